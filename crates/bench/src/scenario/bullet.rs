//! Bullet (ATC '18) §7: Figures 5 to 8, from `ember bench engine --json` runs.
//!
//! The paper ran 50 M keys and 2..16 worker threads for a minute per point on a
//! two-socket machine with emulated persistent memory; the full runs here use
//! 1 M keys, 5 s per point and 1..`--max-threads` threads (static Bullet variants
//! split their threads into workers and gleaners as the paper does).

use super::chart::{Chart, Lines, Panel, Series};
use super::table::{Labels, Table};
use super::{num, opt_num, BenchResult, Ctx, Report};
use serde_json::Value;
use std::time::Duration;

/// Put percentages of Figure 5's four panels.
const PUT_PCTS: [f64; 4] = [0.0, 2.0, 15.0, 50.0];

/// The stores of Figures 5 and 6: (`--engine`, `--backend`, series name).
const STORES: [(&str, &str, &str); 8] = [
    ("volatile", "logfree", "volatile"),
    ("direct", "phash", "direct-phash"),
    ("direct", "logfree", "direct-logfree"),
    ("bullet-st", "logfree", "bullet-st"),
    ("bullet-lfr", "logfree", "bullet-lfr"),
    ("bullet-opt", "logfree", "bullet-opt"),
    ("bullet-dyn", "logfree", "bullet-dyn"),
    ("bullet-full", "logfree", "bullet-full"),
];

/// Quantile points of the CDFs the engine benchmark prints (`--cdf-points`).
const CDF_POINTS: usize = 50;

/// The size of one run.
struct Load {
    keys: u64,
    seconds: f64,
    warmup: f64,
    /// Each log's size (MiB) where the scenario does not set it; None: the
    /// bench's default (64). A new store maps its logs' pages in at creation
    /// (`BulletOptions::preallocate_logs`): 32 logs of 64 MiB would take
    /// seconds of every quick run, which needs a few MiB.
    log_size_mib: Option<u64>,
}

fn load(ctx: &Ctx) -> Load {
    if ctx.quick {
        Load {
            keys: 20_000,
            seconds: 0.15,
            warmup: 0.05,
            log_size_mib: Some(4),
        }
    } else {
        Load {
            keys: 1_000_000,
            seconds: 5.0,
            warmup: 1.0,
            log_size_mib: None,
        }
    }
}

/// Generous bound on one run: start-up, prefill, warm-up and measurement.
fn timeout(l: &Load, measured: f64) -> Duration {
    Duration::from_secs_f64(60.0 + 3.0 * (l.warmup + measured) + l.keys as f64 / 20_000.0)
}

