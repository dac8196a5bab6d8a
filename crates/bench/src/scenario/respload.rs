//! A RESP load generator for the workloads `redis-benchmark` cannot express:
//! MULTI/EXEC blocks ([`transactions`]), PUBLISH fanned out to subscribers
//! that must receive every message ([`fanout`]), and writes each followed by
//! `WAIT` ([`writes`]).
//!
//! Like `redis-benchmark`, one client thread drives every connection from one
//! event loop (mio, edge-triggered, non-blocking sockets): a connection sends
//! a batch of `pipeline` commands, waits for all their replies, then sends the
//! next batch. Connections are opened and set up with the scenarios' blocking
//! client ([`super::resp::Conn`]) and parsed with its parser.
//!
//! Every reply is checked, so that a broken server cannot look fast: a reply
//! other than the one the command must get, a message lost, duplicated, out
//! of order or with other bytes ends the run with an error. A run that makes
//! no progress for [`STALL`] ends with an error too (never a hang).

use super::resp::{encode, parse_reply, token, Conn, Reply, Token};
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token as MioToken};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A run that receives nothing for this long ends with an error.
pub const STALL: Duration = Duration::from_secs(30);

/// Latencies in ns, 1 ns to 60 s, three significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

fn record(h: &mut Histogram<u64>, since: Instant, now: Instant) {
    h.saturating_record(now.saturating_duration_since(since).as_nanos() as u64);
}

/// Throughput and latency of a run.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Units done: transactions, messages published, or writes.
    pub units: u64,
    /// Commands answered (MULTI, EXEC and those between count one each).
    pub commands: u64,
    /// Messages received by the subscribers (fan-out only).
    pub deliveries: u64,
    /// Writes sent again after a `-TRYAGAIN` or `-READONLY` reply (a leader
    /// change under the replicated-writes load).
    pub retried: u64,
    /// From the first send to the last reply (fan-out: and the last delivery).
    pub seconds: f64,
    /// Latency in ms: of a transaction from its MULTI's send to its EXEC's
    /// reply; of a message from its PUBLISH's send to its arrival at a
    /// subscriber (every subscriber's arrival is a sample).
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Outcome {
    pub fn per_sec(&self) -> f64 {
        self.units as f64 / self.seconds
    }

    fn finish(mut self, t0: Instant, end: Instant, h: &Histogram<u64>) -> Outcome {
        self.seconds = end.duration_since(t0).as_secs_f64().max(1e-9);
        self.avg_ms = h.mean() / 1e6;
        self.p50_ms = h.value_at_quantile(0.5) as f64 / 1e6;
        self.p99_ms = h.value_at_quantile(0.99) as f64 / 1e6;
        self.max_ms = h.max() as f64 / 1e6;
        self
    }
}

/// A non-blocking connection in the event loop: its socket, the unparsed
/// bytes read, and the bytes still to write.
struct Client {
    s: TcpStream,
    rbuf: Vec<u8>,
    /// Start of the unparsed bytes in `rbuf`.
    at: usize,
    wbuf: Vec<u8>,
    /// Bytes of `wbuf` written.
    wpos: usize,
}

impl Client {
    /// Takes over a connection set up with the blocking client (it must have
    /// no reply left unread) and registers it.
    fn new(c: Conn, poll: &Poll, i: usize) -> Result<Client, String> {
        let s = c
            .into_stream()
            .map_err(|e| format!("connection {i}: {e}"))?;
        s.set_nonblocking(true)
            .map_err(|e| format!("set_nonblocking: {e}"))?;
        let mut s = TcpStream::from_std(s);
        poll.registry()
            .register(&mut s, MioToken(i), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| format!("register connection {i}: {e}"))?;
        Ok(Client {
            s,
            rbuf: Vec::with_capacity(64 * 1024),
            at: 0,
            wbuf: Vec::new(),
            wpos: 0,
        })
    }

