//! The transport between nodes: Raft messages over TCP, and snapshots'
//! bytes.
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
//!
//! When an incoming connection ends, its reader tells the node whose
//! messages came over it ([`Event::PeerGone`]); the node may then
//! [`Net::probe`] a peer: a refused connection to its Raft address
//! ([`Event::PeerDown`]) says its process is gone (see the node's
//! `leader_down`).
//!
//! # Snapshots: pulled in chunks
//! A `MsgSnapshot` carries only a descriptor ([`SnapDesc`]); the receiver
//! pulls the bytes from the node named in it ([`fetch_snapshot`]): it
//! connects to that node's Raft port and sends, instead of a frame's
//! length, [`FETCH`] and the request (its id, the snapshot's index, length
//! and CRC-32: 28 bytes). The server ([`serve`], on the same port) answers
//! a `u32 LE` status (0: on offer; 1: not, and closes), then the bytes in
//! chunks, each a `u32 LE` length (1 ..= the chunk size, `NodeConfig::
//! snapshot_chunk`, 4 MiB by default, well under [`MAX_FRAME`]) and that
//! many bytes, until the length is sent; the receiver writes each chunk to
//! its file as it comes ([`SnapSink`]), checks the length and CRC-32, and
//! answers one byte (1) once the file is whole and checked. Either side
//! gives up when the other is silent for [`IDLE`]. Memory on either side is
//! one chunk. Pulled, not pushed before the `MsgSnapshot` on the sender's
//! connection: that connection (one per peer, in order) would be held for
//! the whole transfer, with the heartbeats behind it; a `MsgSnapshot`
//! relayed through a peer (a leader with no address for the member) would
//! need its chunks relayed too; and the receiver decides whether it needs
//! the bytes at all (raft-rs would not restore a snapshot it is past) and
//! takes one at a time.

use crate::node::Event;
use crate::storage::{open_offered, Shelf, SnapDesc, SnapSink};
use protobuf::Message as _;
use raft::eraftpb::Message;
use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The largest frame accepted (a batch of entries; raft-rs keeps messages
/// near `max_size_per_msg`; a snapshot's chunk).
pub const MAX_FRAME: usize = 256 << 20;

/// A snapshot's chunk size unless configured (`NodeConfig::snapshot_chunk`).
pub const DEFAULT_SNAPSHOT_CHUNK: usize = 4 << 20;

/// Sent in place of a frame's length: a snapshot fetch request follows.
pub const FETCH: u32 = 0xFFFF_FF01;

/// How long either end of a snapshot transfer waits for the other.
pub const IDLE: Duration = Duration::from_secs(30);

/// A snapshot's bytes to fetch: asked by the raft thread, answered with
/// [`Event::Fetched`] in its inbox.
#[derive(Clone, Debug)]
pub struct Fetch {
    /// The node fetching (the server reports the transfer under it).
    pub me: u64,
    pub desc: SnapDesc,
    /// Where the bytes are written as they come, and where the file goes
    /// once whole and checked.
    pub part: PathBuf,
    pub dest: PathBuf,
}

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
    /// Starts fetching a snapshot's bytes from the node its descriptor
    /// names; [`Event::Fetched`] arrives in the node's inbox when it ends.
    fn fetch(&mut self, f: Fetch);
    /// Checks whether peer `id`'s process is gone: [`Event::PeerDown`]
    /// arrives in the node's inbox if its Raft address refuses a
    /// connection (nothing listens there: the process ended and the host
    /// is up); nothing otherwise (it answers, or does not in time).
    fn probe(&mut self, id: u64);
}

/// How long a [`Net::probe`]'s connection attempt may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(100);

/// A probe's attempts, [`PROBE_GAP`] apart: a process that is ending may
/// close its connections a moment before its listener (a server stopping
/// in-process does; SIGKILL closes them all at once).
pub const PROBE_ATTEMPTS: u32 = 20;
pub const PROBE_GAP: Duration = Duration::from_millis(5);