/// `ember bench engine` arguments (without `--json`).
fn engine_args(
    ctx: &Ctx,
    (engine, backend): (&str, &str),
    threads: usize,
    put_pct: f64,
    l: &Load,
    extra: &[&str],
) -> Vec<String> {
    let mut v: Vec<String> = [
        "engine",
        "--engine",
        engine,
        "--backend",
        backend,
        "--threads",
        &threads.to_string(),
        "--keys",
        &l.keys.to_string(),
        "--put-ratio",
        &(put_pct / 100.0).to_string(),
        "--seconds",
        &l.seconds.to_string(),
        "--warmup",
        &l.warmup.to_string(),
        "--fence-ns",
        &ctx.fence_ns.to_string(),
        "--read-ns",
        &ctx.read_ns.to_string(),
        "--strategy",
        &ctx.strategy,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // In the scenario's scratch directory, so that a killed run leaves nothing
    // behind (the bench removes the file itself when it ends normally).
    let heap = ctx.work_dir().join("engine.heap");
    v.extend(["--heap".to_string(), heap.display().to_string()]);
    if let Some(mib) = l.log_size_mib {
        if engine.starts_with("bullet") && !extra.contains(&"--log-size") {
            v.extend(["--log-size".to_string(), mib.to_string()]);
        }
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn mops(v: &Value) -> BenchResult<f64> {
    Ok(num(v, "ops_per_sec")? / 1e6)
}

/// "durability pmem (clwb); volatile: DRAM only" from the rows' labels.
fn durability_note(labels: &[Labels]) -> String {
    let heap: Vec<&Labels> = labels
        .iter()
        .filter(|l| l.durability != "volatile")
        .collect();
    let mut modes: Vec<String> = heap
        .iter()
        .map(|l| format!("{} ({})", l.durability, l.strategy))
        .collect();
    modes.dedup();
    let mut s = format!("durability {}", modes.join(", "));
    if labels.iter().any(|l| l.durability == "volatile") {
        s.push_str("; volatile = DRAM only");
    }
    s
}

/// A `[quantile, ns]` list of the engine benchmark as (ns, quantile) points.
fn cdf_points(v: &Value, key: &str) -> BenchResult<Vec<(f64, f64)>> {
    let arr = v
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("no {key} in the engine benchmark's output"))?;
    arr.iter()
        .map(|p| match p.as_array().map(|a| a.as_slice()) {
            Some([q, ns]) => match (q.as_f64(), ns.as_f64()) {
                (Some(q), Some(ns)) => Ok((ns, q)),
                _ => Err(format!("bad {key} point {p}")),
            },
            _ => Err(format!("bad {key} point {p}")),
        })
        .collect()
}

pub fn fig5(ctx: &mut Ctx) -> BenchResult<Report> {
    let l = load(ctx);
    let threads = ctx.thread_range();
    ctx.progress
        .plan((PUT_PCTS.len() * threads.len() * STORES.len()) as u64);
    let mut table = Table::new(
        ctx,
        &[
            "backend",
            "put_pct",
            "keys",
            "workers",
            "static_gleaners",
            "seconds",
            "ops_per_sec",
            "p99_ns",
            "get_p50_ns",
            "get_p99_ns",
            "put_p50_ns",
            "put_p99_ns",
            "gleaners_avg",
            "fences_per_op",
        ],
    );
    // (put %, store) -> (Mops/s, p99 µs) per thread count.
    let mut curves: Vec<Vec<Vec<(f64, f64)>>> =
        vec![vec![Vec::new(); STORES.len()]; PUT_PCTS.len()];
    let mut labels = Vec::new();
    let cdf = CDF_POINTS.to_string();
    for (pi, &pct) in PUT_PCTS.iter().enumerate() {
        for &t in &threads {
            // The stores back to back at each setting (A B C ... A B C ...).
            for (si, &(engine, backend, name)) in STORES.iter().enumerate() {
                ctx.progress
                    .start(format!("{name}, {pct}% puts, {t} thread(s)"));
                let args = engine_args(ctx, (engine, backend), t, pct, &l, &["--cdf-points", &cdf]);
                let v = ctx.bench(&args, timeout(&l, l.seconds))?;
                let lab = Labels::of_engine(&v)?;
                let (rate, p99) = (mops(&v)?, num(&v, "all_p99_ns")?);
                table.push(
                    &lab,
                    vec![
                        backend_of(&v),
                        pct.to_string(),
                        l.keys.to_string(),
                        opt_num(&v, "workers"),
                        opt_num(&v, "static_gleaners"),
                        opt_num(&v, "seconds"),
                        opt_num(&v, "ops_per_sec"),
                        p99.to_string(),
                        opt_num(&v, "get_p50_ns"),
                        opt_num(&v, "get_p99_ns"),
                        opt_num(&v, "put_p50_ns"),
                        opt_num(&v, "put_p99_ns"),
                        opt_num(&v, "gleaners_avg"),
                        opt_num(&v, "fences_per_op"),
                    ],
                );
                labels.push(lab);
                curves[pi][si].push((rate, p99 / 1000.0));
                ctx.progress
                    .done(&format!("{rate:.3} Mops/s, p99 {:.2} µs", p99 / 1000.0));
            }
        }
    }
    let panels = PUT_PCTS
        .iter()
        .zip(curves)
        .map(|(pct, per_store)| {
            Panel::Lines(Lines {
                title: format!("{pct}% puts"),
                x_label: "throughput (Mops/s)".into(),
                y_label: "p99 latency, all operations (µs)".into(),
                y_log: true,
                series: STORES
                    .iter()
                    .zip(per_store)
                    .map(|(s, pts)| Series::new(s.2, pts))
                    .collect(),
                ..Lines::default()
            })
        })
        .collect();
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "bullet-fig5: p99 latency against throughput, points = 1..{} threads (Bullet Fig. 5)",
                ctx.max_threads
            ),
            subtitle: ctx.subtitle(&durability_note(&labels)),
            panels,
        },
    })
}

