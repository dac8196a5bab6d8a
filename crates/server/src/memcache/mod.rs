//! memcached's protocol on the keyspace: connections of `--memcached-port`
//! are framed by [`proto::memcache::McCodec`] and run here, on database 0,
//! through the same write path as Redis's commands (`cmd::locked`: stripe
//! lock, staged batch, `Keyspace::apply`; the worker's group commit holds the
//! replies until the writes are durable).
//!
//! Items are strings with memcached's state in a header ([`item`]): client
//! flags, a CAS unique, the fetched / token-sent / stale bits, last access.
//! A Redis string is an item with flags 0 (its CAS follows its bytes); a key
//! holding a Redis collection is invisible to memcached's reads and to the
//! commands that need an item (a miss, `NOT_FOUND`, `NOT_STORED`), `add`
//! refuses it (`NOT_STORED`: the key is taken), `set` replaces it as Redis's
//! SET does, `delete` removes it.
//!
//! Replies follow memcached 1.6.18's texts byte for byte (the differential
//! test `serve_memcached.rs` compares them with a real memcached).

pub mod item;

use crate::client::Client;
use crate::cmd::{self, CmdError, Ctx};
use crate::keyspace::{skey, KsError, KIND_STRING};
use crate::worker::Worker;
use item::{Exp, Meta, FETCHED, KEY_BINARY, STALE, TOKEN_SENT};
use proto::memcache::{
    encode_key, safe_strtoull, Data, McCmd, McCodec, McFrame, McRequest, MetaFlags, StoreMode,
    BAD_CHUNK, OUT_OF_MEMORY, TOO_LARGE,
};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// The memcached version whose protocol the port speaks (`version`,
/// `stats`).
pub const VERSION: &str = "1.6.18";
/// The database memcached's keys live in.
const DB: u8 = 0;
/// memcached's `ITEM_UPDATE_INTERVAL`: a fetch updates an item's last access
/// at most this often (each update is a write).
const UPDATE_INTERVAL: u32 = 60;

/// A memcached connection's state.
#[derive(Debug, Default)]
pub struct McConn {
    codec: McCodec,
    /// `memcached-item-size-max` (startup-only), read at the first request.
    item_max: u64,
}

/// memcached's counters (`stats`), for the whole process.
#[derive(Default)]
pub struct McStats {
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_flush: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub cmd_meta: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub delete_hits: AtomicU64,
    pub delete_misses: AtomicU64,
    pub incr_hits: AtomicU64,
    pub incr_misses: AtomicU64,
    pub decr_hits: AtomicU64,
    pub decr_misses: AtomicU64,
    pub cas_hits: AtomicU64,
    pub cas_misses: AtomicU64,
    pub cas_badval: AtomicU64,
    pub touch_hits: AtomicU64,
    pub touch_misses: AtomicU64,
    pub store_too_large: AtomicU64,
    pub store_no_memory: AtomicU64,
    pub total_items: AtomicU64,
    pub total_connections: AtomicU64,
    /// `evict::evicted_total` at the last `stats reset` (the `evictions`
    /// stat counts from there).
    pub evictions: AtomicU64,
}

