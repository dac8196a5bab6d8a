//! One connection's state. [`Client`] is owned by the worker serving the
//! connection (`worker`), which reads into it and writes out of it; command
//! handlers (`cmd`) reply through its helpers. [`ClientMeta`] is the part
//! other threads read (CLIENT LIST, INFO clients), listed in
//! `Shared::clients`.

use crate::accept::is_loopback;
use crate::acl::{Acl, User};
use crate::clock::Stamp;
use crate::tls::Conn;
use proto::reply::put;
use proto::{Reply, RespCodec, Version};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A client as other threads see it (CLIENT LIST, INFO clients).
pub struct ClientMeta {
    pub id: u64,
    pub addr: String,
    pub laddr: String,
    pub fd: i32,
    pub created: Stamp,
    pub name: Mutex<String>,
    pub lib_name: Mutex<String>,
    pub lib_ver: Mutex<String>,
    /// The ACL user the connection is logged in as (`default` until AUTH).
    pub user: Mutex<String>,
    pub db: AtomicU8,
    pub resp: AtomicU8,
    /// Milliseconds since `created` of the last command.
    pub last_ms: AtomicU64,
    /// The last command's ACL id, a subcommand's for a container (+1; 0 =
    /// none; see `acl::resolve`).
    pub last_cmd: AtomicU64,
    /// Blocked in a blocking command (CLIENT LIST flag `b`).
    pub blocked: AtomicBool,
    /// In MULTI: 1 + the commands queued (CLIENT LIST flag `x`, `multi=`);
    /// 0 outside a transaction.
    pub multi: AtomicU64,
    /// Channel, pattern and shard-channel subscriptions (CLIENT LIST `sub`,
    /// `psub`, `ssub`; any makes it a `pubsub` client, flag `P`).
    pub sub: AtomicU32,
    pub psub: AtomicU32,
    pub ssub: AtomicU32,
    /// CLIENT KILL closed it: its worker drops it (see `Shared::kill_epoch`).
    pub killed: AtomicBool,
    /// Client-side caching (CLIENT TRACKING), and where it is served.
    pub track: crate::tracking::ClientTrack,
}

impl ClientMeta {
    /// A new connection's metadata, stamped now.
    pub(crate) fn new(id: u64, addr: String, laddr: String, fd: i32) -> ClientMeta {
        ClientMeta {
            id,
            addr,
            laddr,
            fd,
            created: Stamp::now(),
            name: Mutex::new(String::new()),
            lib_name: Mutex::new(String::new()),
            lib_ver: Mutex::new(String::new()),
            user: Mutex::new("default".into()),
            db: AtomicU8::new(0),
            resp: AtomicU8::new(2),
            last_ms: AtomicU64::new(0),
            last_cmd: AtomicU64::new(0),
            blocked: AtomicBool::new(false),
            multi: AtomicU64::new(0),
            sub: AtomicU32::new(0),
            psub: AtomicU32::new(0),
            ssub: AtomicU32::new(0),
            killed: AtomicBool::new(false),
            track: Default::default(),
        }
    }
}

impl ClientMeta {
    /// Subscribed to something (Redis's `CLIENT_PUBSUB`).
    pub fn is_pubsub(&self) -> bool {
        self.sub.load(Ordering::Relaxed) > 0
            || self.psub.load(Ordering::Relaxed) > 0
            || self.ssub.load(Ordering::Relaxed) > 0
    }

    /// The client connected from a loopback address (Redis's `connIsLocal`).
    pub fn is_local(&self) -> bool {
        self.addr
            .parse::<SocketAddr>()
            .is_ok_and(|a| is_loopback(a.ip()))
    }

