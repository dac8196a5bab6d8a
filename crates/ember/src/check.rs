//! `ember check PATH [--json]`: offline verification of a heap file.
//!
//! The heap is opened with [`pmem::Heap::open_check`]: a private copy-on-write
//! mapping under a shared file lock, so committed redo logs are replayed in memory
//! only and the file is never written.
//!
//! When the heap root is an index structure ([`index::any::attach_any`]: the
//! log-free hash table, the skip list or phash), the check goes on in that
//! private mapping: the structure is walked once as found (nothing is repaired
//! before it proves sane), then recovered as the server would ([`index::recover`]:
//! interrupted removals finished, the leak sweep over the active pages), walked
//! again with every invariant (`verify(true)`: every node reachable and tagged,
//! keys in their bucket and in order, values owned by their node), and the blocks
//! the structure owns are compared with the blocks the heap has allocated: any
//! difference is a leak outside the active pages or a lost block. A root whose
//! block carries no known descriptor tag is left alone (a heap used without an
//! index; a note says so), and recovery is then not finished, since the leak
//! sweep needs reachability only the layer above knows. `--require-index` makes
//! such a root a problem.
//!
//! A Bullet store's root (`engine::bullet`) is checked the same way through its
//! backend index, with the pool's descriptor, log buffers and the side table
//! counted as its blocks; every log is also read from head to tail (each record
//! checks: position, length, checksum, opcode).
//!
//! When all of that is sound and the root is a key-value store (direct or
//! Bullet), the store is opened as the server opens it, in a second private
//! mapping ([`pmem::Heap::open_scratch`]: Bullet's logs replayed, a direct
//! store's interrupted batches redone, in memory only), and a replicated
//! node's Raft state is verified through a session of it
//! ([`repl::check::check_log`]: the range, every entry, the hard state, the
//! configuration, the applied index). A heap that holds no raft key reports
//! nothing about it.

use clap::Args;
use engine::bullet::{is_bullet_root, BulletOptions, BulletStore};
use engine::direct::{backend_kind, DirectStore};
use engine::Store;
use index::any::{attach_any, claimed_by, AnyIndex};
use index::Index;
use pmem::layout::{Superblock, PAGE};
use pmem::{check_heap, CheckReport, Geometry, Heap, Recovery};
use repl::check::LogReport;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::util::human_bytes;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The heap file to verify.
    pub path: PathBuf,
    /// Print one JSON object instead of the human summary.
    #[arg(long)]
    pub json: bool,
    /// Report a heap whose root is not a known index structure as a problem.
    #[arg(long)]
    pub require_index: bool,
}

/// What the check found about the index structure at the root.
#[derive(Debug, Default)]
struct StructFacts {
    /// `hash`, `skiplist`, `phash`; None when no structure attached.
    name: Option<&'static str>,
    /// Why nothing attached, or a remark.
    note: Option<String>,
    /// How the structure hashes its keys (hash tables only).
    key_hash: Option<&'static str>,
    /// From `verify(true)` after recovery.
    keys: Option<u64>,
    blocks: Option<u64>,
    payload_bytes: Option<u64>,
    /// Allocated blocks in the heap after recovery (`check_heap`).
    heap_blocks: Option<u64>,
    recovered: bool,
    slots: u64,
    repaired: u64,
    leaked_freed: u64,
    revived: u64,
    /// A Bullet store's logs.
    logs: Option<engine::bullet::LogFacts>,
    problems: Vec<String>,
}

