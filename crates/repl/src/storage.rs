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
//! then written through. Compaction ([`HeapStorage::compact`]) drops
//! applied entries (the leader decides the point through a log entry: see
//! `node`); a member that needs entries no longer kept gets a snapshot.
//!
//! # Snapshots
//! A snapshot is the leader's keyspace as it stands at an applied index:
//! every store key and its stored bytes (the heap's own value encoding, not
//! a serialisation), written by [`dump_to`] into a file beside the heap
//! ([`write_dump`]) while the apply thread is held between entries. What
//! raft-rs carries in `Snapshot.data` is only a small [`SnapDesc`] (the
//! index, the file's length and CRC-32, where to fetch it, the members'
//! addresses); the bytes travel in chunks (`net`) into the receiver's own
//! file ([`SnapSink`]: written as they come, checked against the
//! descriptor's length and CRC before raft-rs sees the snapshot). The
//! receiver installs it with [`HeapStorage::install`]: it checks the file
//! again, appends the snapshot's metadata to it (synced, renamed to the
//! install file), marks the store ([`SNAP_MARK`]: the file's length and the
//! CRC-32 of that trailer), replaces every non-Raft key reading the records
//! from the file one at a time, then in one batch resets its log to begin
//! after the snapshot, records the snapshot's index as applied and drops
//! the mark, and removes the file. A store opened with the mark still there
//! (a crash mid-install) finishes the install from the file: it rolls
//! forward, never back, since the node may have told the leader that it
//! holds entries the snapshot replaces.

use engine::{Session, WriteBatch};
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The first bytes of every store key the replication layer writes.
pub const RAFT_PREFIX: &[u8] = &[0xFF, 0xFF, b'r', b'a', b'f', b't', b'/'];
/// The last applied index (u64 little-endian), written by the state machine
/// in the batch of each entry it applies.
pub const APPLIED_KEY: &[u8] = &[0xFF, 0xFF, b'r', b'a', b'f', b't', b'/', b'a'];

/// Set while a snapshot is being installed (see the module docs).
pub const SNAP_MARK: &[u8] = &[0xFF, 0xFF, b'r', b'a', b'f', b't', b'/', b's'];

/// The members' addresses (`ID=HOST:RAFTPORT:PORT,...`), kept with the
/// configuration so that members added online are known after a restart.
pub const PEERS_KEY: &[u8] = &[0xFF, 0xFF, b'r', b'a', b'f', b't', b'/', b'p'];

/// Virtual apply lanes: a data entry whose keys have one owner is applied
/// on lane `owner % VLANES` (mapped onto the node's apply threads), and
/// records its index under that lane's mark ([`lane_key`]).
pub const VLANES: u64 = 64;

/// The store key of virtual lane `v`'s mark: the index of the last entry
/// applied on that lane (u64 little-endian), written in the entry's batch.
pub fn lane_key(v: u64) -> Vec<u8> {
    let mut k = meta_key(b'v');
    k.push(v as u8);
    k
}

/// Every virtual lane's mark (0 where none was written).
pub fn read_lane_marks(sess: &mut dyn Session) -> engine::Result<Vec<u64>> {
    let mut v = Vec::new();
    (0..VLANES)
        .map(|l| {
            if !sess.get(&lane_key(l), &mut v)? {
                return Ok(0);
            }
            let b: [u8; 8] = v
                .as_slice()
                .try_into()
                .map_err(|_| engine::Error::Corrupt(format!("raft lane {l}'s mark")))?;
            Ok(u64::from_le_bytes(b))
        })
        .collect()
}

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
    #[error("snapshot file: {0}")]
    Io(#[from] std::io::Error),
}

/// raft-rs's storage, persisted in the heap (see the module docs).
pub struct HeapStorage {
    mem: MemStorage,
    sess: Box<dyn Session>,
    /// Where a snapshot being installed is kept until it is in.
    snap_file: Option<std::path::PathBuf>,
    /// The snapshot on offer and the requests for one (raft-rs asks through
    /// `&self`; the transport serves the offered file's bytes).
    snap: Shelf,
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
    pub fn open(sess: Box<dyn Session>, voters: &[u64]) -> Result<HeapStorage, LogError> {
        Self::open_with(sess, voters, None)
    }

