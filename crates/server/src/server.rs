//! The server's top: [`Shared`], what every thread shares, and [`run`],
//! which opens the store, starts the acceptor thread (`accept`), N worker
//! threads each running a mio event loop over its own connections with its
//! own store session (`worker`) and the helper threads, then shuts down
//! within `shutdown-worker-timeout` or ends the process. Re-exports the
//! types the command layer and tests reach through `server` ([`Client`]...).

use crate::accept::{accept_loop, set_backlog, ACCEPT_WAKER};
use crate::commit::Committer;
use crate::config::Config;
use crate::counts::KeyCounts;
use crate::keyspace::{Keyspace, Stripes};
use crate::stats::Stats;
use crate::store::{AnyStore, Startup};
use crate::worker::{Settings, Worker, READ_CHUNK, WAKER};
use mio::net::TcpListener;
use mio::{Poll, Waker};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub use crate::client::{Client, ClientMeta};
pub use crate::cmd::dump::Put;
pub use crate::embedded::Embedded;
pub use crate::rlimit::raise_nofile_limit;

/// What every thread shares.
pub struct Shared {
    pub cfg: RwLock<Config>,
    /// Bumped by CONFIG SET so workers reload their cached settings.
    pub cfg_epoch: AtomicU64,
    pub store: AnyStore,
    pub startup: Startup,
    /// Keys per database (DBSIZE, INFO keyspace), kept by every write.
    pub counts: Arc<KeyCounts>,
    /// Whether any collection in the store has pieces (read from
    /// [`crate::coll::PIECED_KEY`] at start, set by the first one made): while
    /// false, a blind overwrite (SET) need not read the key it replaces.
    pub pieced: AtomicBool,
    /// The TTL index and the lazy free (see [`crate::housekeep`]).
    pub hk: Arc<crate::housekeep::Housekeeping>,
    pub stripes: Stripes,
    /// Set by [`Shared::begin_shutdown`] (SHUTDOWN, SIGTERM, SIGINT, a fatal
    /// error); every loop checks it.
    pub shutdown: AtomicBool,
    /// The wakers of every poll loop (workers and acceptor): shutdown wakes
    /// them instead of waiting for their poll timeouts.
    pub wakers: Mutex<Vec<Arc<Waker>>>,
    pub clients: Mutex<BTreeMap<u64, Arc<ClientMeta>>>,
    /// Bumped by CLIENT KILL after it marked connections `killed`: each
    /// worker then drops its marked ones.
    pub kill_epoch: AtomicU64,
    pub slowlog: crate::slowlog::Slowlog,
    /// CLIENT PAUSE.
    pub pause: crate::pause::Pause,
    /// The latency monitor (LATENCY).
    pub latency: crate::latency::Latency,
    /// Clients blocked in BLPOP and the like, by key (see [`crate::blocking`]).
    pub blocking: crate::blocking::Blocking,
    /// Keys clients WATCH (see [`crate::watch`]).
    pub watches: Arc<crate::watch::Watches>,
    /// Client-side caching: the tracking table (see [`crate::tracking`]).
    pub tracking: Arc<crate::tracking::Tracking>,
    /// ACL users and ACL LOG (see [`crate::acl`]).
    pub acl: crate::acl::Acl,
    /// Scripts, function libraries and the running script (see
    /// [`crate::lua`]).
    pub scripting: crate::lua::Scripting,
    /// Pub/Sub subscriptions and message delivery (see [`crate::pubsub`]).
    pub pubsub: crate::pubsub::Pubsub,
    /// maxmemory and eviction (see [`crate::evict`]).
    pub evict: crate::evict::Evictor,
    pub next_client_id: AtomicU64,
    pub connected: AtomicU64,
    pub stats: Stats,
    pub started: Instant,
    pub run_id: String,
    pub tcp_port: u16,
    /// This node's replication, in a cluster (set once at start, before the
    /// workers; see [`crate::cluster`]).
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
}

