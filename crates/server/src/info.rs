//! INFO: Redis's sections and field names, plus an `ember` section.

use crate::cmd::{Ctx, TABLE};
use crate::server::Shared;
use std::fmt::Write;
use std::sync::atomic::Ordering;

/// How writes are made durable, in words (logs, INFO).
pub fn strategy_note(sh: &Shared) -> String {
    match sh.store.heap() {
        None => "no persistence: DRAM only, NOT durable".into(),
        Some(h) => {
            let s = h.region().strategy();
            if s.power_safe_on_ordinary_file() {
                format!("{}: power-safe on an ordinary file", s.name())
            } else {
                format!(
                    "{}: survives SIGKILL, not an OS crash, on an ordinary file",
                    s.name()
                )
            }
        }
    }
}

fn rusage() -> (f64, f64) {
    // SAFETY: all-zero bytes are a valid `rusage` (integers and `timeval`s of
    // integers); getrusage(RUSAGE_SELF, ..) writes one `rusage` into `r`,
    // exclusively borrowed for the call, and keeps no pointer to it.
    unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut r) != 0 {
            return (0.0, 0.0);
        }
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        (t(r.ru_stime), t(r.ru_utime))
    }
}

pub(crate) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|p| p * 4096)
        .unwrap_or(0)
}

/// Two parts of the resident set, from `/proc/self/status`'s counters
/// (no walk of the page tables, which `/proc/self/smaps` would take under
/// the process's mmap lock, for milliseconds on a heap of many GB): pages
/// of file mappings (`RssFile` + `RssShmem`: the heap's mapped pages,
/// Bullet's logs among them, and the executable's few MB), and anonymous
/// memory (`RssAnon`: DRAM, the Bullet frontend's table among it). They add
/// up to `used_memory_rss`.
pub(crate) fn rss_parts() -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (0, 0);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).map(kb_field))
            .unwrap_or(0)
    };
    (field("RssFile:") + field("RssShmem:"), field("RssAnon:"))
}

/// "   1234 kB" as bytes.
fn kb_field(s: &str) -> u64 {
    s.split_whitespace()
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

fn human(n: u64) -> String {
    let f = n as f64;
    if f >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2}G", f / (1024.0 * 1024.0 * 1024.0))
    } else if f >= 1024.0 * 1024.0 {
        format!("{:.2}M", f / (1024.0 * 1024.0))
    } else if f >= 1024.0 {
        format!("{:.2}K", f / 1024.0)
    } else {
        format!("{n}B")
    }
}

const DEFAULT: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "cluster",
    "keyspace",
    "ember",
];

