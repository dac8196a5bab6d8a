//! Lua scripting: EVAL scripts and FUNCTION libraries, in Lua 5.1 (mlua,
//! built from source), with Redis 7.0's sandbox, API and reply conversions.
//!
//! **Engines.** Every worker thread has its own Lua states (mlua's `Lua` is
//! not shared between threads): one for EVAL scripts, one for functions.
//! What they run is shared ([`Scripting`], in `Shared`): the script cache (by
//! SHA1) and the function libraries, each with a generation number; a state
//! compiles a script the first time its thread runs it, and rebuilds its
//! functions when the libraries' generation moved (FUNCTION LOAD, DELETE,
//! FLUSH, RESTORE anywhere). SCRIPT FLUSH drops every thread's eval state.
//!
//! **Sandbox** (`prelude.lua`): user code runs in an environment table whose
//! reads of a missing global and whose writes fail with Redis's texts; the
//! libraries are read-only copies; `loadstring`/`load` compile into the same
//! environment; Lua's `print`, `dofile`, `loadfile`, `getfenv`, `setfenv`,
//! `newproxy`, `os`, `io`, `debug` and `package` are absent, as in Redis.
//! Binary chunks are refused.
//!
//! **One script at a time.** As in Redis, scripts do not overlap: a script
//! holds [`Scripting`]'s run lock while it runs (other workers keep serving
//! other commands). Its writes are one unit (`unit::run`): staged, then
//! applied as one batch, so they are atomic for readers and across a crash.
//!
//! **Busy scripts.** A count hook (every 100,000 Lua instructions, and every
//! `redis.call`) compares the run time with `busy-reply-threshold`; past
//! it, the shared flag [`RunState`] `busy` makes `execute` on every other
//! worker answer `-BUSY` to commands without `allow_busy`, and SCRIPT KILL /
//! FUNCTION KILL (from a connection of another worker) set the kill flag
//! that the hook turns into an error no `pcall` can catch. The worker
//! running the script serves nothing else meanwhile (its other connections
//! wait, as Redis's event loop would have them wait for the reply).

#[allow(unsafe_code)]
mod bind;
pub mod convert;
mod libs;
mod structlib;

