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
    /// A key the store keeps for itself (the direct store's batch intents).
    #[error("key is reserved by the store")]
    ReservedKey,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a client must be told about a failed operation: the store's errors
/// (its own, its index's, its heap's) sorted into the cases a server answers
/// differently, so that a caller needs no knowledge of the layers below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// No room for the write: the heap is full (`disk: false`) or the file
    /// system under it is (`disk: true`). Freeing space cures it.
    NoRoom { disk: bool },
    /// A key longer than `max` bytes.
    KeyTooLarge { len: usize, max: usize },
    /// A value beyond the store's limit.
    ValueTooLarge,
    /// One operation larger than a whole persistent log.
    RecordTooLarge { len: u64, log: u64 },
    /// An increment on a value that is not a decimal 64-bit integer.
    NotInteger,
    /// An increment that would overflow.
    Overflow,
    /// Anything else: corruption, a failed device, a closed store. Its text is
    /// the error's display.
    Internal,
}

impl Error {
    /// The case of this error a client is told about.
    pub fn kind(&self) -> ErrorKind {
        use index::Error as I;
        match self {
            Error::Heap(h) | Error::Index(I::Heap(h)) if h.is_full() => ErrorKind::NoRoom {
                disk: matches!(h, pmem::Error::NoSpace { .. }),
            },
            Error::KeyTooLarge(n) | Error::Index(I::KeyTooLarge(n)) => ErrorKind::KeyTooLarge {
                len: *n,
                max: index::MAX_KEY,
            },
            Error::ValueTooLarge(_) | Error::Index(I::ValueTooLarge(_)) => ErrorKind::ValueTooLarge,
            Error::RecordTooLarge(len, log) => ErrorKind::RecordTooLarge {
                len: *len,
                log: *log,
            },
            Error::NotInteger => ErrorKind::NotInteger,
            Error::Overflow => ErrorKind::Overflow,
            _ => ErrorKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_see_through_the_layers() {
        let full = pmem::Error::NoSpace {
            path: "heap".into(),
            dir: ".".into(),
            requested: 1,
            available: 0,
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(Error::Heap(full).kind(), ErrorKind::NoRoom { disk: true });
        assert_eq!(
            Error::Index(index::Error::KeyTooLarge(9)).kind(),
            ErrorKind::KeyTooLarge {
                len: 9,
                max: index::MAX_KEY
            }
        );
        assert_eq!(Error::Closed.kind(), ErrorKind::Internal);
    }
}
