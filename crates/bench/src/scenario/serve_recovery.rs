//! Crash recovery of `ember serve` against the size of its Bullet logs: the
//! recovery time after SIGKILL against the MB of unapplied log.
//!
//! For each log size (8 logs of 1, 4, 16 and 64 MiB; quick: 1 and 4 MiB) and
//! round: a fresh `ember serve --logs 8 --log-size N` in a data directory of
//! its own (working directory, heap `./ember.heap`, `--heap-size 2gb`) is driven
//! by `redis-benchmark -t set -d 100 -r 1000000 -P 16 -c 8` for at least a few
//! seconds, and longer (up to a bound) until the logs are at least 95% full;
//! `INFO ember` gives `log_occupancy` and the record counters just before the
//! server is killed with SIGKILL while the load runs. The load is stopped, the
//! server restarted on the same heap and port, and timed from the spawn to the
//! first PONG (`ready_ms`). The restarted server's `INFO ember` gives what the
//! recovery found: `last_start_clean` (must be 0), `last_start_ms` (the store's
//! open: heap open, leak sweep, log replay into the frontend),
//! `last_start_log_records`, `last_start_log_bytes` (bytes of log read; an
//! empty cell from a server that does not report it), `last_start_log_replayed`
//! and `last_start_leaked_freed`.
//!
//! Durability pmem only (`--strategy msync` runs `--durability msync`
//! instead): msync rows are left out of the default run, as its group-committed
//! load fills the logs far more slowly and the recovery does the same work.

use super::chart::{Chart, Lines, Panel, Series};
use super::child::{Guard, TempDir};
use super::resp::info_field;
use super::servers::{Kind, Spec};
use super::table::Table;
use super::udorn::{ember_info, server_labels};
use super::{median, BenchResult, Ctx, Report};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Logs of every server.
const LOGS: u64 = 8;
/// Size of a new heap (sparse; it grows online if needed), MiB.
const HEAP_MIB: u64 = 2048;
/// The load: redis-benchmark's SET with these parameters.
const VALUE_SIZE: usize = 100;
const KEYSPACE: u64 = 1_000_000;
const CLIENTS: u32 = 8;
const PIPELINE: u32 = 16;
/// Stop waiting for the logs to fill at this occupancy.
const FULL_ENOUGH: f64 = 0.95;

/// One round's measurements.
struct Round {
    load_s: f64,
    occupancy: f64,
    appended: String,
    applied: String,
    ready_ms: f64,
    info: String,
}

/// The number of an INFO field, or an error naming the field.
fn info_num(info: &str, field: &str) -> BenchResult<f64> {
    info_field(info, field)
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("no number {field:?} in INFO ember"))
}

/// An INFO field as a cell ("" when the server does not report it).
fn info_cell(info: &str, field: &str) -> String {
    info_field(info, field).unwrap_or_default().to_string()
}