use crate::cmd::{unit, CmdError, Ctx, Flags, Spec, R, SUBCOMMANDS, TABLE};
use crate::server::{Client, Shared};
use mlua::{
    ChunkMode, Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value, Variadic,
    VmState,
};
use proto::{Reply, Version};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Script flags (`#!lua flags=...`, `register_function`'s `flags`).
pub const NO_WRITES: u32 = 1;
pub const ALLOW_OOM: u32 = 1 << 1;
pub const ALLOW_STALE: u32 = 1 << 2;
pub const NO_CLUSTER: u32 = 1 << 3;
pub const ALLOW_CROSS_SLOT: u32 = 1 << 4;
/// An EVAL script without a shebang: Redis's compatibility mode.
pub const EVAL_COMPAT: u32 = 1 << 5;

/// The flags' names, in Redis's order.
pub const FLAG_NAMES: &[(u32, &str)] = &[
    (NO_WRITES, "no-writes"),
    (ALLOW_OOM, "allow-oom"),
    (ALLOW_STALE, "allow-stale"),
    (NO_CLUSTER, "no-cluster"),
    (ALLOW_CROSS_SLOT, "allow-cross-slot-keys"),
];

/// Where the function libraries live in the store: an internal key (first
/// byte 0xFF, which no database has, so scans and key counts skip it).
pub const FUNCTIONS_KEY: &[u8] = b"\xff\xfffunctions";

/// How long FUNCTION LOAD lets a library's body run (Redis's
/// `LOAD_TIMEOUT_MS`).
const LOAD_TIMEOUT: Duration = Duration::from_millis(500);

/// Instructions between two checks of the clock and the kill flag.
const HOOK_EVERY: u32 = 100_000;

pub const BUSY_EVAL: &str =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";
pub const BUSY_FUNCTION: &str =
    "BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE.";

/// A cached EVAL script.
pub struct Script {
    pub body: Vec<u8>,
    pub flags: u32,
    /// Length of the shebang line (compiled from its newline on, so line
    /// numbers stay the user's).
    pub shebang: usize,
}

/// A function of a library.
pub struct FuncInfo {
    pub name: String,
    pub desc: Option<Vec<u8>>,
    pub flags: u32,
}

/// A loaded library: its whole code (shebang included) and its functions.
pub struct Library {
    pub name: String,
    pub code: Vec<u8>,
    pub funcs: Vec<FuncInfo>,
}

/// Every library, and every function's library and index in it.
#[derive(Default, Clone)]
pub struct Libraries {
    pub libs: BTreeMap<String, Arc<Library>>,
    pub funcs: HashMap<String, (Arc<Library>, usize)>,
}

impl Libraries {
    pub fn insert(&mut self, lib: Arc<Library>) {
        for (i, f) in lib.funcs.iter().enumerate() {
            self.funcs.insert(f.name.clone(), (lib.clone(), i));
        }
        self.libs.insert(lib.name.clone(), lib);
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<Library>> {
        let lib = self.libs.remove(name)?;
        for f in &lib.funcs {
            self.funcs.remove(&f.name);
        }
        Some(lib)
    }

    pub fn function_count(&self) -> usize {
        self.funcs.len()
    }
}

/// The running script's name, request and start.
type Running = (String, Vec<Vec<u8>>, Instant);

/// The script running now, as other threads see it (BUSY, SCRIPT KILL,
/// FUNCTION STATS).
#[derive(Default)]
pub struct RunState {
    active: AtomicBool,
    /// Running past `busy-reply-threshold`.
    busy: AtomicBool,
    /// SCRIPT KILL / FUNCTION KILL asked it to stop.
    kill: AtomicBool,
    /// Its unit escaped its locks: stop now, it runs again.
    abort: AtomicBool,
    /// An EVAL script (not a function).
    eval: AtomicBool,
    /// It ran a write command (it can no longer be killed).
    wrote: AtomicBool,
    /// SHUTDOWN NOSAVE stopped it: its writes are dropped.
    discard: AtomicBool,
    /// Name, request and start, for FUNCTION STATS.
    info: Mutex<Option<Running>>,
}

impl RunState {
    fn stopping(&self) -> bool {
        self.kill.load(Ordering::Relaxed) || self.abort.load(Ordering::Relaxed)
    }
}

/// Scripting's shared state (one per server).
pub struct Scripting {
    scripts: Mutex<HashMap<String, Arc<Script>>>,
    script_gen: AtomicU64,
    libs: RwLock<Arc<Libraries>>,
    lib_gen: AtomicU64,
    /// Serialises changes of the libraries (load, delete, flush, restore).
    lib_write: Mutex<()>,
    /// Held by the running script.
    run_lock: Mutex<()>,
    pub run: Arc<RunState>,
    rand: Arc<libs::Rand48>,
}

impl Default for Scripting {
    fn default() -> Self {
        Scripting {
            scripts: Mutex::new(HashMap::new()),
            script_gen: AtomicU64::new(0),
            libs: RwLock::new(Arc::new(Libraries::default())),
            lib_gen: AtomicU64::new(0),
            lib_write: Mutex::new(()),
            run_lock: Mutex::new(()),
            run: Arc::new(RunState::default()),
            rand: Arc::new(libs::Rand48::default()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Scripting {
    /// The cached script with this SHA1 (lower-case hex).
    pub fn script(&self, sha: &str) -> Option<Arc<Script>> {
        lock(&self.scripts).get(sha).cloned()
    }

    pub fn has_script(&self, sha: &[u8]) -> bool {
        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
        lock(&self.scripts).contains_key(&sha)
    }

    /// SCRIPT FLUSH: forgets every script; every thread's eval state is
    /// rebuilt before its next script.
    pub fn flush_scripts(&self) {
        lock(&self.scripts).clear();
        self.script_gen.fetch_add(1, Ordering::AcqRel);
    }

    pub fn libraries(&self) -> Arc<Libraries> {
        self.libs.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the libraries (the caller holds `lib_write` and has stored
    /// them).
    fn set_libraries(&self, libs: Libraries) {
        *self.libs.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(libs);
        self.lib_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// SCRIPT KILL (`eval`) or FUNCTION KILL.
    pub fn kill(&self, eval: bool) -> Result<(), CmdError> {
        let r = &self.run;
        if !r.active.load(Ordering::Acquire) {
            return Err(CmdError::Script(
                "NOTBUSY No scripts in execution right now.".into(),
            ));
        }
        if r.wrote.load(Ordering::Acquire) {
            return Err(CmdError::Script("UNKILLABLE Sorry the script already executed write commands against the dataset. You can either wait the script termination or kill the server in a hard way using the SHUTDOWN NOSAVE command.".into()));
        }
        let running_eval = r.eval.load(Ordering::Acquire);
        if eval && !running_eval {
            return Err(CmdError::Script(BUSY_FUNCTION.into()));
        }
        if !eval && running_eval {
            return Err(CmdError::Script(BUSY_EVAL.into()));
        }
        r.kill.store(true, Ordering::Release);
        Ok(())
    }

    /// SHUTDOWN NOSAVE: a script running past the threshold stops and its
    /// writes are dropped, even after it wrote (Redis exits without them).
    pub fn abandon(&self) {
        let r = &self.run;
        if r.active.load(Ordering::Acquire) && r.busy.load(Ordering::Acquire) {
            r.discard.store(true, Ordering::Release);
            r.kill.store(true, Ordering::Release);
        }
    }

    /// FUNCTION STATS's `running_script`: name, request, milliseconds.
    pub fn running(&self) -> Option<(String, Vec<Vec<u8>>, u64)> {
        let r = &self.run;
        if !r.active.load(Ordering::Acquire) {
            return None;
        }
        lock(&r.info)
            .as_ref()
            .map(|(n, a, t)| (n.clone(), a.clone(), t.elapsed().as_millis() as u64))
    }

    pub fn running_eval(&self) -> bool {
        self.run.active.load(Ordering::Acquire) && self.run.eval.load(Ordering::Acquire)
    }
}

thread_local! {
    /// This thread runs a script now: its own commands are not BUSY.
    static IN_SCRIPT: Cell<bool> = const { Cell::new(false) };
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

/// The `-BUSY` error for a request (command `spec`) that arrives while a
/// script runs past the threshold, unless the command is allowed then.
pub fn busy_error(sh: &Shared, spec: &Spec, args: &[Vec<u8>]) -> Option<&'static str> {
    let run = &sh.scripting.run;
    if !run.busy.load(Ordering::Relaxed) || IN_SCRIPT.with(|f| f.get()) {
        return None;
    }
    if spec.flags.contains(Flags::ALLOW_BUSY) {
        return None;
    }
    if let Some(sub) = args.get(1) {
        if SUBCOMMANDS.iter().any(|s| {
            s.parent == spec.name
                && sub.eq_ignore_ascii_case(s.name.as_bytes())
                && s.flags.contains(Flags::ALLOW_BUSY)
        }) {
            return None;
        }
    }
    Some(if run.eval.load(Ordering::Relaxed) {
        BUSY_EVAL
    } else {
        BUSY_FUNCTION
    })
}

/// Whether EVAL's script, EVALSHA's cached script or FCALL's function
/// (`cmd` names which; `args` the request) declares `no-writes` (CLIENT
/// PAUSE WRITE lets it run). A script without a shebang, or unknown, may
/// write.
pub(crate) fn declared_read_only(sh: &Shared, cmd: &str, args: &[Vec<u8>]) -> bool {
    let Some(a1) = args.get(1) else {
        return false;
    };
    let flags = match cmd {
        "eval" => match shebang_flags(a1) {
            Ok((f, _)) => f,
            Err(_) => return false,
        },
        "evalsha" => {
            let sha = String::from_utf8_lossy(a1).to_ascii_lowercase();
            match sh.scripting.script(&sha) {
                Some(s) => s.flags,
                None => return false,
            }
        }
        _ => {
            let libs = sh.scripting.libraries();
            match libs.funcs.get(String::from_utf8_lossy(a1).as_ref()) {
                Some((lib, i)) => lib.funcs[*i].flags,
                None => return false,
            }
        }
    };
    flags & EVAL_COMPAT == 0 && flags & NO_WRITES != 0
}

/// This thread runs a script now.
pub(crate) fn in_script() -> bool {
    IN_SCRIPT.with(|s| s.get())
}

/// Runs `f` (the busy pump serving other connections from this script's
/// thread) as outside the script: their commands get `-BUSY`.
pub(crate) fn outside_script<T>(f: impl FnOnce() -> T) -> T {
    struct Back(bool);
    impl Drop for Back {
        fn drop(&mut self) {
            IN_SCRIPT.with(|s| s.set(self.0));
        }
    }
    let _back = Back(IN_SCRIPT.with(|s| s.replace(false)));
    f()
}

/// The `-BUSY` error while a script runs past the threshold, whoever asks.
pub fn busy_now(sh: &Shared) -> Option<&'static str> {
    let run = &sh.scripting.run;
    if !run.busy.load(Ordering::Acquire) {
        return None;
    }
    Some(if run.eval.load(Ordering::Acquire) {
        BUSY_EVAL
    } else {
        BUSY_FUNCTION
    })
}

/// A shebang's flags: `(flags, shebang length)`; no shebang is
/// compatibility mode. Errors are Redis's texts (after `ERR `).
pub fn shebang_flags(body: &[u8]) -> Result<(u32, usize), String> {
    if !body.starts_with(b"#!") {
        return Ok((EVAL_COMPAT, 0));
    }
    let Some(end) = body.iter().position(|&b| b == b'\n') else {
        return Err("Invalid script shebang".into());
    };
    let parts = proto::parse::split_args(&body[..end]).unwrap_or_default();
    let Some(engine) = parts.first() else {
        return Err("Invalid engine in script shebang".into());
    };
    if engine.as_slice() != b"#!lua" {
        return Err(format!(
            "Unexpected engine in script shebang: {}",
            String::from_utf8_lossy(engine)
        ));
    }
    let mut flags = 0;
    for p in &parts[1..] {
        let Some(list) = p.strip_prefix(b"flags=") else {
            return Err(format!(
                "Unknown lua shebang option: {}",
                String::from_utf8_lossy(p)
            ));
        };
        if list.is_empty() {
            continue;
        }
        for f in list.split(|&b| b == b',') {
            match FLAG_NAMES.iter().find(|(_, n)| n.as_bytes() == f) {
                Some((bit, _)) => flags |= bit,
                None => {
                    return Err(format!(
                        "Unexpected flag in script shebang: {}",
                        String::from_utf8_lossy(f)
                    ))
                }
            }
        }
    }
    Ok((flags, end))
}

pub fn sha1_hex(data: &[u8]) -> String {
    sha1_smol::Sha1::from(data).digest().to_string()
}

/// An error a Rust function of the API raises: a Redis error table
/// (`{err=...}`, as `redis.call` raises) or a message already prefixed with
/// the calling line (as lua-cjson and LuaBitOp raise). The sandbox's error
/// handler and `pcall` turn it back into that Lua value
/// ([`unwrap_raise`]).
#[derive(Debug)]
pub enum Raise {
    Table(String),
    Text(String),
}

impl std::fmt::Display for Raise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Raise::Table(t) | Raise::Text(t) => f.write_str(t),
        }
    }
}

impl std::error::Error for Raise {}

/// Raises `{err = <text as Redis's luaPushError makes it>}`.
pub fn raise_table(text: &str) -> mlua::Error {
    mlua::Error::external(Raise::Table(convert::error_text(text)))
}

/// Raises `msg` prefixed with the innermost user code position
/// ("user_script:3: msg"), as `luaL_error` reports it.
pub fn raise_here(lua: &Lua, msg: &str) -> mlua::Error {
    let text = match user_frame(lua) {
        Some((_, short, line)) => format!("{short}:{line}: {msg}"),
        None => msg.to_string(),
    };
    mlua::Error::external(Raise::Text(text))
}

/// The innermost frame of user code on the stack (a Lua function not of
/// the sandbox's own chunk): its source, short source and current line.
fn user_frame(lua: &Lua) -> Option<(String, String, i32)> {
    for level in 0..256 {
        let d = lua.inspect_stack(level)?;
        let s = d.source();
        if s.what == "C" {
            continue;
        }
        match s.source {
            Some(src) if src != "=ember" => {
                let short = s.short_src.map(|x| x.to_string()).unwrap_or_default();
                return Some((src.to_string(), short, d.curr_line()));
            }
            _ => {}
        }
    }
    None
}

/// The [`Raise`] inside an error a Rust function returned, if any.
fn find_raise(e: &mlua::Error) -> Option<&Raise> {
    match e {
        mlua::Error::CallbackError { cause, .. } => find_raise(cause),
        mlua::Error::ExternalError(x) => x.downcast_ref::<Raise>(),
        _ => None,
    }
}

/// The Lua value of an error raised by a Rust function: its [`Raise`] as a
/// table or string, other errors as their text.
fn unwrap_raise(lua: &Lua, v: Value) -> mlua::Result<Value> {
    let Value::Error(e) = &v else {
        return Ok(v);
    };
    Ok(match find_raise(e) {
        Some(Raise::Table(t)) => {
            let tb = lua.create_table()?;
            tb.raw_set("err", t.as_str())?;
            Value::Table(tb)
        }
        Some(Raise::Text(t)) => Value::String(lua.create_string(t)?),
        None => {
            let msg = match &**e {
                mlua::Error::CallbackError { cause, .. } => cause.to_string(),
                other => other.to_string(),
            };
            Value::String(lua.create_string(msg)?)
        }
    })
}

/// A number argument as `luaL_checkint` reads it (numeric strings too).
fn check_int(lua: &Lua, args: &[Value], i: usize, fname: &str) -> mlua::Result<i64> {
    let bad = |got: &str| {
        raise_here(
            lua,
            &format!(
                "bad argument #{} to '{fname}' (number expected, got {got})",
                i + 1
            ),
        )
    };
    match args.get(i) {
        None => Err(bad("no value")),
        Some(v) => match lua.coerce_number(v.clone()) {
            Ok(Some(n)) => Ok(n as i64),
            _ => Err(bad(v.type_name())),
        },
    }
}

/// Lua's `lua_tonumber` then C's `(int)`: 0 for what is not a number.
fn to_int(lua: &Lua, v: Option<&Value>) -> i64 {
    v.and_then(|v| lua.coerce_number(v.clone()).ok().flatten())
        .map(|n| n as i64)
        .unwrap_or(0)
}

/// A `redis` API function's value, or, when it must raise (`redis.call`'s
/// error reply), the error raising its table.
fn raised((v, raise): (Value, bool)) -> mlua::Result<Value> {
    if raise {
        let text = match &v {
            Value::Table(t) => t.raw_get::<String>("err").unwrap_or_default(),
            _ => String::new(),
        };
        return Err(mlua::Error::external(Raise::Table(text)));
    }
    Ok(v)
}

/// Registers the redis API functions, once per state (they raise through
/// [`Raise`], so they are C functions to Lua and a script's tail call of
/// one keeps the script's frame for the error position). Those that need
/// the run (`call`, `pcall`, `acl`, `setresp`) borrow it from [`bind`].
fn register_api(lua: &Lua, raw: &Table, sc: &Scripting) -> mlua::Result<()> {
    for (name, raise) in [("call", true), ("pcall", false)] {
        raw.raw_set(
            name,
            lua.create_function(move |lua, mv: MultiValue| -> mlua::Result<Value> {
                let r = bind::with(|run| {
                    check_time(run.rs, run.start, run.job.threshold);
                    redis_call(lua, run, raise, &mv)
                });
                let Some(r) = r else {
                    return Err(raise_table(
                        "redis.call/pcall can only be called inside a script invocation",
                    ));
                };
                raised(r?)
            })?,
        )?;
    }
    raw.raw_set(
        "acl",
        lua.create_function(move |lua, mv: MultiValue| -> mlua::Result<Value> {
            let Some(r) = bind::with(|run| acl_check(lua, run.c, &mv)) else {
                return Err(raise_table(
                    "redis.call/pcall can only be called inside a script invocation",
                ));
            };
            raised(r?)
        })?,
    )?;
    raw.raw_set(
        "setresp",
        lua.create_function(move |lua, args: Variadic<Value>| {
            if bind::with(|_| ()).is_none() {
                return Err(raise_table(
                    "redis.setresp can only be called inside a script invocation",
                ));
            }
            if args.len() != 1 {
                return Err(raise_table("redis.setresp() requires one argument."));
            }
            let v = to_int(lua, args.first());
            if v != 2 && v != 3 {
                return Err(raise_table("RESP version must be 2 or 3."));
            }
            bind::with(|run| run.resp3 = v == 3);
            Ok(())
        })?,
    )?;
    raw.raw_set(
        "set_repl",
        lua.create_function(|lua, args: Variadic<Value>| {
            if args.len() != 1 {
                return Err(raise_table("redis.set_repl() requires two arguments."));
            }
            if !(0..=3).contains(&to_int(lua, args.first())) {
                return Err(raise_table(
                    "Invalid replication flags. Use REPL_AOF, REPL_REPLICA, REPL_ALL or REPL_NONE.",
                ));
            }
            Ok(())
        })?,
    )?;
    raw.raw_set(
        "log",
        lua.create_function(|lua, args: Variadic<Value>| {
            if args.len() < 2 {
                return Err(raise_table("redis.log() requires two arguments or more."));
            }
            let Ok(Some(level)) = lua.coerce_number(args[0].clone()) else {
                return Err(raise_table("First argument must be a number (log level)."));
            };
            let level = level as i64;
            if !(0..=3).contains(&level) {
                return Err(raise_table("Invalid debug level."));
            }
            // Redis's default verbosity (notice) shows notice and warning.
            if level >= 2 {
                let mut msg = String::new();
                for (j, a) in args[1..].iter().enumerate() {
                    if let Ok(Some(s)) = lua.coerce_string(a.clone()) {
                        if j > 0 {
                            msg.push(' ');
                        }
                        msg.push_str(&s.to_string_lossy());
                    }
                }
                eprintln!("ember: script: {msg}");
            }
            Ok(())
        })?,
    )?;
    raw.raw_set(
        "sha1hex",
        lua.create_function(|lua, args: Variadic<Value>| {
            if args.len() != 1 {
                return Err(raise_table("wrong number of arguments"));
            }
            let bytes = lua
                .coerce_string(args[0].clone())
                .ok()
                .flatten()
                .map(|s| s.as_bytes().to_vec())
                .unwrap_or_default();
            Ok(sha1_hex(&bytes))
        })?,
    )?;
    let rand = sc.rand.clone();
    raw.raw_set(
        "random",
        lua.create_function(move |lua, args: Variadic<Value>| -> mlua::Result<f64> {
            let r = (rand.next() % libs::LRAND48_MAX) as f64 / libs::LRAND48_MAX as f64;
            match args.len() {
                0 => Ok(r),
                1 => {
                    let u = check_int(lua, &args, 0, "random")?;
                    if u < 1 {
                        return Err(raise_here(
                            lua,
                            "bad argument #1 to 'random' (interval is empty)",
                        ));
                    }
                    Ok((r * u as f64).floor() + 1.0)
                }
                2 => {
                    let l = check_int(lua, &args, 0, "random")?;
                    let u = check_int(lua, &args, 1, "random")?;
                    if l > u {
                        return Err(raise_here(
                            lua,
                            "bad argument #2 to 'random' (interval is empty)",
                        ));
                    }
                    Ok((r * (u - l + 1) as f64).floor() + l as f64)
                }
                _ => Err(raise_here(lua, "wrong number of arguments")),
            }
        })?,
    )?;
    let rand = sc.rand.clone();
    raw.raw_set(
        "randomseed",
        lua.create_function(move |lua, args: Variadic<Value>| {
            rand.seed(check_int(lua, &args, 0, "randomseed")? as i32);
            Ok(())
        })?,
    )?;
    raw.raw_set(
        "rawset",
        lua.create_function(|lua, args: Variadic<Value>| {
            let Some(Value::Table(t)) = args.first() else {
                let got = args.first().map(|v| v.type_name()).unwrap_or("no value");
                return Err(raise_here(
                    lua,
                    &format!("bad argument #1 to 'rawset' (table expected, got {got})"),
                ));
            };
            // The sandbox's read-only tables are the ones whose metatable
            // is protected with `__metatable = false`.
            let protected = t.metatable().is_some_and(|m| {
                matches!(m.raw_get::<Value>("__metatable"), Ok(Value::Boolean(false)))
            });
            if protected {
                return Err(mlua::Error::external(Raise::Text(
                    "Attempt to modify a readonly table".into(),
                )));
            }
            let k = args.get(1).cloned().unwrap_or(Value::Nil);
            let v = args.get(2).cloned().unwrap_or(Value::Nil);
            t.raw_set(k, v)?;
            Ok(t.clone())
        })?,
    )?;
    raw.raw_set(
        "setmetatable",
        lua.create_function(|lua, args: Variadic<Value>| {
            let Some(Value::Table(t)) = args.first() else {
                let got = args.first().map(|v| v.type_name()).unwrap_or("no value");
                return Err(raise_here(
                    lua,
                    &format!("bad argument #1 to 'setmetatable' (table expected, got {got})"),
                ));
            };
            let mt = match args.get(1) {
                None | Some(Value::Nil) => None,
                Some(Value::Table(m)) => Some(m.clone()),
                Some(_) => {
                    return Err(raise_here(
                        lua,
                        "bad argument #2 to 'setmetatable' (nil or table expected)",
                    ))
                }
            };
            match t.metatable().map(|m| m.raw_get::<Value>("__metatable")) {
                // The sandbox's read-only tables.
                Some(Ok(Value::Boolean(false))) => {
                    return Err(mlua::Error::external(Raise::Text(
                        "Attempt to modify a readonly table".into(),
                    )))
                }
                Some(Ok(Value::Nil)) | None => {}
                Some(_) => return Err(raise_here(lua, "cannot change a protected metatable")),
            }
            t.set_metatable(mt);
            Ok(t.clone())
        })?,
    )?;
    raw.raw_set(
        "unwrap",
        lua.create_function(|lua, v: Value| unwrap_raise(lua, v))?,
    )?;
    raw.raw_set(
        "where",
        lua.create_function(|lua, ()| {
            Ok(user_frame(lua).map(|(src, _, line)| (src, line)).unzip())
        })?,
    )?;
    Ok(())
}

/// A function registered by a library's body while it loads.
struct Registered {
    name: String,
    desc: Option<Vec<u8>>,
    flags: u32,
    callback: Function,
}

/// One Lua state with the sandbox.
struct State {
    lua: Lua,
    env: Table,
    run: Function,
    load_lib: Function,
    /// Compiled scripts (eval: by SHA1) or functions (by name).
    compiled: HashMap<String, Function>,
    registering: Rc<RefCell<Option<Vec<Registered>>>>,
    /// `redis.call`'s argument buffers, kept between runs.
    argv: RefCell<Vec<Vec<u8>>>,
}

const PRELUDE: &str = include_str!("prelude.lua");

/// Lua's collector pause (percent): a new cycle starts when the heap is
/// this share of what the previous cycle left. Lua's default, 200, ran a
/// whole incremental cycle over the sandbox for every sandbox-sized amount
/// of garbage, which short scripts (KEYS, ARGV, reply tables) make quickly:
/// 5% of their time. At 400 the collector does a third of that work; a
/// state's heap may reach four times its live data.
const GC_PAUSE: std::ffi::c_int = 400;

impl State {
    fn new(mode: &str, sc: &Scripting) -> mlua::Result<State> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::new(),
        )?;
        lua.gc_inc(GC_PAUSE, 0, 0);
        let raw = lua.create_table()?;
        libs::register(&lua, &raw)?;
        structlib::register(&lua, &raw)?;
        raw.raw_set("json_null", libs::json_null())?;
        let run = sc.run.clone();
        raw.raw_set(
            "stopping",
            lua.create_function(move |_, ()| Ok(run.stopping()))?,
        )?;
        register_api(&lua, &raw, sc)?;
        raw.raw_set(
            "errtext",
            lua.create_function(|_, s: mlua::String| {
                Ok(convert::error_text(&s.to_string_lossy()))
            })?,
        )?;
        raw.raw_set("version", crate::cmd::REDIS_COMPAT_VERSION)?;
        raw.raw_set("version_num", version_num(crate::cmd::REDIS_COMPAT_VERSION))?;
        let registering: Rc<RefCell<Option<Vec<Registered>>>> = Rc::new(RefCell::new(None));
        let reg = registering.clone();
        raw.raw_set(
            "register",
            lua.create_function(move |_, args: Variadic<Value>| {
                Ok(match register_args(&args) {
                    Ok(r) => {
                        let mut g = reg.borrow_mut();
                        match g.as_mut() {
                            None => (
                                false,
                                Some("ERR redis.register_function can only be called on FUNCTION LOAD command".to_string()),
                            ),
                            Some(list) => {
                                if !valid_name(r.name.as_bytes()) {
                                    (false, Some(format!("ERR {NAME_RULE}")))
                                } else if list.iter().any(|x| x.name == r.name) {
                                    (
                                        false,
                                        Some("ERR Function already exists in the library".to_string()),
                                    )
                                } else {
                                    list.push(r);
                                    (true, None)
                                }
                            }
                        }
                    }
                    Err(e) => (false, Some(format!("ERR {e}"))),
                })
            })?,
        )?;
        let (env, run, load_lib): (Table, Function, Function) = lua
            .load(PRELUDE)
            .set_name("=ember")
            .set_mode(ChunkMode::Text)
            .call((raw.clone(), mode))?;
        Ok(State {
            lua,
            env,
            run,
            load_lib,
            compiled: HashMap::new(),
            registering,
            argv: RefCell::new(Vec::new()),
        })
    }

    /// Compiles user code (`name`: `@user_script` or `@user_function`).
    fn compile(&self, code: &[u8], name: &str) -> Result<Function, String> {
        self.lua
            .load(code)
            .set_name(name)
            .set_mode(ChunkMode::Text)
            .set_environment(self.env.clone())
            .into_function()
            .map_err(|e| match e {
                mlua::Error::SyntaxError { message, .. } => message,
                other => other.to_string(),
            })
    }

    /// Runs a library's body (its code after the shebang line) and returns
    /// the functions it registered; errors are Redis's texts (after `ERR `
    /// when they have no code).
    fn load_library(&self, code: &[u8]) -> Result<Vec<Registered>, String> {
        let f = self
            .compile(code, "@user_function")
            .map_err(|e| format!("ERR Error compiling function: {e}"))?;
        *self.registering.borrow_mut() = Some(Vec::new());
        let start = Instant::now();
        let timed_out = Rc::new(Cell::new(false));
        let t = timed_out.clone();
        self.lua.set_hook(
            HookTriggers::new().every_nth_instruction(HOOK_EVERY),
            move |_, _| {
                if start.elapsed() > LOAD_TIMEOUT {
                    t.set(true);
                    return Err(mlua::Error::runtime("FUNCTION LOAD timeout"));
                }
                Ok(VmState::Continue)
            },
        );
        let r: mlua::Result<(bool, Value)> = self.load_lib.call(f);
        self.lua.remove_hook();
        let regs = self.registering.borrow_mut().take().unwrap_or_default();
        let msg = match r {
            Ok((true, _)) => return Ok(regs),
            _ if timed_out.get() => "ERR FUNCTION LOAD timeout".to_string(),
            Ok((false, v)) => error_message(&v),
            Err(e) => format!("ERR {e}"),
        };
        Err(format!("ERR Error registering functions: {msg}"))
    }
}

/// The message of a Lua error value: a string gets "ERR ", a table its
/// `err` field.
fn error_message(v: &Value) -> String {
    match v {
        Value::String(s) => format!("ERR {}", s.to_string_lossy()),
        Value::Table(t) => match t.raw_get::<Value>("err") {
            Ok(Value::String(s)) => s.to_string_lossy().to_string(),
            _ => "ERR unknown error".into(),
        },
        Value::Error(e) => format!("ERR {e}"),
        other => format!("ERR {}", other.type_name()),
    }
}

/// Redis's `REDIS_VERSION_NUM`: 0x00MMmmpp.
fn version_num(v: &str) -> f64 {
    let mut n = 0u32;
    for part in v.split('.').take(3) {
        n = (n << 8) | part.parse::<u32>().unwrap_or(0);
    }
    n as f64
}

const NAME_RULE: &str = "Library names can only contain letters, numbers, or underscores(_) and must be at least one character long";

/// Redis's `functionsVerifyName`: `[A-Za-z0-9_]+`.
fn valid_name(n: &[u8]) -> bool {
    !n.is_empty() && n.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

fn lua_str(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.to_string_lossy().to_string()),
        Value::Number(n) => Some(convert::fmt_g(*n, 14)),
        Value::Integer(i) => Some(i.to_string()),
        _ => None,
    }
}

/// `redis.register_function`'s arguments, checked as Redis does.
fn register_args(args: &[Value]) -> Result<Registered, String> {
    match args {
        [Value::Table(t)] => {
            let (mut name, mut desc, mut cb, mut flags) = (None, None, None, 0);
            for pair in t.pairs::<Value, Value>() {
                let (k, v) = pair.map_err(|e| e.to_string())?;
                let Some(key) = lua_str(&k) else {
                    return Err("named argument key given to redis.register_function is not a string".into());
                };
                match key.to_ascii_lowercase().as_str() {
                    "function_name" => {
                        name = Some(lua_str(&v).ok_or("function_name argument given to redis.register_function must be a string")?)
                    }
                    "description" => {
                        desc = Some(match &v {
                            Value::String(s) => s.as_bytes().to_vec(),
                            other => lua_str(other).ok_or("description argument given to redis.register_function must be a string")?.into_bytes(),
                        })
                    }
                    "callback" => match v {
                        Value::Function(f) => cb = Some(f),
                        _ => return Err("callback argument given to redis.register_function must be a function".into()),
                    },
                    "flags" => {
                        let Value::Table(ft) = v else {
                            return Err("flags argument to redis.register_function must be a table representing function flags".into());
                        };
                        for fv in ft.pairs::<Value, Value>() {
                            let (_, fv) = fv.map_err(|e| e.to_string())?;
                            let s = lua_str(&fv).ok_or("unknown flag given")?;
                            let bit = FLAG_NAMES
                                .iter()
                                .find(|(_, n)| n.eq_ignore_ascii_case(&s))
                                .ok_or("unknown flag given")?
                                .0;
                            flags |= bit;
                        }
                    }
                    _ => return Err("unknown argument given to redis.register_function".into()),
                }
            }
            let name = name.ok_or("redis.register_function must get a function name argument")?;
            let callback = cb.ok_or("redis.register_function must get a callback argument")?;
            Ok(Registered {
                name,
                desc,
                flags,
                callback,
            })
        }
        [_] => Err("calling redis.register_function with a single argument is only applicable to Lua table (representing named arguments).".into()),
        [n, f] => {
            let name = lua_str(n).ok_or("first argument to redis.register_function must be a string")?;
            let Value::Function(callback) = f else {
                return Err("second argument to redis.register_function must be a function".into());
            };
            Ok(Registered {
                name,
                desc: None,
                flags: 0,
                callback: callback.clone(),
            })
        }
        _ => Err("wrong number of arguments to redis.register_function".into()),
    }
}

/// A thread's Lua states.
struct Engine {
    /// The run state of the server they were made for (a process may run
    /// more than one server, e.g. in tests).
    owner: Arc<RunState>,
    eval: State,
    eval_gen: u64,
    funcs: Option<(u64, State)>,
}

fn with_engine<T>(sc: &Scripting, f: impl FnOnce(&mut Engine) -> T) -> Result<T, CmdError> {
    ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let gen = sc.script_gen.load(Ordering::Acquire);
        let stale = match slot.as_ref() {
            Some(e) => !Arc::ptr_eq(&e.owner, &sc.run) || e.eval_gen != gen,
            None => true,
        };
        if stale {
            let keep_funcs = slot
                .take()
                .filter(|e| Arc::ptr_eq(&e.owner, &sc.run))
                .and_then(|e| e.funcs);
            *slot = Some(Engine {
                owner: sc.run.clone(),
                eval: State::new("eval", sc).map_err(lua_setup_error)?,
                eval_gen: gen,
                funcs: keep_funcs,
            });
        }
        Ok(f(slot.as_mut().expect("engine made above")))
    })
}

