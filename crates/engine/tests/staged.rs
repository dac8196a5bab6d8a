//! Group commit writes a log's records through the file at the commit
//! (`Pool::stages`): until then they are staged in memory, where every reader
//! finds them, and none of them is in the file; at the commit they all are.
//! A SIGKILL image (the file as the page cache holds it, copied while the
//! store is open) taken before the commit holds none of them, one taken after
//! holds all. And a model-based run of a group-commit store on a real file,
//! with kills and restarts: what comes back is always the last commit plus a
//! prefix of the writes after it (puts, removes, increments, and merges of
//! collection leaves, which are not idempotent).

mod common;

use common::*;
use engine::bullet::{BulletOptions, BulletStore, Variant};
use engine::crl::{Pool, RecPtr, BACKEND_HASH};
use engine::direct::BackendKind;
use engine::{Error, Op, Outcome, Session, Store};
use pmem::{Heap, PPtr, Strategy as Persist};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering::Acquire;
use std::time::Duration;

const LOG: u64 = 64 << 10;

/// The `len` field (the first 4 bytes) of the record at `p` as the file holds it.
fn len_in_file(path: &Path, base: u64, p: RecPtr) -> u32 {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, base + p.pos() % LOG).unwrap();
    u32::from_le_bytes(b)
}

/// The log's tail as recovery finds it in `image`.
fn recovered_tail(dir: &Path, name: &str, image: &[u8], desc: u64) -> u64 {
    let path = dir.join(name);
    std::fs::write(&path, image).unwrap();
    let rec = Heap::open(&path, &heap_opts(8 << 20, 8 << 20, Persist::Msync)).unwrap();
    let pool = Pool::attach(rec.heap(), desc).unwrap();
    pool.logs[0].tail.load(Acquire)
}

#[test]
fn group_commit_records_reach_the_file_at_the_commit() {
    let d = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = d.path().join("h");
    let heap = Heap::create(&path, &heap_opts(8 << 20, 8 << 20, Persist::Msync)).unwrap();
    let desc = Pool::create_desc(&heap, 1, LOG, BACKEND_HASH, PPtr::from_raw(0)).unwrap();
    heap.set_root(PPtr::from_raw(desc)).unwrap();
    let pool = Pool::attach(&heap, desc).unwrap();
    let base = pool.ensure_buffer(0).unwrap();
    pool.group_commit
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(pool.stages());
    let through = || heap.region().persist_stats().writes_through;

    let w0 = through();
    let mut recs = Vec::new();
    for i in 0..10u8 {
        let key = format!("k{i}");
        let p = pool
            .append(0, 1, key.as_bytes(), &[i; 100], RecPtr(0), i as u64 + 1)
            .unwrap()
            .unwrap();
        recs.push((p, key, i));
    }
    let end = pool.logs[0].tail.load(Acquire);
    // Staged: every reader finds the records; the file (and so the mapping,
    // which reads the same page cache) holds none of them.
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for (p, key, i) in &recs {
        let h = pool.header(*p).unwrap();
        assert_eq!((h.pos, h.version, h.opcode), (p.pos(), *i as u64 + 1, 1));
        pool.key(*p, &h, &mut k);
        pool.payload(*p, &h, &mut v);
        assert_eq!(
            (k.as_slice(), v.as_slice()),
            (key.as_bytes(), &[*i; 100][..])
        );
        assert_eq!(
            len_in_file(&path, base, *p),
            0,
            "record {i} in the file before the commit"
        );
    }
    assert_eq!(through(), w0);
    let before = std::fs::read(&path).unwrap();

    // The commit: one write through the file, then the fence.
    pool.committing(0, 0, end).unwrap();
    pool.fence();
    pool.mark_durable(0, end);
    assert_eq!(through(), w0 + 1);
    for (p, _, i) in &recs {
        let h = pool.header(*p).unwrap();
        assert_eq!(
            len_in_file(&path, base, *p),
            h.len,
            "record {i} not in the file"
        );
    }
    let after = std::fs::read(&path).unwrap();

    assert_eq!(recovered_tail(d.path(), "before", &before, desc), 0);
    assert_eq!(recovered_tail(d.path(), "after", &after, desc), end);

    // Another thread that needs them durable (a later record of the same
    // key in another writer's log) writes them out itself.
    let p = pool
        .append(0, 1, b"k0", &[9; 100], recs[0].0, 11)
        .unwrap()
        .unwrap();
    let end2 = pool.logs[0].tail.load(Acquire);
    std::thread::scope(|s| {
        s.spawn(|| pool.make_durable(p).unwrap());
    });
    assert!(pool.logs[0].durable.load(Acquire) >= end2);
    assert_eq!(through(), w0 + 2);
    let h = pool.header(p).unwrap();
    assert_eq!(len_in_file(&path, base, p), h.len);
    let synced = std::fs::read(&path).unwrap();
    assert_eq!(recovered_tail(d.path(), "synced", &synced, desc), end2);
}

