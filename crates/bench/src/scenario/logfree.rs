//! Log-free data structures (ATC '18) §6: Figures 5, 8 and 10, from `ember bench
//! index --json` and `ember bench recovery --json` runs.
//!
//! Workload of Figures 5 and 8: updates only (half inserts, half removes of
//! random keys of a range twice the size), 8-byte keys and values. The paper
//! compares against lock-based structures with hand-written redo logging; here
//! the redo-log baseline exists for the hash table only (`phash`), so the skip
//! list is shown in absolute numbers.

use super::chart::{Bars, Chart, Lines, Panel, Series};
use super::table::{Labels, Table};
use super::{num, opt_num, text, BenchResult, Ctx, Report};
use serde_json::Value;
use std::time::Duration;

/// (structure, implementation) pairs of the update figures.
const IMPLS: [(&str, &str); 5] = [
    ("hash", "logfree"),
    ("hash", "logfree-nocache"),
    ("hash", "redo"),
    ("skiplist", "logfree"),
    ("skiplist", "logfree-nocache"),
];

/// Series names of the implementations.
fn impl_name(imp: &str) -> &'static str {
    match imp {
        "logfree" => "logfree (link-and-persist + link cache)",
        "logfree-nocache" => "logfree-nocache (link-and-persist)",
        _ => "redo (lock-based, redo log)",
    }
}

fn labels(v: &Value, structure: &str, imp: &str, fence_ns: Option<u64>) -> BenchResult<Labels> {
    let strategy = text(v, "strategy")?;
    Ok(Labels {
        engine: structure.to_string(),
        variant: imp.to_string(),
        durability: if strategy == "msync" { "msync" } else { "pmem" }.into(),
        strategy,
        fence_ns: match fence_ns {
            Some(f) => f,
            None => num(v, "fence_ns")? as u64,
        },
        read_ns: v.get("read_ns").and_then(|x| x.as_u64()).unwrap_or(0),
        threads: num(v, "threads")? as usize,
    })
}

