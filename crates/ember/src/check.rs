//! `ember check PATH [--json]`: offline verification of a heap file.
//!
//! The heap is opened with [`pmem::Heap::open_check`]: a private copy-on-write
//! mapping under a shared file lock, so committed redo logs are replayed in memory
//! only and the file is never written. Recovery is deliberately *not* finished:
//! the leak sweep needs reachability knowledge that only the layers above have.

use clap::Args;
use pmem::layout::{Superblock, PAGE};
use pmem::{check_heap, CheckReport, Geometry, Heap, Recovery};
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
        }
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
        if self.report.ok() {
            println!("result:           consistent");
        } else {
            println!(
                "result:           INCONSISTENT ({} problem{})",
                self.report.problems.len(),
                if self.report.problems.len() == 1 {
                    ""
                } else {
                    "s"
                }
            );
        }
    }

    fn to_json(&self) -> Value {
        let g = &self.geometry;
        let r = &self.report;
        json!({
            "file": self.file.display().to_string(),
            "ok": r.ok(),
            "problems": r.problems,
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
        })
    }
}

/// Runs `ember check`. Exit 0 when the heap is consistent, 1 otherwise (including
/// every failure to open it).
pub fn run(args: &CheckArgs) -> ExitCode {
    let path = &args.path;
    let rec = match open(path) {
        Ok(r) => r,
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
    let facts = Facts::gather(path, &rec);
    if args.json {
        println!("{}", facts.to_json());
    } else {
        facts.print_human();
    }
    for p in &facts.report.problems {
        eprintln!("ember check: {}: {p}", path.display());
    }
    if facts.report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
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
}
