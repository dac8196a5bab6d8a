//! # server — `ember serve`
//!
//! A Redis-protocol server on Ember's persistent stores: RESP2/RESP3 over TCP
//! (the [`proto`] codec), strings, counters, keyspace and expiry commands, the
//! server commands tools need (INFO, CONFIG, COMMAND, CLIENT), a Prometheus
//! endpoint, and instant restart: opening an existing heap runs the store's
//! recovery (milliseconds; Bullet also replays its unapplied log records into
//! DRAM) and no pass over the keys.
//!
//! - [`config`]: flags, redis.conf-syntax file, CONFIG parameters.
//! - [`store`]: opens the configured store on the heap file.
//! - [`keyspace`]: the persistent key/value format (database byte, type tag,
//!   expiry) and the operations commands are built from; [`counts`]: the
//!   per-database key counts they keep (DBSIZE without a scan).
//! - [`glob`]: Redis's glob patterns (KEYS, SCAN MATCH, CONFIG GET...),
//!   matched in polynomial time.
//! - [`server`]: what every thread shares, startup and shutdown; it starts
//!   the acceptor (`accept`: admission, the listen backlog) and the workers
//!   (`worker`: the event loop, reading, running requests, group commit,
//!   writing replies; `expire`: active expiry), each serving its connections
//!   (`client`: a connection's buffers, its codec and its reply sink;
//!   [`tls`]: its transport, plain TCP or TLS).
//!   `rlimit`: the open file limit; `embedded`: the command layer without a
//!   network, for crash tests.
//! - [`cmd`]: the command table and handlers; [`acl`]: ACL users, their
//!   rules and checks, ACL LOG; [`blocking`]: blocked clients (BLPOP...)
//!   and how writes wake them; [`pubsub`]: subscriptions and message
//!   delivery across workers; [`notify`]: keyspace notifications.
//! - [`memcache`]: memcached's text and meta protocol on the same keyspace
//!   (database 0): items, their flags and CAS, the commands, `stats`.
//! - [`evict`]: cache mode (maxmemory, eviction policies, access stamps).
//! - [`info`], [`metrics`], [`stats`]: observability; [`clock`]: the
//!   per-command clock.

// Unsafe code lives where the server calls the C library directly: socket
// and file-descriptor calls (`accept`, `rlimit`), the time-stamp counter
// (`clock`), the CPU a thread runs on (`commit`) and resource usage (`info`);
// `busy`, where a busy script's thread borrows its worker's connections
// through a pointer the worker lends for the command's duration; and
// `lua::bind`, where the `redis` API's functions borrow the running
// script's context through a pointer lent for the script's run.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod accept;
pub mod acl;
pub mod blocking;
#[allow(unsafe_code)]
mod busy;
mod client;
#[allow(unsafe_code)]
pub mod clock;
pub mod cluster;
pub mod cmd;
pub mod coll;
#[allow(unsafe_code)]
pub mod commit;
pub mod config;
pub mod counts;
mod embedded;
pub mod evict;
mod expire;
pub mod geohash;
pub mod glob;
pub mod hll;
pub mod housekeep;
#[allow(unsafe_code)]
pub mod info;
pub mod keyspace;
pub mod latency;
pub mod lua;
pub mod memcache;
pub mod metrics;
pub mod monitor;
pub mod notify;
pub mod pause;
pub mod pqsort;
pub mod pubsub;
pub mod rdb;
pub mod rdbfile;
#[allow(unsafe_code)]
mod rlimit;
pub mod server;
pub mod slowlog;
pub mod stats;
pub mod store;
pub mod tls;
pub mod tracking;
pub mod watch;
pub(crate) mod worker;

pub use config::{Config, ServeArgs};

/// `ember serve`: loads the configuration and serves until shut down.
pub fn serve(args: &ServeArgs) -> Result<(), String> {
    let cfg = Config::load(args)?;
    server::run(cfg)
}
