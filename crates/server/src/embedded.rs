//! [`Embedded`]: the command layer in-process, without a network, for tests
//! that run the server's write paths under a crash simulator
//! (`tests/power_loss.rs`) and for `ember import` and `ember export`. It makes a worker's keyspace and a client as
//! `server::run` and a worker do, and executes requests as a worker's batch
//! does.

use crate::client::{Client, ClientMeta};
use crate::clock::Stamp;
use crate::cmd::{self, Ctx};
use crate::config::Config;
use crate::keyspace::Keyspace;
use crate::server::Shared;
use crate::stats::WorkerStats;
use crate::store::{AnyStore, Startup};
use mio::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The server's command layer in-process, without a network: one worker's
/// keyspace (its own store session and shard of the key counts) and one
/// client, over a store the caller opened. [`Embedded::exec`] runs a request
/// through [`cmd::execute`] as a worker's batch does, and [`Embedded::commit`]
/// commits as a worker does after a batch (in line, before any reply would be
/// written). For tests that run the server's write paths under a crash
/// simulator (a real process can only be killed, not watched), and for
/// `ember import`/`export` on a heap no server has open; not used by
/// `ember serve`.
#[doc(hidden)]
pub struct Embedded {
    // Declared first: the session is dropped before the store it belongs to.
    ks: Keyspace,
    client: Client,
    ws: Arc<WorkerStats>,
    sh: Arc<Shared>,
    clock: Stamp,
    /// The other end of the client's socket (nothing is ever sent on it).
    _peer: std::net::TcpStream,
}

impl Embedded {
    /// Starts on `store` as [`run`] does, for `workers` workers: loads the key
    /// counts (those saved at the last clean shutdown, or a recount to be
    /// finished, here by the first DBSIZE). Each worker is then made with
    /// [`Embedded::new`] on its own thread (a session stays on the thread that
    /// made it), and [`Embedded::shutdown`] ends the run once they are gone.
    ///
    /// [`run`]: crate::server::run
    pub fn start(
        cfg: Config,
        store: AnyStore,
        startup: Startup,
        workers: usize,
    ) -> Result<Arc<Shared>, String> {
        Ok(Arc::new(Shared::new(cfg, store, startup, workers, 0)?))
    }

    /// Worker `id` (below the `workers` given to [`Embedded::start`]) with one
    /// client, whose socket is a loopback connection that carries nothing (a
    /// [`Client`] owns one).
    pub fn new(sh: Arc<Shared>, id: usize) -> Result<Embedded, String> {
        let sess = sh.store.session().map_err(|e| e.to_string())?;
        let mut ks = Keyspace::new(sess, sh.counts.clone(), id, sh.hk.clone());
        ks.set_watches(sh.watches.clone());
        ks.notify = sh.pubsub.notify_flags().clone();
        let ws = sh.stats.workers[id].clone();
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        let sock = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
        let (peer, _) = l.accept().map_err(|e| e.to_string())?;
        sock.set_nonblocking(true).map_err(|e| e.to_string())?;
        let cid = sh.next_client_id.fetch_add(1, Ordering::Relaxed);
        let meta = Arc::new(ClientMeta::new(cid, addr.to_string(), addr.to_string(), -1));
        let client = Client::new(
            cid,
            crate::tls::Conn::Plain(TcpStream::from_std(sock)),
            meta,
            &sh.acl,
        );
        Ok(Embedded {
            ks,
            client,
            ws,
            sh,
            clock: Stamp::now(),
            _peer: peer,
        })
    }

    /// Runs one request (`args[0]` the command name) and returns its reply
    /// (RESP2), as a worker executes it within a batch: nothing is durable
    /// until [`Embedded::commit`].
    pub fn exec(&mut self, args: &[Vec<u8>]) -> Vec<u8> {
        let mut ctx = Ctx {
            sh: &self.sh,
            ks: &mut self.ks,
            ws: &self.ws,
            now: crate::keyspace::now_ms(),
        };
        cmd::execute(&mut ctx, &mut self.client, args, &mut self.clock);
        std::mem::take(&mut self.client.out)
    }

    /// Writes `v` at `key` of database `db` as `RESTORE key ttl payload
    /// ABSTTL [REPLACE]` does (`at`: the expiry time in ms, None for none),
    /// as one unit; nothing is durable until [`Embedded::commit`]. For
    /// `ember import`.
    pub fn put(
        &mut self,
        db: u8,
        key: &[u8],
        v: &crate::rdb::Value,
        at: Option<i64>,
        replace: bool,
    ) -> Result<cmd::dump::Put, String> {
        self.client.db = db;
        self.in_ctx(|ctx, c| cmd::dump::put(ctx, c, key, v, at, replace))
    }

    /// The value at `key` of database `db` and its expiry time in ms (None
    /// when absent), read as one unit. For `ember export`.
    pub fn get(
        &mut self,
        db: u8,
        key: &[u8],
    ) -> Result<Option<(crate::rdb::Value, Option<i64>)>, String> {
        self.client.db = db;
        self.in_ctx(|ctx, c| cmd::dump::get(ctx, c, key))
    }

    /// Runs `f` with a command context and the client, as a worker would
    /// run a command; anything it replies is dropped.
    fn in_ctx<T>(
        &mut self,
        f: impl FnOnce(&mut Ctx, &mut Client) -> Result<T, cmd::CmdError>,
    ) -> Result<T, String> {
        let mut ctx = Ctx {
            sh: &self.sh,
            ks: &mut self.ks,
            ws: &self.ws,
            now: crate::keyspace::now_ms(),
        };
        let r = f(&mut ctx, &mut self.client);
        self.client.out.clear();
        r.map_err(|e| e.text().into_owned())
    }

    /// The worker's in-line commit after a batch: once it returns, the
    /// batch's replies may be sent.
    pub fn commit(&mut self) -> engine::Result<()> {
        self.ks.sess.commit()
    }

    /// Runs the background work a worker's tick does in bounded steps, to
    /// its end: the start pass (keys with a TTL, pending lazy frees), an
    /// active-expiry cycle and the lazy free of every queued collection.
    pub fn run_background(&mut self) -> Result<(), String> {
        crate::housekeep::run_all(&self.sh, &mut self.ks).map_err(|e| format!("{e:?}"))
    }

    /// One batch of the lazy free (a collection queued since the start pass
    /// found it, or since its deletion, loses up to
    /// [`crate::housekeep::FREE_BATCH`] pieces).
    pub fn lazy_free_once(&mut self) -> Result<(), String> {
        let now = Some(std::time::Instant::now());
        crate::housekeep::lazy_free_step(&self.sh, &mut self.ks, now, std::time::Duration::ZERO)
            .map_err(|e| format!("{e:?}"))
    }

    pub fn shared(&self) -> &Shared {
        &self.sh
    }

    /// Clean shutdown as [`run`] ends it, once every worker is dropped: saves
    /// the key counts, closes the store; dropping the heap then marks it clean.
    ///
    /// [`run`]: crate::server::run
    pub fn shutdown(sh: Arc<Shared>) -> Result<(), String> {
        crate::counts::save(&sh.store, &sh.counts).map_err(|e| e.to_string())?;
        sh.store.close().map_err(|e| e.to_string())?;
        match Arc::try_unwrap(sh) {
            Ok(sh) => drop(sh),
            Err(_) => return Err("the store is still referenced".into()),
        }
        Ok(())
    }
}
