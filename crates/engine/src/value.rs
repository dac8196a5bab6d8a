//! Backend values of the Bullet store: the value bytes behind an 8-byte stamp.
//!
//! The stamp is the version of the newest log record whose effect the value
//! includes. A gleaner writes value and stamp with one backend update (one pointer
//! swap in the log-free table, one transaction in phash), so "is record `r` already
//! in the backend?" has an exact answer after any crash: `r.version <= stamp`. That
//! is what makes applying a non-idempotent record exactly once possible without
//! putting the record's `applied` flag in the same transaction as the update.

/// Bytes of the stamp in front of every backend value.
pub const STAMP_LEN: usize = 8;

/// Builds `stamp ‖ value` into `out`.
pub fn encode(stamp: u64, value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(STAMP_LEN + value.len());
    out.extend_from_slice(&stamp.to_le_bytes());
    out.extend_from_slice(value);
}

/// Splits a stored backend value into its stamp and value bytes; `None` when it is
/// too short to carry a stamp (a corrupt or foreign value).
pub fn decode(stored: &[u8]) -> Option<(u64, &[u8])> {
    if stored.len() < STAMP_LEN {
        return None;
    }
    let (s, v) = stored.split_at(STAMP_LEN);
    Some((u64::from_le_bytes(s.try_into().ok()?), v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut b = Vec::new();
        encode(42, b"hello", &mut b);
        assert_eq!(decode(&b), Some((42, &b"hello"[..])));
        encode(7, b"", &mut b);
        assert_eq!(decode(&b), Some((7, &b""[..])));
        assert_eq!(decode(b"short"), None);
    }
}
