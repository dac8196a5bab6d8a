//! `ember bench scenario` (the `ember-bench` binary): the list, and every
//! scenario in its quick mode into a
//! temporary directory, checking that the CSV has the labelled columns and at
//! least one data row, and that the SVG and PNG charts were written.
//!
//! The scenarios run one at a time (they measure; running them side by side on a
//! machine with few cores would only slow each down). The udorn scenarios need
//! `redis-server` and `redis-benchmark`, serve-recovery `redis-benchmark`
//! (scripts/test.sh installs them); they fail with a clear message without them.
//!
//! Also: a bench stopped by SIGTERM removes its heap file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

const SCENARIOS: [&str; 16] = [
    "bullet-fig5",
    "bullet-fig6",
    "bullet-fig7",
    "bullet-fig8",
    "logfree-fig5",
    "logfree-fig8",
    "logfree-fig10",
    "logfree-fig11",
    "udorn-fig4",
    "udorn-fig5",
    "udorn-sustained",
    "udorn-coll-restart",
    "serve-recovery",
    "scripts-txn-pubsub",
    "cluster",
    "cluster-apply",
];

/// Columns every row must carry, non-empty.
const LABELS: [&str; 13] = [
    "scenario",
    "mode",
    "machine_cpu",
    "machine_cores",
    "commit",
    "engine",
    "variant",
    "durability",
    "strategy",
    "fence_ns",
    "read_ns",
    "emulation",
    "threads",
];

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn harness(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember-bench"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run ember-bench")
}

/// `ember` beside the `ember-bench` under test (the server scenarios run its
/// `ember serve`), built first if it is missing.
///
/// Cargo puts the binaries of a build in one directory. `cargo test
/// --workspace` (scripts/test.sh) builds both, fresh; `cargo test -p
/// ember-bench` builds only the harness, so a missing `ember` is built here
/// (`cargo build -p ember`, same profile). One already there is used as it is:
/// rebuild it after changing the server when testing this package alone.
fn ember_binary() -> PathBuf {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(env!("CARGO_BIN_EXE_ember-bench"))
        .parent()
        .expect("the binaries' directory");
    let path = dir.join("ember");
    if path.is_file() {
        return path;
    }
    // target/debug holds the test profile's binaries, target/release the
    // release profile's, target/NAME a custom profile's.
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "test",
        Some(p) => p,
        None => panic!("no profile directory in {}", dir.display()),
    };
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "ember",
            "--bin",
            "ember",
            "--profile",
            profile,
        ])
        .output()
        .expect("run cargo");
    assert!(
        out.status.success() && path.is_file(),
        "cargo build -p ember --profile {profile} did not give {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Splits one CSV line (RFC 4180 quoting, no embedded newlines).
fn fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

fn need(program: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{program} is not installed: the udorn and serve-recovery scenarios run Redis's tools; \
         install the Debian package {package} (scripts/test.sh does)"
    );
}

