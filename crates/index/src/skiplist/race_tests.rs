//! A remover and an inserter of the same key, driven through one
//! interleaving with hooks: the inserter's `find` sees the old node live at
//! level 1 and pauses before level 0; the remover freezes and marks the old
//! node and pauses before its last `find`; the inserter goes on (snips the
//! old node at level 0, links its new node there and at level 1); the
//! remover's `find` then ends. The old node must not stay linked at level 1
//! behind the new one: its remover retires it, and once its block was
//! reused a level could form a cycle (every `find` for a larger key looped
//! forever).
use super::*;
use pmem::HeapOptions;
use std::sync::mpsc::channel;
use std::time::Duration;

fn k(x: u64) -> [u8; 8] {
    x.to_be_bytes()
}

/// Level `l` from the head, at most `max` nodes.
fn walk(list: &SkipList, l: usize, max: usize) -> Vec<u64> {
    let r = list.inner.heap.region();
    let mut out = Vec::new();
    let mut c = ptr(link::load(r, next_at(list.inner.head, l)));
    while c != 0 && out.len() < max {
        out.push(c);
        c = ptr(link::load(r, next_at(c, l)));
    }
    out
}

fn run(cache: bool) {
    let dir = tempfile::tempdir().unwrap();
    let heap = Heap::create(
        &dir.path().join("h"),
        &HeapOptions {
            size: 64 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let list = SkipList::create(
        &heap,
        &SkipOptions {
            link_cache: cache,
            ..Default::default()
        },
    )
    .unwrap();
    const K: u64 = 1000;
    FORCE_H.with(|c| c.set(2));
    let mut hb = list.handle().unwrap();
    assert!(hb.insert(&k(K), b"old").unwrap());
    let old = hb.locate(&k(K)).unwrap().0.raw();
    assert_eq!(walk(&list, 1, 10), vec![old]);

    let (paused_tx, paused_rx) = channel::<()>();
    let (resume_tx, resume_rx) = channel::<()>();
    let (done_tx, done_rx) = channel::<()>();
    let l2 = list.clone();
    let a = std::thread::spawn(move || {
        FORCE_H.with(|c| c.set(2));
        let mut ha = l2.handle().unwrap();
        let mut armed = true;
        HOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |at, l| {
                if armed && at == "find_level" && l == 0 {
                    armed = false;
                    paused_tx.send(()).unwrap();
                    resume_rx.recv().unwrap();
                }
            }))
        });
        let new = ha.insert(&k(K), b"new").unwrap();
        HOOK.with(|h| *h.borrow_mut() = None);
        done_tx.send(()).unwrap();
        new
    });
    paused_rx.recv().unwrap();
    let mut once = Some((resume_tx, done_rx));
    HOOK.with(|h| {
        *h.borrow_mut() = Some(Box::new(move |at, _| {
            if at == "remove_before_find" {
                if let Some((rt, dr)) = once.take() {
                    rt.send(()).unwrap();
                    dr.recv().unwrap();
                }
            }
        }))
    });
    assert!(hb.remove(&k(K)).unwrap());
    HOOK.with(|h| *h.borrow_mut() = None);
    assert!(a.join().unwrap(), "the insert found no live key");
    let new = hb.locate(&k(K)).unwrap().0.raw();
    assert_ne!(new, old);
    assert_eq!(
        walk(&list, 1, 10),
        vec![new],
        "the removed node is still linked"
    );
    assert_eq!(list.verify(true).unwrap().keys, 1);

    // The old node's block goes back to the allocator; new nodes below K
    // (height 2) may reuse it. A find for a key above K still ends.
    drop(hb);
    list.inner.domain.collect();
    let mut hc = list.handle().unwrap();
    for x in 0..200 {
        hc.insert(&k(x), b"x").unwrap();
    }
    drop(hc);
    let l3 = list.clone();
    let (tx, rx) = channel::<()>();
    std::thread::spawn(move || {
        let mut hd = l3.handle().unwrap();
        hd.insert(&k(2000), b"z").unwrap();
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("an insert above K did not end");
    assert_eq!(list.verify(true).unwrap().keys, 202);
}

#[test]
fn removed_node_not_hidden_behind_its_successor() {
    run(false);
}

#[test]
fn removed_node_not_hidden_behind_its_successor_link_cache() {
    run(true);
}
