//! A snapshot's transfer between two stores over real TCP, as the
//! transport does it: the leader's dump written to a file and offered, its
//! bytes pulled by the receiver in chunks into its own file, checked, then
//! installed from that file. A transfer in many chunks installs the exact
//! keyspace; one cut midway leaves the receiver as it was and a later one
//! succeeds; bytes that do not match the descriptor are refused.

use engine::direct::DirectStore;
use engine::{Session, Store, WriteBatch};
use pmem::{Geometry, Heap, HeapOptions, Strategy};
use raft::eraftpb::{HardState, Snapshot};
use repl::net::{fetch_snapshot, Fetch, FETCH};
use repl::node::Event;
use repl::storage::{
    dump, dump_to, part_path, recv_path, write_dump, SnapDesc, SnapSink, PEERS_KEY, SNAP_MARK,
};
use repl::HeapStorage;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

fn heap_opts() -> HeapOptions {
    HeapOptions {
        size: 16 << 20,
        max_size: 128 << 20,
        reserve: 128 << 20,
        geometry: Geometry {
            nslots: 16,
            ..Geometry::small()
        },
        strategy: Strategy::FenceOnly,
        ..Default::default()
    }
}

/// A store in its own heap file.
struct Node {
    store: DirectStore,
    _heap: Heap,
    snap_file: PathBuf,
}

impl Node {
    fn new(dir: &Path, name: &str) -> Node {
        let heap = Heap::create(&dir.join(name), &heap_opts()).unwrap();
        let store = DirectStore::create(&heap, &Default::default()).unwrap();
        Node {
            store,
            _heap: heap,
            snap_file: dir.join(format!("{name}.raft-snapshot")),
        }
    }

    fn sess(&self) -> Box<dyn Session> {
        Box::new(self.store.session().unwrap())
    }

    /// Its log, holding entries 1..=`n` of term `term`, all committed.
    fn log_of(&self, n: u64, term: u64) -> HeapStorage {
        let mut log =
            HeapStorage::open_with(self.sess(), &[1, 2], Some(self.snap_file.clone())).unwrap();
        let ents: Vec<_> = (1..=n)
            .map(|index| raft::eraftpb::Entry {
                index,
                term,
                ..Default::default()
            })
            .collect();
        let hs = HardState {
            term,
            vote: 1,
            commit: n,
            ..Default::default()
        };
        log.persist(&ents, Some(&hs)).unwrap();
        log
    }

    /// Its keyspace as sorted (key, value) pairs, the Raft keys left out.
    fn keyspace(&self) -> Pairs {
        let d = dump(&mut *self.sess()).unwrap();
        let mut out = Vec::new();
        let mut rest = d.as_slice();
        let mut field = || {
            let n = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
            let f = rest[4..4 + n].to_vec();
            rest = &rest[4 + n..];
            f
        };
        let mut left = d.len();
        while left > 0 {
            let k = field();
            let v = field();
            left -= 8 + k.len() + v.len();
            out.push((k, v));
        }
        out.sort();
        out.dedup();
        out
    }
}

/// The leader's side: `keys` keys, a few of them large, dumped to a file
/// and offered at index 50; its transport serving the bytes in `chunk`-byte
/// chunks. Returns the snapshot, the log (keep it: it holds the offer) and
/// the transport's events.
fn leader(
    n: &Node,
    keys: u32,
    chunk: usize,
    stop: &Arc<AtomicBool>,
) -> (Snapshot, HeapStorage, String, Receiver<Event>) {
    let mut s = n.sess();
    let mut b = WriteBatch::new();
    for i in 0..keys {
        let v = if i % 100 == 7 {
            vec![b'x' ^ (i as u8); 100_000]
        } else {
            format!("value-{i}").into_bytes()
        };
        b.put(format!("key-{i}").as_bytes(), &v);
        if b.len() >= 256 {
            s.apply_batch(&b, &mut Vec::new()).unwrap();
            b.clear();
        }
    }
    s.apply_batch(&b, &mut Vec::new()).unwrap();
    let mut log = n.log_of(50, 2);
    let file = write_dump(&repl::storage::dump_path(&n.snap_file, 1), |out| {
        dump_to(&mut *s, out).map_err(|e| e.to_string())
    })
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let desc = SnapDesc {
        index: 50,
        len: file.len,
        crc: file.crc,
        source: addr.clone(),
        peers: format!("1={addr}:1,2=127.0.0.1:2:2"),
    };
    let mut snap = Snapshot {
        data: desc.encode().into(),
        ..Default::default()
    };
    snap.mut_metadata().index = 50;
    snap.mut_metadata().term = 2;
    snap.mut_metadata().mut_conf_state().voters = vec![1, 2];
    log.offer_snapshot(snap.clone(), file);
    let (tx, rx) = std::sync::mpsc::channel();
    repl::net::serve(listener, tx, stop.clone(), log.shelf(), chunk);
    (snap, log, addr, rx)
}

