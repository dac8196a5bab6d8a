//! # pmem — Ember's persistent domain
//!
//! The bottom layer of Ember: a heap file mapped into memory, made durable with a
//! chosen persistence strategy, with a persistent allocator (size classes, per-thread
//! slabs, NV-epoch active page tables for leak-free recovery without allocation
//! logging), failure-atomic redo-log transactions (Bullet's Figure 4 API), persistent
//! spinlocks with generation numbers, a crash simulator and an offline checker.
//!
//! All `unsafe` code for mapped memory in Ember lives in this crate ([`region`],
//! [`persist`]); every block carries a `// SAFETY:` comment. The other modules
//! may not use `unsafe` (besides those two: [`sigbus`]'s signal handler and
//! [`pptr`]'s `Pod` impls).
//!
//! ```no_run
//! use pmem::{Heap, HeapOptions};
//! let path = std::path::Path::new("example.heap");
//! let (heap, _report) = Heap::open_or_create(path, &HeapOptions::default())?
//!     .finish(|_block| true)?; // reachability callback of the layer above
//! let mut th = heap.thread()?;
//! let p = th.alloc(100)?;
//! heap.region().write_bytes(p.offset(), b"hello");
//! heap.region().persist(p.offset(), 5);
//! heap.set_root(p)?;
//! # Ok::<(), pmem::Error>(())
//! ```

#![deny(unsafe_code)]

pub mod alloc;
pub mod check;
pub mod error;
pub mod heap;
pub mod layout;
pub mod lock;
#[allow(unsafe_code)]
pub mod persist;
#[allow(unsafe_code)]
pub mod pptr;
#[allow(unsafe_code)]
pub mod region;
#[allow(unsafe_code)]
pub mod sigbus;
pub mod sim;
#[doc(hidden)]
pub mod slab_state;
pub mod tx;

pub use alloc::AllocStats;
pub use check::{check_heap, CheckReport};
pub use error::{Error, Result};
pub use heap::{FreeTicket, Heap, HeapOptions, Recovery, RecoveryReport, ThreadHeap};
pub use layout::{Geometry, APT_BLOCK_FLAG};
pub use persist::{cpu_features, PersistStats, Strategy};
pub use pptr::PPtr;
pub use region::{prefetch_line, Access, DetachedFence, Region};
pub use sigbus::SIGBUS_EXIT_CODE;
pub use sim::{CrashImage, CrashSim};
pub use tx::{Tx, TxOutcome};