/// Runs `scenario --quick` (plus `extra`) and checks its output files; returns
/// the CSV's header and rows.
fn run(name: &str, extra: &[&str], columns: &[&str]) -> (Vec<String>, Vec<Vec<String>>) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("out");
    let out_s = out_dir.to_str().unwrap();
    // The server scenarios find it next to the harness.
    ember_binary();
    let mut args = vec!["scenario", name, "--quick", "--out", out_s];
    args.extend_from_slice(extra);
    let out = harness(&args, tmp.path());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "{name}: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    assert!(stdout.contains(&format!("{name}.csv")), "{name}: {stdout}");

    let csv = std::fs::read_to_string(out_dir.join(format!("{name}.csv"))).unwrap();
    let mut lines = csv.lines();
    let header = fields(lines.next().expect("a header"));
    let rows: Vec<Vec<String>> = lines.map(fields).collect();
    assert!(!rows.is_empty(), "{name}: no data row:\n{csv}");
    for c in LABELS.iter().chain(columns) {
        assert!(
            header.iter().any(|h| h == c),
            "{name}: no column {c} in {header:?}"
        );
    }
    let col = |c: &str| header.iter().position(|h| h == c).unwrap();
    for r in &rows {
        assert_eq!(
            r.len(),
            header.len(),
            "{name}: row {r:?} against {header:?}"
        );
        for c in LABELS {
            assert!(!r[col(c)].is_empty(), "{name}: empty {c} in {r:?}");
        }
        assert_eq!(r[col("scenario")], name);
        assert_eq!(r[col("mode")], "quick");
        assert!(r[col("machine_cores")].parse::<usize>().unwrap() >= 1);
        assert!(r[col("threads")].parse::<usize>().unwrap() >= 1);
        r[col("fence_ns")].parse::<u64>().unwrap();
    }

    let svg = std::fs::read_to_string(out_dir.join(format!("{name}.svg"))).unwrap();
    assert!(
        svg.contains("<svg") && svg.len() > 1000,
        "{name}: svg {svg:.200}"
    );
    let png = std::fs::read(out_dir.join(format!("{name}.png"))).unwrap();
    assert!(png.len() > 1000, "{name}: png of {} bytes", png.len());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}: not a PNG");
    (header, rows)
}

/// The values of column `c`.
fn column<'a>(header: &[String], rows: &'a [Vec<String>], c: &str) -> Vec<&'a str> {
    let i = col_of(header, c);
    rows.iter().map(|r| r[i].as_str()).collect()
}

/// The index of column `c`.
fn col_of(header: &[String], c: &str) -> usize {
    header
        .iter()
        .position(|h| h == c)
        .unwrap_or_else(|| panic!("no column {c} in {header:?}"))
}

#[test]
fn list_names_every_scenario() {
    let tmp = tempfile::tempdir().unwrap();
    let out = harness(&["scenario", "--list"], tmp.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list = text(&out.stdout);
    assert_eq!(list.lines().count(), SCENARIOS.len(), "{list}");
    for (line, name) in list.lines().zip(SCENARIOS) {
        assert!(line.starts_with(name), "{line:?} should name {name}");
        assert!(line.len() > name.len() + 10, "{line:?} has no description");
    }
}

#[test]
fn unknown_scenarios_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = harness(&["scenario", "bullet-fig99", "--quick"], tmp.path());
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("unknown scenario") && err.contains("bullet-fig5"),
        "{err}"
    );
    let out = harness(&["scenario"], tmp.path());
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--list"),
        "{}",
        text(&out.stderr)
    );
}

/// A server scenario without an `ember` binary to start says where it looked
/// and how to get one.
#[test]
fn a_server_scenario_names_a_missing_ember() {
    let tmp = tempfile::tempdir().unwrap();
    let nope = tmp.path().join("no-ember-here");
    let out_dir = tmp.path().join("out");
    let out = harness(
        &[
            "scenario",
            "udorn-fig4",
            "--quick",
            "--out",
            out_dir.to_str().unwrap(),
            "--ember",
            nope.to_str().unwrap(),
        ],
        tmp.path(),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("no ember binary at {}", nope.display()))
            && err.contains("cargo build --release -p ember"),
        "{err}"
    );
}

#[test]
fn bullet_fig5() {
    let (h, rows) = run("bullet-fig5", &[], &["put_pct", "ops_per_sec", "p99_ns"]);
    // 8 stores x 4 put ratios x threads 1..2.
    assert_eq!(rows.len(), 64);
    let engines = column(&h, &rows, "engine");
    for e in ["volatile", "direct", "bullet"] {
        assert!(engines.contains(&e), "{engines:?}");
    }
    let variants = column(&h, &rows, "variant");
    for v in ["phash", "logfree", "st", "lfr", "opt", "dyn", "full"] {
        assert!(variants.contains(&v), "{variants:?}");
    }
}