    /// Writes what it can of `wbuf` (the rest when the socket is writable again).
    fn flush(&mut self) -> Result<(), String> {
        while self.wpos < self.wbuf.len() {
            match self.s.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("write: {e}")),
            }
        }
        self.wbuf.clear();
        self.wpos = 0;
        Ok(())
    }

    /// Queues `bytes` and writes what it can.
    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.wbuf.extend_from_slice(bytes);
        self.flush()
    }

    /// Reads everything the socket has (edge-triggered: until it would block).
    fn fill(&mut self) -> Result<(), String> {
        if self.at > 0 && self.at * 2 >= self.rbuf.len() {
            self.rbuf.drain(..self.at);
            self.at = 0;
        }
        loop {
            let old = self.rbuf.len();
            self.rbuf.resize(old + 64 * 1024, 0);
            let r = self.s.read(&mut self.rbuf[old..]);
            self.rbuf.truncate(old + *r.as_ref().unwrap_or(&0));
            match r {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }

    /// Handles an event of this connection: writes what waits when the
    /// socket is writable, reads what arrived when it is readable; whether
    /// it read.
    fn on_event(&mut self, ev: &mio::event::Event) -> Result<bool, String> {
        if ev.is_writable() {
            self.flush()?;
        }
        if !ev.is_readable() {
            return Ok(false);
        }
        self.fill()?;
        Ok(true)
    }

    fn unparsed(&self) -> &[u8] {
        &self.rbuf[self.at..]
    }
}

/// Waits for events; an error once nothing arrived for [`STALL`] or `stop`
/// is set. `progress` says what is done so far, for the error.
fn wait(
    poll: &mut Poll,
    events: &mut Events,
    last: &mut Instant,
    stop: &AtomicBool,
    progress: &dyn Fn() -> String,
) -> Result<(), String> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err("interrupted".into());
        }
        match poll.poll(events, Some(Duration::from_millis(200))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("poll: {e}")),
        }
        if !events.is_empty() {
            *last = Instant::now();
            return Ok(());
        }
        if last.elapsed() >= STALL {
            return Err(format!(
                "no reply for {} s ({})",
                STALL.as_secs(),
                progress()
            ));
        }
    }
}

/// Connects `n` clients to `port` (blocking, for the setup).
fn connect(port: u16, n: usize) -> Result<Vec<Conn>, String> {
    (0..n)
        .map(|_| Conn::connect(port, STALL).map_err(|e| format!("connect to {port}: {e}")))
        .collect()
}

/// The MULTI/EXEC workload: `clients` connections run `transactions`
/// transactions between them, each `MULTI`, `SET key:R VALUE`, `INCR
/// counter:R`, `EXEC` with R uniform in `0..keyspace` (the same R for both
/// keys, so that afterwards `counter:R` counts the transactions on `key:R`).
/// `pipeline` is the commands in flight per connection, as `redis-benchmark
/// -P` counts them: at 1 each command waits for its reply (four round trips
/// a transaction); at 16, four whole transactions go in one write.
#[derive(Clone, Debug)]
pub struct TxLoad {
    pub port: u16,
    pub clients: usize,
    pub pipeline: usize,
    pub transactions: u64,
    pub keyspace: u64,
    pub value_size: usize,
    pub seed: u64,
}

/// Commands per transaction.
pub const TX_COMMANDS: u64 = 4;

/// The reply a command of a transaction must get.
#[derive(Clone, Copy, Debug)]
enum TxStep {
    Multi,
    Queued,
    Exec,
}

impl TxStep {
    /// Whether `r` is the reply this command must get.
    fn accepts(self, r: &Reply) -> bool {
        match (self, r) {
            (TxStep::Multi, Reply::Simple(s)) => s == "OK",
            (TxStep::Queued, Reply::Simple(s)) => s == "QUEUED",
            (TxStep::Exec, Reply::Array(Some(v))) => {
                matches!(v.as_slice(), [Reply::Simple(ok), Reply::Int(n)] if ok == "OK" && *n >= 1)
            }
            _ => false,
        }
    }
}

/// One connection of the MULTI/EXEC workload.
struct TxConn {
    c: Client,
    /// Commands still to send.
    left: u64,
    /// Position of the next command in its transaction (0: MULTI).
    step: u64,
    /// The key number of the transaction being sent.
    r: u64,
    /// Commands sent and not answered, with the reply each must get.
    waiting: VecDeque<TxStep>,
    /// Send times of the MULTIs whose EXEC is not answered.
    started: VecDeque<Instant>,
}

