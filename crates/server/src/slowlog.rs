//! SLOWLOG (Redis's `slowlog.c` semantics): commands whose execution took
//! at least `slowlog-log-slower-than` microseconds are logged, newest
//! first, up to `slowlog-max-len` entries, with at most 32 arguments (the
//! last one then says how many more there were) of at most 128 bytes each,
//! and secrets redacted (AUTH's password, HELLO's AUTH pair, ACL SETUSER's
//! rules). EXEC, EVAL and the other `skip_slowlog` commands are not logged
//! themselves (the commands they run are, as in Redis). One mutex, taken
//! only for a command that qualifies: the per-command cost otherwise is
//! one relaxed load.

use proto::Reply;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

const MAX_ARGC: usize = 32;
const MAX_STRING: usize = 128;

struct Entry {
    id: u64,
    /// Unix time in seconds.
    time: i64,
    micros: u64,
    args: Vec<Vec<u8>>,
    addr: String,
    name: String,
}

pub struct Slowlog {
    /// `slowlog-log-slower-than` (negative: off).
    slower_than: AtomicI64,
    max_len: AtomicU64,
    next_id: AtomicU64,
    entries: Mutex<VecDeque<Entry>>,
}

impl Slowlog {
    pub fn new(slower_than: i64, max_len: u64) -> Slowlog {
        Slowlog {
            slower_than: AtomicI64::new(slower_than),
            max_len: AtomicU64::new(max_len),
            next_id: AtomicU64::new(0),
            entries: Mutex::new(VecDeque::new()),
        }
    }

    /// CONFIG SET of the two parameters.
    pub fn configure(&self, slower_than: i64, max_len: u64) {
        self.slower_than.store(slower_than, Ordering::Relaxed);
        self.max_len.store(max_len, Ordering::Relaxed);
        let mut e = self.lock();
        while e.len() as u64 > max_len {
            e.pop_back();
        }
    }

    /// Whether a command that took `micros` is to be logged.
    #[inline]
    pub fn qualifies(&self, micros: u64) -> bool {
        let t = self.slower_than.load(Ordering::Relaxed);
        t >= 0 && micros >= t as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs a command (`args`) that took `micros`, run by the client at
    /// `addr` named `name`.
    pub fn push(&self, args: &[Vec<u8>], micros: u64, addr: &str, name: &str) {
        let max_len = self.max_len.load(Ordering::Relaxed);
        if max_len == 0 {
            return;
        }
        let redacted = redacted(args);
        let n = args.len().min(MAX_ARGC);
        let mut out = Vec::with_capacity(n);
        for (j, a) in args.iter().take(n).enumerate() {
            if n != args.len() && j == n - 1 {
                out.push(format!("... ({} more arguments)", args.len() - n + 1).into_bytes());
            } else if redacted(j) {
                out.push(b"(redacted)".to_vec());
            } else if a.len() > MAX_STRING {
                let mut s = a[..MAX_STRING].to_vec();
                s.extend_from_slice(
                    format!("... ({} more bytes)", a.len() - MAX_STRING).as_bytes(),
                );
                out.push(s);
            } else {
                out.push(a.clone());
            }
        }
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let entry = Entry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            time,
            micros,
            args: out,
            addr: addr.to_string(),
            name: name.to_string(),
        };
        let mut e = self.lock();
        e.push_front(entry);
        while e.len() as u64 > max_len {
            e.pop_back();
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn reset(&self) {
        self.lock().clear();
    }

    /// SLOWLOG GET's reply: the newest `count` entries.
    pub fn get(&self, count: usize) -> Reply {
        let e = self.lock();
        Reply::Array(
            e.iter()
                .take(count)
                .map(|x| {
                    Reply::Array(vec![
                        Reply::Integer(x.id as i64),
                        Reply::Integer(x.time),
                        Reply::Integer(x.micros as i64),
                        Reply::Array(x.args.iter().cloned().map(Reply::Bulk).collect()),
                        Reply::Bulk(x.addr.clone().into_bytes()),
                        Reply::Bulk(x.name.clone().into_bytes()),
                    ])
                })
                .collect(),
        )
    }
}

/// Which arguments of a request Redis redacts from the slow log.
pub(crate) fn redacted(args: &[Vec<u8>]) -> impl Fn(usize) -> bool {
    let is = |i: usize, s: &str| {
        args.get(i)
            .is_some_and(|a| a.eq_ignore_ascii_case(s.as_bytes()))
    };
    let mut hidden: Vec<usize> = Vec::new();
    if is(0, "auth") {
        hidden.push(if args.len() == 2 { 1 } else { 2 });
    } else if is(0, "hello") {
        let mut j = 2;
        while j < args.len() {
            if is(j, "auth") && j + 2 < args.len() {
                hidden.extend([j + 1, j + 2]);
                j += 3;
            } else {
                j += 1;
            }
        }
    } else if is(0, "acl") && is(1, "setuser") {
        hidden.extend(2..args.len());
    }
    move |j| hidden.contains(&j)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn trims_redacts_and_bounds() {
        let log = Slowlog::new(0, 2);
        let mut many = args(&["rpush", "l"]);
        many.extend((0..40).map(|i| i.to_string().into_bytes()));
        log.push(&many, 5, "1.2.3.4:5", "");
        log.push(&args(&["auth", "u", "secret"]), 6, "a", "n");
        log.push(&[b"set".to_vec(), vec![b'x'; 130]], 7, "a", "n");
        assert_eq!(log.len(), 2);
        let Reply::Array(e) = log.get(10) else {
            panic!()
        };
        let Reply::Array(newest) = &e[0] else {
            panic!()
        };
        assert_eq!(newest[0], Reply::Integer(2));
        let Reply::Array(a) = &newest[3] else {
            panic!()
        };
        let mut want = vec![b'x'; 128];
        want.extend_from_slice(b"... (2 more bytes)");
        assert_eq!(a[1], Reply::Bulk(want));
        let Reply::Array(auth) = &e[1] else { panic!() };
        assert_eq!(
            auth[3],
            Reply::Array(vec![
                Reply::Bulk(b"auth".to_vec()),
                Reply::Bulk(b"u".to_vec()),
                Reply::Bulk(b"(redacted)".to_vec())
            ])
        );
        log.configure(0, 10);
        log.push(&many, 5, "a", "");
        let Reply::Array(e) = log.get(1) else {
            panic!()
        };
        let Reply::Array(x) = &e[0] else { panic!() };
        let Reply::Array(a) = &x[3] else { panic!() };
        assert_eq!(a.len(), 32);
        assert_eq!(a[31], Reply::Bulk(b"... (11 more arguments)".to_vec()));
        assert!(!log.qualifies(0) || log.slower_than.load(Ordering::Relaxed) == 0);
        log.configure(-1, 10);
        assert!(!log.qualifies(1_000_000));
    }
}
