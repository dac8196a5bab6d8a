//! HyperLogLog commands: PFADD, PFCOUNT, PFMERGE (Redis 7.0's
//! `hyperloglog.c` semantics). An HLL is a string value in Redis's byte
//! format ([`crate::hll`]): GET returns the bytes Redis would hold. PFDEBUG
//! answers as Redis; PFSELFTEST, Redis's self-test of its C internals,
//! replies not supported.
//!
//! PFADD and PFMERGE keep the key's TTL. PFCOUNT of one key stores the
//! count it computed in the value's header (the cached cardinality), as
//! Redis does, so it writes under the key's stripe lock.

use super::{locked, CmdError, Ctx, R};
use crate::hll::{self, Error as HllError};
use crate::keyspace::{skey, KIND_STRING};
use crate::server::Client;

impl From<HllError> for CmdError {
    fn from(e: HllError) -> Self {
        match e {
            HllError::NotHll => CmdError::NotHll,
            HllError::Corrupt => CmdError::HllCorrupt,
        }
    }
}

/// `hll-sparse-max-bytes`.
fn sparse_max(ctx: &Ctx) -> usize {
    ctx.sh.cfg().hll_sparse_max_bytes as usize
}

/// An HLL's bytes and its key's expiry.
type Loaded = (Vec<u8>, Option<i64>);

/// The HLL at store key `sk` (lock held): None when absent; WRONGTYPE for
/// another type or a string that is not an HLL.
fn load(ctx: &mut Ctx, sk: &[u8]) -> Result<Option<Loaded>, CmdError> {
    let Some(h) = ctx.ks.lookup_locked(sk, ctx.now)? else {
        return Ok(None);
    };
    if h.kind != KIND_STRING {
        return Err(CmdError::WrongType);
    }
    let v = &ctx.ks.raw[h.off..];
    hll::check(v)?;
    Ok(Some((v.to_vec(), h.expire)))
}

pub fn pfadd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let max = sparse_max(ctx);
    let sk = skey(c.db, &a[1]);
    let updated = locked(ctx, &[&sk], |ctx| {
        let (mut v, expire, mut updated) = match load(ctx, &sk)? {
            Some((v, e)) => (v, e, false),
            None => (hll::new_sparse(), None, true),
        };
        for ele in &a[2..] {
            updated |= hll::add(&mut v, ele, max)?;
        }
        if updated {
            hll::invalidate(&mut v);
            ctx.ks.put(&sk, KIND_STRING, expire, &v);
        }
        Ok(updated)
    })?;
    if updated {
        crate::notify::event(ctx, crate::notify::STRING, "pfadd", c.db, &a[1]);
    }
    c.int(i64::from(updated));
    Ok(())
}

pub fn pfcount(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() > 2 {
        // The union's count; nothing is cached.
        let mut max = Box::new([0u8; hll::REGISTERS]);
        for k in &a[1..] {
            let Some(h) = ctx.ks.get(&ctx.sh.stripes, c.db, k, ctx.now)? else {
                continue;
            };
            if h.kind != KIND_STRING {
                return Err(CmdError::WrongType);
            }
            let v = &ctx.ks.raw[h.off..];
            hll::check(v)?;
            hll::merge_into(&mut max, v)?;
        }
        c.int(hll::count_registers(&max) as i64);
        return Ok(());
    }
    let sk = skey(c.db, &a[1]);
    let card = locked(ctx, &[&sk], |ctx| {
        let Some((mut v, expire)) = load(ctx, &sk)? else {
            return Ok(0);
        };
        if let Some(card) = hll::cached(&v) {
            return Ok(card);
        }
        let card = hll::count(&v)?;
        hll::set_cached(&mut v, card);
        ctx.ks.put(&sk, KIND_STRING, expire, &v);
        Ok(card)
    })?;
    c.int(card as i64);
    Ok(())
}

pub fn pfmerge(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let max_bytes = sparse_max(ctx);
    let sks: Vec<Vec<u8>> = a[1..].iter().map(|k| skey(c.db, k)).collect();
    let refs: Vec<&[u8]> = sks.iter().map(|k| k.as_slice()).collect();
    locked(ctx, &refs, |ctx| {
        // Every key, the destination included, is a source.
        let mut max = Box::new([0u8; hll::REGISTERS]);
        let mut dense = false;
        let mut dest = None;
        for (i, sk) in sks.iter().enumerate() {
            let Some((v, expire)) = load(ctx, sk)? else {
                continue;
            };
            dense |= hll::is_dense(&v);
            hll::merge_into(&mut max, &v)?;
            if i == 0 {
                dest = Some((v, expire));
            }
        }
        let (mut v, expire) = dest.unwrap_or_else(|| (hll::new_sparse(), None));
        if dense {
            hll::to_dense(&mut v)?;
        }
        hll::store_registers(&mut v, &max, max_bytes);
        ctx.ks.put(&sks[0], KIND_STRING, expire, &v);
        Ok(())
    })?;
    crate::notify::event(ctx, crate::notify::STRING, "pfadd", c.db, &a[1]);
    c.ok();
    Ok(())
}

/// PFDEBUG GETREG|DECODE|ENCODING|TODENSE key: Redis's debugging view of
/// an HLL (GETREG and TODENSE convert a sparse one to dense, as in Redis).
pub fn pfdebug(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[2]);
    locked(ctx, &[&sk], |ctx| {
        let Some((mut v, expire)) = load(ctx, &sk)? else {
            return Err(CmdError::Msg("The specified key does not exist"));
        };
        let sub = a[1].to_ascii_lowercase();
        match sub.as_slice() {
            b"getreg" | b"todense" => {
                let sparse = !hll::is_dense(&v);
                if sparse {
                    hll::to_dense(&mut v)?;
                    ctx.ks.put(&sk, KIND_STRING, expire, &v);
                }
                if sub == b"todense" {
                    c.int(i64::from(sparse));
                } else {
                    let regs = hll::dense_registers(&v);
                    c.array_header(regs.len());
                    for r in regs {
                        c.int(i64::from(r));
                    }
                }
            }
            b"decode" => {
                if hll::is_dense(&v) {
                    return Err(CmdError::Msg("HLL encoding is not sparse"));
                }
                c.bulk(hll::decode_sparse(&v).as_bytes());
            }
            b"encoding" => c.simple(if hll::is_dense(&v) { "dense" } else { "sparse" }),
            _ => return Err(CmdError::UnknownPfdebug(a[1].clone())),
        }
        Ok(())
    })
}

pub fn pfselftest(_ctx: &mut Ctx, _c: &mut Client, _a: &[Vec<u8>]) -> R {
    Err(CmdError::NotSupported {
        what: "PFSELFTEST".into(),
        why: " (Redis's internal HyperLogLog self-test)",
    })
}
