//! What Redis applications call beyond plain commands: Lua scripts, MULTI/EXEC
//! transactions and Pub/Sub fan-out, Ember against `redis-server` with AOF.
//!
//! Each round starts a fresh Ember (the default engine; `--durability pmem`,
//! or msync with `--strategy msync`) and a fresh `redis-server` (AOF
//! `appendfsync everysec`; `always` against Ember msync), alternating (A B A
//! B), and runs on each, at -P 1 and -P 16 (four times the requests):
//! - SET: `redis-benchmark -t set -d 100 -r 100000 -c 50`, the reference;
//! - EVAL: `redis-benchmark -c 50 -r 100000 EVAL SCRIPT 2 key:__rand_int__
//!   COUNTER VALUE` with [`SCRIPT`] (SET a random key to a 100-byte value,
//!   INCR a counter);
//! - EVALSHA: the same script loaded with SCRIPT LOAD, called by its SHA1;
//! - MULTI/EXEC: `MULTI; SET key:R VALUE; INCR counter:R; EXEC` from 50
//!   connections ([`respload::transactions`]; -P counts commands, so at -P 1
//!   a transaction is four round trips);
//! - PUBLISH fan-out: 50 subscribers on one channel, [`PUBLISHERS`]
//!   publishers with -P messages in flight each ([`respload::fanout`]); a
//!   message counts once every subscriber has it.
//!
//! `redis-benchmark` counts an error reply as a request, so each script run
//! uses a counter of its own and checks afterwards that the script ran for
//! every request. The load generator checks every reply itself.
//!
//! Rows: every round, then the medians with Ember/Redis (the median of the
//! per-round ratios); the summary printed at the end has the goals (1.0x at
//! -P 1, 1.3x at -P 16) beside the ratios.

use super::chart::{Bars, Chart, Panel};
use super::resp::Reply;
use super::respload::{self, FanoutLoad, Outcome, TxLoad, TX_COMMANDS};
use super::servers::{redis_benchmark, BenchLoad, Kind, RedisMode, Server};
use super::table::{Labels, Table};
use super::udorn::{load_preamble, server_version, start_for_load, LOAD_COLUMNS, VALUE_SIZE};
use super::{median, BenchResult, Ctx, Report};
use std::time::Duration;

/// The script of EVAL and EVALSHA: a write and a counted call.
pub const SCRIPT: &str = "redis.call('SET', KEYS[1], ARGV[1]) return redis.call('INCR', KEYS[2])";
/// Subscribers of the fan-out channel.
pub const SUBSCRIBERS: usize = 50;
/// Publishing connections of the fan-out workload.
pub const PUBLISHERS: usize = 4;
/// Connections of every other workload (`redis-benchmark`'s default).
const CLIENTS: usize = 50;
const KEYSPACE: u64 = 100_000;

/// The workloads, in order; the test names of the rows.
const TESTS: [&str; 5] = ["SET", "EVAL", "EVALSHA", "MULTI/EXEC", "PUBLISH"];

/// The goal of Ember/Redis at pipeline depth `p`.
fn goal(p: u32) -> f64 {
    if p == 1 {
        1.0
    } else {
        1.3
    }
}

/// Requests of each workload at -P 1 (-P 16 runs four times as many):
/// SET and the scripts in requests, MULTI/EXEC in transactions, PUBLISH in
/// messages.
struct Sizes {
    set: u64,
    script: u64,
    tx: u64,
    publish: u64,
}

/// One measured workload on one server.
struct Measured {
    test: &'static str,
    /// What `requests` and `rps` count.
    unit: &'static str,
    clients: usize,
    requests: u64,
    rps: f64,
    avg_ms: String,
    p50_ms: String,
    p99_ms: String,
    /// PUBLISH: messages received by the subscribers per second.
    deliveries_per_sec: String,
}

fn ms(v: f64) -> String {
    format!("{v:.3}")
}

/// A row of our own generator's outcome.
fn measured(test: &'static str, unit: &'static str, clients: usize, o: &Outcome) -> Measured {
    Measured {
        test,
        unit,
        clients,
        requests: o.units,
        rps: o.per_sec(),
        avg_ms: ms(o.avg_ms),
        p50_ms: ms(o.p50_ms),
        p99_ms: ms(o.p99_ms),
        deliveries_per_sec: if o.deliveries > 0 {
            format!("{:.0}", o.deliveries as f64 / o.seconds)
        } else {
            String::new()
        },
    }
}