impl StructFacts {
    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "note": self.note,
            "key_hash": self.key_hash,
            "keys": self.keys,
            "blocks": self.blocks,
            "payload_bytes": self.payload_bytes,
            "heap_blocks_after_recovery": self.heap_blocks,
            "recovered_in_memory": self.recovered,
            "slots_examined": self.slots,
            "repaired": self.repaired,
            "leaked_freed": self.leaked_freed,
            "revived": self.revived,
            "logs": self.logs.as_ref().map(|l| json!({
                "logs_used": l.logs_used,
                "records": l.records,
                "unapplied": l.unapplied,
                "bytes": l.bytes,
            })),
            "problems": self.problems,
        })
    }

    fn print_human(&self) {
        match self.name {
            Some(n) => {
                print!("structure:        {n}");
                if let (Some(k), Some(b)) = (self.keys, self.blocks) {
                    print!(", {k} keys, {b} blocks");
                    if let Some(p) = self.payload_bytes {
                        print!(", {} of keys and values", human_bytes(p));
                    }
                }
                println!();
                if self.recovered {
                    println!(
                        "recovery in memory: {} block slots examined, {} interrupted removals \
                         finished, {} leaked blocks freed, {} blocks revived; heap blocks after: {}",
                        self.slots,
                        self.repaired,
                        self.leaked_freed,
                        self.revived,
                        self.heap_blocks.map_or("?".into(), |b| b.to_string())
                    );
                }
            }
            None => println!("structure:        none"),
        }
        if let Some(h) = self.key_hash {
            println!("key hash:         {h}");
        }
        if let Some(l) = &self.logs {
            println!(
                "logs:             {} in use, {} records ({} not yet applied), {}",
                l.logs_used,
                l.records,
                l.unapplied,
                human_bytes(l.bytes)
            );
        }
        if let Some(n) = &self.note {
            println!("note:             {n}");
        }
    }
}

/// Everything `check` reports about a heap it could open.
struct Facts {
    file: PathBuf,
    file_len: Option<u64>,
    sb: Superblock,
    size: u64,
    generation: u64,
    clean: bool,
    geometry: Geometry,
    txs_replayed: u64,
    active_pages: usize,
    report: CheckReport,
    /// The index structure at the root, when there is a root to look at.
    structure: Option<StructFacts>,
    /// A replicated node's Raft state, when the store holds one.
    raft: Option<LogReport>,
    /// Why the store could not be opened to look for a Raft state.
    raft_error: Option<String>,
}

impl Facts {
    fn gather(path: &Path, rec: &Recovery) -> Facts {
        let heap = rec.heap();
        let region = heap.region();
        let report = check_heap(heap);
        Facts {
            file: path.to_path_buf(),
            file_len: std::fs::metadata(path).ok().map(|m| m.len()),
            sb: region.superblock(),
            size: region.size(),
            generation: region.generation(),
            clean: rec.report().was_clean,
            geometry: region.geometry(),
            txs_replayed: rec.report().txs_replayed,
            active_pages: rec.active_pages().len(),
            report,
            structure: None,
            raft: None,
            raft_error: None,
        }
    }

    /// Every problem: the heap's, then the structure's, then the Raft
    /// state's.
    fn problems(&self) -> Vec<String> {
        let mut v = self.report.problems.clone();
        if let Some(s) = &self.structure {
            v.extend(s.problems.iter().cloned());
        }
        v.extend(self.raft_error.iter().cloned());
        if let Some(r) = &self.raft {
            v.extend(r.problems.iter().map(|p| format!("raft log: {p}")));
        }
        v
    }

    fn ok(&self) -> bool {
        self.report.ok()
            && self
                .structure
                .as_ref()
                .is_none_or(|s| s.problems.is_empty())
            && self.raft_error.is_none()
            && self.raft.as_ref().is_none_or(|r| r.problems.is_empty())
    }

