//! Configuration: `ember serve` flags, a redis.conf-syntax file, and the table of
//! parameters `CONFIG GET/SET` knows.
//!
//! Precedence: built-in defaults, then the file (`--config FILE`), then flags.
//! The file uses redis.conf syntax: one directive per line, arguments split as
//! Redis splits them (quotes and escapes), `#` comments. Directives Redis has
//! that only tune its own encodings, snapshots or AOF are accepted and have no
//! effect here (the heap is always the image); they are listed by
//! [`NO_EFFECT`], reported by `CONFIG GET` as set, and logged at startup.
//! Anything else unknown is refused, as Redis refuses it.

use clap::Args;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `ember serve` flags. Every flag overrides the same directive of `--config`.
#[derive(Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// A configuration file in redis.conf syntax (port, bind, requirepass,
    /// user, aclfile, maxclients, timeout, hz, protected-mode, databases, proto-max-bulk-len,
    /// client-query-buffer-limit, heap, heap-size, heap-max-size, engine,
    /// durability, commit-pipeline, threads, metrics-port, logs, log-size, log-backlog, frontend-max-keys, fence-ns,
    /// tcp-backlog, busy-poll-us, shutdown-worker-timeout,
    /// enable-debug-command, tls-port, tls-cert-file, tls-key-file,
    /// tls-ca-cert-file, tls-auth-clients, client-output-buffer-limit,
    /// maxmemory, maxmemory-policy, maxmemory-samples,
    /// maxmemory-eviction-tenacity, lfu-log-factor, lfu-decay-time,
    /// tracking-table-max-keys; Redis's
    /// snapshot/AOF/encoding directives are accepted and have no effect).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// TCP port (0: no plain TCP, for a server that serves TLS only)
    /// [default: 6379].
    #[arg(long)]
    pub port: Option<u16>,
    /// Addresses to listen on, space separated [default: 127.0.0.1].
    #[arg(long)]
    pub bind: Option<String>,
    /// Password clients must give with AUTH (or HELLO ... AUTH) [default: none].
    #[arg(long)]
    pub requirepass: Option<String>,
    /// The ACL file: users are loaded from it at startup and by ACL LOAD,
    /// and ACL SAVE writes them to it (not with `user` directives in the
    /// configuration file) [default: none].
    #[arg(long, value_name = "FILE")]
    pub aclfile: Option<PathBuf>,
    /// Most connected clients; more are refused with Redis's error [default: 10000].
    #[arg(long)]
    pub maxclients: Option<u64>,
    /// Close a client idle for this many seconds (0 = never) [default: 0].
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Background task frequency per second (active expiry) [default: 10].
    #[arg(long)]
    pub hz: Option<u64>,
    /// Without requirepass, serve only loopback clients (yes|no) [default: yes].
    #[arg(long, value_name = "yes|no")]
    pub protected_mode: Option<String>,
    /// Number of databases for SELECT (1..=255; store keys beginning with 255 are the pieces of large collections) [default: 16].
    #[arg(long)]
    pub databases: Option<u64>,
    /// Largest bulk argument accepted, e.g. 512mb [default: 512mb].
    #[arg(long)]
    pub proto_max_bulk_len: Option<String>,
    /// Largest pending request per client, e.g. 1gb [default: 1gb].
    #[arg(long)]
    pub client_query_buffer_limit: Option<String>,
    /// The heap file (created when absent) [default: ember.heap in the working
    /// directory].
    #[arg(long, value_name = "FILE")]
    pub heap: Option<PathBuf>,
    /// Size of a new heap, e.g. 1gb [default: 1gb].
    #[arg(long)]
    pub heap_size: Option<String>,
    /// The heap grows online (doubling) up to this size [default: 64gb].
    #[arg(long)]
    pub heap_max_size: Option<String>,
    /// Store engine: bullet (DRAM frontend + persistent logs + durable backend),
    /// bullet-st|bullet-lfr|bullet-opt|bullet-dyn (the paper's ablation variants),
    /// direct (durable hash table only), direct-phash, or volatile (DRAM only,
    /// NOT durable: for comparison) [default: bullet].
    #[arg(long)]
    pub engine: Option<String>,
    /// When a write is acknowledged: pmem (cache-line flush + fence into the
    /// mapping; on an ordinary file this survives SIGKILL, not an OS crash) or
    /// msync (power-safe on an ordinary file; one msync per batch of requests)
    /// [default: pmem].
    #[arg(long, value_name = "pmem|msync")]
    pub durability: Option<String>,
    /// msync mode: a batch of 64 requests or more commits on a syncer thread
    /// while the worker serves the next requests, whose replies wait for the
    /// commit after it (pipelined group commit). Pays off when the disk's
    /// flush is slow next to serving a batch; costs when background gleaning
    /// competes for the CPU (BENCHMARKS.md) [default: no].
    #[arg(long, value_name = "yes|no")]
    pub commit_pipeline: Option<String>,
    /// Worker threads serving clients [default: number of CPUs - 1, at least 1:
    /// one core is left to the store's background threads and the network stack;
    /// on a cluster node (--node-id) 16, as its workers mostly wait for their
    /// writes' quorum].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Serve Prometheus metrics on 127.0.0.1:PORT/metrics [default: off].
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// Bullet: number of persistent logs [default: 8].
    #[arg(long)]
    pub logs: Option<usize>,
    /// Bullet: size of each log, e.g. 32mb (a value must fit in one) [default: 32mb].
    #[arg(long)]
    pub log_size: Option<String>,
    /// Bullet: most bytes of log not yet applied to the heap's index, which a
    /// restart after a crash replays; writers wait for the gleaners beyond it
    /// (0: the logs' size) [default: 4mb with --durability pmem, 128mb with
    /// msync, whose gleaners apply about a tenth as fast].
    #[arg(long)]
    pub log_backlog: Option<String>,
    /// Bullet: most keys the DRAM frontend holds (Bullet's bounded frontend:
    /// past it, the least recently used entries leave DRAM and a miss reads
    /// the heap); 0 keeps a DRAM copy of every key [default: 0].
    #[arg(long)]
    pub frontend_max_keys: Option<u64>,
    /// Emulated extra latency per fence in ns (always reported in INFO) [default: 0].
    #[arg(long)]
    pub fence_ns: Option<u64>,
    /// After a batch of clients that each sent one or two requests (they wait
    /// for every reply), a worker polls its sockets without sleeping for up
    /// to this many microseconds before it blocks (0 = block at once): a
    /// request arriving meanwhile costs no wake-up. Never after pipelined
    /// batches or on an idle server [default: 50].
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
    /// Pending connections the kernel queues for accept (capped by
    /// net.core.somaxconn) [default: 511].
    #[arg(long)]
    pub tcp_backlog: Option<u32>,
    /// SHUTDOWN and SIGTERM wait this many seconds for the workers to finish
    /// the commands they are running; then the process exits without the
    /// clean shutdown steps (every acknowledged write is already durable; the
    /// next start recovers the heap as after a crash) [default: 5].
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_worker_timeout: Option<u64>,
    /// Allow the DEBUG command (Redis's enable-debug-command): no, yes, or
    /// local (loopback clients only) [default: no].
    #[arg(long, value_name = "no|yes|local")]
    pub enable_debug_command: Option<String>,
    /// Serve TLS on this port too (0 = no TLS; with --port 0, TLS only)
    /// [default: 0].
    #[arg(long)]
    pub tls_port: Option<u16>,
    /// The server's certificate chain (PEM) for TLS.
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<String>,
    /// The private key (PEM) of tls-cert-file.
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<String>,
    /// CA certificates (PEM) that client certificates are verified against.
    #[arg(long, value_name = "FILE")]
    pub tls_ca_cert_file: Option<String>,
    /// Client certificates over TLS: yes (required and verified against
    /// tls-ca-cert-file), optional (verified when presented), no (not
    /// asked for) [default: yes].
    #[arg(long, value_name = "yes|no|optional")]
    pub tls_auth_clients: Option<String>,
    /// Serve memcached's text and meta protocol on this port too, on the
    /// same keyspace (database 0) (0 = off) [default: 0].
    #[arg(long)]
    pub memcached_port: Option<u16>,
    /// The largest memcached item (memcached's -I), e.g. 1m [default: 1m].
    #[arg(long, value_name = "BYTES")]
    pub memcached_item_size_max: Option<String>,
    /// This node's id in a replicated cluster (with --raft-port and
    /// --peers; 0 = not replicated) [default: 0].
    #[arg(long, value_name = "N")]
    pub node_id: Option<u64>,
    /// The port of this node's Raft transport [default: the port in its
    /// --peers entry].
    #[arg(long, value_name = "PORT")]
    pub raft_port: Option<u16>,
    /// Every member of the cluster, this node included:
    /// ID=HOST:RAFTPORT:PORT,ID=HOST:RAFTPORT:PORT,...
    #[arg(long, value_name = "LIST")]
    pub peers: Option<String>,
    /// The Raft tick in milliseconds; heartbeats go every 2 ticks and the
    /// election timeout is raft-election-ticks [default: 5].
    #[arg(long, value_name = "MS")]
    pub raft_tick_ms: Option<u64>,
    /// Ticks without a leader's heartbeat before a follower stands for
    /// election (randomised up to twice this) [default: 10].
    #[arg(long, value_name = "N")]
    pub raft_election_ticks: Option<u64>,
    /// Join a running cluster: a new heap starts with no configuration and
    /// waits for the leader's snapshot (add the node with `RAFT ADD` at any
    /// member) instead of bootstrapping a cluster of the --peers
    /// [default: no].
    #[arg(long, value_name = "yes|no", num_args = 0..=1, default_missing_value = "yes")]
    pub join: Option<String>,
    /// Applied Raft entries kept for members that fall behind; a member
    /// further behind is sent a snapshot [default: 10000].
    #[arg(long, value_name = "N")]
    pub raft_log_keep: Option<u64>,
    /// Threads applying committed entries: entries on different keys are
    /// applied in parallel (Blizzard's commutativity), those that share a
    /// key or touch several keys in log order; 1 = one thread, every entry
    /// in log order [default: 1].
    #[arg(long, value_name = "N")]
    pub raft_apply_lanes: Option<u64>,
    /// Bytes per chunk in which a snapshot's data is served to a member
    /// that fetches it (256mb at most) [default: 4mb].
    #[arg(long, value_name = "BYTES")]
    pub raft_snapshot_chunk: Option<String>,
    /// Output a client may have pending: "<class> <hard> <soft> <seconds>"
    /// for class normal, replica or pubsub, as Redis's directive; a client
    /// above the hard limit, or above the soft limit for longer than the
    /// seconds, is disconnected (0 = no limit) [default: normal 0 0 0
    /// replica 256mb 64mb 60 pubsub 32mb 8mb 60].
    #[arg(long, value_name = "CLASS HARD SOFT SECONDS")]
    pub client_output_buffer_limit: Option<String>,
    /// Cache mode: the memory limit (INFO `used_memory`), e.g. 512mb; 0 =
    /// none [default: 0].
    #[arg(long)]
    pub maxmemory: Option<String>,
    /// What happens at the limit: noeviction (writes get -OOM),
    /// allkeys-lru, volatile-lru, allkeys-lfu, volatile-lfu,
    /// allkeys-random, volatile-random or volatile-ttl (keys are evicted;
    /// with maxmemory 0 these evict when the heap nears heap-max-size)
    /// [default: noeviction].
    #[arg(long, value_name = "POLICY")]
    pub maxmemory_policy: Option<String>,
}