pub static STATS: McStats = McStats {
    cmd_get: AtomicU64::new(0),
    cmd_set: AtomicU64::new(0),
    cmd_flush: AtomicU64::new(0),
    cmd_touch: AtomicU64::new(0),
    cmd_meta: AtomicU64::new(0),
    get_hits: AtomicU64::new(0),
    get_misses: AtomicU64::new(0),
    delete_hits: AtomicU64::new(0),
    delete_misses: AtomicU64::new(0),
    incr_hits: AtomicU64::new(0),
    incr_misses: AtomicU64::new(0),
    decr_hits: AtomicU64::new(0),
    decr_misses: AtomicU64::new(0),
    cas_hits: AtomicU64::new(0),
    cas_misses: AtomicU64::new(0),
    cas_badval: AtomicU64::new(0),
    touch_hits: AtomicU64::new(0),
    touch_misses: AtomicU64::new(0),
    store_too_large: AtomicU64::new(0),
    store_no_memory: AtomicU64::new(0),
    total_items: AtomicU64::new(0),
    total_connections: AtomicU64::new(0),
    evictions: AtomicU64::new(0),
};

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A delayed `flush_all`: the Unix ms at which database 0 is flushed (0:
/// none pending). Memory only, as in memcached.
static FLUSH_AT: AtomicI64 = AtomicI64::new(0);

impl Worker {
    /// Runs the buffered requests of a memcached connection (the worker's
    /// `run_requests` for the memcached port); false when stopped at the
    /// output high water.
    pub(crate) fn run_memcached(&mut self, c: &mut Client) -> bool {
        let now = crate::keyspace::now_ms();
        loop {
            if c.close_after || c.kill {
                return true;
            }
            let pending = c.out.len() - c.outpos;
            if pending >= self.obuf_check_of(c) && self.output_limit_reached(c) {
                return true;
            }
            if pending > crate::worker::OUT_HIGH_WATER {
                return false;
            }
            if c.inpos == c.inbuf.len() {
                if c.inbuf.capacity() > crate::worker::KEEP_BUF {
                    c.inbuf = Vec::new();
                } else {
                    c.inbuf.clear();
                }
                c.inpos = 0;
                return true;
            }
            let Some(mc) = c.mc.as_mut() else {
                return true;
            };
            if mc.item_max == 0 {
                mc.item_max = self.sh.cfg().memcached_item_size_max;
                bump(&STATS.total_connections);
            }
            match mc.codec.decode(&c.inbuf[c.inpos..], mc.item_max as usize) {
                McFrame::Incomplete => {
                    if c.inpos > 0 {
                        c.inbuf.drain(..c.inpos);
                        c.inpos = 0;
                    }
                    return true;
                }
                McFrame::Skip(n) => c.inpos += n,
                McFrame::Close { reply } => {
                    c.out.extend_from_slice(reply.as_bytes());
                    c.close_after = true;
                    c.inbuf = Vec::new();
                    c.inpos = 0;
                    return true;
                }
                McFrame::Request { consumed, req } => {
                    c.inpos += consumed;
                    if self.sh.acl.auth_required(c.authed) {
                        // memcached's text for an unauthenticated client: the
                        // port has no way to log in.
                        c.out.extend_from_slice(b"CLIENT_ERROR unauthenticated\r\n");
                        c.close_after = true;
                        return true;
                    }
                    let mut ctx = Ctx {
                        sh: &self.sh,
                        ks: &mut self.ks,
                        ws: &self.ws,
                        now,
                    };
                    due_flush(&mut ctx);
                    execute(&mut ctx, c, req);
                    self.batch_requests += 1;
                    c.meta.last_ms.store(
                        crate::clock::Stamp::now().millis_since(c.meta.created),
                        Ordering::Relaxed,
                    );
                }
            }
        }
    }

    /// Worker 0's tick: runs a delayed `flush_all` whose time has come.
    pub(crate) fn memcached_tick(&mut self) {
        if FLUSH_AT.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut ctx = Ctx {
            sh: &self.sh,
            ks: &mut self.ks,
            ws: &self.ws,
            now: crate::keyspace::now_ms(),
        };
        due_flush(&mut ctx);
    }
}

/// Flushes database 0 if a delayed `flush_all` is due.
fn due_flush(ctx: &mut Ctx) {
    let at = FLUSH_AT.load(Ordering::Relaxed);
    if at != 0
        && at <= ctx.now
        && FLUSH_AT
            .compare_exchange(at, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        if let Err(e) = cmd::flush_dbs(ctx, &[DB]) {
            eprintln!("ember: memcached flush_all failed: {}", e.text());
        }
    }
}

/// Appends a reply line unless `noreply` hides it.
fn line(c: &mut Client, noreply: bool, s: &str) {
    if !noreply {
        c.out.extend_from_slice(s.as_bytes());
        c.out.extend_from_slice(b"\r\n");
    }
}

/// The reply for a write the store refused: memcached's out-of-memory text
/// for a full heap, the store's error otherwise.
fn store_error(e: CmdError) -> String {
    let text = e.text();
    match e {
        CmdError::Store(KsError::Store(se))
            if matches!(se.kind(), engine::ErrorKind::NoRoom { .. }) =>
        {
            bump(&STATS.store_no_memory);
            OUT_OF_MEMORY.into()
        }
        // maxmemory reached with nothing left to evict (noeviction).
        CmdError::OomMaxmemory => {
            bump(&STATS.store_no_memory);
            OUT_OF_MEMORY.into()
        }
        _ => format!("SERVER_ERROR {}", text.trim_start_matches("ERR ")),
    }
}

/// [`store_error`] for incr/decr, whose full heap memcached words
/// differently.
fn arith_error(e: CmdError) -> String {
    let t = store_error(e);
    if t == OUT_OF_MEMORY {
        "SERVER_ERROR out of memory".into()
    } else {
        t
    }
}

/// What a key holds, for memcached.
enum Look {
    Miss,
    /// A Redis collection: not an item.
    Other,
    /// An item: its expiry, state and value.
    Hit(Option<i64>, Meta, Vec<u8>),
}

/// Reads `sk` under its stripe lock (an expired key's removal is staged).
fn look(ctx: &mut Ctx, sk: &[u8]) -> Result<Look, CmdError> {
    Ok(match ctx.ks.lookup_locked(sk, ctx.now)? {
        None => Look::Miss,
        Some(h) if h.kind != KIND_STRING => Look::Other,
        Some(h) => {
            let m = item::meta(&ctx.ks.raw, &h);
            Look::Hit(h.expire, m, ctx.ks.raw[h.off..].to_vec())
        }
    })
}

/// Stages an item write (stripe lock held); an expiry in the past removes
/// the key instead. A collection it replaces has its pieces freed.
fn put(ctx: &mut Ctx, sk: &[u8], expire: Option<i64>, m: &Meta, value: &[u8], other: bool) -> R {
    if other {
        ctx.ks.free_pieces(sk, ctx.now)?;
    }
    if expire.is_some_and(|t| t <= ctx.now) {
        ctx.ks.delete(sk, ctx.now)?;
        return Ok(());
    }
    let mut buf = Vec::new();
    item::encode(expire, m, value, &mut buf);
    ctx.ks.put_raw(sk, &buf);
    Ok(())
}

type R = Result<(), CmdError>;

fn now_s(ctx: &Ctx) -> u32 {
    (ctx.now / 1000) as u32
}

/// A new item's state.
fn fresh(ctx: &Ctx, flags: u32, bits: u8) -> Meta {
    Meta {
        flags,
        cas: item::next_cas(),
        bits,
        atime: now_s(ctx),
    }
}

/// Whether an item of this key, flags and value length fits under
/// `memcached-item-size-max`, sized as memcached sizes it (its 48-byte item
/// header, the key and its NUL, the flags when not 0, the value and its
/// `\r\n`, the CAS), so the same items are refused as by `memcached -I`.
fn fits(item_max: u64, key: &[u8], flags: u32, vlen: usize) -> bool {
    let total = 48 + key.len() as u64 + 1 + if flags != 0 { 4 } else { 0 } + vlen as u64 + 2 + 8;
    total <= item_max
}

/// Where every store of a data block (the text storage commands, `ms`)
/// begins, before any stripe lock is taken: whether the item fits
/// ([`fits`]; `vlen` None: a block too large to have been read). One that
/// does not is counted, and with `drop_old` the key's old item is deleted
/// (memcached would rather lose it than keep serving stale data). A cache
/// that evicts makes room for an admitted item here (no lock held, so
/// eviction may lock the keys it removes).
fn admit_store(
    ctx: &mut Ctx,
    item_max: u64,
    key: &[u8],
    flags: u32,
    vlen: Option<usize>,
    drop_old: bool,
) -> Result<bool, CmdError> {
    if let Some(n) = vlen.filter(|&n| fits(item_max, key, flags, n)) {
        // Cache mode: evict to make room for the item (about its key,
        // value and header).
        crate::evict::make_room_for(ctx, (key.len() + n + 64) as u64)?;
        return Ok(true);
    }
    bump(&STATS.store_too_large);
    if drop_old {
        let sk = skey(DB, key);
        cmd::locked(ctx, &[&sk], |ctx| Ok(ctx.ks.delete(&sk, ctx.now)?))?;
    }
    Ok(false)
}

fn execute(ctx: &mut Ctx, c: &mut Client, req: McRequest) {
    let nr = req.noreply;
    let item_max = c.mc.as_ref().map_or(1 << 20, |m| m.item_max);
    match req.cmd {
        McCmd::Error(t) => line(c, nr, t),
        McCmd::Get { keys, cas, touch } => get(ctx, c, &keys, cas, touch),
        McCmd::Store {
            mode,
            key,
            flags,
            exptime,
            cas,
            data,
        } => {
            let r = store(ctx, item_max, mode, &key, flags, exptime, cas, data);
            line(c, nr, &r);
        }
        McCmd::Delete { key } => {
            let sk = skey(DB, &key);
            let r = cmd::locked(ctx, &[&sk], |ctx| {
                Ok(match look(ctx, &sk)? {
                    Look::Miss => false,
                    _ => ctx.ks.delete(&sk, ctx.now)?,
                })
            });
            let r = match r {
                Ok(true) => {
                    bump(&STATS.delete_hits);
                    "DELETED".to_string()
                }
                Ok(false) => {
                    bump(&STATS.delete_misses);
                    "NOT_FOUND".to_string()
                }
                Err(e) => store_error(e),
            };
            line(c, nr, &r);
        }
        McCmd::Arith { incr, key, delta } => {
            let sk = skey(DB, &key);
            let r = cmd::locked(ctx, &[&sk], |ctx| arith(ctx, &sk, incr, delta, None));
            let r = match r {
                Ok(Arith::Done { digits, .. }) => {
                    bump(if incr {
                        &STATS.incr_hits
                    } else {
                        &STATS.decr_hits
                    });
                    digits
                }
                Ok(Arith::Missing) => {
                    bump(if incr {
                        &STATS.incr_misses
                    } else {
                        &STATS.decr_misses
                    });
                    "NOT_FOUND".into()
                }
                Ok(Arith::NonNumeric) => {
                    "CLIENT_ERROR cannot increment or decrement non-numeric value".into()
                }
                Ok(Arith::CasMismatch) => "EXISTS".into(),
                Err(e) => arith_error(e),
            };
            line(c, nr, &r);
        }
        McCmd::Touch { key, exptime } => {
            let sk = skey(DB, &key);
            bump(&STATS.cmd_touch);
            let r = cmd::locked(ctx, &[&sk], |ctx| {
                let Look::Hit(_, mut m, v) = look(ctx, &sk)? else {
                    return Ok(false);
                };
                m.bits |= FETCHED;
                m.atime = now_s(ctx);
                put(
                    ctx,
                    &sk,
                    Exp::from(exptime, ctx.now).expire(),
                    &m,
                    &v,
                    false,
                )?;
                Ok(true)
            });
            let r = match r {
                Ok(true) => {
                    bump(&STATS.touch_hits);
                    "TOUCHED".to_string()
                }
                Ok(false) => {
                    bump(&STATS.touch_misses);
                    "NOT_FOUND".to_string()
                }
                Err(e) => store_error(e),
            };
            line(c, nr, &r);
        }
        McCmd::FlushAll { delay } => {
            bump(&STATS.cmd_flush);
            // memcached invalidates what was stored up to a second before
            // the time given (its `oldest_live` is that time minus one).
            let started = ctx.now - ctx.sh.started.elapsed().as_millis() as i64;
            let at = match Exp::from(delay.max(0), ctx.now) {
                Exp::At(t) => t - 1000,
                // An absolute time from before the server started: nothing
                // was stored before it, and memcached flushes nothing.
                Exp::Past if i64::from(delay) * 1000 <= started => {
                    FLUSH_AT.store(0, Ordering::Relaxed);
                    return line(c, nr, "OK");
                }
                Exp::Never | Exp::Past => 0,
            };
            if at > ctx.now {
                FLUSH_AT.store(at, Ordering::Relaxed);
                line(c, nr, "OK");
            } else {
                FLUSH_AT.store(0, Ordering::Relaxed);
                match cmd::flush_dbs(ctx, &[DB]) {
                    Ok(()) => line(c, nr, "OK"),
                    Err(e) => line(c, nr, &store_error(e)),
                }
            }
        }
        McCmd::Version => line(c, nr, &format!("VERSION {VERSION}")),
        McCmd::Verbosity => line(c, nr, "OK"),
        McCmd::Quit => c.close_after = true,
        McCmd::Stats { args } => stats(ctx, c, &args),
        McCmd::MetaNoop => line(c, false, "MN"),
        McCmd::MetaGet { key, flags } => {
            bump(&STATS.cmd_meta);
            meta_get(ctx, c, &key, &flags);
        }
        McCmd::MetaSet { key, flags, data } => {
            bump(&STATS.cmd_meta);
            meta_set(ctx, c, item_max, &key, &flags, data);
        }
        McCmd::MetaDelete { key, flags } => {
            bump(&STATS.cmd_meta);
            meta_delete(ctx, c, &key, &flags);
        }
        McCmd::MetaArith { key, flags } => {
            bump(&STATS.cmd_meta);
            meta_arith(ctx, c, &key, &flags);
        }
        McCmd::MetaDebug { key, .. } => {
            bump(&STATS.cmd_meta);
            let sk = skey(DB, &key);
            let r = cmd::locked(ctx, &[&sk], |ctx| look(ctx, &sk));
            match r {
                Ok(Look::Hit(expire, m, v)) => {
                    // memcached prints the key as the item was stored.
                    let k = if m.bits & KEY_BINARY != 0 {
                        encode_key(&key)
                    } else {
                        String::from_utf8_lossy(&key).into_owned()
                    };
                    let exp = match expire {
                        None => -1,
                        Some(t) => item::secs_ceil(ctx.now) - item::secs_ceil(t),
                    };
                    let size =
                        48 + key.len() + 1 + v.len() + 2 + 8 + if m.flags != 0 { 4 } else { 0 };
                    line(
                        c,
                        false,
                        &format!(
                            "ME {k} exp={exp} la={} cas={} fetch={} cls=1 size={size}",
                            now_s(ctx).saturating_sub(m.atime),
                            m.cas,
                            if m.bits & FETCHED != 0 { "yes" } else { "no" },
                        ),
                    );
                }
                Ok(_) => line(c, false, "EN"),
                Err(e) => line(c, false, &store_error(e)),
            }
        }
    }
}

/// get, gets, gat, gats.
fn get(ctx: &mut Ctx, c: &mut Client, keys: &[Vec<u8>], cas: bool, touch: Option<i32>) {
    let mut out = Vec::new();
    for key in keys {
        if key.len() > proto::memcache::KEY_MAX {
            // The keys before it were fetched; their values are not sent.
            return line(c, false, proto::memcache::BAD_FORMAT);
        }
        let sk = skey(DB, key);
        let found = if let Some(exptime) = touch {
            bump(&STATS.cmd_touch);
            let r = cmd::locked(ctx, &[&sk], |ctx| {
                let Look::Hit(_, mut m, v) = look(ctx, &sk)? else {
                    return Ok(None);
                };
                let shown = m;
                m.bits |= FETCHED;
                m.atime = now_s(ctx);
                put(
                    ctx,
                    &sk,
                    Exp::from(exptime, ctx.now).expire(),
                    &m,
                    &v,
                    false,
                )?;
                Ok(Some((shown, v)))
            });
            match r {
                Ok(f) => {
                    bump(if f.is_some() {
                        &STATS.touch_hits
                    } else {
                        &STATS.touch_misses
                    });
                    f
                }
                Err(e) => {
                    line(c, false, &store_error(e));
                    return;
                }
            }
        } else {
            bump(&STATS.cmd_get);
            match read_bumping(ctx, &sk) {
                Ok(f) => {
                    bump(if f.is_some() {
                        &STATS.get_hits
                    } else {
                        &STATS.get_misses
                    });
                    f
                }
                Err(e) => {
                    line(c, false, &store_error(e));
                    return;
                }
            }
        };
        if let Some((m, v)) = found {
            out.extend_from_slice(b"VALUE ");
            out.extend_from_slice(key);
            use std::io::Write;
            let _ = write!(out, " {} {}", m.flags, v.len());
            if cas {
                let _ = write!(out, " {}", m.cas);
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&v);
            out.extend_from_slice(b"\r\n");
        }
    }
    c.out.extend_from_slice(&out);
    c.out.extend_from_slice(b"END\r\n");
}

/// A plain read of an item (no lock), as memcached's fetch: the first fetch
/// of an item, or one a minute after its last access, records the access
/// The start of an mg or ma reply: `VA <len>` when the value is returned,
/// `HD` otherwise (the flags follow).
fn meta_head(value: bool, len: usize) -> Vec<u8> {
    if value {
        format!("VA {len}").into_bytes()
    } else {
        b"HD".to_vec()
    }
}

/// (a write, under the key's lock). Returns the state before the access.
fn read_bumping(ctx: &mut Ctx, sk: &[u8]) -> Result<Option<(Meta, Vec<u8>)>, CmdError> {
    let Some(h) = ctx.ks.get(&ctx.sh.stripes, DB, &sk[1..], ctx.now)? else {
        return Ok(None);
    };
    if h.kind != KIND_STRING {
        return Ok(None);
    }
    let m = item::meta(&ctx.ks.raw, &h);
    let v = ctx.ks.raw[h.off..].to_vec();
    let is_item = ctx.ks.raw[0] & crate::keyspace::MC_BIT != 0;
    if is_item && needs_bump(ctx, &m) {
        record_access(ctx, sk, m.cas);
    }
    Ok(Some((m, v)))
}

/// Records a fetch of the item at `sk` (fetched bit, last access) if it is
/// still the one with CAS `cas`: a write of its own, under the key's lock.
/// Best effort: a read does not fail because the heap is full.
fn record_access(ctx: &mut Ctx, sk: &[u8], cas: u64) {
    let _ = cmd::locked(ctx, &[sk], |ctx| {
        if let Look::Hit(expire, mut m, v) = look(ctx, sk)? {
            if m.cas == cas && needs_bump(ctx, &m) {
                m.bits |= FETCHED;
                m.atime = now_s(ctx);
                put(ctx, sk, expire, &m, &v, false)?;
            }
        }
        Ok(())
    });
}

fn needs_bump(ctx: &Ctx, m: &Meta) -> bool {
    m.bits & FETCHED == 0 || now_s(ctx).saturating_sub(m.atime) >= UPDATE_INTERVAL
}

/// The text storage commands; returns the reply line.
#[allow(clippy::too_many_arguments)]
fn store(
    ctx: &mut Ctx,
    item_max: u64,
    mode: StoreMode,
    key: &[u8],
    flags: u32,
    exptime: i32,
    cas: u64,
    data: Data,
) -> String {
    let sk = skey(DB, key);
    let value = match data {
        Data::BadChunk => {
            bump(&STATS.cmd_set);
            return BAD_CHUNK.into();
        }
        data => {
            let v = match data {
                Data::Bytes(v) => Some(v),
                _ => None,
            };
            let vlen = v.as_ref().map(|v| v.len());
            match admit_store(ctx, item_max, key, flags, vlen, mode == StoreMode::Set) {
                Ok(true) => v.unwrap_or_default(),
                Ok(false) => return TOO_LARGE.into(),
                Err(e) => return store_error(e),
            }
        }
    };
    bump(&STATS.cmd_set);
    let r = cmd::locked(ctx, &[&sk], |ctx| {
        let found = look(ctx, &sk)?;
        let expire = Exp::from(exptime, ctx.now).expire();
        let stored = |ctx: &mut Ctx, other: bool| -> Result<&'static str, CmdError> {
            put(ctx, &sk, expire, &fresh(ctx, flags, 0), &value, other)?;
            bump(&STATS.total_items);
            Ok("STORED")
        };
        match (mode, found) {
            (StoreMode::Set, f) => stored(ctx, matches!(f, Look::Other)),
            (StoreMode::Add, Look::Miss) => stored(ctx, false),
            (StoreMode::Add, _) => Ok("NOT_STORED"),
            (StoreMode::Replace, Look::Hit(..)) => stored(ctx, false),
            (StoreMode::Append | StoreMode::Prepend, Look::Hit(old_exp, m, old)) => {
                let mut v = Vec::with_capacity(old.len() + value.len());
                if mode == StoreMode::Append {
                    v.extend_from_slice(&old);
                    v.extend_from_slice(&value);
                } else {
                    v.extend_from_slice(&value);
                    v.extend_from_slice(&old);
                }
                if !fits(item_max, key, m.flags, v.len()) {
                    return Ok("NOT_STORED");
                }
                put(ctx, &sk, old_exp, &fresh(ctx, m.flags, 0), &v, false)?;
                bump(&STATS.total_items);
                Ok("STORED")
            }
            (StoreMode::Cas, Look::Hit(_, m, _)) => {
                if cas != 0 && cas == m.cas {
                    bump(&STATS.cas_hits);
                    stored(ctx, false)
                } else {
                    bump(&STATS.cas_badval);
                    Ok("EXISTS")
                }
            }
            (StoreMode::Cas, _) => {
                bump(&STATS.cas_misses);
                Ok("NOT_FOUND")
            }
            (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, _) => Ok("NOT_STORED"),
        }
    });
    match r {
        Ok(s) => s.into(),
        Err(e) => store_error(e),
    }
}