impl Shared {
    /// The state of a run on `store` with `workers` workers: loads the key
    /// counts (those saved at the last clean shutdown, or a recount to be
    /// finished).
    pub fn new(
        cfg: Config,
        store: AnyStore,
        startup: Startup,
        workers: usize,
        tcp_port: u16,
    ) -> Result<Shared, String> {
        // One shard of key counts per worker, and one per apply thread of
        // a cluster node.
        let counts = crate::counts::load(&store, workers + cfg.raft_apply_lanes.max(1))
            .map_err(|e| format!("cannot read the key counts: {e}"))?;
        let pieced = crate::coll::has_pieced(&store)
            .map_err(|e| format!("cannot read the collections marker: {e}"))?;
        let acl = crate::acl::Acl::new(
            cfg.requirepass.as_deref(),
            &cfg.users,
            cfg.aclfile.as_deref(),
        )?;
        acl.set_log_max(cfg.acllog_max_len);
        // A start pass finds the keys with a TTL and the pending lazy frees
        // the store holds: needed unless it is known to hold neither.
        let ttls = (0..=u8::MAX).any(|db| counts.get(db).is_none_or(|(_, e)| e > 0));
        let hk = Arc::new(crate::housekeep::Housekeeping::new(pieced || ttls));
        let pubsub = crate::pubsub::Pubsub::new(workers, cfg.notify_keyspace_events);
        let slowlog = crate::slowlog::Slowlog::new(cfg.slowlog_slower_than, cfg.slowlog_max_len);
        let latency_threshold = cfg.latency_monitor_threshold;
        let evict = crate::evict::Evictor::new(&cfg, store.heap().map(|_| cfg.heap_max_size));
        evict.configure(&cfg, Some(&hk.access));
        let sh = Shared {
            cfg: RwLock::new(cfg),
            cfg_epoch: AtomicU64::new(0),
            store,
            startup,
            counts: Arc::new(counts),
            pieced: AtomicBool::new(pieced),
            hk,
            stripes: Stripes::new(4096),
            shutdown: AtomicBool::new(false),
            wakers: Mutex::new(Vec::new()),
            clients: Mutex::new(BTreeMap::new()),
            kill_epoch: AtomicU64::new(0),
            slowlog,
            pause: crate::pause::Pause::default(),
            latency: crate::latency::Latency::new(latency_threshold),
            blocking: crate::blocking::Blocking::new(workers),
            watches: Arc::default(),
            tracking: Arc::default(),
            acl,
            scripting: crate::lua::Scripting::default(),
            pubsub,
            evict,
            next_client_id: AtomicU64::new(1),
            connected: AtomicU64::new(0),
            stats: Stats::new(workers),
            started: Instant::now(),
            run_id: run_id(),
            tcp_port,
            cluster: std::sync::OnceLock::new(),
        };
        crate::cmd::finish_swap(&sh).map_err(|e| format!("cannot finish a SWAPDB: {e:?}"))?;
        crate::cmd::finish_flushes(&sh).map_err(|e| format!("cannot finish a flush: {e:?}"))?;
        crate::lua::load_functions(&sh)
            .map_err(|e| format!("cannot load the function libraries: {e}"))?;
        Ok(sh)
    }

    pub fn cfg(&self) -> std::sync::RwLockReadGuard<'_, Config> {
        self.cfg.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a clean shutdown: every loop stops at its next check, and the
    /// poll loops are woken now.
    pub fn begin_shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
        for w in self.wakers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = w.wake();
        }
    }
}