fn backend_of(v: &Value) -> String {
    v.get("backend")
        .and_then(Value::as_str)
        .unwrap_or("none")
        .to_string()
}

pub fn fig6(ctx: &mut Ctx) -> BenchResult<Report> {
    let l = load(ctx);
    let t = ctx.max_threads;
    let pct = 2.0;
    ctx.progress.plan(STORES.len() as u64);
    let mut table = Table::new(
        ctx,
        &[
            "backend",
            "put_pct",
            "keys",
            "op",
            "quantile",
            "latency_ns",
            "op_count",
            "mean_ns",
        ],
    );
    let mut gets = Vec::new();
    let mut puts = Vec::new();
    let mut labels = Vec::new();
    let cdf = CDF_POINTS.to_string();
    for &(engine, backend, name) in &STORES {
        ctx.progress
            .start(format!("{name}, {pct}% puts, {t} thread(s)"));
        let args = engine_args(ctx, (engine, backend), t, pct, &l, &["--cdf-points", &cdf]);
        let v = ctx.bench(&args, timeout(&l, l.seconds))?;
        let lab = Labels::of_engine(&v)?;
        for (op, key, count, mean, out) in [
            ("get", "get_cdf", "get_ops", "get_mean_ns", &mut gets),
            ("put", "put_cdf", "put_ops", "put_mean_ns", &mut puts),
        ] {
            let pts = cdf_points(&v, key)?;
            for &(ns, q) in &pts {
                table.push(
                    &lab,
                    vec![
                        backend_of(&v),
                        pct.to_string(),
                        l.keys.to_string(),
                        op.into(),
                        q.to_string(),
                        ns.to_string(),
                        opt_num(&v, count),
                        opt_num(&v, mean),
                    ],
                );
            }
            // The chart stops at the 99.99th percentile: the maximum of a short
            // run on a shared machine is a preemption, and would squeeze the rest.
            out.push(Series::new(
                name,
                pts.into_iter().filter(|&(_, q)| q <= 0.9999).collect(),
            ));
        }
        labels.push(lab);
        ctx.progress.done(&format!(
            "get p50 {} ns, put p50 {} ns",
            opt_num(&v, "get_p50_ns"),
            opt_num(&v, "put_p50_ns")
        ));
    }
    let panel = |title: &str, series| {
        Panel::Lines(Lines {
            title: format!("{title} (to the 99.99th percentile)"),
            x_label: "latency (ns)".into(),
            y_label: "fraction of operations at or below".into(),
            x_log: true,
            series,
            markers: false,
            ..Lines::default()
        })
    };
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "bullet-fig6: latency CDFs at {pct}% puts, {t} thread(s) (Bullet Fig. 6)"
            ),
            subtitle: ctx.subtitle(&durability_note(&labels)),
            panels: vec![panel("gets", gets), panel("puts", puts)],
        },
    })
}

/// Put percentages of Figure 7, in order.
const TRACE: [f64; 7] = [2.0, 15.0, 2.0, 0.0, 2.0, 50.0, 2.0];