/// The integer value of `key` (0 when it does not exist).
fn counter(s: &Server, key: &str) -> BenchResult<i64> {
    match s
        .conn(Duration::from_secs(30))?
        .call(&[b"GET", key.as_bytes()])
    {
        Ok(Reply::Bulk(None)) => Ok(0),
        Ok(Reply::Bulk(Some(b))) => String::from_utf8_lossy(&b)
            .parse()
            .map_err(|_| format!("GET {key}: not a number: {b:?}")),
        r => Err(format!("GET {key} answered {r:?}")),
    }
}

/// Runs one script workload with `redis-benchmark` (`call` is `EVAL SCRIPT`
/// or `EVALSHA SHA`) and checks that the script ran once for every request.
fn script_run(
    ctx: &Ctx,
    s: &Server,
    test: &'static str,
    call: [&str; 2],
    p: u32,
    requests: u64,
    timeout: Duration,
) -> BenchResult<Measured> {
    let calls = format!("calls:{test}:P{p}");
    let value = "v".repeat(VALUE_SIZE);
    let command = [
        call[0],
        call[1],
        "2",
        "key:__rand_int__",
        calls.as_str(),
        value.as_str(),
    ];
    let load = BenchLoad {
        tests: "",
        requests,
        clients: CLIENTS as u32,
        pipeline: p,
        data_size: VALUE_SIZE,
        keyspace: KEYSPACE,
        command: &command,
    };
    let lines = redis_benchmark(s.port, &load, timeout, ctx.stop_flag())?;
    let [l] = lines.as_slice() else {
        return Err(format!("{test}: redis-benchmark reported {lines:?}"));
    };
    // redis-benchmark may send up to a pipeline per client beyond -n.
    let ran = counter(s, &calls)?;
    let most = requests + u64::from(load.clients) * u64::from(p);
    if ran < requests as i64 || ran > most as i64 {
        return Err(format!(
            "{test} -P {p}: the script ran {ran} times for {requests} requests (errors?)"
        ));
    }
    Ok(Measured {
        test,
        unit: "requests",
        clients: CLIENTS,
        requests,
        rps: l.rps,
        avg_ms: l.avg_ms.clone(),
        p50_ms: l.p50_ms.clone(),
        p99_ms: l.p99_ms.clone(),
        deliveries_per_sec: String::new(),
    })
}

/// Every workload at depth `p` on `s`, in [`TESTS`] order.
fn workloads(ctx: &Ctx, s: &Server, p: u32, z: &Sizes) -> BenchResult<Vec<Measured>> {
    let x = if p == 1 { 1 } else { 4 };
    let timeout = Duration::from_secs(if ctx.quick { 300 } else { 1800 });
    let stop = ctx.stop_flag();
    let mut out = Vec::new();

    let load = BenchLoad {
        tests: "set",
        requests: z.set * x,
        clients: CLIENTS as u32,
        pipeline: p,
        data_size: VALUE_SIZE,
        keyspace: KEYSPACE,
        command: &[],
    };
    let lines = redis_benchmark(s.port, &load, timeout, stop)?;
    let [l] = lines.as_slice() else {
        return Err(format!("SET: redis-benchmark reported {lines:?}"));
    };
    out.push(Measured {
        test: "SET",
        unit: "requests",
        clients: CLIENTS,
        requests: load.requests,
        rps: l.rps,
        avg_ms: l.avg_ms.clone(),
        p50_ms: l.p50_ms.clone(),
        p99_ms: l.p99_ms.clone(),
        deliveries_per_sec: String::new(),
    });
    ctx.check_stop()?;

    out.push(script_run(
        ctx,
        s,
        "EVAL",
        ["EVAL", SCRIPT],
        p,
        z.script * x,
        timeout,
    )?);
    let sha = match s
        .conn(Duration::from_secs(30))?
        .call(&[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()])
    {
        Ok(Reply::Bulk(Some(b))) if b.len() == 40 => String::from_utf8_lossy(&b).into_owned(),
        r => return Err(format!("SCRIPT LOAD answered {r:?}")),
    };
    out.push(script_run(
        ctx,
        s,
        "EVALSHA",
        ["EVALSHA", &sha],
        p,
        z.script * x,
        timeout,
    )?);
    ctx.check_stop()?;

    let tx = respload::transactions(
        &TxLoad {
            port: s.port,
            clients: CLIENTS,
            pipeline: p as usize,
            transactions: z.tx * x,
            keyspace: KEYSPACE,
            value_size: VALUE_SIZE,
            seed: u64::from(p),
        },
        stop,
    )
    .map_err(|e| format!("MULTI/EXEC -P {p}: {e}"))?;
    if tx.commands != tx.units * TX_COMMANDS {
        return Err(format!(
            "MULTI/EXEC -P {p}: {} commands answered for {} transactions",
            tx.commands, tx.units
        ));
    }
    out.push(measured("MULTI/EXEC", "transactions", CLIENTS, &tx));
    ctx.check_stop()?;

    let fan = respload::fanout(
        &FanoutLoad {
            port: s.port,
            subscribers: SUBSCRIBERS,
            publishers: PUBLISHERS,
            pipeline: p as usize,
            messages: z.publish * x,
            value_size: VALUE_SIZE,
        },
        stop,
    )
    .map_err(|e| format!("PUBLISH -P {p}: {e}"))?;
    out.push(measured("PUBLISH", "messages", PUBLISHERS, &fan));
    Ok(out)
}