fn lua_setup_error(e: mlua::Error) -> CmdError {
    CmdError::Script(format!("ERR cannot start the Lua engine: {e}"))
}

/// Library metadata from its shebang line: `(name, engine, code offset)`.
fn library_metadata(code: &[u8]) -> Result<(String, usize), String> {
    if !code.starts_with(b"#!") {
        return Err("Missing library metadata".into());
    }
    let Some(end) = code.iter().position(|&b| b == b'\n') else {
        return Err("Invalid library metadata".into());
    };
    let parts = proto::parse::split_args(&code[..end]).unwrap_or_default();
    let Some(first) = parts.first() else {
        return Err("Invalid library metadata".into());
    };
    let engine = &first[2..];
    let mut name: Option<String> = None;
    for p in &parts[1..] {
        if p.len() >= 5 && p[..5].eq_ignore_ascii_case(b"name=") {
            if name.is_some() {
                return Err(
                    "Invalid metadata value, name argument was given multiple times".into(),
                );
            }
            name = Some(String::from_utf8_lossy(&p[5..]).into_owned());
            continue;
        }
        return Err(format!(
            "Invalid metadata value given: {}",
            String::from_utf8_lossy(p)
        ));
    }
    let name = name.ok_or("Library name was not given")?;
    if !valid_name(name.as_bytes()) {
        return Err(NAME_RULE.into());
    }
    if !engine.eq_ignore_ascii_case(b"lua") {
        return Err(format!(
            "Engine '{}' not found",
            String::from_utf8_lossy(engine)
        ));
    }
    Ok((name, end))
}

