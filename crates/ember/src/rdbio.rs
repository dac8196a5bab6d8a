//! `ember import FILE.rdb` and `ember export FILE.rdb`: a Redis RDB file
//! (version 10, Redis 7.0; older versions are read too) into a heap, and a
//! heap into an RDB file that `redis-server` loads.
//!
//! Both run offline: the heap is opened as `ember serve` opens it
//! (`server::store::open`, which takes the heap's file lock, so a heap a
//! server has open is refused) and the server's command layer runs
//! in-process ([`server::server::Embedded`]). Import writes each key
//! through RESTORE's code (`Embedded::put`: the type's own write paths, the
//! TTL, the key counts), each key one unit, committed in batches; function
//! libraries go through FUNCTION RESTORE. Export reads each key through
//! DUMP's code (`Embedded::get`) in SCAN order, database by database.
//!
//! The file is read twice by import: a first pass decodes every record and
//! checks the checksum (and, without `--replace`, that no key nor library
//! exists yet) before anything is written, so a corrupt, truncated or
//! conflicting file imports nothing. Only a failure of the heap itself
//! during the second pass (e.g. it is full) leaves part of the file
//! imported: every key is all or nothing, the keys before it are
//! committed, and the error says how many.

use clap::Args;
use server::rdbfile::{FileReader, FileWriter, Record};
use server::server::Embedded;
use server::ServeArgs;
use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// The heap flags `ember serve` takes, for opening the same heap.
#[derive(Args, Debug, Clone, Default)]
pub struct HeapArgs {
    /// A configuration file in redis.conf syntax (its heap, engine and
    /// durability directives are used).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The heap file (created when absent) [default: ember.heap in the
    /// working directory].
    #[arg(long, value_name = "FILE")]
    pub heap: Option<PathBuf>,
    /// Size of a new heap, e.g. 1gb [default: 1gb].
    #[arg(long)]
    pub heap_size: Option<String>,
    /// The heap grows (doubling) up to this size [default: 64gb].
    #[arg(long)]
    pub heap_max_size: Option<String>,
    /// Store engine, as for `ember serve` [default: bullet].
    #[arg(long)]
    pub engine: Option<String>,
    /// pmem or msync, as for `ember serve` [default: pmem].
    #[arg(long, value_name = "pmem|msync")]
    pub durability: Option<String>,
    /// Bullet: number of persistent logs [default: 8].
    #[arg(long)]
    pub logs: Option<usize>,
    /// Bullet: size of each log [default: 32mb].
    #[arg(long)]
    pub log_size: Option<String>,
    /// Number of databases [default: 16].
    #[arg(long)]
    pub databases: Option<u64>,
}

/// `ember import`'s arguments (the rules are in `main.rs`'s help).
#[derive(Args, Debug)]
pub struct ImportArgs {
    #[command(flatten)]
    pub heap: HeapArgs,
    /// Replace keys and function libraries that already exist (without it
    /// an existing one is an error and nothing is imported).
    #[arg(long)]
    pub replace: bool,
    /// Keys per commit (each key is atomic; a batch is made durable at once).
    #[arg(long, default_value_t = 1000, hide = true)]
    pub batch: usize,
    /// The RDB file.
    pub file: PathBuf,
}

/// `ember export`'s arguments.
#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    pub heap: HeapArgs,
    /// The RDB file to write (replaced if it exists).
    pub file: PathBuf,
}

fn config(h: &HeapArgs) -> Result<server::Config, String> {
    let a = ServeArgs {
        config: h.config.clone(),
        heap: h.heap.clone(),
        heap_size: h.heap_size.clone(),
        heap_max_size: h.heap_max_size.clone(),
        engine: h.engine.clone(),
        durability: h.durability.clone(),
        logs: h.logs,
        log_size: h.log_size.clone(),
        databases: h.databases,
        ..Default::default()
    };
    let cfg = server::Config::load(&a)?;
    if cfg.engine == server::config::EngineChoice::Volatile {
        return Err("the volatile engine keeps nothing: choose a durable one".into());
    }
    Ok(cfg)
}

/// The heap opened as the server opens it, with one in-process worker.
struct Opened {
    sh: Arc<server::server::Shared>,
    e: Option<Embedded>,
    databases: u64,
}

impl Opened {
    fn open(h: &HeapArgs) -> Result<Opened, String> {
        let cfg = config(h)?;
        let databases = cfg.databases;
        let (st, startup) = server::store::open(&cfg)?;
        let sh = Embedded::start(cfg, st, startup, 1)?;
        let e = Embedded::new(sh.clone(), 0)?;
        Ok(Opened {
            sh,
            e: Some(e),
            databases,
        })
    }

    fn e(&mut self) -> &mut Embedded {
        self.e.as_mut().expect("open until closed")
    }

