//! Offline verification of the Raft state a node keeps in its heap (the keys
//! [`crate::storage`] and the state machine write under [`RAFT_PREFIX`]), for
//! `ember check`.
//!
//! [`check_log`] reads through any engine [`Session`] (only `get` and `scan`)
//! and verifies:
//! - the range (`first`, `last`, the term of entry `first - 1`): 24 bytes,
//!   `first ≥ 1`, `last ≥ first - 1`, the term before `first` 0 when
//!   `first = 1` (there is no entry 0) and at least 1 otherwise;
//! - every entry `first..=last` is present, parses as a raft-rs `Entry`,
//!   carries its own index and a term of at least 1, terms never decrease
//!   along the log (starting from the term recorded before `first`), and its
//!   data is one of the kinds the node writes: empty (a new leader's entry),
//!   a write batch (tag 0, decoded with [`WriteBatch::from_bytes`]), a
//!   compaction point (tag 1 and a u64 no beyond the entry itself), an
//!   event (tag 2: its data is the server's), or a raft-rs configuration
//!   change;
//! - no entry key lies outside the range (compaction and suffix replacement
//!   remove theirs) and no key under the prefix is unknown;
//! - the hard state parses, its commit lies in `[first - 1, last]` and its
//!   term is at least the last entry's;
//! - the configuration parses and names at least one voter, none twice, none
//!   0, none also a learner;
//! - the applied index is 8 bytes, at most the commit index and at least
//!   `first - 1` (entries are dropped only once applied);
//! - the members' addresses ([`PEERS_KEY`]), when recorded, parse as
//!   `--peers` does and name every member of the configuration; a
//!   configuration change adding a node names its address;
//! - a snapshot install's mark ([`SNAP_MARK`]: the snapshot file's length
//!   and its trailer's CRC-32, 12 bytes) is reported, not counted as a
//!   problem: a crash interrupted the install, and the node finishes it
//!   from its snapshot file at its next start.
//!
//! Nothing here panics or loops on corrupt input: every length and index is
//! checked, and the problems listed are capped ([`MAX_PROBLEMS`]).

use crate::node::{parse_peers, TAG_COMPACT, TAG_DATA, TAG_EVENT};
use crate::storage::{entry_key, APPLIED_KEY, PEERS_KEY, RAFT_PREFIX, SNAP_MARK};
use engine::{Session, WriteBatch};
use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, HardState,
};
use std::collections::BTreeSet;

/// At most this many problems are listed; the rest are counted in one line.
pub const MAX_PROBLEMS: usize = 100;

/// Entries of a range are looked up one by one when the range claims at
/// most this many more than the scan found; a larger claim (a corrupt range
/// of billions) is reported from the scan's keys alone.
const MAX_EXTRA_LOOKUPS: u64 = 1 << 16;

/// What [`check_log`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogReport {
    /// The range recorded (or, when it is missing or unreadable, the span of
    /// the entry keys found).
    pub first: u64,
    pub last: u64,
    /// The recorded term of entry `first - 1`.
    pub before_term: u64,
    /// Entries present in `first..=last`.
    pub entries: u64,
    /// The term of the last entry present (the term before `first` when none).
    pub last_term: u64,
    /// The hard state (zeros when none was persisted yet).
    pub term: u64,
    pub vote: u64,
    pub commit: u64,
    /// The applied index (0 when none was persisted yet).
    pub applied: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// Entries by kind.
    pub batches: u64,
    /// Operations in the write batches.
    pub batch_ops: u64,
    pub compactions: u64,
    /// Events (the server's Pub/Sub messages).
    pub events: u64,
    /// Entries without data (each new leader's first).
    pub empty: u64,
    pub conf_changes: u64,
    /// Keys under [`RAFT_PREFIX`] the scan found.
    pub keys: u64,
    /// The members' addresses recorded with the configuration (none before
    /// the first membership change or snapshot).
    pub peers: Option<String>,
    /// The length of the snapshot file whose install a crash interrupted
    /// (the install's mark).
    pub install_interrupted: Option<u64>,
    /// Everything wrong, as sentences; empty when the state is consistent.
    pub problems: Vec<String>,
}

