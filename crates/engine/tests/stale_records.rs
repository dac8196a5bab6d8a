//! A record from before a crash must not replay after the next one.
//!
//! Recovery finds a log's tail by reading records from the head while they
//! check. Positions are reused after a crash: if a power loss keeps record B
//! but loses record A before it, recovery stops at A, and the next run appends
//! from A's position. When a new record N ends exactly where B starts (equal
//! sizes), the next recovery must not read on into B: B is from before the
//! first crash, and N, acknowledged since, is the key's value. Every record
//! carries the generation of the open that wrote it, and recovery requires
//! generations not to decrease along a log, nor to fall below the log's floor
//! (the generation its head was persisted under, for a drained log).
//!
//! The power loss is made deterministic: the store is closed, and A's bytes
//! are garbled in the file, as a loss of A's page would leave them.

mod common;

use common::*;
use engine::bullet::{BulletOptions, BulletRecovery, BulletStore, Variant};
use engine::direct::BackendKind;
use engine::{Op, Session, Store};
use pmem::{Heap, Strategy as Persist};
use std::path::Path;
use std::time::Duration;

const VLEN: usize = 100;

fn opts() -> BulletOptions {
    BulletOptions {
        // One log: every record goes to it, in order.
        logs: 1,
        // Nothing applies records behind the test's back (a drain does).
        static_gleaners: 0,
        epoch: Duration::from_millis(5),
        ..bullet_opts(Variant::Full, BackendKind::LogFree, 64 << 10)
    }
}

fn heap_o() -> pmem::HeapOptions {
    heap_opts(8 << 20, 8 << 20, Persist::FenceOnly)
}

fn value(tag: u8) -> Vec<u8> {
    let mut v = format!("VALUE-{}-", tag as char).into_bytes();
    v.resize(VLEN, tag.to_ascii_lowercase());
    v
}

fn open(path: &Path) -> (BulletStore, BulletRecovery) {
    let rec = Heap::open(path, &heap_o()).unwrap();
    BulletStore::open(rec, &opts()).unwrap()
}

fn get(st: &BulletStore, key: &str) -> Option<Vec<u8>> {
    let mut s = st.session().unwrap();
    let mut out = Vec::new();
    s.get(key.as_bytes(), &mut out).unwrap().then_some(out)
}

fn put(st: &BulletStore, key: &str, v: &[u8]) {
    let mut s = st.session().unwrap();
    s.apply(key.as_bytes(), Op::Put(v)).unwrap();
    s.commit().unwrap();
}

/// Garbles the record whose payload is `payload` in the closed heap file at
/// `path` (one byte of its payload: its checksum no longer matches).
fn lose(path: &Path, payload: &[u8]) {
    let mut img = std::fs::read(path).unwrap();
    let at = img
        .windows(payload.len())
        .position(|w| w == payload)
        .expect("the record is in the file");
    assert!(
        !img[at + 1..].windows(payload.len()).any(|w| w == payload),
        "one copy"
    );
    img[at + VLEN / 2] ^= 0x5a;
    std::fs::write(path, img).unwrap();
}

/// Run 1 writes A (`key-one`) then B (`key-two`); a power loss keeps B and
/// loses A. Run 2 recovers neither, writes N (`key-two`, A's size) at A's
/// position, and either leaves it in the log or drains the log (its head then
/// rests at B's position). After the next crash `key-two` must be N.
fn scenario(drain: bool) {
    let d = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = d.path().join("heap");
    {
        let heap = Heap::create(&path, &heap_o()).unwrap();
        let st = BulletStore::create(&heap, &opts()).unwrap();
        put(&st, "key-one", &value(b'A'));
        put(&st, "key-two", &value(b'B'));
        st.close().unwrap();
    }
    lose(&path, &value(b'A'));

    {
        let (st, rec) = open(&path);
        assert_eq!(rec.records, 0, "recovery stops at the lost record");
        assert_eq!(get(&st, "key-one"), None);
        assert_eq!(get(&st, "key-two"), None);
        put(&st, "key-two", &value(b'N'));
        assert_eq!(get(&st, "key-two"), Some(value(b'N')));
        if drain {
            st.drain().unwrap();
            assert_eq!(st.log_occupancy_bytes().0, 0);
        }
        st.close().unwrap();
    }

    // The next crash: the file as run 2 left it.
    let (st, rec) = open(&path);
    assert_eq!(
        rec.records,
        if drain { 0 } else { 1 },
        "a record from before the first crash was read as live"
    );
    assert_eq!(
        get(&st, "key-two"),
        Some(value(b'N')),
        "the acknowledged write lost"
    );
    assert_eq!(get(&st, "key-one"), None);

    // And the store goes on: a write after it survives a reopen.
    put(&st, "key-three", &value(b'C'));
    st.close().unwrap();
    drop(st);
    let (st, _) = open(&path);
    assert_eq!(get(&st, "key-two"), Some(value(b'N')));
    assert_eq!(get(&st, "key-three"), Some(value(b'C')));
    st.close().unwrap();
}

#[test]
fn a_stale_record_behind_a_reused_position_is_not_replayed() {
    scenario(false);
}

#[test]
fn a_stale_record_at_a_drained_head_is_not_replayed() {
    scenario(true);
}
