//! The applied flags live in a bitmap after each log's ring (`crl.rs`), so a
//! position's flag outlives its record: before the position is reused, the
//! flag must be clear, durably, or the new record reads as applied after a
//! crash and recovery drops it. The advancer clears the flags of the space it
//! frees (after persisting the head, before `free_to`), and opening a store
//! clears those a crash left between the two (`Pool::clear_stale_flags`).
//!
//! The test: fill a log with old values and drain it, with a crash image at
//! every fence of the drain; recover each image, put new values (they wrap
//! around the ring onto the old records' positions), crash again and recover:
//! every key reads its new value.

mod common;

use common::*;
use engine::bullet::{BulletOptions, BulletStore, Variant};
use engine::direct::BackendKind;
use engine::{Op, Session, Store};
use pmem::Heap;
use std::time::Duration;

const LOG: u64 = 4096;
/// Records of 96 bytes: 40 of them fill 3,840 of the ring's 4,096 bytes.
const KEYS: usize = 40;

fn opts(backend: BackendKind) -> BulletOptions {
    BulletOptions {
        logs: 1,
        // Nothing moves but the drains and the writers' own gleaning.
        epoch: Duration::from_secs(600),
        role_threads: 0,
        static_gleaners: 0,
        ..bullet_opts(Variant::Full, backend, LOG)
    }
}

fn key(i: usize) -> String {
    format!("k{i:04}")
}

/// A value of `tag` that makes a 96-byte record with a 5-byte key.
fn value(tag: &str, i: usize) -> Vec<u8> {
    let mut v = format!("{tag}-{i}-").into_bytes();
    v.resize(48, b'.');
    v
}

fn put_all(store: &BulletStore, tag: &str) {
    let mut s = store.session().unwrap();
    for i in 0..KEYS {
        s.apply(key(i).as_bytes(), Op::Put(&value(tag, i))).unwrap();
    }
}

/// Keys of `store` that do not read their `tag` value.
fn wrong(store: &BulletStore, tag: &str) -> Vec<String> {
    let mut s = store.session().unwrap();
    let mut out = Vec::new();
    (0..KEYS)
        .filter(|&i| !(s.get(key(i).as_bytes(), &mut out).unwrap() && out == value(tag, i)))
        .map(key)
        .collect()
}

fn run(backend: BackendKind) {
    let o = opts(backend);
    let mut bad = Vec::new();
    let mut checked = 0;
    for seed in 0..3u64 {
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let path = dir.path().join("h");
        {
            let heap = Heap::create(&path, &sim_opts()).unwrap();
            BulletStore::create(&heap, &o).unwrap().close().unwrap();
        }
        let (store, sim) = open_bullet_under_sim(&path, &o, seed);
        put_all(&store, "old");
        sim.set_capture_ppm(1_000_000);
        store.drain().unwrap();
        sim.set_capture_ppm(0);
        let images = sim.take_images();
        assert!(images.len() >= 3, "too few fences in the drain");
        drop(store);
        for (n, img) in images.iter().enumerate() {
            let p1 = dir.path().join(format!("a{n}"));
            let (s1, sim1) = recover_bullet(&p1, &img.bytes, &o, seed);
            let w = wrong(&s1, "old");
            assert!(
                w.is_empty(),
                "seed {seed} image {n}: old values lost: {w:?}"
            );
            // New values: their records wrap around onto the old ones' places
            // (after the drain's head, or through a writer's own gleaning when
            // the image has the old head).
            put_all(&s1, "new");
            let img2 = sim1.capture_now(s1.heap().region());
            drop(s1);
            let p2 = dir.path().join(format!("b{n}"));
            let (s2, _) = recover_bullet(&p2, &img2.bytes, &o, seed);
            checked += 1;
            let w = wrong(&s2, "new");
            if !w.is_empty() {
                bad.push(format!(
                    "seed {seed} image {n}: {} keys lost their new value: {w:?}",
                    w.len()
                ));
            } else {
                s2.drain().unwrap();
                if let Err(e) = s2.verify() {
                    bad.push(format!("seed {seed} image {n}: {e}"));
                }
            }
            drop(s2);
            let _ = std::fs::remove_file(&p1);
            let _ = std::fs::remove_file(&p2);
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {checked} images: {bad:#?}",
        bad.len()
    );
}

#[test]
fn a_reused_position_never_reads_as_applied_logfree() {
    run(BackendKind::LogFree);
}

#[test]
fn a_reused_position_never_reads_as_applied_phash() {
    run(BackendKind::PHash);
}
