//! The volatile store: the DRAM table alone. The upper bound of every comparison
//! (Bullet's `volatile`); nothing survives the process, and it says so
//! ([`Durability::Volatile`]).

use crate::table::{prefetch_keys, Blob, Table};
use crate::{
    check_op, incr_value, merge_value, Durability, KeyHasher, Op, Outcome, Result, Session, Store,
    StoreStats,
};
use std::sync::Arc;

/// The DRAM-only store. Clone is cheap.
#[derive(Clone)]
pub struct VolatileStore {
    table: Arc<Table<Blob, ()>>,
    hasher: KeyHasher,
}

impl VolatileStore {
    pub fn new(initial_buckets: usize) -> VolatileStore {
        VolatileStore {
            table: Arc::new(Table::new(initial_buckets)),
            hasher: KeyHasher::random(),
        }
    }

    /// Waits for a background doubling to finish (benchmarks' prefill).
    pub fn wait_resize(&self) {
        self.table.wait_resize();
    }
}

pub struct VolatileSession {
    table: Arc<Table<Blob, ()>>,
    hasher: KeyHasher,
    buf: Vec<u8>,
}

impl Store for VolatileStore {
    type Session = VolatileSession;

    fn session(&self) -> Result<VolatileSession> {
        Ok(VolatileSession {
            table: self.table.clone(),
            hasher: self.hasher,
            buf: Vec::new(),
        })
    }

    fn name(&self) -> String {
        "volatile".into()
    }

    fn durability(&self) -> Durability {
        Durability::Volatile
    }

    fn key_hasher(&self) -> KeyHasher {
        self.hasher
    }

    fn stats(&self) -> StoreStats {
        let n = self.table.len() as u64;
        StoreStats {
            keys: n,
            frontend_entries: n,
            ..Default::default()
        }
    }

    fn close(&self) -> Result<()> {
        Ok(())
    }
}

impl Session for VolatileSession {
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        let g = crossbeam_epoch::pin();
        match self.table.get(self.hasher.hash(key), key, &g) {
            Some(n) => {
                out.extend_from_slice(n.value(&g).get().unwrap_or_default());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn prefetch(&mut self, keys: &[&[u8]]) {
        prefetch_keys(&self.table, &self.hasher, keys);
    }

    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64> {
        Ok(self
            .table
            .scan(cursor, count, |n, _| out.push(n.key().to_vec())))
    }

    fn apply(&mut self, key: &[u8], op: Op<'_>) -> Result<Outcome> {
        check_op(key, &op)?;
        let hash = self.hasher.hash(key);
        let mut l = self.table.lock(hash);
        match op {
            Op::Put(v) => {
                if let Some(n) = l.find(key) {
                    let old_first = n.value(l.guard()).get().and_then(|b| b.first().copied());
                    l.set_value(n, Blob::new(v));
                    Ok(Outcome::Put {
                        created: false,
                        old_first,
                    })
                } else {
                    l.insert(hash, key, Blob::new(v), ());
                    Ok(Outcome::Put {
                        created: true,
                        old_first: None,
                    })
                }
            }
            Op::Remove => Ok(Outcome::Removed(l.remove(key))),
            Op::Incr(d) => {
                let g = l.guard();
                let cur = l.find(key).and_then(|n| n.value(g).get());
                let n = incr_value(cur, d)?;
                self.buf.clear();
                self.buf.extend_from_slice(n.to_string().as_bytes());
                if let Some(node) = l.find(key) {
                    l.set_value(node, Blob::new(&self.buf));
                } else {
                    l.insert(hash, key, Blob::new(&self.buf), ());
                }
                Ok(Outcome::Int(n))
            }
            Op::Merge(p) => {
                let g = l.guard();
                let node = l.find(key);
                let new = merge_value(node.and_then(|n| n.value(g).get()), p)?;
                let len = new.len();
                let node = node.expect("a merge succeeds only on a present value");
                l.set_value(node, Blob::new(&new));
                Ok(Outcome::Merged(len))
            }
        }
    }
}