    fn print_human(&self) {
        let g = &self.geometry;
        println!("file:             {}", self.file.display());
        println!("format version:   {}", self.sb.version);
        println!("uuid:             {}", uuid_hex(&self.sb.uuid));
        match self.file_len {
            Some(l) if l != self.size => println!(
                "size:             {} bytes ({}; file length {} bytes)",
                self.size,
                human_bytes(self.size),
                l
            ),
            _ => println!(
                "size:             {} bytes ({})",
                self.size,
                human_bytes(self.size)
            ),
        }
        println!("generation:       {}", self.generation);
        println!(
            "clean shutdown:   {}",
            if self.clean {
                "yes"
            } else {
                "no (the last process did not close the heap)"
            }
        );
        println!(
            "geometry:         {} pages of {} per chunk ({} chunks), {} thread slots, \
             {}-byte redo logs, {} active-page entries per slot, header {} bytes",
            g.chunk_pages,
            human_bytes(PAGE),
            human_bytes(g.chunk_size()),
            g.nslots,
            g.log_size,
            g.apt_entries,
            g.header_size()
        );
        println!("root:             {:#x}", self.sb.root);
        println!("created:          {} (unix seconds)", self.sb.created);
        println!("redo logs replayed in memory: {}", self.txs_replayed);
        println!(
            "active pages:     {} (distinct pages in the active page tables)",
            self.active_pages
        );
        print!("{}", self.report);
        if let Some(st) = &self.structure {
            st.print_human();
            for p in &st.problems {
                println!("problem: {p}");
            }
        }
        if let Some(r) = &self.raft {
            print_raft(r);
        }
        if let Some(e) = &self.raft_error {
            println!("problem: {e}");
        }
        let n = self.problems().len();
        if n == 0 {
            println!("result:           consistent");
        } else {
            println!(
                "result:           INCONSISTENT ({n} problem{})",
                if n == 1 { "" } else { "s" }
            );
        }
    }

    fn to_json(&self) -> Value {
        let g = &self.geometry;
        let r = &self.report;
        let mut v = json!({
            "file": self.file.display().to_string(),
            "ok": self.ok(),
            "problems": self.problems(),
            "format_version": self.sb.version,
            "uuid": uuid_hex(&self.sb.uuid),
            "size": self.size,
            "file_len": self.file_len,
            "generation": self.generation,
            "clean_shutdown": self.clean,
            "root": self.sb.root,
            "created_unix_s": self.sb.created,
            "geometry": {
                "chunk_pages": g.chunk_pages,
                "chunk_size": g.chunk_size(),
                "page_size": PAGE,
                "nslots": g.nslots,
                "log_size": g.log_size,
                "apt_entries": g.apt_entries,
                "header_size": g.header_size(),
            },
            "txs_replayed": self.txs_replayed,
            "active_pages": self.active_pages,
            "report": {
                "heap_bytes": r.heap_bytes,
                "chunks": r.chunks,
                "huge_runs": r.huge_runs,
                "slabs": r.slabs,
                "runs": r.runs,
                "free_pages": r.free_pages,
                "blocks": r.blocks,
                "allocated_bytes": r.allocated_bytes,
                "active_pages": r.active_pages,
                "pending_logs": r.pending_logs,
            },
            "structure": self.structure.as_ref().map(StructFacts::to_json),
        });
        if let (Some(l), Some(o)) = (&self.raft, v.as_object_mut()) {
            o.insert("raft_log".into(), raft_json(l));
        }
        v
    }
}

/// The "raft log" section of the human summary.
fn print_raft(r: &LogReport) {
    let ids = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    println!(
        "raft log:         entries {}..={} ({} present; term {} before them), last term {}",
        r.first, r.last, r.entries, r.before_term, r.last_term
    );
    print!(
        "raft state:       term {}, vote {}, commit {}, applied {}; voters {}",
        r.term,
        r.vote,
        r.commit,
        r.applied,
        ids(&r.voters)
    );
    if !r.learners.is_empty() {
        print!(", learners {}", ids(&r.learners));
    }
    println!();
    println!(
        "raft entries:     {} write batches ({} operations), {} compactions, {} events, \
         {} empty, {} configuration changes",
        r.batches, r.batch_ops, r.compactions, r.events, r.empty, r.conf_changes
    );
    if let Some(p) = &r.peers {
        println!("raft members:     {p}");
    }
    if let Some(len) = r.install_interrupted {
        println!(
            "note:             a crash interrupted the install of a snapshot ({len} bytes): the \
             node finishes it from its snapshot file at its next start"
        );
    }
    for p in &r.problems {
        println!("problem: raft log: {p}");
    }
}