/// An increment's outcome.
enum Arith {
    /// Done: the new number's digits, the item's CAS, its expiry, and
    /// whether the number fit in the old value (changed in place).
    Done {
        digits: String,
        cas: u64,
        expire: Option<i64>,
        in_place: bool,
    },
    Missing,
    NonNumeric,
    CasMismatch,
}

/// incr/decr (stripe lock held): memcached's `do_add_delta`. A number that
/// fits in the old value's length is written over it, padded with spaces
/// (memcached changes items in place so); a longer one makes a new value.
fn arith(
    ctx: &mut Ctx,
    sk: &[u8],
    incr: bool,
    delta: u64,
    cas_check: Option<u64>,
) -> Result<Arith, CmdError> {
    let Look::Hit(expire, mut m, v) = look(ctx, sk)? else {
        return Ok(Arith::Missing);
    };
    if v.is_empty() {
        return Ok(Arith::NonNumeric);
    }
    if let Some(want) = cas_check.filter(|&c| c != 0) {
        if want != m.cas {
            return Ok(Arith::CasMismatch);
        }
    }
    // The value as a C string.
    let text = v.split(|&b| b == 0).next().unwrap_or_default();
    let Some(n) = safe_strtoull(text) else {
        return Ok(Arith::NonNumeric);
    };
    let n = if incr {
        n.wrapping_add(delta)
    } else {
        n.saturating_sub(delta)
    };
    let digits = n.to_string();
    let mut nv = digits.clone().into_bytes();
    let in_place = nv.len() <= v.len();
    if in_place {
        nv.resize(v.len(), b' ');
    } else {
        m.bits = 0;
    }
    m.cas = item::next_cas();
    put(ctx, sk, expire, &m, &nv, false)?;
    Ok(Arith::Done {
        digits,
        cas: m.cas,
        expire,
        in_place,
    })
}

