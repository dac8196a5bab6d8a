//! WATCH: which connections watch which keys, and the writes that make
//! their next EXEC fail (Redis's `touchWatchedKey`).
//!
//! Every write is applied by [`crate::keyspace::Keyspace::apply`] under its
//! keys' stripe locks; when anyone watches (one load of [`Watches::active`]
//! otherwise), it touches each database key it wrote here before the locks
//! go. EXEC locks its watched keys' stripes before it reads a connection's
//! `dirty` flag, so a write either touched the flag before that read or
//! comes after the transaction.
//!
//! A key that had expired (but was not yet deleted) when it was watched is
//! flagged so: deleting it is no change (a watcher does not fail on it),
//! and EXEC fails when a watched key that was live has expired since
//! (Redis 7.0's `isWatchedKeyExpired`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One watcher of one key.
struct Watcher {
    client: u64,
    dirty: Arc<AtomicBool>,
    /// The key had expired when it was watched (see the module's text).
    expired: Arc<AtomicBool>,
}

/// The server's watched keys.
#[derive(Default)]
pub struct Watches {
    /// Watch entries (a connection watching a key); 0 makes a write's check
    /// one load.
    active: AtomicUsize,
    map: Mutex<HashMap<Vec<u8>, Vec<Watcher>>>,
}

/// What one connection watches.
#[derive(Default)]
pub struct Watching {
    /// Store keys, with their "expired when watched" flags.
    pub keys: Vec<(Vec<u8>, Arc<AtomicBool>)>,
    /// Set by a write to one of them: the next EXEC fails.
    pub dirty: Arc<AtomicBool>,
}

impl Watches {
    /// Whether any connection watches a key.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::SeqCst) > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Vec<Watcher>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connection `client` watches store key `skey` (once: a key it already
    /// watches is left as it is); `expired`: the key has expired but is
    /// still stored.
    pub fn watch(&self, client: u64, w: &mut Watching, skey: &[u8], expired: bool) {
        if w.keys.iter().any(|(k, _)| k == skey) {
            return;
        }
        let flag = Arc::new(AtomicBool::new(expired));
        self.lock().entry(skey.to_vec()).or_default().push(Watcher {
            client,
            dirty: w.dirty.clone(),
            expired: flag.clone(),
        });
        self.active.fetch_add(1, Ordering::SeqCst);
        w.keys.push((skey.to_vec(), flag));
    }

    /// Forgets every key `client` watches and clears its dirty flag (UNWATCH,
    /// EXEC, DISCARD, RESET, a closed connection).
    pub fn unwatch_all(&self, client: u64, w: &mut Watching) {
        if !w.keys.is_empty() {
            let mut map = self.lock();
            for (k, _) in w.keys.drain(..) {
                if let Some(list) = map.get_mut(&k) {
                    let before = list.len();
                    list.retain(|x| x.client != client);
                    self.active.fetch_sub(before - list.len(), Ordering::SeqCst);
                    if list.is_empty() {
                        map.remove(&k);
                    }
                }
            }
        }
        w.dirty.store(false, Ordering::SeqCst);
    }

    /// A write to `skey` was applied (`removed`: it deleted the key): its
    /// watchers' next EXEC fails, except where the key had expired when
    /// watched and is now deleted (no logical change).
    pub fn touch(&self, skey: &[u8], removed: bool) {
        let map = self.lock();
        let Some(list) = map.get(skey) else {
            return;
        };
        for w in list {
            if removed && w.expired.swap(false, Ordering::SeqCst) {
                continue;
            }
            w.dirty.store(true, Ordering::SeqCst);
        }
    }

    /// Watch entries (a connection watching a key).
    pub fn count(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_dirties_its_watchers_only() {
        let ws = Watches::default();
        let (mut a, mut b) = (Watching::default(), Watching::default());
        ws.watch(1, &mut a, b"\0x", false);
        ws.watch(1, &mut a, b"\0x", false);
        ws.watch(2, &mut b, b"\0y", false);
        assert_eq!(ws.count(), 2);
        ws.touch(b"\0x", false);
        assert!(a.dirty.load(Ordering::SeqCst));
        assert!(!b.dirty.load(Ordering::SeqCst));
        ws.unwatch_all(1, &mut a);
        assert!(!a.dirty.load(Ordering::SeqCst));
        assert_eq!(ws.count(), 1);
        ws.touch(b"\0x", false);
        assert!(!a.dirty.load(Ordering::SeqCst));
        ws.unwatch_all(2, &mut b);
        assert!(!ws.active());
    }

    #[test]
    fn deleting_a_key_expired_when_watched_is_no_change() {
        let ws = Watches::default();
        let mut a = Watching::default();
        ws.watch(1, &mut a, b"\0x", true);
        ws.touch(b"\0x", true);
        assert!(!a.dirty.load(Ordering::SeqCst));
        // Deleted, it is a plain watched key now: a new value is a change.
        ws.touch(b"\0x", false);
        assert!(a.dirty.load(Ordering::SeqCst));
    }
}
