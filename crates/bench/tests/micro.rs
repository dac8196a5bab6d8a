//! End-to-end tests of the micro-benchmarks (`ember bench alloc`, `persist`,
//! `index`, `recovery`) with tiny parameters, through the `ember-bench` binary.

use std::process::{Command, Output};

fn harness(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember-bench"))
        .args(args)
        .output()
        .expect("run ember-bench")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn bench_alloc_tiny() {
    let out = harness(&[
        "alloc", "--ops", "2000", "--rounds", "1", "--window", "64", "--batch", "16",
    ]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}\n{}", text(&out.stderr));
    for f in [
        "machine:",
        "strategy:",
        "fence_ns:",
        "threads: 1",
        "ops_per_sec_per_thread",
        "ns_per_op",
        "fences_per_op",
        "flushes_per_op",
        "ratio_vs_system",
        "system",
        "immediate",
        "batched",
    ] {
        assert!(s.contains(f), "missing {f:?} in:\n{s}");
    }
}

#[test]
fn bench_alloc_json_two_threads() {
    let dir = tempfile::tempdir().unwrap();
    let heap = dir.path().join("bench.heap");
    let out = harness(&[
        "alloc",
        "--threads",
        "2",
        "--ops",
        "2000",
        "--rounds",
        "1",
        "--strategy",
        "fence-only",
        "--heap",
        heap.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["bench"], "alloc");
    assert_eq!(v["threads"], 2);
    assert_eq!(v["strategy"], "fence-only");
    assert_eq!(v["fence_ns"], 0);
    assert!(v["machine"]["cpu"].is_string());
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    for m in ["system", "immediate", "batched"] {
        let x = &v["modes"][m];
        for k in [
            "ops_per_sec_per_thread",
            "ns_per_op",
            "fences_per_op",
            "flushes_per_op",
            "ratio_vs_system",
        ] {
            assert!(x[k].is_number(), "{m}.{k} missing: {x}");
        }
        assert!(x["ops_per_sec_per_thread"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(v["modes"]["system"]["fences_per_op"], 0.0);
    // Small-block allocation and free need no fence (their pages are covered by
    // the active page table): only a new slab or a table change fences.
    for m in ["immediate", "batched"] {
        let f = v["modes"][m]["fences_per_op"].as_f64().unwrap();
        assert!(f < 0.05, "{m} fences/op {f}");
    }
    assert!(!heap.exists(), "the bench heap was not removed");
}

/// A bench given an existing file as its heap refuses it and leaves it as it
/// was (it registers its heap for removal before creating it, so it must never
/// register someone else's file).
#[test]
fn bench_refuses_an_existing_heap_file_and_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let heap = tmp.path().join("mine.heap");
    std::fs::write(&heap, b"not a heap, and not the bench's").unwrap();
    let out = harness(&[
        "engine",
        "--keys",
        "100",
        "--seconds",
        "0.1",
        "--heap",
        heap.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "the bench accepted an existing file");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exists already"), "{err}");
    assert_eq!(
        std::fs::read(&heap).unwrap(),
        b"not a heap, and not the bench's",
        "the file was changed or removed"
    );
}

#[test]
fn bench_alloc_rejects_bad_arguments() {
    let out = harness(&["alloc", "--strategy", "bogus"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("bogus"));
    let out = harness(&["alloc", "--size", "4"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--size"));
}

#[test]
fn bench_persist_tiny() {
    let out = harness(&["persist", "--iters", "500", "--rounds", "1"]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}\n{}", text(&out.stderr));
    for f in [
        "machine:",
        "fence_ns:",
        "ns_per_record",
        "fences_per_record",
        "flushes_per_record",
        "clwb",
        "clflushopt",
        "clflush",
        "fence-only",
        "msync",
    ] {
        assert!(s.contains(f), "missing {f:?} in:\n{s}");
    }
}

#[test]
fn bench_persist_json() {
    let out = harness(&["persist", "--iters", "300", "--rounds", "1", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["bench"], "persist");
    let list = v["strategies"].as_array().unwrap();
    let names: Vec<&str> = list
        .iter()
        .map(|s| s["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["clwb", "clflushopt", "clflush", "fence-only", "msync"]
    );
    for s in list {
        if s["supported"] == true {
            assert!(s["ns_per_record"].as_f64().unwrap() > 0.0, "{s}");
            assert_eq!(s["fences_per_record"], 1.0, "{s}");
        } else {
            assert!(s.get("ns_per_record").is_none());
        }
    }
    let msync = list.iter().find(|s| s["strategy"] == "msync").unwrap();
    assert_eq!(msync["supported"], true);
    assert_eq!(msync["msyncs_per_record"], 1.0);
}

fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = harness(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", text(&out.stdout)))
}

#[test]
fn bench_index_tiny_json() {
    for (structure, imp, name) in [
        ("hash", "logfree", "hash"),
        ("hash", "logfree-nocache", "hash"),
        ("hash", "redo", "phash"),
        ("skiplist", "logfree", "skiplist"),
        ("skiplist", "logfree-nocache", "skiplist"),
    ] {
        let v = bench_json(&[
            "index",
            "--structure",
            structure,
            "--impl",
            imp,
            "--size",
            "256",
            "--seconds",
            "0.2",
            "--threads",
            "2",
            "--update-ratio",
            "0.5",
            "--verify",
            "--json",
        ]);
        assert_eq!(v["bench"], "index");
        assert_eq!(v["structure"], structure);
        assert_eq!(v["impl"], imp);
        assert_eq!(v["implementation"], name);
        assert_eq!(v["threads"], 2);
        assert_eq!(v["size"], 256);
        assert_eq!(v["update_ratio"], 0.5);
        assert_eq!(v["fence_ns"], 0);
        assert!(v["strategy"].is_string());
        assert!(v["machine"]["cpu"].is_string());
        for k in [
            "ops_per_sec",
            "p50_ns",
            "p99_ns",
            "fences_per_op",
            "flushes_per_op",
        ] {
            assert!(v[k].is_number(), "{imp}: {k} missing: {v}");
        }
        assert!(v["ops_per_sec"].as_f64().unwrap() > 0.0);
        assert!(v["p99_ns"].as_u64().unwrap() >= v["p50_ns"].as_u64().unwrap());
        let durable = if imp == "logfree" {
            "cache-flush"
        } else {
            "op"
        };
        assert_eq!(v["durable_at"], durable);
        let f = v["fences_per_op"].as_f64().unwrap();
        assert!(f > 0.0, "{imp}: {f}");
        assert_eq!(v["keys_after"], v["verified_keys"], "{v}");
    }
    // Updates only, one thread, a fence latency, sync on every op.
    let v = bench_json(&[
        "index",
        "--size",
        "100",
        "--seconds",
        "0.1",
        "--fence-ns",
        "100",
        "--sync-every",
        "1",
        "--json",
    ]);
    assert_eq!(v["fence_ns"], 100);
    assert_eq!(v["durable_at"], "op");
    assert_eq!(v["gets"], 0);
    // The node-read emulation knob is taken and reported.
    let v = bench_json(&[
        "index",
        "--size",
        "100",
        "--seconds",
        "0.1",
        "--read-ns",
        "200",
        "--json",
    ]);
    assert_eq!(v["read_ns"], 200);
    assert!(v["ops_per_sec"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_index_human_and_errors() {
    let out = harness(&["index", "--size", "64", "--seconds", "0.1"]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for f in [
        "ember bench index",
        "machine:",
        "fence_ns:",
        "ops/s",
        "p50",
        "p99",
        "fences/op",
    ] {
        assert!(s.contains(f), "missing {f:?} in {s}");
    }
    let out = harness(&["index", "--structure", "skiplist", "--impl", "redo"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("hash table only"),
        "{}",
        text(&out.stderr)
    );
    for bad in [
        ["--update-ratio", "1.5"],
        ["--threads", "0"],
        ["--size", "0"],
        ["--seconds", "0"],
    ] {
        let out = harness(&["index", bad[0], bad[1]]);
        assert_eq!(out.status.code(), Some(1), "{bad:?}");
        assert!(
            text(&out.stderr).contains(bad[0]),
            "{bad:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn bench_recovery_tiny_json() {
    for structure in ["hash", "skiplist"] {
        let dir = tempfile::tempdir().unwrap();
        let v = bench_json(&[
            "recovery",
            "--structure",
            structure,
            "--size",
            "3000",
            "--updates",
            "500",
            "--dir",
            dir.path().to_str().unwrap(),
            "--verify",
            "--json",
        ]);
        assert_eq!(v["bench"], "recovery");
        assert_eq!(v["structure"], structure);
        assert_eq!(v["size"], 3000);
        assert_eq!(v["page_cache"], "warm");
        assert_eq!(v["was_clean"], false);
        for k in [
            "recovery_ms",
            "open_ms",
            "sweep_ms",
            "active_pages",
            "slots_examined",
            "leaked_freed",
            "keys_after",
        ] {
            assert!(v[k].is_number(), "{k} missing: {v}");
        }
        assert!(v["recovery_ms"].as_f64().unwrap() > 0.0);
        assert_eq!(v["blocks_match"], true, "{v}");
        assert_eq!(v["keys_after"], v["verified_keys"]);
        let k = v["keys_after"].as_u64().unwrap();
        assert!((2000..4000).contains(&k), "{k}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "heap file left behind"
        );
    }
}