impl TxConn {
    /// Queues the next batch (up to `pipeline` commands) and writes it.
    fn send_batch(
        &mut self,
        pipeline: usize,
        keyspace: u64,
        value: &[u8],
        rng: &mut SmallRng,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        out.clear();
        let now = Instant::now();
        let n = self.left.min(pipeline as u64);
        for _ in 0..n {
            let step = match self.step {
                0 => {
                    self.r = rng.random_range(0..keyspace);
                    self.started.push_back(now);
                    encode(out, &[b"MULTI"]);
                    TxStep::Multi
                }
                1 => {
                    let key = format!("key:{:012}", self.r);
                    encode(out, &[b"SET", key.as_bytes(), value]);
                    TxStep::Queued
                }
                2 => {
                    let key = format!("counter:{:012}", self.r);
                    encode(out, &[b"INCR", key.as_bytes()]);
                    TxStep::Queued
                }
                _ => {
                    encode(out, &[b"EXEC"]);
                    TxStep::Exec
                }
            };
            self.waiting.push_back(step);
            self.step = (self.step + 1) % TX_COMMANDS;
        }
        self.left -= n;
        self.c.send(out)
    }
}

/// Runs the MULTI/EXEC workload (see [`TxLoad`]).
pub fn transactions(load: &TxLoad, stop: &AtomicBool) -> Result<Outcome, String> {
    if load.clients == 0 || load.pipeline == 0 || load.transactions == 0 || load.keyspace == 0 {
        return Err("clients, pipeline, transactions and keyspace must be at least 1".into());
    }
    let mut poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
    let mut conns = Vec::with_capacity(load.clients);
    for (i, c) in connect(load.port, load.clients)?.into_iter().enumerate() {
        let n = load.transactions / load.clients as u64
            + u64::from((i as u64) < load.transactions % load.clients as u64);
        conns.push(TxConn {
            c: Client::new(c, &poll, i)?,
            left: n * TX_COMMANDS,
            step: 0,
            r: 0,
            waiting: VecDeque::new(),
            started: VecDeque::new(),
        });
    }
    let value = vec![b'x'; load.value_size];
    let mut rng = SmallRng::seed_from_u64(load.seed);
    let mut out = Vec::new();
    let mut hist = histogram();
    let mut o = Outcome::default();
    let t0 = Instant::now();
    let mut end = t0;
    for tc in &mut conns {
        if tc.left > 0 {
            tc.send_batch(load.pipeline, load.keyspace, &value, &mut rng, &mut out)?;
        }
    }
    let mut busy = conns.iter().filter(|c| !c.waiting.is_empty()).count();
    let mut events = Events::with_capacity(1024);
    let mut last = Instant::now();
    while busy > 0 {
        let done = o.units;
        wait(&mut poll, &mut events, &mut last, stop, &|| {
            format!("{done} of {} transactions done", load.transactions)
        })?;
        for ev in events.iter() {
            let i = ev.token().0;
            let tc = &mut conns[i];
            if !tc.c.on_event(ev)? {
                continue;
            }
            let now = Instant::now();
            while let Some((r, n)) = parse_reply(tc.c.unparsed())? {
                tc.c.at += n;
                let Some(step) = tc.waiting.pop_front() else {
                    return Err(format!("a reply nothing asked for: {r:?}"));
                };
                if !step.accepts(&r) {
                    return Err(format!("{step:?} answered {r:?}"));
                }
                o.commands += 1;
                if let TxStep::Exec = step {
                    let t = tc.started.pop_front().expect("a MULTI before its EXEC");
                    record(&mut hist, t, now);
                    o.units += 1;
                }
            }
            if tc.waiting.is_empty() {
                end = now;
                if tc.left > 0 {
                    tc.send_batch(load.pipeline, load.keyspace, &value, &mut rng, &mut out)?;
                } else {
                    busy -= 1;
                }
            }
        }
    }
    Ok(o.finish(t0, end, &hist))
}

/// A single-key write of the replicated-writes workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteCmd {
    /// `SET key:R VALUE`: +OK.
    Set,
    /// `INCR counter:R`: an integer.
    Incr,
    /// `LPUSH list:R VALUE`: an integer (the list's length).
    Lpush,
}

