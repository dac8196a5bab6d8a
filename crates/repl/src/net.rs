//! The transport between nodes: Raft messages over TCP.
//!
//! A frame is a 4-byte little-endian length and a protobuf-encoded
//! `eraftpb::Message`. Each peer has one sender thread that owns the
//! outgoing connection: it connects when it has something to send, writes
//! every queued message in one buffered write, and on any error drops the
//! connection and the messages (Raft resends what matters). Incoming
//! connections each get a reader thread that hands decoded messages to the
//! node's inbox. Plain threads and blocking sockets: a node has a handful of
//! peers, and the raft-rs state machine is synchronous. A message for a node
//! whose address is not known here goes to every peer, which forwards it
//! ([`Transport::send`]).

use protobuf::Message as _;
use raft::eraftpb::Message;
use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

/// The largest frame accepted (a batch of entries; raft-rs keeps messages
/// near `max_size_per_msg`).
const MAX_FRAME: usize = 256 << 20;

/// Where the raft thread sends its messages: [`Transport`] in a server; a
/// simulated network in the replication simulation (tests), which decides
/// when each message arrives, if ever.
pub trait Net {
    /// Queues `m` for its recipient. A recipient whose address is not
    /// known here gets it through every peer that is, which forward it
    /// (see [`Transport::send`]).
    fn send(&mut self, m: Message);
    /// Queues `m`, a message another node relayed through this one, for
    /// its recipient if its address is known here (never relayed again).
    fn forward(&mut self, m: Message);
    /// Starts sending to peer `id` at `addr` (a member added; a new
    /// address replaces the old).
    fn add(&mut self, id: u64, addr: &str);
    /// Stops sending to peer `id` (a member removed).
    fn remove(&mut self, id: u64);
}

/// Outgoing queues, one per peer.
pub struct Transport {
    peers: HashMap<u64, Sender<Message>>,
    stop: Arc<AtomicBool>,
}

impl Transport {
    /// Starts a sender thread per peer (`id` → raft address).
    pub fn start(peers: &[(u64, String)], stop: Arc<AtomicBool>) -> Transport {
        let mut t = Transport {
            peers: HashMap::new(),
            stop,
        };
        for (id, addr) in peers {
            t.add(*id, addr);
        }
        t
    }

    /// Starts sending to peer `id` at `addr` (a member added; a new
    /// address replaces the old).
    pub fn add(&mut self, id: u64, addr: &str) {
        let (tx, rx) = std::sync::mpsc::channel();
        let addr = addr.to_string();
        let stop = self.stop.clone();
        std::thread::Builder::new()
            .name(format!("raft-send-{id}"))
            .spawn(move || send_loop(&addr, &rx, &stop))
            .expect("spawn a raft sender thread");
        self.peers.insert(id, tx);
    }

    /// Stops sending to peer `id` (a member removed): its sender thread
    /// ends when it sees its queue closed.
    pub fn remove(&mut self, id: u64) {
        self.peers.remove(&id);
    }

    /// Queues `m` for its recipient. A recipient with no address here
    /// gets it through every peer, which forward it to its recipient: a
    /// member whose configuration predates the addition of the node that
    /// now leads has no address for it and could not otherwise answer it,
    /// so it would never get the entries (or the snapshot) that bring the
    /// address, and would stay behind for good.
    pub fn send(&self, m: Message) {
        if let Some(tx) = self.peers.get(&m.to) {
            let _ = tx.send(m);
            return;
        }
        for tx in self.peers.values() {
            let _ = tx.send(m.clone());
        }
    }

    /// Queues `m` for its recipient if it is a peer (a relayed message).
    pub fn forward(&self, m: Message) {
        if let Some(tx) = self.peers.get(&m.to) {
            let _ = tx.send(m);
        }
    }
}

impl Net for Transport {
    fn send(&mut self, m: Message) {
        Transport::send(self, m);
    }
    fn forward(&mut self, m: Message) {
        Transport::forward(self, m);
    }
    fn add(&mut self, id: u64, addr: &str) {
        Transport::add(self, id, addr);
    }
    fn remove(&mut self, id: u64) {
        Transport::remove(self, id);
    }
}

fn resolve(addr: &str) -> Option<SocketAddr> {
    addr.to_socket_addrs().ok()?.next()
}

fn send_loop(addr: &str, rx: &Receiver<Message>, stop: &AtomicBool) {
    let mut conn: Option<BufWriter<TcpStream>> = None;
    let mut buf = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let first = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if conn.is_none() {
            conn = resolve(addr).and_then(|a| {
                let s = TcpStream::connect_timeout(&a, Duration::from_millis(200)).ok()?;
                let _ = s.set_nodelay(true);
                let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                Some(BufWriter::with_capacity(256 << 10, s))
            });
        }
        let Some(w) = conn.as_mut() else {
            // Unreachable: drop what is queued; Raft retries.
            while rx.try_recv().is_ok() {}
            continue;
        };
        let mut ok = true;
        for m in std::iter::once(first).chain(rx.try_iter()) {
            buf.clear();
            if m.write_to_vec(&mut buf).is_err() {
                continue;
            }
            if w.write_all(&(buf.len() as u32).to_le_bytes()).is_err() || w.write_all(&buf).is_err()
            {
                ok = false;
                break;
            }
        }
        if !ok || w.flush().is_err() {
            conn = None;
        }
    }
}

/// Accepts peers' connections on `listener` and hands every message read to
/// `inbox` until `stop` is set.
pub fn serve(listener: TcpListener, inbox: Sender<crate::node::Event>, stop: Arc<AtomicBool>) {
    let _ = listener.set_nonblocking(true);
    std::thread::Builder::new()
        .name("raft-accept".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let inbox = inbox.clone();
                        let stop = stop.clone();
                        let _ = std::thread::Builder::new()
                            .name("raft-recv".into())
                            .spawn(move || read_loop(s, &inbox, &stop));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
        .expect("spawn the raft accept thread");
}

fn read_loop(s: TcpStream, inbox: &Sender<crate::node::Event>, stop: &AtomicBool) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut r = std::io::BufReader::with_capacity(256 << 10, s);
    let mut len = [0u8; 4];
    let mut buf = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match read_full(&mut r, &mut len, stop) {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
        let n = u32::from_le_bytes(len) as usize;
        if n > MAX_FRAME {
            return;
        }
        buf.resize(n, 0);
        if !matches!(read_full(&mut r, &mut buf, stop), Ok(true)) {
            return;
        }
        let Ok(m) = Message::parse_from_bytes(&buf) else {
            return;
        };
        if inbox
            .send(crate::node::Event::Message(Box::new(m)))
            .is_err()
        {
            return;
        }
    }
}

/// Fills `buf`, riding out read timeouts (they only let `stop` be seen);
/// false at a clean end of stream before the first byte.
fn read_full(r: &mut impl Read, buf: &mut [u8], stop: &AtomicBool) -> std::io::Result<bool> {
    let mut at = 0;
    while at < buf.len() {
        match r.read(&mut buf[at..]) {
            Ok(0) if at == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