#[test]
fn bullet_fig6() {
    let (h, rows) = run("bullet-fig6", &[], &["op", "quantile", "latency_ns"]);
    let ops = column(&h, &rows, "op");
    assert!(ops.contains(&"get") && ops.contains(&"put"));
}

#[test]
fn bullet_fig7() {
    let (h, rows) = run(
        "bullet-fig7",
        &[],
        &["t_s", "put_pct", "ops_per_sec", "gleaners"],
    );
    assert!(rows.len() >= 5, "{rows:?}");
    let pcts = column(&h, &rows, "put_pct");
    assert!(pcts.contains(&"15") && pcts.contains(&"50"), "{pcts:?}");
}

#[test]
fn bullet_fig8_labels_the_fence_emulation() {
    let (h, rows) = run(
        "bullet-fig8",
        &["--fence-ns", "100", "--read-ns", "50"],
        &["log_size_mib", "ops_per_sec"],
    );
    assert_eq!(column(&h, &rows, "log_size_mib"), ["1", "4", "16", "64"]);
    assert!(column(&h, &rows, "fence_ns").iter().all(|f| *f == "100"));
    // The node-read knob reaches the engine benchmark, which reports it back.
    assert!(column(&h, &rows, "read_ns").iter().all(|f| *f == "50"));
    assert!(column(&h, &rows, "emulation")
        .iter()
        .all(|e| *e == "emulated fence 100 ns, node read 50 ns"));
}

#[test]
fn logfree_fig5() {
    let (h, rows) = run(
        "logfree-fig5",
        &[],
        &["structure", "impl", "size", "ratio_vs_redo"],
    );
    let ratios = column(&h, &rows, "ratio_vs_redo");
    assert!(
        ratios.iter().any(|r| r.parse::<f64>().is_ok()),
        "{ratios:?}"
    );
}

#[test]
fn logfree_fig8() {
    let (h, rows) = run("logfree-fig8", &[], &["structure", "impl", "ops_per_sec"]);
    let imps = column(&h, &rows, "impl");
    for i in ["logfree", "logfree-nocache", "redo"] {
        assert!(imps.contains(&i), "{imps:?}");
    }
}

#[test]
fn logfree_fig10() {
    let (h, rows) = run("logfree-fig10", &[], &["structure", "size", "recovery_ms"]);
    for ms in column(&h, &rows, "recovery_ms") {
        assert!(ms.parse::<f64>().unwrap() > 0.0);
    }
}

/// Whether the `ember` under test serves memcached (`--memcached-port`).
fn ember_serves_memcached() -> bool {
    let out = Command::new(ember_binary())
        .args(["serve", "--help"])
        .output()
        .expect("run ember serve --help");
    text(&out.stdout).contains("--memcached-port")
}

#[test]
fn logfree_fig11() {
    need("memcached", "memcached");
    let (h, rows) = run(
        "logfree-fig11",
        &[
            "--client-threads",
            "1",
            "--pipeline",
            "2",
            "--multiget",
            "3",
        ],
        &[
            "key_range",
            "round",
            "ops_per_sec",
            "p50_us",
            "p99_us",
            "errors_lost",
            "errors_corrupt",
            "errors_unexpected",
            "ratio_vs_memcached",
        ],
    );
    let engines = column(&h, &rows, "engine");
    assert!(engines.contains(&"memcached"), "{engines:?}");
    assert_eq!(
        engines.contains(&"ember"),
        ember_serves_memcached(),
        "Ember's rows are there exactly when it serves memcached: {engines:?}"
    );
    // The knobs reach the generator and its rows.
    assert!(column(&h, &rows, "client_threads")
        .iter()
        .all(|t| *t == "1"));
    assert!(column(&h, &rows, "multiget").iter().all(|t| *t == "3"));
    let round = col_of(&h, "round");
    for r in &rows {
        if r[round] == "median" {
            continue;
        }
        for c in ["errors_lost", "errors_corrupt", "errors_unexpected"] {
            assert_eq!(r[col_of(&h, c)], "0", "{c} in {r:?}");
        }
        assert!(r[col_of(&h, "ops_per_sec")].parse::<f64>().unwrap() > 0.0);
        assert!(r[col_of(&h, "p99_us")].parse::<f64>().unwrap() > 0.0);
    }
    assert_eq!(
        column(&h, &rows, "key_range")
            .iter()
            .zip(column(&h, &rows, "round"))
            .filter(|(_, r)| *r == "median")
            .count(),
        if ember_serves_memcached() { 6 } else { 2 }
    );
}