impl WriteCmd {
    pub fn name(self) -> &'static str {
        match self {
            WriteCmd::Set => "SET",
            WriteCmd::Incr => "INCR",
            WriteCmd::Lpush => "LPUSH",
        }
    }

    fn encode(self, r: u64, value: &[u8], out: &mut Vec<u8>) {
        let (cmd, prefix): (&[u8], &str) = match self {
            WriteCmd::Set => (b"SET", "key"),
            WriteCmd::Incr => (b"INCR", "counter"),
            WriteCmd::Lpush => (b"LPUSH", "list"),
        };
        let key = format!("{prefix}:{r:012}");
        if self == WriteCmd::Incr {
            encode(out, &[cmd, key.as_bytes()]);
        } else {
            encode(out, &[cmd, key.as_bytes(), value]);
        }
    }

    fn accepts(self, r: &Reply) -> bool {
        match (self, r) {
            (WriteCmd::Set, Reply::Simple(s)) => s == "OK",
            (WriteCmd::Incr | WriteCmd::Lpush, Reply::Int(n)) => *n >= 1,
            _ => false,
        }
    }
}

/// The replicated-writes workload: `clients` connections send `requests`
/// writes between them, one at a time per connection (pipeline 1), each to a
/// key `R` uniform in `0..keyspace`. With `wait = Some(n)`, each write is
/// followed by `WAIT n 0` in the same send (a client that wants its write on
/// `n` replicas pipelines the two), and the write counts once WAIT answers
/// `n` or more; latency runs from the send to the last reply.
#[derive(Clone, Debug)]
pub struct WriteLoad {
    pub port: u16,
    pub clients: usize,
    pub requests: u64,
    pub write: WriteCmd,
    pub wait: Option<u32>,
    pub keyspace: u64,
    pub value_size: usize,
    pub seed: u64,
}

/// One connection of the replicated-writes workload.
struct WriteConn {
    c: Client,
    left: u64,
    /// Replies still due for the write in flight (1, or 2 with WAIT).
    due: usize,
    sent: Instant,
    /// The bytes of the write in flight (sent again after -TRYAGAIN).
    last: Vec<u8>,
}

/// Runs the replicated-writes workload (see [`WriteLoad`]).
pub fn writes(load: &WriteLoad, stop: &AtomicBool) -> Result<Outcome, String> {
    if load.clients == 0 || load.requests == 0 || load.keyspace == 0 {
        return Err("clients, requests and keyspace must be at least 1".into());
    }
    let mut poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
    let mut conns = Vec::with_capacity(load.clients);
    for (i, c) in connect(load.port, load.clients)?.into_iter().enumerate() {
        let n = load.requests / load.clients as u64
            + u64::from((i as u64) < load.requests % load.clients as u64);
        conns.push(WriteConn {
            c: Client::new(c, &poll, i)?,
            left: n,
            due: 0,
            sent: Instant::now(),
            last: Vec::new(),
        });
    }
    let value = vec![b'x'; load.value_size];
    let wait_n = load.wait.map(|n| n.to_string());
    let mut rng = SmallRng::seed_from_u64(load.seed);
    let send = |wc: &mut WriteConn, rng: &mut SmallRng| -> Result<(), String> {
        wc.last.clear();
        load.write
            .encode(rng.random_range(0..load.keyspace), &value, &mut wc.last);
        wc.due = 1;
        if let Some(n) = &wait_n {
            encode(&mut wc.last, &[b"WAIT", n.as_bytes(), b"0"]);
            wc.due = 2;
        }
        wc.left -= 1;
        wc.sent = Instant::now();
        let bytes = std::mem::take(&mut wc.last);
        let r = wc.c.send(&bytes);
        wc.last = bytes;
        r
    };
    let mut hist = histogram();
    let mut o = Outcome::default();
    let t0 = Instant::now();
    let mut end = t0;
    let mut busy = 0;
    for wc in &mut conns {
        if wc.left > 0 {
            send(wc, &mut rng)?;
            busy += 1;
        }
    }
    let mut events = Events::with_capacity(1024);
    let mut last = Instant::now();
    while busy > 0 {
        let done = o.units;
        wait(&mut poll, &mut events, &mut last, stop, &|| {
            format!("{done} of {} writes done", load.requests)
        })?;
        for ev in events.iter() {
            let wc = &mut conns[ev.token().0];
            if !wc.c.on_event(ev)? {
                continue;
            }
            let now = Instant::now();
            while let Some((r, n)) = parse_reply(wc.c.unparsed())? {
                wc.c.at += n;
                // A leader change failed the write before its commit
                // (TRYAGAIN), or the node has just lost its leadership and
                // knows no leader yet (READONLY): a client sends it again
                // (to the same node, which forwards it once it knows the new
                // leader). With WAIT there is no Raft leader.
                if load.wait.is_none()
                    && wc.due == 1
                    && matches!(&r, Reply::Error(e) if e.starts_with("TRYAGAIN") || e.starts_with("READONLY"))
                {
                    o.retried += 1;
                    let bytes = std::mem::take(&mut wc.last);
                    let sent = wc.c.send(&bytes);
                    wc.last = bytes;
                    sent?;
                    continue;
                }
                match wc.due {
                    0 => return Err(format!("a reply nothing asked for: {r:?}")),
                    2 => {
                        if !load.write.accepts(&r) {
                            return Err(format!("{} answered {r:?}", load.write.name()));
                        }
                    }
                    _ if load.wait.is_some() => {
                        let want = i64::from(load.wait.unwrap_or(0));
                        if !matches!(r, Reply::Int(k) if k >= want) {
                            return Err(format!("WAIT {want} 0 answered {r:?}"));
                        }
                    }
                    _ => {
                        if !load.write.accepts(&r) {
                            return Err(format!("{} answered {r:?}", load.write.name()));
                        }
                    }
                }
                o.commands += 1;
                wc.due -= 1;
                if wc.due == 0 {
                    record(&mut hist, wc.sent, now);
                    o.units += 1;
                }
            }
            if wc.due == 0 {
                end = now;
                if wc.left > 0 {
                    send(wc, &mut rng)?;
                } else {
                    busy -= 1;
                }
            }
        }
    }
    Ok(o.finish(t0, end, &hist))
}

