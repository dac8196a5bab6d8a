//! Keyspace commands: deletion, existence, iteration, renames, expiry.

use super::{eq, int_arg, locked, CmdError, Ctx, R};
use crate::glob::Glob;
use crate::housekeep::{flush_key, SWAP_MARKER, SWAP_TMP};
use crate::keyspace::{
    skey, type_name, Keyspace, KsError, KIND_HASH, KIND_LIST, KIND_SET, KIND_STREAM, KIND_STRING,
    KIND_ZSET, PIECE_PREFIX,
};
use crate::notify::{self, event};
use crate::server::{Client, Shared};
use proto::Reply;

pub fn del(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sks: Vec<Vec<u8>> = a[1..].iter().map(|k| skey(c.db, k)).collect();
    let refs: Vec<&[u8]> = sks.iter().map(|k| k.as_slice()).collect();
    let gone = locked(ctx, &refs, |ctx| {
        let mut gone = Vec::new();
        for (i, sk) in sks.iter().enumerate() {
            if ctx.ks.delete(sk, ctx.now)? {
                gone.push(i + 1);
            }
        }
        c.int(gone.len() as i64);
        Ok(gone)
    })?;
    for i in gone {
        event(ctx, notify::GENERIC, "del", c.db, &a[i]);
    }
    Ok(())
}

pub fn exists(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let mut n = 0;
    for k in &a[1..] {
        if ctx.ks.get(&ctx.sh.stripes, c.db, k, ctx.now)?.is_some() {
            n += 1;
        }
    }
    c.int(n);
    Ok(())
}

pub fn touch(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    exists(ctx, c, a)
}

pub fn type_(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let t = match ctx.ks.get(&ctx.sh.stripes, c.db, &a[1], ctx.now)? {
        Some(h) => type_name(h.kind),
        None => "none",
    };
    c.simple(t);
    Ok(())
}

/// Every live key of database `db` that `keep` accepts (a full scan).
fn all_keys(
    ctx: &mut Ctx,
    db: u8,
    mut keep: impl FnMut(&[u8]) -> bool,
) -> Result<Vec<Vec<u8>>, CmdError> {
    let sh = ctx.sh;
    let mut out = Vec::new();
    ctx.ks.for_each_live(&sh.stripes, db, ctx.now, |sk, _| {
        if keep(&sk[1..]) {
            out.push(sk[1..].to_vec());
        }
    })?;
    Ok(out)
}

pub fn keys(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    // Redis skips matching for the pattern "*" (which alone would not match "").
    let glob = (a[1].as_slice() != b"*").then(|| Glob::new(&a[1], false));
    let ks = all_keys(ctx, c.db, |k| glob.as_ref().is_none_or(|g| g.matches(k)))?;
    c.array_header(ks.len());
    for k in &ks {
        c.bulk(k);
    }
    Ok(())
}

pub fn scan(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let cursor = proto::int::parse_cursor(&a[1]).ok_or(CmdError::InvalidCursor)?;
    let mut pat: Option<&[u8]> = None;
    let mut count = 10usize;
    let mut typ: Option<String> = None;
    let mut i = 2;
    while i < a.len() {
        let Some(v) = a.get(i + 1) else {
            return Err(CmdError::Syntax);
        };
        if eq(&a[i], "match") {
            pat = Some(v);
        } else if eq(&a[i], "count") {
            let n = int_arg(v)?;
            if n < 1 {
                return Err(CmdError::Syntax);
            }
            count = n.min(1 << 20) as usize;
        } else if eq(&a[i], "type") {
            typ = Some(String::from_utf8_lossy(v).to_ascii_lowercase());
        } else {
            return Err(CmdError::Syntax);
        }
        i += 2;
    }
    // Redis skips matching for the pattern "*" (which alone would not match "").
    let glob = pat.filter(|p| *p != b"*").map(|p| Glob::new(p, false));
    let mut page = Vec::new();
    let next = ctx.ks.scan_page(c.db, cursor, count, &mut page)?;
    let mut out = Vec::new();
    for k in page {
        if let Some(g) = &glob {
            if !g.matches(&k) {
                continue;
            }
        }
        let Some(h) = ctx.ks.get(&ctx.sh.stripes, c.db, &k, ctx.now)? else {
            continue;
        };
        if let Some(t) = &typ {
            if type_name(h.kind) != t {
                continue;
            }
        }
        out.push(Reply::Bulk(k));
    }
    c.reply(&Reply::Array(vec![
        Reply::Bulk(next.to_string().into_bytes()),
        Reply::Array(out),
    ]));
    Ok(())
}

