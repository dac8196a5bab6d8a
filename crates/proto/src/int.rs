//! Integers as Redis reads them: the one decimal parser of the workspace.
//!
//! Redis reads integers in two ways, and so does Ember:
//! - [`parse_i64`] is Redis's `string2ll`: the strict form used for lengths in
//!   the protocol, for command arguments (`EXPIRE k 10`, `INCRBY k 5`) and for
//!   values that must hold an integer (`INCR` on a stored string): an optional
//!   `-`, no `+`, no leading zeros, no spaces, no overflow. [`parse_u64`] is
//!   the same without the sign (a protocol length, a count).
//! - [`parse_cursor`] is C's `strtoul` as `SCAN` uses it: leading sign allowed
//!   (a minus wraps around), digits up to the first NUL byte, the empty string
//!   reads as 0.
//!
//! Both accumulate digits with [`accumulate`], so overflow is detected in one
//! place.

/// The value of a run of ASCII digits (at least one), or `None` on a
/// non-digit or an overflow of `u64`.
fn accumulate(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(v)
}

/// Redis's `string2ll`: optional `-`, no `+`, no leading zeros (`0` itself
/// excepted, `-0` refused), no spaces, no overflow, at most 20 bytes.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if !matches!(digits.first(), Some(b'1'..=b'9')) {
        return None;
    }
    let v = accumulate(digits)?;
    if neg {
        i64::try_from(-i128::from(v)).ok()
    } else {
        i64::try_from(v).ok()
    }
}

/// [`parse_i64`]'s rules without a sign: a non-negative integer (at most
/// `u64::MAX`).
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.len() > 20 || (s.len() > 1 && s[0] == b'0') {
        return None;
    }
    accumulate(s)
}

/// A `SCAN` cursor as Redis reads it (`strtoul` on a C string, leading space
/// refused): an optional sign (a minus wraps around, as in C), decimal digits
/// up to the first NUL, and the empty string reads as 0.
pub fn parse_cursor(a: &[u8]) -> Option<u64> {
    let a = a.split(|&b| b == 0).next().unwrap_or_default();
    if a.is_empty() {
        return Some(0);
    }
    let (neg, digits) = match a[0] {
        b'-' => (true, &a[1..]),
        b'+' => (false, &a[1..]),
        _ => (false, a),
    };
    let n = accumulate(digits)?;
    Some(if neg { n.wrapping_neg() } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn string2ll_rules() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"01",
            b"-0",
            b"+1",
            b" 1",
            b"1 ",
            b"1a",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"000000000000000000001",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn unsigned_rules() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"-1",
            b"+1",
            b"01",
            b"18446744073709551616",
            b"1 ",
        ] {
            assert_eq!(parse_u64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cursor_rules() {
        assert_eq!(parse_cursor(b""), Some(0));
        assert_eq!(parse_cursor(b"12\0junk"), Some(12));
        assert_eq!(parse_cursor(b"+5"), Some(5));
        assert_eq!(parse_cursor(b"-1"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"007"), Some(7));
        for bad in [&b" 1"[..], b"1x", b"-", b"\t1", b"18446744073709551616"] {
            assert_eq!(parse_cursor(bad), None, "{bad:?}");
        }
    }

    proptest! {
        /// Every i64 round-trips through its decimal text, and the parser
        /// agrees with Rust's on texts in canonical form.
        #[test]
        fn round_trips(n: i64, junk in proptest::collection::vec(any::<u8>(), 0..22)) {
            prop_assert_eq!(parse_i64(n.to_string().as_bytes()), Some(n));
            if let Some(v) = parse_i64(&junk) {
                prop_assert_eq!(v.to_string().into_bytes(), junk.clone());
            }
            if let Some(v) = parse_u64(&junk) {
                prop_assert_eq!(v.to_string().into_bytes(), junk.clone());
            }
        }
    }
}