/// The fan-out workload: `subscribers` connections SUBSCRIBE to one channel,
/// then `publishers` connections PUBLISH `messages` messages of `value_size`
/// bytes to it between them, `pipeline` in flight per publisher. Each PUBLISH
/// must answer `subscribers` (every subscriber got it), and every subscriber
/// must receive every message, each publisher's in order. The run ends when
/// the last subscriber has received the last message.
#[derive(Clone, Debug)]
pub struct FanoutLoad {
    pub port: u16,
    pub subscribers: usize,
    pub publishers: usize,
    pub pipeline: usize,
    pub messages: u64,
    pub value_size: usize,
}

/// The channel of the fan-out workload.
const CHANNEL: &[u8] = b"bench:fanout";

/// The payload of message `seq` of publisher `p`: `p:seq:` and a fill byte
/// up to `size` bytes.
fn payload(p: usize, seq: u64, size: usize, out: &mut Vec<u8>) {
    out.clear();
    let _ = write!(out, "{p}:{seq}:");
    let fill = b'a' + (seq % 26) as u8;
    out.resize(size.max(out.len()), fill);
}

/// The publisher and sequence number a payload carries, if its bytes are
/// what [`payload`] writes for them at `size` bytes.
fn parse_payload(data: &[u8], size: usize) -> Option<(usize, u64)> {
    let mut parts = data.splitn(3, |&b| b == b':');
    let (p, seq, fill) = (parts.next()?, parts.next()?, parts.next()?);
    let num = |s: &[u8]| -> Option<u64> {
        if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(s).ok()?.parse().ok()
    };
    let (p, seq) = (usize::try_from(num(p)?).ok()?, num(seq)?);
    let f = b'a' + (seq % 26) as u8;
    let header = data.len() - fill.len();
    (data.len() == size.max(header) && fill.iter().all(|&b| b == f)).then_some((p, seq))
}

/// A complete pub/sub `message` push at the start of `buf`: its payload and
/// the bytes it takes; None while incomplete; an error for anything else
/// (another channel, another kind of push, a reply).
fn parse_message(buf: &[u8]) -> Result<Option<(&[u8], usize)>, String> {
    let mut n = 0;
    let mut items: [&[u8]; 3] = [&[]; 3];
    for i in 0..4 {
        let Some((t, m)) = token(&buf[n..])? else {
            return Ok(None);
        };
        n += m;
        match (i, t) {
            (0, Token::Array(Some(3))) => {}
            (1..=3, Token::Bulk(Some(b))) => items[i - 1] = b,
            _ => {
                return Err(format!(
                    "a subscriber got {t:?} where a message push was expected"
                ))
            }
        }
    }
    if items[0] != b"message" || items[1] != CHANNEL {
        return Err(format!(
            "a subscriber got a {:?} push on {:?}",
            String::from_utf8_lossy(items[0]),
            String::from_utf8_lossy(items[1])
        ));
    }
    Ok(Some((items[2], n)))
}

