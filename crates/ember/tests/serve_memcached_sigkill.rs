//! SIGKILL tests of the memcached port: clients store, append to and delete
//! items (meta commands, which return each item's CAS) while the server is
//! killed with SIGKILL; after a restart every acknowledged item is there
//! with its value, client flags and CAS, no deleted item is back, and the
//! one request in flight per client either happened or did not.

mod serve_common;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serve_common::{free_port, Server};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An item as a client last saw it acknowledged: value, flags, CAS.
type Item = Option<(Vec<u8>, u32, u64)>;
/// What a request would make of its key: value and flags, or deleted.
type Effect = Option<(Vec<u8>, u32)>;

#[derive(Default, Debug)]
struct Known {
    acked: HashMap<String, Item>,
    /// The key of the request in flight when the server died, and what it
    /// would have made of it (the CAS of a store is unknown then: None).
    inflight: Option<(String, Effect)>,
    acked_ops: u64,
}

struct McConn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl McConn {
    fn open(port: u16) -> Option<McConn> {
        let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        let w = s.try_clone().ok()?;
        Some(McConn {
            r: BufReader::new(s),
            w,
        })
    }

    fn line(&mut self) -> Option<String> {
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(n) if n > 0 && l.ends_with("\r\n") => Some(l.trim_end().to_string()),
            _ => None,
        }
    }

    fn send(&mut self, req: &[u8]) -> Option<String> {
        self.w.write_all(req).ok()?;
        self.line()
    }

    /// `mg key v f c`: the item, or None on a miss.
    fn get(&mut self, key: &str) -> Option<Item> {
        let head = self.send(format!("mg {key} v f c\r\n").as_bytes())?;
        if head == "EN" {
            return Some(None);
        }
        let w: Vec<&str> = head.split(' ').collect();
        assert_eq!(w[0], "VA", "{head}");
        let len: usize = w[1].parse().unwrap();
        let flags: u32 = w[2].strip_prefix('f').unwrap().parse().unwrap();
        let cas: u64 = w[3].strip_prefix('c').unwrap().parse().unwrap();
        let mut v = vec![0u8; len + 2];
        self.r.read_exact(&mut v).ok()?;
        v.truncate(len);
        Some(Some((v, flags, cas)))
    }
}

/// The CAS in a meta reply (`HD c123`).
fn cas_of(reply: &str) -> u64 {
    reply
        .split(' ')
        .find_map(|w| w.strip_prefix('c'))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no CAS in {reply:?}"))
}

fn client_loop(port: u16, id: usize, seed: u64, stop: Arc<AtomicBool>) -> Known {
    let mut k = Known::default();
    let Some(mut c) = McConn::open(port) else {
        return k;
    };
    let mut rng = SmallRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        let key = format!("c{id}:k{}", rng.random_range(0..20));
        let cur = k.acked.get(&key).cloned().flatten();
        match rng.random_range(0..10) {
            0..=5 => {
                let v: Vec<u8> = format!(
                    "v{}-{}",
                    rng.random_range(0..1_000_000),
                    "x".repeat(rng.random_range(0..200))
                )
                .into_bytes();
                let flags = rng.random_range(0..u32::MAX);
                k.inflight = Some((key.clone(), Some((v.clone(), flags))));
                let mut req = format!("ms {key} {} F{flags} c\r\n", v.len()).into_bytes();
                req.extend_from_slice(&v);
                req.extend_from_slice(b"\r\n");
                let Some(r) = c.send(&req) else { break };
                assert!(r.starts_with("HD"), "{r}");
                k.acked.insert(key, Some((v, flags, cas_of(&r))));
            }
            6..=7 => {
                k.inflight = Some((key.clone(), None));
                let Some(r) = c.send(format!("md {key}\r\n").as_bytes()) else {
                    break;
                };
                assert!(r == "HD" || r == "NF", "{r}");
                k.acked.insert(key, None);
            }
            _ => {
                // Append: keeps the flags, makes a new CAS.
                let Some((v, flags, _)) = cur else { continue };
                let add = format!("+{}", rng.random_range(0..100)).into_bytes();
                let mut nv = v.clone();
                nv.extend_from_slice(&add);
                k.inflight = Some((key.clone(), Some((nv.clone(), flags))));
                let mut req = format!("ms {key} {} MA c\r\n", add.len()).into_bytes();
                req.extend_from_slice(&add);
                req.extend_from_slice(b"\r\n");
                let Some(r) = c.send(&req) else { break };
                assert!(r.starts_with("HD"), "{r}");
                k.acked.insert(key, Some((nv, flags, cas_of(&r))));
            }
        }
        k.inflight = None;
        k.acked_ops += 1;
    }
    k
}

fn check(port: u16, k: &Known) {
    let mut c = McConn::open(port).expect("connect after restart");
    for (key, want) in &k.acked {
        let got = c.get(key).expect("mg after restart");
        if let Some((ik, after)) = &k.inflight {
            if ik == key {
                let ok = got == *want
                    || match (after, &got) {
                        (None, None) => true,
                        (Some((v, f)), Some((gv, gf, _))) => v == gv && f == gf,
                        _ => false,
                    };
                assert!(
                    ok,
                    "{key}: got {got:?}, acked {want:?}, in flight {after:?}"
                );
                continue;
            }
        }
        assert_eq!(&got, want, "{key} after restart");
    }
    // A key first written by the request in flight.
    if let Some((ik, after)) = &k.inflight {
        if !k.acked.contains_key(ik) {
            let got = c.get(ik).expect("mg after restart");
            let ok = got.is_none()
                || matches!((after, &got), (Some((v, f)), Some((gv, gf, _))) if v == gv && f == gf);
            assert!(ok, "{ik}: got {got:?}, in flight {after:?}");
        }
    }
}

fn kill_cycles(extra: &[&str], cycles: usize, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mport = free_port();
    let ps = mport.to_string();
    let mut args = vec!["--memcached-port", ps.as_str()];
    args.extend_from_slice(extra);
    let mut srv = Server::start(dir.path(), &args);
    let mut rng = SmallRng::seed_from_u64(seed);
    for cycle in 0..cycles {
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..4)
            .map(|id| {
                let stop = stop.clone();
                let s = seed * 100 + cycle as u64 * 10 + id as u64;
                std::thread::spawn(move || client_loop(mport, id, s, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(200..600)));
        srv.kill9();
        stop.store(true, Ordering::Relaxed);
        let known: Vec<Known> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let ops: u64 = known.iter().map(|k| k.acked_ops).sum();
        assert!(
            ops > 20,
            "cycle {cycle}: only {ops} acknowledged operations"
        );
        srv.restart();
        for k in &known {
            check(mport, k);
        }
        // The next cycle's clients start over on their keys.
        let mut c = McConn::open(mport).unwrap();
        assert_eq!(c.send(b"flush_all\r\n").as_deref(), Some("OK"));
    }
}

#[test]
fn memcached_sigkill_bullet_pmem() {
    kill_cycles(&[], 3, 1);
}

#[test]
fn memcached_sigkill_bullet_msync() {
    kill_cycles(&["--engine", "bullet", "--durability", "msync"], 2, 2);
}

#[test]
fn memcached_sigkill_direct() {
    kill_cycles(&["--engine", "direct"], 2, 3);
}