/// Problems, capped at [`MAX_PROBLEMS`] listed.
#[derive(Default)]
struct Problems {
    list: Vec<String>,
    more: u64,
}

impl Problems {
    fn push(&mut self, p: String) {
        if self.list.len() < MAX_PROBLEMS {
            self.list.push(p);
        } else {
            self.more += 1;
        }
    }

    fn finish(mut self) -> Vec<String> {
        if self.more > 0 {
            self.list
                .push(format!("... and {} more problems", self.more));
        }
        self.list
    }
}

fn meta_key(tag: u8) -> Vec<u8> {
    let mut k = RAFT_PREFIX.to_vec();
    k.push(tag);
    k
}

/// Keys under the prefix, sorted by what they are.
#[derive(Default)]
struct Found {
    /// Indexes of well-formed entry keys.
    entries: BTreeSet<u64>,
    /// Keys under the prefix that are no key the log writes.
    unknown: Vec<Vec<u8>>,
    count: u64,
}

/// Scans the whole store for keys under [`RAFT_PREFIX`].
fn scan_raft_keys(sess: &mut dyn Session, probs: &mut Problems) -> Found {
    let mut seen: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut cursor = 0u64;
    let mut batch = Vec::new();
    loop {
        batch.clear();
        let next = match sess.scan(cursor, 1024, &mut batch) {
            Ok(n) => n,
            Err(e) => {
                probs.push(format!("scanning the store for the log's keys: {e}"));
                break;
            }
        };
        for k in batch.drain(..) {
            if k.starts_with(RAFT_PREFIX) {
                seen.insert(k);
            }
        }
        if next == 0 {
            break;
        }
        // A split-order cursor only grows: a step that does not move on
        // would scan forever.
        if next <= cursor {
            probs.push(format!(
                "the store's scan went back from cursor {cursor} to {next}: keys may be missed"
            ));
            break;
        }
        cursor = next;
    }
    let known: Vec<Vec<u8>> = [b'h', b'c', b'r'].map(meta_key).into_iter().collect();
    let mut f = Found {
        count: seen.len() as u64,
        ..Found::default()
    };
    for k in seen {
        let rest = &k[RAFT_PREFIX.len()..];
        match rest {
            [b'e', idx @ ..] if idx.len() == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(idx);
                f.entries.insert(u64::from_be_bytes(b));
            }
            // A virtual apply lane's mark (`storage::lane_key`).
            [b'v', l] if u64::from(*l) < crate::storage::VLANES => {}
            _ if k == APPLIED_KEY || k == PEERS_KEY || k == SNAP_MARK || known.contains(&k) => {}
            _ => f.unknown.push(k),
        }
    }
    f
}

/// A run of missing entries, reported as one problem.
#[derive(Default)]
struct Gap(Option<(u64, u64)>);

impl Gap {
    fn missing(&mut self, i: u64, probs: &mut Problems) {
        match &mut self.0 {
            Some((_, b)) if b.checked_add(1) == Some(i) => *b = i,
            _ => {
                self.close(probs);
                self.0 = Some((i, i));
            }
        }
    }

    fn close(&mut self, probs: &mut Problems) {
        match self.0.take() {
            Some((a, b)) if a == b => probs.push(format!("entry {a} is missing")),
            Some((a, b)) => probs.push(format!("entries {a}..={b} are missing")),
            None => {}
        }
    }
}

