//! HyperLogLog in Redis's byte format (Redis 7.0's `hyperloglog.c`), so that a
//! PFADD here and on Redis with the same elements leaves the same bytes (GET
//! returns them, DUMP/RESTORE elsewhere keeps working) and PFCOUNT gives the
//! same number.
//!
//! # Format (a string value)
//! - Header, 16 bytes: `"HYLL"`, the encoding (0 dense, 1 sparse), three
//!   zero bytes, the cached cardinality as a little-endian u64 whose most
//!   significant bit set means "stale" (PFADD and PFMERGE set it, PFCOUNT
//!   recomputes and stores the count).
//! - 16384 registers of 6 bits. *Dense*: packed little-endian-bit-first, 12288
//!   bytes (register `i` at bit `6 i`). *Sparse*: run-length opcodes —
//!   `00xxxxxx` ZERO (1..64 zero registers), `01xxxxxx yyyyyyyy` XZERO
//!   (1..16384 zero registers, 14-bit length), `1vvvvvxx` VAL (1..4
//!   registers of value 1..32). An empty HLL is sparse: one XZERO of 16384.
//! - A sparse HLL becomes dense when a register needs a value above 32, or
//!   when an update would make the value longer than `hll-sparse-max-bytes`
//!   (3000 by default); it never goes back.
//!
//! Elements are hashed with MurmurHash64A (seed `0xadc83b19`): the low 14
//! bits pick the register, the position of the first 1 bit in the rest (from
//! the low end, counting from 1, at most 51) is the candidate value. The
//! estimate is Ertl's improved raw estimator ("New cardinality estimation
//! algorithms for HyperLogLog sketches", arXiv:1702.01284) on the register
//! histogram, as Redis computes it, in `f64`.
//!
//! Everything here works on the value's bytes; no function panics on any
//! input (a value that is not a valid HLL is an error).

/// Bytes of the header.
pub const HDR: usize = 16;
/// Register count (2^14).
pub const REGISTERS: usize = 1 << P;
const P: u32 = 14;
const Q: u32 = 64 - P;
const REGISTER_MAX: u8 = 63;
/// Length of a dense value.
pub const DENSE_SIZE: usize = HDR + (REGISTERS * 6).div_ceil(8);
/// Redis's default `hll-sparse-max-bytes`.
pub const SPARSE_MAX_BYTES: usize = 3000;
const DENSE: u8 = 0;
const SPARSE: u8 = 1;
const VAL_MAX_VALUE: u8 = 32;
const VAL_MAX_LEN: usize = 4;
const ZERO_MAX_LEN: usize = 64;
const XZERO_MAX_LEN: usize = 16384;
const ALPHA_INF: f64 = 0.721_347_520_444_481_7;

/// Why a value cannot be used as an HLL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Not an HLL at all (Redis: `WRONGTYPE Key is not a valid HyperLogLog
    /// string value.`): too short, no magic, unknown encoding, a dense value
    /// of the wrong length.
    NotHll,
    /// An HLL whose sparse opcodes do not cover exactly the 16384 registers
    /// (Redis: `INVALIDOBJ Corrupted HLL object detected`).
    Corrupt,
}