/// Runs the server until SHUTDOWN, SIGTERM or SIGINT; returns after a clean
/// shutdown (the store closed, the heap marked clean). When a thread does not
/// stop within `shutdown-worker-timeout`, the process exits with status 1
/// instead (see `force_exit`).
pub fn run(cfg: Config) -> Result<(), String> {
    for (k, v) in &cfg.no_effect {
        eprintln!("ember: config '{k} {v}' accepted; it has no effect in Ember (the heap is always the image)");
    }
    let room = raise_nofile_limit(cfg.maxclients);
    if room < cfg.maxclients {
        eprintln!(
            "ember: the open file limit allows about {room} clients, fewer than maxclients {}; raise it (ulimit -n) to serve that many",
            cfg.maxclients
        );
    }
    // Port 0 serves no plain TCP (TLS only, as Redis's `port 0`); the
    // certificates are checked before anything listens or the heap opens.
    if cfg.port == 0 && cfg.tls_port == 0 && cfg.memcached_port == 0 {
        return Err(
            "configured to listen nowhere: port, tls-port and memcached-port are all 0".into(),
        );
    }
    let tls = if cfg.tls_port != 0 {
        Some(crate::tls::server_config(&cfg)?)
    } else {
        None
    };
    let mut listeners = Vec::new();
    let ports = [
        (cfg.port, None, false),
        (cfg.tls_port, tls, false),
        (cfg.memcached_port, None, true),
    ];
    for (port, tls, mc) in ports.iter().filter(|(p, _, _)| *p != 0) {
        for b in &cfg.bind {
            let ip: std::net::IpAddr = b
                .parse()
                .map_err(|_| format!("bind: '{b}' is not an IP address"))?;
            let addr = SocketAddr::new(ip, *port);
            let l = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            set_backlog(&l, cfg.tcp_backlog);
            listeners.push((l, tls.clone(), *mc));
        }
    }
    let tcp_port = cfg.port;
    let (store, startup) = crate::store::open(&cfg)?;
    let threads = cfg.threads;
    let metrics_port = cfg.metrics_port;
    let sh = Arc::new(Shared::new(cfg, store, startup, threads, tcp_port)?);
    let mut aux = Vec::new();
    {
        let term = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register(sig, term.clone()).map_err(|e| e.to_string())?;
        }
        let sh2 = sh.clone();
        aux.push(
            std::thread::Builder::new()
                .name("ember-signal".into())
                .spawn(move || {
                    while !term.load(Ordering::Acquire) && !sh2.shutdown.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    if term.load(Ordering::Acquire) {
                        eprintln!("ember: received SIGTERM/SIGINT: shutting down");
                    }
                    sh2.begin_shutdown();
                })
                .map_err(|e| e.to_string())?,
        );
    }
    if let Some(p) = metrics_port {
        aux.push(crate::metrics::spawn(sh.clone(), p)?);
    }
    if !sh.counts.ready() {
        let sh2 = sh.clone();
        aux.push(
            std::thread::Builder::new()
                .name("ember-keycount".into())
                .spawn(move || crate::counts::recount_thread(sh2))
                .map_err(|e| e.to_string())?,
        );
    }
    if let Some(c) = crate::cluster::start(&sh)? {
        let _ = sh.cluster.set(c);
    }
    let mut handles = Vec::new();
    let mut doors = Vec::new();
    for id in 0..threads {
        let poll = Poll::new().map_err(|e| e.to_string())?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(|e| e.to_string())?);
        sh.wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(waker.clone());
        sh.blocking.set_waker(id, waker.clone());
        sh.pubsub.set_waker(id, waker.clone());
        let (tx, rx) = channel();
        doors.push((tx, waker.clone()));
        let sh2 = sh.clone();
        let ws = sh.stats.workers[id].clone();
        let h = std::thread::Builder::new()
            .name(format!("ember-worker-{id}"))
            .spawn(move || {
                // A session stays on the thread that made it.
                let sess = match sh2.store.session() {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("ember: worker {id}: cannot open a store session: {e}");
                        sh2.begin_shutdown();
                        return;
                    }
                };
                let settings = Settings::load(&sh2);
                let pipeline_commits = sh2.cfg().commit_pipeline;
                let counts = sh2.counts.clone();
                let hk = sh2.hk.clone();
                let mut ks = Keyspace::new(sess, counts, id, hk);
                ks.set_watches(sh2.watches.clone());
                ks.set_repl(sh2.cluster.get().cloned());
                ks.track.set_registry(sh2.tracking.clone());
                Worker {
                    id,
                    sh: sh2,
                    poll,
                    rx,
                    clients: HashMap::new(),
                    next_token: 0,
                    ks,
                    ws,
                    settings,
                    expire_cursor: 0,
                    pending: Vec::new(),
                    rbuf: vec![0; READ_CHUNK],
                    args: proto::Args::default(),
                    pf_keys: Vec::new(),
                    committer: Committer::new(format!("ember-sync-{id}"), waker),
                    batch_requests: 0,
                    pipeline: pipeline_commits,
                    acl_epoch: 0,
                    block_timers: std::collections::BTreeSet::new(),
                    pump_woke: false,
                    kill_epoch: 0,
                    paused: Vec::new(),
                    fwd_waiting: Vec::new(),
                }
                .run()
            })
            .map_err(|e| e.to_string())?;
        handles.push(h);
    }
    {
        let c = sh.cfg();
        let st = &sh.startup;
        eprintln!(
            "ember: serving {} on {} port {}{} ({} workers): engine {}, durability {} ({}), heap {}; {} in {:.1} ms{}",
            if st.existed { "existing heap" } else { "new heap" },
            c.bind.join(" "),
            tcp_port,
            if c.tls_port != 0 {
                format!(
                    ", TLS port {} with tls-auth-clients {}",
                    c.tls_port,
                    c.tls_auth_clients.name()
                )
            } else {
                String::new()
            } + &if c.memcached_port != 0 {
                format!(", memcached port {}", c.memcached_port)
            } else {
                String::new()
            },
            threads,
            sh.store.name(),
            c.durability.name(),
            crate::info::strategy_note(&sh),
            c.heap.display(),
            if st.was_clean { "clean start" } else { "recovered after a crash" },
            st.open_ms,
            if st.log_records > 0 {
                format!(
                    ", {} log records read ({} bytes), {} replayed",
                    st.log_records, st.log_bytes, st.log_replayed
                )
            } else {
                String::new()
            }
        );
    }
    let accept_poll = Poll::new().map_err(|e| format!("acceptor: {e}"))?;
    sh.wakers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Arc::new(
            Waker::new(accept_poll.registry(), ACCEPT_WAKER)
                .map_err(|e| format!("acceptor: {e}"))?,
        ));
    let sh2 = sh.clone();
    let acceptor = std::thread::Builder::new()
        .name("ember-accept".into())
        .spawn(move || accept_loop(sh2, accept_poll, listeners, doors))
        .map_err(|e| e.to_string())?;
    let _ = acceptor.join();
    let threads: Vec<_> = handles.into_iter().chain(aux).collect();
    let wait = Duration::from_secs(sh.cfg().shutdown_worker_timeout);
    if !finish_within(&threads, wait) {
        force_exit(&threads, wait);
    }
    for h in threads {
        let _ = h.join();
    }
    let t = Instant::now();
    if let Err(e) = crate::counts::save(&sh.store, &sh.counts) {
        eprintln!("ember: could not save the key counts ({e}): the next start recounts them");
    }
    let r = sh.store.close().map_err(|e| e.to_string());
    eprintln!(
        "ember: shut down in {:.1} ms{}",
        t.elapsed().as_secs_f64() * 1e3,
        match &r {
            Ok(()) => String::new(),
            Err(e) => format!(" with an error: {e}"),
        }
    );
    // Every thread is joined: this is the last reference to the store, and
    // dropping the heap with it marks the heap clean.
    match Arc::try_unwrap(sh) {
        Ok(sh) => drop(sh),
        Err(_) => eprintln!("ember: the store is still referenced at exit; the next start recovers as after a crash"),
    }
    r
}