/// A key for a problem text: printable bytes as they are, others as `\xNN`.
fn show_key(k: &[u8]) -> String {
    let mut s = String::new();
    for &b in k {
        if b.is_ascii_graphic() {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s
}

/// Reads `key`, a problem when the read fails.
fn read(sess: &mut dyn Session, key: &[u8], out: &mut Vec<u8>, probs: &mut Problems) -> bool {
    match sess.get(key, out) {
        Ok(found) => found,
        Err(e) => {
            probs.push(format!("reading {}: {e}", show_key(key)));
            false
        }
    }
}

/// Verifies the Raft state kept in `sess`'s store (see the module docs).
/// None when the store holds no key under [`RAFT_PREFIX`] (a node that never
/// ran replicated); otherwise the report, whose `problems` list what is wrong.
pub fn check_log(sess: &mut dyn Session) -> Option<LogReport> {
    let mut probs = Problems::default();
    let found = scan_raft_keys(sess, &mut probs);
    if found.count == 0 && probs.list.is_empty() {
        return None;
    }
    let mut r = LogReport {
        keys: found.count,
        ..LogReport::default()
    };
    let mut v = Vec::new();

    // The range, or the span of the entries found when it is unusable.
    let span = || match (found.entries.first(), found.entries.last()) {
        (Some(&a), Some(&b)) => (a, b),
        _ => (1, 0),
    };
    let mut range_ok = false;
    if read(sess, &meta_key(b'r'), &mut v, &mut probs) {
        match <[u8; 24]>::try_from(v.as_slice()) {
            Ok(b) => {
                let word = |i: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&b[i * 8..i * 8 + 8]);
                    u64::from_le_bytes(w)
                };
                let (first, last, before) = (word(0), word(1), word(2));
                r.before_term = before;
                if first == 0 {
                    probs.push(format!(
                        "the range starts at entry 0 (last {last}): entries start at 1"
                    ));
                } else if last < first - 1 {
                    probs.push(format!(
                        "the range ends before it starts: first {first}, last {last}"
                    ));
                } else {
                    range_ok = true;
                    (r.first, r.last) = (first, last);
                    if first == 1 && before != 0 {
                        probs.push(format!(
                            "the range starts at entry 1 but records term {before} for entry 0 \
                             (there is none: 0)"
                        ));
                    } else if first > 1 && before == 0 {
                        probs.push(format!(
                            "the range records term 0 for entry {} (compacted entries have a \
                             term of at least 1)",
                            first - 1
                        ));
                    }
                }
            }
            Err(_) => probs.push(format!("the range is {} bytes, not 24", v.len())),
        }
    } else {
        probs.push("the store holds raft keys but no range (raft/r)".into());
    }
    if !range_ok {
        (r.first, r.last) = span();
    }

    // The entries of the range, in order.
    let (first, last) = (r.first, r.last);
    let claimed: u128 = (u128::from(last) + 1).saturating_sub(u128::from(first));
    let in_range: Vec<u64> = found.entries.range(first..=last).copied().collect();
    let lookups: Box<dyn Iterator<Item = u64>> =
        if claimed <= in_range.len() as u128 + u128::from(MAX_EXTRA_LOOKUPS) {
            Box::new((first..=last).take(claimed as usize))
        } else {
            probs.push(format!(
                "the range {first}..={last} claims {claimed} entries; the store holds {} of them",
                in_range.len()
            ));
            Box::new(in_range.iter().copied())
        };
    let mut prev_term = r.before_term;
    let mut gap = Gap::default();
    for i in lookups {
        if !read(sess, &entry_key(i), &mut v, &mut probs) {
            gap.missing(i, &mut probs);
            continue;
        }
        gap.close(&mut probs);
        let e = match Entry::parse_from_bytes(&v) {
            Ok(e) => e,
            Err(err) => {
                probs.push(format!(
                    "entry {i} does not parse as a raft entry ({} bytes): {err}",
                    v.len()
                ));
                continue;
            }
        };
        r.entries += 1;
        if e.index != i {
            probs.push(format!("entry {i} says it is entry {}", e.index));
        }
        if e.term == 0 {
            probs.push(format!("entry {i} has term 0"));
        }
        if e.term < prev_term {
            probs.push(format!(
                "entry {i} has term {} after term {prev_term}: terms never decrease along the log",
                e.term
            ));
        }
        prev_term = prev_term.max(e.term);
        r.last_term = e.term;
        check_data(&e, i, &mut r, &mut probs);
    }
    gap.close(&mut probs);
    if r.entries == 0 {
        r.last_term = r.before_term;
    }

    // Entry keys outside the range (when it is known) and unknown keys;
    // each re-read, as a scan may return a key removed meanwhile.
    if range_ok {
        let outside: Vec<u64> = found
            .entries
            .iter()
            .copied()
            .filter(|&i| i < first || i > last)
            .collect();
        for i in outside {
            if read(sess, &entry_key(i), &mut v, &mut probs) {
                probs.push(format!(
                    "entry {i} is in the store but outside the range {first}..={last}"
                ));
            }
        }
    }
    for k in &found.unknown {
        if read(sess, k, &mut v, &mut probs) {
            probs.push(format!(
                "{} is under the raft prefix but is no key the log writes",
                show_key(k)
            ));
        }
    }

    // The configuration.
    if read(sess, &meta_key(b'c'), &mut v, &mut probs) {
        match ConfState::parse_from_bytes(&v) {
            Ok(cs) => {
                r.voters = cs.voters.clone();
                r.learners = cs.learners.clone();
                if cs.voters.is_empty() {
                    probs.push("the configuration has no voter".into());
                }
                let mut ids = BTreeSet::new();
                for &id in cs.voters.iter().chain(&cs.learners) {
                    if id == 0 {
                        probs.push("the configuration names node 0".into());
                    } else if !ids.insert(id) {
                        probs.push(format!("the configuration names node {id} twice"));
                    }
                }
            }
            Err(e) => probs.push(format!("the configuration does not parse: {e}")),
        }
    } else {
        probs.push("the store holds raft keys but no configuration (raft/c)".into());
    }

    // The hard state (none before the first Ready persisted one).
    let mut hs_ok = true;
    if read(sess, &meta_key(b'h'), &mut v, &mut probs) {
        match HardState::parse_from_bytes(&v) {
            Ok(hs) => (r.term, r.vote, r.commit) = (hs.term, hs.vote, hs.commit),
            Err(e) => {
                hs_ok = false;
                probs.push(format!("the hard state does not parse: {e}"));
            }
        }
    }
    if hs_ok {
        if r.commit > last {
            probs.push(format!(
                "the commit index {} is beyond the log's last entry {last}",
                r.commit
            ));
        }
        if r.commit < first.saturating_sub(1) {
            probs.push(format!(
                "the commit index {} is below entry {} (the log dropped entries that were not \
                 committed)",
                r.commit,
                first.saturating_sub(1)
            ));
        }
        if r.term < r.last_term {
            probs.push(format!(
                "the hard state's term {} is below the last entry's term {}",
                r.term, r.last_term
            ));
        }
    }

    // The applied index.
    if read(sess, APPLIED_KEY, &mut v, &mut probs) {
        match <[u8; 8]>::try_from(v.as_slice()) {
            Ok(b) => r.applied = u64::from_le_bytes(b),
            Err(_) => probs.push(format!("the applied index is {} bytes, not 8", v.len())),
        }
    }
    if hs_ok && r.applied > r.commit {
        probs.push(format!(
            "the applied index {} is beyond the commit index {}",
            r.applied, r.commit
        ));
    }
    if r.applied < first.saturating_sub(1) {
        probs.push(format!(
            "the applied index {} is below entry {} (the log dropped entries not yet applied)",
            r.applied,
            first.saturating_sub(1)
        ));
    }
    // The members' addresses and an interrupted install.
    if read(sess, PEERS_KEY, &mut v, &mut probs) {
        match std::str::from_utf8(&v)
            .map_err(|e| e.to_string())
            .and_then(parse_peers)
        {
            Ok(peers) => {
                for id in r.voters.iter().chain(&r.learners) {
                    if !peers.iter().any(|p| p.id == *id) {
                        probs.push(format!(
                            "node {id} of the configuration has no address in the members' \
                             list (raft/p)"
                        ));
                    }
                }
                r.peers = Some(String::from_utf8_lossy(&v).into_owned());
            }
            Err(e) => probs.push(format!("the members' list (raft/p) does not parse: {e}")),
        }
    }
    if read(sess, SNAP_MARK, &mut v, &mut probs) {
        // The file's length (u64) and its trailer's CRC-32 (u32), as
        // `HeapStorage::install` writes them.
        match <[u8; 12]>::try_from(v.as_slice()) {
            Ok(b) => {
                let len: [u8; 8] = b[..8].try_into().unwrap_or_default();
                r.install_interrupted = Some(u64::from_le_bytes(len));
            }
            Err(_) => probs.push(format!(
                "the snapshot install mark is {} bytes, not 12",
                v.len()
            )),
        }
    }
    r.problems = probs.finish();
    Some(r)
}