/// The engine a heap is served with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineChoice {
    Volatile,
    Direct(engine::direct::BackendKind),
    Bullet(engine::bullet::Variant),
}

impl EngineChoice {
    pub fn parse(s: &str) -> Result<EngineChoice, String> {
        use engine::bullet::Variant;
        use engine::direct::BackendKind;
        Ok(match s {
            "volatile" => EngineChoice::Volatile,
            "direct" | "direct-logfree" => EngineChoice::Direct(BackendKind::LogFree),
            "direct-phash" => EngineChoice::Direct(BackendKind::PHash),
            "bullet" | "bullet-full" => EngineChoice::Bullet(Variant::Full),
            "bullet-st" => EngineChoice::Bullet(Variant::St),
            "bullet-lfr" => EngineChoice::Bullet(Variant::Lfr),
            "bullet-opt" => EngineChoice::Bullet(Variant::Opt),
            "bullet-dyn" => EngineChoice::Bullet(Variant::Dyn),
            _ => {
                return Err(format!(
                    "unknown engine '{s}' (expected bullet, bullet-st, bullet-lfr, bullet-opt, bullet-dyn, direct, direct-phash or volatile)"
                ))
            }
        })
    }

    pub fn name(&self) -> String {
        match self {
            EngineChoice::Volatile => "volatile".into(),
            EngineChoice::Direct(b) => match b {
                engine::direct::BackendKind::LogFree => "direct".into(),
                engine::direct::BackendKind::PHash => "direct-phash".into(),
            },
            EngineChoice::Bullet(v) => match v {
                engine::bullet::Variant::Full => "bullet".into(),
                v => v.name().to_string(),
            },
        }
    }
}

/// When a write is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurabilityMode {
    /// Flush + fence into the mapping (SIGKILL-safe on an ordinary file).
    Pmem,
    /// msync before the reply (power-safe on an ordinary file).
    Msync,
}

impl DurabilityMode {
    pub fn name(self) -> &'static str {
        match self {
            DurabilityMode::Pmem => "pmem",
            DurabilityMode::Msync => "msync",
        }
    }
}

/// Who may run a protected command (Redis's `enable-debug-command`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protected {
    No,
    Yes,
    /// Clients on a loopback address only.
    Local,
}

/// `tls-auth-clients`: whether a TLS client must present a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsAuth {
    /// Required, and verified against `tls-ca-cert-file`.
    Yes,
    /// Verified when the client presents one.
    Optional,
    /// Not asked for.
    No,
}

impl TlsAuth {
    pub fn name(self) -> &'static str {
        match self {
            TlsAuth::Yes => "yes",
            TlsAuth::Optional => "optional",
            TlsAuth::No => "no",
        }
    }
}

/// One class's `client-output-buffer-limit`: bytes (0 = no limit) and the
/// seconds a client may stay above the soft limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObufLimit {
    pub hard: u64,
    pub soft: u64,
    pub soft_seconds: u64,
}

/// The client classes of `client-output-buffer-limit`, in Redis's order.
/// Replicas do not exist yet: their limit is kept and reported; the
/// `pubsub` limit applies to clients with subscriptions.
pub const OBUF_CLASSES: [&str; 3] = ["normal", "slave", "pubsub"];

/// Parses Redis's `client-output-buffer-limit` value (one or more groups of
/// `<class> <hard> <soft> <soft-seconds>`) onto `limits`; Redis's errors.
fn parse_obuf_limits(args: &[String], limits: &mut [ObufLimit; 3]) -> Result<(), String> {
    let words: Vec<&str> = args.iter().flat_map(|a| a.split_whitespace()).collect();
    // An empty value is no group at all (Redis accepts it and changes nothing).
    if !words.len().is_multiple_of(4) {
        return Err("Wrong number of arguments in buffer limit configuration.".into());
    }
    let mut next = *limits;
    for g in words.chunks(4) {
        let class = match g[0].to_ascii_lowercase().as_str() {
            "normal" => 0,
            "slave" | "replica" => 1,
            "pubsub" => 2,
            _ => {
                return Err("Invalid client class specified in buffer limit configuration.".into())
            }
        };
        let bad = || "Error in hard, soft or soft_seconds setting in buffer limit configuration.";
        let hard = parse_size(g[1]).map_err(|_| bad())?;
        let soft = parse_size(g[2]).map_err(|_| bad())?;
        let soft_seconds = g[3].parse::<u64>().map_err(|_| bad())?;
        next[class] = ObufLimit {
            hard,
            soft,
            soft_seconds,
        };
    }
    *limits = next;
    Ok(())
}