fn raft_json(r: &LogReport) -> Value {
    json!({
        "first": r.first,
        "last": r.last,
        "term_before_first": r.before_term,
        "entries": r.entries,
        "last_term": r.last_term,
        "term": r.term,
        "vote": r.vote,
        "commit": r.commit,
        "applied": r.applied,
        "voters": r.voters,
        "learners": r.learners,
        "write_batches": r.batches,
        "batch_operations": r.batch_ops,
        "compactions": r.compactions,
        "events": r.events,
        "empty": r.empty,
        "conf_changes": r.conf_changes,
        "keys": r.keys,
        "members": r.peers,
        "install_interrupted_bytes": r.install_interrupted,
        "problems": r.problems,
    })
}

/// Runs `ember check`. Exit 0 when the heap is consistent, 1 otherwise (including
/// every failure to open it).
pub fn run(args: &CheckArgs) -> ExitCode {
    let path = &args.path;
    let facts = match examine(path, args.require_index) {
        Ok(f) => f,
        Err(e) => {
            // The pmem error's Display already names the file.
            eprintln!("ember check: {e}");
            if args.json {
                let v = json!({
                    "file": path.display().to_string(),
                    "ok": false,
                    "error": e.to_string(),
                    "problems": [e.to_string()],
                });
                println!("{v}");
            }
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        println!("{}", facts.to_json());
    } else {
        facts.print_human();
    }
    for p in facts.problems() {
        eprintln!("ember check: {}: {p}", path.display());
    }
    if facts.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Opens the heap at `path` and checks it (the heap, then the structure at
/// its root), printing nothing.
fn examine(path: &Path, require_index: bool) -> pmem::Result<Facts> {
    let rec = open(path)?;
    let mut facts = Facts::gather(path, &rec);
    facts.structure = check_structure(rec, facts.report.ok(), require_index);
    // The store is opened only over a sound heap and structure: opening runs
    // recovery, which trusts what the checks above verified.
    if facts.ok() && facts.structure.as_ref().is_some_and(|s| s.name.is_some()) {
        match quietly(|| raft_state(path)) {
            Ok(Ok(r)) => facts.raft = r,
            Ok(Err(e)) => {
                facts.raft_error = Some(format!("opening the store to read its raft log: {e}"))
            }
            Err(p) => facts.raft_error = Some(format!("reading the raft log panicked: {p}")),
        }
    }
    Ok(facts)
}

/// Opens the store at the heap's root in a new private mapping, as the server
/// would (recovery in memory only), and verifies the Raft state it holds;
/// None when it holds none or the root is no key-value store.
fn raft_state(path: &Path) -> Result<Option<LogReport>, String> {
    fn read<S: Store>(st: &S) -> Result<Option<LogReport>, String> {
        let mut sess = st.session().map_err(|e| e.to_string())?;
        Ok(repl::check::check_log(&mut sess))
    }
    // A scratch view: sessions allocate and write (the replay, a redone
    // batch, the sessions' own bookkeeping) in its private mapping only.
    let rec = Heap::open_scratch(path).map_err(|e| e.to_string())?;
    let root = rec.heap().root();
    if root.is_null() {
        return Ok(None);
    }
    if is_bullet_root(rec.heap(), root) {
        // No role threads: no background thread gleans while the check reads.
        let opts = BulletOptions {
            role_threads: 0,
            ..Default::default()
        };
        let (st, _) = BulletStore::open(rec, &opts).map_err(|e| e.to_string())?;
        return read(&st);
    }
    match attach_any(rec.heap(), root) {
        Ok(t) if backend_kind(&t).is_some() => {}
        _ => return Ok(None),
    }
    let (st, _) = DirectStore::open(rec).map_err(|e| e.to_string())?;
    read(&st)
}

/// What `ember check PATH` finds, without printing it: the problems (none
/// when the heap is consistent), or the error that kept the heap from
/// opening. For callers other than the command line (the fuzz targets).
pub fn problems(path: &Path, require_index: bool) -> pmem::Result<Vec<String>> {
    examine(path, require_index).map(|f| f.problems())
}

/// Runs `f`, turning a panic into an error message (printed nowhere): a check
/// must report corrupt input, not crash on it. The structures' walks bound every
/// read, so this is only a second line of defence (with `panic = "abort"`, as in
/// release builds, there is no unwinding to catch).
fn quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(prev);
    r.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into())
    })
}

