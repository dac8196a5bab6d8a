//! Errors of the index layer.

/// Failures of index operations. Corruption found in a structure is an error value,
/// never a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Heap(#[from] pmem::Error),
    #[error("key of {0} bytes is larger than the limit ({max} bytes)", max = crate::MAX_KEY)]
    KeyTooLarge(usize),
    #[error("value of {0} bytes is larger than the limit ({max} bytes)", max = crate::MAX_VALUE)]
    ValueTooLarge(usize),
    #[error("corrupt index structure: {0}")]
    Corrupt(String),
    /// An operation the structure does not offer (e.g. a hash-order scan of the
    /// skip list).
    #[error("{0}")]
    Unsupported(&'static str),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