pub fn run(ctx: &mut Ctx) -> BenchResult<Report> {
    let sizes: &[u64] = if ctx.quick { &[1, 4] } else { &[1, 4, 16, 64] };
    let rounds = ctx.rounds(3);
    // Load at least min_s, then until the logs are FULL_ENOUGH, at most max_s.
    let (min_s, max_s) = if ctx.quick { (1.0, 3.0) } else { (4.0, 30.0) };
    let restart_timeout = Duration::from_secs(if ctx.quick { 60 } else { 120 });
    let msync = ctx.strategy == "msync";
    if !matches!(ctx.strategy.as_str(), "auto" | "msync") {
        ctx.progress.note(&format!(
            "ember serve picks its persistence strategy itself (auto, or msync with --strategy msync); --strategy {} does not apply",
            ctx.strategy
        ));
    }
    // Missing redis-benchmark is an error before any server starts.
    let mut probe = Command::new("redis-benchmark");
    probe.arg("--version");
    super::child::run_capture(
        probe,
        "redis-benchmark --version",
        Duration::from_secs(10),
        ctx.stop_flag(),
    )?;
    ctx.progress.plan((sizes.len() * rounds) as u64);
    let mut table = Table::new(
        ctx,
        &[
            "logs",
            "log_size_mib",
            "log_capacity_mib",
            "round",
            "load",
            "load_s",
            "log_occupancy_before_kill",
            "records_appended_before_kill",
            "records_applied_before_kill",
            "ready_ms",
            "last_start_clean",
            "last_start_ms",
            "last_start_log_records",
            "last_start_log_bytes",
            "last_start_log_mb",
            "last_start_log_replayed",
            "last_start_leaked_freed",
            "keys_estimate_after",
            "server_version",
        ],
    );
    let load_name =
        format!("redis-benchmark -t set -d {VALUE_SIZE} -r {KEYSPACE} -c {CLIENTS} -P {PIPELINE}");
    // Per log size: (x in MB, ready ms, open ms, records read, records replayed)
    // of every round.
    let mut per_size: Vec<Vec<[f64; 5]>> = vec![Vec::new(); sizes.len()];
    let mut have_bytes = true;
    let mut note = String::new();
    for (si, &mib) in sizes.iter().enumerate() {
        for round in 1..=rounds {
            ctx.progress.start(format!(
                "{LOGS} logs of {mib} MiB, round {round}: SET load, SIGKILL, restart"
            ));
            let dir = TempDir::new_in(ctx.work_dir(), &format!("serve-{LOGS}x{mib}-{round}"))?;
            let ember = ctx.ember()?;
            let spec = Spec {
                kind: Kind::Ember { msync },
                dir: dir.path(),
                ember: &ember,
                fence_ns: ctx.fence_ns,
                heap_mib: HEAP_MIB,
                extra: vec![
                    "--logs".into(),
                    LOGS.to_string(),
                    "--log-size".into(),
                    format!("{mib}mb"),
                ],
            };
            let (r, labels_info) = crash_and_restart(ctx, &spec, (min_s, max_s), restart_timeout)?;
            let lab = server_labels(ctx, spec.kind, Some(labels_info));
            if note.is_empty() {
                note = format!("durability {} ({})", lab.durability, lab.strategy);
            }
            let clean = info_cell(&r.info, "last_start_clean");
            if clean != "0" {
                return Err(format!(
                    "{LOGS} x {mib} MiB, round {round}: the restart after SIGKILL reports last_start_clean {clean:?} (expected 0)"
                ));
            }
            let open_ms = info_num(&r.info, "last_start_ms")?;
            let records = info_num(&r.info, "last_start_log_records")?;
            let replayed = info_num(&r.info, "last_start_log_replayed")?;
            let bytes =
                info_field(&r.info, "last_start_log_bytes").and_then(|v| v.parse::<f64>().ok());
            let capacity_mib = LOGS * mib;
            // Without the byte count, the chart's x is the log capacity times
            // the occupancy at the kill (labelled so).
            let x_mb = match bytes {
                Some(b) => b / 1e6,
                None => {
                    have_bytes = false;
                    r.occupancy * (capacity_mib << 20) as f64 / 1e6
                }
            };
            table.push(
                &lab,
                vec![
                    LOGS.to_string(),
                    mib.to_string(),
                    capacity_mib.to_string(),
                    round.to_string(),
                    load_name.clone(),
                    format!("{:.3}", r.load_s),
                    r.occupancy.to_string(),
                    r.appended.clone(),
                    r.applied.clone(),
                    format!("{:.3}", r.ready_ms),
                    clean,
                    open_ms.to_string(),
                    info_cell(&r.info, "last_start_log_records"),
                    info_cell(&r.info, "last_start_log_bytes"),
                    bytes.map(|b| format!("{:.3}", b / 1e6)).unwrap_or_default(),
                    info_cell(&r.info, "last_start_log_replayed"),
                    info_cell(&r.info, "last_start_leaked_freed"),
                    info_cell(&r.info, "store_keys_estimate"),
                    format!("ember {}", env!("CARGO_PKG_VERSION")),
                ],
            );
            per_size[si].push([x_mb, r.ready_ms, open_ms, records, replayed]);
            ctx.progress.done(&format!(
                "occupancy {:.2} after {:.1} s of load; ready in {:.1} ms (open {open_ms:.1} ms), {} read, {:.0}k records, {:.0}k replayed",
                r.occupancy,
                r.load_s,
                r.ready_ms,
                bytes
                    .map(|b| format!("{:.1} MB", b / 1e6))
                    .unwrap_or_else(|| "? MB (not reported)".into()),
                records / 1e3,
                replayed / 1e3
            ));
        }
    }
    // The median of every column per log size, as points.
    let med = |k: usize| -> Vec<f64> {
        per_size
            .iter()
            .map(|v| median(&v.iter().map(|p| p[k]).collect::<Vec<_>>()))
            .collect()
    };
    let (x, ready, open, records, replayed) = (med(0), med(1), med(2), med(3), med(4));
    let pts = |y: &[f64]| -> Vec<(f64, f64)> { x.iter().copied().zip(y.iter().copied()).collect() };
    let x_label = if have_bytes {
        "log read at recovery (MB, last_start_log_bytes)".to_string()
    } else {
        "log capacity x occupancy at the kill (MB; this server reports no last_start_log_bytes)"
            .to_string()
    };
    let sizes_note = sizes
        .iter()
        .map(|m| m.to_string())
        .collect::<Vec<_>>()
        .join("/");
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "serve-recovery: ember serve restart after SIGKILL under a SET load against the log read, {LOGS} logs of {sizes_note} MiB (median of {rounds})"
            ),
            subtitle: ctx.subtitle(&note),
            panels: vec![
                Panel::Lines(Lines {
                    title: "recovery time".into(),
                    x_label: x_label.clone(),
                    y_label: "time (ms)".into(),
                    x_log: true,
                    y_log: true,
                    series: vec![
                        Series::new("ready: restart to first PONG", pts(&ready)),
                        Series::new("open: last_start_ms (heap + log replay)", pts(&open)),
                    ],
                    ..Lines::default()
                }),
                Panel::Lines(Lines {
                    title: "log records at recovery".into(),
                    x_label,
                    y_label: "records".into(),
                    x_log: true,
                    y_log: true,
                    series: vec![
                        Series::new("records read (last_start_log_records)", pts(&records)),
                        Series::new("records replayed (last_start_log_replayed)", pts(&replayed)),
                    ],
                    ..Lines::default()
                }),
            ],
        },
    })
}