#[derive(Clone, Debug)]
enum TOp {
    Put(usize, u8),
    Incr(usize, i64),
    /// A collection's list leaf, and a merge of an edit of it.
    PutLeaf(usize, u8, u32),
    Merge(usize, u8, u32, u32),
    Remove(usize),
    Get(usize),
    Commit,
    /// The file as it is now (a SIGKILL), recovered.
    Kill,
    /// Closed without a commit, reopened.
    Restart,
}

const NKEYS: usize = 6;

fn op() -> impl Strategy<Value = TOp> {
    prop_oneof![
        6 => (0..NKEYS, any::<u8>()).prop_map(|(k, v)| TOp::Put(k, v)),
        3 => (0..NKEYS, -3i64..4).prop_map(|(k, d)| TOp::Incr(k, d)),
        2 => (0..NKEYS, 1u8..5, any::<u32>()).prop_map(|(k, n, v)| TOp::PutLeaf(k, n, v)),
        4 => (0..NKEYS, 0u8..3, 0u32..5, any::<u32>())
            .prop_map(|(k, e, p, v)| TOp::Merge(k, e, p, v)),
        1 => (0..NKEYS).prop_map(TOp::Remove),
        2 => (0..NKEYS).prop_map(TOp::Get),
        3 => Just(TOp::Commit),
        1 => Just(TOp::Kill),
        1 => Just(TOp::Restart),
    ]
}

fn key(k: usize) -> Vec<u8> {
    format!("key:{k}").into_bytes()
}

/// Values of 60..315 bytes: a few dozen records fill a log, so logs wrap,
/// fill and are gleaned while records are staged.
fn value(k: usize, v: u8) -> Vec<u8> {
    let mut out = format!("{k}-{v}-").into_bytes();
    out.resize(60 + v as usize, b'a' + (v % 26));
    out
}

fn opts() -> BulletOptions {
    BulletOptions {
        logs: 2,
        group_commit: true,
        // As `ember serve --durability msync` runs it.
        role_threads: 1,
        ..bullet_opts(Variant::Full, BackendKind::LogFree, 8 << 10)
    }
}

struct Live {
    sess: Option<engine::bullet::BulletSession>,
    store: Option<BulletStore>,
    path: std::path::PathBuf,
}

impl Live {
    fn open(path: &Path) -> Live {
        let rec = Heap::open(path, &heap_opts(16 << 20, 64 << 20, Persist::Msync)).unwrap();
        let (store, _) = BulletStore::open(rec, &opts()).unwrap();
        Live {
            sess: Some(store.session().unwrap()),
            store: Some(store),
            path: path.to_path_buf(),
        }
    }

    fn read_all(&mut self) -> BTreeMap<usize, Vec<u8>> {
        let s = self.sess.as_mut().unwrap();
        let mut out = Vec::new();
        let mut m = BTreeMap::new();
        for k in 0..NKEYS {
            if s.get(&key(k), &mut out).unwrap() {
                m.insert(k, out.clone());
            }
        }
        m
    }

    fn shut(&mut self) {
        self.sess = None;
        if let Some(s) = self.store.take() {
            s.close().unwrap();
        }
    }
}

/// After a kill or a restart: the store holds the state of the last commit
/// followed by some prefix of the writes after it (`states[j]`: after `j`).
fn check_prefix(
    got: &BTreeMap<usize, Vec<u8>>,
    states: &[BTreeMap<usize, Vec<u8>>],
    what: &str,
) -> Result<(), String> {
    if states.iter().any(|s| s == got) {
        Ok(())
    } else {
        Err(format!(
            "{what}: {got:?} is not the last commit ({:?}) plus a prefix of the {} writes after it",
            states[0],
            states.len() - 1
        ))
    }
}

