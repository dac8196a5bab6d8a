//! Errors of the stores.

/// Failures of store operations. A full heap or full logs are error values (or
/// waits), never corruption.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Heap(#[from] pmem::Error),
    #[error(transparent)]
    Index(#[from] index::Error),
    #[error("key of {0} bytes is larger than the limit ({max} bytes)", max = index::MAX_KEY)]
    KeyTooLarge(usize),
    #[error("value of {0} bytes is larger than the limit")]
    ValueTooLarge(usize),
    /// Redis's wording, so the server can pass it on.
    #[error("value is not an integer or out of range")]
    NotInteger,
    #[error("increment or decrement would overflow")]
    Overflow,
    /// A record larger than a whole log.
    #[error("operation of {0} bytes does not fit in a log of {1} bytes")]
    RecordTooLarge(u64, u64),
    #[error("corrupt store: {0}")]
    Corrupt(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("the store is closed")]
    Closed,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
