//! LCS: the longest common subsequence of two strings (Redis 7.0's
//! `lcsCommand`: the same dynamic-programming table, the same backward walk,
//! so ties resolve and match ranges come out as in Redis).

use super::{eq, int_arg, CmdError, Ctx, R};
use crate::keyspace::KIND_STRING;
use crate::server::Client;
use proto::Reply;

/// The string at `key` (empty when absent); None for another type.
fn value(ctx: &mut Ctx, c: &Client, key: &[u8]) -> Result<Option<Vec<u8>>, CmdError> {
    Ok(match ctx.ks.get(&ctx.sh.stripes, c.db, key, ctx.now)? {
        Some(h) if h.kind != KIND_STRING => None,
        Some(h) => Some(ctx.ks.raw[h.off..].to_vec()),
        None => Some(Vec::new()),
    })
}

/// One match range: (start, end) in each string.
type Range = ((usize, usize), (usize, usize));

/// The LCS table `(alen+1) x (blen+1)` of u32 lengths, row-major; None
/// when the memory for it cannot be had.
fn table(a: &[u8], b: &[u8]) -> Option<Vec<u32>> {
    let w = b.len() + 1;
    let cells = (a.len() + 1).checked_mul(w)?;
    let mut t = Vec::new();
    t.try_reserve_exact(cells).ok()?;
    t.resize(cells, 0u32);
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            t[i * w + j] = if a[i - 1] == b[j - 1] {
                t[(i - 1) * w + j - 1] + 1
            } else {
                t[(i - 1) * w + j].max(t[i * w + j - 1])
            };
        }
    }
    Some(t)
}

/// Walks the table back from the end: the LCS itself and the match ranges
/// (from the end of the strings), as Redis emits them.
fn walk(a: &[u8], b: &[u8], t: &[u32]) -> (Vec<u8>, Vec<Range>) {
    let w = b.len() + 1;
    let total = t[a.len() * w + b.len()] as usize;
    let mut result = vec![0u8; total];
    let mut idx = total;
    let mut ranges = Vec::new();
    // `None`: no range open (Redis's `arange_start == alen`).
    let mut open: Option<Range> = None;
    let (mut i, mut j) = (a.len(), b.len());
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            result[idx - 1] = a[i - 1];
            match &mut open {
                None => open = Some(((i - 1, i - 1), (j - 1, j - 1))),
                Some(r) if r.0 .0 == i && r.1 .0 == j => {
                    r.0 .0 -= 1;
                    r.1 .0 -= 1;
                }
                Some(_) => emit = true,
            }
            if open.is_some_and(|r| r.0 .0 == 0 || r.1 .0 == 0) {
                emit = true;
            }
            idx -= 1;
            i -= 1;
            j -= 1;
        } else {
            if t[(i - 1) * w + j] > t[i * w + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            if open.is_some() {
                emit = true;
            }
        }
        if emit {
            if let Some(r) = open.take() {
                ranges.push(r);
            }
        }
    }
    (result, ranges)
}

pub fn lcs(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let not_strings = CmdError::Msg("The specified keys must contain string values");
    let x = value(ctx, c, &a[1])?;
    let y = value(ctx, c, &a[2])?;
    let (Some(x), Some(y)) = (x, y) else {
        return Err(not_strings);
    };
    let (mut getlen, mut getidx, mut withlen) = (false, false, false);
    let mut minlen: i64 = 0;
    let mut j = 3;
    while j < a.len() {
        let opt = &a[j];
        if eq(opt, "idx") {
            getidx = true;
        } else if eq(opt, "len") {
            getlen = true;
        } else if eq(opt, "withmatchlen") {
            withlen = true;
        } else if eq(opt, "minmatchlen") && j + 1 < a.len() {
            minlen = int_arg(&a[j + 1])?.max(0);
            j += 1;
        } else {
            return Err(CmdError::Syntax);
        }
        j += 1;
    }
    if getlen && getidx {
        return Err(CmdError::Msg(
            "If you want both the length and indexes, please just use IDX.",
        ));
    }
    let cells = (x.len() as u64 + 1).saturating_mul(y.len() as u64 + 1);
    if cells.saturating_mul(4) > ctx.sh.cfg().proto_max_bulk_len {
        return Err(CmdError::LcsTooLarge);
    }
    let t = table(&x, &y).ok_or(CmdError::Msg(
        "Insufficient memory, failed allocating transient memory for LCS",
    ))?;
    let total = t[t.len() - 1];
    if getlen {
        c.int(i64::from(total));
        return Ok(());
    }
    let (result, ranges) = walk(&x, &y, &t);
    if !getidx {
        c.bulk(&result);
        return Ok(());
    }
    let pair = |(s, e): (usize, usize)| Reply::Array(vec![int(s), int(e)]);
    let matches = ranges
        .into_iter()
        .filter_map(|(ra, rb)| {
            let mlen = ra.1 - ra.0 + 1;
            if minlen != 0 && (mlen as i64) < minlen {
                return None;
            }
            let mut m = vec![pair(ra), pair(rb)];
            if withlen {
                m.push(int(mlen));
            }
            Some(Reply::Array(m))
        })
        .collect();
    c.reply(&Reply::Map(vec![
        (Reply::Bulk(b"matches".to_vec()), Reply::Array(matches)),
        (
            Reply::Bulk(b"len".to_vec()),
            Reply::Integer(i64::from(total)),
        ),
    ]));
    Ok(())
}

fn int(n: usize) -> Reply {
    Reply::Integer(n as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_documentation_example() {
        let (a, b) = (b"ohmytext".as_slice(), b"mynewtext".as_slice());
        let t = table(a, b).unwrap();
        let (res, ranges) = walk(a, b, &t);
        assert_eq!(res, b"mytext");
        assert_eq!(ranges, vec![((4, 7), (5, 8)), ((2, 3), (0, 1))]);
        let t = table(b"", b"abc").unwrap();
        assert_eq!(walk(b"", b"abc", &t), (Vec::new(), Vec::new()));
    }
}
