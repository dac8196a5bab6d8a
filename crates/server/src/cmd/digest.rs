//! DEBUG DIGEST and DEBUG DIGEST-VALUE: Redis 7.0's digest of the dataset
//! (`debug.c`), so that two servers holding the same data, Ember and Redis
//! included, answer the same 40 hex digits (all zeros for an empty dataset
//! or a missing key).
//!
//! The digest is made of two SHA-1 steps: `xor(d, data)` xors SHA-1(data)
//! into `d` (order-free), `mix(d, data)` sets `d` to SHA-1(d xor
//! SHA-1(data)) (order-dependent). A key's digest starts at zero, mixes the
//! key name, the type's number (Redis's `OBJ_*`, 4 bytes big-endian) and
//! then its value: a string mixed whole; list elements mixed in order; set
//! members xored; each hash field and each sorted-set member digested
//! apart (mix of the field then the value, or of the member then its score
//! as `%.17g`, from zero) and that digest xored in; a stream's entries mixed in order (the ID as
//! `ms.seq`, then each field and value; consumer groups do not count); and
//! `!!expire!!` xored in when the key has a TTL (its time does not count).
//! The dataset's digest xors in the keys' digests, after mixing in each
//! non-empty database's number. Redis reads its values' encodings the same
//! way (an integer-encoded member reads as its decimal string), so the
//! digests match for every type.
//!
//! Redis also counts keys that expired and were not yet deleted; here such
//! keys are deleted by the scan (as a read would) and do not count.

use super::unit::{self, Locks};
use super::{dump::read_value, CmdError, Ctx, R};
use crate::keyspace::skey;
use crate::rdb::Value;
use crate::server::Client;
use proto::Reply;

type Digest = [u8; 20];

fn sha1(data: &[u8]) -> Digest {
    sha1_smol::Sha1::from(data).digest().bytes()
}

/// Xors SHA-1(`data`) into `d`.
fn xor(d: &mut Digest, data: &[u8]) {
    for (a, b) in d.iter_mut().zip(sha1(data)) {
        *a ^= b;
    }
}

/// `d` = SHA-1(`d` xor SHA-1(`data`)).
fn mix(d: &mut Digest, data: &[u8]) {
    xor(d, data);
    *d = sha1(d);
}

/// The digest of a field-value pair (a hash's field, a sorted set's member
/// and its score).
fn pair(a: &[u8], b: &[u8]) -> Digest {
    let mut e = [0; 20];
    mix(&mut e, a);
    mix(&mut e, b);
    e
}

/// Mixes a value into `d` as Redis's `xorObjectDigest` does.
fn value_digest(d: &mut Digest, v: &Value, ttl: bool) {
    // Redis's OBJ_STRING, OBJ_LIST, OBJ_SET, OBJ_ZSET, OBJ_HASH, OBJ_STREAM.
    let kind: u32 = match v {
        Value::String(_) => 0,
        Value::List(_) => 1,
        Value::Set(_) => 2,
        Value::Zset(_) => 3,
        Value::Hash(_) => 4,
        Value::Stream(_) => 6,
    };
    mix(d, &kind.to_be_bytes());
    match v {
        Value::String(s) => mix(d, s),
        Value::List(items) => items.iter().for_each(|e| mix(d, e)),
        Value::Set(members) => members.iter().for_each(|m| xor(d, m)),
        Value::Hash(pairs) => {
            for (f, v) in pairs {
                xor(d, &pair(f, v));
            }
        }
        Value::Zset(members) => {
            for (m, score) in members {
                xor(d, &pair(m, proto::reply::format_double(*score).as_bytes()));
            }
        }
        Value::Stream(s) => {
            for (id, fields) in &s.entries {
                mix(d, format!("{}.{}", id.ms, id.seq).as_bytes());
                for (f, v) in fields {
                    mix(d, f);
                    mix(d, v);
                }
            }
        }
    }
    if ttl {
        xor(d, b"!!expire!!");
    }
}

/// The digest of `key` (in the client's database) and its value, zeros
/// when it does not exist; read inside the running unit, which holds its
/// lock. `with_name`: the dataset digest's form (the key's name mixed
/// first), else DIGEST-VALUE's (the value alone).
fn key_digest(
    ctx: &mut Ctx,
    c: &mut Client,
    key: &[u8],
    with_name: bool,
) -> Result<Digest, CmdError> {
    let mut d = [0; 20];
    let sk = skey(c.db, key);
    let Some(h) = ctx.ks.lookup_locked(&sk, ctx.now)? else {
        return Ok(d);
    };
    let Some(v) = read_value(ctx, c, key)? else {
        return Ok(d);
    };
    if with_name {
        mix(&mut d, key);
    }
    value_digest(&mut d, &v, h.expire.is_some());
    Ok(d)
}

fn hex(d: &Digest) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// DEBUG DIGEST: the whole dataset's digest, read under every stripe lock
/// (no write runs meanwhile).
pub fn dataset(ctx: &mut Ctx, c: &mut Client) -> R {
    let dbs = ctx.sh.cfg().databases as u8;
    let mut fin = [0u8; 20];
    let home = c.db;
    let r = unit::run(ctx, c, Locks::All, |ctx, c| {
        fin = [0; 20];
        for db in 0..dbs {
            let mut keys = Vec::new();
            ctx.ks
                .for_each_live(&ctx.sh.stripes, db, ctx.now, |sk, _| {
                    keys.push(sk[1..].to_vec())
                })?;
            if keys.is_empty() {
                continue;
            }
            mix(&mut fin, &u32::from(db).to_be_bytes());
            c.db = db;
            for k in &keys {
                xor(&mut fin, &key_digest(ctx, c, k, true)?);
            }
        }
        Ok(())
    });
    c.db = home;
    r?;
    c.simple(&hex(&fin));
    Ok(())
}

/// DEBUG DIGEST-VALUE key...: each value's digest (without its key's name),
/// zeros for a missing key.
pub fn values(ctx: &mut Ctx, c: &mut Client, keys: &[Vec<u8>]) -> R {
    let sks: Vec<Vec<u8>> = keys.iter().map(|k| skey(c.db, k)).collect();
    let mut out = Vec::with_capacity(keys.len());
    unit::run(ctx, c, Locks::Keys(sks), |ctx, c| {
        out.clear();
        for k in keys {
            out.push(Reply::Simple(hex(&key_digest(ctx, c, k, false)?)));
        }
        Ok(())
    })?;
    c.reply(&Reply::Array(out));
    Ok(())
}