/// Appends ` k<key>` (base64 and ` b` for a binary key).
fn echo_key(p: &mut Vec<u8>, key: &[u8], binary: bool) {
    p.extend_from_slice(b" k");
    if binary {
        p.extend_from_slice(encode_key(key).as_bytes());
        p.extend_from_slice(b" b");
    } else {
        p.extend_from_slice(key);
    }
}

/// Appends the `O` and `k` flags of `f` in request order (replies without
/// an item).
fn echo_opaque_key(p: &mut Vec<u8>, f: &MetaFlags, key: &[u8]) {
    for t in &f.tokens {
        match t[0] {
            b'O' => {
                p.push(b' ');
                p.extend_from_slice(t);
            }
            b'k' => echo_key(p, key, f.base64),
            _ => {}
        }
    }
}

/// Whether an `O` flag is longer than memcached echoes.
fn long_opaque(f: &MetaFlags) -> bool {
    f.tokens
        .iter()
        .any(|t| t[0] == b'O' && t.len() > proto::memcache::MAX_OPAQUE_LEN)
}

/// mg.
fn meta_get(ctx: &mut Ctx, c: &mut Client, key: &[u8], f: &MetaFlags) {
    let sk = skey(DB, key);
    let r = cmd::locked(ctx, &[&sk], |ctx| {
        let mut created = false;
        let (mut expire, mut m, v, other) = match look(ctx, &sk)? {
            Look::Hit(e, m, v) => (e, m, v, false),
            found => {
                let Some(n) = f.vivify else {
                    return Ok(None);
                };
                created = true;
                let _ = n;
                let bits = if f.base64 { KEY_BINARY } else { 0 };
                (
                    None,
                    fresh(ctx, 0, bits),
                    Vec::new(),
                    matches!(found, Look::Other),
                )
            }
        };
        let shown = m;
        let mut p = meta_head(f.value, v.len());
        let mut changed = created;
        let mut won = false;
        let mut ttl_set = false;
        let mut long_opaque = false;
        for t in &f.tokens {
            match t[0] {
                b'O' if t.len() > proto::memcache::MAX_OPAQUE_LEN => {
                    long_opaque = true;
                    break;
                }
                b'T' => {
                    ttl_set = true;
                    changed = true;
                    expire = Exp::from(f.ttl.unwrap_or(0), ctx.now).expire();
                }
                b'N' if created => {
                    expire = Exp::from(f.vivify.unwrap_or(0), ctx.now).expire();
                    won = true;
                }
                b'R' => {
                    let recache = Exp::from(f.recache.unwrap_or(0), ctx.now);
                    if m.bits & TOKEN_SENT == 0 && !created {
                        if let (Some(e), Some(r)) = (expire, recache.expire()) {
                            if recache != Exp::Never && item::secs_ceil(e) < item::secs_ceil(r) {
                                won = true;
                            }
                        }
                    }
                }
                b's' => {
                    p.extend_from_slice(b" s");
                    p.extend_from_slice(v.len().to_string().as_bytes());
                }
                b't' => {
                    p.extend_from_slice(b" t");
                    p.extend_from_slice(item::ttl_left(expire, ctx.now).as_bytes());
                }
                b'c' => {
                    p.extend_from_slice(b" c");
                    p.extend_from_slice(m.cas.to_string().as_bytes());
                }
                b'f' => {
                    p.extend_from_slice(b" f");
                    p.extend_from_slice(m.flags.to_string().as_bytes());
                }
                b'l' => {
                    p.extend_from_slice(b" l");
                    let la = if shown.atime == 0 {
                        0
                    } else {
                        now_s(ctx).saturating_sub(shown.atime)
                    };
                    p.extend_from_slice(la.to_string().as_bytes());
                }
                b'h' => {
                    p.extend_from_slice(if shown.bits & FETCHED != 0 {
                        b" h1"
                    } else {
                        b" h0"
                    });
                }
                b'O' => {
                    p.push(b' ');
                    p.extend_from_slice(t);
                }
                b'k' => echo_key(&mut p, key, m.bits & KEY_BINARY != 0),
                _ => {}
            }
        }
        if long_opaque {
            // memcached stops there: what the flags before it changed
            // stays, and a fetch without the flags that lock the item
            // recorded the access.
            let locks = f
                .tokens
                .iter()
                .any(|t| matches!(t[0], b'T' | b'N' | b'R' | b'l' | b'h'));
            let access = !locks && !f.no_update && needs_bump(ctx, &m);
            if changed {
                if access {
                    m.bits |= FETCHED;
                    m.atime = now_s(ctx);
                }
                put(ctx, &sk, expire, &m, &v, other)?;
            }
            let later = (access && !changed).then_some(m.cas);
            return Ok(Some((Vec::new(), ttl_set, true, later)));
        }
        if m.bits & TOKEN_SENT != 0 {
            p.extend_from_slice(b" Z");
        }
        if m.bits & STALE != 0 {
            p.extend_from_slice(b" X");
            if m.bits & TOKEN_SENT == 0 {
                won = true;
            }
        }
        if won {
            p.extend_from_slice(b" W");
            m.bits |= TOKEN_SENT;
            changed = true;
        }
        p.extend_from_slice(b"\r\n");
        if f.value {
            p.extend_from_slice(&v);
            p.extend_from_slice(b"\r\n");
        }
        // The access is recorded with the item's other changes, or on its
        // own after the reply is built (a read must not fail for want of
        // room).
        let access = !f.no_update && needs_bump(ctx, &m);
        if changed {
            if access {
                m.bits |= FETCHED;
                m.atime = now_s(ctx);
            }
            put(ctx, &sk, expire, &m, &v, other)?;
            if created {
                bump(&STATS.total_items);
            }
        }
        let later = (access && !changed).then_some(m.cas);
        Ok(Some((p, ttl_set, false, later)))
    });
    if let Ok(Some((.., Some(cas)))) = &r {
        record_access(ctx, &sk, *cas);
    }
    match r {
        Ok(Some((_, _, true, _))) => line(c, false, "CLIENT_ERROR opaque token too long"),
        Ok(Some((p, ttl_set, ..))) => {
            if ttl_set {
                bump(&STATS.cmd_touch);
                bump(&STATS.touch_hits);
            } else {
                bump(&STATS.cmd_get);
                bump(&STATS.get_hits);
            }
            c.out.extend_from_slice(&p);
        }
        Ok(None) => {
            if f.ttl.is_some() {
                bump(&STATS.cmd_touch);
                bump(&STATS.touch_misses);
            } else {
                bump(&STATS.cmd_get);
                bump(&STATS.get_misses);
            }
            if long_opaque(f) {
                line(c, false, "CLIENT_ERROR opaque token too long");
            } else if !f.quiet {
                let mut p = b"EN".to_vec();
                echo_opaque_key(&mut p, f, key);
                p.extend_from_slice(b"\r\n");
                c.out.extend_from_slice(&p);
            }
        }
        Err(e) => line(c, false, &store_error(e)),
    }
}

