//! The running script's context, lent to the `redis` API's Rust functions.
//!
//! `redis.call`, `redis.pcall`, `redis.setresp` and `redis.acl_check_cmd`
//! are registered once per Lua state, so they cannot capture the command's
//! `Ctx` and `Client` (borrows that live for one command). Instead `exec`
//! lends them for the duration of the script's run through a pointer in a
//! thread-local, and the functions borrow it with [`with`]. Building the
//! callback in an `mlua` scope on every run instead cost about a sixth of
//! a short script's time (a boxed closure, a userdata and a second call
//! through Lua for each `redis.call`).

use super::{Job, RunState};
use crate::client::Client;
use crate::cmd::Ctx;
use std::cell::Cell;
use std::time::Instant;

/// What the `redis` API needs of the run in progress.
pub(super) struct Run<'a, 'c> {
    pub ctx: &'a mut Ctx<'c>,
    pub c: &'a mut Client,
    pub job: &'a Job<'a>,
    pub rs: &'a RunState,
    pub start: Instant,
    /// The protocol the script chose for its commands' replies
    /// (`redis.setresp`).
    pub resp3: bool,
    /// A command's arguments, reused from call to call.
    pub argv: Vec<Vec<u8>>,
}

thread_local! {
    /// The lent run (a `*mut Run`), null when none is lent or while a
    /// function borrows it.
    static RUN: Cell<*mut ()> = const { Cell::new(std::ptr::null_mut()) };
}

/// Puts the previous pointer back when a lend or a borrow ends (also on
/// unwinding).
struct Restore(*mut ());

impl Drop for Restore {
    fn drop(&mut self) {
        RUN.with(|r| r.set(self.0));
    }
}

/// Runs `f` with `run` lent to this thread's `redis` API functions.
pub(super) fn lend<T>(run: &mut Run<'_, '_>, f: impl FnOnce() -> T) -> T {
    let ptr = (run as *mut Run<'_, '_>).cast::<()>();
    let _restore = Restore(RUN.with(|r| r.replace(ptr)));
    f()
}

/// Runs `f` with the run lent by [`lend`] on this thread; None when no run
/// is lent (the API called outside a script, or while loading a library)
/// or it is already borrowed.
pub(super) fn with<T>(f: impl FnOnce(&mut Run<'_, '_>) -> T) -> Option<T> {
    // Taken for the borrow: a nested borrow finds none.
    let ptr = RUN.with(|r| r.replace(std::ptr::null_mut()));
    if ptr.is_null() {
        return None;
    }
    let _restore = Restore(ptr);
    // SAFETY: `ptr` was set by `lend` from a `&mut Run` that outlives the
    // `f` passed to `lend`, and `lend` is still running (its guard clears
    // the pointer when it returns): the API functions run only while the
    // script runs, inside that `f`, on this thread (a Lua state stays on
    // its thread). `lend`'s caller does not touch the run while `f` runs,
    // and the pointer is taken out of the thread-local for this borrow, so
    // this is the only reference to the run. `f` is generic over the
    // run's lifetimes, so it can keep nothing borrowed from it.
    let run = unsafe { &mut *ptr.cast::<Run<'_, '_>>() };
    Some(f(run))
}