#[test]
fn logfree_fig11_warmup() {
    need("memcached", "memcached");
    let (h, rows) = run(
        "logfree-fig11",
        &["--warmup"],
        &[
            "items",
            "warm_ms",
            "items_present",
            "server_bytes",
            "server_bytes_per_item",
            "rss_bytes",
        ],
    );
    for (n, present) in column(&h, &rows, "items")
        .iter()
        .zip(column(&h, &rows, "items_present"))
    {
        assert_eq!(n, &present);
    }
    let engines = column(&h, &rows, "engine");
    // memcached's item bytes hold at least the 32-byte values; Ember's heap
    // grows by whole chunks, so at the quick run's sizes only its totals are
    // checked.
    for ((e, bpi), (bytes, rss)) in engines
        .iter()
        .zip(column(&h, &rows, "server_bytes_per_item"))
        .zip(
            column(&h, &rows, "server_bytes")
                .into_iter()
                .zip(column(&h, &rows, "rss_bytes")),
        )
    {
        if *e == "memcached" {
            assert!(bpi.parse::<f64>().unwrap() > 32.0, "{bpi}");
        }
        assert!(bytes.parse::<u64>().unwrap() > 0, "{e}: {bytes}");
        assert!(rss.parse::<u64>().unwrap() > 0, "{e}: {rss}");
    }
    assert_eq!(engines.contains(&"ember"), ember_serves_memcached());
}

#[test]
fn udorn_fig4() {
    need("redis-server", "redis-server");
    let (h, rows) = run(
        "udorn-fig4",
        &[],
        &["keys", "launch_ms", "shutdown_ms", "dbsize_after"],
    );
    let engines = column(&h, &rows, "engine");
    assert!(engines.contains(&"ember") && engines.contains(&"redis"));
    let variants = column(&h, &rows, "variant");
    assert!(
        variants.contains(&"rdb") && variants.contains(&"aof everysec"),
        "{variants:?}"
    );
    // The data survived the restart.
    for (k, n) in column(&h, &rows, "keys")
        .iter()
        .zip(column(&h, &rows, "dbsize_after"))
    {
        assert_eq!(k, &n);
    }
}

#[test]
fn udorn_fig5() {
    need("redis-server", "redis-server");
    need("redis-benchmark", "redis-tools");
    let (h, rows) = run("udorn-fig5", &[], &["test", "pipeline", "rps"]);
    let tests = column(&h, &rows, "test");
    for t in [
        "SET",
        "GET",
        "INCR",
        "LPUSH",
        "RPUSH",
        "LPOP",
        "RPOP",
        "SADD",
        "HSET",
        "SPOP",
        "ZADD",
        "ZPOPMIN",
        "LRANGE_100 (first 100 elements)",
        "LRANGE_300 (first 300 elements)",
        "LRANGE_600 (first 600 elements)",
        "MSET (10 keys)",
    ] {
        assert!(tests.contains(&t), "{t} missing from {tests:?}");
    }
    // Every server ran every test at both depths.
    for d in ["pmem", "msync", "aof"] {
        for p in ["1", "16"] {
            let n = rows
                .iter()
                .filter(|r| {
                    r[col_of(&h, "durability")] == d
                        && r[col_of(&h, "pipeline")] == p
                        && r[col_of(&h, "test")] == "ZADD"
                })
                .count();
            assert!(n >= 1, "no ZADD row of {d} at -P {p}");
        }
    }
    let durability = column(&h, &rows, "durability");
    assert!(
        durability.contains(&"pmem")
            && durability.contains(&"msync")
            && durability.contains(&"aof")
    );
    assert!(column(&h, &rows, "pipeline").contains(&"16"));
}