/// Start, load, SIGKILL under load, restart on the same heap and port: what
/// the round measured, and the restarted server's (engine, strategy).
fn crash_and_restart(
    ctx: &Ctx,
    spec: &Spec<'_>,
    (min_s, max_s): (f64, f64),
    restart_timeout: Duration,
) -> BenchResult<(Round, super::udorn::EmberInfo)> {
    let stop = ctx.stop_flag();
    let io = Duration::from_secs(30);
    let (s, _) = spec.start(Duration::from_secs(60), stop)?;
    let port = s.port;
    let mut info_conn = s.conn(io)?;
    let info = |c: &mut super::resp::Conn| c.info("ember").map_err(|e| format!("INFO ember: {e}"));

    let bench_log = spec.dir.join("redis-benchmark.log");
    let f = std::fs::File::create(&bench_log)
        .map_err(|e| format!("cannot create {}: {e}", bench_log.display()))?;
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-t", "set"])
        .args(["-d", &VALUE_SIZE.to_string()])
        .args(["-r", &KEYSPACE.to_string()])
        .args(["-n", "2000000000"])
        .args(["-c", &CLIENTS.to_string()])
        .args(["-P", &PIPELINE.to_string()])
        .arg("-q")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(f));
    let t0 = Instant::now();
    let mut load = Guard::spawn(cmd, "redis-benchmark")?;
    let before_kill = loop {
        std::thread::sleep(Duration::from_millis(100));
        ctx.check_stop()?;
        if let Some(st) = load.try_wait()? {
            return Err(format!(
                "redis-benchmark ended ({st}) before the kill; its stderr ends:\n{}\nthe server's log ends:\n{}",
                super::child::tail(&std::fs::read_to_string(&bench_log).unwrap_or_default(), 10),
                s.log_tail(10)
            ));
        }
        let t = t0.elapsed().as_secs_f64();
        if t < min_s {
            continue;
        }
        let text = info(&mut info_conn)?;
        if info_num(&text, "log_occupancy")? >= FULL_ENOUGH || t >= max_s {
            break text;
        }
    };
    let load_s = t0.elapsed().as_secs_f64();
    let appended = info_cell(&before_kill, "records_appended");
    if appended.parse::<u64>().unwrap_or(0) == 0 {
        return Err(format!(
            "the server appended no log record under the load; INFO ember:\n{before_kill}"
        ));
    }
    s.kill()?;
    drop(load);
    drop(info_conn);
    ctx.check_stop()?;
    let (s2, ready) = spec.start_on(port, restart_timeout, stop)?;
    let after = info(&mut s2.conn(io)?)?;
    let labels = ember_info(&s2)?;
    // Killed as well: its data directory goes next (a clean shutdown would
    // first apply every log record to the backend).
    drop(s2);
    Ok((
        Round {
            load_s,
            occupancy: info_num(&before_kill, "log_occupancy")?,
            appended,
            applied: info_cell(&before_kill, "records_applied"),
            ready_ms: ready.as_secs_f64() * 1e3,
            info: after,
        },
        labels,
    ))
}
