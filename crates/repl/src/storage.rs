//! The Raft log in the persistent heap: raft-rs's [`Storage`] over an engine
//! [`Session`].
//!
//! Every entry, the hard state (term, vote, commit), the configuration and
//! the log's range are store values under internal keys that begin with
//! [`RAFT_PREFIX`] (0xFF 0xFF: not a key of any database, so scans, counts,
//! expiry and FLUSHALL pass them by). One Ready's new entries, its hard state
//! and the range are written as **one** [`WriteBatch`]: one crash-atomic
//! append with one persist barrier (the store's), before the messages that
//! depend on them are sent. The state machine writes [`APPLIED_KEY`] in the
//! same batch as each entry's effects, which makes apply exactly-once.
//!
//! Reads (raft-rs asks for entries to send, terms, the range) are served by a
//! [`MemStorage`] kept equal to what is persisted: loaded once at open and
//! then written through. Compaction ([`HeapStorage::compact`]) drops the
//! entries every member already has (the leader decides the point through
//! a log entry: see `node`); there are no snapshots yet, so a lagging or
//! restarted follower always catches up from entries.

use engine::{Session, WriteBatch};
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage};

/// The first bytes of every store key the replication layer writes.
pub const RAFT_PREFIX: &[u8] = &[0xFF, 0xFF, b'r', b'a', b'f', b't', b'/'];
/// The last applied index (u64 little-endian), written by the state machine
/// in the batch of each entry it applies.
pub const APPLIED_KEY: &[u8] = &[0xFF, 0xFF, b'r', b'a', b'f', b't', b'/', b'a'];

fn meta_key(tag: u8) -> Vec<u8> {
    let mut k = RAFT_PREFIX.to_vec();
    k.push(tag);
    k
}