/// One `ember bench index` run of updates only.
fn index_run(
    ctx: &Ctx,
    structure: &str,
    imp: &str,
    size: u64,
    threads: usize,
) -> BenchResult<Value> {
    let seconds = if ctx.quick { 0.2 } else { 2.0 };
    let args: Vec<String> = [
        "index",
        "--structure",
        structure,
        "--impl",
        imp,
        "--size",
        &size.to_string(),
        "--threads",
        &threads.to_string(),
        "--update-ratio",
        "1",
        "--seconds",
        &seconds.to_string(),
        "--fence-ns",
        &ctx.fence_ns.to_string(),
        "--read-ns",
        &ctx.read_ns.to_string(),
        "--strategy",
        &ctx.strategy,
        "--dir",
        &ctx.work_dir().display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let timeout = Duration::from_secs_f64(60.0 + 5.0 * seconds + size as f64 / 50_000.0);
    ctx.bench(&args, timeout)
}

const UPDATE_COLUMNS: [&str; 12] = [
    "structure",
    "impl",
    "implementation",
    "size",
    "update_ratio",
    "durable_at",
    "seconds",
    "ops_per_sec",
    "ratio_vs_redo",
    "p99_ns",
    "fences_per_op",
    "flushes_per_op",
];

/// One measured update run.
struct Run {
    structure: &'static str,
    imp: &'static str,
    size: u64,
    threads: usize,
    ops: f64,
    labels: Labels,
    v: Value,
}

/// Runs every (structure, impl) of `IMPLS` at each size and thread count, the
/// implementations back to back at each setting.
fn update_runs(
    ctx: &mut Ctx,
    sizes: &[u64],
    impls: &[(&'static str, &'static str)],
) -> BenchResult<Vec<Run>> {
    let threads = ctx.thread_ends();
    ctx.progress
        .plan((sizes.len() * threads.len() * impls.len()) as u64);
    let mut runs = Vec::new();
    for &size in sizes {
        for &t in &threads {
            for &(structure, imp) in impls {
                ctx.progress
                    .start(format!("{structure} {imp}, {size} keys, {t} thread(s)"));
                let v = index_run(ctx, structure, imp, size, t)?;
                let ops = num(&v, "ops_per_sec")?;
                ctx.progress.done(&format!("{:.3} M updates/s", ops / 1e6));
                runs.push(Run {
                    structure,
                    imp,
                    size,
                    threads: t,
                    ops,
                    labels: labels(&v, structure, imp, None)?,
                    v,
                });
            }
        }
    }
    Ok(runs)
}

/// Throughput of the run divided by the redo baseline's at the same structure,
/// size and threads (None without a baseline).
fn ratio(runs: &[Run], r: &Run) -> Option<f64> {
    runs.iter()
        .find(|b| {
            b.imp == "redo"
                && b.structure == r.structure
                && b.size == r.size
                && b.threads == r.threads
        })
        .filter(|b| b.ops > 0.0)
        .map(|b| r.ops / b.ops)
}

fn update_table(ctx: &Ctx, runs: &[Run]) -> BenchResult<Table> {
    let mut table = Table::new(ctx, &UPDATE_COLUMNS);
    for r in runs {
        table.push(
            &r.labels,
            vec![
                r.structure.into(),
                r.imp.into(),
                text(&r.v, "implementation")?,
                r.size.to_string(),
                opt_num(&r.v, "update_ratio"),
                text(&r.v, "durable_at")?,
                opt_num(&r.v, "elapsed_s"),
                r.ops.to_string(),
                ratio(runs, r).map(|x| x.to_string()).unwrap_or_default(),
                opt_num(&r.v, "p99_ns"),
                opt_num(&r.v, "fences_per_op"),
                opt_num(&r.v, "flushes_per_op"),
            ],
        );
    }
    Ok(table)
}

fn strategy_note(runs: &[Run]) -> String {
    let s = runs
        .first()
        .map(|r| format!("{} ({})", r.labels.durability, r.labels.strategy))
        .unwrap_or_default();
    format!("durability {s}")
}

fn threads_name(t: usize) -> String {
    if t == 1 {
        "1 thread".into()
    } else {
        format!("{t} threads")
    }
}

pub fn fig8(ctx: &mut Ctx) -> BenchResult<Report> {
    let size = 1024;
    let runs = update_runs(ctx, &[size], &IMPLS)?;
    let threads = ctx.thread_ends();
    let table = update_table(ctx, &runs)?;
    let find = |s: &str, i: &str, t: usize| {
        runs.iter()
            .find(|r| r.structure == s && r.imp == i && r.threads == t)
    };
    let mut groups = Vec::new();
    let mut hash_groups = Vec::new();
    for s in ["hash", "skiplist"] {
        for &t in &threads {
            groups.push((s, t));
            if s == "hash" {
                hash_groups.push((s, t));
            }
        }
    }
    let imps = ["logfree", "logfree-nocache", "redo"];
    let absolute = Bars {
        title: "update throughput (M updates/s)".into(),
        y_label: "M updates/s".into(),
        groups: groups
            .iter()
            .map(|(s, t)| format!("{s}, {}", threads_name(*t)))
            .collect(),
        series: imps
            .iter()
            .map(|i| {
                let vals = groups
                    .iter()
                    .map(|&(s, t)| find(s, i, t).map(|r| r.ops / 1e6))
                    .collect();
                (impl_name(i).to_string(), vals)
            })
            .collect(),
    };
    let relative = Bars {
        title: "hash table, normalised to the redo-log baseline".into(),
        y_label: "throughput / redo's".into(),
        groups: hash_groups
            .iter()
            .map(|(s, t)| format!("{s}, {}", threads_name(*t)))
            .collect(),
        series: imps
            .iter()
            .map(|i| {
                let vals = hash_groups
                    .iter()
                    .map(|&(s, t)| find(s, i, t).and_then(|r| ratio(&runs, r)))
                    .collect();
                (impl_name(i).to_string(), vals)
            })
            .collect(),
    };
    Ok(Report {
        chart: Chart {
            title: format!(
                "logfree-fig8: update throughput by structure, {size} keys, 100% updates (log-free Fig. 8; no redo skip list)"
            ),
            subtitle: ctx.subtitle(&strategy_note(&runs)),
            panels: vec![Panel::Bars(absolute), Panel::Bars(relative)],
        },
        table,
    })
}

pub fn fig5(ctx: &mut Ctx) -> BenchResult<Report> {
    let sizes: &[u64] = if ctx.quick {
        &[1024, 8192, 65_536]
    } else {
        &[1024, 16_384, 262_144, 1_048_576, 4_194_304]
    };
    let impls = [
        ("hash", "logfree"),
        ("hash", "redo"),
        ("skiplist", "logfree"),
    ];
    let runs = update_runs(ctx, sizes, &impls)?;
    let threads = ctx.thread_ends();
    let table = update_table(ctx, &runs)?;
    let ratios = threads
        .iter()
        .map(|&t| {
            let pts = runs
                .iter()
                .filter(|r| r.structure == "hash" && r.imp == "logfree" && r.threads == t)
                .filter_map(|r| ratio(&runs, r).map(|x| (r.size as f64, x)))
                .collect();
            Series::new(format!("hash logfree / redo, {}", threads_name(t)), pts)
        })
        .collect();
    let mut absolute = Vec::new();
    for &(s, i) in &impls {
        for &t in &threads {
            let pts = runs
                .iter()
                .filter(|r| r.structure == s && r.imp == i && r.threads == t)
                .map(|r| (r.size as f64, r.ops / 1e6))
                .collect();
            absolute.push(Series::new(format!("{s} {i}, {}", threads_name(t)), pts));
        }
    }
    Ok(Report {
        chart: Chart {
            title: "logfree-fig5: update throughput against size, log-free against redo logging (log-free Fig. 5)".into(),
            subtitle: ctx.subtitle(&strategy_note(&runs)),
            panels: vec![
                Panel::Lines(Lines {
                    title: "hash table: log-free throughput / redo-log throughput".into(),
                    x_label: "keys in the structure".into(),
                    y_label: "ratio".into(),
                    x_log: true,
                    series: ratios,
                    ..Lines::default()
                }),
                Panel::Lines(Lines {
                    title: "update throughput".into(),
                    x_label: "keys in the structure".into(),
                    y_label: "M updates/s".into(),
                    x_log: true,
                    series: absolute,
                    ..Lines::default()
                }),
            ],
        },
        table,
    })
}

pub fn fig10(ctx: &mut Ctx) -> BenchResult<Report> {
    let sizes: &[u64] = if ctx.quick {
        &[1000, 10_000, 50_000]
    } else {
        &[10_000, 100_000, 1_000_000, 4_000_000]
    };
    let impls = [
        ("hash", "logfree"),
        ("skiplist", "logfree"),
        ("hash", "redo"),
    ];
    let threads = ctx.max_threads.min(64);
    let updates = if ctx.quick { 2_000 } else { 20_000 };
    if ctx.fence_ns != 0 {
        ctx.progress.note(
            "ember bench recovery has no fence knob: recovery runs without emulation (rows say fence_ns 0)",
        );
    }
    if ctx.strategy != "auto" {
        ctx.progress.note(
            "ember bench recovery always uses the detected strategy; --strategy does not apply",
        );
    }
    ctx.progress.plan((sizes.len() * impls.len()) as u64);
    let mut table = Table::new(
        ctx,
        &[
            "structure",
            "impl",
            "implementation",
            "size",
            "recovery_ms",
            "open_ms",
            "attach_ms",
            "sweep_ms",
            "active_pages",
            "slots_examined",
            "leaked_freed",
            "repaired",
            "keys_after",
            "heap_file_len",
            "fill_s",
        ],
    );
    let mut curves: Vec<Vec<(f64, f64)>> = vec![Vec::new(); impls.len()];
    let mut note = String::new();
    for &size in sizes {
        for (k, &(s, i)) in impls.iter().enumerate() {
            ctx.progress
                .start(format!("{s} {i}, {size} keys, SIGKILL during updates"));
            let args: Vec<String> = [
                "recovery",
                "--structure",
                s,
                "--impl",
                i,
                "--size",
                &size.to_string(),
                "--threads",
                &threads.to_string(),
                "--updates",
                &updates.to_string(),
                "--dir",
                &ctx.work_dir().display().to_string(),
            ]
            .iter()
            .map(|a| a.to_string())
            .collect();
            let timeout = Duration::from_secs_f64(60.0 + size as f64 / 20_000.0);
            let v = ctx.bench(&args, timeout)?;
            let lab = labels(&v, s, i, Some(0))?;
            if note.is_empty() {
                note = format!("durability {} ({})", lab.durability, lab.strategy);
            }
            let ms = num(&v, "recovery_ms")?;
            table.push(
                &lab,
                vec![
                    s.into(),
                    i.into(),
                    text(&v, "implementation")?,
                    size.to_string(),
                    ms.to_string(),
                    opt_num(&v, "open_ms"),
                    opt_num(&v, "attach_ms"),
                    opt_num(&v, "sweep_ms"),
                    opt_num(&v, "active_pages"),
                    opt_num(&v, "slots_examined"),
                    opt_num(&v, "leaked_freed"),
                    opt_num(&v, "repaired"),
                    opt_num(&v, "keys_after"),
                    opt_num(&v, "heap_file_len"),
                    opt_num(&v, "fill_s"),
                ],
            );
            curves[k].push((size as f64, ms));
            ctx.progress.done(&format!("recovered in {ms:.3} ms"));
        }
    }
    Ok(Report {
        table,
        chart: Chart {
            title: "logfree-fig10: recovery time after SIGKILL against size, page cache warm (log-free Fig. 10)".into(),
            subtitle: format!(
                "{}, {} cores · {note} · no emulation (bench recovery has no fence knob) · commit {} · {} run",
                ctx.machine.cpu,
                ctx.machine.cores,
                super::COMMIT,
                ctx.mode()
            ),
            panels: vec![Panel::Lines(Lines {
                title: "open + attach + repair and leak sweep".into(),
                x_label: "keys in the structure".into(),
                y_label: "recovery time (ms)".into(),
                x_log: true,
                y_log: true,
                series: impls
                    .iter()
                    .zip(curves)
                    .map(|((s, i), pts)| Series::new(format!("{s} {i}"), pts))
                    .collect(),
                ..Lines::default()
            })],
        },
    })
}