/// The receiver's side: a store with keys of its own and a log of 5
/// entries.
fn receiver(n: &Node) -> HeapStorage {
    let mut s = n.sess();
    let mut b = WriteBatch::new();
    b.put(b"key-3", b"stale");
    b.put(b"only-here", b"x");
    s.apply_batch(&b, &mut Vec::new()).unwrap();
    n.log_of(5, 1)
}

fn fetch_for(n: &Node, snap: &Snapshot, source: &str) -> Fetch {
    let mut desc = SnapDesc::decode(&snap.data).unwrap();
    desc.source = source.to_string();
    Fetch {
        me: 2,
        desc,
        part: part_path(&n.snap_file),
        dest: recv_path(&n.snap_file),
    }
}

/// The transfer's end as the leader's transport reports it.
fn transfer_end(rx: &Receiver<Event>) -> bool {
    loop {
        match rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a transfer event")
        {
            Event::Transfer { to: 2, done: None } => {}
            Event::Transfer {
                to: 2,
                done: Some(ok),
            } => return ok,
            _ => panic!("an unexpected event"),
        }
    }
}

/// Sorted (key, value) pairs.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The receiver's state: keyspace, log range, applied index, no mark.
fn state(n: &Node, log: &HeapStorage) -> (Pairs, (u64, u64), u64, bool) {
    let mut s = n.sess();
    (
        n.keyspace(),
        log.range(),
        repl::read_applied(&mut *s).unwrap(),
        s.get(SNAP_MARK, &mut Vec::new()).unwrap(),
    )
}

#[test]
fn a_snapshot_in_many_chunks_installs_the_exact_keyspace() {
    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (a, b) = (Node::new(dir.path(), "a"), Node::new(dir.path(), "b"));
    let chunk = 4096;
    let (snap, _alog, addr, events) = leader(&a, 3000, chunk, &stop);
    let desc = SnapDesc::decode(&snap.data).unwrap();
    assert!(desc.len > 2_000_000, "{}", desc.len);
    // On the wire: a status, then chunks of at most `chunk` bytes.
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut req = FETCH.to_le_bytes().to_vec();
    for w in [2u64, desc.index, desc.len] {
        req.extend_from_slice(&w.to_le_bytes());
    }
    req.extend_from_slice(&desc.crc.to_le_bytes());
    s.write_all(&req).unwrap();
    let mut word = [0u8; 4];
    s.read_exact(&mut word).unwrap();
    assert_eq!(u32::from_le_bytes(word), 0, "on offer");
    let (mut got, mut chunks) = (0u64, 0);
    let mut h = crc32fast::Hasher::new();
    while got < desc.len {
        s.read_exact(&mut word).unwrap();
        let n = u32::from_le_bytes(word) as usize;
        assert!((1..=chunk).contains(&n), "a chunk of {n} bytes");
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf).unwrap();
        h.update(&buf);
        got += n as u64;
        chunks += 1;
    }
    assert_eq!((got, h.finalize()), (desc.len, desc.crc));
    assert!(chunks as u64 >= desc.len / chunk as u64, "{chunks} chunks");
    drop(s);
    assert!(!transfer_end(&events), "no acknowledgement: not delivered");
    // The receiver's fetch and install.
    let mut blog = receiver(&b);
    let f = fetch_for(&b, &snap, &addr);
    fetch_snapshot(&f, &stop).unwrap();
    assert!(transfer_end(&events), "delivered");
    assert!(f.dest.exists() && !f.part.exists());
    blog.install(&snap, None).unwrap();
    assert!(!f.dest.exists() && !b.snap_file.exists(), "files removed");
    let (keys, range, applied, mark) = state(&b, &blog);
    assert_eq!(keys, a.keyspace(), "the leader's keyspace exactly");
    assert_eq!((range, applied, mark), ((51, 50), 50, false));
    let mut v = Vec::new();
    assert!(b.sess().get(PEERS_KEY, &mut v).unwrap());
    assert_eq!(v, desc.peers.as_bytes());
    stop.store(true, Ordering::Relaxed);
}