/// ms.
fn meta_set(ctx: &mut Ctx, c: &mut Client, item_max: u64, key: &[u8], f: &MetaFlags, data: Data) {
    let sk = skey(DB, key);
    let value = match data {
        Data::BadChunk => {
            bump(&STATS.cmd_set);
            return line(c, false, BAD_CHUNK);
        }
        data => {
            let v = match data {
                Data::Bytes(v) => Some(v),
                _ => None,
            };
            let vlen = v.as_ref().map(|v| v.len());
            // Whatever the mode, as memcached's ms does.
            match admit_store(ctx, item_max, key, f.client_flags, vlen, true) {
                Ok(true) => v.unwrap_or_default(),
                Ok(false) => return line(c, false, TOO_LARGE),
                Err(e) => return line(c, false, &store_error(e)),
            }
        }
    };
    bump(&STATS.cmd_set);
    let mut mode = match f.mode {
        Some(b'E') => StoreMode::Add,
        Some(b'A') => StoreMode::Append,
        Some(b'P') => StoreMode::Prepend,
        Some(b'R') => StoreMode::Replace,
        _ => StoreMode::Set,
    };
    if f.cas.is_some() && matches!(mode, StoreMode::Set | StoreMode::Replace) {
        mode = StoreMode::Cas;
    }
    let bits = if f.base64 { KEY_BINARY } else { 0 };
    let r = cmd::locked(ctx, &[&sk], |ctx| {
        let expire = Exp::from(f.ttl.unwrap_or(0), ctx.now).expire();
        let it_cas = f.cas.unwrap_or(0);
        let found = look(ctx, &sk)?;
        let store = |ctx: &mut Ctx, exp: Option<i64>, m: Meta, v: &[u8], other: bool| {
            put(ctx, &sk, exp, &m, v, other)?;
            bump(&STATS.total_items);
            Ok::<_, CmdError>(("HD", m.cas))
        };
        match found {
            Look::Hit(old_exp, old, old_v) => {
                #[derive(PartialEq)]
                enum Cas {
                    None,
                    Match,
                    Stale,
                    Bad,
                }
                let cr = if it_cas == 0 {
                    Cas::None
                } else if it_cas == old.cas {
                    Cas::Match
                } else if f.invalidate && it_cas < old.cas {
                    Cas::Stale
                } else {
                    Cas::Bad
                };
                match mode {
                    StoreMode::Add => Ok(("NS", 0)),
                    StoreMode::Cas => match cr {
                        Cas::Match => {
                            bump(&STATS.cas_hits);
                            store(ctx, expire, fresh(ctx, f.client_flags, bits), &value, false)
                        }
                        Cas::Stale => {
                            bump(&STATS.cas_hits);
                            let keep = old.bits & TOKEN_SENT;
                            let m = fresh(ctx, f.client_flags, bits | STALE | keep);
                            store(ctx, old_exp, m, &value, false)
                        }
                        _ => {
                            bump(&STATS.cas_badval);
                            Ok(("EX", 0))
                        }
                    },
                    StoreMode::Append | StoreMode::Prepend => {
                        if cr != Cas::None && cr != Cas::Match {
                            return Ok(("EX", 0));
                        }
                        let mut v = Vec::with_capacity(old_v.len() + value.len());
                        if mode == StoreMode::Append {
                            v.extend_from_slice(&old_v);
                            v.extend_from_slice(&value);
                        } else {
                            v.extend_from_slice(&value);
                            v.extend_from_slice(&old_v);
                        }
                        if !fits(item_max, key, old.flags, v.len()) {
                            return Ok(("NS", 0));
                        }
                        store(ctx, old_exp, fresh(ctx, old.flags, bits), &v, false)
                    }
                    StoreMode::Set | StoreMode::Replace => {
                        store(ctx, expire, fresh(ctx, f.client_flags, bits), &value, false)
                    }
                }
            }
            other => match mode {
                StoreMode::Set => store(
                    ctx,
                    expire,
                    fresh(ctx, f.client_flags, bits),
                    &value,
                    matches!(other, Look::Other),
                ),
                StoreMode::Add if matches!(other, Look::Miss) => {
                    store(ctx, expire, fresh(ctx, f.client_flags, bits), &value, false)
                }
                StoreMode::Cas => {
                    bump(&STATS.cas_misses);
                    Ok(("NF", 0))
                }
                _ => Ok(("NS", 0)),
            },
        }
    });
    let (status, cas) = match r {
        Ok(x) => x,
        Err(e) => return line(c, false, &store_error(e)),
    };
    if status == "HD" && f.quiet {
        return;
    }
    let mut p = status.as_bytes().to_vec();
    for t in &f.tokens {
        match t[0] {
            b'O' => {
                p.push(b' ');
                p.extend_from_slice(t);
            }
            b'k' => echo_key(&mut p, key, f.base64),
            b'c' => {
                p.extend_from_slice(b" c");
                p.extend_from_slice(cas.to_string().as_bytes());
            }
            _ => {}
        }
    }
    p.extend_from_slice(b"\r\n");
    c.out.extend_from_slice(&p);
}

