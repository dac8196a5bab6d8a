//! Smoke test of `ember bench engine`: every kind of store runs a short load and
//! reports the fields the benchmark promises.

use serde_json::Value;
use std::process::Command;

const FIELDS: &[&str] = &[
    "ops_per_sec",
    "get_p50_ns",
    "get_p99_ns",
    "put_p50_ns",
    "put_p99_ns",
    "gleaners_avg",
    "threads",
    "workers",
    "static_gleaners",
    "keys",
    "key_size",
    "value_size",
    "put_ratio",
    "zipf",
    "seconds",
    "engine",
    "durability",
    "fence_ns",
    "logs",
    "log_size_mib",
    "backend",
    "machine",
    "fences_per_op",
    "flushes_per_op",
    "log_full_waits",
    "records_appended",
    "records_applied",
    "records_collapsed",
    "log_occupancy_end",
    "ops",
    "get_ops",
    "put_ops",
];

/// Runs `ember bench engine` with a tiny load (2 threads, 2,000 keys, 0.3 s, four
/// 1 MiB logs) plus `extra`; returns its standard output, after checking it
/// succeeded.
fn bench(engine: &str, put_ratio: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "engine",
        "--engine",
        engine,
        "--threads",
        "2",
        "--keys",
        "2000",
        "--seconds",
        "0.3",
        "--warmup",
        "0",
        "--put-ratio",
        put_ratio,
        "--json",
        "--log-size",
        "1",
        "--logs",
        "4",
    ];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_ember-bench"))
        .args(&args)
        .output()
        .expect("run ember-bench");
    assert!(
        out.status.success(),
        "{engine}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn run(engine: &str) -> Value {
    let text = bench(engine, "0.2", &[]);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{engine}: {e}: {text}"))
}

#[test]
fn every_engine_reports() {
    for (engine, name, heap) in [
        ("volatile", "volatile", false),
        ("direct", "direct-logfree", true),
        ("bullet", "bullet-full", true),
        ("bullet-st", "bullet-st", true),
    ] {
        let v = run(engine);
        for f in FIELDS {
            assert!(v.get(f).is_some(), "{engine}: no {f} in {v}");
        }
        assert_eq!(v["engine"], name, "{v}");
        let rate = v["ops_per_sec"].as_f64().expect("ops_per_sec");
        assert!(rate > 0.0, "{engine}: {v}");
        let ops = v["ops"].as_u64().unwrap();
        assert_eq!(
            ops,
            v["get_ops"].as_u64().unwrap() + v["put_ops"].as_u64().unwrap()
        );
        assert!(v["put_ops"].as_u64().unwrap() > 0, "{engine}: {v}");
        // Every key was prefilled: no get may miss.
        assert_eq!(v["get_misses"], 0, "{engine}: {v}");
        assert_eq!(v["keys"], 2000);
        assert_eq!(v["threads"], 2);
        assert_eq!(v["put_ratio"], 0.2);
        assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
        if heap {
            assert!(v["fences_per_op"].as_f64().unwrap() > 0.0, "{engine}: {v}");
            assert_ne!(v["durability"], "volatile");
        } else {
            assert_eq!(v["durability"], "volatile");
            assert!(v["fences_per_op"].is_null());
        }
        if engine == "bullet-st" {
            assert_eq!(v["static_gleaners"], 1);
            assert_eq!(v["workers"], 1);
            assert_eq!(v["gleaners_avg"], 1.0);
        } else {
            assert_eq!(v["workers"], 2);
            assert_eq!(v["static_gleaners"], 0);
        }
        if engine.starts_with("bullet") {
            assert_eq!(v["logs"], 4);
            assert_eq!(v["log_size_mib"], 1);
            assert!(v["records_appended"].as_u64().unwrap() > 0, "{engine}: {v}");
        }
    }
}

#[test]
fn rejects_bad_arguments() {
    for bad in [
        &["--engine", "nope"][..],
        &["--put-ratio", "2"],
        &["--zipf", "1.0"],
        &["--key-size", "4"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ember-bench"))
            .args(["engine", "--keys", "100000", "--seconds", "0.1"])
            .args(bad)
            .output()
            .expect("run ember-bench");
        assert!(!out.status.success(), "{bad:?} was accepted");
    }
}

/// `--recovery`: a second JSON object with the recovery of the undrained logs.
#[test]
fn bullet_recovery_is_timed() {
    // No epoch ends: the advancer does not drain the logs before close.
    let text = bench("bullet", "0.5", &["--recovery", "--epoch-ms", "100000"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    let run: Value = serde_json::from_str(lines[0]).unwrap();
    assert!(run["ops_per_sec"].as_f64().unwrap() > 0.0);
    let rec: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(rec["bench"], "engine-recovery", "{rec}");
    assert!(rec["recovery_ms"].as_f64().unwrap() > 0.0, "{rec}");
    assert!(rec["log_records"].as_u64().unwrap() > 0, "{rec}");
}

/// Runs `ember bench engine --engine bullet` on four 1 MiB logs with `args`;
/// returns (success, stdout, stderr).
fn bullet_small_logs(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember-bench"))
        .args(["engine", "--engine", "bullet"])
        .args(["--logs", "4", "--log-size", "1", "--json"])
        .args(args)
        .output()
        .expect("run ember-bench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--backlog`: the puts wait in the logs (nobody gleans them) until the
/// timed drain applies every one, collapsing each key's chain into one write.
#[test]
fn bullet_backlog_drain_is_timed() {
    let (ok, text, err) = bullet_small_logs(&[
        "--threads",
        "1",
        "--keys",
        "500",
        "--zipf",
        "0",
        "--backlog",
        "5000",
        "--epoch-ms",
        "100000",
    ]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["bench"], "engine-backlog", "{v}");
    assert_eq!(v["puts"], 5000, "{v}");
    assert_eq!(v["applied_before_drain"], 0, "{v}");
    assert_eq!(v["records_applied"], 5000, "{v}");
    let distinct = v["distinct_keys"].as_u64().unwrap();
    assert!(distinct > 400 && distinct <= 500, "{v}");
    // One backend write per key's chain (a chain split across two batches
    // costs one more).
    let collapsed = v["records_collapsed"].as_u64().unwrap();
    assert!(collapsed >= 5000 - 2 * distinct && collapsed < 5000, "{v}");
    assert!(v["drain_ms"].as_f64().unwrap() > 0.0, "{v}");
}

/// `--backlog` refuses what it cannot measure: two threads (a session would
/// glean), and more records than the logs hold.
#[test]
fn bullet_backlog_checks_its_arguments() {
    let (ok, _, err) = bullet_small_logs(&["--threads", "2", "--keys", "100", "--backlog", "100"]);
    assert!(!ok && err.contains("--backlog needs"), "{err}");
    let (ok, _, err) =
        bullet_small_logs(&["--threads", "1", "--keys", "100", "--backlog", "1000000"]);
    assert!(!ok && err.contains("do not fit"), "{err}");
}