fn run(ops: &[TOp]) -> Result<(), String> {
    let d = tempfile::tempdir_in(shm_dir()).unwrap();
    let path0 = d.path().join("g0");
    {
        let heap = Heap::create(&path0, &heap_opts(16 << 20, 64 << 20, Persist::Msync)).unwrap();
        let st = BulletStore::create(&heap, &opts()).unwrap();
        st.close().unwrap();
    }
    let mut live = Live::open(&path0);
    // `states[0]`: as of the last commit; `states[j]`: after `j` writes more.
    let mut states = vec![BTreeMap::new()];
    let mut gen = 0;
    for (i, op) in ops.iter().enumerate() {
        let what = format!("op {i} {op:?}");
        let model = states.last().unwrap().clone();
        match op {
            TOp::Put(..) | TOp::PutLeaf(..) => {
                let (k, val) = match op {
                    TOp::Put(k, v) => (k, value(*k, *v)),
                    TOp::PutLeaf(k, n, v) => (k, leaf_piece(*n, *v)),
                    _ => unreachable!(),
                };
                let r = live
                    .sess
                    .as_mut()
                    .unwrap()
                    .apply(&key(*k), Op::Put(&val))
                    .map_err(|e| format!("{what}: {e}"))?;
                let mut m = model;
                let old = m.insert(*k, val);
                let want = Outcome::Put {
                    created: old.is_none(),
                    old_first: old.and_then(|v| v.first().copied()),
                };
                if r != want {
                    return Err(format!("{what}: {r:?}, the model says {want:?}"));
                }
                states.push(m);
            }
            TOp::Remove(k) => {
                let r = live
                    .sess
                    .as_mut()
                    .unwrap()
                    .apply(&key(*k), Op::Remove)
                    .map_err(|e| format!("{what}: {e}"))?;
                let mut m = model;
                let want = Outcome::Removed(m.remove(k).is_some());
                if r != want {
                    return Err(format!("{what}: {r:?}, the model says {want:?}"));
                }
                states.push(m);
            }
            TOp::Incr(k, d) => {
                let r = live.sess.as_mut().unwrap().apply(&key(*k), Op::Incr(*d));
                let want = engine::incr_value(model.get(k).map(|v| v.as_slice()), *d);
                match (r, want) {
                    (Ok(Outcome::Int(n)), Ok(m)) if n == m => {
                        let mut m = model;
                        m.insert(*k, n.to_string().into_bytes());
                        states.push(m);
                    }
                    (Err(Error::NotInteger), Err(Error::NotInteger)) => {}
                    (r, w) => return Err(format!("{what}: {r:?}, the model says {w:?}")),
                }
            }
            TOp::Merge(k, e, p, v) => {
                let payload = leaf_edit(*e, *p, *v);
                let r = live
                    .sess
                    .as_mut()
                    .unwrap()
                    .apply(&key(*k), Op::Merge(&payload));
                let want = engine::merge_value(model.get(k).map(|v| v.as_slice()), &payload);
                match (r, want) {
                    (Ok(Outcome::Merged(n)), Ok(new)) if n == new.len() => {
                        let mut m = model;
                        m.insert(*k, new);
                        states.push(m);
                    }
                    (Err(_), Err(_)) => {}
                    (r, w) => return Err(format!("{what}: {r:?}, the model says {w:?}")),
                }
            }
            TOp::Get(k) => {
                let mut out = Vec::new();
                let found = live
                    .sess
                    .as_mut()
                    .unwrap()
                    .get(&key(*k), &mut out)
                    .map_err(|e| format!("{what}: {e}"))?;
                if found.then_some(&out) != model.get(k) {
                    return Err(format!("{what}: {out:?}, the model has {:?}", model.get(k)));
                }
            }
            TOp::Commit => {
                live.sess
                    .as_mut()
                    .unwrap()
                    .commit()
                    .map_err(|e| format!("{what}: {e}"))?;
                states = vec![model];
            }
            TOp::Kill => {
                let image = std::fs::read(&live.path).unwrap();
                live.shut();
                std::fs::remove_file(&live.path).unwrap();
                gen += 1;
                let next = d.path().join(format!("g{gen}"));
                std::fs::write(&next, &image).unwrap();
                live = Live::open(&next);
                let got = live.read_all();
                check_prefix(&got, &states, &what)?;
                states = vec![got];
            }
            TOp::Restart => {
                live.shut();
                live = Live::open(&live.path.clone());
                let got = live.read_all();
                check_prefix(&got, &states, &what)?;
                states = vec![got];
            }
        }
    }
    let got = live.read_all();
    if &got != states.last().unwrap() {
        return Err(format!("end: {got:?}, the model has {:?}", states.last()));
    }
    live.sess.as_mut().unwrap().commit().unwrap();
    let st = live.store.as_ref().unwrap();
    if !drain_within(st, 30) {
        return Err("end: the drain did not finish".into());
    }
    st.verify().map_err(|e| format!("end: verify: {e}"))?;
    live.shut();
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("EMBER_PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(24),
        max_shrink_iters: 200,
        timeout: 60_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn group_commit_through_the_file_keeps_a_prefix_after_kills(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        if let Err(e) = run(&ops) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// Whatever the gleaner is doing, the records a session wrote stay readable
/// while staged: a writer session keeps writing one key (each record's `prev`
/// its last one) across many commits while the gleaner walks the chains.
#[test]
fn staged_chains_read_back_under_a_running_gleaner() {
    let d = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = d.path().join("h");
    let heap = Heap::create(&path, &heap_opts(16 << 20, 64 << 20, Persist::Msync)).unwrap();
    let st = BulletStore::create(&heap, &opts()).unwrap();
    let mut s = st.session().unwrap();
    let mut out = Vec::new();
    for round in 0..300u32 {
        for k in 0..NKEYS {
            let v = value(k, (round % 251) as u8);
            s.apply(&key(k), Op::Put(&v)).unwrap();
            assert!(s.get(&key(k), &mut out).unwrap());
            assert_eq!(out, v);
        }
        if round % 3 == 2 {
            s.commit().unwrap();
        }
        if round % 50 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    s.commit().unwrap();
    assert!(heap.region().persist_stats().writes_through > 0);
    drop(s);
    assert!(drain_within(&st, 30));
    st.verify().unwrap();
    st.close().unwrap();
}