/// Compiles a library in `st` and describes it (errors: whole texts).
fn make_library(st: &State, code: &[u8]) -> Result<(Library, Vec<Registered>), String> {
    let (name, off) = library_metadata(code).map_err(|e| format!("ERR {e}"))?;
    let regs = st.load_library(&code[off..])?;
    if regs.is_empty() {
        return Err("ERR No functions registered".into());
    }
    let lib = Library {
        name,
        code: code.to_vec(),
        funcs: regs
            .iter()
            .map(|r| FuncInfo {
                name: r.name.clone(),
                desc: r.desc.clone(),
                flags: r.flags,
            })
            .collect(),
    };
    Ok((lib, regs))
}

/// Checks and compiles a library for FUNCTION LOAD / RESTORE (in a fresh
/// state: a failed load leaves nothing behind).
pub fn check_library(sc: &Scripting, code: &[u8]) -> Result<Library, CmdError> {
    let st = State::new("function", sc).map_err(lua_setup_error)?;
    make_library(&st, code)
        .map(|(lib, _)| lib)
        .map_err(CmdError::Script)
}

/// Adds `new` libraries to `base`: collisions of library names fail unless
/// `replace`, collisions of function names always fail.
pub fn join_libraries(
    base: &Libraries,
    new: Vec<Library>,
    replace: bool,
    load_texts: bool,
) -> Result<Libraries, CmdError> {
    let mut out = base.clone();
    let mut added: Vec<String> = Vec::new();
    for lib in new {
        if out.libs.contains_key(&lib.name) {
            // A library of the same payload never replaces another.
            if !replace || added.contains(&lib.name) {
                return Err(CmdError::Script(if load_texts {
                    format!("ERR Library '{}' already exists", lib.name)
                } else {
                    format!("ERR Library {} already exists", lib.name)
                }));
            }
            out.remove(&lib.name);
        }
        if let Some(f) = lib.funcs.iter().find(|f| out.funcs.contains_key(&f.name)) {
            return Err(CmdError::Script(format!(
                "ERR Function {} already exists",
                f.name
            )));
        }
        added.push(lib.name.clone());
        out.insert(Arc::new(lib));
    }
    Ok(out)
}