/// md.
fn meta_delete(ctx: &mut Ctx, c: &mut Client, key: &[u8], f: &MetaFlags) {
    let sk = skey(DB, key);
    let r = cmd::locked(ctx, &[&sk], |ctx| {
        Ok(match look(ctx, &sk)? {
            Look::Miss => "NF",
            Look::Other => {
                ctx.ks.delete(&sk, ctx.now)?;
                "HD"
            }
            Look::Hit(expire, mut m, v) => {
                if f.cas.is_some_and(|want| want != m.cas) {
                    "EX"
                } else if f.invalidate {
                    let expire = match f.ttl {
                        Some(t) => Exp::from(t, ctx.now).expire(),
                        None => expire,
                    };
                    m.bits = (m.bits | STALE) & !TOKEN_SENT;
                    m.cas = item::next_cas();
                    put(ctx, &sk, expire, &m, &v, false)?;
                    "HD"
                } else {
                    ctx.ks.delete(&sk, ctx.now)?;
                    "HD"
                }
            }
        })
    });
    let status = match r {
        Ok(s) => s,
        Err(e) => return line(c, false, &store_error(e)),
    };
    match status {
        "HD" if f.invalidate => {}
        "HD" => bump(&STATS.delete_hits),
        _ => bump(&STATS.delete_misses),
    }
    if status == "HD" && f.quiet {
        return;
    }
    let mut p = status.as_bytes().to_vec();
    echo_opaque_key(&mut p, f, key);
    p.extend_from_slice(b"\r\n");
    c.out.extend_from_slice(&p);
}

