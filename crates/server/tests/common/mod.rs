//! What the power-loss tests share: where images go, and opening one as the
//! server starts.

use pmem::{Heap, Strategy};
use server::config::Config;
use server::server::{Embedded, Shared};
use server::store::{self, Startup};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Opens the heap of `c` (a crash image) as `ember serve` starts, without
/// the simulator: store recovery, then one worker's command layer.
pub fn recover(c: Config) -> Result<(Arc<Shared>, Embedded), String> {
    let opts = pmem::HeapOptions {
        // The same format; nothing waits for the file.
        strategy: Strategy::FenceOnly,
        ..store::heap_options(&c)
    };
    let rec = Heap::open(&c.heap, &opts).map_err(|e| format!("open: {e}"))?;
    let st = Startup {
        existed: true,
        ..Startup::default()
    };
    let (store, st) =
        store::open_recovered(&c, rec, st, Instant::now()).map_err(|e| format!("recover: {e}"))?;
    let sh = Embedded::start(c, store, st, 1)?;
    let e = Embedded::new(sh.clone(), 0)?;
    Ok((sh, e))
}

/// A tmpfs directory when there is one (images are written often).
pub fn shm_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}
