//! `ember bench recovery`: the time to recover an index structure after a crash
//! (log-free paper Figure 10).
//!
//! The crash is real: `ember bench recovery` starts a copy of itself (the hidden
//! `ember bench recovery-fill`) that creates a heap, builds the structure with
//! `--size` random keys of a range of `2 × size` (8-byte keys and values by
//! default), runs a burst of random updates so that the active page tables hold
//! recent allocations and unlinks, prints `ready`, and then keeps updating until
//! it is killed with SIGKILL, in the middle of operations. The parent then times,
//! in its own process:
//!
//! 1. `Heap::open` (superblock, mapping, replay of committed redo logs),
//! 2. attaching the structure found at the heap root ([`index::any::attach_any`]),
//! 3. [`index::recover`]: repair of interrupted removals and the leak sweep over
//!    every block slot of the active pages.
//!
//! `recovery_ms` is the sum, measured as one interval. SIGKILL ends the process,
//! not the machine: stores that were never flushed still reach the file through
//! the page cache. Recovery does the same work either way (it reads the active
//! page tables and the structure's links), but the file is warm in the page cache:
//! the paper purges CPU caches, not an OS page cache, and neither is done here
//! (`page_cache: "warm"`).

use super::index::{create, encode_key, heap_bytes_for, prefill, Impl, Structure};
use super::{BenchResult, Machine, TempPath};
use clap::Args;
use index::any::{attach_any, AnyHandle};
use index::{Index, Ops};
use pmem::{Geometry, Heap, HeapOptions, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct RecoveryArgs {
    /// Which structure (the log-free one; `--impl` picks the variant).
    #[arg(long, value_enum, default_value = "hash")]
    pub structure: Structure,
    /// Implementation of the structure built before the crash.
    #[arg(long = "impl", value_enum, default_value = "logfree")]
    pub imp: Impl,
    /// Keys in the structure at the crash.
    #[arg(long, default_value_t = 1_000_000)]
    pub size: u64,
    /// Threads that build and update the structure in the child.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Random updates per thread between the fill and `ready` (they populate the
    /// active page tables).
    #[arg(long, default_value_t = 20_000)]
    pub updates: u64,
    /// Milliseconds of further updates between `ready` and SIGKILL.
    #[arg(long, default_value_t = 50)]
    pub kill_after_ms: u64,
    /// What the child does between `ready` and SIGKILL: keep updating (`update`),
    /// or nothing, with every handle synced and dropped (`idle`).
    #[arg(long, value_enum, default_value = "update")]
    pub crash_while: CrashWhile,
    /// Directory for the heap file (default: the system temp dir). The file is
    /// removed at the end, also when this process is stopped by SIGINT, SIGTERM
    /// or SIGHUP or panics; a SIGKILL leaves ember-bench-recovery-PID-*.heap.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the crashed heap file (and print its path) instead of removing it.
    #[arg(long)]
    pub keep: bool,
    /// After recovery, also walk the structure (exact key count) and compare its
    /// blocks with the heap's allocated blocks (not part of recovery_ms).
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// The hidden child of `bench recovery` (and of the tests): builds a structure in
/// a new heap at `--path`, prints `ready`, updates until killed.
#[derive(Args, Debug)]
pub struct FillArgs {
    /// The heap file to create (must not exist).
    #[arg(long)]
    pub path: PathBuf,
    #[arg(long, value_enum, default_value = "hash")]
    pub structure: Structure,
    #[arg(long = "impl", value_enum, default_value = "logfree")]
    pub imp: Impl,
    #[arg(long, default_value_t = 1000)]
    pub size: u64,
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Updates per thread before `ready`.
    #[arg(long, default_value_t = 1000)]
    pub updates: u64,
    /// After `ready`: keep updating until killed (`update`; `ready ~N` gives an
    /// estimate), wait to be killed with every handle synced (`idle`; `ready N`
    /// gives the exact key count), or close the heap cleanly and exit (`exit`).
    #[arg(long, value_enum, default_value = "update")]
    pub after_ready: AfterReady,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CrashWhile {
    Update,
    Idle,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AfterReady {
    Update,
    Idle,
    Exit,
}

const KEY: usize = 8;
const VALUE: usize = 8;

fn heap_options(size: u64, threads: usize) -> HeapOptions {
    let bytes = heap_bytes_for(size, KEY, VALUE, size.next_power_of_two());
    HeapOptions {
        size: bytes,
        max_size: bytes.saturating_mul(4),
        strategy: Strategy::detect(),
        geometry: Geometry {
            nslots: (threads as u64 + 2).max(Geometry::default().nslots),
            ..Geometry::default()
        },
        ..Default::default()
    }
}

/// `ember bench recovery-fill`.
pub fn fill(args: &FillArgs) -> BenchResult<()> {
    let threads = args.threads.clamp(1, 64);
    let heap =
        Heap::create(&args.path, &heap_options(args.size, threads)).map_err(|e| e.to_string())?;
    let t = create(
        &heap,
        args.structure,
        args.imp,
        args.size.next_power_of_two(),
    )?;
    prefill(&t, args.size, threads, KEY, VALUE, args.seed)?;
    let range = args.size.saturating_mul(2).max(1);
    let forever = args.after_ready == AfterReady::Update;
    let ready = std::sync::Barrier::new(threads + 1);
    let say_ready = |keys: String| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready {keys} keys in {}", args.path.display());
        let _ = out.flush();
    };
    std::thread::scope(|s| -> BenchResult<()> {
        let hs: Vec<_> = (0..threads as u64)
            .map(|i| {
                let (t, ready) = (&t, &ready);
                s.spawn(move || -> BenchResult<()> {
                    let mut rng = SmallRng::seed_from_u64(args.seed.wrapping_add(100 + i));
                    let mut key = [0u8; KEY];
                    let mut n = 0u64;
                    let mut one = |h: &mut AnyHandle| -> index::Result<()> {
                        let k = rng.random_range(0..range);
                        encode_key(k, &mut key);
                        if rng.random_bool(0.5) {
                            h.insert(&key, &n.to_le_bytes())?;
                        } else {
                            h.remove(&key)?;
                        }
                        n += 1;
                        Ok(())
                    };
                    let r = t.handle().and_then(|mut h| {
                        for _ in 0..args.updates {
                            one(&mut h)?;
                        }
                        h.sync()?;
                        Ok(h)
                    });
                    // Every thread passes the barrier, also after a failure.
                    ready.wait();
                    let mut h = r.map_err(|e| e.to_string())?;
                    if forever {
                        loop {
                            one(&mut h).map_err(|e| e.to_string())?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        ready.wait();
        if forever {
            say_ready(format!("~{}", t.len_estimate()));
        }
        for h in hs {
            h.join()
                .unwrap_or_else(|_| Err("fill thread panicked".into()))?;
        }
        Ok(())
    })?;
    // Idle or exit: every handle has synced and dropped; the count is exact.
    let keys = t.verify(false)?.keys;
    say_ready(keys.to_string());
    if args.after_ready == AfterReady::Idle {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    t.close().map_err(|e| e.to_string())?;
    Ok(())
}

/// Kills the child on every path out of `run` (also on errors).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(args: &RecoveryArgs) -> BenchResult<()> {
    if args.size == 0 || args.size > 1 << 32 {
        return Err(format!("--size {} must be in 1..=2^32", args.size));
    }
    if args.threads == 0 || args.threads > 64 {
        return Err(format!("--threads {} must be in 1..=64", args.threads));
    }
    if args.structure == Structure::Skiplist && args.imp == Impl::Redo {
        return Err(
            "--structure skiplist --impl redo: the redo-log baseline exists for the hash table only (phash)"
                .into(),
        );
    }
    let machine = Machine::detect();
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!(
        "ember-bench-recovery-{}-{}.heap",
        std::process::id(),
        args.structure.name()
    ));
    if path.exists() {
        return Err(format!("{} already exists", path.display()));
    }
    // Removed at the end (unless --keep), also on SIGINT, SIGTERM, SIGHUP or a
    // panic; a SIGKILL of this process leaves it.
    let mut rm = TempPath::new(path.clone());
    if args.keep {
        rm.keep();
    }

    // The child builds the structure and keeps updating until it is killed.
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let t_fill = Instant::now();
    let mut cmd = Command::new(exe);
    // The child dies with this process, however it ends (it would otherwise
    // keep updating the heap for ever).
    // SAFETY: the closure runs in the forked child before exec; prctl(2) is
    // async-signal-safe and touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .args(["recovery-fill", "--path"])
        .arg(&path)
        .args([
            "--structure",
            args.structure.name(),
            "--impl",
            args.imp.name(),
            "--size",
            &args.size.to_string(),
            "--threads",
            &args.threads.to_string(),
            "--updates",
            &args.updates.to_string(),
            "--after-ready",
            match args.crash_while {
                CrashWhile::Update => "update",
                CrashWhile::Idle => "idle",
            },
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the fill process: {e}"))?;
    let mut child = KillOnDrop(child);
    let stdout = child.0.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("reading the fill process: {e}"))?;
    if !line.starts_with("ready") {
        let st = child.0.wait().ok();
        return Err(format!(
            "the fill process did not get ready (exit {st:?}; said {:?})",
            line.trim()
        ));
    }
    let fill_s = t_fill.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(args.kill_after_ms));
    child.0.kill().map_err(|e| format!("kill: {e}"))?;
    let status = child.0.wait().map_err(|e| format!("wait: {e}"))?;
    let killed = {
        use std::os::unix::process::ExitStatusExt;
        status.signal() == Some(libc::SIGKILL)
    };
    if !killed {
        return Err(format!(
            "the fill process ended before it was killed ({status})"
        ));
    }

    let r = recover_once(&path, args.verify)?;
    let file_len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    if args.json {
        let mut v = json!({
            "bench": "recovery",
            "machine": machine.to_json(),
            "strategy": Strategy::detect().name(),
            "structure": args.structure.name(),
            "impl": args.imp.name(),
            "implementation": r.name,
            "size": args.size,
            "threads": args.threads,
            "updates_per_thread_before_ready": args.updates,
            "kill_after_ms": args.kill_after_ms,
            "crash": match args.crash_while {
                CrashWhile::Update => "SIGKILL of the filling process during updates",
                CrashWhile::Idle => "SIGKILL of the filling process while idle (handles synced)",
            },
            "page_cache": "warm",
            "fill_s": fill_s,
            "heap_file_len": file_len,
            "recovery_ms": r.total_ms,
            "open_ms": r.open_ms,
            "attach_ms": r.attach_ms,
            "sweep_ms": r.sweep_ms,
            "was_clean": r.stats.heap.was_clean,
            "txs_replayed": r.stats.heap.txs_replayed,
            "active_pages": r.stats.heap.active_pages,
            "apt_chunk_entries": r.chunk_entries,
            "apt_block_entries": r.block_entries,
            "slots_examined": r.stats.slots,
            "active_blocks": r.stats.heap.active_blocks,
            "leaked_freed": r.stats.heap.leaked_freed,
            "revived": r.stats.heap.revived,
            "repaired": r.stats.repaired,
            "keys_after": r.keys_after,
            "keys_after_exact": r.verified.is_some(),
            "heap": if args.keep { Some(path.display().to_string()) } else { None },
        });
        if let Some((keys, blocks, heap_blocks)) = r.verified {
            v["verified_keys"] = json!(keys);
            v["verified_blocks"] = json!(blocks);
            v["heap_blocks"] = json!(heap_blocks);
            v["blocks_match"] = json!(blocks == heap_blocks);
        }
        println!("{v}");
    } else {
        println!(
            "ember bench recovery: {} {} ({}), {} keys, crash = SIGKILL during updates",
            args.structure.name(),
            args.imp.name(),
            r.name,
            args.size
        );
        println!("machine:  {}", machine.line());
        println!(
            "recovery: {:.3} ms (open {:.3} ms, attach {:.3} ms, repair + leak sweep {:.3} ms); \
             page cache warm",
            r.total_ms, r.open_ms, r.attach_ms, r.sweep_ms
        );
        println!(
            "sweep:    {} active page table entries ({} whole chunks, {} single blocks), {} block slots examined, {} allocated, {} leaked \
             blocks freed, {} revived, {} interrupted removals repaired; {} redo logs replayed",
            r.stats.heap.active_pages,
            r.chunk_entries,
            r.block_entries,
            r.stats.slots,
            r.stats.heap.active_blocks,
            r.stats.heap.leaked_freed,
            r.stats.heap.revived,
            r.stats.repaired,
            r.stats.heap.txs_replayed
        );
        match r.verified {
            Some((keys, blocks, heap_blocks)) => println!(
                "after:    {keys} keys (verified), structure blocks {blocks}, heap blocks {heap_blocks}{}",
                if blocks == heap_blocks { "" } else { "  MISMATCH" }
            ),
            None => println!("after:    {} keys (estimate)", r.keys_after),
        }
        if args.keep {
            println!("heap kept: {}", path.display());
        }
    }
    if let Some((_, blocks, heap_blocks)) = r.verified {
        if blocks != heap_blocks {
            return Err(format!(
                "after recovery the structure owns {blocks} blocks but the heap has {heap_blocks} allocated"
            ));
        }
    }
    Ok(())
}

struct Recovered {
    name: &'static str,
    total_ms: f64,
    open_ms: f64,
    attach_ms: f64,
    sweep_ms: f64,
    stats: index::RecoverStats,
    keys_after: u64,
    /// Active page table entries that cover a whole chunk.
    chunk_entries: u64,
    /// Active page table entries that cover one block (free tickets).
    block_entries: u64,
    /// (keys, structure blocks, heap blocks) with `--verify`.
    verified: Option<(u64, u64, u64)>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Opens the crashed heap and recovers the structure at its root, timed.
fn recover_once(path: &Path, verify: bool) -> BenchResult<Recovered> {
    let opts = HeapOptions::default();
    let t0 = Instant::now();
    let rec = Heap::open(path, &opts).map_err(|e| e.to_string())?;
    let t1 = Instant::now();
    // Not timed: how coarse the active page tables are (whole-chunk entries,
    // single-block entries).
    let entries = rec.active_pages();
    let count = |flag: u64| entries.iter().filter(|e| *e & flag != 0).count() as u64;
    let chunk_entries = count(pmem::heap::APT_CHUNK_FLAG);
    let block_entries = count(pmem::APT_BLOCK_FLAG);
    let t1b = Instant::now();
    let t = attach_any(rec.heap(), rec.heap().root()).map_err(|e| e.to_string())?;
    let t2 = Instant::now();
    let (heap, stats) = index::recover(rec, &[&t]).map_err(|e| e.to_string())?;
    let t3 = Instant::now();
    let mut keys_after = t.len_estimate();
    let verified = if verify {
        let v = t.verify(true)?;
        let c = pmem::check_heap(&heap);
        if !c.ok() {
            return Err(format!("heap check after recovery: {:?}", c.problems));
        }
        keys_after = v.keys;
        Some((v.keys, v.blocks, c.blocks))
    } else {
        None
    };
    let name = t.name();
    drop(t);
    drop(heap);
    Ok(Recovered {
        name,
        total_ms: ms(t1 - t0) + ms(t3 - t1b),
        open_ms: ms(t1 - t0),
        attach_ms: ms(t2 - t1b),
        chunk_entries,
        block_entries,
        sweep_ms: ms(t3 - t2),
        stats,
        keys_after,
        verified,
    })
}