/// Outgoing queues, one per peer.
pub struct Transport {
    peers: HashMap<u64, Sender<Message>>,
    /// Each peer's Raft address (for probes).
    addrs: HashMap<u64, String>,
    stop: Arc<AtomicBool>,
    /// The node's inbox (fetches report there).
    inbox: Sender<Event>,
}

impl Transport {
    /// Starts a sender thread per peer (`id` → raft address).
    pub fn start(
        peers: &[(u64, String)],
        stop: Arc<AtomicBool>,
        inbox: Sender<Event>,
    ) -> Transport {
        let mut t = Transport {
            peers: HashMap::new(),
            addrs: HashMap::new(),
            stop,
            inbox,
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
        self.addrs.insert(id, addr.clone());
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
        self.addrs.remove(&id);
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
    fn fetch(&mut self, f: Fetch) {
        let (stop, inbox) = (self.stop.clone(), self.inbox.clone());
        let desc = f.desc.clone();
        let spawned = std::thread::Builder::new()
            .name("raft-fetch".into())
            .spawn(move || {
                let ok = fetch_snapshot(&f, &stop);
                let _ = inbox.send(Event::Fetched { desc: f.desc, ok });
            });
        if let Err(e) = spawned {
            let _ = self.inbox.send(Event::Fetched {
                desc,
                ok: Err(e.to_string()),
            });
        }
    }
    fn probe(&mut self, id: u64) {
        let Some(addr) = self.addrs.get(&id).cloned() else {
            return;
        };
        let inbox = self.inbox.clone();
        let _ = std::thread::Builder::new()
            .name("raft-probe".into())
            .spawn(move || {
                for k in 0..PROBE_ATTEMPTS {
                    if k > 0 {
                        std::thread::sleep(PROBE_GAP);
                    }
                    if refused(&addr) {
                        let _ = inbox.send(Event::PeerDown(id));
                        return;
                    }
                }
            });
    }
}

/// True when `addr` refuses a connection at once: nothing listens there
/// (the process ended; its host answers). False when it accepts, or does
/// not answer within [`PROBE_TIMEOUT`] (a host or network down: the
/// election timeout covers that), or the name does not resolve.
fn refused(addr: &str) -> bool {
    let Some(a) = resolve(addr) else {
        return false;
    };
    matches!(
        TcpStream::connect_timeout(&a, PROBE_TIMEOUT),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
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
        if conn.as_ref().is_some_and(|w| closed_by_peer(w.get_ref())) {
            // The peer's process ended (or restarted) since the last write:
            // a write now would still succeed once, into a connection
            // nobody reads, and the message would be lost (an election's
            // vote request, which raft-rs does not resend before the next
            // election timeout). Connect again instead.
            conn = None;
        }
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

/// Whether the peer closed `s`, an outgoing connection (the peer never
/// writes on it, so anything readable is its end or an error).
fn closed_by_peer(s: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = 0u8;
    // SAFETY: a one-byte buffer that outlives the call; the descriptor is
    // the stream's, open while it is borrowed. MSG_PEEK leaves the byte.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            (&mut b as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => {
            let e = std::io::Error::last_os_error();
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            )
        }
    }
}

/// Accepts peers' connections on `listener` and hands every message read to
/// `inbox` until `stop` is set; serves the bytes of the snapshot on
/// `shelf` to the nodes that fetch them, in chunks of `chunk` bytes.
pub fn serve(
    listener: TcpListener,
    inbox: Sender<Event>,
    stop: Arc<AtomicBool>,
    shelf: Shelf,
    chunk: usize,
) {
    let _ = listener.set_nonblocking(true);
    let chunk = chunk.clamp(1, MAX_FRAME);
    std::thread::Builder::new()
        .name("raft-accept".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // A connection is taken as it arrives (an election's first
                // messages between two followers open new connections: a
                // polling sleep here added up to its length to each), and
                // `stop` is seen within the wait.
                if !readable(&listener, ACCEPT_WAIT) {
                    continue;
                }
                match listener.accept() {
                    Ok((s, _)) => {
                        let inbox = inbox.clone();
                        let stop = stop.clone();
                        let shelf = shelf.clone();
                        let _ = std::thread::Builder::new()
                            .name("raft-recv".into())
                            .spawn(move || read_loop(s, &inbox, &stop, &shelf, chunk));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    // Out of descriptors, say: not a busy loop.
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
        .expect("spawn the raft accept thread");
}

/// How long the accept thread waits for a connection before it looks at
/// `stop` again.
const ACCEPT_WAIT: Duration = Duration::from_millis(100);

/// Waits up to `wait` for `listener` to have a connection to accept (or an
/// error to report); false on timeout.
fn readable(listener: &TcpListener, wait: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the call's duration; the descriptor is
    // the listener's, open while it is borrowed.
    let n = unsafe { libc::poll(&mut p, 1, wait.as_millis() as libc::c_int) };
    n > 0
}

/// Reads a peer's connection until it ends; then, unless the node is
/// stopping, tells the node whose messages came over it
/// ([`Event::PeerGone`]): a peer's sender keeps its connection while it
/// runs, so its end is the first sign of the peer's process ending.
fn read_loop(s: TcpStream, inbox: &Sender<Event>, stop: &AtomicBool, shelf: &Shelf, chunk: usize) {
    let mut from = Vec::new();
    read_messages(s, inbox, stop, shelf, chunk, &mut from);
    if !from.is_empty() && !stop.load(Ordering::Relaxed) {
        let _ = inbox.send(Event::PeerGone(from));
    }
}

/// The senders seen on one connection: its peer's id, and those of
/// messages it relayed (a few at most).
const MAX_SENDERS: usize = 8;

fn read_messages(
    s: TcpStream,
    inbox: &Sender<Event>,
    stop: &AtomicBool,
    shelf: &Shelf,
    chunk: usize,
    from: &mut Vec<u64>,
) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut r = std::io::BufReader::with_capacity(256 << 10, s);
    let mut len = [0u8; 4];
    let mut buf = Vec::new();
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        match read_full(&mut r, &mut len, stop) {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
        if std::mem::take(&mut first) && u32::from_le_bytes(len) == FETCH {
            serve_fetch(r, inbox, stop, shelf, chunk);
            return;
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
        if m.from != 0 && !from.contains(&m.from) && from.len() < MAX_SENDERS {
            from.push(m.from);
        }
        if inbox.send(Event::Message(Box::new(m))).is_err() {
            return;
        }
    }
}

/// Serves one fetch request (its [`FETCH`] read): the snapshot's bytes in
/// chunks, if it is the one on offer. The raft thread hears of the
/// transfer ([`Event::Transfer`]): when it starts and how it ended (true
/// once the receiver has the whole file checked).
fn serve_fetch(
    mut r: std::io::BufReader<TcpStream>,
    inbox: &Sender<Event>,
    stop: &AtomicBool,
    shelf: &Shelf,
    chunk: usize,
) {
    let mut req = [0u8; 28];
    if !matches!(read_full(&mut r, &mut req, stop), Ok(true)) {
        return;
    }
    let word = |at: usize| u64::from_le_bytes(req[at..at + 8].try_into().unwrap_or_default());
    let (to, index, len) = (word(0), word(8), word(16));
    let crc = u32::from_le_bytes(req[24..28].try_into().unwrap_or_default());
    let mut s = r.into_inner();
    let _ = s.set_nodelay(false);
    let _ = s.set_write_timeout(Some(IDLE));
    let Some(file) = open_offered(shelf, index, len, crc) else {
        let _ = s.write_all(&1u32.to_le_bytes());
        return;
    };
    if s.write_all(&0u32.to_le_bytes()).is_err() {
        return;
    }
    let _ = inbox.send(Event::Transfer { to, done: None });
    let ok = send_chunks(&mut s, file, len, chunk, stop).is_ok();
    let _ = inbox.send(Event::Transfer { to, done: Some(ok) });
}

/// Writes `len` bytes of `file` to `s` in chunks, then waits for the
/// receiver's byte saying it has them all, checked.
fn send_chunks(
    s: &mut TcpStream,
    mut file: std::fs::File,
    len: u64,
    chunk: usize,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; chunk.min(usize::try_from(len).unwrap_or(usize::MAX)).max(1)];
    let mut left = len;
    while left > 0 {
        if stop.load(Ordering::Relaxed) {
            return Err(std::io::ErrorKind::Interrupted.into());
        }
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        file.read_exact(&mut buf[..n])?;
        s.write_all(&(n as u32).to_le_bytes())?;
        s.write_all(&buf[..n])?;
        left -= n as u64;
    }
    s.flush()?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut ack = [0u8; 1];
    read_idle(s, &mut ack, stop)?;
    if ack[0] != 1 {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    Ok(())
}

/// Fetches the bytes of snapshot `f.desc` from the node it names into
/// `f.part`, checks them and moves the file to `f.dest` (see the module
/// docs). A cut transfer leaves no file behind.
pub fn fetch_snapshot(f: &Fetch, stop: &AtomicBool) -> Result<(), String> {
    let addr = resolve(&f.desc.source).ok_or_else(|| format!("no address {}", f.desc.source))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("{}: {e}", f.desc.source))?;
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = s.set_write_timeout(Some(IDLE));
    let mut req = Vec::with_capacity(32);
    req.extend_from_slice(&FETCH.to_le_bytes());
    req.extend_from_slice(&f.me.to_le_bytes());
    req.extend_from_slice(&f.desc.index.to_le_bytes());
    req.extend_from_slice(&f.desc.len.to_le_bytes());
    req.extend_from_slice(&f.desc.crc.to_le_bytes());
    s.write_all(&req).map_err(|e| e.to_string())?;
    let mut r = std::io::BufReader::with_capacity(256 << 10, s);
    let mut word = [0u8; 4];
    read_idle(&mut r, &mut word, stop).map_err(|e| e.to_string())?;
    if u32::from_le_bytes(word) != 0 {
        return Err("the snapshot is no longer on offer".into());
    }
    let mut sink = SnapSink::create(&f.part, &f.desc).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    while sink.received() < f.desc.len {
        read_idle(&mut r, &mut word, stop).map_err(|e| e.to_string())?;
        let n = u32::from_le_bytes(word) as usize;
        if n == 0 || n > MAX_FRAME {
            return Err(format!("a chunk of {n} bytes"));
        }
        buf.resize(n, 0);
        read_idle(&mut r, &mut buf, stop).map_err(|e| e.to_string())?;
        sink.write(&buf)?;
    }
    sink.finish(&f.dest)?;
    let mut s = r.into_inner();
    let _ = s.write_all(&[1]);
    Ok(())
}

/// Fills `buf`; an error at the end of the stream, when `stop` is set, or
/// after [`IDLE`] without a byte (the socket's read timeout is short).
fn read_idle(r: &mut impl Read, buf: &mut [u8], stop: &AtomicBool) -> std::io::Result<()> {
    match fill(r, buf, stop, Some(IDLE))? {
        true => Ok(()),
        false => Err(std::io::ErrorKind::UnexpectedEof.into()),
    }
}

/// Fills `buf`, riding out read timeouts (they only let `stop` be seen);
/// false at a clean end of stream before the first byte.
fn read_full(r: &mut impl Read, buf: &mut [u8], stop: &AtomicBool) -> std::io::Result<bool> {
    fill(r, buf, stop, None)
}

/// Fills `buf`, riding out the socket's short read timeouts: false at a
/// clean end of stream before the first byte or once `stop` is set; an
/// error at an end of stream within `buf`, or after `idle` without a byte.
fn fill(
    r: &mut impl Read,
    buf: &mut [u8],
    stop: &AtomicBool,
    idle: Option<Duration>,
) -> std::io::Result<bool> {
    let mut at = 0;
    let mut last = Instant::now();
    while at < buf.len() {
        match r.read(&mut buf[at..]) {
            Ok(0) if at == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                at += n;
                last = Instant::now();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                if idle.is_some_and(|d| last.elapsed() >= d) {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