/// Checks the index structure at the heap root (see the module documentation).
/// None when the root is null and no index is required.
fn check_structure(rec: Recovery, heap_ok: bool, require: bool) -> Option<StructFacts> {
    let heap = rec.heap().clone();
    let root = heap.root();
    let mut f = StructFacts::default();
    if root.is_null() {
        if !require {
            return None;
        }
        f.problems
            .push("the heap root is null: there is no index structure".into());
        return Some(f);
    }
    if engine::bullet::is_bullet_root(&heap, root) {
        return Some(check_bullet(rec, heap_ok));
    }
    let claimed = claimed_by(&heap, root);
    let t = match quietly(|| attach_any(&heap, root)) {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            let msg = format!("root {:#x}: {e}", root.raw());
            if claimed.is_some() || require {
                f.name = claimed;
                f.problems.push(msg);
            } else {
                f.note = Some(format!(
                    "root {:#x} is not a known index structure (only the heap was checked)",
                    root.raw()
                ));
            }
            return Some(f);
        }
        Err(p) => {
            f.name = claimed;
            f.problems
                .push(format!("root {:#x}: attaching panicked: {p}", root.raw()));
            return Some(f);
        }
    };
    let name = t.name();
    f.name = Some(name);
    f.key_hash = t.hasher().map(hash_name);
    // Walk it as found before anything writes to it (even in this private
    // mapping): repair and the sweep follow links, and only a sane structure
    // gets them. phash is walked without taking its bucket locks: a lock held by
    // a crashed process still looks held here (the generation is bumped only by a
    // writable open).
    let as_found = matches!(t, AnyIndex::PHash(_));
    match quietly(|| t.verify(as_found)) {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            f.problems.push(format!("{name}: {e}"));
            return Some(f);
        }
        Err(p) => {
            f.problems.push(format!("{name}: the walk panicked: {p}"));
            return Some(f);
        }
    }
    if !heap_ok {
        f.note = Some("the heap has problems: the structure was not recovered".into());
        return Some(f);
    }
    if !recover_into(&mut f, name, rec, &[&t]) {
        return Some(f);
    }
    match quietly(|| t.verify(true)) {
        Ok(Ok(v)) => {
            f.keys = Some(v.keys);
            f.blocks = Some(v.blocks);
            f.payload_bytes = Some(v.payload_bytes);
        }
        Ok(Err(e)) => f.problems.push(format!("{name} after recovery: {e}")),
        Err(p) => f
            .problems
            .push(format!("{name} after recovery: the walk panicked: {p}")),
    }
    let c = check_heap(&heap);
    f.heap_blocks = Some(c.blocks);
    for p in c.problems {
        f.problems.push(format!("heap after recovery: {p}"));
    }
    if let Some(b) = f.blocks {
        if c.blocks > b {
            f.problems.push(format!(
                "{} allocated blocks are not reachable from the {name} (leaked outside the \
                 active pages): the heap has {} allocated, the {name} owns {b}",
                c.blocks - b,
                c.blocks
            ));
        } else if c.blocks < b {
            f.problems.push(format!(
                "the {name} links {} blocks more than the heap has allocated (lost blocks): \
                 the heap has {} allocated, the {name} owns {b}",
                b - c.blocks,
                c.blocks
            ));
        }
    }
    Some(f)
}