/// Stores `libs` in the heap (one internal key) and makes them current.
pub fn save_libraries(ctx: &mut Ctx, libs: Libraries) -> R {
    let bytes = encode_libraries(&libs);
    crate::cmd::locked(ctx, &[FUNCTIONS_KEY], |ctx| {
        if libs.libs.is_empty() {
            ctx.ks.remove_piece(FUNCTIONS_KEY);
        } else {
            ctx.ks.put_piece(FUNCTIONS_KEY, &bytes);
        }
        Ok(())
    })?;
    ctx.sh.scripting.set_libraries(libs);
    Ok(())
}

/// Holds the libraries' write lock (FUNCTION LOAD, DELETE, FLUSH, RESTORE).
pub fn lib_write(sc: &Scripting) -> std::sync::MutexGuard<'_, ()> {
    lock(&sc.lib_write)
}

const DUMP_MAGIC: &[u8] = b"EMBERFN1";

/// The libraries' codes: magic, then each code as u32 LE length and bytes.
pub fn encode_libraries(libs: &Libraries) -> Vec<u8> {
    let mut out = DUMP_MAGIC.to_vec();
    for lib in libs.libs.values() {
        out.extend_from_slice(&(lib.code.len() as u32).to_le_bytes());
        out.extend_from_slice(&lib.code);
    }
    out
}