/// ma.
fn meta_arith(ctx: &mut Ctx, c: &mut Client, key: &[u8], f: &MetaFlags) {
    let sk = skey(DB, key);
    let incr = !matches!(f.mode, Some(b'D' | b'-'));
    let delta = if f.has(b'D') { f.delta } else { 1 };
    let r = cmd::locked(ctx, &[&sk], |ctx| {
        let mut created = false;
        // memcached's `T` and `N` change the item it incremented in place or
        // created; a number that outgrew its value went to a new item, and
        // the new TTL to the old one, which is dropped.
        let (digits, cas, mut expire, ttl_lands) = match arith(ctx, &sk, incr, delta, f.cas)? {
            Arith::Done {
                digits,
                cas,
                expire,
                in_place,
            } => (digits, cas, expire, in_place),
            Arith::Missing if f.vivify.is_some() => {
                let digits = f.initial.to_string();
                let m = fresh(ctx, 0, 0);
                put(ctx, &sk, None, &m, digits.as_bytes(), false)?;
                bump(&STATS.total_items);
                created = true;
                (digits, m.cas, None, true)
            }
            Arith::Missing => return Ok(Err("NF")),
            Arith::CasMismatch => return Ok(Err("EX")),
            Arith::NonNumeric => {
                return Ok(Err(
                    "CLIENT_ERROR cannot increment or decrement non-numeric value",
                ))
            }
        };
        let mut p = meta_head(f.value, digits.len());
        let mut new_exp = false;
        let mut long = false;
        for t in &f.tokens {
            match t[0] {
                b'O' if t.len() > proto::memcache::MAX_OPAQUE_LEN => {
                    long = true;
                    break;
                }
                b'c' => {
                    p.extend_from_slice(b" c");
                    p.extend_from_slice(cas.to_string().as_bytes());
                }
                b't' => {
                    p.extend_from_slice(b" t");
                    p.extend_from_slice(item::ttl_left(expire, ctx.now).as_bytes());
                }
                b'T' => {
                    expire = Exp::from(f.ttl.unwrap_or(0), ctx.now).expire();
                    new_exp = true;
                }
                b'N' if created => {
                    expire = Exp::from(f.vivify.unwrap_or(0), ctx.now).expire();
                    new_exp = true;
                }
                b'O' => {
                    p.push(b' ');
                    p.extend_from_slice(t);
                }
                b'k' => echo_key(&mut p, key, f.base64),
                _ => {}
            }
        }
        if new_exp && ttl_lands {
            // The value just staged, with its new expiry.
            if let Look::Hit(_, m, v) = look(ctx, &sk)? {
                put(ctx, &sk, expire, &m, &v, false)?;
            }
        }
        if long {
            return Ok(Err("CLIENT_ERROR opaque token too long"));
        }
        if f.value {
            p.extend_from_slice(b"\r\n");
            p.extend_from_slice(digits.as_bytes());
        }
        p.extend_from_slice(b"\r\n");
        Ok(Ok((p, created)))
    });
    match r {
        Ok(Ok((p, created))) => {
            bump(if incr {
                &STATS.incr_hits
            } else {
                &STATS.decr_hits
            });
            // Quiet mode hides a success, not a vivified item.
            if !f.quiet || created {
                c.out.extend_from_slice(&p);
            }
        }
        Ok(Err(e)) if e.starts_with("CLIENT_ERROR") => line(c, false, e),
        Ok(Err(status)) if long_opaque(f) => {
            let _ = status;
            line(c, false, "CLIENT_ERROR opaque token too long");
        }
        Ok(Err(status)) => {
            if status == "NF" {
                bump(if incr {
                    &STATS.incr_misses
                } else {
                    &STATS.decr_misses
                });
            }
            let mut p = status.as_bytes().to_vec();
            echo_opaque_key(&mut p, f, key);
            p.extend_from_slice(b"\r\n");
            c.out.extend_from_slice(&p);
        }
        Err(e) => line(c, false, &arith_error(e)),
    }
}