/// Runs index recovery (repair, leak sweep) for `parts` in the private mapping and
/// records what it did in `f`; false (with the problem recorded) when it failed.
fn recover_into(
    f: &mut StructFacts,
    name: &str,
    rec: Recovery,
    parts: &[&dyn index::Recoverable],
) -> bool {
    match quietly(|| index::recover(rec, parts)) {
        Ok(Ok((_, st))) => {
            f.recovered = true;
            f.slots = st.slots;
            f.repaired = st.repaired;
            f.leaked_freed = st.heap.leaked_freed;
            f.revived = st.heap.revived;
            true
        }
        Ok(Err(e)) => {
            f.problems.push(format!("{name}: recovery failed: {e}"));
            false
        }
        Err(p) => {
            f.problems.push(format!("{name}: recovery panicked: {p}"));
            false
        }
    }
}

/// Checks a Bullet store: its backend as found, its logs, then recovery (in the
/// private mapping) and the block count against everything the store owns.
/// How a hash structure hashes its keys, for the report.
fn hash_name(h: index::KeyHasher) -> &'static str {
    if h.sip_key().is_some() {
        "siphash-1-3, keyed"
    } else {
        "xxh3, unkeyed (made by an earlier Ember: keys that share a bucket can be chosen)"
    }
}

fn check_bullet(rec: Recovery, heap_ok: bool) -> StructFacts {
    let heap = rec.heap().clone();
    let root = heap.root();
    let mut f = StructFacts {
        name: Some("bullet"),
        ..Default::default()
    };
    let parts = match quietly(|| engine::bullet::BulletParts::attach(&heap, root)) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            f.problems.push(format!("bullet: {e}"));
            return f;
        }
        Err(p) => {
            f.problems.push(format!("bullet: attaching panicked: {p}"));
            return f;
        }
    };
    f.key_hash = parts.backend.hasher().map(hash_name);
    let as_found = matches!(parts.backend, AnyIndex::PHash(_));
    match quietly(|| parts.backend.verify(as_found)) {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            f.problems.push(format!("bullet backend: {e}"));
            return f;
        }
        Err(p) => {
            f.problems
                .push(format!("bullet backend: the walk panicked: {p}"));
            return f;
        }
    }
    match quietly(|| engine::bullet::check_logs(&heap, root)) {
        Ok(Ok(l)) => f.logs = Some(l),
        Ok(Err(e)) => f.problems.push(format!("bullet logs: {e}")),
        Err(p) => f
            .problems
            .push(format!("bullet logs: reading panicked: {p}")),
    }
    if !heap_ok || !f.problems.is_empty() {
        f.note = Some("problems found: the store was not recovered".into());
        return f;
    }
    if !recover_into(&mut f, "bullet", rec, &parts.recoverables()) {
        return f;
    }
    let mut owned = parts.pool_blocks();
    match quietly(|| parts.backend.verify(true)) {
        Ok(Ok(v)) => {
            f.keys = Some(v.keys);
            f.payload_bytes = Some(v.payload_bytes);
            owned += v.blocks;
        }
        Ok(Err(e)) => {
            f.problems
                .push(format!("bullet backend after recovery: {e}"));
            return f;
        }
        Err(p) => {
            f.problems.push(format!(
                "bullet backend after recovery: the walk panicked: {p}"
            ));
            return f;
        }
    }
    if let Some(side) = &parts.side {
        match quietly(|| side.verify(true)) {
            Ok(Ok(v)) => owned += v.blocks,
            Ok(Err(e)) => f.problems.push(format!("bullet side table: {e}")),
            Err(p) => f
                .problems
                .push(format!("bullet side table: the walk panicked: {p}")),
        }
    }
    f.blocks = Some(owned);
    let c = check_heap(&heap);
    f.heap_blocks = Some(c.blocks);
    for p in c.problems {
        f.problems.push(format!("heap after recovery: {p}"));
    }
    if c.blocks != owned {
        f.problems.push(format!(
            "the heap has {} allocated blocks, the Bullet store owns {owned} (backend, side \
             table, descriptor and log buffers)",
            c.blocks
        ));
    }
    f
}