/// Waits up to `wait` for every thread to finish; true when they all did.
fn finish_within(threads: &[std::thread::JoinHandle<()>], wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        if threads.iter().all(|h| h.is_finished()) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Ends the process when a thread (a worker in a long command such as DEBUG
/// SLEEP, or waiting for the store) did not stop within
/// `shutdown-worker-timeout` of the shutdown. Nothing is closed: the store
/// stays as a crash would leave it, which recovery expects, and no step that
/// needs the stuck thread's session or locks is attempted. Every write
/// whose reply was sent is durable already (a reply leaves only after its
/// writes are, in either durability mode); the key counts are not saved, so
/// the next start recounts them, and it replays Bullet's logs as after a
/// crash.
fn force_exit(threads: &[std::thread::JoinHandle<()>], wait: Duration) -> ! {
    let stuck: Vec<&str> = threads
        .iter()
        .filter(|h| !h.is_finished())
        .map(|h| h.thread().name().unwrap_or("a thread"))
        .collect();
    eprintln!(
        "ember: {} still busy {} s after the shutdown began; exiting without a clean shutdown \
         (acknowledged writes are durable; the next start recovers the heap as after a crash)",
        stuck.join(", "),
        wait.as_secs()
    );
    std::process::exit(1)
}

pub(crate) fn run_id() -> String {
    use rand::RngExt;
    let mut rng = rand::rng();
    (0..40)
        .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
        .collect()
}