/// Renders the requested sections (none = Redis's default set plus `ember`).
pub fn render(ctx: &mut Ctx, want: &[String]) -> Result<String, crate::keyspace::KsError> {
    let all = want.iter().any(|s| s == "all" || s == "everything");
    let default = want.is_empty() || want.iter().any(|s| s == "default");
    let on =
        |name: &str| all || (default && DEFAULT.contains(&name)) || want.iter().any(|s| s == name);
    let sh = ctx.sh;
    let cfg = sh.cfg().clone();
    let mut o = String::new();
    let uptime = sh.started.elapsed().as_secs();
    let tot = sh.stats.totals();
    if on("server") {
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let _ = write!(
            o,
            "# Server\r\nredis_version:{}\r\nember_version:{}\r\nredis_git_sha1:00000000\r\nredis_git_dirty:0\r\nredis_build_id:0\r\nredis_mode:standalone\r\nos:{} {}\r\narch_bits:64\r\nmultiplexing_api:epoll\r\nprocess_id:{}\r\nrun_id:{}\r\ntcp_port:{}\r\nserver_time_usec:{}\r\nuptime_in_seconds:{}\r\nuptime_in_days:{}\r\nhz:{}\r\nexecutable:{}\r\nconfig_file:{}\r\nio_threads_active:{}\r\n\r\n",
            crate::cmd::REDIS_COMPAT_VERSION,
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH,
            std::process::id(),
            sh.run_id,
            sh.tcp_port,
            now_us,
            uptime,
            uptime / 86400,
            cfg.hz,
            std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
            cfg.config_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            cfg.threads,
        );
    }
    if on("clients") {
        let _ = write!(
            o,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:{}\r\ntracking_clients:{}\r\n\r\n",
            sh.connected.load(Ordering::Relaxed),
            cfg.maxclients,
            // Those waiting in a blocking command sent to the cluster's
            // leader count too.
            sh.blocking.blocked_clients()
                + sh.cluster.get().map_or(0, |cl| {
                    cl.fwd_blocked.lock().unwrap_or_else(|p| p.into_inner()).len()
                }),
            sh.tracking.counts().0
        );
    }
    let heap = sh.store.heap();
    if on("memory") {
        // One read of the counters, so that the parts add up to the whole.
        let (rss_heap, rss_anon) = rss_parts();
        let rss = match rss_heap + rss_anon {
            0 => rss_bytes(),
            n => n,
        };
        let used = heap.map(heap_used).unwrap_or(rss);
        let _ = write!(
            o,
            "# Memory\r\nused_memory:{used}\r\nused_memory_human:{}\r\nused_memory_rss:{rss}\r\nused_memory_rss_human:{}\r\nused_memory_rss_heap:{rss_heap}\r\nused_memory_rss_dram:{rss_anon}\r\nmaxmemory:{}\r\nmaxmemory_human:{}\r\nmaxmemory_policy:{}\r\nmem_allocator:ember-heap\r\nlazyfree_pending_objects:{}\r\nlazyfreed_objects:{}\r\n\r\n",
            human(used),
            human(rss),
            cfg.maxmemory,
            human(cfg.maxmemory),
            cfg.maxmemory_policy.name(),
            sh.hk.pending(),
            sh.hk.freed.load(Ordering::Relaxed),
        );
    }
    if on("persistence") {
        let _ = write!(
            o,
            "# Persistence\r\nloading:0\r\nasync_loading:0\r\nrdb_changes_since_last_save:0\r\nrdb_bgsave_in_progress:0\r\nrdb_last_save_time:{}\r\nrdb_last_bgsave_status:ok\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\naof_last_write_status:ok\r\npersistence_model:{}\r\n\r\n",
            ctx.now / 1000,
            if heap.is_some() { "the heap is the image (every acknowledged write is in it)" } else { "none (volatile engine)" },
        );
    }
    if on("stats") {
        let denied = sh.acl.denied();
        let ps = sh.pubsub.counts();
        let tr = sh.tracking.counts();
        let _ = write!(
            o,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ntotal_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nevicted_keys:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\npubsub_channels:{}\r\npubsub_patterns:{}\r\npubsubshard_channels:{}\r\ntracking_total_keys:{}\r\ntracking_total_items:{}\r\ntracking_total_prefixes:{}\r\ntotal_error_replies:{}\r\nacl_access_denied_auth:{}\r\nacl_access_denied_cmd:{}\r\nacl_access_denied_key:{}\r\nacl_access_denied_channel:{}\r\nclient_output_buffer_limit_disconnections:{}\r\n\r\n",
            sh.stats.total_connections.load(Ordering::Relaxed),
            tot.commands,
            tot.net_in,
            tot.net_out,
            sh.stats.rejected.load(Ordering::Relaxed),
            tot.expired_keys,
            sh.evict.evicted(),
            tot.hits,
            tot.misses,
            ps.0,
            ps.1,
            ps.2,
            tr.1,
            tr.2,
            tr.3,
            tot.errors,
            denied[0],
            denied[1],
            denied[2],
            denied[3],
            sh.stats.obuf_limit_disconnections.load(Ordering::Relaxed),
        );
    }
    if on("replication") {
        if let Some(sec) = crate::cluster::info_section(sh) {
            o.push_str(&sec);
        } else {
            let _ = write!(
            o,
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\nmaster_replid:{}\r\nmaster_repl_offset:0\r\n\r\n",
            sh.run_id
        );
        }
    }
    if on("cpu") {
        let (sys, user) = rusage();
        let _ = write!(
            o,
            "# CPU\r\nused_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\n\r\n"
        );
    }
    if on("commandstats") {
        o.push_str("# Commandstats\r\n");
        for (i, s) in TABLE.iter().enumerate() {
            let (calls, usec, failed, rejected) = tot.per_cmd[i];
            if calls + rejected == 0 {
                continue;
            }
            let per = if calls > 0 {
                usec as f64 / calls as f64
            } else {
                0.0
            };
            let _ = write!(
                o,
                "cmdstat_{}:calls={calls},usec={usec},usec_per_call={per:.2},rejected_calls={rejected},failed_calls={failed}\r\n",
                s.name
            );
        }
        o.push_str("\r\n");
    }
    if on("cluster") {
        o.push_str("# Cluster\r\ncluster_enabled:0\r\n\r\n");
    }
    if on("keyspace") {
        o.push_str("# Keyspace\r\n");
        for db in 0..cfg.databases.min(crate::counts::DBS as u64) {
            let (keys, expires) = crate::counts::db_counts(ctx, db as u8)?;
            if keys > 0 {
                let avg = if expires == 0 {
                    0
                } else {
                    ctx.sh.counts.avg_ttl(db as u8)
                };
                let _ = write!(o, "db{db}:keys={keys},expires={expires},avg_ttl={avg}\r\n");
            }
        }
        o.push_str("\r\n");
    }
    if on("ember") {
        let st = sh.store.stats();
        let s = &sh.startup;
        let _ = write!(
            o,
            "# Ember\r\nengine:{}\r\nengine_durable:{}\r\ndurability:{}\r\npersistence_strategy:{}\r\n",
            sh.store.name(),
            if heap.is_some() { "yes" } else { "no (volatile engine: for comparison only, nothing survives a restart)" },
            if heap.is_some() { cfg.durability.name() } else { "none" },
            strategy_note(sh),
        );
        if let Some(h) = heap {
            let ps = h.region().persist_stats();
            let used = heap_used(h);
            let _ = write!(
                o,
                "fence_ns_emulated:{}\r\nheap_path:{}\r\nheap_size:{}\r\nheap_used:{used}\r\nheap_max_size:{}\r\nheap_full_keys:{}\r\nheap_oom_errors:{}\r\nheap_full_reason:{}\r\nflushes:{}\r\nfences:{}\r\nmsyncs:{}\r\nwrites_through:{}\r\n",
                h.region().fence_ns(),
                cfg.heap.display(),
                h.region().size(),
                cfg.heap_max_size,
                st.heap_full_keys,
                crate::keyspace::OOM_ERRORS.load(std::sync::atomic::Ordering::Relaxed),
                oom_reason(),
                ps.flushes,
                ps.fences,
                ps.msyncs,
                ps.writes_through,
            );
        }
        let _ = write!(
            o,
            "commit_pipeline:{}\r\ngroup_commit_batches:{}\r\ngroup_commit_requests:{}\r\ngroup_commits_pipelined:{}\r\n",
            if cfg.commit_pipeline { "yes" } else { "no" },
            tot.group_commit_batches,
            tot.group_commit_requests,
            tot.commits_pipelined
        );
        let _ = write!(
            o,
            "store_keys_estimate:{}\r\nfrontend_entries:{}\r\nfrontend_max_keys:{}\r\nfrontend_evictions:{}\r\nlog_occupancy:{:.4}\r\ngleaners:{}\r\nrecords_appended:{}\r\nrecords_applied:{}\r\nrecords_collapsed:{}\r\nlog_bytes_released:{}\r\nbackend_loads:{}\r\nlog_full_waits:{}\r\nepochs:{}\r\ngleaner_roles_lowered:{}\r\nlast_start_clean:{}\r\nlast_start_ms:{:.3}\r\nlast_start_log_records:{}\r\nlast_start_log_bytes:{}\r\nlast_start_log_replayed:{}\r\nlast_start_leaked_freed:{}\r\nignored_config:{}\r\n\r\n",
            st.keys,
            st.frontend_entries,
            cfg.frontend_max_keys,
            st.evictions,
            st.log_occupancy,
            st.gleaners,
            st.records_appended,
            st.records_applied,
            st.records_collapsed,
            st.log_bytes_released,
            st.backend_loads,
            st.log_full_waits,
            st.epochs,
            st.gleaner_roles_lowered,
            if s.was_clean { 1 } else { 0 },
            s.open_ms,
            s.log_records,
            s.log_bytes,
            s.log_replayed,
            s.leaked_freed,
            cfg.no_effect.keys().cloned().collect::<Vec<_>>().join(","),
        );
    }
    if o.ends_with("\r\n\r\n") {
        o.truncate(o.len() - 2);
    }
    Ok(o)
}

/// The last write refusal's reason for lack of room, on one line ("" when
/// none yet).
fn oom_reason() -> String {
    crate::keyspace::OOM_REASON
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .replace(['\r', '\n'], " ")
}

/// Bytes of heap pages in use (slab pages and runs; a slab page with one live
/// block counts whole): the chunks the allocator has scanned less their free
/// pages. Chunks not scanned yet hold nothing.
pub(crate) fn heap_used(h: &pmem::Heap) -> u64 {
    let s = h.alloc_stats();
    (s.chunks_scanned * h.region().geometry().chunk_size())
        .saturating_sub(s.free_pages_scanned * pmem::layout::PAGE)
}
