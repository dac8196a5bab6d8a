//! A memcached item in the keyspace: a string value (type tag 1) whose tag
//! has [`MC_BIT`] set and whose header carries memcached's per-item state
//! after the expiry, so that Redis's GET of the key reads the value bytes
//! unchanged (the header is skipped by `keyspace::decode` like the expiry).
//!
//! Stored form, little-endian: tag (`KIND_STRING | MC_BIT`, `| 0x80` with an
//! expiry) ‖ expiry i64 ms (when the tag says so) ‖ client flags u32 ‖ CAS
//! u64 ‖ item bits u8 ([`FETCHED`], [`TOKEN_SENT`], [`STALE`],
//! [`KEY_BINARY`]) ‖ last access u32 (Unix seconds) ‖ value.
//!
//! A plain string (written by a Redis command) is an item with flags 0, no
//! bits, and a CAS derived from its stored bytes (a hash with the top bit
//! set; a CRC-64 of tag, expiry and value): it changes whenever the value or its TTL is rewritten differently,
//! and never equals a CAS this module issued.

use crate::keyspace::{Header, KIND_STRING, MC_BIT, MC_HEADER};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Fetched at least once since it was stored (`h` flag).
pub const FETCHED: u8 = 1;
/// A recache token was handed out (`W` sent; others see `Z`).
pub const TOKEN_SENT: u8 = 2;
/// Marked stale (`md I`, `ms I` with a lower CAS).
pub const STALE: u8 = 4;
/// Stored with a base64 key (`b`): `k` echoes it in base64.
pub const KEY_BINARY: u8 = 8;

const EXPIRY_BIT: u8 = 0x80;

/// memcached's per-item state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub flags: u32,
    pub cas: u64,
    pub bits: u8,
    /// Last access (store, or a fetch that bumped it), Unix seconds; 0 for
    /// a plain string (unknown).
    pub atime: u32,
}

/// The item state of a string value just read (`raw`, decoded as `h`).
pub fn meta(raw: &[u8], h: &Header) -> Meta {
    if raw[0] & MC_BIT != 0 {
        let m = &raw[h.off - MC_HEADER..h.off];
        Meta {
            flags: u32::from_le_bytes(m[0..4].try_into().unwrap_or_default()),
            cas: u64::from_le_bytes(m[4..12].try_into().unwrap_or_default()),
            bits: m[12],
            atime: u32::from_le_bytes(m[13..17].try_into().unwrap_or_default()),
        }
    } else {
        const CRC: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_REDIS);
        Meta {
            flags: 0,
            cas: CRC.checksum(raw) | 1 << 63,
            bits: 0,
            atime: 0,
        }
    }
}

/// Encodes an item into `out` (cleared first).
pub fn encode(expire: Option<i64>, m: &Meta, value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(1 + 8 + MC_HEADER + value.len());
    match expire {
        Some(t) => {
            out.push(KIND_STRING | MC_BIT | EXPIRY_BIT);
            out.extend_from_slice(&t.to_le_bytes());
        }
        None => out.push(KIND_STRING | MC_BIT),
    }
    out.extend_from_slice(&m.flags.to_le_bytes());
    out.extend_from_slice(&m.cas.to_le_bytes());
    out.push(m.bits);
    out.extend_from_slice(&m.atime.to_le_bytes());
    out.extend_from_slice(value);
}

/// A new CAS unique. Issued from a counter that starts, in each process, at
/// the start time in milliseconds shifted left by 20 bits: a restart issues
/// values above every one issued before it (as long as fewer than 2^20 were
/// issued per millisecond of the previous run and the clock did not go
/// back), so a CAS read before a crash never matches an item written after.
pub fn next_cas() -> u64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU64::new((crate::keyspace::now_ms().max(1) as u64) << 20))
        .fetch_add(1, Ordering::Relaxed)
}

/// memcached's `REALTIME_MAXDELTA`: larger exptimes are absolute Unix times.
const MAX_DELTA: i64 = 60 * 60 * 24 * 30;