/// The store key of log entry `index` (big-endian, so keys sort by index).
pub fn entry_key(index: u64) -> Vec<u8> {
    let mut k = meta_key(b'e');
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// The applied index found in the store (0 when nothing was applied).
pub fn read_applied(sess: &mut dyn Session) -> engine::Result<u64> {
    let mut v = Vec::new();
    if !sess.get(APPLIED_KEY, &mut v)? {
        return Ok(0);
    }
    let b: [u8; 8] = v
        .as_slice()
        .try_into()
        .map_err(|_| engine::Error::Corrupt("raft applied index".into()))?;
    Ok(u64::from_le_bytes(b))
}

/// Errors opening or writing the log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(transparent)]
    Store(#[from] engine::Error),
    #[error("corrupt raft log: {0}")]
    Corrupt(String),
}

/// raft-rs's storage, persisted in the heap (see the module docs).
pub struct HeapStorage {
    mem: MemStorage,
    sess: Box<dyn Session>,
    /// The persisted range: entries `first..=last` (none when last < first).
    first: u64,
    last: u64,
    batch: WriteBatch,
}

fn corrupt(what: &str) -> LogError {
    LogError::Corrupt(what.to_string())
}

impl HeapStorage {
    /// Opens the log kept in `sess`'s store. A store with no log yet starts
    /// one whose configuration is `voters` (every node of a new cluster is
    /// started with the same list, as raft-rs's bootstrap expects).
    pub fn open(mut sess: Box<dyn Session>, voters: &[u64]) -> Result<HeapStorage, LogError> {
        let mut v = Vec::new();
        let mem = MemStorage::new();
        let (first, last);
        if sess.get(&meta_key(b'r'), &mut v)? {
            let b: [u8; 24] = v.as_slice().try_into().map_err(|_| corrupt("range"))?;
            first = u64::from_le_bytes(b[0..8].try_into().unwrap_or_default());
            last = u64::from_le_bytes(b[8..16].try_into().unwrap_or_default());
            let before_term = u64::from_le_bytes(b[16..24].try_into().unwrap_or_default());
            if first == 0 || last + 1 < first {
                return Err(corrupt("range"));
            }
            let mut cs = ConfState::default();
            if sess.get(&meta_key(b'c'), &mut v)? {
                cs = ConfState::parse_from_bytes(&v).map_err(|_| corrupt("conf state"))?;
            }
            let mut hs = HardState::default();
            if sess.get(&meta_key(b'h'), &mut v)? {
                hs = HardState::parse_from_bytes(&v).map_err(|_| corrupt("hard state"))?;
            }
            let mut core = mem.wl();
            if first > 1 {
                let mut snap = Snapshot::default();
                snap.mut_metadata().index = first - 1;
                snap.mut_metadata().term = before_term;
                snap.mut_metadata().set_conf_state(cs.clone());
                core.apply_snapshot(snap).map_err(|_| corrupt("range"))?;
            }
            let mut ents = Vec::with_capacity((last + 1 - first) as usize);
            for i in first..=last {
                if !sess.get(&entry_key(i), &mut v)? {
                    return Err(LogError::Corrupt(format!("entry {i} missing")));
                }
                let e = Entry::parse_from_bytes(&v)
                    .map_err(|_| LogError::Corrupt(format!("entry {i}")))?;
                if e.index != i {
                    return Err(LogError::Corrupt(format!("entry {i} says {}", e.index)));
                }
                ents.push(e);
            }
            core.append(&ents).map_err(|_| corrupt("entries"))?;
            core.set_conf_state(cs);
            core.set_hardstate(hs);
        } else {
            first = 1;
            last = 0;
            let cs = ConfState {
                voters: voters.to_vec(),
                ..Default::default()
            };
            let mut b = WriteBatch::new();
            b.put(
                &meta_key(b'c'),
                &cs.write_to_bytes().map_err(|_| corrupt("conf"))?,
            );
            b.put(&meta_key(b'r'), &range_bytes(first, last, 0));
            sess.apply_batch(&b, &mut Vec::new())?;
            sess.commit()?;
            mem.wl().set_conf_state(cs);
        }
        Ok(HeapStorage {
            mem,
            sess,
            first,
            last,
            batch: WriteBatch::new(),
        })
    }

    /// Persists one Ready's new entries (which may replace a conflicting
    /// suffix) and hard state in one crash-atomic batch, then makes them
    /// visible to raft-rs's reads.
    pub fn persist(&mut self, ents: &[Entry], hs: Option<&HardState>) -> Result<(), LogError> {
        if ents.is_empty() && hs.is_none() {
            return Ok(());
        }
        self.batch.clear();
        let mut last = self.last;
        if let (Some(f), Some(l)) = (ents.first(), ents.last()) {
            if f.index < self.first || f.index > self.last + 1 {
                return Err(LogError::Corrupt(format!(
                    "append at {} to a log of {}..={}",
                    f.index, self.first, self.last
                )));
            }
            for e in ents {
                let bytes = e.write_to_bytes().map_err(|_| corrupt("entry"))?;
                self.batch.put(&entry_key(e.index), &bytes);
            }
            // A conflicting suffix longer than the new entries goes.
            for i in l.index + 1..=self.last {
                self.batch.remove(&entry_key(i));
            }
            last = l.index;
            let before = self.before_term()?;
            self.batch
                .put(&meta_key(b'r'), &range_bytes(self.first, last, before));
        }
        if let Some(hs) = hs {
            let bytes = hs.write_to_bytes().map_err(|_| corrupt("hard state"))?;
            self.batch.put(&meta_key(b'h'), &bytes);
        }
        self.sess.apply_batch(&self.batch, &mut Vec::new())?;
        self.sess.commit()?;
        self.last = last;
        let mut core = self.mem.wl();
        if !ents.is_empty() {
            core.append(ents).map_err(|_| corrupt("append"))?;
        }
        if let Some(hs) = hs {
            core.set_hardstate(hs.clone());
        }
        Ok(())
    }

    /// Records a new commit index (LightReady's), persisted with the hard
    /// state.
    pub fn commit_to(&mut self, index: u64) -> Result<(), LogError> {
        let mut hs = self.mem.rl().hard_state().clone();
        if index <= hs.commit {
            return Ok(());
        }
        hs.commit = index;
        self.persist(&[], Some(&hs))
    }

    /// Drops the entries below `to` (the log then starts at `to`): their
    /// removal and the new range are one crash-atomic batch. The term of
    /// entry `to - 1` is kept with the range, as raft-rs asks for it.
    pub fn compact(&mut self, to: u64) -> Result<(), LogError> {
        let to = to.min(self.last + 1);
        if to <= self.first {
            return Ok(());
        }
        let before = self
            .mem
            .term(to - 1)
            .map_err(|e| LogError::Corrupt(e.to_string()))?;
        self.batch.clear();
        for i in self.first..to {
            self.batch.remove(&entry_key(i));
        }
        self.batch
            .put(&meta_key(b'r'), &range_bytes(to, self.last, before));
        self.sess.apply_batch(&self.batch, &mut Vec::new())?;
        self.sess.commit()?;
        self.first = to;
        // MemStorage keeps the term of the entry before its first only
        // through a snapshot's metadata: install one (no data) at to - 1.
        let kept = if to <= self.last {
            self.mem
                .entries(to, self.last + 1, None, GetEntriesContext::empty(false))
                .map_err(|e| LogError::Corrupt(e.to_string()))?
        } else {
            Vec::new()
        };
        let cs = self
            .mem
            .initial_state()
            .map_err(|e| LogError::Corrupt(e.to_string()))?
            .conf_state;
        let mut core = self.mem.wl();
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = to - 1;
        snap.mut_metadata().term = before;
        snap.mut_metadata().set_conf_state(cs);
        let hs = core.hard_state().clone();
        core.apply_snapshot(snap)
            .map_err(|e| LogError::Corrupt(e.to_string()))?;
        core.append(&kept)
            .map_err(|e| LogError::Corrupt(e.to_string()))?;
        core.set_hardstate(hs);
        Ok(())
    }

    /// Raises the persisted commit index to `index` (within the log) if it
    /// is lower.
    pub fn raise_commit(&mut self, index: u64) -> Result<(), LogError> {
        let commit = self.mem.rl().hard_state().commit;
        if index > commit && index <= self.last {
            self.commit_to(index)?;
        }
        Ok(())
    }

    fn before_term(&self) -> Result<u64, LogError> {
        if self.first <= 1 {
            return Ok(0);
        }
        self.mem
            .term(self.first - 1)
            .map_err(|e| LogError::Corrupt(e.to_string()))
    }

    /// The persisted entries' range.
    pub fn range(&self) -> (u64, u64) {
        (self.first, self.last)
    }

    /// The session the log writes with (the node reads the applied index
    /// through it at start).
    pub fn session(&mut self) -> &mut dyn Session {
        &mut *self.sess
    }
}

fn range_bytes(first: u64, last: u64, before_term: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(24);
    v.extend_from_slice(&first.to_le_bytes());
    v.extend_from_slice(&last.to_le_bytes());
    v.extend_from_slice(&before_term.to_le_bytes());
    v
}

impl Storage for HeapStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        // The log is compacted only below every member's matched index,
        // so raft-rs never needs one: a follower is always sent entries. Refusing (rather than handing
        // out MemStorage's empty snapshot) keeps a follower from ever
        // believing it has state it was not sent.
        let _ = (request_index, to);
        Err(raft::Error::Store(
            raft::StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}
