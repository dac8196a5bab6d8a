//! Large collections: restart time and bytes per element, `ember serve`
//! (default engine, `pmem`) against `redis-server` (RDB at shutdown).
//!
//! Each round starts each server fresh in a data directory of its own, then:
//!
//! 1. Memory. For each type (list, hash, set, sorted set) and size: at 1,000
//!    elements, `SMALL_KEYS` keys of 1,000 elements each (one key would be
//!    below the resolution of RSS); at the large size, one key. Elements are
//!    16-byte strings `m:NNNNNNNNNNNNNN` (hash: field `f:...` with a 16-byte
//!    value `v:...`; sorted set: score = the element's number), written with
//!    commands of 1,000 elements each (RPUSH, HSET, SADD, ZADD) pipelined
//!    `PIPELINE` at a time over a raw RESP connection. After each step, once
//!    Ember's gleaners have applied its logs (`log_occupancy` 0), INFO
//!    memory gives `used_memory_rss` (both servers: the process's RSS; for
//!    Ember it counts the heap pages mapped in and the DRAM frontend) and
//!    `used_memory` (Redis: its allocator's bytes; Ember: the persistent heap
//!    in use, `heap_used`, without the DRAM frontend); the growth over the
//!    step divided by its elements is the row's bytes per element; a row of
//!    type `all` divides the growth over every step by every element. The large
//!    list is `biglist` (`--list-elements`), the large sorted set `big`
//!    (`--zset-elements`); the large hash and set have 1,000,000 elements.
//! 2. Restart with that data. First the small keys of step 1 are written
//!    again under other names (not measured), then Ember is killed with
//!    SIGKILL right away (its logs hold what its gleaners had not applied
//!    yet: `log_occupancy_before`), started, time from the spawn
//!    to the first answered `ZRANGE big 0 9` (ten members) and then to the
//!    first answered `LINDEX biglist 0`; then SHUTDOWN and the same timing
//!    (its INFO `last_start_*` fields say what each start read). Redis:
//!    `SHUTDOWN SAVE` (timed), start, the same timing (Redis answers -LOADING
//!    until its RDB is loaded). After each start ZCARD and LLEN must give the
//!    sizes built.

use super::chart::{Bars, Chart, Panel};
use super::child::TempDir;
use super::resp::{encode, info_field, Conn, Reply};
use super::servers::{data_bytes, redis_version, Kind, RedisMode, Server, Spec};
use super::table::{Labels, Table};
use super::udorn::{labels_of, server_spec, server_version};
use super::{median, BenchResult, Ctx, Report};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Elements per command of the fills.
const PER_COMMAND: u64 = 1_000;
/// Commands in flight on the fill connection.
const PIPELINE: u64 = 10;
/// Elements of a "small" collection, and how many of them a memory step writes.
const SMALL: u64 = 1_000;
const SMALL_KEYS: u64 = 100;
const QUICK_SMALL_KEYS: u64 = 5;
/// Longest wait for Ember's gleaners to apply its logs before a memory reading.
const SETTLE: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Type {
    List,
    Hash,
    Set,
    Zset,
}

const TYPES: [Type; 4] = [Type::List, Type::Hash, Type::Set, Type::Zset];

impl Type {
    fn name(self) -> &'static str {
        match self {
            Type::List => "list",
            Type::Hash => "hash",
            Type::Set => "set",
            Type::Zset => "zset",
        }
    }

    /// The key of the large collection of this type.
    fn big_key(self) -> &'static str {
        match self {
            Type::List => "biglist",
            Type::Hash => "bighash",
            Type::Set => "bigset",
            Type::Zset => "big",
        }
    }

    /// Appends the command adding elements `from..to` to `key`: element `i`
    /// is `m:i` (14 digits); a hash's is field `f:i` with value `v:i`, a
    /// sorted set's has score `i`.
    fn encode(self, buf: &mut Vec<u8>, key: &[u8], from: u64, to: u64) {
        let mut owned: Vec<Vec<u8>> = Vec::new();
        for i in from..to {
            match self {
                Type::List | Type::Set => owned.push(format!("m:{i:014}").into_bytes()),
                Type::Hash => {
                    owned.push(format!("f:{i:014}").into_bytes());
                    owned.push(format!("v:{i:014}").into_bytes());
                }
                Type::Zset => {
                    owned.push(i.to_string().into_bytes());
                    owned.push(format!("m:{i:014}").into_bytes());
                }
            }
        }
        let cmd: &[u8] = match self {
            Type::List => b"RPUSH",
            Type::Hash => b"HSET",
            Type::Set => b"SADD",
            Type::Zset => b"ZADD",
        };
        let mut args: Vec<&[u8]> = vec![cmd, key];
        args.extend(owned.iter().map(Vec::as_slice));
        encode(buf, &args);
    }
}