fn rename_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], nx: bool) -> R {
    let src = skey(c.db, &a[1]);
    let dst = skey(c.db, &a[2]);
    let renamed = locked(ctx, &[&src, &dst], |ctx| {
        let Some(h) = ctx.ks.lookup_locked(&src, ctx.now)? else {
            return Err(CmdError::NoSuchKey);
        };
        let raw = ctx.ks.raw.clone();
        if src == dst {
            if nx {
                c.int(0);
            } else {
                c.ok();
            }
            return Ok(false);
        }
        if nx && ctx.ks.lookup_locked(&dst, ctx.now)?.is_some() {
            c.int(0);
            return Ok(false);
        }
        // The destination is written first: a crash in between leaves both keys,
        // never neither. A collection it held leaves no pieces behind.
        ctx.ks.free_pieces(&dst, ctx.now)?;
        ctx.ks.put_raw(&dst, &raw);
        ctx.ks.remove_known(&src, h.expire.is_some());
        if nx {
            c.int(1);
        } else {
            c.ok();
        }
        Ok(true)
    })?;
    if renamed {
        // Redis adds the destination (`new`) before these two.
        notify::flush_pending(ctx.sh, ctx.ks);
        event(ctx, notify::GENERIC, "rename_from", c.db, &a[1]);
        event(ctx, notify::GENERIC, "rename_to", c.db, &a[2]);
    }
    Ok(())
}

pub fn rename(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    rename_generic(ctx, c, a, false)
}

pub fn renamenx(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    rename_generic(ctx, c, a, true)
}

pub fn dbsize(ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    let (n, _) = crate::counts::db_counts(ctx, c.db)?;
    c.int(n as i64);
    Ok(())
}

/// Serialises flushes: two at once could each find the other's marker gone.
pub(crate) static FLUSHING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Keys deleted per batch by a flush.
const FLUSH_BATCH: usize = 64;

/// FLUSHDB / FLUSHALL of `dbs`, all-or-nothing across a crash: one batch
/// writes a flush marker per database, then the keys go in batches, then
/// one batch removes the markers (before the reply). A start that finds a
/// marker finishes that flush before serving ([`finish_flushes`]).
///
/// On a full heap the markers (puts) are refused: the first batches of
/// removals then go unmarked until one makes room for the markers (a crash
/// in between leaves those keys deleted: the one case where a flush is not
/// all-or-nothing).
pub(crate) fn flush_dbs(ctx: &mut Ctx, dbs: &[u8]) -> R {
    // A transaction or script that flushes took FLUSHING and every stripe
    // lock before it began (`cmd::unit`).
    let _f = (!ctx.ks.in_unit()).then(|| FLUSHING.lock().unwrap_or_else(|p| p.into_inner()));
    let mut marked = false;
    let mut mark = |ks: &mut Keyspace| -> Result<(), KsError> {
        if marked {
            return Ok(());
        }
        for &db in dbs {
            ks.put_piece(&flush_key(db), b"1");
        }
        match ks.apply() {
            Ok(()) => {
                marked = true;
                Ok(())
            }
            Err(KsError::Store(e)) if matches!(e.kind(), engine::ErrorKind::NoRoom { .. }) => {
                Ok(())
            }
            Err(e) => Err(e),
        }
    };
    mark(ctx.ks)?;
    // Tracking clients get one null for the flush, not one key at a time.
    crate::tracking::flushing(ctx, true);
    let r = delete_all(ctx.sh, ctx.ks, dbs, &mut mark);
    crate::tracking::flushing(ctx, false);
    r?;
    for &db in dbs {
        ctx.sh.counts.reset_avg_ttl(db);
    }
    for &db in dbs {
        ctx.ks.remove_piece(&flush_key(db));
    }
    ctx.ks.apply()?;
    Ok(())
}