impl Protected {
    pub fn name(self) -> &'static str {
        match self {
            Protected::No => "no",
            Protected::Yes => "yes",
            Protected::Local => "local",
        }
    }

    /// Whether a client (loopback or not) may run the command.
    pub fn allows(self, local: bool) -> bool {
        match self {
            Protected::No => false,
            Protected::Yes => true,
            Protected::Local => local,
        }
    }
}

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub port: u16,
    pub bind: Vec<String>,
    pub requirepass: Option<String>,
    /// `user <name> <rules...>` directives: name then rules.
    pub users: Vec<Vec<Vec<u8>>>,
    pub aclfile: Option<PathBuf>,
    /// ACL LOG's length.
    pub acllog_max_len: u64,
    pub maxclients: u64,
    pub timeout: u64,
    pub hz: u64,
    pub protected_mode: bool,
    pub databases: u64,
    pub proto_max_bulk_len: u64,
    pub client_query_buffer_limit: u64,
    pub heap: PathBuf,
    pub heap_size: u64,
    pub heap_max_size: u64,
    pub engine: EngineChoice,
    pub durability: DurabilityMode,
    pub commit_pipeline: bool,
    pub threads: usize,
    /// `threads` was set (flag or file), not the default.
    pub threads_given: bool,
    pub metrics_port: Option<u16>,
    pub logs: usize,
    pub log_size: u64,
    /// Bullet's backlog bound (`BulletOptions::backlog_limit`; 0: none).
    pub log_backlog: u64,
    /// `log-backlog` was set (else its default follows the durability mode).
    pub log_backlog_given: bool,
    /// Bullet's bounded frontend (`BulletOptions::cache_entries`; 0: none).
    pub frontend_max_keys: u64,
    pub fence_ns: u64,
    pub tcp_backlog: u32,
    /// Microseconds a worker polls without sleeping after finding work.
    pub busy_poll_us: u64,
    /// Milliseconds a script or function runs before other clients are
    /// answered `-BUSY` and SCRIPT KILL / FUNCTION KILL may stop it
    /// (`busy-reply-threshold`, alias `lua-time-limit`; 0 = never).
    pub busy_reply_threshold: u64,
    /// SLOWLOG: commands slower than this many microseconds are logged
    /// (`slowlog-log-slower-than`; negative: none, 0: all).
    pub slowlog_slower_than: i64,
    /// SLOWLOG's length (`slowlog-max-len`).
    pub slowlog_max_len: u64,
    /// The latency monitor's threshold in ms (`latency-monitor-threshold`;
    /// 0: off).
    pub latency_monitor_threshold: u64,
    /// Seconds a shutdown waits for the workers before the process exits
    /// without the clean steps.
    pub shutdown_worker_timeout: u64,
    pub enable_debug_command: Protected,
    /// TLS port (0 = none).
    pub tls_port: u16,
    /// PEM files for TLS (empty = not set).
    pub tls_cert_file: String,
    pub tls_key_file: String,
    pub tls_ca_cert_file: String,
    pub tls_auth_clients: TlsAuth,
    /// memcached protocol port (0 = none).
    pub memcached_port: u16,
    /// The largest memcached item, memcached's `-I` (header, key and value).
    pub memcached_item_size_max: u64,
    /// Replication (see `crate::cluster`): this node's id (0 = off), its
    /// Raft port (0 = its --peers entry's), the members, the tick and the
    /// election timeout in ticks.
    pub node_id: u64,
    pub raft_port: u16,
    pub peers: String,
    pub raft_tick_ms: u64,
    pub raft_election_ticks: u64,
    /// `join`: start with no configuration, to be added to a running
    /// cluster; `raft-log-keep`: applied entries kept for lagging members.
    pub join: bool,
    pub raft_log_keep: u64,
    /// `raft-apply-lanes`: threads applying committed entries.
    pub raft_apply_lanes: usize,
    /// `raft-snapshot-chunk`: bytes per chunk of a snapshot's transfer.
    pub raft_snapshot_chunk: usize,
    /// `client-output-buffer-limit` per class (`OBUF_CLASSES`).
    pub client_output_buffer_limit: [ObufLimit; 3],
    /// Bytes above which a sparse HyperLogLog becomes dense (Redis's
    /// `hll-sparse-max-bytes`).
    pub hll_sparse_max_bytes: u64,
    /// Keys in the client-side caching table before some are dropped with
    /// an invalidation (0: no limit; see [`crate::tracking`]).
    pub tracking_table_max_keys: u64,
    /// `notify-keyspace-events` as flags (see [`crate::notify`]).
    pub notify_keyspace_events: u32,
    /// Cache mode (see [`crate::evict`]): bytes (0 = no limit), the
    /// policy, keys sampled per eviction, Redis's eviction tenacity and
    /// LFU parameters.
    pub maxmemory: u64,
    pub maxmemory_policy: crate::evict::Policy,
    pub maxmemory_samples: u64,
    pub maxmemory_eviction_tenacity: u64,
    pub lfu_log_factor: u64,
    pub lfu_decay_time: u64,
    /// Redis directives accepted with no effect here (name → value as given).
    pub no_effect: BTreeMap<String, String>,
    /// The file the configuration was read from.
    pub config_file: Option<PathBuf>,
}

const MB: u64 = 1024 * 1024;

impl Default for Config {
    fn default() -> Self {
        Config {
            port: 6379,
            bind: vec!["127.0.0.1".into()],
            requirepass: None,
            users: Vec::new(),
            aclfile: None,
            acllog_max_len: crate::acl::LOG_MAX_LEN as u64,
            maxclients: 10_000,
            timeout: 0,
            hz: 10,
            protected_mode: true,
            databases: 16,
            proto_max_bulk_len: 512 * MB,
            client_query_buffer_limit: 1024 * MB,
            heap: PathBuf::from("ember.heap"),
            heap_size: 1024 * MB,
            heap_max_size: 64 * 1024 * MB,
            engine: EngineChoice::Bullet(engine::bullet::Variant::Full),
            durability: DurabilityMode::Pmem,
            commit_pipeline: false,
            threads: default_threads(),
            threads_given: false,
            metrics_port: None,
            logs: 8,
            log_size: 32 * MB,
            log_backlog: PMEM_BACKLOG,
            log_backlog_given: false,
            frontend_max_keys: 0,
            fence_ns: 0,
            busy_poll_us: 50,
            busy_reply_threshold: 5000,
            slowlog_slower_than: 10_000,
            slowlog_max_len: 128,
            latency_monitor_threshold: 0,
            tcp_backlog: 511,
            shutdown_worker_timeout: 5,
            enable_debug_command: Protected::No,
            tls_port: 0,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_ca_cert_file: String::new(),
            tls_auth_clients: TlsAuth::Yes,
            memcached_port: 0,
            node_id: 0,
            raft_port: 0,
            peers: String::new(),
            raft_tick_ms: 5,
            raft_election_ticks: 10,
            join: false,
            raft_log_keep: 10_000,
            raft_apply_lanes: 1,
            raft_snapshot_chunk: repl::net::DEFAULT_SNAPSHOT_CHUNK,
            memcached_item_size_max: MB,
            // Redis 7.0's defaults.
            client_output_buffer_limit: [
                ObufLimit {
                    hard: 0,
                    soft: 0,
                    soft_seconds: 0,
                },
                ObufLimit {
                    hard: 256 * MB,
                    soft: 64 * MB,
                    soft_seconds: 60,
                },
                ObufLimit {
                    hard: 32 * MB,
                    soft: 8 * MB,
                    soft_seconds: 60,
                },
            ],
            hll_sparse_max_bytes: crate::hll::SPARSE_MAX_BYTES as u64,
            tracking_table_max_keys: 1_000_000,
            notify_keyspace_events: 0,
            maxmemory: 0,
            maxmemory_policy: crate::evict::Policy::NoEviction,
            maxmemory_samples: 5,
            maxmemory_eviction_tenacity: 10,
            lfu_log_factor: 10,
            lfu_decay_time: 1,
            no_effect: BTreeMap::new(),
            config_file: None,
        }
    }
}