/// Adds elements `0..n` to `key`, `PER_COMMAND` a command, `PIPELINE`
/// commands in flight; every reply must be an integer.
fn fill(c: &mut Conn, t: Type, key: &str, n: u64) -> BenchResult<()> {
    let mut buf = Vec::new();
    let mut i = 0;
    while i < n {
        buf.clear();
        let mut sent = 0;
        while sent < PIPELINE && i < n {
            let to = (i + PER_COMMAND).min(n);
            t.encode(&mut buf, key.as_bytes(), i, to);
            i = to;
            sent += 1;
        }
        c.write_raw(&buf)
            .map_err(|e| format!("filling {key}: write: {e}"))?;
        for _ in 0..sent {
            match c.read_reply() {
                Ok(Reply::Int(_)) => {}
                Ok(r) => return Err(format!("filling {key}: the server answered {r:?}")),
                Err(e) => return Err(format!("filling {key}: read: {e}")),
            }
        }
    }
    Ok(())
}

/// (used_memory_rss, used_memory) from INFO memory once the server is
/// settled: Ember's gleaners have applied its logs to the heap (else the
/// backend's share of a step would land in the next step's growth), and then
/// a pause, as Redis refreshes its RSS figure in its 100 ms timer, not when
/// INFO asks.
fn memory(s: &Server, kind: Kind, stop: &AtomicBool) -> BenchResult<(f64, f64)> {
    if let Kind::Ember { .. } = kind {
        let deadline = Instant::now() + SETTLE;
        while log_occupancy(s)?
            .parse::<f64>()
            .map_err(|e| format!("log_occupancy: {e}"))?
            > 0.0
        {
            if stop.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "Ember's logs were not applied within {} s of the last write",
                    SETTLE.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let info = s
        .conn(Duration::from_secs(60))?
        .info("memory")
        .map_err(|e| format!("INFO memory: {e}"))?;
    let get = |f: &str| {
        info_field(&info, f)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("no number {f:?} in INFO memory"))
    };
    Ok((get("used_memory_rss")?, get("used_memory")?))
}

/// An integer reply of `args`, or an error naming the command.
fn int(c: &mut Conn, args: &[&[u8]]) -> BenchResult<i64> {
    let what = String::from_utf8_lossy(&args.join(&b' ')).into_owned();
    match c.call(args) {
        Ok(Reply::Int(n)) => Ok(n),
        Ok(r) => Err(format!("{what} answered {r:?}")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Ready when `ZRANGE big 0 9` answers ten members (a server still loading
/// answers an error; one that lost the data an empty array).
fn zrange_ready(c: &mut Conn) -> bool {
    matches!(c.call(&[b"ZRANGE", b"big", b"0", b"9"]), Ok(Reply::Array(Some(v))) if v.len() == 10)
}

/// What one timed start measured.
struct Start {
    zrange_ms: f64,
    lindex_ms: f64,
    /// Ember's INFO ember after the start (empty for Redis).
    info: String,
}

/// Starts the server on its data, times the first answered ZRANGE and LINDEX,
/// checks the sizes, and returns the running server.
fn timed_start(
    ctx: &Ctx,
    spec: &Spec<'_>,
    zset_n: u64,
    list_n: u64,
) -> BenchResult<(Server, Start)> {
    let timeout = Duration::from_secs(if ctx.quick { 60 } else { 900 });
    let port = free_port()?;
    let (s, zrange) = spec.start_until(port, timeout, ctx.stop_flag(), &mut zrange_ready)?;
    let label = spec.kind.label();
    let deadline = Instant::now() + timeout;
    let mut c = s.conn(Duration::from_secs(60))?;
    loop {
        match c.call(&[b"LINDEX", b"biglist", b"0"]) {
            Ok(Reply::Bulk(Some(_))) => break,
            Ok(r) if Instant::now() >= deadline => {
                return Err(format!("{label}: LINDEX biglist 0 answered {r:?}"))
            }
            Err(e) => return Err(format!("{label}: LINDEX biglist 0: {e}")),
            Ok(_) => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    let lindex = s.started().elapsed();
    let zcard = int(&mut c, &[b"ZCARD", b"big"])?;
    let llen = int(&mut c, &[b"LLEN", b"biglist"])?;
    if zcard != zset_n as i64 || llen != list_n as i64 {
        return Err(format!(
            "{label}: ZCARD big {zcard} and LLEN biglist {llen} after the start, {zset_n} and {list_n} built"
        ));
    }
    let info = match spec.kind {
        Kind::Ember { .. } => c.info("ember").map_err(|e| format!("INFO: {e}"))?,
        Kind::Redis(_) => String::new(),
    };
    Ok((
        s,
        Start {
            zrange_ms: zrange.as_secs_f64() * 1e3,
            lindex_ms: lindex.as_secs_f64() * 1e3,
            info,
        },
    ))
}

/// A port nothing listens on now.
fn free_port() -> BenchResult<u16> {
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind 127.0.0.1:0: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

const COLUMNS: [&str; 21] = [
    "round",
    "phase",
    "type",
    "elements_per_key",
    "keys",
    "elements",
    "build_s",
    "elements_per_s",
    "rss_growth_bytes",
    "used_memory_growth_bytes",
    "rss_bytes_per_element",
    "used_memory_bytes_per_element",
    "restart",
    "log_occupancy_before",
    "shutdown_ms",
    "zrange_ms",
    "lindex_ms",
    "last_start_clean",
    "last_start_log_bytes",
    "data_bytes",
    "server_version",
];

/// Per server kind: medians over rounds of each memory step and restart.
#[derive(Default, Clone)]
struct Got {
    /// (type, size index) -> RSS bytes per element of every round.
    mem: Vec<Vec<Vec<f64>>>,
    /// RSS bytes per element over every memory step of a round, per round
    /// (Ember's RSS grows in lumps that one step can take for another).
    all: Vec<f64>,
    /// restart ("sigkill", "shutdown") -> (zrange ms, lindex ms) of every round.
    restart: Vec<(&'static str, Vec<f64>, Vec<f64>)>,
}

impl Got {
    fn restart(&mut self, how: &'static str) -> &mut (&'static str, Vec<f64>, Vec<f64>) {
        if let Some(i) = self.restart.iter().position(|r| r.0 == how) {
            &mut self.restart[i]
        } else {
            self.restart.push((how, Vec::new(), Vec::new()));
            self.restart.last_mut().expect("just pushed")
        }
    }
}

pub fn run(ctx: &mut Ctx) -> BenchResult<Report> {
    let quick_or = |quick: u64, full: u64| if ctx.quick { quick } else { full };
    let zset_n = ctx.zset_elements.unwrap_or(quick_or(20_000, 1_000_000));
    let list_n = ctx.list_elements.unwrap_or(quick_or(20_000, 1_000_000));
    let big_n = quick_or(20_000, 1_000_000);
    let small_keys = quick_or(QUICK_SMALL_KEYS, SMALL_KEYS);
    if zset_n < 10 || list_n < 1 {
        return Err("--zset-elements must be at least 10 and --list-elements at least 1".into());
    }
    let rounds = ctx.rounds(2);
    let kinds = [Kind::Ember { msync: false }, Kind::Redis(RedisMode::Rdb)];
    let version = redis_version(ctx.stop_flag())?;
    // Heap: about 500 bytes an element of the large collections, sparse.
    let heap_mib = ((zset_n + list_n + 2 * big_n).saturating_mul(500) >> 20).max(1024);
    ctx.progress.plan((rounds * kinds.len()) as u64);
    let mut table = Table::new(ctx, &COLUMNS);
    let sizes = |t: Type| -> [(u64, u64); 2] {
        let big = match t {
            Type::List => list_n,
            Type::Zset => zset_n,
            Type::Hash | Type::Set => big_n,
        };
        [(SMALL, small_keys), (big, 1)]
    };
    let mut got = vec![
        Got {
            mem: vec![vec![Vec::new(); 2]; TYPES.len()],
            all: Vec::new(),
            restart: Vec::new(),
        };
        kinds.len()
    ];
    let io = Duration::from_secs(300);
    let mut ember_note = String::new();
    for round in 1..=rounds {
        for (ki, &kind) in kinds.iter().enumerate() {
            ctx.check_stop()?;
            ctx.progress
                .start(format!("{}, round {round}", kind.label()));
            let dir = TempDir::new_in(ctx.work_dir(), &format!("{}-{round}", kind.tag()))?;
            let ember = ctx.ember()?;
            let spec = server_spec(ctx, kind, dir.path(), &ember, heap_mib);
            let (s, _) = spec.start(Duration::from_secs(60), ctx.stop_flag())?;
            let lab = labels_of(ctx, kind, &s)?;
            let server_version = server_version(kind, &version);
            let mut c = s.conn(io)?;
            let mut summary = Vec::new();
            // RSS growth and elements over every memory step.
            let (mut all_growth, mut all_used, mut all_n) = (0.0, 0.0, 0.0);
            for (ti, &t) in TYPES.iter().enumerate() {
                for (si, &(per_key, keys)) in sizes(t).iter().enumerate() {
                    ctx.check_stop()?;
                    let (rss0, used0) = memory(&s, kind, ctx.stop_flag())?;
                    let t0 = Instant::now();
                    for k in 0..keys {
                        let key = if keys == 1 {
                            t.big_key().to_string()
                        } else {
                            format!("{}:{per_key}:{k}", t.name())
                        };
                        fill(&mut c, t, &key, per_key)
                            .map_err(|e| format!("{}: {e}", kind.label()))?;
                    }
                    let build = t0.elapsed().as_secs_f64();
                    let (rss1, used1) = memory(&s, kind, ctx.stop_flag())?;
                    let n = (per_key * keys) as f64;
                    let rss_pe = (rss1 - rss0) / n;
                    let used_pe = (used1 - used0) / n;
                    got[ki].mem[ti][si].push(rss_pe);
                    all_growth += rss1 - rss0;
                    all_used += used1 - used0;
                    all_n += n;
                    summary.push(format!("{} {per_key}: {rss_pe:.0} B/el", t.name()));
                    let mut cells = vec![
                        round.to_string(),
                        "memory".into(),
                        t.name().into(),
                        per_key.to_string(),
                        keys.to_string(),
                        (per_key * keys).to_string(),
                        format!("{build:.3}"),
                        format!("{:.0}", n / build),
                        format!("{:.0}", rss1 - rss0),
                        format!("{:.0}", used1 - used0),
                        format!("{rss_pe:.1}"),
                        format!("{used_pe:.1}"),
                    ];
                    cells.extend(std::iter::repeat_n(String::new(), 8));
                    cells.push(server_version.clone());
                    table.push(&lab, cells);
                }
            }
            // The whole run's growth: a row of type `all`.
            got[ki].all.push(all_growth / all_n);
            summary.push(format!("all: {:.0} B/el", all_growth / all_n));
            let mut cells = vec![round.to_string(), "memory".into(), "all".into()];
            cells.extend([String::new(), String::new(), format!("{all_n:.0}")]);
            cells.extend([String::new(), String::new()]);
            cells.extend([
                format!("{all_growth:.0}"),
                format!("{all_used:.0}"),
                format!("{:.1}", all_growth / all_n),
                format!("{:.1}", all_used / all_n),
            ]);
            cells.extend(std::iter::repeat_n(String::new(), 8));
            cells.push(server_version.clone());
            table.push(&lab, cells);
            // More writes, not measured, so that Ember's logs hold records its
            // gleaners have not applied yet when it is killed (the memory
            // steps waited for them): the same again under other keys.
            for &t in &TYPES {
                for k in 0..small_keys {
                    let key = format!("tail:{}:{k}", t.name());
                    fill(&mut c, t, &key, SMALL).map_err(|e| format!("{}: {e}", kind.label()))?;
                }
            }
            drop(c);
            // Restarts on that data.
            let shutdown_timeout = Duration::from_secs(if ctx.quick { 60 } else { 900 });
            let mut s = s;
            let mut occupancy = String::new();
            if let Kind::Ember { .. } = kind {
                if ember_note.is_empty() {
                    ember_note = format!("Ember durability {} ({})", lab.durability, lab.strategy);
                }
                occupancy = log_occupancy(&s)?;
                s.kill()?;
                let (s2, st) = timed_start(ctx, &spec, zset_n, list_n)?;
                let row = RestartRow {
                    round,
                    how: "sigkill",
                    occupancy: &occupancy,
                    shutdown_ms: "",
                    dir: dir.path(),
                    server_version: &server_version,
                };
                summary.push(row.record(&mut table, &lab, &st, &mut got[ki]));
                s = s2;
                occupancy = log_occupancy(&s)?;
            }
            let (save, how): (&[&str], _) = match kind {
                Kind::Redis(_) => (&["SAVE"], "shutdown save"),
                Kind::Ember { .. } => (&[], "shutdown"),
            };
            let shut = s.shutdown(save, shutdown_timeout, ctx.stop_flag())?;
            let shut_ms = format!("{:.3}", shut.as_secs_f64() * 1e3);
            let (s, st) = timed_start(ctx, &spec, zset_n, list_n)?;
            let row = RestartRow {
                round,
                how,
                occupancy: &occupancy,
                shutdown_ms: &shut_ms,
                dir: dir.path(),
                server_version: &server_version,
            };
            summary.push(row.record(&mut table, &lab, &st, &mut got[ki]));
            // Killed: nothing else is measured on it, its directory goes next.
            drop(s);
            ctx.progress.done(&summary.join(", "));
        }
    }
    let restart_groups = [
        ("sigkill", "after SIGKILL"),
        (
            "shutdown",
            "after SHUTDOWN (Redis: SHUTDOWN SAVE, RDB load)",
        ),
    ];
    let restart_panel = |col: usize, cmd: &str| {
        Panel::Bars(Bars {
            title: format!("start to first answered {cmd}"),
            y_label: "ms".into(),
            groups: restart_groups.iter().map(|g| g.1.to_string()).collect(),
            series: kinds
                .iter()
                .zip(&got)
                .map(|(k, g)| {
                    let vals = restart_groups
                        .iter()
                        .map(|(how, _)| {
                            g.restart
                                .iter()
                                .find(|r| r.0 == *how)
                                .map(|r| median(if col == 1 { &r.1 } else { &r.2 }))
                        })
                        .collect();
                    (k.label().to_string(), vals)
                })
                .collect(),
        })
    };
    let mem_groups: Vec<String> = TYPES
        .iter()
        .flat_map(|&t| {
            sizes(t)
                .into_iter()
                .map(move |(n, _)| format!("{} {}", t.name(), super::chart::short(n as f64)))
        })
        .chain(["all steps".to_string()])
        .collect();
    let mem_panel = Panel::Bars(Bars {
        title: "bytes per element (growth of RSS over the elements written)".into(),
        y_label: "bytes per element".into(),
        groups: mem_groups,
        series: kinds
            .iter()
            .zip(&got)
            .map(|(k, g)| {
                let vals = g
                    .mem
                    .iter()
                    .flat_map(|per_size| {
                        per_size.iter().map(|v| (!v.is_empty()).then(|| median(v)))
                    })
                    .chain([(!g.all.is_empty()).then(|| median(&g.all))])
                    .collect();
                (k.label().to_string(), vals)
            })
            .collect(),
    });
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "udorn-coll-restart: a {zset_n}-element sorted set and a {list_n}-element list, Ember against redis-server {version} (median of {rounds})"
            ),
            subtitle: ctx.subtitle(&format!("{ember_note}; Redis: RDB written at SHUTDOWN SAVE")),
            panels: vec![
                restart_panel(1, "ZRANGE big 0 9"),
                restart_panel(2, "LINDEX biglist 0"),
                mem_panel,
            ],
        },
    })
}

/// Ember's `log_occupancy` (INFO ember).
fn log_occupancy(s: &Server) -> BenchResult<String> {
    let info = s
        .conn(Duration::from_secs(60))?
        .info("ember")
        .map_err(|e| format!("INFO ember: {e}"))?;
    Ok(info_field(&info, "log_occupancy").unwrap_or("").to_string())
}

/// What a restart's row says besides the timings.
struct RestartRow<'a> {
    round: usize,
    /// `sigkill`, `shutdown` or `shutdown save`.
    how: &'static str,
    /// Ember's log occupancy before the kill or shutdown.
    occupancy: &'a str,
    shutdown_ms: &'a str,
    dir: &'a std::path::Path,
    server_version: &'a str,
}

impl RestartRow<'_> {
    /// Writes the row of start `st`, keeps its timings for the chart (`got`,
    /// under `sigkill` or `shutdown`) and returns its progress summary.
    fn record(&self, table: &mut Table, lab: &Labels, st: &Start, got: &mut Got) -> String {
        let mut cells = vec![self.round.to_string(), "restart".into()];
        cells.extend(std::iter::repeat_n(String::new(), 10));
        cells.extend([
            self.how.to_string(),
            self.occupancy.to_string(),
            self.shutdown_ms.to_string(),
            format!("{:.3}", st.zrange_ms),
            format!("{:.3}", st.lindex_ms),
            info_field(&st.info, "last_start_clean")
                .unwrap_or("")
                .to_string(),
            info_field(&st.info, "last_start_log_bytes")
                .unwrap_or("")
                .to_string(),
            data_bytes(self.dir).to_string(),
            self.server_version.to_string(),
        ]);
        table.push(lab, cells);
        let g = got.restart(if self.how == "sigkill" {
            "sigkill"
        } else {
            "shutdown"
        });
        g.1.push(st.zrange_ms);
        g.2.push(st.lindex_ms);
        format!(
            "{}: ZRANGE {:.1} ms, LINDEX {:.1} ms",
            self.how, st.zrange_ms, st.lindex_ms
        )
    }
}