/// Deletes every key of databases `dbs` (one scan of the store),
/// [`FLUSH_BATCH`] keys per batch (large collections go to the lazy free);
/// `before` runs before each batch.
fn delete_all(
    sh: &Shared,
    ks: &mut Keyspace,
    dbs: &[u8],
    before: &mut dyn FnMut(&mut Keyspace) -> Result<(), KsError>,
) -> Result<(), KsError> {
    let mut cursor = 0;
    let mut page = Vec::new();
    loop {
        page.clear();
        cursor = ks.sess.scan(cursor, 256, &mut page)?;
        page.retain(|k| k.first().is_some_and(|d| dbs.contains(d)));
        page.sort_unstable();
        page.dedup();
        for chunk in page.chunks(FLUSH_BATCH) {
            before(ks)?;
            let refs: Vec<&[u8]> = chunk.iter().map(|k| k.as_slice()).collect();
            let _g = (!ks.in_unit()).then(|| sh.stripes.lock_many(&refs));
            let now = crate::keyspace::now_ms();
            for k in chunk {
                ks.delete(k, now)?;
            }
            ks.apply()?;
        }
        if cursor == 0 {
            return Ok(());
        }
    }
}

/// At start, before any command: finishes the flushes a crash interrupted
/// (a database whose flush marker is in the store loses every key), so a
/// FLUSHDB or FLUSHALL is either wholly done or not begun. Costs one read
/// per database when no flush was interrupted.
pub fn finish_flushes(sh: &Shared) -> Result<(), KsError> {
    let sess = sh.store.session()?;
    let mut ks = Keyspace::new(sess, sh.counts.clone(), 0, sh.hk.clone());
    let mut v = Vec::new();
    let mut marked = Vec::new();
    for db in 0..PIECE_PREFIX {
        if ks.sess.get(&flush_key(db), &mut v)? {
            marked.push(db);
        }
    }
    if marked.is_empty() {
        return Ok(());
    }
    eprintln!("ember: finishing a flush that a crash interrupted (databases {marked:?})");
    delete_all(sh, &mut ks, &marked, &mut |_| Ok(()))?;
    for &db in &marked {
        ks.remove_piece(&flush_key(db));
    }
    ks.apply()?;
    ks.sess.commit()?;
    Ok(())
}

fn flush_args(a: &[Vec<u8>]) -> R {
    match a.len() {
        1 => Ok(()),
        2 if eq(&a[1], "async") || eq(&a[1], "sync") => Ok(()),
        _ => Err(CmdError::Syntax),
    }
}

pub fn flushdb(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    flush_args(a)?;
    flush_dbs(ctx, &[c.db])?;
    c.ok();
    Ok(())
}

pub fn flushall(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    flush_args(a)?;
    let dbs: Vec<u8> = (0..ctx.sh.cfg().databases).map(|d| d as u8).collect();
    flush_dbs(ctx, &dbs)?;
    c.ok();
    Ok(())
}

/// SWAPDB index1 index2: every client of either database sees the other's
/// keys from then on (see [`swap_dbs`]); a database swapped with itself is
/// left as it is.
pub fn swapdb(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    // Redis reads each index as a C int, with its own message.
    let index = |arg: &[u8], msg: &'static str| match proto::int::parse_i64(arg) {
        Some(n) if i32::try_from(n).is_ok() => Ok(n),
        _ => Err(CmdError::Msg(msg)),
    };
    let x = index(&a[1], "invalid first DB index")?;
    let y = index(&a[2], "invalid second DB index")?;
    let dbs = 0..ctx.sh.cfg().databases as i64;
    if !dbs.contains(&x) || !dbs.contains(&y) {
        return Err(CmdError::DbIndexOutOfRange);
    }
    if x != y {
        swap_dbs(ctx, x as u8, y as u8)?;
    }
    c.ok();
    Ok(())
}

/// Keys moved per batch by a SWAPDB.
const SWAP_BATCH: usize = 64;

