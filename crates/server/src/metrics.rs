//! A Prometheus text endpoint (`--metrics-port`): GET /metrics on 127.0.0.1.
//! A small blocking HTTP/1.0 responder on its own thread; written by hand
//! because it answers one fixed request and needs nothing an HTTP stack adds.

use crate::server::Shared;
use crate::stats::LATENCY_BOUNDS_US;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Scrapes answered at once; more wait for the listener's next turn.
const MAX_IN_FLIGHT: usize = 8;

pub fn spawn(sh: Arc<Shared>, port: u16) -> Result<JoinHandle<()>, String> {
    let l = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("metrics: cannot listen on 127.0.0.1:{port}: {e}"))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("ember-metrics".into())
        .spawn(move || {
            // Each scrape on its own short-lived thread, so that a client that
            // connects and says nothing delays nobody else.
            let in_flight = Arc::new(AtomicUsize::new(0));
            while !sh.shutdown.load(Ordering::Acquire) {
                if in_flight.load(Ordering::Acquire) >= MAX_IN_FLIGHT {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                match l.accept() {
                    Ok((s, _)) => {
                        in_flight.fetch_add(1, Ordering::AcqRel);
                        let sh = sh.clone();
                        let done = in_flight.clone();
                        let r = std::thread::Builder::new()
                            .name("ember-scrape".into())
                            .spawn(move || {
                                answer(&sh, s);
                                done.fetch_sub(1, Ordering::AcqRel);
                            });
                        if r.is_err() {
                            in_flight.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
        .map_err(|e| e.to_string())
}

/// Reads one request (up to the end of its headers) and answers it.
fn answer(sh: &Shared, mut s: TcpStream) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let mut req = Vec::new();
    let mut buf = [0u8; 2048];
    while req.len() < 8192 && !req.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&req);
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if !line.starts_with("GET ") {
        ("405 Method Not Allowed", "only GET /metrics\n".to_string())
    } else if path == "/metrics" || path.starts_with("/metrics?") {
        ("200 OK", render(sh))
    } else {
        ("404 Not Found", "try GET /metrics\n".to_string())
    };
    let _ = write!(
        s,
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// The metrics text.
pub fn render(sh: &Shared) -> String {
    let t = sh.stats.totals_since_start();
    let mut o = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, v: String| {
        let _ = write!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{v}");
    };
    let mut calls = String::new();
    for (i, s) in crate::cmd::TABLE.iter().enumerate() {
        let (c, _, f, r) = t.per_cmd[i];
        if c + r > 0 {
            let _ = writeln!(calls, "ember_commands_total{{cmd=\"{}\"}} {c}", s.name);
            let _ = writeln!(
                calls,
                "ember_command_errors_total{{cmd=\"{}\"}} {}",
                s.name,
                f + r
            );
        }
    }
    metric(
        "ember_commands_total",
        "counter",
        "Commands executed, by command (errors counted separately too).",
        calls,
    );
    let mut h = String::new();
    let mut cum = 0;
    for (i, b) in LATENCY_BOUNDS_US.iter().enumerate() {
        cum += t.latency[i];
        let _ = writeln!(
            h,
            "ember_command_duration_seconds_bucket{{le=\"{}\"}} {cum}",
            *b as f64 / 1e6
        );
    }
    cum += t.latency[LATENCY_BOUNDS_US.len()];
    let _ = writeln!(
        h,
        "ember_command_duration_seconds_bucket{{le=\"+Inf\"}} {cum}"
    );
    let _ = writeln!(
        h,
        "ember_command_duration_seconds_sum {}",
        t.latency_sum_us as f64 / 1e6
    );
    let _ = writeln!(h, "ember_command_duration_seconds_count {cum}");
    metric(
        "ember_command_duration_seconds",
        "histogram",
        "Command execution time (durable when it ends).",
        h,
    );
    metric(
        "ember_connected_clients",
        "gauge",
        "Connected clients.",
        format!(
            "ember_connected_clients {}\n",
            sh.connected.load(Ordering::Relaxed)
        ),
    );
    metric(
        "ember_keyspace_hits_total",
        "counter",
        "Reads that found their key.",
        format!("ember_keyspace_hits_total {}\n", t.hits),
    );
    metric(
        "ember_keyspace_misses_total",
        "counter",
        "Reads that did not find their key.",
        format!("ember_keyspace_misses_total {}\n", t.misses),
    );
    metric(
        "ember_expired_keys_total",
        "counter",
        "Keys deleted because their TTL passed.",
        format!("ember_expired_keys_total {}\n", t.expired_keys),
    );
    metric(
        "ember_group_commit_batches_total",
        "counter",
        "Batches of requests whose writes awaited a group commit (durability msync).",
        format!(
            "ember_group_commit_batches_total {}\n",
            t.group_commit_batches
        ),
    );
    metric(
        "ember_group_commit_requests_total",
        "counter",
        "Requests served in those batches.",
        format!(
            "ember_group_commit_requests_total {}\n",
            t.group_commit_requests
        ),
    );
    if let Some(heap) = sh.store.heap() {
        let ps = heap.region().persist_stats();
        metric(
            "ember_flushes_total",
            "counter",
            "Cache lines flushed towards the persistence domain.",
            format!("ember_flushes_total {}\n", ps.flushes),
        );
        metric(
            "ember_fences_total",
            "counter",
            "Persist barriers (fences).",
            format!("ember_fences_total {}\n", ps.fences),
        );
        metric(
            "ember_msyncs_total",
            "counter",
            "msync calls (durability msync).",
            format!("ember_msyncs_total {}\n", ps.msyncs),
        );
        metric(
            "ember_writes_through_total",
            "counter",
            "Log record runs written through the file at a group commit (durability msync).",
            format!("ember_writes_through_total {}\n", ps.writes_through),
        );
        metric(
            "ember_heap_size_bytes",
            "gauge",
            "Heap file size.",
            format!("ember_heap_size_bytes {}\n", heap.region().size()),
        );
    }
    let st = sh.store.stats();
    metric(
        "ember_log_occupancy_ratio",
        "gauge",
        "Bullet: fraction of persistent log space in use.",
        format!("ember_log_occupancy_ratio {}\n", st.log_occupancy),
    );
    metric(
        "ember_gleaners",
        "gauge",
        "Bullet: threads gleaning now.",
        format!("ember_gleaners {}\n", st.gleaners),
    );
    metric(
        "ember_log_records_appended_total",
        "counter",
        "Bullet: log records appended.",
        format!("ember_log_records_appended_total {}\n", st.records_appended),
    );
    metric(
        "ember_log_records_applied_total",
        "counter",
        "Bullet: log records applied to the backend.",
        format!("ember_log_records_applied_total {}\n", st.records_applied),
    );
    o
}