/// MurmurHash2, 64-bit version (MurmurHash64A), reading 8-byte blocks
/// little-endian as Redis's endian-neutral variant does.
pub fn murmur64a(key: &[u8], seed: u32) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h: u64 = u64::from(seed) ^ (key.len() as u64).wrapping_mul(M);
    let mut blocks = key.chunks_exact(8);
    for b in &mut blocks {
        let mut k = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate() {
            h ^= u64::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

/// The register an element falls in and the length of its `000..1` pattern
/// (1..=51).
pub fn pattern(ele: &[u8]) -> (usize, u8) {
    let hash = murmur64a(ele, 0xadc8_3b19);
    let index = (hash as usize) & (REGISTERS - 1);
    let rest = (hash >> P) | (1u64 << Q);
    (index, rest.trailing_zeros() as u8 + 1)
}

/// A new, empty HLL (sparse, as Redis creates it).
pub fn new_sparse() -> Vec<u8> {
    let mut v = Vec::with_capacity(HDR + 2 + 16);
    v.extend_from_slice(b"HYLL");
    v.push(SPARSE);
    v.extend_from_slice(&[0; 11]);
    let mut left = REGISTERS;
    while left > 0 {
        let n = left.min(XZERO_MAX_LEN);
        push_xzero(&mut v, n);
        left -= n;
    }
    v
}

/// Checks that `v` is an HLL (Redis's `isHLLObjectOrReply`). The sparse
/// opcodes are checked by the operations that read them.
pub fn check(v: &[u8]) -> Result<(), Error> {
    if v.len() < HDR || &v[..4] != b"HYLL" || v[4] > SPARSE {
        return Err(Error::NotHll);
    }
    if v[4] == DENSE && v.len() != DENSE_SIZE {
        return Err(Error::NotHll);
    }
    Ok(())
}

/// The cached cardinality, when it is valid.
pub fn cached(v: &[u8]) -> Option<u64> {
    let c = u64::from_le_bytes(v.get(8..16)?.try_into().ok()?);
    (c >> 63 == 0).then_some(c)
}

/// Stores a freshly computed cardinality in the header.
pub fn set_cached(v: &mut [u8], card: u64) {
    if let Some(c) = v.get_mut(8..16) {
        c.copy_from_slice(&card.to_le_bytes());
    }
}

/// Marks the cached cardinality stale (its most significant bit).
pub fn invalidate(v: &mut [u8]) {
    if let Some(b) = v.get_mut(15) {
        *b |= 0x80;
    }
}

/// Whether `v` (checked) is dense.
pub fn is_dense(v: &[u8]) -> bool {
    v.get(4) == Some(&DENSE)
}

/// Adds an element (Redis's `hllAdd`): true when a register changed.
pub fn add(v: &mut Vec<u8>, ele: &[u8], sparse_max: usize) -> Result<bool, Error> {
    let (index, count) = pattern(ele);
    set_register(v, index, count, sparse_max)
}

/// Raises register `index` to `count` if it is lower (Redis's
/// `hllDenseSet`/`hllSparseSet`): true when it changed.
pub fn set_register(
    v: &mut Vec<u8>,
    index: usize,
    count: u8,
    sparse_max: usize,
) -> Result<bool, Error> {
    check(v)?;
    match v.get(4) {
        Some(&DENSE) => Ok(dense_set(&mut v[HDR..], index, count)),
        Some(&SPARSE) => sparse_set(v, index, count, sparse_max),
        _ => Err(Error::Corrupt),
    }
}

/// A dense register (bytes past the end read as zero, as the C string's
/// terminator does in Redis).
fn dense_get(regs: &[u8], i: usize) -> u8 {
    let byte = i * 6 / 8;
    let fb = (i * 6) & 7;
    let b0 = u32::from(regs.get(byte).copied().unwrap_or(0));
    let b1 = u32::from(regs.get(byte + 1).copied().unwrap_or(0));
    (((b0 >> fb) | (b1 << (8 - fb))) & u32::from(REGISTER_MAX)) as u8
}

fn dense_put(regs: &mut [u8], i: usize, val: u8) {
    let byte = i * 6 / 8;
    let fb = (i * 6) & 7;
    let v = u32::from(val);
    let max = u32::from(REGISTER_MAX);
    if let Some(b) = regs.get_mut(byte) {
        *b = ((u32::from(*b) & !(max << fb)) | (v << fb)) as u8;
    }
    if let Some(b) = regs.get_mut(byte + 1) {
        *b = ((u32::from(*b) & !(max >> (8 - fb))) | (v >> (8 - fb))) as u8;
    }
}

fn dense_set(regs: &mut [u8], i: usize, count: u8) -> bool {
    if count > dense_get(regs, i) {
        dense_put(regs, i, count);
        true
    } else {
        false
    }
}

fn is_zero(b: u8) -> bool {
    b & 0xc0 == 0
}
fn is_xzero(b: u8) -> bool {
    b & 0xc0 == 0x40
}
fn is_val(b: u8) -> bool {
    b & 0x80 != 0
}
fn zero_len(b: u8) -> usize {
    usize::from(b & 0x3f) + 1
}
fn xzero_len(b0: u8, b1: u8) -> usize {
    ((usize::from(b0 & 0x3f) << 8) | usize::from(b1)) + 1
}
fn val_value(b: u8) -> u8 {
    ((b >> 2) & 0x1f) + 1
}
fn val_len(b: u8) -> usize {
    usize::from(b & 0x3) + 1
}
fn val_op(val: u8, len: usize) -> u8 {
    ((val - 1) << 2) | (len as u8 - 1) | 0x80
}
fn zero_op(len: usize) -> u8 {
    (len - 1) as u8
}
fn push_xzero(out: &mut Vec<u8>, len: usize) {
    let l = len - 1;
    out.push((l >> 8) as u8 | 0x40);
    out.push((l & 0xff) as u8);
}
/// A run of `len` zero registers as ZERO or XZERO.
fn push_zeros(out: &mut Vec<u8>, len: usize) {
    if len > ZERO_MAX_LEN {
        push_xzero(out, len);
    } else {
        out.push(zero_op(len));
    }
}

/// One sparse opcode at `p`: (registers covered, opcode bytes). The byte
/// after the end reads as zero (Redis reads the string's terminator).
fn opcode(s: &[u8], p: usize) -> (usize, usize) {
    let b = s[p];
    if is_zero(b) {
        (zero_len(b), 1)
    } else if is_val(b) {
        (val_len(b), 1)
    } else {
        (xzero_len(b, s.get(p + 1).copied().unwrap_or(0)), 2)
    }
}

/// Redis's `hllSparseSet`: updates the opcodes in place, splitting the run
/// that covers `index` and merging equal neighbouring VALs, exactly as Redis
/// does so that the bytes agree; promotes to dense when the value is above
/// 32 or the update would grow the value past `sparse_max` bytes.
fn sparse_set(v: &mut Vec<u8>, index: usize, count: u8, sparse_max: usize) -> Result<bool, Error> {
    if count > VAL_MAX_VALUE {
        return promote(v, index, count);
    }
    // Step 1: find the opcode covering `index`.
    let end = v.len();
    let mut p = HDR;
    let mut first = 0usize;
    let mut prev = None;
    let mut span = 0usize;
    let mut oplen = 1;
    while p < end {
        (span, oplen) = opcode(v, p);
        if index < first + span {
            break;
        }
        prev = Some(p);
        p += oplen;
        first += span;
    }
    if span == 0 || p >= end {
        return Err(Error::Corrupt);
    }
    let b = v[p];
    let (zero, xzero) = (is_zero(b), is_xzero(b));
    // Step 2: the trivial cases.
    if is_val(b) {
        if val_value(b) >= count {
            return Ok(false);
        }
        if span == 1 {
            v[p] = val_op(count, 1);
            merge_vals(v, prev);
            return Ok(true);
        }
    }
    if zero && span == 1 {
        v[p] = val_op(count, 1);
        merge_vals(v, prev);
        return Ok(true);
    }
    // The general case: the run is split in up to three opcodes.
    let last = first + span - 1;
    let mut seq = Vec::with_capacity(5);
    if zero || xzero {
        if index != first {
            push_zeros(&mut seq, index - first);
        }
        seq.push(val_op(count, 1));
        if index != last {
            push_zeros(&mut seq, last - index);
        }
    } else {
        let cur = val_value(b);
        if index != first {
            seq.push(val_op(cur, index - first));
        }
        seq.push(val_op(count, 1));
        if index != last {
            seq.push(val_op(cur, last - index));
        }
    }
    // Step 3: put the sequence in place of the opcode.
    if seq.len() > oplen && v.len() + seq.len() - oplen > sparse_max {
        return promote(v, index, count);
    }
    let old_end = (p + oplen).min(v.len());
    v.splice(p..old_end, seq);
    merge_vals(v, prev);
    Ok(true)
}

/// Step 4 of `hllSparseSet`: merges adjacent VAL opcodes of equal value
/// (at most 4 registers long) among up to 5 opcodes from `prev`, then marks
/// the cached cardinality stale.
fn merge_vals(v: &mut Vec<u8>, prev: Option<usize>) {
    let mut p = prev.unwrap_or(HDR);
    let mut end = v.len();
    let mut scan = 5;
    while p < end && scan > 0 {
        scan -= 1;
        let b = v[p];
        if is_xzero(b) {
            p += 2;
            continue;
        } else if is_zero(b) {
            p += 1;
            continue;
        }
        if p + 1 < end && is_val(v[p + 1]) {
            let (v1, v2) = (val_value(b), val_value(v[p + 1]));
            if v1 == v2 {
                let len = val_len(b) + val_len(v[p + 1]);
                if len <= VAL_MAX_LEN {
                    v[p + 1] = val_op(v1, len);
                    v.remove(p);
                    end -= 1;
                    continue;
                }
            }
        }
        p += 1;
    }
    invalidate(v);
}

/// Converts to dense, then sets the register (which must change).
fn promote(v: &mut Vec<u8>, index: usize, count: u8) -> Result<bool, Error> {
    to_dense(v)?;
    Ok(dense_set(&mut v[HDR..], index, count))
}

/// Converts a sparse HLL to dense (Redis's `hllSparseToDense`; the header,
/// cached cardinality included, is kept). A dense one is left alone.
pub fn to_dense(v: &mut Vec<u8>) -> Result<(), Error> {
    check(v)?;
    if is_dense(v) {
        return Ok(());
    }
    let mut dense = vec![0u8; DENSE_SIZE];
    dense[..HDR].copy_from_slice(&v[..HDR]);
    dense[4] = DENSE;
    let regs = &mut dense[HDR..];
    let mut idx = 0usize;
    let mut p = HDR;
    while p < v.len() {
        let b = v[p];
        let (span, oplen) = opcode(v, p);
        if is_val(b) {
            if idx + span > REGISTERS {
                break;
            }
            for i in idx..idx + span {
                dense_put(regs, i, val_value(b));
            }
        }
        idx += span;
        p += oplen;
    }
    if idx != REGISTERS {
        return Err(Error::Corrupt);
    }
    *v = dense;
    Ok(())
}

/// Raises `max[i]` to register `i` of the HLL `v` (checked), for PFMERGE and
/// the union PFCOUNT (Redis's `hllMerge`).
pub fn merge_into(max: &mut [u8; REGISTERS], v: &[u8]) -> Result<(), Error> {
    check(v)?;
    if is_dense(v) {
        for (i, m) in max.iter_mut().enumerate() {
            *m = (*m).max(dense_get(&v[HDR..], i));
        }
        return Ok(());
    }
    let mut i = 0usize;
    let mut p = HDR;
    while p < v.len() {
        let b = v[p];
        let (span, oplen) = opcode(v, p);
        if is_val(b) {
            if i + span > REGISTERS {
                break;
            }
            for m in &mut max[i..i + span] {
                *m = (*m).max(val_value(b));
            }
        }
        i += span;
        p += oplen;
    }
    if i != REGISTERS {
        return Err(Error::Corrupt);
    }
    Ok(())
}

/// The cardinality estimate of the HLL `v` (checked; Redis's `hllCount`),
/// ignoring the cache. A sparse value whose opcodes do not cover the
/// registers exactly is corrupt.
pub fn count(v: &[u8]) -> Result<u64, Error> {
    check(v)?;
    let mut histo = [0u64; 64];
    if is_dense(v) {
        for i in 0..REGISTERS {
            histo[usize::from(dense_get(&v[HDR..], i))] += 1;
        }
    } else {
        let mut idx = 0usize;
        let mut p = HDR;
        while p < v.len() {
            let b = v[p];
            let (span, oplen) = opcode(v, p);
            let value = if is_val(b) { val_value(b) } else { 0 };
            histo[usize::from(value)] += span as u64;
            idx = idx.saturating_add(span);
            p += oplen;
        }
        if idx != REGISTERS {
            return Err(Error::Corrupt);
        }
    }
    Ok(estimate(&histo))
}

/// The estimate of plain registers (one byte each), for the union PFCOUNT.
pub fn count_registers(regs: &[u8; REGISTERS]) -> u64 {
    let mut histo = [0u64; 64];
    for &r in regs.iter() {
        histo[usize::from(r & 63)] += 1;
    }
    estimate(&histo)
}

/// Ertl's estimator on a register histogram, step for step as Redis does.
fn estimate(histo: &[u64; 64]) -> u64 {
    let m = REGISTERS as f64;
    let q = Q as usize;
    let mut z = m * tau((m - histo[q + 1] as f64) / m);
    for j in (1..=q).rev() {
        z += histo[j] as f64;
        z *= 0.5;
    }
    z += m * sigma(histo[0] as f64 / m);
    // llroundl: halves away from zero, as `f64::round`.
    (ALPHA_INF * m * m / z).round() as u64
}

fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let mut y = 1.0;
    let mut z = x;
    loop {
        x *= x;
        let prev = z;
        z += x * y;
        y += y;
        if prev == z {
            return z;
        }
    }
}

fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let mut y = 1.0;
    let mut z = 1.0 - x;
    loop {
        x = x.sqrt();
        let prev = z;
        y *= 0.5;
        // Redis writes pow(1 - x, 2), which the C compiler emits as a
        // multiplication.
        z -= (1.0 - x) * (1.0 - x) * y;
        if prev == z {
            return z / 3.0;
        }
    }
}