/// Swaps databases `x` and `y` (different), all-or-nothing across a crash.
///
/// A database is the first byte of its keys' store keys (`keyspace`), so
/// unlike Redis's pointer swap this is O(n) in the keys of both databases:
/// the keys move. The command holds [`FLUSHING`] and every stripe lock
/// throughout (no other command reads or writes a key meanwhile; readers
/// that take no lock read again under their lock, see
/// [`crate::keyspace::Stripes::moving`]), and moves:
/// 0. one batch writes the marker [`SWAP_MARKER`] = `x y 1`;
/// 1. every key of `x` is parked under [`SWAP_TMP`] (`0xFF 0xFF "swaptmp"
///    ‖ key`, value unchanged: a collection's pieces are keyed by its id and
///    stay; the TTL is in the value), then the marker says phase 2;
/// 2. every key of `y` moves to `x`, then the marker says phase 3;
/// 3. every parked key moves to `y`, and one batch removes the marker.
///
/// Each key moves in one batch (its new store key put, its old one
/// removed), [`SWAP_BATCH`] keys a batch. A start that finds the marker
/// finishes the swap from its phase ([`finish_swap`]): a phase moves what
/// is left under its source prefix, and the marker's phase keeps phase 2's
/// keys (now in `x`) from being taken for phase 1's. So after a crash the
/// swap is wholly done or not begun. A full heap (the marker refused) fails
/// it before anything moved; one that refuses a move midway leaves the swap
/// partly done until the next start or the next SWAPDB finishes it (the
/// error says so).
///
/// The moves publish no keyspace event (Redis publishes none) and touch
/// the watched keys of both databases that exist in either (Redis's
/// `touchAllWatchedKeysInDb`); clients blocked on a key of either database
/// are woken to look again. Beyond Redis 7.0 (which invalidates nothing), a
/// tracking client gets one null, as for a flush: its cached keys may have
/// changed.
fn swap_dbs(ctx: &mut Ctx, x: u8, y: u8) -> R {
    let sh = ctx.sh;
    // A transaction or script runs SWAPDB holding FLUSHING and every stripe
    // (`cmd::unit`).
    let unit = ctx.ks.in_unit();
    let flushing = (!unit).then(|| FLUSHING.lock().unwrap_or_else(|p| p.into_inner()));
    let stripes = (!unit).then(|| sh.stripes.lock_all());
    let (events, created) = (ctx.ks.events.len(), ctx.ks.created_log.len());
    // An earlier swap that a full heap stopped midway is finished first:
    // its marker must not be overwritten.
    let mut stopped = Vec::new();
    if !ctx.ks.sess.get(SWAP_MARKER, &mut stopped)? {
        stopped.clear();
        ctx.ks.put_piece(SWAP_MARKER, &[x, y, 1]);
        ctx.ks.apply()?;
    }
    crate::tracking::flushing(ctx, true);
    sh.stripes.moving();
    let woken = sh.blocking.any();
    let mut moved = Vec::new();
    let mut r = Ok(());
    if let &[a, b, phase] = stopped.as_slice() {
        r = swap_phases(ctx.ks, a, b, phase, None);
        if r.is_ok() {
            ctx.ks.put_piece(SWAP_MARKER, &[x, y, 1]);
            r = ctx.ks.apply();
        }
    }
    if r.is_ok() {
        r = swap_phases(ctx.ks, x, y, 1, woken.then_some(&mut moved));
    }
    sh.stripes.moving();
    crate::tracking::flushing(ctx, false);
    // The moves' `new` events are not the command's.
    ctx.ks.events.truncate(events);
    ctx.ks.created_log.truncate(created);
    if let Err(e) = r {
        eprintln!(
            "ember: SWAPDB {x} {y} stopped midway ({e:?}); the next start or SWAPDB finishes it"
        );
        return Err(CmdError::Msg(
            "SWAPDB could not move every key (the heap is full?): the two databases stay partly swapped until the next start or SWAPDB finishes the swap",
        ));
    }
    sh.counts.swap_avg_ttl(x, y);
    // The waiters are woken after the locks are released, as a unit's are.
    drop(stripes);
    drop(flushing);
    if woken {
        let mut keys = Vec::with_capacity(moved.len() * 2);
        for k in &moved {
            keys.push(skey(x, k));
            keys.push(skey(y, k));
        }
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        sh.blocking.signal(&refs);
    }
    Ok(())
}

/// Phases `from..=3` of a swap of `x` and `y` (see [`swap_dbs`]), then the
/// marker's removal; the client keys moved out of `x` and `y` are added to
/// `moved` when given.
fn swap_phases(
    ks: &mut Keyspace,
    x: u8,
    y: u8,
    from: u8,
    mut moved: Option<&mut Vec<Vec<u8>>>,
) -> Result<(), KsError> {
    for phase in from..=3 {
        let (src, dst): (&[u8], &[u8]) = match phase {
            1 => (&[x], SWAP_TMP),
            2 => (&[y], &[x]),
            _ => (SWAP_TMP, &[y]),
        };
        move_prefix(ks, src, dst, phase < 3, moved.as_deref_mut())?;
        if phase < 3 {
            ks.put_piece(SWAP_MARKER, &[x, y, phase + 1]);
        } else {
            ks.remove_piece(SWAP_MARKER);
        }
        ks.apply()?;
    }
    Ok(())
}