#[test]
fn udorn_sustained() {
    need("redis-server", "redis-server");
    need("redis-benchmark", "redis-tools");
    let (h, rows) = run(
        "udorn-sustained",
        &[],
        &["test", "pipeline", "rps", "max_latency_ms"],
    );
    assert!(column(&h, &rows, "test").iter().all(|t| *t == "SET"));
    assert!(column(&h, &rows, "pipeline").iter().all(|p| *p == "16"));
    let durability = column(&h, &rows, "durability");
    assert!(
        durability.contains(&"pmem")
            && durability.contains(&"msync")
            && durability.contains(&"aof")
    );
    // Ember's rows say how often its logs were full; Redis's leave it empty.
    for (e, w) in column(&h, &rows, "engine")
        .iter()
        .zip(column(&h, &rows, "log_full_waits"))
    {
        assert_eq!(*e == "ember", w.parse::<u64>().is_ok(), "{e}: {w:?}");
    }
}

#[test]
fn scripts_txn_pubsub() {
    need("redis-server", "redis-server");
    need("redis-benchmark", "redis-tools");
    let (h, rows) = run(
        "scripts-txn-pubsub",
        &[],
        &["test", "pipeline", "rps", "unit", "ratio_vs_redis"],
    );
    // Every workload ran on both servers at both depths, and has a median
    // row; Ember's median rows carry the ratio.
    for t in ["SET", "EVAL", "EVALSHA", "MULTI/EXEC", "PUBLISH"] {
        for d in ["pmem", "aof"] {
            for p in ["1", "16"] {
                let of = |round: &dyn Fn(&str) -> bool| {
                    rows.iter()
                        .filter(|r| {
                            r[col_of(&h, "test")] == t
                                && r[col_of(&h, "durability")] == d
                                && r[col_of(&h, "pipeline")] == p
                                && round(&r[col_of(&h, "round")])
                        })
                        .collect::<Vec<_>>()
                };
                let measured = of(&|r| r.parse::<u32>().is_ok());
                assert_eq!(measured.len(), 1, "{t} on {d} at -P {p}");
                let rps: f64 = measured[0][col_of(&h, "rps")].parse().unwrap();
                assert!(rps > 0.0, "{t} on {d} at -P {p}: {rps}");
                let med = of(&|r| r == "median");
                assert_eq!(med.len(), 1, "median of {t} on {d} at -P {p}");
                let ratio = &med[0][col_of(&h, "ratio_vs_redis")];
                if d == "pmem" {
                    assert!(ratio.parse::<f64>().unwrap() > 0.0, "{t}: {ratio}");
                } else {
                    assert!(ratio.is_empty(), "{t}: {ratio}");
                }
            }
        }
    }
    let units: Vec<_> = rows
        .iter()
        .filter(|r| r[col_of(&h, "test")] == "PUBLISH")
        .map(|r| r[col_of(&h, "unit")].as_str())
        .collect();
    assert!(units.iter().all(|u| *u == "messages"), "{units:?}");
}