/// The registers of a dense HLL `v` (checked), one value each.
pub fn dense_registers(v: &[u8]) -> Vec<u8> {
    let regs = v.get(HDR..).unwrap_or_default();
    (0..REGISTERS).map(|i| dense_get(regs, i)).collect()
}

/// A sparse HLL's opcodes as PFDEBUG DECODE prints them (`z:len` ZERO,
/// `Z:len` XZERO, `v:value,len` VAL, separated by spaces).
pub fn decode_sparse(v: &[u8]) -> String {
    let mut out = Vec::new();
    let mut p = HDR;
    while p < v.len() {
        let b = v[p];
        let (span, oplen) = opcode(v, p);
        out.push(if is_zero(b) {
            format!("z:{span}")
        } else if is_val(b) {
            format!("v:{},{span}", val_value(b))
        } else {
            format!("Z:{span}")
        });
        p += oplen;
    }
    out.join(" ")
}

/// Writes merged registers into the HLL `v` (checked; PFMERGE's
/// destination, Redis's loop of `hllDenseSet`/`hllSparseSet` over the
/// non-zero registers in order).
pub fn store_registers(v: &mut Vec<u8>, max: &[u8; REGISTERS], sparse_max: usize) {
    for (i, &m) in max.iter().enumerate() {
        if m != 0 {
            // Redis ignores a failure here: the destination was read as a
            // valid HLL by the merge that produced `max`.
            let _ = set_register(v, i, m, sparse_max);
        }
    }
    invalidate(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize, prefix: &str, sparse_max: usize) -> Vec<u8> {
        let mut v = new_sparse();
        for i in 0..n {
            add(&mut v, format!("{prefix}{i}").as_bytes(), sparse_max).unwrap();
        }
        v
    }

    /// PFADD of `e0`..`e{n-1}` (in PFADDs of 1000) into a new key on
    /// redis-server 7.0.15, then PFCOUNT and GET: n, the count, the GET
    /// length and the first 8 bytes of its SHA-256 in hex.
    const REDIS: &[(usize, u64, usize, &str)] = &[
        (1, 1, 21, "ccda8ba82764c30e"),
        (2, 2, 24, "92b278a2c210952b"),
        (10, 10, 48, "0bba112db5cc118c"),
        (100, 100, 285, "aebee27e50c67272"),
        (200, 200, 513, "1f40af84180704c3"),
        (500, 506, 1068, "70c1bb138b0e357f"),
        (1000, 1008, 1906, "ab6313e24c05ff99"),
        (2000, 2000, 12304, "934a6aaa45ebe9f4"),
        (5000, 4968, 12304, "bd470063c39f632f"),
        (10000, 9973, 12304, "c44e2d26f9f332c8"),
        (50000, 49978, 12304, "5922252bfcc5dbd6"),
        (200000, 200859, 12304, "032cf8dd54736f73"),
    ];

    #[test]
    fn counts_and_bytes_match_redis() {
        use sha2::Digest;
        for &(n, card, len, digest) in REDIS {
            let mut v = filled(n, "e", SPARSE_MAX_BYTES);
            let c = count(&v).unwrap();
            set_cached(&mut v, c);
            assert_eq!(c, card, "n={n}");
            assert_eq!(v.len(), len, "n={n}");
            let h = sha2::Sha256::digest(&v);
            let hex: String = h[..8].iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, digest, "n={n}");
        }
    }

    #[test]
    fn empty_hll_is_redis_bytes() {
        let v = new_sparse();
        assert_eq!(v.len(), 18);
        assert_eq!(&v[..5], b"HYLL\x01");
        assert_eq!(&v[16..], &[0x7f, 0xff]);
        assert_eq!(count(&v), Ok(0));
        assert_eq!(cached(&v), Some(0));
    }

    #[test]
    fn sparse_and_dense_agree() {
        // The same elements added to a sparse HLL and to one converted to
        // dense first give the same registers and count.
        for n in [1, 10, 100, 1000, 5000] {
            let s = filled(n, "e", usize::MAX);
            let mut d = new_sparse();
            to_dense(&mut d).unwrap();
            for i in 0..n {
                add(&mut d, format!("e{i}").as_bytes(), usize::MAX).unwrap();
            }
            let mut ds = s.clone();
            to_dense(&mut ds).unwrap();
            assert_eq!(ds[HDR..], d[HDR..], "n={n}");
            assert_eq!(count(&s), count(&d));
        }
    }

    #[test]
    fn promotion_follows_the_byte_limit() {
        let v = filled(100, "x", SPARSE_MAX_BYTES);
        assert!(!is_dense(&v));
        let v = filled(3000, "x", SPARSE_MAX_BYTES);
        assert!(is_dense(&v));
        assert_eq!(v.len(), DENSE_SIZE);
        let v = filled(100, "x", 0);
        assert!(is_dense(&v));
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        for short in [&b""[..], b"HYLL", b"HYLL\x00", b"HYLL\x01\0\0"] {
            let mut v = short.to_vec();
            assert_eq!(count(&v), Err(Error::NotHll));
            assert_eq!(add(&mut v, b"a", 3000), Err(Error::NotHll));
            assert_eq!(to_dense(&mut v), Err(Error::NotHll));
            assert!(merge_into(&mut [0; REGISTERS], &v).is_err());
            assert_eq!(dense_registers(&v).len(), REGISTERS);
            let _ = decode_sparse(&v);
        }
        assert_eq!(check(b"HYLL"), Err(Error::NotHll));
        assert_eq!(check(b"HYLX\x01\0\0\0\0\0\0\0\0\0\0\0"), Err(Error::NotHll));
        assert_eq!(check(b"HYLL\x02\0\0\0\0\0\0\0\0\0\0\0"), Err(Error::NotHll));
        assert_eq!(check(b"HYLL\x00\0\0\0\0\0\0\0\0\0\0\0"), Err(Error::NotHll));
        let mut v = b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\0".to_vec();
        assert_eq!(check(&v), Ok(()));
        assert_eq!(count(&v), Err(Error::Corrupt));
        assert_eq!(add(&mut v, b"a", 3000), Err(Error::Corrupt));
        // Every opcode byte, alone and truncated, in every position.
        for b0 in 0..=255u8 {
            for b1 in [0u8, 0x3f, 0x40, 0x7f, 0x80, 0xff] {
                let mut v = new_sparse();
                v.truncate(HDR);
                v.push(b0);
                v.push(b1);
                let _ = count(&v);
                let mut m = [0u8; REGISTERS];
                let _ = merge_into(&mut m, &v);
                let mut w = v.clone();
                let _ = to_dense(&mut w);
                for ele in ["a", "b", "c"] {
                    let _ = add(&mut v, ele.as_bytes(), 3000);
                }
                v.truncate(HDR + 1);
                let _ = add(&mut v, b"a", 3000);
                let _ = count(&v);
            }
        }
    }

    #[test]
    fn merge_is_the_register_maximum() {
        let a = filled(300, "a", SPARSE_MAX_BYTES);
        let b = filled(5000, "b", SPARSE_MAX_BYTES);
        let mut m = [0u8; REGISTERS];
        merge_into(&mut m, &a).unwrap();
        merge_into(&mut m, &b).unwrap();
        let mut both = a.clone();
        for i in 0..5000 {
            add(&mut both, format!("b{i}").as_bytes(), SPARSE_MAX_BYTES).unwrap();
        }
        let mut mb = [0u8; REGISTERS];
        merge_into(&mut mb, &both).unwrap();
        assert_eq!(m, mb);
        assert_eq!(count_registers(&m), count(&both).unwrap());
    }
}