/// Moves every store key that begins with `src` to `dst` ‖ the rest (one
/// scan of the store, [`SWAP_BATCH`] keys per batch), the values unchanged;
/// the client keys of a database source are added to `moved` when given
/// (`from_db`: the source is a database).
fn move_prefix(
    ks: &mut Keyspace,
    src: &[u8],
    dst: &[u8],
    from_db: bool,
    mut moved: Option<&mut Vec<Vec<u8>>>,
) -> Result<(), KsError> {
    let mut cursor = 0;
    let mut page = Vec::new();
    let mut raw = Vec::new();
    let mut to = Vec::new();
    loop {
        page.clear();
        cursor = ks.sess.scan(cursor, 256, &mut page)?;
        page.retain(|k| k.starts_with(src));
        page.sort_unstable();
        page.dedup();
        for chunk in page.chunks(SWAP_BATCH) {
            for k in chunk {
                // The scan may return a key twice: the second time it is gone.
                if !ks.sess.get(k, &mut raw)? {
                    continue;
                }
                to.clear();
                to.extend_from_slice(dst);
                to.extend_from_slice(&k[src.len()..]);
                if from_db {
                    let ttl = crate::keyspace::decode(&raw).is_some_and(|h| h.expire.is_some());
                    ks.remove_known(k, ttl);
                    if let Some(m) = moved.as_deref_mut() {
                        m.push(k[1..].to_vec());
                    }
                } else {
                    ks.remove_piece(k);
                }
                if dst.len() == 1 {
                    ks.put_raw(&to, &raw);
                } else {
                    ks.put_piece(&to, &raw);
                }
            }
            ks.apply()?;
        }
        if cursor == 0 {
            return Ok(());
        }
    }
}

/// At start, before any command: finishes a SWAPDB that a crash
/// interrupted, from the phase its marker names (see [`swap_dbs`]). Costs
/// one read when none was.
pub fn finish_swap(sh: &Shared) -> Result<(), KsError> {
    let sess = sh.store.session()?;
    let mut ks = Keyspace::new(sess, sh.counts.clone(), 0, sh.hk.clone());
    let mut v = Vec::new();
    if !ks.sess.get(SWAP_MARKER, &mut v)? {
        return Ok(());
    }
    let &[x, y, phase] = v.as_slice() else {
        return Err(KsError::Corrupt);
    };
    eprintln!("ember: finishing a SWAPDB {x} {y} that a crash interrupted (phase {phase})");
    swap_phases(&mut ks, x, y, phase, None)?;
    ks.sess.commit()?;
    Ok(())
}

/// A database index argument (COPY's DB, MOVE), checked as SELECT checks
/// it.
fn db_arg(ctx: &Ctx, a: &[u8]) -> Result<u8, CmdError> {
    let n = int_arg(a)?;
    if n < i32::MIN as i64 || n > i32::MAX as i64 {
        return Err(CmdError::IntRange);
    }
    if n < 0 || n >= ctx.sh.cfg().databases as i64 {
        return Err(CmdError::DbIndexOutOfRange);
    }
    Ok(n as u8)
}

/// COPY source destination [DB destination-db] [REPLACE]: the copy keeps
/// the TTL; a pieced collection's pieces are copied under a new collection
/// id (O(n); a large collection in batches of its own before the command's,
/// see [`crate::coll::copy_value`]).
pub fn copy(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (mut db, mut replace) = (c.db, false);
    let mut i = 3;
    while i < a.len() {
        if eq(&a[i], "replace") {
            replace = true;
            i += 1;
        } else if eq(&a[i], "db") && i + 1 < a.len() {
            db = db_arg(ctx, &a[i + 1])?;
            i += 2;
        } else {
            return Err(CmdError::Syntax);
        }
    }
    if db == c.db && a[1] == a[2] {
        return Err(CmdError::SameObject);
    }
    let src = skey(c.db, &a[1]);
    let dst = skey(db, &a[2]);
    let copied = locked(ctx, &[&src, &dst], |ctx| {
        let Some(h) = ctx.ks.lookup_locked(&src, ctx.now)? else {
            c.int(0);
            return Ok(false);
        };
        let raw = ctx.ks.raw.clone();
        let exists = ctx.ks.lookup_locked(&dst, ctx.now)?.is_some();
        if exists && !replace {
            c.int(0);
            return Ok(false);
        }
        // The copy first (a large one applies batches of pieces before the
        // command's own), then the replaced value's removal and the new head
        // in the command's batch.
        let payload = crate::coll::copy_value(ctx.sh, ctx.ks, h.kind, &raw[h.off..])?;
        if exists {
            ctx.ks.delete(&dst, ctx.now)?;
        }
        ctx.ks.put(&dst, h.kind, h.expire, &payload);
        c.int(1);
        Ok(true)
    })?;
    if copied {
        event(ctx, notify::GENERIC, "copy_to", db, &a[2]);
    }
    Ok(())
}