/// Opens the heap for checking. A FIFO is refused before `open(2)`, which would
/// block until some writer appeared (pmem opens first and looks at the file type
/// after).
fn open(path: &Path) -> pmem::Result<Recovery> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::metadata(path) {
        if m.file_type().is_fifo() {
            return Err(pmem::Error::NotAHeap {
                path: path.to_path_buf(),
                detail: "not a regular file (a FIFO)".into(),
            });
        }
    }
    Heap::open_check(path)
}

/// The uuid in its canonical hex form (8-4-4-4-12).
fn uuid_hex(u: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format() {
        let u = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0, 1, 2, 3, 4, 5, 6, 7,
        ];
        assert_eq!(uuid_hex(&u), "01234567-89ab-cdef-0001-020304050607");
    }

    /// A new small heap holding a direct store.
    fn direct_store(path: &Path) -> DirectStore {
        let opts = pmem::HeapOptions {
            size: 8 << 20,
            geometry: Geometry::small(),
            ..Default::default()
        };
        DirectStore::create(&Heap::create(path, &opts).unwrap(), &Default::default()).unwrap()
    }

    /// A direct store holding a node's log (entries 1..=3, all applied).
    fn replicated_heap(path: &Path) {
        use engine::{Session, WriteBatch};
        use raft::eraftpb::{Entry, HardState};
        let st = direct_store(path);
        let mut log = repl::HeapStorage::open(Box::new(st.session().unwrap()), &[1]).unwrap();
        let ents: Vec<Entry> = (1..=3)
            .map(|i| Entry {
                index: i,
                term: 1,
                ..Default::default()
            })
            .collect();
        let hs = HardState {
            term: 1,
            vote: 1,
            commit: 3,
            ..Default::default()
        };
        log.persist(&ents, Some(&hs)).unwrap();
        drop(log);
        let mut b = WriteBatch::new();
        b.put(repl::APPLIED_KEY, &3u64.to_le_bytes());
        b.put(b"k", b"v");
        st.session()
            .unwrap()
            .apply_batch(&b, &mut Vec::new())
            .unwrap();
        st.close().unwrap();
    }

    #[test]
    fn a_raft_log_is_reported_and_its_problems_fail_the_check() {
        use engine::{Session, WriteBatch};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        replicated_heap(&path);
        let f = examine(&path, false).unwrap();
        assert!(f.ok(), "{:?}", f.problems());
        let r = f.raft.as_ref().expect("a raft log section");
        assert_eq!((r.first, r.last, r.commit, r.applied), (1, 3, 3, 3));
        assert_eq!(f.to_json()["raft_log"]["entries"], 3);
        // Entry 2 removed: the check fails and says why.
        {
            let rec = Heap::open(&path, &Default::default()).unwrap();
            let (st, _) = DirectStore::open(rec).unwrap();
            let mut b = WriteBatch::new();
            b.remove(&repl::entry_key(2));
            st.session()
                .unwrap()
                .apply_batch(&b, &mut Vec::new())
                .unwrap();
            st.close().unwrap();
        }
        let f = examine(&path, false).unwrap();
        assert!(!f.ok());
        assert_eq!(
            f.problems(),
            vec!["raft log: entry 2 is missing".to_string()]
        );
        assert_eq!(f.to_json()["ok"], false);
    }

    #[test]
    fn a_heap_without_raft_keys_has_no_raft_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        direct_store(&path).close().unwrap();
        let f = examine(&path, false).unwrap();
        assert!(f.ok(), "{:?}", f.problems());
        assert!(f.raft.is_none() && f.raft_error.is_none());
        assert!(f.to_json().get("raft_log").is_none());
    }
}