/// Redis directives accepted with no effect: they tune Redis's own encodings,
/// snapshots, AOF, or process management that Ember does differently (the heap
/// is always the image; data types have one encoding each).
pub const NO_EFFECT: &[&str] = &[
    "save",
    "appendonly",
    "appendfsync",
    "appendfilename",
    "appenddirname",
    "dbfilename",
    "dir",
    "rdbcompression",
    "rdbchecksum",
    "rdb-del-sync-files",
    "stop-writes-on-bgsave-error",
    "no-appendfsync-on-rewrite",
    "auto-aof-rewrite-percentage",
    "auto-aof-rewrite-min-size",
    "aof-load-truncated",
    "aof-use-rdb-preamble",
    "aof-rewrite-incremental-fsync",
    "aof-timestamp-enabled",
    "rdb-save-incremental-fsync",
    "list-max-ziplist-size",
    "list-max-listpack-size",
    "list-compress-depth",
    "hash-max-ziplist-entries",
    "hash-max-ziplist-value",
    "hash-max-listpack-entries",
    "hash-max-listpack-value",
    "set-max-intset-entries",
    "set-max-listpack-entries",
    "set-max-listpack-value",
    "zset-max-ziplist-entries",
    "zset-max-ziplist-value",
    "zset-max-listpack-entries",
    "zset-max-listpack-value",
    "stream-node-max-bytes",
    "stream-node-max-entries",
    "activerehashing",
    "activedefrag",
    "lazyfree-lazy-eviction",
    "lazyfree-lazy-expire",
    "lazyfree-lazy-server-del",
    "lazyfree-lazy-user-del",
    "lazyfree-lazy-user-flush",
    "replica-lazy-flush",
    "dynamic-hz",
    "daemonize",
    "supervised",
    "pidfile",
    "loglevel",
    "logfile",
    "syslog-enabled",
    "always-show-logo",
    "set-proc-title",
    "tcp-keepalive",
    "io-threads",
    "io-threads-do-reads",
    "jemalloc-bg-thread",
    "oom-score-adj",
    "latency-tracking",
];

/// Parameters Ember honours (CONFIG GET shows them; `mutable` ones CONFIG SET
/// changes at runtime).
pub const HONOURED: &[(&str, bool)] = &[
    ("port", false),
    ("bind", false),
    ("requirepass", true),
    ("aclfile", false),
    ("acllog-max-len", true),
    ("maxclients", true),
    ("timeout", true),
    ("hz", true),
    ("protected-mode", true),
    ("databases", false),
    ("proto-max-bulk-len", true),
    ("client-query-buffer-limit", true),
    ("heap", false),
    ("heap-size", false),
    ("heap-max-size", false),
    ("engine", false),
    ("durability", false),
    ("commit-pipeline", false),
    ("threads", false),
    ("metrics-port", false),
    ("logs", false),
    ("log-size", false),
    ("log-backlog", false),
    ("frontend-max-keys", false),
    ("fence-ns", false),
    ("tcp-backlog", false),
    ("busy-poll-us", true),
    ("busy-reply-threshold", true),
    ("slowlog-log-slower-than", true),
    ("slowlog-max-len", true),
    ("latency-monitor-threshold", true),
    ("lua-time-limit", true),
    ("shutdown-worker-timeout", true),
    ("enable-debug-command", false),
    ("tls-port", false),
    ("tls-cert-file", false),
    ("tls-key-file", false),
    ("tls-ca-cert-file", false),
    ("tls-auth-clients", false),
    ("memcached-port", false),
    ("memcached-item-size-max", false),
    ("node-id", false),
    ("raft-port", false),
    ("peers", false),
    ("raft-tick-ms", false),
    ("raft-election-ticks", false),
    ("join", false),
    ("raft-log-keep", false),
    ("raft-apply-lanes", false),
    ("raft-snapshot-chunk", false),
    ("client-output-buffer-limit", true),
    ("hll-sparse-max-bytes", true),
    ("tracking-table-max-keys", true),
    ("notify-keyspace-events", true),
    ("maxmemory", true),
    ("maxmemory-policy", true),
    ("maxmemory-samples", true),
    ("maxmemory-eviction-tenacity", true),
    ("lfu-log-factor", true),
    ("lfu-decay-time", true),
];

/// Parses a size the way Redis's `memtoll` does: `k`/`m`/`g` are powers of
/// 1000, `kb`/`mb`/`gb` powers of 1024, case-insensitive.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let l = s.to_ascii_lowercase();
    let (num, mul) = [
        ("gb", 1u64 << 30),
        ("mb", 1 << 20),
        ("kb", 1 << 10),
        ("g", 1_000_000_000),
        ("m", 1_000_000),
        ("k", 1_000),
        ("b", 1),
    ]
    .iter()
    .find_map(|(suf, m)| l.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((&l, 1));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size '{s}' (e.g. 1024, 100kb, 512mb, 2gb)"))?;
    n.checked_mul(mul)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("argument must be 'yes' or 'no', got '{s}'")),
    }
}

fn parse_u64(s: &str) -> Result<u64, String> {
    s.parse()
        .map_err(|_| format!("argument couldn't be parsed into an integer: '{s}'"))
}

/// An integer parameter within `lo..=hi`, with Redis's texts.
fn bounded(s: &str, lo: i64, hi: i64) -> Result<u64, String> {
    let n: i64 = s
        .parse()
        .map_err(|_| "argument couldn't be parsed into an integer".to_string())?;
    if n < lo || n > hi {
        return Err(format!("argument must be between {lo} and {hi} inclusive"));
    }
    Ok(n as u64)
}

/// How deep `include` directives may nest.
const MAX_INCLUDE_DEPTH: usize = 16;