pub fn fig7(ctx: &mut Ctx) -> BenchResult<Report> {
    let l = load(ctx);
    let step = if ctx.quick { 1.0 } else { 30.0 };
    let t = ctx.max_threads;
    ctx.progress.plan(1);
    ctx.progress.start(format!(
        "bullet-full, puts {TRACE:?}%, {step} s per step, {t} thread(s)"
    ));
    let steps: Vec<String> = TRACE.iter().map(|p| p.to_string()).collect();
    let args = engine_args(
        ctx,
        ("bullet-full", "logfree"),
        t,
        TRACE[0],
        &l,
        &[
            "--trace-steps",
            &steps.join(","),
            "--step-seconds",
            &step.to_string(),
        ],
    );
    let total = step * TRACE.len() as f64;
    let v = ctx.bench(&args, timeout(&l, total))?;
    let lab = Labels::of_engine(&v)?;
    let mut table = Table::new(
        ctx,
        &[
            "backend",
            "keys",
            "t_s",
            "put_pct",
            "ops_per_sec",
            "gleaners",
            "log_occupancy",
        ],
    );
    let rows = v
        .get("trace")
        .and_then(Value::as_array)
        .ok_or("no trace in the engine benchmark's output")?;
    let mut rate = Vec::new();
    let mut gleaners = Vec::new();
    for r in rows {
        let ts = num(r, "t")?;
        table.push(
            &lab,
            vec![
                backend_of(&v),
                l.keys.to_string(),
                ts.to_string(),
                opt_num(r, "put_pct"),
                opt_num(r, "ops_per_sec"),
                opt_num(r, "gleaners"),
                opt_num(r, "log_occupancy"),
            ],
        );
        rate.push((ts, num(r, "ops_per_sec")? / 1e6));
        gleaners.push((ts, num(r, "gleaners")?));
    }
    ctx.progress
        .done(&format!("{} one-second rows", rows.len()));
    let marks = TRACE
        .iter()
        .enumerate()
        .map(|(i, p)| (i as f64 * step, format!(" {p}%")))
        .collect();
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "bullet-fig7: bullet-full as the put share steps {} %, {t} thread(s) (Bullet Fig. 7)",
                steps.join("-")
            ),
            subtitle: ctx.subtitle(&durability_note(std::slice::from_ref(&lab))),
            panels: vec![Panel::Lines(Lines {
                title: "throughput each second, gleaners at its end".into(),
                x_label: "time (s)".into(),
                y_label: "throughput (Mops/s)".into(),
                series: vec![Series::new("throughput (Mops/s, left axis)", rate)],
                y2: Some((
                    "gleaners".into(),
                    vec![Series::new("gleaners (right axis)", gleaners)],
                )),
                marks,
                ..Lines::default()
            })],
        },
    })
}

/// Log sizes of Figure 8, MiB per log.
const LOG_SIZES: [u64; 4] = [1, 4, 16, 64];

pub fn fig8(ctx: &mut Ctx) -> BenchResult<Report> {
    let l = load(ctx);
    let t = ctx.max_threads;
    let pct = 2.0;
    let logs = 32;
    ctx.progress.plan(LOG_SIZES.len() as u64);
    let mut table = Table::new(
        ctx,
        &[
            "backend",
            "put_pct",
            "keys",
            "logs",
            "log_size_mib",
            "ops_per_sec",
            "get_p99_ns",
            "put_p99_ns",
            "gleaners_avg",
            "log_full_waits",
            "records_collapsed",
        ],
    );
    let mut pts = Vec::new();
    let mut labels = Vec::new();
    for mib in LOG_SIZES {
        ctx.progress.start(format!(
            "bullet-full, {logs} logs of {mib} MiB, {pct}% puts"
        ));
        let (logs_s, mib_s) = (logs.to_string(), mib.to_string());
        let args = engine_args(
            ctx,
            ("bullet-full", "logfree"),
            t,
            pct,
            &l,
            &["--logs", &logs_s, "--log-size", &mib_s],
        );
        let v = ctx.bench(&args, timeout(&l, l.seconds))?;
        let lab = Labels::of_engine(&v)?;
        let rate = mops(&v)?;
        table.push(
            &lab,
            vec![
                backend_of(&v),
                pct.to_string(),
                l.keys.to_string(),
                logs.to_string(),
                mib.to_string(),
                opt_num(&v, "ops_per_sec"),
                opt_num(&v, "get_p99_ns"),
                opt_num(&v, "put_p99_ns"),
                opt_num(&v, "gleaners_avg"),
                opt_num(&v, "log_full_waits"),
                opt_num(&v, "records_collapsed"),
            ],
        );
        labels.push(lab);
        pts.push((mib as f64, rate));
        ctx.progress.done(&format!("{rate:.3} Mops/s"));
    }
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "bullet-fig8: bullet-full throughput against log size, {logs} logs, {pct}% puts, {t} thread(s) (Bullet Fig. 8)"
            ),
            subtitle: ctx.subtitle(&durability_note(&labels)),
            panels: vec![Panel::Lines(Lines {
                title: "throughput against the size of each log".into(),
                x_label: "log size (MiB per log)".into(),
                y_label: "throughput (Mops/s)".into(),
                x_log: true,
                series: vec![Series::new(format!("bullet-full, {pct}% puts"), pts)],
                ..Lines::default()
            })],
        },
    })
}
