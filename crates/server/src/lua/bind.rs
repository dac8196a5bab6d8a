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
//!
//! Also here: [`call_runner`], which builds a run's KEYS and ARGV tables
//! with Lua's C API and runs the script.

use super::{Job, RunState};
use crate::client::Client;
use crate::cmd::Ctx;
use std::cell::Cell;
use std::ffi::c_int;
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

/// Calls the prelude's runner `runner(f, KEYS, ARGV, eval)` and returns
/// its two results, building KEYS and ARGV (new tables of byte strings)
/// with Lua's C API in the same protected call: `mlua`'s `create_string`
/// and `raw_seti` would make and drop a registry reference per element,
/// and a second protected call would cost as much again (together a tenth
/// of a short script's time).
pub(super) fn call_runner(
    lua: &mlua::Lua,
    runner: &mlua::Function,
    f: &mlua::Function,
    keys: &[Vec<u8>],
    args: &[Vec<u8>],
    eval: bool,
) -> mlua::Result<(bool, mlua::Value)> {
    if c_int::try_from(keys.len().max(args.len())).is_err() {
        return Err(mlua::Error::runtime("too many keys or arguments"));
    }
    // SAFETY: `exec_raw` pushes `runner` and `f` and runs the closure in a
    // protected call on that stack. The closure makes room for its values
    // (`luaL_checkstack` raises an error rather than overflow), leaves
    // `runner, f, KEYS, ARGV, eval` and calls the runner, whose two results
    // are left for `exec_raw` to convert. A Lua error (memory, or one the
    // runner does not catch) is a longjmp out of the closure, which the
    // protected call turns into an `Err`: nothing on the closure's frames
    // has a destructor to skip. The lengths fit a `c_int` (checked above).
    unsafe {
        lua.exec_raw((runner, f), |state| {
            mlua::ffi::luaL_checkstack(state, 4, c"KEYS and ARGV".as_ptr());
            push_sequence(state, keys);
            push_sequence(state, args);
            mlua::ffi::lua_pushboolean(state, c_int::from(eval));
            mlua::ffi::lua_call(state, 4, 2);
        })
    }
}

/// Pushes a new table holding `items` at 1..=n.
///
/// # Safety
/// `state` is a live Lua state with room for two more values, and
/// `items.len()` fits a `c_int`.
unsafe fn push_sequence(state: *mut mlua::lua_State, items: &[Vec<u8>]) {
    // SAFETY: as the function's contract says; the table is at -2 while
    // each string is pushed and stored.
    unsafe {
        mlua::ffi::lua_createtable(state, items.len() as c_int, 0);
        for (i, item) in items.iter().enumerate() {
            mlua::ffi::lua_pushlstring(state, item.as_ptr().cast(), item.len());
            mlua::ffi::lua_rawseti_(state, -2, (i + 1) as c_int);
        }
    }
}