#[test]
fn cluster() {
    need("redis-server", "redis-server");
    need("redis-benchmark", "redis-tools");
    let (h, rows) = run(
        "cluster",
        &[],
        &["test", "rps", "p50_ms", "p99_ms", "failover_ms", "ratio"],
    );
    let of = |engine: &str, test: &str, round: &dyn Fn(&str) -> bool| {
        rows.iter()
            .filter(|r| {
                r[col_of(&h, "engine")] == engine
                    && r[col_of(&h, "test")] == test
                    && round(&r[col_of(&h, "round")])
            })
            .collect::<Vec<_>>()
    };
    // Every write ran on Ember with 1 and 2 workers and on Redis + WAIT,
    // measured and as a median; Ember's medians carry the ratio.
    for t in ["SET", "INCR", "LPUSH"] {
        let ember = of("ember", t, &|r| r.parse::<u32>().is_ok());
        assert_eq!(ember.len(), 2, "{t}: {ember:?}");
        let threads: Vec<_> = ember
            .iter()
            .map(|r| r[col_of(&h, "threads")].as_str())
            .collect();
        assert!(
            threads.contains(&"1") && threads.contains(&"2"),
            "{t}: {threads:?}"
        );
        let redis = of("redis", t, &|r| r.parse::<u32>().is_ok());
        assert_eq!(redis.len(), 1, "{t}");
        for r in ember.iter().chain(&redis) {
            assert!(r[col_of(&h, "rps")].parse::<f64>().unwrap() > 0.0, "{r:?}");
            assert!(
                r[col_of(&h, "p99_ms")].parse::<f64>().unwrap() > 0.0,
                "{r:?}"
            );
        }
        for m in of("ember", t, &|r| r == "median") {
            assert!(
                m[col_of(&h, "ratio")].parse::<f64>().unwrap() > 0.0,
                "{m:?}"
            );
        }
    }
    // One kill of each, with its failover time, p50 and max.
    for engine in ["ember", "redis"] {
        let kills = of(engine, "failover", &|r| r == "1");
        assert_eq!(kills.len(), 1, "{engine}");
        let t: f64 = kills[0][col_of(&h, "failover_ms")].parse().unwrap();
        assert!(t > 0.0 && t < 30_000.0, "{engine}: {t} ms");
        assert_eq!(of(engine, "failover", &|r| r == "max").len(), 1);
    }
}

#[test]
fn cluster_apply() {
    need("redis-server", "redis-server");
    let (h, rows) = run(
        "cluster-apply",
        &[],
        &["rps", "catch_up_entries", "catch_up_ms", "applied_per_sec"],
    );
    // One round of 1 and of 2 lanes; the follower caught up with every
    // write, and with 2 lanes applied entries in parallel.
    let lanes: Vec<&str> = column(&h, &rows, "apply_lanes");
    assert_eq!(lanes, ["1", "2"], "{rows:?}");
    for r in &rows {
        let writes: u64 = r[col_of(&h, "requests")].parse().unwrap();
        let caught: u64 = r[col_of(&h, "catch_up_entries")].parse().unwrap();
        assert!(caught >= writes, "{r:?}");
        let par: u64 = r[col_of(&h, "applied_in_parallel")].parse().unwrap();
        if r[col_of(&h, "apply_lanes")] == "1" {
            assert_eq!(par, 0, "{r:?}");
        } else {
            assert!(par > 0, "{r:?}");
        }
    }
}

