//! CLIENT PAUSE / CLIENT UNPAUSE (Redis 7.0): for `timeout` milliseconds,
//! every client's commands (ALL), or those that may write (WRITE: commands
//! flagged `write` or `may_replicate`, EXEC of a transaction holding one,
//! EVAL/EVALSHA/FCALL of a script not declared `no-writes`), wait unrun in
//! their connection's buffer, in order, and run when the pause ends or
//! CLIENT UNPAUSE lifts it. As in Redis, a later pause keeps the later end
//! and takes the new mode, and under ALL even CLIENT UNPAUSE waits.
//!
//! A worker that meets a held request leaves it in the buffer and notes the
//! connection (`Worker::paused`); its poll sleeps no longer than the pause,
//! and UNPAUSE wakes every worker. One relaxed load per request when no
//! pause is on. As in Redis 7.0, the dataset stays as it is during a pause
//! of either mode (`Housekeeping::paused`): active expiry and eviction
//! delete nothing, and a key read after its time is reported missing but
//! left in place (DBSIZE still counts it) until the pause ends.

use crate::client::Client;
use crate::cmd::{Flags, TABLE};
use crate::server::Shared;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Pause {
    on: AtomicBool,
    /// The end, and whether every command waits (ALL) or only writes.
    state: Mutex<Option<(Instant, bool)>>,
}

impl Pause {
    fn state(&self) -> std::sync::MutexGuard<'_, Option<(Instant, bool)>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// CLIENT PAUSE for `ms` milliseconds.
    pub fn pause(&self, ms: u64, all: bool) {
        let end = Instant::now() + Duration::from_millis(ms);
        let mut s = self.state();
        let end = s.map_or(end, |(e, _)| e.max(end));
        *s = Some((end, all));
        self.on.store(true, Ordering::Release);
    }

    /// CLIENT UNPAUSE (the caller wakes the workers).
    pub fn unpause(&self) {
        *self.state() = None;
        self.on.store(false, Ordering::Release);
    }

    /// How long the pause still lasts (None: no pause).
    pub fn remaining(&self) -> Option<Duration> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        let mut s = self.state();
        match *s {
            Some((end, _)) if end > Instant::now() => Some(end - Instant::now()),
            _ => {
                *s = None;
                self.on.store(false, Ordering::Release);
                None
            }
        }
    }

    /// Whether request `args` of client `c` waits for the pause to end.
    #[inline]
    pub fn holds(&self, sh: &Shared, c: &Client, args: &[Vec<u8>]) -> bool {
        if !self.on.load(Ordering::Relaxed) {
            return false;
        }
        let all = {
            let mut s = self.state();
            match *s {
                Some((end, all)) if end > Instant::now() => all,
                _ => {
                    // Over: later requests pay one load again.
                    *s = None;
                    self.on.store(false, Ordering::Release);
                    return false;
                }
            }
        };
        all || may_write(sh, c, args)
    }
}

/// Whether a request may write (Redis's `is_may_replicate_command`).
fn may_write(sh: &Shared, c: &Client, args: &[Vec<u8>]) -> bool {
    let Some(i) = crate::cmd::lookup(&args[0]) else {
        return false;
    };
    let spec = &TABLE[i];
    match spec.name {
        "exec" => c.multi.as_ref().is_some_and(|m| {
            m.cmds.iter().any(|q| {
                crate::cmd::lookup(&q[0]).is_some_and(|j| {
                    let f = TABLE[j].flags;
                    f.contains(Flags::WRITE) || f.contains(Flags::MAY_REPLICATE)
                })
            })
        }),
        "eval" | "evalsha" | "fcall" => !crate::lua::declared_read_only(sh, spec.name, args),
        _ => spec.flags.contains(Flags::WRITE) || spec.flags.contains(Flags::MAY_REPLICATE),
    }
}