/// MOVE key db: the head value moves (a collection's pieces are keyed by
/// its id, not by database and key, so they stay), with its TTL.
pub fn move_(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let db = db_arg(ctx, &a[2])?;
    if db == c.db {
        return Err(CmdError::SameObject);
    }
    let src = skey(c.db, &a[1]);
    let dst = skey(db, &a[1]);
    let moved = locked(ctx, &[&src, &dst], |ctx| {
        let Some(h) = ctx.ks.lookup_locked(&src, ctx.now)? else {
            c.int(0);
            return Ok(false);
        };
        let raw = ctx.ks.raw.clone();
        if ctx.ks.lookup_locked(&dst, ctx.now)?.is_some() {
            c.int(0);
            return Ok(false);
        }
        ctx.ks.put_raw(&dst, &raw);
        ctx.ks.remove_known(&src, h.expire.is_some());
        c.int(1);
        Ok(true)
    })?;
    if moved {
        // Redis adds the destination (`new`) before these two.
        notify::flush_pending(ctx.sh, ctx.ks);
        event(ctx, notify::GENERIC, "move_from", c.db, &a[1]);
        event(ctx, notify::GENERIC, "move_to", db, &a[1]);
    }
    Ok(())
}

/// MEMORY USAGE key [SAMPLES n] (and HELP). The estimate is the key's store
/// entry (key, value, and the store's per-entry overhead) plus, for a
/// pieced collection, its pieces: measured on `n` pieces spread over it
/// (default 5, 0: every piece) and scaled to their count.
pub fn memory(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sub = String::from_utf8_lossy(&a[1]).to_ascii_lowercase();
    match sub.as_str() {
        "help" if a.len() == 2 => {
            let lines = [
                "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "USAGE <key> [SAMPLES <count>]",
                "    Return memory in bytes used by <key> and its value. Nested values are",
                "    sampled up to <count> times (default: 5, 0 means sample all).",
                "HELP",
                "    Prints this help.",
            ];
            super::help(c, &lines);
            return Ok(());
        }
        "usage" if a.len() >= 3 => {}
        "doctor" | "stats" | "purge" | "malloc-stats" if a.len() == 2 => {
            return Err(CmdError::NotSupported {
                what: format!("MEMORY {}", sub.to_ascii_uppercase()),
                why: " (INFO memory and INFO persistence report the heap's use)",
            })
        }
        "usage" | "help" | "doctor" | "stats" | "purge" | "malloc-stats" => {
            return Err(super::arity_error(format!("memory|{sub}")))
        }
        _ => return Err(super::unknown_subcommand("MEMORY", &a[1])),
    }
    let samples = match &a[3..] {
        [] => 5,
        [o, n] if eq(o, "samples") => {
            let n = int_arg(n)?;
            if n < 0 {
                return Err(CmdError::Syntax);
            }
            n as usize
        }
        _ => return Err(CmdError::Syntax),
    };
    let sk = skey(c.db, &a[2]);
    let n = locked(ctx, &[&sk], |ctx| {
        let Some(h) = ctx.ks.lookup_locked(&sk, ctx.now)? else {
            return Ok(None);
        };
        let raw = ctx.ks.raw.clone();
        let pieces = crate::coll::pieces_usage(ctx.ks, h.kind, &raw[h.off..], samples)?;
        Ok(Some(
            sk.len() as u64 + raw.len() as u64 + crate::coll::PIECE_OVERHEAD + pieces,
        ))
    })?;
    match n {
        Some(n) => c.int(n as i64),
        None => c.null(),
    }
    Ok(())
}