    /// One line of CLIENT LIST / CLIENT INFO (Redis's field order).
    pub fn line(&self) -> String {
        let age_ms = Stamp::now().millis_since(self.created);
        let idle = age_ms.saturating_sub(self.last_ms.load(Ordering::Relaxed)) / 1000;
        let cmd = match self.last_cmd.load(Ordering::Relaxed) {
            0 => "NULL".to_string(),
            i => crate::acl::cmd_name(i as usize - 1).to_string(),
        };
        let multi = self.multi.load(Ordering::Relaxed) as i64 - 1;
        let mut flags = String::new();
        if self.is_pubsub() {
            flags.push('P');
        }
        if multi >= 0 {
            flags.push('x');
        }
        if self.blocked.load(Ordering::Relaxed) {
            flags.push('b');
        }
        self.track.flag_chars(&mut flags);
        if flags.is_empty() {
            flags.push('N');
        }
        format!(
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db={} sub={} psub={} ssub={} multi={} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} user={} redir={} resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            self.name.lock().unwrap_or_else(|p| p.into_inner()),
            age_ms / 1000,
            idle,
            flags,
            self.db.load(Ordering::Relaxed),
            self.sub.load(Ordering::Relaxed),
            self.psub.load(Ordering::Relaxed),
            self.ssub.load(Ordering::Relaxed),
            multi,
            cmd,
            self.user.lock().unwrap_or_else(|p| p.into_inner()),
            self.track.redir_field(),
            self.resp.load(Ordering::Relaxed),
            self.lib_name.lock().unwrap_or_else(|p| p.into_inner()),
            self.lib_ver.lock().unwrap_or_else(|p| p.into_inner()),
        )
    }
}

/// One connection, owned by its worker.
pub struct Client {
    pub id: u64,
    pub(crate) sock: Conn,
    pub(crate) inbuf: Vec<u8>,
    pub(crate) inpos: usize,
    pub out: Vec<u8>,
    pub(crate) outpos: usize,
    /// Bytes dropped from the front of `out` so far: `out_base + i` is the
    /// absolute position of `out[i]` (see `commit`).
    pub(crate) out_base: u64,
    /// Output may be written up to this absolute position: replies past it
    /// wait for their batch's commit.
    pub(crate) ready_to: u64,
    pub db: u8,
    pub resp: Version,
    /// Logged in (AUTH, HELLO AUTH, or a new connection while the default
    /// user is on and nopass); see `Acl::auth_required`.
    pub authed: bool,
    /// The ACL user, as read at `acl_epoch` (re-read when the epoch moves).
    pub user: Arc<User>,
    pub acl_epoch: u64,
    /// Close once the output is written (QUIT, protocol error).
    pub close_after: bool,
    /// Close now, without writing (query buffer limit).
    pub(crate) kill: bool,
    /// The peer shut down its side: run what is buffered, answer, then close.
    pub(crate) eof: bool,
    /// An event said the peer shut down its side (or the socket failed): read
    /// on to the end of the stream, even after a short read.
    pub(crate) peer_closing: bool,
    /// Stopped at the output high water with input left; resumes (through
    /// `pending`) once a flush brings the output below it.
    pub(crate) stalled: bool,
    /// The connection's protocol: frames requests out of `inbuf`, keeping
    /// what it learnt of a request that has not fully arrived.
    pub(crate) codec: RespCodec,
    pub meta: Arc<ClientMeta>,
    pub(crate) last_active: Instant,
    pub(crate) want_write: bool,
    /// Since when the pending output has been above the soft
    /// `client-output-buffer-limit` (None: below it).
    pub(crate) obuf_soft_since: Option<Instant>,
    /// The worker and poll token serving the connection (None in the
    /// in-process executor, whose client may not block).
    pub(crate) home: Option<(usize, mio::Token)>,
    /// The blocking request it waits in; its input is not parsed meanwhile.
    pub(crate) blocked: Option<Box<crate::blocking::Blocked>>,
    /// How many times it blocked (numbers its waits, see `blocking`).
    pub(crate) block_seq: u64,
    /// Its Pub/Sub subscriptions (None while it has none; see `pubsub`).
    pub(crate) subs: Option<Box<crate::pubsub::Subs>>,
    /// In MULTI: the queued transaction (see `cmd::multi`).
    pub multi: Option<Multi>,
    /// Keys it WATCHes.
    pub watching: crate::watch::Watching,
    /// Blocking commands answer at once (inside EXEC or a script).
    pub deny_blocking: bool,
    /// A connection of the memcached port: its codec and state (see
    /// `memcache`); None for Redis's protocol.
    pub(crate) mc: Option<Box<crate::memcache::McConn>>,
    /// In MONITOR mode (see `pubsub::Pubsub::feed_monitors`).
    pub(crate) monitor: bool,
    /// CLIENT REPLY: OFF drops every reply; SKIP drops the next command's
    /// (armed when the SKIP itself ends: see `Client::after_request`).
    pub(crate) reply_off: bool,
    pub(crate) reply_skip_next: bool,
    pub(crate) reply_skip: bool,
    /// On a cluster's follower: its connection to the leader for the
    /// requests forwarded there, and READONLY (reads served here).
    pub(crate) fwd: Option<Box<crate::cluster::Forward>>,
    /// A blocking command forwarded to the leader whose reply has not come
    /// (see `cluster::forward_blocking`); its input waits meanwhile.
    pub(crate) fwd_wait: Option<Box<crate::cluster::FwdWait>>,
    pub(crate) readonly: bool,
    /// The Raft index of its last replicated write (WAIT counts the
    /// followers that have it).
    pub(crate) repl_index: u64,
}