/// The codes of an [`encode_libraries`] payload (None if malformed).
pub fn decode_libraries(b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut rest = b.strip_prefix(DUMP_MAGIC)?;
    let mut codes = Vec::new();
    while !rest.is_empty() {
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        codes.push(rest.get(4..4 + len)?.to_vec());
        rest = &rest[4 + len..];
    }
    Some(codes)
}

/// FUNCTION DUMP's payload: Redis's (each library's code as an RDB
/// function record, the RDB version and the CRC-64), so a dump moves
/// between Redis and Ember both ways.
pub fn dump_payload(libs: &Libraries) -> Vec<u8> {
    crate::rdb::dump_functions(libs.libs.values().map(|l| l.code.as_slice()))
}

/// The codes of a FUNCTION DUMP payload; the error is Redis's reply text.
pub fn restore_payload(b: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if crate::rdb::verify(b).is_err() {
        return Err("ERR DUMP payload version or checksum are wrong".into());
    }
    crate::rdb::restore_functions(b).map_err(|e| format!("ERR {e}"))
}

/// At start: loads the libraries stored in the heap.
pub fn load_functions(sh: &Shared) -> Result<(), String> {
    let mut sess = sh.store.session().map_err(|e| format!("{e:?}"))?;
    let mut v = Vec::new();
    if !sess
        .get(FUNCTIONS_KEY, &mut v)
        .map_err(|e| format!("{e:?}"))?
    {
        return Ok(());
    }
    let codes = decode_libraries(&v).ok_or("the stored function libraries are malformed")?;
    let sc = &sh.scripting;
    let st = State::new("function", sc).map_err(|e| e.to_string())?;
    let mut libs = Libraries::default();
    for code in codes {
        let (lib, _) = make_library(&st, &code)?;
        libs.insert(Arc::new(lib));
    }
    sc.set_libraries(libs);
    Ok(())
}

/// What a run executes.
pub enum Target {
    Eval { sha: String, script: Arc<Script> },
    Function { lib: Arc<Library>, index: usize },
}

/// Caches an EVAL script after checking that it compiles; returns its
/// SHA1.
pub fn load_script(sc: &Scripting, body: &[u8]) -> Result<(String, Arc<Script>), CmdError> {
    let sha = sha1_hex(body);
    if let Some(s) = sc.script(&sha) {
        return Ok((sha, s));
    }
    let (flags, shebang) = shebang_flags(body).map_err(|e| CmdError::Script(format!("ERR {e}")))?;
    let script = Arc::new(Script {
        body: body.to_vec(),
        flags,
        shebang,
    });
    with_engine(sc, |e| {
        let f = e
            .eval
            .compile(&body[shebang..], "@user_script")
            .map_err(|m| {
                CmdError::Script(format!("ERR Error compiling script (new function): {m}"))
            })?;
        e.eval.compiled.insert(sha.clone(), f);
        Ok::<_, CmdError>(())
    })??;
    lock(&sc.scripts).insert(sha.clone(), script.clone());
    Ok((sha, script))
}