pub fn randomkey(ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    use rand::RngExt;
    let start: u64 = rand::rng().random::<u64>() | 1;
    let mut cursor = start;
    let mut wrapped = false;
    let mut page = Vec::new();
    loop {
        page.clear();
        let next = ctx.ks.scan_page(c.db, cursor, 64, &mut page)?;
        for k in page.drain(..) {
            if ctx.ks.get(&ctx.sh.stripes, c.db, &k, ctx.now)?.is_some() {
                c.bulk(&k);
                return Ok(());
            }
        }
        if next == 0 {
            if wrapped {
                break;
            }
            wrapped = true;
            cursor = 0;
        } else {
            cursor = next;
        }
        if wrapped && cursor >= start {
            break;
        }
    }
    c.null();
    Ok(())
}

/// EXPIRE / PEXPIRE / EXPIREAT / PEXPIREAT with NX, XX, GT, LT (Redis 7).
fn expire_generic(
    ctx: &mut Ctx,
    c: &mut Client,
    a: &[Vec<u8>],
    ms: bool,
    relative: bool,
    cmd: &'static str,
) -> R {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for o in &a[3..] {
        if eq(o, "nx") {
            nx = true;
        } else if eq(o, "xx") {
            xx = true;
        } else if eq(o, "gt") {
            gt = true;
        } else if eq(o, "lt") {
            lt = true;
        } else {
            return Err(CmdError::ExpireOption(o.to_vec()));
        }
    }
    if nx && (xx || gt || lt) {
        return Err(CmdError::ExpireNxWithOthers);
    }
    if gt && lt {
        return Err(CmdError::ExpireGtWithLt);
    }
    let n = int_arg(&a[2])?;
    let invalid = || CmdError::InvalidExpire(cmd);
    let mut when = if ms {
        n
    } else {
        n.checked_mul(1000).ok_or_else(invalid)?
    };
    if relative {
        when = when.checked_add(ctx.now).ok_or_else(invalid)?;
    }
    let sk = skey(c.db, &a[1]);
    let what = locked(ctx, &[&sk], |ctx| {
        let Some(h) = ctx.ks.lookup_locked(&sk, ctx.now)? else {
            c.int(0);
            return Ok(None);
        };
        let cur = h.expire;
        let refuse = (nx && cur.is_some())
            || (xx && cur.is_none())
            || (gt && cur.is_none_or(|t| when <= t))
            || (lt && cur.is_some_and(|t| when >= t));
        if refuse {
            c.int(0);
            return Ok(None);
        }
        let what = if when <= ctx.now {
            ctx.ks.delete(&sk, ctx.now)?;
            "del"
        } else {
            let v = ctx.ks.raw[h.off..].to_vec();
            ctx.ks.put(&sk, h.kind, Some(when), &v);
            "expire"
        };
        c.int(1);
        Ok(Some(what))
    })?;
    if let Some(name) = what {
        event(ctx, notify::GENERIC, name, c.db, &a[1]);
    }
    Ok(())
}

pub fn expire(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    expire_generic(ctx, c, a, false, true, "expire")
}
pub fn pexpire(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    expire_generic(ctx, c, a, true, true, "pexpire")
}
pub fn expireat(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    expire_generic(ctx, c, a, false, false, "expireat")
}
pub fn pexpireat(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    expire_generic(ctx, c, a, true, false, "pexpireat")
}

/// TTL family: -2 missing, -1 no expiry.
fn ttl_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], ms: bool, abs: bool) -> R {
    let Some(h) = ctx.ks.get(&ctx.sh.stripes, c.db, &a[1], ctx.now)? else {
        c.int(-2);
        return Ok(());
    };
    let Some(t) = h.expire else {
        c.int(-1);
        return Ok(());
    };
    let v = if abs { t } else { (t - ctx.now).max(0) };
    // Rounded to seconds in i128: an expiry near i64::MAX (PXAT
    // 9223372036854775807) must not overflow; Redis answers the exact quotient.
    c.int(if ms {
        v
    } else {
        ((v as i128 + 500) / 1000) as i64
    });
    Ok(())
}

