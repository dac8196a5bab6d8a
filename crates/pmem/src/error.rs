//! The shared storage error type of the persistent domain.

use std::path::PathBuf;

/// Every failure the persistent heap can report. Bad input (a foreign, truncated or
/// corrupt file, a full heap, an invalid pointer) is an error value, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not an Ember heap ({detail})")]
    NotAHeap { path: PathBuf, detail: String },
    #[error(
        "{path}: truncated heap: the superblock says {expected} bytes but the file has {actual}"
    )]
    Truncated {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error("{path}: heap format version {found} is newer than this build supports ({supported})")]
    NewerVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("{path}: corrupt heap: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("{path}: heap is in use by another process (file lock held)")]
    InUse { path: PathBuf },
    #[error("{path}: already exists")]
    Exists { path: PathBuf },
    #[error("invalid heap options: {0}")]
    InvalidOptions(String),
    #[error("heap full: cannot allocate {requested} bytes (heap size {heap_size} bytes, limit {max_size} bytes)")]
    HeapFull {
        requested: u64,
        heap_size: u64,
        max_size: u64,
    },
    /// The heap's file system has no room for the heap's blocks (`fallocate`
    /// failed): at creation, at a start that reserves an old sparse heap's
    /// blocks, or when the heap grows.
    #[error("{path}: the file system holding the heap ({dir}) has no room for it: reserving {requested} bytes failed ({source}; {available} bytes available there)")]
    NoSpace {
        path: PathBuf,
        dir: PathBuf,
        requested: u64,
        available: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("allocation of {0} bytes is larger than the heap can ever hold")]
    TooLarge(u64),
    #[error("invalid persistent pointer {0:#x}: {1}")]
    InvalidPointer(u64, &'static str),
    #[error("double free of persistent block {0:#x}")]
    DoubleFree(u64),
    #[error("all {0} thread slots of the heap are in use")]
    NoThreadSlot(usize),
    #[error(
        "the active page table of thread slot {0} is full ({1} pages with operations in flight)"
    )]
    ActivePagesFull(usize, usize),
    #[error("transaction redo log full ({0} bytes); split the transaction")]
    TxLogFull(usize),
    #[error("transaction nesting is unbalanced")]
    TxNesting,
    #[error("the heap is open read-only")]
    ReadOnly,
    #[error("unknown persistence strategy {0:?} (expected clwb, clflushopt, clflush, fence-only, msync or auto)")]
    UnknownStrategy(String),
    #[error("persistence strategy {0} is not supported by this CPU")]
    StrategyUnsupported(&'static str),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is a lack of room (the heap at its limit, an allocation
    /// larger than the heap, or no space on the file system): an error a
    /// writer may meet and that freeing space can cure.
    pub fn is_full(&self) -> bool {
        matches!(
            self,
            Error::HeapFull { .. } | Error::TooLarge(_) | Error::NoSpace { .. }
        )
    }

    /// A copy of a lack-of-room error (`is_full`), for reporting it again later;
    /// None for other errors.
    pub fn clone_full(&self) -> Option<Error> {
        Some(match self {
            Error::HeapFull {
                requested,
                heap_size,
                max_size,
            } => Error::HeapFull {
                requested: *requested,
                heap_size: *heap_size,
                max_size: *max_size,
            },
            Error::TooLarge(n) => Error::TooLarge(*n),
            Error::NoSpace {
                path,
                dir,
                requested,
                available,
                source,
            } => Error::NoSpace {
                path: path.clone(),
                dir: dir.clone(),
                requested: *requested,
                available: *available,
                source: match source.raw_os_error() {
                    Some(n) => std::io::Error::from_raw_os_error(n),
                    None => std::io::Error::new(source.kind(), source.to_string()),
                },
            },
            _ => return None,
        })
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