impl Config {
    /// Applies one directive (file line, flag, or CONFIG SET at startup-only
    /// parameters). `args` are the directive's arguments.
    pub fn apply(&mut self, name: &str, args: &[String]) -> Result<(), String> {
        let name = name.to_ascii_lowercase();
        let one = || -> Result<&str, String> {
            match args {
                [a] => Ok(a.as_str()),
                _ => Err("wrong number of arguments".into()),
            }
        };
        match name.as_str() {
            "port" => {
                self.port = one()?
                    .parse()
                    .map_err(|_| format!("invalid port '{}'", one().unwrap_or("")))?
            }
            "bind" => {
                if args.is_empty() {
                    return Err("wrong number of arguments".into());
                }
                let addrs: Vec<String> = args
                    .iter()
                    .flat_map(|a| a.split_whitespace())
                    .map(|a| a.trim_start_matches('-').to_string())
                    .filter(|a| !a.is_empty())
                    .collect();
                // Blank words or a lone "-" would leave an empty address (a
                // startup error) or none at all (listening nowhere).
                if addrs.is_empty() {
                    return Err("bind needs at least one address".into());
                }
                self.bind = addrs;
            }
            "requirepass" => {
                let p = one()?;
                self.requirepass = if p.is_empty() {
                    None
                } else {
                    Some(p.to_string())
                };
            }
            "user" => {
                let Some((user, rules)) = args.split_first() else {
                    return Err("wrong number of arguments".into());
                };
                if self.users.iter().any(|u| u[0] == user.as_bytes()) {
                    return Err(
                        "Duplicate user found. A user can only be defined once in config files"
                            .into(),
                    );
                }
                let mut def = vec![user.as_bytes().to_vec()];
                def.extend(rules.iter().map(|r| r.as_bytes().to_vec()));
                // Checked now, applied when the server starts.
                crate::acl::apply_rules(&mut crate::acl::User::new(&def[0]), &def[1..])?;
                self.users.push(def);
            }
            "acllog-max-len" => self.acllog_max_len = parse_u64(one()?)?,
            "aclfile" => {
                let f = one()?;
                self.aclfile = (!f.is_empty()).then(|| PathBuf::from(f));
            }
            "maxclients" => {
                let n = parse_u64(one()?)?;
                if n == 0 {
                    return Err("maxclients must be at least 1".into());
                }
                self.maxclients = n;
            }
            "timeout" => self.timeout = parse_u64(one()?)?,
            "hz" => self.hz = parse_u64(one()?)?.clamp(1, 500),
            "busy-reply-threshold" | "lua-time-limit" => {
                self.busy_reply_threshold = parse_u64(one()?)?
            }
            "slowlog-log-slower-than" => {
                let v = one()?;
                self.slowlog_slower_than = v
                    .parse::<i64>()
                    .map_err(|_| format!("argument couldn't be parsed into an integer: {v}"))?;
            }
            "slowlog-max-len" => self.slowlog_max_len = parse_u64(one()?)?,
            "latency-monitor-threshold" => self.latency_monitor_threshold = parse_u64(one()?)?,
            "protected-mode" => self.protected_mode = parse_bool(one()?)?,
            "databases" => {
                let n = parse_u64(one()?)?;
                if !(1..=255).contains(&n) {
                    return Err("databases must be between 1 and 255".into());
                }
                self.databases = n;
            }
            "proto-max-bulk-len" => {
                let n = parse_size(one()?)?;
                if n < 1024 * 1024 {
                    return Err("proto-max-bulk-len must be at least 1mb".into());
                }
                self.proto_max_bulk_len = n;
            }
            "client-query-buffer-limit" => {
                let n = parse_size(one()?)?;
                if n < 1024 * 1024 {
                    return Err("client-query-buffer-limit must be at least 1mb".into());
                }
                self.client_query_buffer_limit = n;
            }
            "heap" => self.heap = PathBuf::from(one()?),
            "heap-size" => self.heap_size = parse_size(one()?)?,
            "heap-max-size" => self.heap_max_size = parse_size(one()?)?,
            "engine" => self.engine = EngineChoice::parse(one()?)?,
            "durability" => {
                self.durability = match one()? {
                    "pmem" => DurabilityMode::Pmem,
                    "msync" => DurabilityMode::Msync,
                    d => return Err(format!("unknown durability '{d}' (expected pmem or msync)")),
                }
            }
            "commit-pipeline" => self.commit_pipeline = parse_bool(one()?)?,
            "threads" => {
                let n = parse_u64(one()?)?;
                if !(1..=64).contains(&n) {
                    return Err("threads must be between 1 and 64".into());
                }
                self.threads = n as usize;
                self.threads_given = true;
            }
            "metrics-port" => {
                let p: u16 = one()?.parse().map_err(|_| "invalid port".to_string())?;
                self.metrics_port = (p != 0).then_some(p);
            }
            "logs" => {
                let n = parse_u64(one()?)?;
                if !(2..=1024).contains(&n) {
                    return Err("logs must be between 2 and 1024".into());
                }
                self.logs = n as usize;
            }
            "log-size" => self.log_size = parse_size(one()?)?,
            "log-backlog" => {
                self.log_backlog = parse_size(one()?)?;
                self.log_backlog_given = true;
            }
            "frontend-max-keys" => self.frontend_max_keys = parse_u64(one()?)?,
            "fence-ns" => self.fence_ns = parse_u64(one()?)?,
            "busy-poll-us" => {
                let n = parse_u64(one()?)?;
                if n > 10_000 {
                    return Err("busy-poll-us must be between 0 and 10000".into());
                }
                self.busy_poll_us = n;
            }
            "tcp-backlog" => {
                let n = parse_u64(one()?)?;
                if !(1..=65535).contains(&n) {
                    return Err("tcp-backlog must be between 1 and 65535".into());
                }
                self.tcp_backlog = n as u32;
            }
            "shutdown-worker-timeout" => {
                let n = parse_u64(one()?)?;
                if !(1..=86_400).contains(&n) {
                    return Err("shutdown-worker-timeout must be between 1 and 86400".into());
                }
                self.shutdown_worker_timeout = n;
            }
            "enable-debug-command" => {
                self.enable_debug_command = match one()?.to_ascii_lowercase().as_str() {
                    "no" => Protected::No,
                    "yes" => Protected::Yes,
                    "local" => Protected::Local,
                    _ => {
                        return Err(
                            "argument(s) must be one of the following: no, yes, local".into()
                        )
                    }
                }
            }
            "tls-port" => {
                self.tls_port = one()?
                    .parse()
                    .map_err(|_| format!("invalid port '{}'", one().unwrap_or("")))?
            }
            "tls-cert-file" => self.tls_cert_file = one()?.to_string(),
            "tls-key-file" => self.tls_key_file = one()?.to_string(),
            "tls-ca-cert-file" => self.tls_ca_cert_file = one()?.to_string(),
            "memcached-port" => {
                self.memcached_port = one()?
                    .parse()
                    .map_err(|_| format!("invalid port '{}'", one().unwrap_or("")))?
            }
            "node-id" => {
                self.node_id = one()?
                    .parse()
                    .map_err(|_| format!("invalid node id '{}'", one().unwrap_or("")))?
            }
            "raft-port" => {
                self.raft_port = one()?
                    .parse()
                    .map_err(|_| format!("invalid port '{}'", one().unwrap_or("")))?
            }
            "peers" => {
                let v = one()?;
                repl::parse_peers(v)?;
                self.peers = v.to_string();
            }
            "raft-tick-ms" => {
                self.raft_tick_ms = one()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| "raft-tick-ms must be between 1 and 1000".to_string())?
            }
            "raft-election-ticks" => {
                self.raft_election_ticks = one()?
                    .parse()
                    .ok()
                    .filter(|n| (3..=10_000).contains(n))
                    .ok_or_else(|| "raft-election-ticks must be between 3 and 10000".to_string())?
            }
            "join" => self.join = parse_bool(one()?)?,
            "raft-log-keep" => {
                self.raft_log_keep = one()?
                    .parse()
                    .ok()
                    .filter(|n| (2..=1_000_000_000).contains(n))
                    .ok_or_else(|| "raft-log-keep must be between 2 and 1000000000".to_string())?
            }
            "raft-apply-lanes" => {
                self.raft_apply_lanes = one()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=repl::MAX_LANES).contains(n))
                    .ok_or_else(|| {
                        format!("raft-apply-lanes must be between 1 and {}", repl::MAX_LANES)
                    })?
            }
            "raft-snapshot-chunk" => {
                let n = parse_size(one()?)?;
                if !(1..=256 * MB).contains(&n) {
                    return Err("raft-snapshot-chunk must be between 1 and 256mb".into());
                }
                self.raft_snapshot_chunk = n as usize;
            }
            "memcached-item-size-max" => {
                let n = parse_size(one()?)?;
                if !(1024..=512 * MB).contains(&n) {
                    return Err("memcached-item-size-max must be between 1kb and 512mb".into());
                }
                self.memcached_item_size_max = n;
            }
            "tls-auth-clients" => {
                self.tls_auth_clients = match one()?.to_ascii_lowercase().as_str() {
                    "yes" => TlsAuth::Yes,
                    "no" => TlsAuth::No,
                    "optional" => TlsAuth::Optional,
                    _ => {
                        return Err(
                            "argument(s) must be one of the following: no, yes, optional".into(),
                        )
                    }
                }
            }
            "client-output-buffer-limit" => {
                parse_obuf_limits(args, &mut self.client_output_buffer_limit)?
            }
            "hll-sparse-max-bytes" => {
                let n = parse_size(one()?)?;
                if n > i64::MAX as u64 {
                    return Err("argument must be a memory value".into());
                }
                self.hll_sparse_max_bytes = n;
            }
            "tracking-table-max-keys" => {
                self.tracking_table_max_keys = bounded(one()?, 0, i64::MAX)?
            }
            "notify-keyspace-events" => {
                self.notify_keyspace_events = crate::notify::parse_flags(one()?)
                    .ok_or("Invalid event class character. Use 'Ag$lshzxeKEtmdn'.")?
            }
            "maxmemory" => {
                self.maxmemory =
                    parse_size(one()?).map_err(|_| "argument must be a memory value".to_string())?
            }
            "maxmemory-policy" => {
                self.maxmemory_policy =
                    crate::evict::Policy::parse(one()?).ok_or_else(crate::evict::Policy::invalid)?
            }
            "maxmemory-samples" => self.maxmemory_samples = bounded(one()?, 1, i32::MAX.into())?,
            "maxmemory-eviction-tenacity" => {
                self.maxmemory_eviction_tenacity = bounded(one()?, 0, 100)?
            }
            "lfu-log-factor" => self.lfu_log_factor = bounded(one()?, 0, i32::MAX.into())?,
            "lfu-decay-time" => self.lfu_decay_time = bounded(one()?, 0, i32::MAX.into())?,
            n if NO_EFFECT.contains(&n) => {
                self.no_effect.insert(n.to_string(), args.join(" "));
            }
            _ => return Err("Bad directive or wrong number of arguments".into()),
        }
        Ok(())
    }

    /// Reads a redis.conf-syntax file on top of `self`.
    pub fn apply_file(&mut self, path: &std::path::Path) -> Result<(), String> {
        self.apply_file_nested(path, 0)
    }

    /// [`Config::apply_file`] at `depth` includes deep: a file that includes
    /// itself (or a longer cycle) is an error, not a stack overflow.
    fn apply_file_nested(&mut self, path: &std::path::Path, depth: usize) -> Result<(), String> {
        if depth > MAX_INCLUDE_DEPTH {
            return Err(format!(
                "{}: includes nested more than {MAX_INCLUDE_DEPTH} deep (a file that includes itself?)",
                path.display()
            ));
        }
        let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        self.apply_text_nested(&text, path, depth)
    }

    /// Applies the text of a redis.conf-syntax file read from `path` (which
    /// errors name, and `include` directives are read relative to the
    /// working directory as Redis does).
    pub fn apply_text(&mut self, text: &[u8], path: &std::path::Path) -> Result<(), String> {
        self.apply_text_nested(text, path, 0)
    }

    fn apply_text_nested(
        &mut self,
        text: &[u8],
        path: &std::path::Path,
        depth: usize,
    ) -> Result<(), String> {
        for (i, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() || trimmed[0] == b'#' {
                continue;
            }
            let words = proto::split_args(trimmed).ok_or_else(|| {
                format!(
                    "{}:{}: unbalanced quotes in configuration line",
                    path.display(),
                    i + 1
                )
            })?;
            let Some((name, rest)) = words.split_first() else {
                continue;
            };
            let name = String::from_utf8_lossy(name).to_string();
            let rest: Vec<String> = rest
                .iter()
                .map(|w| String::from_utf8_lossy(w).to_string())
                .collect();
            if name.eq_ignore_ascii_case("include") {
                for f in &rest {
                    self.apply_file_nested(std::path::Path::new(f), depth + 1)?;
                }
                continue;
            }
            self.apply(&name, &rest).map_err(|e| {
                format!(
                    "{}:{}: '{}': {e}",
                    path.display(),
                    i + 1,
                    String::from_utf8_lossy(trimmed)
                )
            })?;
        }
        Ok(())
    }

    /// Defaults, then `--config`, then flags.
    pub fn load(a: &ServeArgs) -> Result<Config, String> {
        let mut c = Config::default();
        if let Some(f) = &a.config {
            c.apply_file(f)?;
            c.config_file = Some(f.clone());
        }
        let mut set = |name: &str, v: Option<String>| -> Result<(), String> {
            match v {
                Some(v) => c
                    .apply(name, std::slice::from_ref(&v))
                    .map_err(|e| format!("--{name} {v}: {e}")),
                None => Ok(()),
            }
        };
        set("port", a.port.map(|v| v.to_string()))?;
        set("bind", a.bind.clone())?;
        set("requirepass", a.requirepass.clone())?;
        set(
            "aclfile",
            a.aclfile.as_ref().map(|p| p.display().to_string()),
        )?;
        set("maxclients", a.maxclients.map(|v| v.to_string()))?;
        set("timeout", a.timeout.map(|v| v.to_string()))?;
        set("hz", a.hz.map(|v| v.to_string()))?;
        set("protected-mode", a.protected_mode.clone())?;
        set("databases", a.databases.map(|v| v.to_string()))?;
        set("proto-max-bulk-len", a.proto_max_bulk_len.clone())?;
        set(
            "client-query-buffer-limit",
            a.client_query_buffer_limit.clone(),
        )?;
        set("heap", a.heap.as_ref().map(|p| p.display().to_string()))?;
        set("heap-size", a.heap_size.clone())?;
        set("heap-max-size", a.heap_max_size.clone())?;
        set("engine", a.engine.clone())?;
        set("durability", a.durability.clone())?;
        set("commit-pipeline", a.commit_pipeline.clone())?;
        set("threads", a.threads.map(|v| v.to_string()))?;
        set("metrics-port", a.metrics_port.map(|v| v.to_string()))?;
        set("logs", a.logs.map(|v| v.to_string()))?;
        set("log-size", a.log_size.clone())?;
        set("log-backlog", a.log_backlog.clone())?;
        set(
            "frontend-max-keys",
            a.frontend_max_keys.map(|v| v.to_string()),
        )?;
        set("fence-ns", a.fence_ns.map(|v| v.to_string()))?;
        set("busy-poll-us", a.busy_poll_us.map(|v| v.to_string()))?;
        set("tcp-backlog", a.tcp_backlog.map(|v| v.to_string()))?;
        set(
            "shutdown-worker-timeout",
            a.shutdown_worker_timeout.map(|v| v.to_string()),
        )?;
        set("enable-debug-command", a.enable_debug_command.clone())?;
        set("tls-port", a.tls_port.map(|v| v.to_string()))?;
        set("tls-cert-file", a.tls_cert_file.clone())?;
        set("tls-key-file", a.tls_key_file.clone())?;
        set("tls-ca-cert-file", a.tls_ca_cert_file.clone())?;
        set("tls-auth-clients", a.tls_auth_clients.clone())?;
        set("memcached-port", a.memcached_port.map(|v| v.to_string()))?;
        set("memcached-item-size-max", a.memcached_item_size_max.clone())?;
        set("node-id", a.node_id.map(|v| v.to_string()))?;
        set("raft-port", a.raft_port.map(|v| v.to_string()))?;
        set("peers", a.peers.clone())?;
        set("raft-tick-ms", a.raft_tick_ms.map(|v| v.to_string()))?;
        set(
            "raft-election-ticks",
            a.raft_election_ticks.map(|v| v.to_string()),
        )?;
        set("join", a.join.clone())?;
        set("raft-log-keep", a.raft_log_keep.map(|v| v.to_string()))?;
        set(
            "raft-apply-lanes",
            a.raft_apply_lanes.map(|v| v.to_string()),
        )?;
        set("raft-snapshot-chunk", a.raft_snapshot_chunk.clone())?;
        set(
            "client-output-buffer-limit",
            a.client_output_buffer_limit.clone(),
        )?;
        set("maxmemory", a.maxmemory.clone())?;
        set("maxmemory-policy", a.maxmemory_policy.clone())?;
        if c.aclfile.is_some() && !c.users.is_empty() {
            // As Redis refuses it: two sources of users invite mistakes.
            return Err("Configuring users defined in the configuration file ('user' directives) and at the same time an ACL file path ('aclfile') is invalid: define either an ACL file or the users in the configuration file, not both".into());
        }
        if c.heap_max_size < c.heap_size {
            c.heap_max_size = c.heap_size;
        }
        if !c.log_backlog_given {
            c.log_backlog = default_backlog(c.durability);
        }
        if c.node_id != 0 && !c.threads_given {
            // A cluster node's worker holds a write's locks until a quorum
            // has it: the workers, not the CPUs, bound the writes in flight
            // (3-node SET from 50 clients: 2 workers 5.0-5.8k/s, 8 workers
            // 9.7-11.0k/s, 16 workers 12.5-13.7k/s on 2 cores; BENCHMARKS.md).
            c.threads = CLUSTER_THREADS.max(c.threads);
        }
        Ok(c)
    }

    /// The value of an honoured parameter as CONFIG GET shows it.
    pub fn get(&self, name: &str) -> Option<String> {
        Some(match name {
            "port" => self.port.to_string(),
            "bind" => self.bind.join(" "),
            "requirepass" => self.requirepass.clone().unwrap_or_default(),
            "acllog-max-len" => self.acllog_max_len.to_string(),
            "aclfile" => self
                .aclfile
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            "maxclients" => self.maxclients.to_string(),
            "timeout" => self.timeout.to_string(),
            "hz" => self.hz.to_string(),
            "busy-reply-threshold" | "lua-time-limit" => self.busy_reply_threshold.to_string(),
            "slowlog-log-slower-than" => self.slowlog_slower_than.to_string(),
            "slowlog-max-len" => self.slowlog_max_len.to_string(),
            "latency-monitor-threshold" => self.latency_monitor_threshold.to_string(),
            "protected-mode" => if self.protected_mode { "yes" } else { "no" }.into(),
            "databases" => self.databases.to_string(),
            "proto-max-bulk-len" => self.proto_max_bulk_len.to_string(),
            "client-query-buffer-limit" => self.client_query_buffer_limit.to_string(),
            "heap" => self.heap.display().to_string(),
            "heap-size" => self.heap_size.to_string(),
            "heap-max-size" => self.heap_max_size.to_string(),
            "engine" => self.engine.name(),
            "durability" => self.durability.name().into(),
            "commit-pipeline" => if self.commit_pipeline { "yes" } else { "no" }.into(),
            "threads" => self.threads.to_string(),
            "metrics-port" => self.metrics_port.unwrap_or(0).to_string(),
            "logs" => self.logs.to_string(),
            "log-size" => self.log_size.to_string(),
            "log-backlog" => self.log_backlog.to_string(),
            "frontend-max-keys" => self.frontend_max_keys.to_string(),
            "fence-ns" => self.fence_ns.to_string(),
            "busy-poll-us" => self.busy_poll_us.to_string(),
            "tcp-backlog" => self.tcp_backlog.to_string(),
            "shutdown-worker-timeout" => self.shutdown_worker_timeout.to_string(),
            "enable-debug-command" => self.enable_debug_command.name().into(),
            "tls-port" => self.tls_port.to_string(),
            "tls-cert-file" => self.tls_cert_file.clone(),
            "tls-key-file" => self.tls_key_file.clone(),
            "tls-ca-cert-file" => self.tls_ca_cert_file.clone(),
            "tls-auth-clients" => self.tls_auth_clients.name().into(),
            "memcached-port" => self.memcached_port.to_string(),
            "memcached-item-size-max" => self.memcached_item_size_max.to_string(),
            "node-id" => self.node_id.to_string(),
            "raft-port" => self.raft_port.to_string(),
            "peers" => self.peers.clone(),
            "raft-tick-ms" => self.raft_tick_ms.to_string(),
            "raft-election-ticks" => self.raft_election_ticks.to_string(),
            "join" => if self.join { "yes" } else { "no" }.into(),
            "raft-log-keep" => self.raft_log_keep.to_string(),
            "raft-apply-lanes" => self.raft_apply_lanes.to_string(),
            "raft-snapshot-chunk" => self.raft_snapshot_chunk.to_string(),
            "client-output-buffer-limit" => OBUF_CLASSES
                .iter()
                .zip(&self.client_output_buffer_limit)
                .map(|(n, l)| format!("{n} {} {} {}", l.hard, l.soft, l.soft_seconds))
                .collect::<Vec<_>>()
                .join(" "),
            "hll-sparse-max-bytes" => self.hll_sparse_max_bytes.to_string(),
            "tracking-table-max-keys" => self.tracking_table_max_keys.to_string(),
            "notify-keyspace-events" => crate::notify::flags_string(self.notify_keyspace_events),
            "maxmemory" => self.maxmemory.to_string(),
            "maxmemory-policy" => self.maxmemory_policy.name().into(),
            "maxmemory-samples" => self.maxmemory_samples.to_string(),
            "maxmemory-eviction-tenacity" => self.maxmemory_eviction_tenacity.to_string(),
            "lfu-log-factor" => self.lfu_log_factor.to_string(),
            "lfu-decay-time" => self.lfu_decay_time.to_string(),
            n if NO_EFFECT.contains(&n) => self.no_effect.get(n).cloned().unwrap_or_default(),
            _ => return None,
        })
    }
}