/// Checks an entry's data against the kinds the node writes and counts it.
fn check_data(e: &Entry, i: u64, r: &mut LogReport, probs: &mut Problems) {
    match e.get_entry_type() {
        EntryType::EntryNormal => match e.data.first() {
            None => r.empty += 1,
            Some(&TAG_DATA) => match WriteBatch::from_bytes(&e.data[1..]) {
                Ok(b) => {
                    r.batches += 1;
                    r.batch_ops += b.len() as u64;
                }
                Err(err) => probs.push(format!("entry {i}'s write batch does not decode: {err}")),
            },
            Some(&TAG_COMPACT) => match <[u8; 8]>::try_from(&e.data[1..]) {
                Ok(b) => {
                    r.compactions += 1;
                    let point = u64::from_le_bytes(b);
                    if point > i {
                        probs.push(format!(
                            "entry {i} is a compaction to {point}, beyond itself"
                        ));
                    }
                }
                Err(_) => probs.push(format!(
                    "entry {i} is a compaction whose point is {} bytes, not 8",
                    e.data.len() - 1
                )),
            },
            Some(&TAG_EVENT) => r.events += 1,
            Some(t) => probs.push(format!(
                "entry {i}'s data is of no known kind (first byte {t:#04x})"
            )),
        },
        EntryType::EntryConfChange => match ConfChange::parse_from_bytes(&e.data) {
            Ok(cc) => {
                r.conf_changes += 1;
                let adds = matches!(
                    cc.get_change_type(),
                    ConfChangeType::AddNode | ConfChangeType::AddLearnerNode
                );
                if cc.node_id == 0 {
                    probs.push(format!("entry {i} changes the membership of node 0"));
                } else if adds {
                    // The new member's address, as `--peers` spells it.
                    let spec = std::str::from_utf8(&cc.context)
                        .map_err(|e| e.to_string())
                        .and_then(parse_peers);
                    match spec.as_deref() {
                        Ok([p]) if p.id == cc.node_id => {}
                        _ => probs.push(format!(
                            "entry {i} adds node {} without its address (context {:?})",
                            cc.node_id,
                            String::from_utf8_lossy(&cc.context)
                        )),
                    }
                }
            }
            Err(err) => probs.push(format!(
                "entry {i}'s configuration change does not parse: {err}"
            )),
        },
        EntryType::EntryConfChangeV2 => match ConfChangeV2::parse_from_bytes(&e.data) {
            Ok(_) => r.conf_changes += 1,
            Err(err) => probs.push(format!(
                "entry {i}'s configuration change does not parse: {err}"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::HeapStorage;
    use engine::direct::DirectStore;
    use engine::Store;
    use pmem::{Geometry, Heap, HeapOptions, Strategy};

    fn heap_opts() -> HeapOptions {
        HeapOptions {
            size: 8 << 20,
            geometry: Geometry::small(),
            strategy: Strategy::FenceOnly,
            ..Default::default()
        }
    }

    fn entry(index: u64, term: u64, data: Vec<u8>) -> Entry {
        Entry {
            index,
            term,
            data: data.into(),
            ..Default::default()
        }
    }

    fn batch_data(key: &[u8]) -> Vec<u8> {
        let mut b = WriteBatch::new();
        b.put(key, b"v");
        b.incr(b"counter", 1);
        let mut d = vec![TAG_DATA];
        d.extend_from_slice(b.as_bytes());
        d
    }

    /// A store with a good log: entries 3..=8 (1 and 2 compacted away),
    /// commit 7, applied 6, voters 1, 2, 3.
    struct Fixture {
        _dir: tempfile::TempDir,
        st: DirectStore,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let heap = Heap::create(&dir.path().join("h"), &heap_opts()).unwrap();
            let st = DirectStore::create(&heap, &Default::default()).unwrap();
            let mut log = HeapStorage::open(Box::new(st.session().unwrap()), &[1, 2, 3]).unwrap();
            let mut compact = vec![TAG_COMPACT];
            compact.extend_from_slice(&3u64.to_le_bytes());
            let ents = vec![
                entry(1, 1, Vec::new()),
                entry(2, 1, batch_data(b"a")),
                entry(3, 1, batch_data(b"b")),
                entry(4, 2, Vec::new()),
                entry(5, 2, batch_data(b"c")),
                entry(6, 2, compact),
                entry(7, 2, batch_data(b"d")),
                entry(8, 2, vec![TAG_EVENT, 0, 1, 0, 0, 0, b'c', b'm']),
            ];
            let hs = HardState {
                term: 2,
                vote: 1,
                commit: 7,
                ..Default::default()
            };
            log.persist(&ents, Some(&hs)).unwrap();
            log.compact(3).unwrap();
            drop(log);
            let f = Fixture { _dir: dir, st };
            f.put(APPLIED_KEY, &6u64.to_le_bytes());
            f
        }

        fn put(&self, key: &[u8], value: &[u8]) {
            let mut b = WriteBatch::new();
            b.put(key, value);
            self.st
                .session()
                .unwrap()
                .apply_batch(&b, &mut Vec::new())
                .unwrap();
        }

        fn remove(&self, key: &[u8]) {
            let mut b = WriteBatch::new();
            b.remove(key);
            self.st
                .session()
                .unwrap()
                .apply_batch(&b, &mut Vec::new())
                .unwrap();
        }

        fn put_entry(&self, e: &Entry) {
            self.put(&entry_key(e.index), &e.write_to_bytes().unwrap());
        }

        fn put_hs(&self, term: u64, commit: u64) {
            let hs = HardState {
                term,
                vote: 1,
                commit,
                ..Default::default()
            };
            self.put(&meta_key(b'h'), &hs.write_to_bytes().unwrap());
        }

        fn check(&self) -> LogReport {
            check_log(&mut self.st.session().unwrap()).expect("a raft log")
        }

        /// The report's problems, which must contain `want`.
        fn expect(&self, want: &str) -> LogReport {
            let r = self.check();
            assert!(
                r.problems.iter().any(|p| p.contains(want)),
                "no problem containing {want:?} in {:?}",
                r.problems
            );
            r
        }
    }

    #[test]
    fn a_good_log_is_consistent_and_counted() {
        let f = Fixture::new();
        let r = f.check();
        assert_eq!(r.problems, Vec::<String>::new());
        assert_eq!((r.first, r.last, r.before_term), (3, 8, 1));
        assert_eq!(r.entries, 6);
        assert_eq!((r.term, r.vote, r.commit, r.applied), (2, 1, 7, 6));
        assert_eq!(r.last_term, 2);
        assert_eq!(r.voters, vec![1, 2, 3]);
        assert_eq!((r.batches, r.batch_ops), (3, 6));
        assert_eq!(
            (r.compactions, r.events, r.empty, r.conf_changes),
            (1, 1, 1, 0)
        );
        // 6 entries, range, hard state, configuration, applied.
        assert_eq!(r.keys, 10);
    }

    #[test]
    fn a_store_without_raft_keys_has_no_report() {
        let dir = tempfile::tempdir().unwrap();
        let heap = Heap::create(&dir.path().join("h"), &heap_opts()).unwrap();
        let st = DirectStore::create(&heap, &Default::default()).unwrap();
        let mut s = st.session().unwrap();
        let mut b = WriteBatch::new();
        b.put(b"k", b"v");
        s.apply_batch(&b, &mut Vec::new()).unwrap();
        assert_eq!(check_log(&mut s), None);
    }

    #[test]
    fn a_new_log_with_no_entry_is_consistent() {
        let dir = tempfile::tempdir().unwrap();
        let heap = Heap::create(&dir.path().join("h"), &heap_opts()).unwrap();
        let st = DirectStore::create(&heap, &Default::default()).unwrap();
        drop(HeapStorage::open(Box::new(st.session().unwrap()), &[1, 2, 3]).unwrap());
        let r = check_log(&mut st.session().unwrap()).unwrap();
        assert_eq!(r.problems, Vec::<String>::new());
        assert_eq!(
            (r.first, r.last, r.entries, r.commit, r.applied),
            (1, 0, 0, 0, 0)
        );
    }

    #[test]
    fn a_missing_entry_is_found() {
        let f = Fixture::new();
        f.remove(&entry_key(5));
        let r = f.expect("entry 5 is missing");
        assert_eq!(r.entries, 5);
        f.remove(&entry_key(6));
        f.expect("entries 5..=6 are missing");
    }

    #[test]
    fn an_entry_with_the_wrong_index_is_found() {
        let f = Fixture::new();
        // The entry stored for 5 says it is 7.
        f.put(
            &entry_key(5),
            &entry(7, 2, Vec::new()).write_to_bytes().unwrap(),
        );
        f.expect("entry 5 says it is entry 7");
    }

    #[test]
    fn a_decreasing_term_is_found() {
        let f = Fixture::new();
        f.put_entry(&entry(7, 1, batch_data(b"d")));
        f.expect("entry 7 has term 1 after term 2");
        // Below the term recorded for the entry before the range too.
        let f = Fixture::new();
        f.put_entry(&entry(3, 0, batch_data(b"b")));
        f.expect("entry 3 has term 0 after term 1");
    }

    #[test]
    fn a_commit_beyond_the_last_entry_is_found() {
        let f = Fixture::new();
        f.put_hs(2, 9);
        f.expect("the commit index 9 is beyond the log's last entry 8");
        // And a hard state whose term is behind the log's.
        f.put_hs(1, 7);
        f.expect("the hard state's term 1 is below the last entry's term 2");
    }

    #[test]
    fn an_applied_index_beyond_the_commit_is_found() {
        let f = Fixture::new();
        f.put(APPLIED_KEY, &8u64.to_le_bytes());
        f.expect("the applied index 8 is beyond the commit index 7");
        f.put(APPLIED_KEY, &1u64.to_le_bytes());
        f.expect("the applied index 1 is below entry 2");
        f.put(APPLIED_KEY, b"123");
        f.expect("the applied index is 3 bytes, not 8");
    }

    #[test]
    fn garbage_bytes_are_found_without_a_panic() {
        let f = Fixture::new();
        f.put(&entry_key(4), &[0xFF; 16]);
        f.expect("entry 4 does not parse as a raft entry");
        let f = Fixture::new();
        f.put(&meta_key(b'h'), &[0xFF; 5]);
        f.expect("the hard state does not parse");
        f.put(&meta_key(b'c'), &[0xFF; 5]);
        f.expect("the configuration does not parse");
        f.put(&meta_key(b'r'), b"short");
        f.expect("the range is 5 bytes, not 24");
        // An entry whose write batch is truncated, and one of no known kind.
        let f = Fixture::new();
        let mut d = batch_data(b"c");
        d.truncate(d.len() - 3);
        f.put_entry(&entry(5, 2, d));
        f.expect("entry 5's write batch does not decode");
        f.put_entry(&entry(7, 2, vec![9, 1, 2]));
        f.expect("entry 7's data is of no known kind (first byte 0x09)");
        f.put_entry(&entry(6, 2, vec![TAG_COMPACT, 1]));
        f.expect("entry 6 is a compaction whose point is 1 bytes, not 8");
        let mut e = entry(8, 2, vec![0xFF; 7]);
        e.set_entry_type(EntryType::EntryConfChange);
        f.put_entry(&e);
        f.expect("entry 8's configuration change does not parse");
    }

    #[test]
    fn a_corrupt_range_is_found_without_scanning_it() {
        let f = Fixture::new();
        let mut b = Vec::new();
        for w in [1u64, u64::MAX, 0] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        f.put(&meta_key(b'r'), &b);
        let r = f.expect("claims 18446744073709551615 entries; the store holds 6 of them");
        // The commit and applied indexes are then within it: no other
        // complaint about them.
        assert_eq!(r.entries, 6);
        let mut b = Vec::new();
        for w in [5u64, 3, 1] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        f.put(&meta_key(b'r'), &b);
        f.expect("the range ends before it starts: first 5, last 3");
        f.remove(&meta_key(b'r'));
        f.expect("no range");
    }

    #[test]
    fn stray_keys_are_found() {
        let f = Fixture::new();
        f.put_entry(&entry(2, 1, batch_data(b"a")));
        f.expect("entry 2 is in the store but outside the range 3..=8");
        let f = Fixture::new();
        f.put_entry(&entry(9, 2, Vec::new()));
        f.expect("entry 9 is in the store but outside the range 3..=8");
        let mut k = RAFT_PREFIX.to_vec();
        k.extend_from_slice(b"zz");
        f.put(&k, b"?");
        f.expect("raft/zz is under the raft prefix but is no key the log writes");
    }

    #[test]
    fn a_bad_configuration_is_found() {
        let f = Fixture::new();
        f.put(
            &meta_key(b'c'),
            &ConfState::default().write_to_bytes().unwrap(),
        );
        f.expect("the configuration has no voter");
        let cs = ConfState {
            voters: vec![1, 2, 2],
            learners: vec![0],
            ..Default::default()
        };
        f.put(&meta_key(b'c'), &cs.write_to_bytes().unwrap());
        f.expect("names node 2 twice");
        f.expect("names node 0");
        f.remove(&meta_key(b'c'));
        f.expect("no configuration");
    }

    #[test]
    fn random_bytes_in_every_key_never_panic() {
        let f = Fixture::new();
        let mut keys: Vec<Vec<u8>> = [b'r', b'h', b'c'].map(meta_key).into_iter().collect();
        keys.extend([APPLIED_KEY, PEERS_KEY, SNAP_MARK].map(<[u8]>::to_vec));
        keys.extend((1..=9).map(entry_key));
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..300 {
            let k = &keys[(next() % keys.len() as u64) as usize];
            let n = (next() % 40) as usize;
            let v: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            f.put(k, &v);
            let r = f.check();
            assert!(r.problems.len() <= MAX_PROBLEMS + 1);
        }
    }

    #[test]
    fn membership_records_are_checked() {
        let f = Fixture::new();
        let all = "1=127.0.0.1:1:2,2=127.0.0.1:3:4,3=127.0.0.1:5:6";
        f.put(PEERS_KEY, all.as_bytes());
        let r = f.check();
        assert_eq!(r.problems, Vec::<String>::new());
        assert_eq!(r.peers.as_deref(), Some(all));
        f.put(PEERS_KEY, b"1=127.0.0.1:1:2,2=127.0.0.1:3:4");
        f.expect("node 3 of the configuration has no address in the members' list");
        f.put(PEERS_KEY, b"nonsense");
        f.expect("the members' list (raft/p) does not parse");
        // A configuration change adding node 4 names its address.
        let f = Fixture::new();
        let mut cc = ConfChange::default();
        cc.set_change_type(ConfChangeType::AddNode);
        cc.node_id = 4;
        cc.context = b"4=127.0.0.1:7:8".to_vec().into();
        let conf_entry = |cc: &ConfChange| {
            let mut e = entry(8, 2, cc.write_to_bytes().unwrap());
            e.set_entry_type(EntryType::EntryConfChange);
            e
        };
        f.put_entry(&conf_entry(&cc));
        let r = f.check();
        assert_eq!(r.problems, Vec::<String>::new());
        assert_eq!((r.conf_changes, r.batches), (1, 3));
        cc.context = b"5=127.0.0.1:7:8".to_vec().into();
        f.put_entry(&conf_entry(&cc));
        f.expect("entry 8 adds node 4 without its address");
    }

    #[test]
    fn an_interrupted_install_is_reported_but_no_problem() {
        let f = Fixture::new();
        // As `HeapStorage::install` writes it: length, then CRC-32.
        let mut mark = 9000u64.to_le_bytes().to_vec();
        mark.extend_from_slice(&0xdead_beefu32.to_le_bytes());
        f.put(SNAP_MARK, &mark);
        let r = f.check();
        assert_eq!(r.problems, Vec::<String>::new());
        assert_eq!(r.install_interrupted, Some(9000));
        f.put(SNAP_MARK, &9u64.to_le_bytes());
        f.expect("the snapshot install mark is 8 bytes, not 12");
    }
}