pub fn ttl(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    ttl_generic(ctx, c, a, false, false)
}
pub fn pttl(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    ttl_generic(ctx, c, a, true, false)
}
pub fn expiretime(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    ttl_generic(ctx, c, a, false, true)
}
pub fn pexpiretime(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    ttl_generic(ctx, c, a, true, true)
}

pub fn persist(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    let done = locked(ctx, &[&sk], |ctx| {
        match ctx.ks.lookup_locked(&sk, ctx.now)? {
            Some(h) if h.expire.is_some() => {
                let v = ctx.ks.raw[h.off..].to_vec();
                ctx.ks.put(&sk, h.kind, None, &v);
                c.int(1);
                Ok(true)
            }
            _ => {
                c.int(0);
                Ok(false)
            }
        }
    })?;
    if done {
        event(ctx, notify::GENERIC, "persist", c.db, &a[1]);
    }
    Ok(())
}

/// Redis's encoding name for a string value.
fn string_encoding(v: &[u8]) -> &'static str {
    if v.len() <= 20 && proto::int::parse_i64(v).is_some() {
        "int"
    } else if v.len() <= 44 {
        "embstr"
    } else {
        "raw"
    }
}

/// OBJECT ENCODING's name for a value of type `kind` (`v`: its stored
/// form), as Redis names its encodings.
pub(super) fn encoding_of(kind: u8, v: &[u8]) -> &'static str {
    match kind {
        KIND_STRING => string_encoding(v),
        KIND_HASH => super::maps::encoding(v, "listpack"),
        KIND_SET => super::maps::encoding(v, "intset"),
        // Redis 7.0 keeps every list as a quicklist.
        KIND_LIST => "quicklist",
        KIND_ZSET => super::zsets::encoding(v),
        KIND_STREAM => super::streams::encoding(),
        _ => "unknown",
    }
}

pub fn object(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sub = String::from_utf8_lossy(&a[1]).to_ascii_lowercase();
    if sub == "help" {
        let lines = [
            "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "ENCODING <key>",
            "    Return the kind of internal representation used in order to store the value",
            "    associated with a <key>.",
            "FREQ <key>",
            "    Return the access frequency index of the <key>. The returned integer is",
            "    proportional to the logarithm of the recent access frequency of the key.",
            "IDLETIME <key>",
            "    Return the idle time of the <key>, that is the approximated number of",
            "    seconds elapsed since the last access to the key.",
            "REFCOUNT <key>",
            "    Return the number of references of the value associated with the specified",
            "    <key>.",
            "HELP",
            "    Prints this help.",
        ];
        super::help(c, &lines);
        return Ok(());
    }
    if !matches!(sub.as_str(), "encoding" | "refcount" | "freq" | "idletime") {
        return Err(super::unknown_subcommand("OBJECT", &a[1]));
    }
    if a.len() != 3 {
        return Err(super::arity_error(format!("object|{sub}")));
    }
    // As Redis's OBJECT: the lookup does not count as an access.
    let Some(h) = ctx
        .ks
        .get_untouched(&ctx.sh.stripes, c.db, &a[2], ctx.now)?
    else {
        c.null();
        return Ok(());
    };
    let v = &ctx.ks.raw[h.off..];
    match sub.as_str() {
        "encoding" => c.bulk(encoding_of(h.kind, v).as_bytes()),
        "refcount" => {
            // Redis shares the integers 0..9999 (refcount INT_MAX).
            let shared = proto::int::parse_i64(v).is_some_and(|n| (0..10_000).contains(&n));
            c.int(if shared { i32::MAX as i64 } else { 1 });
        }
        // The DRAM access stamps (`evict::Access`): a frequency under an
        // LFU policy, an idle time otherwise; a key not accessed since the
        // start reads as idle since the start.
        "freq" => {
            if !ctx.sh.evict.policy().lfu() {
                return Err(CmdError::NoLfuPolicy);
            }
            let sk = skey(c.db, &a[2]);
            c.int(ctx.sh.hk.access.freq(&sk, ctx.now).into());
        }
        _ => {
            if ctx.sh.evict.policy().lfu() {
                return Err(CmdError::LfuPolicy);
            }
            let sk = skey(c.db, &a[2]);
            let idle = ctx.sh.hk.access.idle_ms(&sk, ctx.now);
            let idle = idle.unwrap_or(ctx.sh.started.elapsed().as_millis() as u64);
            c.int((idle / 1000) as i64);
        }
    }
    Ok(())
}