/// Runs a script or function for EVAL*/FCALL*: `keys` and `args` as the
/// request gives them, `ro` for the *_RO commands. The reply (or the
/// script's error) goes to `c`.
pub fn run(
    ctx: &mut Ctx,
    c: &mut Client,
    target: Target,
    keys: &[Vec<u8>],
    args: &[Vec<u8>],
    request: &[Vec<u8>],
    ro: bool,
) -> R {
    let sc = &ctx.sh.scripting;
    let (flags, name, eval) = match &target {
        Target::Eval { sha, script } => (script.flags, sha.clone(), true),
        Target::Function { lib, index } => {
            let f = &lib.funcs[*index];
            (f.flags, f.name.clone(), false)
        }
    };
    let compat = flags & EVAL_COMPAT != 0;
    if !compat && flags & NO_WRITES == 0 && ro {
        return Err(CmdError::Script(
            "ERR Can not execute a script with write flag using *_ro command.".into(),
        ));
    }
    let read_only = ro || (!compat && flags & NO_WRITES != 0);
    // One script at a time; a script waiting for another that went past the
    // threshold gets BUSY, as it would in Redis. A script inside EXEC holds
    // its transaction's locks while it waits, which the running script may
    // be waiting for: it gives up after a second rather than deadlock.
    let nested = ctx.ks.unit().is_some();
    let waited = Instant::now();
    let _run = loop {
        match sc.run_lock.try_lock() {
            Ok(g) => break g,
            Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                if sc.run.busy.load(Ordering::Acquire)
                    || (nested && waited.elapsed() > Duration::from_secs(1))
                {
                    return Err(CmdError::Script(
                        if sc.run.eval.load(Ordering::Acquire) {
                            BUSY_EVAL
                        } else {
                            BUSY_FUNCTION
                        }
                        .into(),
                    ));
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    };
    let threshold = ctx.sh.cfg().busy_reply_threshold;
    let rs = sc.run.clone();
    rs.kill.store(false, Ordering::Release);
    rs.abort.store(false, Ordering::Release);
    rs.busy.store(false, Ordering::Release);
    rs.wrote.store(false, Ordering::Release);
    rs.discard.store(false, Ordering::Release);
    rs.eval.store(eval, Ordering::Release);
    set_info(&rs, &name, request);
    rs.active.store(true, Ordering::Release);
    IN_SCRIPT.with(|f| f.set(true));
    let (db, resp) = (c.db, c.resp);
    // A blocking command (BLMPOP...) answers at once inside a script.
    c.deny_blocking = true;
    let locks = unit::Locks::Keys(keys.iter().map(|k| crate::keyspace::skey(db, k)).collect());
    let job = Job {
        name: &name,
        eval,
        read_only,
        keys,
        args,
        threshold,
        db,
    };
    let r = with_engine(sc, |e| -> R {
        let st: &mut State = match &target {
            Target::Eval { .. } => &mut e.eval,
            Target::Function { .. } => {
                let gen = sc.lib_gen.load(Ordering::Acquire);
                if e.funcs.as_ref().is_none_or(|(g, _)| *g != gen) {
                    e.funcs = Some((gen, function_state(sc)?));
                }
                &mut e.funcs.as_mut().expect("made above").1
            }
        };
        let f = match &target {
            Target::Eval { sha, script } => match st.compiled.get(sha) {
                Some(f) => f.clone(),
                None => {
                    let f = st
                        .compile(&script.body[script.shebang..], "@user_script")
                        .map_err(|m| {
                            CmdError::Script(format!(
                                "ERR Error compiling script (new function): {m}"
                            ))
                        })?;
                    st.compiled.insert(sha.clone(), f.clone());
                    f
                }
            },
            Target::Function { lib, index } => {
                let fname = &lib.funcs[*index].name;
                st.compiled
                    .get(fname)
                    .cloned()
                    .ok_or_else(|| CmdError::Script("ERR Function not found".into()))?
            }
        };
        let st: &State = st;
        if nested {
            // Inside EXEC: the transaction's unit holds the locks and
            // applies the writes (and reruns everything if a key escapes).
            exec(st, &f, &job, ctx, c)
        } else {
            unit::run(ctx, c, locks, |ctx, c| exec(st, &f, &job, ctx, c))
        }
    });
    IN_SCRIPT.with(|f| f.set(false));
    rs.active.store(false, Ordering::Release);
    rs.busy.store(false, Ordering::Release);
    {
        // The buffers stay for the next script unless they are large.
        let mut info = lock(&rs.info);
        if info
            .as_ref()
            .is_some_and(|(_, a, _)| a.iter().map(|x| x.capacity()).sum::<usize>() > INFO_KEEP)
        {
            *info = None;
        }
    }
    c.deny_blocking = false;
    c.db = db;
    c.meta.db.store(db, Ordering::Relaxed);
    c.resp = resp;
    r?
}

/// The request bytes [`RunState`]'s `info` keeps after a script ends (to
/// reuse its buffers for the next).
const INFO_KEEP: usize = 64 << 10;

/// Records the running script's name and request for FUNCTION STATS,
/// reusing the previous script's buffers (read only while `active`).
fn set_info(rs: &RunState, name: &str, request: &[Vec<u8>]) {
    let mut info = lock(&rs.info);
    let now = Instant::now();
    match info.as_mut() {
        Some((n, a, t)) => {
            n.clear();
            n.push_str(name);
            a.truncate(request.len());
            for (i, r) in request.iter().enumerate() {
                match a.get_mut(i) {
                    Some(x) => {
                        x.clear();
                        x.extend_from_slice(r);
                    }
                    None => a.push(r.clone()),
                }
            }
            *t = now;
        }
        None => *info = Some((name.to_string(), request.to_vec(), now)),
    }
}

/// A thread's function state for the current libraries.
fn function_state(sc: &Scripting) -> Result<State, CmdError> {
    let mut st = State::new("function", sc).map_err(lua_setup_error)?;
    for lib in sc.libraries().libs.values() {
        let (_, regs) = make_library(&st, &lib.code).map_err(CmdError::Script)?;
        for r in regs {
            st.compiled.insert(r.name, r.callback);
        }
    }
    Ok(st)
}

/// One run's parameters.
struct Job<'a> {
    name: &'a str,
    eval: bool,
    read_only: bool,
    keys: &'a [Vec<u8>],
    args: &'a [Vec<u8>],
    threshold: u64,
    db: u8,
}

/// Runs `f` once (the body of the script's unit: it may run again under
/// wider locks) and writes its reply.
fn exec(st: &State, f: &Function, job: &Job, ctx: &mut Ctx, c: &mut Client) -> R {
    c.db = job.db;
    let rs = ctx.sh.scripting.run.clone();
    rs.abort.store(false, Ordering::Release);
    let lua = &st.lua;
    let start = Instant::now();
    let (hook_rs, threshold) = (rs.clone(), job.threshold);
    lua.set_hook(
        HookTriggers::new().every_nth_instruction(HOOK_EVERY),
        move |_, _| {
            check_time(&hook_rs, start, threshold);
            if hook_rs.busy.load(Ordering::Relaxed) {
                // The worker's other connections: -BUSY, SCRIPT KILL...
                crate::busy::serve_while_busy();
            }
            if hook_rs.stopping() {
                return Err(mlua::Error::runtime(
                    "Script killed by user with SCRIPT KILL...",
                ));
            }
            Ok(VmState::Continue)
        },
    );
    let mut run = bind::Run {
        ctx,
        c,
        job,
        rs: &rs,
        start,
        resp3: false,
        argv: std::mem::take(&mut *st.argv.borrow_mut()),
    };
    let out: mlua::Result<(bool, Value)> = bind::lend(&mut run, || {
        bind::call_runner(lua, &st.run, f, job.keys, job.args, job.eval)
    });
    let resp3 = run.resp3;
    *st.argv.borrow_mut() = std::mem::take(&mut run.argv);
    lua.remove_hook();
    if rs.discard.load(Ordering::Acquire) {
        // SHUTDOWN NOSAVE: nothing of the script (or of the transaction it
        // runs in) is applied, and the connection closes with the server.
        ctx.ks.discard_staged();
        c.close_after = true;
        return Ok(());
    }
    if unit::escaped(ctx) {
        // The unit runs the body again under wider locks.
        return Ok(());
    }
    let reply = match out {
        Ok((true, v)) => convert::lua_to_reply(&v, resp3),
        Ok((false, v)) => Reply::Error(run_error(&rs, job.name, &v)),
        Err(e) if rs.kill.load(Ordering::Acquire) => {
            let _ = e;
            Reply::Error(format!(
                "ERR Script killed by user with SCRIPT KILL... script: {}",
                job.name
            ))
        }
        Err(e) => Reply::Error(format!("ERR Error running script {}, {e}", job.name)),
    };
    // Lua garbage (KEYS, ARGV, reply tables, strings) is left to Lua's
    // incremental collector (a cycle each time the heap doubles). Redis
    // also runs a 50 KB step every 50 scripts; here that forced a marking
    // of the whole sandbox far more often than its garbage needs (6% of a
    // short script's time).
    c.reply(&reply);
    Ok(())
}

/// Marks the run busy once it has lasted `threshold` ms (0: never).
fn check_time(rs: &RunState, start: Instant, threshold: u64) {
    if threshold > 0
        && !rs.busy.load(Ordering::Relaxed)
        && start.elapsed() >= Duration::from_millis(threshold)
    {
        rs.busy.store(true, Ordering::Release);
    }
}

/// The reply text of a script's error (the error handler's table):
/// "<err> script: <name>, on <source>:<line>."
fn run_error(rs: &RunState, name: &str, v: &Value) -> String {
    let (mut msg, pos) = match v {
        Value::Table(t) => {
            let msg = match t.raw_get::<Value>("err") {
                Ok(Value::String(s)) => s.to_string_lossy().to_string(),
                _ => "ERR unknown error".into(),
            };
            let src = t.raw_get::<Option<String>>("source").ok().flatten();
            let line = t.raw_get::<Option<i64>>("line").ok().flatten();
            (msg, src.zip(line))
        }
        other => (error_message(other), None),
    };
    if rs.kill.load(Ordering::Acquire) {
        msg = "ERR Script killed by user with SCRIPT KILL...".into();
    }
    match pos {
        Some((src, line)) => format!("{msg} script: {name}, on {src}:{line}."),
        None => msg,
    }
}

/// `redis.call` / `redis.pcall`: checks the command as Redis's `scriptCall`
/// does, runs it inside the script's unit, converts its reply. Returns the
/// value and whether `redis.call` must raise it.
fn redis_call(
    lua: &Lua,
    run: &mut bind::Run<'_, '_>,
    raise: bool,
    args: &MultiValue,
) -> mlua::Result<(Value, bool)> {
    let fail = |text: &str| -> mlua::Result<(Value, bool)> {
        let t = convert::error_table(lua, text)?;
        t.raw_set("ignore_error_stats_update", true)?;
        Ok((Value::Table(t), raise))
    };
    let rs = run.rs;
    if rs.stopping() {
        return fail("Script killed by user with SCRIPT KILL...");
    }
    let mut argv = std::mem::take(&mut run.argv);
    let r = match command_args(args, &mut argv) {
        Ok(()) => call_checked(lua, run, raise, &argv),
        Err(e) => fail(e),
    };
    run.argv = argv;
    r
}

/// Whether command `i` of the table has subcommands (looked up once: the
/// subcommand table is searched only for those).
fn container(i: usize) -> bool {
    static CONTAINERS: std::sync::OnceLock<Vec<bool>> = std::sync::OnceLock::new();
    CONTAINERS.get_or_init(|| {
        TABLE
            .iter()
            .map(|spec| SUBCOMMANDS.iter().any(|s| s.parent == spec.name))
            .collect()
    })[i]
}

/// The rest of [`redis_call`] once the arguments are bytes.
fn call_checked(
    lua: &Lua,
    run: &mut bind::Run<'_, '_>,
    raise: bool,
    argv: &[Vec<u8>],
) -> mlua::Result<(Value, bool)> {
    let fail = |text: &str| -> mlua::Result<(Value, bool)> {
        let t = convert::error_table(lua, text)?;
        t.raw_set("ignore_error_stats_update", true)?;
        Ok((Value::Table(t), raise))
    };
    let (ctx, c, job, rs) = (&mut *run.ctx, &mut *run.c, run.job, run.rs);
    let Some(i) = crate::cmd::lookup(&argv[0]) else {
        return fail("Unknown Redis command called from script");
    };
    let spec = &TABLE[i];
    if !spec.arity_ok(argv.len()) {
        return fail("Wrong number of args calling Redis command from script");
    }
    // A container's subcommand has its own flags (FUNCTION LOAD, SCRIPT
    // KILL... are noscript, FUNCTION and SCRIPT are not).
    let sub_flags = if container(i) {
        argv.get(1).and_then(|sub| {
            SUBCOMMANDS
                .iter()
                .find(|s| s.parent == spec.name && sub.eq_ignore_ascii_case(s.name.as_bytes()))
                .map(|s| s.flags)
        })
    } else {
        None
    };
    let flags = sub_flags.map_or(spec.flags, |f| spec.flags.with(f));
    if flags.contains(Flags::NOSCRIPT) {
        return fail("This Redis command is not allowed from script");
    }
    if !c.user.unrestricted() {
        if let Some(id) = crate::acl::resolve(i, argv) {
            match c.user.check_id(id, argv) {
                Ok(()) => {}
                Err(crate::acl::Denied::Command(id)) => {
                    let name = crate::acl::cmd(id).name.clone();
                    ctx.sh
                        .acl
                        .log("command", name.as_bytes(), &c.user.name, c.meta.line());
                    return fail(
                        "The user executing the script can't run this command or subcommand",
                    );
                }
                Err(crate::acl::Denied::Key(k)) => {
                    ctx.sh.acl.log("key", &argv[k], &c.user.name, c.meta.line());
                    return fail("The user executing the script no permissions to access one of the keys used as arguments");
                }
                Err(crate::acl::Denied::Channel(k)) => {
                    ctx.sh
                        .acl
                        .log("channel", &argv[k], &c.user.name, c.meta.line());
                    return fail("The user executing the script no permissions to access one of the channels used as arguments");
                }
            }
        }
    }
    let writes = flags.contains(Flags::WRITE);
    if job.read_only && (writes || flags.contains(Flags::MAY_REPLICATE)) {
        return fail("Write commands are not allowed from read-only scripts.");
    }
    if writes {
        rs.wrote.store(true, Ordering::Release);
    }
    let saved = c.resp;
    c.resp = if run.resp3 {
        Version::Resp3
    } else {
        Version::Resp2
    };
    let mark = c.out.len();
    unit::call_at(ctx, c, i, argv);
    c.resp = saved;
    if unit::escaped(ctx) {
        c.out.truncate(mark);
        rs.abort.store(true, Ordering::Release);
        return fail("script touched keys it did not declare; it runs again");
    }
    let r = convert::reply_bytes_to_lua(lua, &c.out[mark..], run.resp3);
    c.out.truncate(mark);
    let (v, is_err) = r?;
    Ok((v, raise && is_err))
}

/// A command's arguments from `redis.call`'s Lua values (Redis's
/// `luaArgsToRedisArgv`) into `argv`, whose buffers are reused.
fn command_args(args: &MultiValue, argv: &mut Vec<Vec<u8>>) -> Result<(), &'static str> {
    if args.is_empty() {
        return Err("Please specify at least one argument for this redis lib call");
    }
    argv.truncate(args.len());
    for (i, a) in args.iter().enumerate() {
        if i == argv.len() {
            argv.push(Vec::new());
        }
        let out = &mut argv[i];
        out.clear();
        if !convert::arg_bytes_into(a, out) {
            return Err("Lua redis lib command arguments must be strings or integers");
        }
    }
    Ok(())
}

/// `redis.acl_check_cmd`: whether the script's user may run the command.
fn acl_check(lua: &Lua, c: &mut Client, args: &MultiValue) -> mlua::Result<(Value, bool)> {
    let fail = |text: &str| -> mlua::Result<(Value, bool)> {
        Ok((Value::Table(convert::error_table(lua, text)?), true))
    };
    let mut argv = Vec::new();
    if let Err(e) = command_args(args, &mut argv) {
        return fail(e);
    }
    let Some(i) = crate::cmd::lookup(&argv[0]) else {
        return fail("Invalid command passed to redis.acl_check_cmd()");
    };
    let ok = c.user.unrestricted()
        || crate::acl::resolve(i, &argv).is_none_or(|id| c.user.check_id(id, &argv).is_ok());
    Ok((Value::Boolean(ok), false))
}