/// stats [settings|items|slabs|sizes|reset].
/// Keys evicted (by either protocol's writes) since the start or the last
/// `stats reset`.
fn evictions(sh: &crate::server::Shared) -> u64 {
    crate::evict::evicted_total(sh).saturating_sub(STATS.evictions.load(Ordering::Relaxed))
}

fn stats(ctx: &mut Ctx, c: &mut Client, args: &[Vec<u8>]) {
    let mut o = String::new();
    let mut stat = |name: &str, v: &dyn std::fmt::Display| {
        o.push_str(&format!("STAT {name} {v}\r\n"));
    };
    // Finishes a recount in progress, as DBSIZE does.
    let curr_items = crate::counts::db_counts(ctx, DB).map_or(0, |(k, _)| k);
    let cfg = ctx.sh.cfg();
    let bytes = ctx.sh.store.heap().map_or(0, crate::info::heap_used);
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    match args.first().map(|a| a.as_slice()) {
        None => {
            let now = ctx.now / 1000;
            stat("pid", &std::process::id());
            stat("uptime", &ctx.sh.started.elapsed().as_secs());
            stat("time", &now);
            stat("version", &VERSION);
            stat("pointer_size", &64);
            stat("max_connections", &cfg.maxclients);
            stat(
                "curr_connections",
                &ctx.sh.connected.load(Ordering::Relaxed),
            );
            stat("total_connections", &l(&STATS.total_connections));
            stat(
                "rejected_connections",
                &ctx.sh.stats.rejected.load(Ordering::Relaxed),
            );
            stat("cmd_get", &l(&STATS.cmd_get));
            stat("cmd_set", &l(&STATS.cmd_set));
            stat("cmd_flush", &l(&STATS.cmd_flush));
            stat("cmd_touch", &l(&STATS.cmd_touch));
            stat("cmd_meta", &l(&STATS.cmd_meta));
            stat("get_hits", &l(&STATS.get_hits));
            stat("get_misses", &l(&STATS.get_misses));
            stat("delete_misses", &l(&STATS.delete_misses));
            stat("delete_hits", &l(&STATS.delete_hits));
            stat("incr_misses", &l(&STATS.incr_misses));
            stat("incr_hits", &l(&STATS.incr_hits));
            stat("decr_misses", &l(&STATS.decr_misses));
            stat("decr_hits", &l(&STATS.decr_hits));
            stat("cas_misses", &l(&STATS.cas_misses));
            stat("cas_hits", &l(&STATS.cas_hits));
            stat("cas_badval", &l(&STATS.cas_badval));
            stat("touch_hits", &l(&STATS.touch_hits));
            stat("touch_misses", &l(&STATS.touch_misses));
            stat("store_too_large", &l(&STATS.store_too_large));
            stat("store_no_memory", &l(&STATS.store_no_memory));
            stat("limit_maxbytes", &cfg.heap_max_size);
            stat("threads", &cfg.threads);
            stat("bytes", &bytes);
            stat("curr_items", &curr_items);
            stat("total_items", &l(&STATS.total_items));
            stat("evictions", &evictions(ctx.sh));
        }
        Some(b"settings") => {
            stat("maxbytes", &cfg.heap_max_size);
            stat("maxconns", &cfg.maxclients);
            stat("tcpport", &cfg.memcached_port);
            stat("udpport", &0);
            stat("evictions", &"on");
            stat("cas_enabled", &"yes");
            stat("num_threads", &cfg.threads);
            stat("item_size_max", &cfg.memcached_item_size_max);
            stat("flush_enabled", &"yes");
            stat("binding_protocol", &"ascii");
        }
        Some(b"items") => {
            if curr_items > 0 {
                stat("items:1:number", &curr_items);
                stat("items:1:evicted", &evictions(ctx.sh));
            }
        }
        Some(b"slabs") => {
            stat("active_slabs", &u64::from(curr_items > 0));
            stat("total_malloced", &bytes);
        }
        Some(b"sizes") => stat("sizes_status", &"disabled"),
        Some(b"reset") => {
            for a in [
                &STATS.cmd_get,
                &STATS.cmd_set,
                &STATS.cmd_flush,
                &STATS.cmd_touch,
                &STATS.cmd_meta,
                &STATS.get_hits,
                &STATS.get_misses,
                &STATS.delete_hits,
                &STATS.delete_misses,
                &STATS.incr_hits,
                &STATS.incr_misses,
                &STATS.decr_hits,
                &STATS.decr_misses,
                &STATS.cas_hits,
                &STATS.cas_misses,
                &STATS.cas_badval,
                &STATS.touch_hits,
                &STATS.touch_misses,
                &STATS.store_too_large,
                &STATS.store_no_memory,
                &STATS.total_items,
                &STATS.total_connections,
            ] {
                a.store(0, Ordering::Relaxed);
            }
            STATS
                .evictions
                .store(crate::evict::evicted_total(ctx.sh), Ordering::Relaxed);
            drop(cfg);
            return line(c, false, "RESET");
        }
        Some(b"detail" | b"cachedump" | b"conns" | b"extstore" | b"proxy") => {
            drop(cfg);
            return line(
                c,
                false,
                "CLIENT_ERROR this stats group is not supported by Ember",
            );
        }
        Some(_) => {
            drop(cfg);
            return line(c, false, "ERROR");
        }
    }
    drop(cfg);
    c.out.extend_from_slice(o.as_bytes());
    c.out.extend_from_slice(b"END\r\n");
}