#[test]
fn udorn_coll_restart() {
    need("redis-server", "redis-server");
    let (h, rows) = run(
        "udorn-coll-restart",
        &["--zset-elements", "3000", "--list-elements", "2000"],
        &[
            "phase",
            "type",
            "elements",
            "rss_bytes_per_element",
            "used_memory_bytes_per_element",
            "restart",
            "zrange_ms",
            "lindex_ms",
            "last_start_clean",
        ],
    );
    let cell = |r: &Vec<String>, c: &str| r[col_of(&h, c)].clone();
    // A memory row for each type and size, on both servers.
    for engine in ["ember", "redis"] {
        for t in ["list", "hash", "set", "zset"] {
            let sizes: Vec<String> = rows
                .iter()
                .filter(|r| {
                    cell(r, "engine") == engine
                        && cell(r, "phase") == "memory"
                        && cell(r, "type") == t
                })
                .map(|r| cell(r, "elements_per_key"))
                .collect();
            assert_eq!(sizes.len(), 2, "{engine} {t}: {sizes:?}");
            assert_eq!(sizes[0], "1000");
        }
    }
    // The knobs size the large list and sorted set.
    let big = |t: &str| {
        rows.iter()
            .find(|r| {
                cell(r, "engine") == "ember" && cell(r, "type") == t && cell(r, "keys") == "1"
            })
            .map(|r| cell(r, "elements"))
    };
    assert_eq!(big("zset").as_deref(), Some("3000"));
    assert_eq!(big("list").as_deref(), Some("2000"));
    // Ember restarts after SIGKILL (a recovery) and after SHUTDOWN (clean);
    // Redis after SHUTDOWN SAVE. Each answered ZRANGE and then LINDEX.
    let restarts: Vec<(String, String, String)> = rows
        .iter()
        .filter(|r| cell(r, "phase") == "restart")
        .map(|r| {
            (
                cell(r, "engine"),
                cell(r, "restart"),
                cell(r, "last_start_clean"),
            )
        })
        .collect();
    assert!(
        restarts.contains(&("ember".into(), "sigkill".into(), "0".into())),
        "{restarts:?}"
    );
    assert!(
        restarts.contains(&("ember".into(), "shutdown".into(), "1".into())),
        "{restarts:?}"
    );
    assert!(
        restarts.contains(&("redis".into(), "shutdown save".into(), "".into())),
        "{restarts:?}"
    );
    for r in rows.iter().filter(|r| cell(r, "phase") == "restart") {
        let z: f64 = cell(r, "zrange_ms").parse().unwrap();
        let l: f64 = cell(r, "lindex_ms").parse().unwrap();
        assert!(z > 0.0 && l >= z, "{r:?}");
    }
}

#[test]
fn serve_recovery() {
    need("redis-benchmark", "redis-tools");
    let (h, rows) = run(
        "serve-recovery",
        &[],
        &[
            "logs",
            "log_size_mib",
            "log_occupancy_before_kill",
            "ready_ms",
            "last_start_clean",
            "last_start_ms",
            "last_start_log_records",
            "last_start_log_bytes",
            "last_start_log_replayed",
            "last_start_leaked_freed",
        ],
    );
    assert_eq!(column(&h, &rows, "log_size_mib"), ["1", "4"]);
    assert!(column(&h, &rows, "logs").iter().all(|l| *l == "8"));
    assert!(column(&h, &rows, "engine").iter().all(|e| *e == "ember"));
    assert!(column(&h, &rows, "durability").iter().all(|d| *d == "pmem"));
    // Every restart was a recovery after the SIGKILL, and read log records.
    assert!(column(&h, &rows, "last_start_clean")
        .iter()
        .all(|c| *c == "0"));
    for c in ["ready_ms", "last_start_ms", "last_start_log_records"] {
        for v in column(&h, &rows, c) {
            assert!(v.parse::<f64>().unwrap() > 0.0, "{c} {v}");
        }
    }
    // Empty only from a server that does not report it.
    for b in column(&h, &rows, "last_start_log_bytes") {
        assert!(b.is_empty() || b.parse::<u64>().unwrap() > 0, "{b}");
    }
}

/// A bench stopped by SIGTERM removes its heap file (a SIGKILL would leave it).
#[test]
fn a_terminated_bench_removes_its_heap() {
    let tmp = tempfile::tempdir().unwrap();
    let heap = tmp.path().join("engine.heap");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember-bench"))
        .args(["engine", "--engine", "bullet-full", "--keys", "10000"])
        .args(["--logs", "2", "--log-size", "1", "--warmup", "0"])
        .args(["--seconds", "60", "--heap"])
        .arg(&heap)
        .current_dir(tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run ember-bench");
    let t = std::time::Instant::now();
    while !heap.exists() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "no heap file"
        );
        assert!(child.try_wait().unwrap().is_none(), "the bench ended");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let st = child.wait().unwrap();
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(15), "{st}");
    }
    assert!(!heap.exists(), "the heap file is still there");
}