/// Workers by default on a cluster node (see [`Config::load`]).
pub const CLUSTER_THREADS: usize = 16;

/// The backlog bound by default with `--durability pmem`: a restart after a
/// crash replays at most 4 MiB of log (10-50 ms), and its gleaners apply
/// 400k+ SETs a second, so the bound holds back only long bursts (a
/// 600,000-SET pipelined burst: 1.45x faster unbounded, BENCHMARKS.md).
pub const PMEM_BACKLOG: u64 = 4 * MB;

/// The backlog bound by default with `--durability msync`. Its gleaners
/// apply about 45,000 SETs a second under load (each batch's scattered backend
/// pages are written back by `msync`, a TLB shootdown and a page fault per
/// page), so a 4 MiB bound held a pipelined burst to that pace: 45k SET/s
/// against 520-550k with 128 MiB, where a restart after a crash in the
/// middle of the burst took 0.25-0.5 s instead of 40-50 ms (BENCHMARKS.md).
pub const MSYNC_BACKLOG: u64 = 128 * MB;

/// The backlog bound a durability mode gets when `log-backlog` is not set.
pub fn default_backlog(d: DurabilityMode) -> u64 {
    match d {
        DurabilityMode::Pmem => PMEM_BACKLOG,
        DurabilityMode::Msync => MSYNC_BACKLOG,
    }
}