    /// [`Self::open`], with the file where a snapshot being installed is
    /// kept (`None`: snapshots cannot be installed).
    pub fn open_with(
        mut sess: Box<dyn Session>,
        voters: &[u64],
        snap_file: Option<std::path::PathBuf>,
    ) -> Result<HeapStorage, LogError> {
        let mut v = Vec::new();
        if sess.get(SNAP_MARK, &mut v)? {
            finish_torn_install(&mut *sess, &v, snap_file.as_deref())?;
        }
        // Nothing of an earlier run's snapshots is of use now: dumps it
        // offered, bytes it was receiving or had received, an install file
        // that an install failing before its mark left.
        if let Some(p) = &snap_file {
            remove_stale_files(p);
            let _ = std::fs::remove_file(p);
        }
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
            snap_file,
            snap: Arc::new(Mutex::new(SnapState::default())),
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
        if let Some(f) = ents.first() {
            if f.index < self.first || f.index > self.last + 1 {
                return Err(LogError::Corrupt(format!(
                    "append at {} to a log of {}..={}",
                    f.index, self.first, self.last
                )));
            }
        }
        // In batches that fit the store (a Ready may hold more entries than
        // one store batch takes: many proposals of large values at a
        // leader, a follower's catch-up): each batch puts its entries and
        // the range ending at its last one, so a crash between batches
        // leaves a prefix of them, which Raft allows (this node has not
        // acknowledged any yet). The first batch also removes the whole
        // conflicting suffix a new entry replaces (no stale entry is left
        // past the range) and carries the hard state. One commit at the
        // end: the range key's chain orders the batches' durability.
        let limit = self.sess.batch_limit();
        let before = self.before_term()?;
        let old_last = self.last;
        let mut last = self.last;
        let mut next = 0;
        let mut hs_left = hs;
        while next < ents.len() || hs_left.is_some() {
            self.batch.clear();
            let mut ops = 2;
            if next == 0 {
                if let Some(f) = ents.first() {
                    for i in f.index..=old_last {
                        self.batch.remove(&entry_key(i));
                        ops += 1;
                    }
                }
            }
            if let Some(h) = hs_left.take() {
                let bytes = h.write_to_bytes().map_err(|_| corrupt("hard state"))?;
                self.batch.put(&meta_key(b'h'), &bytes);
            }
            let start = next;
            while let Some(e) = ents.get(next) {
                let bytes = e.write_to_bytes().map_err(|_| corrupt("entry"))?;
                // 64 bytes for the range put that ends the batch.
                let size = self.batch.as_bytes().len() + bytes.len() + 64;
                if next > start && !engine::batch_fits(ops + 1, size, limit) {
                    break;
                }
                self.batch.put(&entry_key(e.index), &bytes);
                ops += 1;
                next += 1;
            }
            if next > start {
                last = ents[next - 1].index;
                self.batch
                    .put(&meta_key(b'r'), &range_bytes(self.first, last, before));
            }
            self.sess.apply_batch(&self.batch, &mut Vec::new())?;
            self.last = last;
        }
        self.sess.commit()?;
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

    /// Installs snapshot `snap` received from the leader, with the hard
    /// state `hs` of its Ready: the keyspace becomes the snapshot's (see the
    /// module docs for the crash-safe order), the log begins after it, and
    /// its index is the applied index. Its bytes are the received file
    /// ([`recv_path`]), checked against the descriptor in `snap.data` before
    /// anything changes. The caller holds the apply thread.
    pub fn install(&mut self, snap: &Snapshot, hs: Option<&HardState>) -> Result<(), LogError> {
        let path = self
            .snap_file
            .clone()
            .ok_or_else(|| corrupt("no file to install a snapshot through"))?;
        let desc = SnapDesc::decode(&snap.data).ok_or_else(|| corrupt("snapshot descriptor"))?;
        let recv = recv_path(&path);
        let mut f = File::open(&recv).map_err(|e| {
            LogError::Corrupt(format!("the snapshot's bytes ({}): {e}", recv.display()))
        })?;
        if f.metadata()?.len() != desc.len || !records_match(&mut f, &desc)? {
            return Err(LogError::Corrupt(format!(
                "the snapshot's bytes ({}) do not match its descriptor",
                recv.display()
            )));
        }
        drop(f);
        // Its metadata after the records, so the file alone can finish
        // an install a crash interrupts.
        let trailer = trailer_bytes(snap)?;
        {
            let mut f = std::fs::OpenOptions::new().append(true).open(&recv)?;
            f.write_all(&trailer)?;
            f.sync_all()?;
        }
        std::fs::rename(&recv, &path)?;
        File::open(dir_of(&path))?.sync_all()?;
        let mut mark = Vec::with_capacity(12);
        mark.extend_from_slice(&(desc.len + trailer.len() as u64).to_le_bytes());
        mark.extend_from_slice(&crc32fast::hash(&trailer).to_le_bytes());
        let mut b = WriteBatch::new();
        b.put(SNAP_MARK, &mark);
        self.sess.apply_batch(&b, &mut Vec::new())?;
        self.sess.commit()?;
        let hs = hs
            .cloned()
            .unwrap_or_else(|| self.mem.rl().hard_state().clone());
        let hs = install_store(
            &mut *self.sess,
            &path,
            snap,
            &desc,
            hs,
            self.first,
            self.last,
        )?;
        let _ = std::fs::remove_file(&path);
        let index = snap.get_metadata().index;
        self.first = index + 1;
        self.last = index;
        let mut core = self.mem.wl();
        core.apply_snapshot(snap.clone())
            .map_err(|e| LogError::Corrupt(e.to_string()))?;
        core.set_hardstate(hs);
        Ok(())
    }

    /// Persists a new configuration (a committed membership change) and
    /// the members' addresses.
    pub fn set_conf(&mut self, cs: &ConfState, peers: &str) -> Result<(), LogError> {
        let mut b = WriteBatch::new();
        b.put(
            &meta_key(b'c'),
            &cs.write_to_bytes().map_err(|_| corrupt("conf"))?,
        );
        b.put(PEERS_KEY, peers.as_bytes());
        self.sess.apply_batch(&b, &mut Vec::new())?;
        self.sess.commit()?;
        self.mem.wl().set_conf_state(cs.clone());
        // A snapshot on offer carries the old configuration: a member just
        // added is not in it and would refuse it.
        self.drop_offer();
        Ok(())
    }

    /// The configuration now.
    pub fn conf_state(&self) -> ConfState {
        self.mem
            .initial_state()
            .map(|s| s.conf_state)
            .unwrap_or_default()
    }

    /// The members' addresses persisted with the configuration, if any.
    pub fn peers(&mut self) -> Result<Option<String>, LogError> {
        let mut v = Vec::new();
        if !self.sess.get(PEERS_KEY, &mut v)? {
            return Ok(None);
        }
        String::from_utf8(v).map(Some).map_err(|_| corrupt("peers"))
    }

    /// Offers the snapshot the leader sends to members that need entries
    /// no longer kept (see [`Storage::snapshot`]); `file` holds its bytes.
    /// The file of the snapshot it replaces is removed (a transfer still
    /// reading it has it open: it goes on).
    pub fn offer_snapshot(&mut self, snap: Snapshot, file: DumpFile) {
        let old = std::mem::replace(
            &mut *self.snap.lock().unwrap_or_else(|p| p.into_inner()),
            SnapState {
                ready: Some((snap, file)),
                wanted: 0,
            },
        );
        if let Some((_, f)) = old.ready {
            let _ = std::fs::remove_file(&f.path);
        }
    }

    /// Withdraws the snapshot on offer, if any, and removes its file.
    pub fn drop_offer(&mut self) {
        let old = self
            .snap
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ready
            .take();
        if let Some((_, f)) = old {
            let _ = std::fs::remove_file(&f.path);
        }
    }

    /// The index of the snapshot on offer and its file.
    pub fn offered(&self) -> Option<(u64, PathBuf)> {
        self.snap
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ready
            .as_ref()
            .map(|(s, f)| (s.get_metadata().index, f.path.clone()))
    }

    /// Where the snapshot on offer is kept, for the transport that serves
    /// its bytes ([`open_offered`]).
    pub fn shelf(&self) -> Shelf {
        self.snap.clone()
    }

    /// The lowest index a member asked a snapshot for since the last
    /// offer (0: none asked).
    pub fn snapshot_wanted(&self) -> u64 {
        self.snap.lock().unwrap_or_else(|p| p.into_inner()).wanted
    }

    /// The term of entry `index` when the log still knows it.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        self.mem.term(index).ok()
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

/// Every store key outside the Raft state, in `sess`'s store (a scan may
/// return a key twice; callers tolerate it).
fn for_each_data_key(
    sess: &mut dyn Session,
    mut f: impl FnMut(&mut dyn Session, Vec<u8>) -> Result<(), LogError>,
) -> Result<(), LogError> {
    let mut cursor = 0u64;
    let mut page = Vec::new();
    loop {
        page.clear();
        let next = sess.scan(cursor, 256, &mut page)?;
        for k in page.drain(..) {
            if !k.starts_with(RAFT_PREFIX) {
                f(sess, k)?;
            }
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Removes every non-Raft key, in batches of a few hundred.
fn wipe_data(sess: &mut dyn Session) -> Result<(), LogError> {
    let mut b = WriteBatch::new();
    for_each_data_key(sess, |sess, k| {
        b.remove(&k);
        if b.len() >= 512 {
            sess.apply_batch(&b, &mut Vec::new())?;
            b.clear();
        }
        Ok(())
    })?;
    if !b.is_empty() {
        sess.apply_batch(&b, &mut Vec::new())?;
    }
    Ok(())
}

/// A crash interrupted a snapshot's install (`mark`: [`SNAP_MARK`]'s
/// value): finishes it from the snapshot's file, once it is found whole
/// (its length, its trailer's CRC, its records' CRC), reading the records
/// one at a time.
fn finish_torn_install(
    sess: &mut dyn Session,
    mark: &[u8],
    snap_file: Option<&Path>,
) -> Result<(), LogError> {
    let m: [u8; 12] = mark.try_into().map_err(|_| corrupt("snapshot mark"))?;
    let len = u64::from_le_bytes(m[0..8].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(m[8..12].try_into().unwrap_or_default());
    let path = snap_file
        .ok_or_else(|| corrupt("a snapshot's install was interrupted; its file is unknown"))?;
    let unreadable = |e: std::io::Error| {
        LogError::Corrupt(format!(
            "a snapshot's install was interrupted and its file {} cannot be read: {e}",
            path.display()
        ))
    };
    let mismatch = || {
        LogError::Corrupt(format!(
            "a snapshot's install was interrupted and its file {} does not match",
            path.display()
        ))
    };
    let mut f = File::open(path).map_err(unreadable)?;
    if f.metadata().map_err(unreadable)?.len() != len {
        return Err(mismatch());
    }
    let (snap, desc) = read_trailer(&mut f, len, crc)
        .map_err(unreadable)?
        .ok_or_else(mismatch)?;
    if !records_match(&mut f, &desc)? {
        return Err(mismatch());
    }
    drop(f);
    let mut v = Vec::new();
    let (mut first, mut last) = (1, 0);
    if sess.get(&meta_key(b'r'), &mut v)? {
        let r: [u8; 24] = v.as_slice().try_into().map_err(|_| corrupt("range"))?;
        first = u64::from_le_bytes(r[0..8].try_into().unwrap_or_default());
        last = u64::from_le_bytes(r[8..16].try_into().unwrap_or_default());
    }
    let mut hs = HardState::default();
    if sess.get(&meta_key(b'h'), &mut v)? {
        hs = HardState::parse_from_bytes(&v).map_err(|_| corrupt("hard state"))?;
    }
    install_store(sess, path, &snap, &desc, hs, first, last)?;
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// The store's part of an install, after the mark: every non-Raft key
/// replaced by the records of the file at `path` (read one at a time),
/// then one batch that resets the log (its entries `first..=last`
/// removed) to begin after the snapshot, writes the configuration, the
/// members' addresses, the hard state `hs` (commit raised to the
/// snapshot's index), the applied index, and drops the mark. Returns the
/// hard state written.
fn install_store(
    sess: &mut dyn Session,
    path: &Path,
    snap: &Snapshot,
    desc: &SnapDesc,
    mut hs: HardState,
    first: u64,
    last: u64,
) -> Result<HardState, LogError> {
    let meta = snap.get_metadata();
    let (index, term) = (meta.index, meta.term);
    wipe_data(sess)?;
    let mut recs = RecordReader::new(
        BufReader::with_capacity(1 << 20, File::open(path)?),
        desc.len,
    );
    let mut b = WriteBatch::new();
    let mut bytes = 0;
    let (mut k, mut v) = (Vec::new(), Vec::new());
    while recs.next(&mut k, &mut v)? {
        b.put(&k, &v);
        bytes += k.len() + v.len();
        if bytes >= 1 << 20 || b.len() >= 1024 {
            sess.apply_batch(&b, &mut Vec::new())?;
            b.clear();
            bytes = 0;
        }
    }
    for i in first..=last {
        b.remove(&entry_key(i));
    }
    b.put(&meta_key(b'r'), &range_bytes(index + 1, index, term));
    b.put(
        &meta_key(b'c'),
        &meta
            .get_conf_state()
            .write_to_bytes()
            .map_err(|_| corrupt("conf"))?,
    );
    if !desc.peers.is_empty() {
        b.put(PEERS_KEY, desc.peers.as_bytes());
    }
    hs.commit = hs.commit.max(index);
    hs.term = hs.term.max(term);
    b.put(
        &meta_key(b'h'),
        &hs.write_to_bytes().map_err(|_| corrupt("hard state"))?,
    );
    b.put(APPLIED_KEY, &index.to_le_bytes());
    b.remove(SNAP_MARK);
    sess.apply_batch(&b, &mut Vec::new())?;
    sess.commit()?;
    Ok(hs)
}

/// The keyspace in `sess`'s store as a snapshot's data, written to `out`:
/// every non-Raft key and its stored bytes, as `u32 LE length, key, u32 LE
/// length, value` records. The caller holds the apply thread between
/// entries, so that it is the state at one applied index.
pub fn dump_to(sess: &mut dyn Session, out: &mut dyn Write) -> Result<(), LogError> {
    let mut v = Vec::new();
    for_each_data_key(sess, |sess, k| {
        if sess.get(&k, &mut v)? {
            out.write_all(&(k.len() as u32).to_le_bytes())?;
            out.write_all(&k)?;
            out.write_all(&(v.len() as u32).to_le_bytes())?;
            out.write_all(&v)?;
        }
        Ok(())
    })
}

/// [`dump_to`] into memory (tests and tools; a leader dumps to a file).
pub fn dump(sess: &mut dyn Session) -> Result<Vec<u8>, LogError> {
    let mut out = Vec::new();
    dump_to(sess, &mut out)?;
    Ok(out)
}

/// Appends one of [`dump_to`]'s records.
pub fn push_record(out: &mut Vec<u8>, k: &[u8], v: &[u8]) {
    out.extend_from_slice(&(k.len() as u32).to_le_bytes());
    out.extend_from_slice(k);
    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    out.extend_from_slice(v);
}

/// Reads [`dump_to`]'s records from a file, one at a time: `left` bytes of
/// records, no more.
struct RecordReader<R> {
    r: R,
    left: u64,
}

impl<R: Read> RecordReader<R> {
    fn new(r: R, len: u64) -> Self {
        RecordReader { r, left: len }
    }

    fn field(&mut self, out: &mut Vec<u8>) -> Result<(), LogError> {
        let mut n = [0u8; 4];
        if self.left < 4 {
            return Err(corrupt("snapshot data: a record cut short"));
        }
        self.r.read_exact(&mut n)?;
        let n = u32::from_le_bytes(n) as u64;
        if self.left - 4 < n {
            return Err(corrupt("snapshot data: a record cut short"));
        }
        out.clear();
        out.resize(n as usize, 0);
        self.r.read_exact(out)?;
        self.left -= 4 + n;
        Ok(())
    }

    /// The next record into `k` and `v`; false at the end.
    fn next(&mut self, k: &mut Vec<u8>, v: &mut Vec<u8>) -> Result<bool, LogError> {
        if self.left == 0 {
            return Ok(false);
        }
        self.field(k)?;
        self.field(v)?;
        Ok(true)
    }
}

/// The descriptor of a snapshot: what raft-rs carries in `Snapshot.data`
/// (the bytes themselves travel apart, in chunks: see `net`). Encoded as
/// the magic `EmbSnap1` (its version), `u64 LE` index, `u64 LE` length and
/// `u32 LE` CRC-32 of the records, then the source's Raft address and the
/// members' addresses, each a `u32 LE` length and its UTF-8 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapDesc {
    /// The applied index the keyspace was dumped at.
    pub index: u64,
    /// The records' length and CRC-32.
    pub len: u64,
    pub crc: u32,
    /// The Raft address of the node offering the bytes (the leader that
    /// made it).
    pub source: String,
    /// The members' addresses (`--peers` text), put under [`PEERS_KEY`]
    /// by the install.
    pub peers: String,
}

const DESC_MAGIC: &[u8; 8] = b"EmbSnap1";
/// The last bytes of an install file (after its metadata and their length).
const TRAILER_MAGIC: &[u8; 8] = b"EmbSnapT";

impl SnapDesc {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(36 + self.source.len() + self.peers.len());
        v.extend_from_slice(DESC_MAGIC);
        v.extend_from_slice(&self.index.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v.extend_from_slice(&self.crc.to_le_bytes());
        for s in [&self.source, &self.peers] {
            v.extend_from_slice(&(s.len() as u32).to_le_bytes());
            v.extend_from_slice(s.as_bytes());
        }
        v
    }

    /// None when `b` is not a descriptor of this version.
    pub fn decode(b: &[u8]) -> Option<SnapDesc> {
        let rest = b.strip_prefix(DESC_MAGIC)?;
        let index = u64::from_le_bytes(rest.get(0..8)?.try_into().ok()?);
        let len = u64::from_le_bytes(rest.get(8..16)?.try_into().ok()?);
        let crc = u32::from_le_bytes(rest.get(16..20)?.try_into().ok()?);
        let mut rest = &rest[20..];
        let mut text = || -> Option<String> {
            let n = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
            let s = String::from_utf8(rest.get(4..4 + n)?.to_vec()).ok()?;
            rest = &rest[4 + n..];
            Some(s)
        };
        let (source, peers) = (text()?, text()?);
        rest.is_empty().then_some(SnapDesc {
            index,
            len,
            crc,
            source,
            peers,
        })
    }

    /// Whether `o` describes the same bytes.
    pub fn same_bytes(&self, o: &SnapDesc) -> bool {
        (self.index, self.len, self.crc) == (o.index, o.len, o.crc)
    }
}

/// The metadata appended to the records in an install file:
/// the snapshot (metadata and descriptor) as protobuf, its `u32 LE`
/// length, [`TRAILER_MAGIC`].
fn trailer_bytes(snap: &Snapshot) -> Result<Vec<u8>, LogError> {
    let mut t = snap.write_to_bytes().map_err(|_| corrupt("snapshot"))?;
    let n = t.len() as u32;
    t.extend_from_slice(&n.to_le_bytes());
    t.extend_from_slice(TRAILER_MAGIC);
    Ok(t)
}

/// The snapshot and its descriptor from the trailer of the install file
/// `f` (`len` bytes), when the trailer's CRC-32 is `crc` and the records
/// before it are as long as the descriptor says; None otherwise.
fn read_trailer(f: &mut File, len: u64, crc: u32) -> std::io::Result<Option<(Snapshot, SnapDesc)>> {
    if len < 12 {
        return Ok(None);
    }
    let mut end = [0u8; 12];
    f.seek(SeekFrom::Start(len - 12))?;
    f.read_exact(&mut end)?;
    let n = u64::from(u32::from_le_bytes(end[0..4].try_into().unwrap_or_default()));
    if &end[4..12] != TRAILER_MAGIC || n + 12 > len || n > 64 << 20 {
        return Ok(None);
    }
    let mut t = vec![0u8; n as usize];
    f.seek(SeekFrom::Start(len - 12 - n))?;
    f.read_exact(&mut t)?;
    t.extend_from_slice(&end);
    if crc32fast::hash(&t) != crc {
        return Ok(None);
    }
    let Ok(snap) = Snapshot::parse_from_bytes(&t[..n as usize]) else {
        return Ok(None);
    };
    let Some(desc) = SnapDesc::decode(&snap.data) else {
        return Ok(None);
    };
    if desc.len + n + 12 != len {
        return Ok(None);
    }
    Ok(Some((snap, desc)))
}

/// Whether the first `desc.len` bytes of `f` have `desc.crc` (read in
/// pieces; `f` is at its start again afterwards).
fn records_match(f: &mut File, desc: &SnapDesc) -> Result<bool, LogError> {
    f.seek(SeekFrom::Start(0))?;
    let mut h = crc32fast::Hasher::new();
    let mut left = desc.len;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = f.read(&mut buf[..want])?;
        if n == 0 {
            return Ok(false);
        }
        h.update(&buf[..n]);
        left -= n as u64;
    }
    f.seek(SeekFrom::Start(0))?;
    Ok(h.finalize() == desc.crc)
}

/// The file where a snapshot's bytes are received (`snap_file` + `.part`).
pub fn part_path(snap_file: &Path) -> PathBuf {
    with_suffix(snap_file, ".part")
}

/// The file where a snapshot's bytes are once received whole and checked
/// (`snap_file` + `.recv`), until it is installed or another replaces it.
pub fn recv_path(snap_file: &Path) -> PathBuf {
    with_suffix(snap_file, ".recv")
}

/// The file of a leader's `seq`-th dump (`snap_file` + `.out-SEQ`).
pub fn dump_path(snap_file: &Path, seq: u64) -> PathBuf {
    with_suffix(snap_file, &format!(".out-{seq}"))
}

/// The directory holding `p` (`.` for a bare file name: a heap given as
/// `ember.heap`, in the working directory).
fn dir_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(suffix);
    s.into()
}

/// Removes every snapshot file but the install file itself: an earlier
/// run's dumps, bytes received or being received.
pub fn remove_stale_files(snap_file: &Path) {
    let _ = std::fs::remove_file(part_path(snap_file));
    let _ = std::fs::remove_file(recv_path(snap_file));
    let _ = std::fs::remove_file(with_suffix(snap_file, ".tmp"));
    let Some(name) = snap_file.file_name() else {
        return;
    };
    let dir = dir_of(snap_file);
    let mut prefix = name.to_os_string();
    prefix.push(".out-");
    let prefix = prefix.as_encoded_bytes().to_vec();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_name().as_encoded_bytes().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A leader's dump, written to a file: its path, length and CRC-32.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpFile {
    pub path: PathBuf,
    pub len: u64,
    pub crc: u32,
}

/// Counts and sums what goes through it.
struct Summing<W> {
    w: W,
    h: crc32fast::Hasher,
    n: u64,
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.w.write(b)?;
        self.h.update(&b[..n]);
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// Writes a dump to a new file at `path` as `dump` produces it (through a
/// buffer: the dump is never whole in memory), with its length and CRC-32.
/// The file is not synced: a leader that crashes drops it at its next
/// start ([`remove_stale_files`]). On failure the file is removed.
pub fn write_dump(
    path: &Path,
    dump: impl FnOnce(&mut dyn Write) -> Result<(), String>,
) -> Result<DumpFile, String> {
    let f = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut s = Summing {
        w: BufWriter::with_capacity(1 << 20, f),
        h: crc32fast::Hasher::new(),
        n: 0,
    };
    let r = dump(&mut s).and_then(|()| s.flush().map_err(|e| format!("{}: {e}", path.display())));
    if let Err(e) = r {
        drop(s);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(DumpFile {
        path: path.to_path_buf(),
        len: s.n,
        crc: s.h.finalize(),
    })
}

/// Where a leader keeps the snapshot it offers (shared with the transport,
/// which serves its bytes).
pub type Shelf = Arc<Mutex<SnapState>>;

/// Opens the file of the snapshot on `shelf` when it is the one with this
/// index, length and CRC-32 (None: no longer on offer). Opened under the
/// shelf's lock: a file withdrawn later stays readable through it.
pub fn open_offered(shelf: &Shelf, index: u64, len: u64, crc: u32) -> Option<File> {
    let st = shelf.lock().unwrap_or_else(|p| p.into_inner());
    let (s, f) = st.ready.as_ref()?;
    if s.get_metadata().index != index || f.len != len || f.crc != crc {
        return None;
    }
    File::open(&f.path).ok()
}

/// A snapshot's bytes being received: written to `part` as they come,
/// summed, and checked against the descriptor by [`SnapSink::finish`].
/// Dropped unfinished, it removes its file.
pub struct SnapSink {
    w: Option<BufWriter<File>>,
    part: PathBuf,
    h: crc32fast::Hasher,
    n: u64,
    len: u64,
    crc: u32,
}

impl SnapSink {
    /// Starts receiving the bytes `desc` describes into a new file `part`.
    pub fn create(part: &Path, desc: &SnapDesc) -> std::io::Result<SnapSink> {
        Ok(SnapSink {
            w: Some(BufWriter::with_capacity(1 << 20, File::create(part)?)),
            part: part.to_path_buf(),
            h: crc32fast::Hasher::new(),
            n: 0,
            len: desc.len,
            crc: desc.crc,
        })
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.n
    }

    /// Appends the next chunk.
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), String> {
        if self.n + chunk.len() as u64 > self.len {
            return Err("more bytes than the snapshot's descriptor says".into());
        }
        let w = self.w.as_mut().ok_or("finished")?;
        w.write_all(chunk).map_err(|e| e.to_string())?;
        self.h.update(chunk);
        self.n += chunk.len() as u64;
        Ok(())
    }

    /// Checks the length and CRC-32 received against the descriptor's and,
    /// when they match, moves the file to `dest` ([`recv_path`]).
    pub fn finish(mut self, dest: &Path) -> Result<(), String> {
        let mut w = self.w.take().ok_or("finished")?;
        let r = (|| {
            w.flush().map_err(|e| e.to_string())?;
            drop(w);
            if self.n != self.len {
                return Err(format!("{} bytes received of {}", self.n, self.len));
            }
            let crc = self.h.clone().finalize();
            if crc != self.crc {
                return Err("the bytes received do not match the snapshot's CRC-32".into());
            }
            std::fs::rename(&self.part, dest).map_err(|e| e.to_string())
        })();
        if r.is_err() {
            let _ = std::fs::remove_file(&self.part);
        }
        r
    }
}

impl Drop for SnapSink {
    fn drop(&mut self) {
        if self.w.take().is_some() {
            let _ = std::fs::remove_file(&self.part);
        }
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

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // The snapshot on offer when it is recent enough; otherwise the
        // request is noted (the node has one made off this thread: a dump
        // of the keyspace) and raft-rs asks again later.
        let mut st = self.snap.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((s, _)) = &st.ready {
            let i = s.get_metadata().index;
            if i >= request_index && i + 1 >= self.first {
                return Ok(s.clone());
            }
        }
        st.wanted = if st.wanted == 0 {
            request_index.max(1)
        } else {
            st.wanted.min(request_index.max(1))
        };
        Err(raft::Error::Store(
            raft::StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}

/// The snapshot a leader offers (with the file of its bytes), and what was
/// asked for since.
#[derive(Default)]
pub struct SnapState {
    ready: Option<(Snapshot, DumpFile)>,
    wanted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heap named without a directory (`--heap ember.heap`, the default
    /// in the working directory) has its snapshot files there too: the
    /// install syncs that directory (an empty parent path, opened as it
    /// was, failed every install of such a node: found by the manual run
    /// with a 305 MiB keyspace).
    #[test]
    fn a_bare_file_name_lives_in_the_working_directory() {
        let bare = Path::new("ember.heap.raft-snapshot");
        assert_eq!(dir_of(bare), Path::new("."));
        File::open(dir_of(bare)).unwrap().sync_all().unwrap();
        assert_eq!(dir_of(Path::new("/a/b")), Path::new("/a"));
        assert_eq!(dir_of(Path::new("d/b")), Path::new("d"));
    }
}