/// A proxy to `upstream` that passes `limit` bytes from the server, then
/// drops both connections (as a sender killed or a connection lost).
fn cutting_proxy(upstream: String, limit: usize) -> (String, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let passed = Arc::new(AtomicUsize::new(0));
    let p2 = passed.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let mut up = TcpStream::connect(&upstream).unwrap();
            let (mut c2, mut up2) = (c.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut up2);
            });
            let mut buf = vec![0u8; 8192];
            loop {
                let n = match up.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let room = limit - p2.load(Ordering::Relaxed);
                let n = n.min(room);
                if c.write_all(&buf[..n]).is_err() {
                    break;
                }
                p2.fetch_add(n, Ordering::Relaxed);
                if n == room {
                    break;
                }
            }
            let _ = c.shutdown(std::net::Shutdown::Both);
            let _ = up.shutdown(std::net::Shutdown::Both);
        }
    });
    (addr, passed)
}

#[test]
fn a_transfer_cut_midway_leaves_the_receiver_untouched_and_a_later_one_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (a, b) = (Node::new(dir.path(), "a"), Node::new(dir.path(), "b"));
    let (snap, _alog, addr, events) = leader(&a, 2000, 1000, &stop);
    let desc = SnapDesc::decode(&snap.data).unwrap();
    let mut blog = receiver(&b);
    let before = state(&b, &blog);
    // Cut at half the bytes.
    let (proxy, passed) = cutting_proxy(addr.clone(), desc.len as usize / 2);
    let f = fetch_for(&b, &snap, &proxy);
    let e = fetch_snapshot(&f, &stop).expect_err("a cut transfer fails");
    assert!(
        passed.load(Ordering::Relaxed) >= desc.len as usize / 2,
        "{e}"
    );
    assert!(!transfer_end(&events), "the leader sees it fail");
    assert!(!f.part.exists() && !f.dest.exists(), "no file left behind");
    // Nothing to install: the receiver refuses and stays as it was.
    assert!(blog.install(&snap, None).is_err());
    assert_eq!(state(&b, &blog), before);
    // A later transfer succeeds and installs the leader's keyspace.
    let f = fetch_for(&b, &snap, &addr);
    fetch_snapshot(&f, &stop).unwrap();
    assert!(transfer_end(&events));
    blog.install(&snap, None).unwrap();
    assert_eq!(b.keyspace(), a.keyspace());
    assert_eq!(blog.range(), (51, 50));
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn a_corrupt_short_or_long_snapshot_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (a, b) = (Node::new(dir.path(), "a"), Node::new(dir.path(), "b"));
    let (snap, _alog, addr, _events) = leader(&a, 300, 512, &stop);
    let desc = SnapDesc::decode(&snap.data).unwrap();
    let data = std::fs::read(repl::storage::dump_path(&a.snap_file, 1)).unwrap();
    let mut blog = receiver(&b);
    let before = state(&b, &blog);
    let (part, dest) = (part_path(&b.snap_file), recv_path(&b.snap_file));
    // Received through a sink: one bit flipped, one byte short.
    let mut flipped = data.clone();
    flipped[data.len() / 3] ^= 4;
    for bytes in [&flipped[..], &data[..data.len() - 1]] {
        let mut s = SnapSink::create(&part, &desc).unwrap();
        for c in bytes.chunks(100) {
            s.write(c).unwrap();
        }
        assert!(s.finish(&dest).is_err());
        assert!(!part.exists() && !dest.exists());
    }
    // One byte too many.
    let mut s = SnapSink::create(&part, &desc).unwrap();
    s.write(&data).unwrap();
    assert!(s.write(b"!").is_err());
    drop(s);
    assert!(!part.exists(), "an unfinished sink leaves no file");
    // A fetch naming bytes other than those on offer is refused.
    let mut f = fetch_for(&b, &snap, &addr);
    f.desc.crc ^= 1;
    let e = fetch_snapshot(&f, &stop).unwrap_err();
    assert!(e.contains("no longer on offer"), "{e}");
    // A received file damaged, cut short or grown before the install: the
    // install refuses it and changes nothing.
    let mut longer = data.clone();
    longer.push(0);
    for bytes in [&flipped[..], &data[..data.len() - 1], &longer[..]] {
        std::fs::write(&dest, bytes).unwrap();
        let e = blog.install(&snap, None).unwrap_err();
        assert!(e.to_string().contains("do not match"), "{e}");
        assert_eq!(state(&b, &blog), before);
    }
    // The right bytes install.
    std::fs::write(&dest, &data).unwrap();
    blog.install(&snap, None).unwrap();
    assert_eq!(b.keyspace(), a.keyspace());
    stop.store(true, Ordering::Relaxed);
}