/// Workers by default: one per CPU but one. The store's background threads (the
/// epoch advancer, Bullet's gleaner and log population) and the kernel's network
/// processing need a core too: on two cores shared with a load generator,
/// one worker serves pipelined reads faster than two (the measurements are
/// in BENCHMARKS.md's history).
fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .saturating_sub(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bind address is non-empty, so the value CONFIG GET shows reads
    /// back the same (the config fuzz target found `bind "x -"` showing a
    /// trailing empty address).
    #[test]
    fn bind_addresses_are_never_empty() {
        let mut c = Config::default();
        c.apply("bind", &["127.0.0.1 -".into(), "-::1".into()])
            .unwrap();
        assert_eq!(c.bind, ["127.0.0.1", "::1"]);
        for blank in [" ", "-", " - -- "] {
            assert!(c.apply("bind", &[blank.into()]).is_err(), "{blank:?}");
        }
        assert_eq!(c.bind, ["127.0.0.1", "::1"]);
    }

    #[test]
    fn sizes_like_redis() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("1k").unwrap(), 1000);
        assert_eq!(parse_size("1kb").unwrap(), 1024);
        assert_eq!(parse_size("2GB").unwrap(), 2 << 30);
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999gb").is_err());
    }

    #[test]
    fn file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("e.conf");
        std::fs::write(
            &f,
            "# comment\nport 7000\nbind 127.0.0.1 ::1\nrequirepass \"p w\"\nsave 900 1\nappendonly yes\nengine direct\n",
        )
        .unwrap();
        let a = ServeArgs {
            config: Some(f.clone()),
            port: Some(7001),
            ..Default::default()
        };
        let c = Config::load(&a).unwrap();
        assert_eq!(c.port, 7001);
        assert_eq!(c.bind, ["127.0.0.1", "::1"]);
        assert_eq!(c.requirepass.as_deref(), Some("p w"));
        assert_eq!(c.get("save").unwrap(), "900 1");
        assert_eq!(c.engine.name(), "direct");
        std::fs::write(&f, "port 1\nbogus-directive 3\n").unwrap();
        let e = Config::load(&a).unwrap_err();
        assert!(e.contains(":2:") && e.contains("Bad directive"), "{e}");
        std::fs::write(&f, "maxclients x\n").unwrap();
        assert!(Config::load(&a).is_err());
    }

    #[test]
    fn shutdown_timeout_and_debug_command() {
        let c = Config::default();
        assert_eq!(c.shutdown_worker_timeout, 5);
        assert_eq!(c.enable_debug_command, Protected::No);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("e.conf");
        std::fs::write(
            &f,
            "shutdown-worker-timeout 2\nenable-debug-command local\n",
        )
        .unwrap();
        let mut a = ServeArgs {
            config: Some(f.clone()),
            ..Default::default()
        };
        let c = Config::load(&a).unwrap();
        assert_eq!(c.get("shutdown-worker-timeout").unwrap(), "2");
        assert_eq!(c.get("enable-debug-command").unwrap(), "local");
        assert!(c.enable_debug_command.allows(true));
        assert!(!c.enable_debug_command.allows(false));
        a.enable_debug_command = Some("YES".into());
        a.shutdown_worker_timeout = Some(30);
        let c = Config::load(&a).unwrap();
        assert!(c.enable_debug_command.allows(false));
        assert_eq!(c.shutdown_worker_timeout, 30, "the flag wins");
        for bad in ["shutdown-worker-timeout 0", "enable-debug-command maybe"] {
            std::fs::write(&f, bad).unwrap();
            a.enable_debug_command = None;
            a.shutdown_worker_timeout = None;
            assert!(Config::load(&a).is_err(), "{bad}");
        }
        assert!(!Protected::No.allows(true));
    }

    #[test]
    fn output_buffer_limits_like_redis() {
        let c = Config::default();
        assert_eq!(
            c.get("client-output-buffer-limit").unwrap(),
            "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("e.conf");
        std::fs::write(
            &f,
            "client-output-buffer-limit normal 1mb 512kb 1\nclient-output-buffer-limit replica 1gb 1gb 0\n",
        )
        .unwrap();
        let mut a = ServeArgs {
            config: Some(f.clone()),
            ..Default::default()
        };
        let c = Config::load(&a).unwrap();
        assert_eq!(
            c.get("client-output-buffer-limit").unwrap(),
            "normal 1048576 524288 1 slave 1073741824 1073741824 0 pubsub 33554432 8388608 60"
        );
        a.client_output_buffer_limit = Some("pubsub 0 0 0 normal 10 20 30".into());
        let c = Config::load(&a).unwrap();
        assert_eq!(
            c.client_output_buffer_limit,
            [
                ObufLimit {
                    hard: 10,
                    soft: 20,
                    soft_seconds: 30
                },
                ObufLimit {
                    hard: 1 << 30,
                    soft: 1 << 30,
                    soft_seconds: 0
                },
                ObufLimit {
                    hard: 0,
                    soft: 0,
                    soft_seconds: 0
                },
            ]
        );
        // A bad group changes nothing (CONFIG SET is all or nothing).
        let mut c = Config::default();
        for (bad, why) in [
            ("normal 1 2", "Wrong number"),
            ("normal 1 2 3 master 1 2 3", "Invalid client class"),
            ("normal 1 2 -3", "Error in hard, soft or soft_seconds"),
            ("normal 1x 2 3", "Error in hard, soft or soft_seconds"),
        ] {
            let e = c
                .apply("client-output-buffer-limit", &[bad.to_string()])
                .unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert_eq!(
            c.client_output_buffer_limit,
            Config::default().client_output_buffer_limit
        );
    }

    #[test]
    fn tls_parameters() {
        let c = Config::default();
        assert_eq!(c.get("tls-port").unwrap(), "0");
        assert_eq!(c.get("tls-auth-clients").unwrap(), "yes");
        assert_eq!(c.get("tls-cert-file").unwrap(), "");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("e.conf");
        std::fs::write(
            &f,
            "port 0\ntls-port 6380\ntls-cert-file /a/c.pem\ntls-key-file \"/a/k.pem\"\ntls-ca-cert-file /a/ca.pem\ntls-auth-clients optional\n",
        )
        .unwrap();
        let mut a = ServeArgs {
            config: Some(f.clone()),
            ..Default::default()
        };
        let c = Config::load(&a).unwrap();
        assert_eq!(c.port, 0);
        assert_eq!(c.tls_port, 6380);
        assert_eq!(c.get("tls-key-file").unwrap(), "/a/k.pem");
        assert_eq!(c.tls_auth_clients, TlsAuth::Optional);
        a.tls_auth_clients = Some("NO".into());
        assert_eq!(Config::load(&a).unwrap().tls_auth_clients, TlsAuth::No);
        a.tls_auth_clients = Some("maybe".into());
        let e = Config::load(&a).unwrap_err();
        assert!(e.contains("no, yes, optional"), "{e}");
    }

    /// A cluster node's default workers; `threads` given (flag or file)
    /// wins, and a lone server keeps one per CPU but one.
    #[test]
    fn a_cluster_node_runs_more_workers_by_default() {
        let node = |threads: Option<usize>| ServeArgs {
            node_id: Some(1),
            peers: Some("1=127.0.0.1:1:2".into()),
            threads,
            ..Default::default()
        };
        assert_eq!(Config::load(&node(None)).unwrap().threads, CLUSTER_THREADS);
        assert_eq!(Config::load(&node(Some(3))).unwrap().threads, 3);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t.conf");
        std::fs::write(&f, "threads 2\n").unwrap();
        let a = ServeArgs {
            config: Some(f),
            ..node(None)
        };
        assert_eq!(Config::load(&a).unwrap().threads, 2);
        let lone = Config::load(&ServeArgs::default()).unwrap();
        assert_eq!(lone.threads, default_threads());
    }

    /// The backlog bound follows the durability mode unless given (flag or
    /// file), and CONFIG GET shows the bound in force.
    #[test]
    fn the_backlog_bound_follows_the_durability_mode() {
        let args = |durability: Option<&str>, backlog: Option<&str>| ServeArgs {
            durability: durability.map(Into::into),
            log_backlog: backlog.map(Into::into),
            ..Default::default()
        };
        let c = Config::load(&args(None, None)).unwrap();
        assert_eq!(c.log_backlog, PMEM_BACKLOG);
        let c = Config::load(&args(Some("msync"), None)).unwrap();
        assert_eq!(c.log_backlog, MSYNC_BACKLOG);
        assert_eq!(c.get("log-backlog").unwrap(), (128u64 << 20).to_string());
        assert_eq!(
            Config::load(&args(Some("msync"), Some("1mb")))
                .unwrap()
                .log_backlog,
            1 << 20
        );
        assert_eq!(
            Config::load(&args(Some("msync"), Some("0")))
                .unwrap()
                .log_backlog,
            0
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("b.conf");
        std::fs::write(&f, "durability msync\nlog-backlog 8mb\n").unwrap();
        let a = ServeArgs {
            config: Some(f),
            ..Default::default()
        };
        assert_eq!(Config::load(&a).unwrap().log_backlog, 8 << 20);
    }

    #[test]
    fn users_and_aclfile() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("e.conf");
        std::fs::write(&f, "user alice on >p ~a:* +get\nuser bob off\n").unwrap();
        let mut a = ServeArgs {
            config: Some(f.clone()),
            ..Default::default()
        };
        let c = Config::load(&a).unwrap();
        assert_eq!(c.users.len(), 2);
        assert_eq!(c.users[0][0], b"alice");
        assert_eq!(
            c.users[0][1..],
            [
                b"on".to_vec(),
                b">p".to_vec(),
                b"~a:*".to_vec(),
                b"+get".to_vec()
            ]
        );
        assert_eq!(c.get("aclfile").unwrap(), "");
        for (bad, why) in [
            ("user alice +nosuch\n", "Unknown command"),
            ("user alice\nuser alice on\n", "Duplicate user"),
            ("user\n", "wrong number of arguments"),
        ] {
            std::fs::write(&f, bad).unwrap();
            let e = Config::load(&a).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // `user` directives and an ACL file together are refused.
        std::fs::write(&f, "user alice on\n").unwrap();
        a.aclfile = Some(dir.path().join("users.acl"));
        let e = Config::load(&a).unwrap_err();
        assert!(e.contains("not both"), "{e}");
        std::fs::write(&f, "port 7000\n").unwrap();
        let c = Config::load(&a).unwrap();
        assert_eq!(c.aclfile, a.aclfile);
        assert!(c.get("aclfile").unwrap().ends_with("users.acl"));
    }

    #[test]
    fn an_include_cycle_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("self.conf");
        std::fs::write(&f, format!("port 7000\ninclude {}\n", f.display())).unwrap();
        let e = Config::default().apply_file(&f).unwrap_err();
        assert!(e.contains("nested more than"), "{e}");
    }

    #[test]
    fn busy_reply_threshold_and_its_alias() {
        assert_eq!(Config::default().busy_reply_threshold, 5000);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("e.conf");
        std::fs::write(&f, "lua-time-limit 250\n").unwrap();
        let a = ServeArgs {
            config: Some(f.clone()),
            ..Default::default()
        };
        let c = Config::load(&a).unwrap();
        assert_eq!(c.busy_reply_threshold, 250);
        assert_eq!(c.get("busy-reply-threshold").unwrap(), "250");
        assert_eq!(c.get("lua-time-limit").unwrap(), "250");
        assert!(HONOURED.contains(&("busy-reply-threshold", true)));
    }

    #[test]
    fn busy_poll() {
        assert_eq!(Config::default().busy_poll_us, 50);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("e.conf");
        std::fs::write(&f, "busy-poll-us 0\n").unwrap();
        let mut a = ServeArgs {
            config: Some(f.clone()),
            ..Default::default()
        };
        let c = Config::load(&a).unwrap();
        assert_eq!(c.busy_poll_us, 0);
        assert_eq!(c.get("busy-poll-us").unwrap(), "0");
        a.busy_poll_us = Some(200);
        assert_eq!(Config::load(&a).unwrap().busy_poll_us, 200, "the flag wins");
        std::fs::write(&f, "busy-poll-us 10001\n").unwrap();
        a.busy_poll_us = None;
        let e = Config::load(&a).unwrap_err();
        assert!(e.contains("between 0 and 10000"), "{e}");
        assert!(
            HONOURED.contains(&("busy-poll-us", true)),
            "CONFIG SET changes it"
        );
    }
}