/// One subscriber: the next sequence number it expects of each publisher,
/// the messages it received, and whether that is all of them.
struct Sub {
    c: Client,
    next: Vec<u64>,
    received: u64,
    done: bool,
}

/// One publisher: messages still to send, the next sequence number, the
/// PUBLISHes not answered, and the send time of each message.
struct Pub {
    c: Client,
    left: u64,
    seq: u64,
    waiting: usize,
    sent: Vec<Instant>,
}

/// Runs the fan-out workload (see [`FanoutLoad`]).
pub fn fanout(load: &FanoutLoad, stop: &AtomicBool) -> Result<Outcome, String> {
    if load.subscribers == 0 || load.publishers == 0 || load.pipeline == 0 || load.messages == 0 {
        return Err("subscribers, publishers, pipeline and messages must be at least 1".into());
    }
    let mut poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
    let mut subs = Vec::with_capacity(load.subscribers);
    for (i, mut c) in connect(load.port, load.subscribers)?
        .into_iter()
        .enumerate()
    {
        match c.call(&[b"SUBSCRIBE", CHANNEL]) {
            Ok(Reply::Array(Some(v)))
                if matches!(v.as_slice(), [Reply::Bulk(Some(k)), Reply::Bulk(Some(ch)), Reply::Int(1)]
                    if k == b"subscribe" && ch == CHANNEL) => {}
            r => return Err(format!("SUBSCRIBE answered {r:?}")),
        }
        subs.push(Sub {
            c: Client::new(c, &poll, i)?,
            next: vec![0; load.publishers],
            received: 0,
            done: false,
        });
    }
    let mut pubs = Vec::with_capacity(load.publishers);
    for (i, mut c) in connect(load.port, load.publishers)?.into_iter().enumerate() {
        // Every subscription is in place before the first message.
        let want = Reply::Array(Some(vec![
            Reply::Bulk(Some(CHANNEL.to_vec())),
            Reply::Int(load.subscribers as i64),
        ]));
        match c.call(&[b"PUBSUB", b"NUMSUB", CHANNEL]) {
            Ok(r) if r == want => {}
            r => return Err(format!("PUBSUB NUMSUB answered {r:?}, not {want:?}")),
        }
        let n = load.messages / load.publishers as u64
            + u64::from((i as u64) < load.messages % load.publishers as u64);
        pubs.push(Pub {
            c: Client::new(c, &poll, load.subscribers + i)?,
            left: n,
            seq: 0,
            waiting: 0,
            sent: Vec::with_capacity(n as usize),
        });
    }
    let per_sub: u64 = load.messages;
    let mut hist = histogram();
    let mut o = Outcome::default();
    let (mut out, mut body) = (Vec::new(), Vec::new());
    let send = |p: &mut Pub, i: usize, out: &mut Vec<u8>, body: &mut Vec<u8>| {
        out.clear();
        let n = p.left.min(load.pipeline as u64);
        let now = Instant::now();
        for _ in 0..n {
            payload(i, p.seq, load.value_size, body);
            encode(out, &[b"PUBLISH", CHANNEL, body]);
            p.sent.push(now);
            p.seq += 1;
        }
        p.left -= n;
        p.waiting = n as usize;
        p.c.send(out)
    };
    let t0 = Instant::now();
    for (i, p) in pubs.iter_mut().enumerate() {
        if p.left > 0 {
            send(p, i, &mut out, &mut body)?;
        }
    }
    let mut pubs_busy = pubs.iter().filter(|p| p.waiting > 0).count();
    let mut subs_busy = subs.len();
    let mut end = t0;
    let mut events = Events::with_capacity(1024);
    let mut last = Instant::now();
    while pubs_busy > 0 || subs_busy > 0 {
        let (done, got) = (o.units, o.deliveries);
        wait(&mut poll, &mut events, &mut last, stop, &|| {
            format!(
                "{done} of {} messages published, {got} of {} deliveries",
                load.messages,
                per_sub * load.subscribers as u64
            )
        })?;
        for ev in events.iter() {
            let i = ev.token().0;
            if i < subs.len() {
                let s = &mut subs[i];
                if !s.c.on_event(ev)? {
                    continue;
                }
                let now = Instant::now();
                while let Some((data, n)) = parse_message(s.c.unparsed())? {
                    let Some((p, seq)) = parse_payload(data, load.value_size) else {
                        return Err(format!(
                            "a subscriber got a message with other bytes: {:?}",
                            String::from_utf8_lossy(&data[..data.len().min(80)])
                        ));
                    };
                    let Some(&want) = s.next.get(p) else {
                        return Err(format!("a message of publisher {p}, which does not exist"));
                    };
                    if seq != want {
                        return Err(format!(
                            "subscriber {i} got message {seq} of publisher {p} where {want} was next (lost, repeated or reordered)"
                        ));
                    }
                    // Its PUBLISH went out already: it has a send time.
                    let Some(&sent) = pubs[p].sent.get(seq as usize) else {
                        return Err(format!(
                            "subscriber {i} got message {seq} of publisher {p}, which was not sent"
                        ));
                    };
                    record(&mut hist, sent, now);
                    s.next[p] += 1;
                    s.received += 1;
                    o.deliveries += 1;
                    s.c.at += n;
                }
                if !s.done && s.received == per_sub {
                    s.done = true;
                    subs_busy -= 1;
                    end = end.max(now);
                }
                continue;
            }
            let pi = i - subs.len();
            let p = &mut pubs[pi];
            if !p.c.on_event(ev)? {
                continue;
            }
            while let Some((r, n)) = parse_reply(p.c.unparsed())? {
                p.c.at += n;
                if p.waiting == 0 {
                    return Err(format!("a reply nothing asked for: {r:?}"));
                }
                if r != Reply::Int(load.subscribers as i64) {
                    return Err(format!(
                        "PUBLISH answered {r:?}, not the {} subscribers",
                        load.subscribers
                    ));
                }
                p.waiting -= 1;
                o.commands += 1;
                o.units += 1;
            }
            if p.waiting == 0 {
                end = end.max(Instant::now());
                if p.left > 0 {
                    send(p, pi, &mut out, &mut body)?;
                } else {
                    pubs_busy -= 1;
                }
            }
        }
    }
    Ok(o.finish(t0, end, &hist))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        let mut b = Vec::new();
        for (p, seq) in [(0, 0), (3, 12_345), (49, u64::from(u32::MAX) * 7)] {
            payload(p, seq, 100, &mut b);
            assert_eq!(b.len(), 100);
            assert_eq!(parse_payload(&b, 100), Some((p, seq)));
            assert_eq!(parse_payload(&b, 99), None);
            let mut wrong = b.clone();
            *wrong.last_mut().unwrap() ^= 1;
            assert_eq!(parse_payload(&wrong, 100), None);
        }
        // Shorter than its header: the header alone.
        payload(7, 1_000_000, 4, &mut b);
        assert_eq!(parse_payload(&b, 4), Some((7, 1_000_000)));
        assert_eq!(parse_payload(b"x:1:b", 5), None);
    }

    #[test]
    fn parses_message_pushes() {
        let mut body = Vec::new();
        payload(1, 2, 10, &mut body);
        let mut buf = Vec::new();
        encode(&mut buf, &[b"message", CHANNEL, &body]);
        for i in 0..buf.len() {
            assert_eq!(parse_message(&buf[..i]).unwrap(), None, "prefix {i}");
        }
        assert_eq!(parse_message(&buf).unwrap(), Some((&body[..], buf.len())));
        let mut other = Vec::new();
        encode(&mut other, &[b"message", b"elsewhere", &body]);
        assert!(parse_message(&other).is_err());
        assert!(parse_message(b":1\r\n").is_err());
    }

    #[test]
    fn transaction_replies_are_checked() {
        let ok = || Reply::Simple("OK".into());
        assert!(TxStep::Multi.accepts(&ok()));
        assert!(!TxStep::Multi.accepts(&Reply::Error("ERR".into())));
        assert!(TxStep::Queued.accepts(&Reply::Simple("QUEUED".into())));
        assert!(!TxStep::Queued.accepts(&ok()));
        assert!(TxStep::Exec.accepts(&Reply::Array(Some(vec![ok(), Reply::Int(3)]))));
        // A transaction aborted (null array) or with an error inside fails.
        assert!(!TxStep::Exec.accepts(&Reply::Array(None)));
        assert!(!TxStep::Exec.accepts(&Reply::Array(Some(vec![ok(), Reply::Error("ERR".into())]))));
    }
}