    /// Runs a command; its reply, or its error text.
    fn cmd(&mut self, args: &[&[u8]]) -> Result<proto::Reply, String> {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
        let out = self.e().exec(&args);
        match proto::parse_reply(&out) {
            Ok(Some((proto::Reply::Error(e), _))) => Err(e),
            Ok(Some((r, _))) => Ok(r),
            _ => Err("an internal command gave no reply".into()),
        }
    }

    fn commit(&mut self) -> Result<(), String> {
        self.e().commit().map_err(|e| format!("commit: {e}"))
    }

    /// Commits and shuts down cleanly (key counts saved, heap marked clean).
    fn close(mut self) -> Result<(), String> {
        self.commit()?;
        drop(self.e.take());
        Embedded::shutdown(self.sh)
    }
}

/// The RDB file as records, from the start.
fn reader(path: &Path) -> Result<FileReader<File>, String> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    FileReader::new(f, size).map_err(|e| format!("{}: {e}", path.display()))
}

fn mb_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-9)
}

pub fn import(a: &ImportArgs) -> ExitCode {
    match import_run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ember import: {e}");
            ExitCode::FAILURE
        }
    }
}

fn import_run(a: &ImportArgs) -> Result<(), String> {
    let t0 = Instant::now();
    let mut h = Opened::open(&a.heap)?;
    // The heap is closed cleanly whatever happened (what was committed stays).
    let res = import_into(&mut h, a);
    let close = h.close();
    let (written, expired, keys, dbs, libs, size, t_check) = res?;
    close?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "imported {written} keys into {dbs} databases, {libs} function libraries; {expired} keys already expired were skipped ({keys} keys in the file)"
    );
    println!(
        "{size} bytes in {secs:.2} s (check pass {t_check:.2} s): {:.1} MB/s, {:.0} keys/s",
        mb_s(size, secs),
        keys as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// Both passes; (written, expired, keys in the file, databases, libraries,
/// file size, seconds of the check pass).
type Imported = (u64, u64, u64, usize, usize, u64, f64);

fn import_into(h: &mut Opened, a: &ImportArgs) -> Result<Imported, String> {
    let t0 = Instant::now();
    let name = a.file.display().to_string();
    // Pass 1: the whole file decodes and its checksum holds; no conflicts.
    let mut r = reader(&a.file)?;
    let mut libs = Vec::new();
    let mut keys = 0u64;
    let mut selected = None;
    loop {
        match r
            .read_record()
            .map_err(|e| format!("{name}: {e}; nothing imported"))?
        {
            Record::Eof => break,
            Record::Function(code) => libs.push(code),
            Record::SelectDb(db) if db >= h.databases => {
                return Err(format!(
                    "{name}: the file has database {db}; the heap has {} (--databases): nothing imported",
                    h.databases
                ));
            }
            Record::Key {
                db, key, offset, ..
            } => {
                keys += 1;
                if !a.replace {
                    if selected != Some(db) {
                        h.cmd(&[b"SELECT", db.to_string().as_bytes()])?;
                        selected = Some(db);
                    }
                    if h.cmd(&[b"EXISTS", &key])? != proto::Reply::Integer(0) {
                        return Err(format!(
                            "{name}: key '{}' (database {db}, record at byte offset {offset}) already exists in the heap (use --replace): nothing imported",
                            String::from_utf8_lossy(&key)
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    let size = r.offset();
    let t_check = t0.elapsed().as_secs_f64();
    // Pass 2: libraries first (one FUNCTION RESTORE: all or none), then keys.
    if !libs.is_empty() {
        let payload = server::rdb::dump_functions(libs.iter().map(|c| c.as_slice()));
        let policy: &[u8] = if a.replace { b"REPLACE" } else { b"APPEND" };
        h.cmd(&[b"FUNCTION", b"RESTORE", &payload, policy])
            .map_err(|e| format!("{name}: function libraries: {e}; nothing imported"))?;
    }
    let mut r = reader(&a.file)?;
    let (mut written, mut expired, mut pending) = (0u64, 0u64, 0usize);
    let mut dbs = HashSet::new();
    let partial = |written: u64| {
        if written == 0 && libs.is_empty() {
            "nothing imported".to_string()
        } else {
            format!(
                "{written} keys before it and {} function libraries were imported",
                libs.len()
            )
        }
    };
    loop {
        let rec = r
            .read_record()
            .map_err(|e| format!("{name} changed while importing: {e}; {}", partial(written)))?;
        let Record::Key {
            db,
            key,
            value,
            expire_ms,
            offset,
        } = rec
        else {
            if rec == Record::Eof {
                break;
            }
            continue;
        };
        let what = || {
            format!(
                "key '{}' (database {db}, record at byte offset {offset})",
                String::from_utf8_lossy(&key)
            )
        };
        let db8 = u8::try_from(db)
            .ok()
            .filter(|&d| u64::from(d) < h.databases)
            .ok_or_else(|| {
                format!(
                    "{name} changed while importing: {}: no such database; {}",
                    what(),
                    partial(written)
                )
            })?;
        let put = h
            .e()
            .put(db8, &key, &value, expire_ms, a.replace)
            .map_err(|e| format!("{name}: {}: {e}; {}", what(), partial(written)))?;
        match put {
            server::server::Put::Written => {
                written += 1;
                dbs.insert(db);
            }
            server::server::Put::Expired => expired += 1,
            server::server::Put::Busy => {
                return Err(format!(
                    "{name}: {}: the key is in the file twice; {}",
                    what(),
                    partial(written)
                ))
            }
        }
        pending += 1;
        if pending >= a.batch.max(1) {
            h.commit()?;
            pending = 0;
        }
    }
    Ok((written, expired, keys, dbs.len(), libs.len(), size, t_check))
}

pub fn export(a: &ExportArgs) -> ExitCode {
    match export_run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ember export: {e}");
            ExitCode::FAILURE
        }
    }
}

fn export_run(a: &ExportArgs) -> Result<(), String> {
    let t0 = Instant::now();
    let mut h = Opened::open(&a.heap)?;
    let name = a.file.display().to_string();
    let mut tmp = a.file.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let f = File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let res = export_to(&mut h, f);
    let close = h.close();
    let (keys, libs, bytes, dbs) = match res.and_then(|n| close.map(|()| n)) {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("{name}: {e}"));
        }
    };
    std::fs::rename(&tmp, &a.file).map_err(|e| format!("{name}: {e}"))?;
    let secs = t0.elapsed().as_secs_f64();
    println!("exported {keys} keys from {dbs} databases, {libs} function libraries");
    println!(
        "{bytes} bytes in {secs:.2} s: {:.1} MB/s, {:.0} keys/s",
        mb_s(bytes, secs),
        keys as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// Writes the heap's libraries and keys; (keys, libraries, bytes, databases).
fn export_to(h: &mut Opened, f: File) -> Result<(u64, usize, u64, usize), String> {
    let io = |e: std::io::Error| format!("writing: {e}");
    let ctime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string();
    // Redis logs and otherwise ignores AUX fields it does not know.
    let mut w = FileWriter::new(
        f,
        &[
            ("ember-ver", env!("CARGO_PKG_VERSION")),
            ("redis-bits", "64"),
            ("ctime", &ctime),
        ],
    )
    .map_err(io)?;
    let libs = match h.cmd(&[b"FUNCTION", b"DUMP"])? {
        proto::Reply::Bulk(p) => server::rdb::restore_functions(&p).map_err(|e| e.to_string())?,
        _ => Vec::new(),
    };
    for code in &libs {
        w.function(code).map_err(io)?;
    }
    let (mut keys, mut dbs) = (0u64, 0usize);
    for db in 0..h.databases {
        h.cmd(&[b"SELECT", db.to_string().as_bytes()])?;
        let n = match h.cmd(&[b"DBSIZE"])? {
            proto::Reply::Integer(n) => n,
            _ => 0,
        };
        if n <= 0 {
            continue;
        }
        // Every key name of the database (SCAN may return one twice).
        let mut names = Vec::new();
        let mut cursor = b"0".to_vec();
        loop {
            let page = h.cmd(&[b"SCAN", &cursor, b"COUNT", b"1000"])?;
            let proto::Reply::Array(mut parts) = page else {
                return Err("SCAN gave an unexpected reply".into());
            };
            let (Some(proto::Reply::Array(ks)), Some(proto::Reply::Bulk(next))) =
                (parts.pop(), parts.pop())
            else {
                return Err("SCAN gave an unexpected reply".into());
            };
            names.extend(ks.into_iter().filter_map(|k| match k {
                proto::Reply::Bulk(k) => Some(k),
                _ => None,
            }));
            if next == b"0" {
                break;
            }
            cursor = next;
        }
        names.sort_unstable();
        names.dedup();
        let mut first = true;
        for k in names {
            let Some((v, at)) = h.e().get(db as u8, &k)? else {
                continue;
            };
            if first {
                w.select_db(db, n as u64, 0).map_err(io)?;
                dbs += 1;
                first = false;
            }
            w.key(&k, &v, at).map_err(io)?;
            keys += 1;
        }
    }
    let bytes = w.written() + 9;
    let mut f = w.finish().map_err(io)?;
    f.flush().map_err(io)?;
    f.sync_all().map_err(io)?;
    Ok((keys, libs.len(), bytes, dbs))
}