/// An exptime converted to Ember's absolute expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exp {
    Never,
    At(i64),
    /// Already expired (negative, or an absolute time in the past).
    Past,
}

impl Exp {
    /// memcached's exptime rules: 0 never, up to 30 days relative seconds,
    /// above an absolute Unix time, negative expired at once.
    pub fn from(exptime: i32, now_ms: i64) -> Exp {
        let e = i64::from(exptime);
        if e < 0 {
            Exp::Past
        } else if e == 0 {
            Exp::Never
        } else if e > MAX_DELTA {
            let at = e * 1000;
            if at <= now_ms {
                Exp::Past
            } else {
                Exp::At(at)
            }
        } else {
            Exp::At(now_ms + e * 1000)
        }
    }

    /// The stored expiry (an expired one as a time in the past).
    pub fn expire(self) -> Option<i64> {
        match self {
            Exp::Never => None,
            Exp::At(t) => Some(t),
            Exp::Past => Some(0),
        }
    }
}

/// Whole seconds, rounded up (memcached counts TTLs in seconds).
pub fn secs_ceil(ms: i64) -> i64 {
    ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) != 0)
}

/// The TTL left that `t` reports: -1 without an expiry; memcached prints
/// it as an unsigned 32-bit number.
pub fn ttl_left(expire: Option<i64>, now_ms: i64) -> String {
    match expire {
        None => "-1".into(),
        Some(t) => ((t.div_euclid(1000) - now_ms.div_euclid(1000)) as u32).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::decode;

    #[test]
    fn items_round_trip_and_read_as_strings() {
        let m = Meta {
            flags: 7,
            cas: 99,
            bits: FETCHED,
            atime: 5,
        };
        let mut out = Vec::new();
        encode(Some(1234), &m, b"hello", &mut out);
        let h = decode(&out).unwrap();
        assert_eq!(h.kind, KIND_STRING);
        assert_eq!(h.expire, Some(1234));
        assert_eq!(&out[h.off..], b"hello");
        assert_eq!(meta(&out, &h), m);
        encode(None, &m, b"", &mut out);
        let h = decode(&out).unwrap();
        assert_eq!((h.expire, &out[h.off..]), (None, &b""[..]));
        assert_eq!(meta(&out, &h), m);
        // A truncated header is corrupt, not a panic.
        assert!(decode(&out[..out.len() - 1]).is_none());
    }

    #[test]
    fn plain_strings_have_a_cas_that_follows_their_bytes() {
        let mut a = Vec::new();
        crate::keyspace::encode(KIND_STRING, None, b"v1", &mut a);
        let mut b = Vec::new();
        crate::keyspace::encode(KIND_STRING, None, b"v2", &mut b);
        let (ha, hb) = (decode(&a).unwrap(), decode(&b).unwrap());
        let (ma, mb) = (meta(&a, &ha), meta(&b, &hb));
        assert_eq!(ma.flags, 0);
        assert_ne!(ma.cas, mb.cas);
        assert_eq!(ma.cas, meta(&a, &ha).cas);
        assert!(ma.cas >> 63 == 1 && next_cas() >> 63 == 0);
    }

    #[test]
    fn exptimes_follow_memcached() {
        let now = 1_700_000_000_000;
        assert_eq!(Exp::from(0, now), Exp::Never);
        assert_eq!(Exp::from(-1, now), Exp::Past);
        assert_eq!(Exp::from(10, now), Exp::At(now + 10_000));
        assert_eq!(Exp::from(2_592_000, now), Exp::At(now + 2_592_000_000));
        assert_eq!(Exp::from(2_592_001, now), Exp::Past);
        assert_eq!(Exp::from(1_800_000_000, now), Exp::At(1_800_000_000_000));
        assert!(next_cas() < next_cas());
        assert_eq!(ttl_left(Some(now + 30_000), now + 400), "30");
    }
}