/// The servers: Ember in the default durability (pmem) against Redis AOF
/// everysec, or Ember msync against Redis AOF always with `--strategy msync`.
fn kinds(ctx: &Ctx) -> [Kind; 2] {
    if ctx.strategy == "msync" {
        [
            Kind::Ember { msync: true },
            Kind::Redis(RedisMode::AofAlways),
        ]
    } else {
        [
            Kind::Ember { msync: false },
            Kind::Redis(RedisMode::AofEverysec),
        ]
    }
}

pub fn run(ctx: &mut Ctx) -> BenchResult<Report> {
    let kinds = kinds(ctx);
    let pipelines = [1u32, 16];
    let rounds = ctx.rounds(3);
    let z = if ctx.quick {
        Sizes {
            set: 2_000,
            script: 1_000,
            tx: 300,
            publish: 200,
        }
    } else {
        Sizes {
            set: 200_000,
            script: 100_000,
            tx: 50_000,
            publish: 20_000,
        }
    };
    let version = load_preamble(ctx)?;
    ctx.progress.plan((rounds * kinds.len()) as u64);
    let extra = [
        "unit",
        "subscribers",
        "deliveries_per_sec",
        "ratio_vs_redis",
        "server_version",
    ];
    let mut table = Table::new(ctx, &[&LOAD_COLUMNS[..], &extra].concat());
    // [pipeline][kind][test] -> throughput of every round.
    let mut rps = vec![vec![vec![Vec::<f64>::new(); TESTS.len()]; kinds.len()]; pipelines.len()];
    let mut labels: Vec<Option<Labels>> = vec![None; kinds.len()];
    let mut ember_note = Vec::new();
    for round in 1..=rounds {
        for (si, &kind) in kinds.iter().enumerate() {
            let server = start_for_load(ctx, kind, round, &mut ember_note)?;
            labels[si] = Some(server.lab.clone());
            let mut summary = Vec::new();
            for (pi, &p) in pipelines.iter().enumerate() {
                for m in workloads(ctx, &server.s, p, &z)? {
                    let ti = TESTS.iter().position(|t| *t == m.test).expect("a test");
                    rps[pi][si][ti].push(m.rps);
                    table.push(
                        &server.lab,
                        row(&m, p, round.to_string(), "", kind, &version),
                    );
                    summary.push(format!("{} P{p} {:.0}k/s", m.test, m.rps / 1e3));
                }
            }
            // Killed, not shut down, as in udorn-fig5.
            drop(server);
            ctx.progress.done(&summary.join(", "));
        }
    }

    // The median rows, with Ember/Redis as the median of the per-round ratios.
    let mut lines = Vec::new();
    let mut ratio_med = vec![vec![None; TESTS.len()]; pipelines.len()];
    for (pi, &p) in pipelines.iter().enumerate() {
        for (ti, &test) in TESTS.iter().enumerate() {
            let (e, r) = (&rps[pi][0][ti], &rps[pi][1][ti]);
            let ratios: Vec<f64> = e.iter().zip(r).map(|(a, b)| a / b).collect();
            let ratio = median(&ratios);
            ratio_med[pi][ti] = Some(ratio);
            for (si, &kind) in kinds.iter().enumerate() {
                let Some(lab) = &labels[si] else { continue };
                let m = Measured {
                    test,
                    unit: unit_of(test),
                    clients: if test == "PUBLISH" {
                        PUBLISHERS
                    } else {
                        CLIENTS
                    },
                    requests: 0,
                    rps: median(&rps[pi][si][ti]),
                    avg_ms: String::new(),
                    p50_ms: String::new(),
                    p99_ms: String::new(),
                    deliveries_per_sec: String::new(),
                };
                let r = if si == 0 {
                    format!("{ratio:.3}")
                } else {
                    String::new()
                };
                table.push(lab, row(&m, p, "median".into(), &r, kind, &version));
            }
            let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().copied().fold(0.0, f64::max);
            let range = format!("{ratio:.2}x ({lo:.2}-{hi:.2})");
            lines.push(format!(
                "| {test:<10} | {p:>2} | {:<12} | {:>11.0} | {:>11.0} | {range:<20} | {:>4.1}x | {:<7} |",
                unit_of(test),
                median(e),
                median(r),
                goal(p),
                if ratio >= goal(p) { "met" } else { "NOT met" },
            ));
        }
    }
    let ember_note = ember_note.join(", ");
    println!(
        "\nscripts-txn-pubsub: Ember ({ember_note}) against redis-server {version} ({}); medians of {rounds} round(s), ratio = median of the per-round Ember/Redis\n\
         machine: {}\nmode: {} run, commit {}\n\
         | test       | -P | unit         | ember /s    | redis /s    | ember/redis (range)  | goal  | status  |\n\
         |------------|----|--------------|-------------|-------------|----------------------|-------|---------|\n{}",
        kinds[1].label(),
        ctx.machine.line(),
        ctx.mode(),
        super::COMMIT,
        lines.join("\n")
    );

    let mut panels = Vec::new();
    for (pi, &p) in pipelines.iter().enumerate() {
        panels.push(Panel::Bars(Bars {
            title: format!("-P {p}: requests, transactions or messages per second"),
            y_label: "per second".into(),
            groups: TESTS.iter().map(|t| t.to_string()).collect(),
            series: kinds
                .iter()
                .enumerate()
                .map(|(si, k)| {
                    let v = rps[pi][si]
                        .iter()
                        .map(|v| (!v.is_empty()).then(|| median(v)))
                        .collect();
                    (k.label().to_string(), v)
                })
                .collect(),
        }));
    }
    panels.push(Panel::Bars(Bars {
        title: "Ember / Redis (median of the per-round ratios; goals 1.0x at -P 1, 1.3x at -P 16)"
            .into(),
        y_label: "ratio".into(),
        groups: TESTS.iter().map(|t| t.to_string()).collect(),
        series: pipelines
            .iter()
            .zip(&ratio_med)
            .map(|(p, v)| (format!("ember/redis -P {p}"), v.clone()))
            .collect(),
    }));
    Ok(Report {
        table,
        chart: Chart {
            title: format!(
                "scripts-txn-pubsub: EVAL, EVALSHA, MULTI/EXEC, PUBLISH to {SUBSCRIBERS} subscribers, Ember against redis-server {version} (median of {rounds})"
            ),
            subtitle: ctx.subtitle(&format!(
                "Ember durability {ember_note}; Redis {}",
                kinds[1].label().trim_start_matches("redis ")
            )),
            panels,
        },
    })
}

fn unit_of(test: &str) -> &'static str {
    match test {
        "MULTI/EXEC" => "transactions",
        "PUBLISH" => "messages",
        _ => "requests",
    }
}

/// The cells of a row: [`LOAD_COLUMNS`] (in its order), then this
/// scenario's columns. `round` is a number or "median" (whose row leaves the
/// request count and latencies empty).
fn row(m: &Measured, p: u32, round: String, ratio: &str, kind: Kind, version: &str) -> Vec<String> {
    vec![
        m.test.to_string(),
        p.to_string(),
        m.clients.to_string(),
        if m.requests == 0 {
            String::new()
        } else {
            m.requests.to_string()
        },
        VALUE_SIZE.to_string(),
        KEYSPACE.to_string(),
        round,
        format!("{:.0}", m.rps),
        m.avg_ms.clone(),
        m.p50_ms.clone(),
        m.p99_ms.clone(),
        m.unit.to_string(),
        if m.test == "PUBLISH" {
            SUBSCRIBERS.to_string()
        } else {
            String::new()
        },
        m.deliveries_per_sec.clone(),
        ratio.to_string(),
        server_version(kind, version),
    ]
}