/// A transaction being queued (MULTI until EXEC or DISCARD).
#[derive(Default)]
pub struct Multi {
    /// The queued requests.
    pub cmds: Vec<Vec<Vec<u8>>>,
    /// A request was refused while queueing: EXEC fails with EXECABORT.
    pub dirty: bool,
    /// Bytes of the queued arguments (bounded like the query buffer).
    pub bytes: usize,
}

impl Client {
    /// After a request whose output began at `mark`: CLIENT REPLY OFF or
    /// SKIP drops it (Pub/Sub messages are delivered apart and still go),
    /// and a SKIP takes effect for the next request.
    #[inline]
    pub(crate) fn after_request(&mut self, mark: usize) {
        if self.reply_off || self.reply_skip {
            self.out.truncate(mark);
        }
        self.reply_skip = std::mem::take(&mut self.reply_skip_next);
    }

    /// A new connection: nothing read or queued yet, RESP2, database 0, the
    /// default user (logged in when it is on and nopass, as Redis does).
    pub(crate) fn new(id: u64, sock: Conn, meta: Arc<ClientMeta>, acl: &Acl) -> Client {
        let acl_epoch = acl.epoch();
        let authed = acl.default_open();
        Client {
            id,
            sock,
            inbuf: Vec::new(),
            inpos: 0,
            out: Vec::new(),
            outpos: 0,
            out_base: 0,
            ready_to: 0,
            db: 0,
            resp: Version::Resp2,
            authed,
            user: acl.default_user(),
            acl_epoch,
            close_after: false,
            kill: false,
            eof: false,
            peer_closing: false,
            stalled: false,
            codec: RespCodec::default(),
            meta,
            last_active: Instant::now(),
            want_write: false,
            obuf_soft_since: None,
            home: None,
            blocked: None,
            block_seq: 0,
            multi: None,
            fwd: None,
            fwd_wait: None,
            readonly: false,
            repl_index: 0,
            watching: Default::default(),
            deny_blocking: false,
            monitor: false,
            reply_off: false,
            reply_skip_next: false,
            reply_skip: false,
            subs: None,
            mc: None,
        }
    }
}

impl Client {
    /// Logs the connection in as `user` (AUTH, HELLO AUTH) or, with `None`,
    /// back to the default user not logged in (RESET, a deleted user).
    pub fn set_user(&mut self, acl: &Acl, user: Option<Arc<User>>) {
        self.acl_epoch = acl.epoch();
        self.authed = user.is_some() || acl.default_open();
        self.user = user.unwrap_or_else(|| acl.default_user());
        *self.meta.user.lock().unwrap_or_else(|p| p.into_inner()) =
            String::from_utf8_lossy(&self.user.name).into_owned();
    }
}

impl Client {
    // The reply sink of a command: RESP in the connection's version, encoded
    // by `proto` (`Reply::encode`, and its `put` pieces on the hot path).
    pub fn reply(&mut self, r: &Reply) {
        r.encode(self.resp, &mut self.out);
    }
    pub fn ok(&mut self) {
        put::ok(&mut self.out);
    }
    pub fn simple(&mut self, s: &str) {
        self.reply(&Reply::Simple(s.into()));
    }
    pub fn err(&mut self, s: &str) {
        self.reply(&Reply::Error(s.into()));
    }
    pub fn int(&mut self, n: i64) {
        put::int(&mut self.out, n);
    }
    pub fn bulk(&mut self, b: &[u8]) {
        put::bulk(&mut self.out, b);
    }
    pub fn null(&mut self) {
        put::null(&mut self.out, self.resp);
    }
    pub fn array_header(&mut self, n: usize) {
        put::array_header(&mut self.out, n);
    }
}
