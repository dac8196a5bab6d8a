//! The `command` target: argument vectors executed by the server's command
//! layer ([`server::server::Embedded`]: one worker's keyspace and one client,
//! as `ember serve` runs them, without a network) on a small heap holding a
//! Direct store (the log-free hash table) or a Bullet store.
//!
//! An input that starts with a letter or `*` is read as a client's requests
//! (inline or multibulk, as `redis-cli` would send them), which makes the
//! seeds readable; it runs on the Bullet store when that letter is
//! lower-case. Any other input is read as up to [`MAX_COMMANDS`] generated
//! commands (on the Bullet store when the first byte's bit 2 is set, and
//! after `HELLO 3` when its bit 0 is). A generated command's name is mostly
//! one of the command table's (`server::cmd::TABLE`, in either case), with a
//! real subcommand for the container commands; its arguments are drawn from
//! a few keys, numbers, option words and glob patterns, or are bytes of the
//! input, often as many as the command's arity asks. Any command may be
//! `HELLO` or `RESET`, so replies are checked in both protocols.
//!
//! Checked for every command: it returns (no panic, no hang), and its output
//! is exactly one reply, well-formed for the connection's protocol: the
//! reply parser reads it whole, and re-encoding what it read in the
//! connection's protocol gives the same bytes (so a RESP2 connection gets no
//! RESP3 type, and nothing is encoded in a non-canonical way); an error
//! reply starts with an upper-case code (`ERR`, `WRONGTYPE`...). The commit
//! after the input's batch (what a worker does before sending the replies)
//! succeeds. After it, every name the input used is deleted in every
//! database, and then every database must be empty (DBSIZE 0); the lazy
//! free of deleted collections' pieces is then run to its end.
//!
//! Each heap is made once per thread in a temporary directory. Each input
//! starts from the same state: the configuration as made, `RESET`
//! (database 0, RESP2, no name), no keys.
//!
//! Not run (skipped with their arguments), because they would stop or stall
//! the harness rather than test anything:
//! - `SHUTDOWN` ends the run (the store refuses work afterwards);
//! - `DEBUG` (`DEBUG SLEEP` sleeps for as long as it is asked; it is
//!   refused anyway unless `enable-debug-command` allows it);
//! - `ACL` (a user change can lock the harness's own connection out; the
//!   `acl` target fuzzes the rule parser);
//! - `SETRANGE` with an offset above 1 MiB: a legitimate write of a value
//!   up to 512 MiB, which takes seconds, not a bug.
//!
//! `QUIT` ends the input's sequence after its reply, as it ends a
//! connection. `CONFIG SET` runs (the configuration is put back before the
//! next input); the parameters whose change would reach outside the process
//! (`heap`, `dir`...) are immutable or have no effect.

use arbitrary::Unstructured;
use proto::{parse_reply, parse_request, Limits, Parsed, Reply, Version};
use server::config::{Config, DurabilityMode, EngineChoice};
use server::server::{Embedded, Shared};
use server::store;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most commands run for one input.
pub const MAX_COMMANDS: usize = 24;

/// The server the inputs run against: one per engine and thread (a store
/// session stays on the thread that made it).
struct Harness {
    // Declared in drop order: the client's session, the store, the heap file.
    e: Embedded,
    sh: Arc<Shared>,
    cfg: Config,
    _dir: tempfile::TempDir,
}

thread_local! {
    /// The Direct harness, then the Bullet one, each made when first used.
    static HARNESSES: RefCell<[Option<Harness>; 2]> = const { RefCell::new([None, None]) };
}

impl Harness {
    fn new(engine: EngineChoice) -> Harness {
        let dir = tempfile::Builder::new()
            .prefix("ember-fuzz-command")
            .tempdir()
            .expect("temporary directory");
        let cfg = Config {
            heap: dir.path().join("fuzz.heap"),
            heap_size: 4 << 20,
            heap_max_size: 32 << 20,
            engine,
            // Cache-line flushes, not msync: a commit costs microseconds.
            durability: DurabilityMode::Pmem,
            threads: 1,
            logs: 4,
            log_size: 256 << 10,
            ..Config::default()
        };
        let (st, startup) = store::open(&cfg).expect("open the fuzz heap");
        let sh = Embedded::start(cfg.clone(), st, startup, 1).expect("start");
        let e = Embedded::new(sh.clone(), 0).expect("client");
        Harness {
            e,
            sh,
            cfg,
            _dir: dir,
        }
    }

    fn exec_ok(&mut self, args: &[Vec<u8>], expect: &[u8]) {
        let out = self.e.exec(args);
        assert!(
            out.starts_with(expect),
            "{:?} between inputs replied {:?}",
            String::from_utf8_lossy(&args[0]),
            String::from_utf8_lossy(&out)
        );
    }

    /// Back to the state every input starts from: the configuration as
    /// made, a fresh connection state (`RESET`), and no keys. The keys go
    /// by deleting every argument the input's commands had (a key only
    /// comes into being under a name some argument gave) in database 0 and
    /// in each database a SELECT named: FLUSHALL would do, but it walks the
    /// whole store once per database, which Bullet makes slow. Then every
    /// database must be empty, which checks the key counts too.
    fn reset(&mut self, cmds: &[Vec<Vec<u8>>]) {
        *self.sh.cfg.write().unwrap_or_else(|p| p.into_inner()) = self.cfg.clone();
        self.sh.cfg_epoch.fetch_add(1, Ordering::AcqRel);
        // CONFIG SET requirepass gave the default user a password: back to
        // nopass, as made.
        self.sh
            .acl
            .set_default_password(self.cfg.requirepass.as_deref());
        self.exec_ok(&[b"RESET".to_vec()], b"+RESET");
        let mut del: Vec<Vec<u8>> = cmds.iter().flatten().cloned().collect();
        del.sort();
        del.dedup();
        del.insert(0, b"DEL".to_vec());
        let selected: Vec<u64> = cmds
            .iter()
            .filter(|c| c.len() == 2 && c[0].eq_ignore_ascii_case(b"select"))
            .filter_map(|c| std::str::from_utf8(&c[1]).ok()?.parse().ok())
            .collect();
        // MOVE and COPY's DB option put keys in databases no SELECT named.
        let anywhere = cmds.iter().any(|c| {
            c.first()
                .is_some_and(|n| n.eq_ignore_ascii_case(b"move") || n.eq_ignore_ascii_case(b"copy"))
        });
        for db in 0..self.cfg.databases {
            self.exec_ok(&[b"SELECT".to_vec(), db.to_string().into_bytes()], b"+OK");
            if del.len() > 1 && (db == 0 || anywhere || selected.contains(&db)) {
                self.exec_ok(&del, b":");
            }
            self.exec_ok(&[b"DBSIZE".to_vec()], b":0\r\n");
        }
        self.exec_ok(&[b"SELECT".to_vec(), b"0".to_vec()], b"+OK");
        // The pieces of large collections deleted go now (a server's worker
        // frees them in the background), so none outlive the input.
        self.e.run_background().expect("lazy free between inputs");
        self.e.commit().expect("commit between inputs");
    }
}

/// The `command` target (see the module documentation).
pub fn command(data: &[u8]) {
    let (cmds, bullet) = commands(data);
    HARNESSES.with(|h| {
        let mut h = h.borrow_mut();
        let h = h[usize::from(bullet)].get_or_insert_with(|| {
            Harness::new(if bullet {
                EngineChoice::Bullet(engine::bullet::Variant::Full)
            } else {
                EngineChoice::Direct(engine::direct::BackendKind::LogFree)
            })
        });
        run(h, &cmds);
        h.reset(&cmds);
    });
}

/// The commands an input stands for, and whether they run on the Bullet
/// heap (else the Direct one): the requests it holds when it starts as a
/// client's requests do (a letter, or `*`; Bullet when it is a lower-case
/// letter), else generated ones (Bullet when the first byte's bit 2 is set).
fn commands(data: &[u8]) -> (Vec<Vec<Vec<u8>>>, bool) {
    let mut cmds: Vec<Vec<Vec<u8>>> = Vec::new();
    let first = data.first().copied().unwrap_or(0);
    if first.is_ascii_alphabetic() || first == b'*' {
        let mut rest = data;
        while cmds.len() < MAX_COMMANDS {
            match parse_request(rest, &Limits::default()) {
                Parsed::Complete { args, consumed } => {
                    if !args.is_empty() {
                        cmds.push(args);
                    }
                    rest = &rest[consumed..];
                }
                _ => break,
            }
        }
        return (cmds, first.is_ascii_lowercase());
    }
    let mut u = Unstructured::new(data);
    if first & 1 == 1 {
        cmds.push(vec![b"HELLO".to_vec(), b"3".to_vec()]);
    }
    while cmds.len() < MAX_COMMANDS && !u.is_empty() {
        cmds.push(gen_command(&mut u));
    }
    (cmds, first & 4 != 0)
}

fn run(h: &mut Harness, cmds: &[Vec<Vec<u8>>]) {
    let mut version = Version::Resp2;
    // Prints each command and its reply (to see what a crashing input did).
    let trace = std::env::var_os("EMBER_FUZZ_TRACE").is_some();
    for args in cmds {
        let name = args[0].to_ascii_lowercase();
        if skipped(&name, args) {
            continue;
        }
        let out = h.e.exec(args);
        if trace {
            eprintln!(
                "{version:?} {:?} -> {:?}",
                args.iter()
                    .map(|a| String::from_utf8_lossy(a))
                    .collect::<Vec<_>>(),
                String::from_utf8_lossy(&out)
            );
        }
        if name == b"hello" {
            // A HELLO that succeeds replies in the protocol it switched to.
            match out.first() {
                Some(b'%') => version = Version::Resp3,
                Some(b'*') => version = Version::Resp2,
                _ => {}
            }
        }
        // A (P|S)(UN)SUBSCRIBE confirms each channel with a reply of its
        // own (Redis's protocol): each must be one canonical reply.
        if matches!(
            name.as_slice(),
            b"subscribe"
                | b"unsubscribe"
                | b"psubscribe"
                | b"punsubscribe"
                | b"ssubscribe"
                | b"sunsubscribe"
        ) {
            let mut rest = out.as_slice();
            loop {
                let Ok(Some((_, n))) = parse_reply(rest) else {
                    // No reply, or a tail that does not parse: this fails.
                    check_reply(rest, version, args);
                    break;
                };
                check_reply(&rest[..n], version, args);
                rest = &rest[n..];
                if rest.is_empty() {
                    break;
                }
            }
        } else {
            check_reply(&out, version, args);
        }
        match name.as_slice() {
            b"reset" if out == b"+RESET\r\n" => version = Version::Resp2,
            b"quit" => break,
            _ => {}
        }
    }
    if let Err(e) = h.e.commit() {
        panic!("commit after {} commands failed: {e}", cmds.len());
    }
}

/// Whether the harness refuses to run `args` (see the module documentation).
fn skipped(name: &[u8], args: &[Vec<u8>]) -> bool {
    match name {
        b"shutdown" | b"debug" => true,
        // Users change what the harness itself may run between inputs (a
        // disabled default user leaves the connection unauthenticated); the
        // `acl` target fuzzes the rules, serve_acl.rs the commands.
        b"acl" => true,
        b"setrange" => args
            .get(2)
            .and_then(|o| std::str::from_utf8(o).ok())
            .and_then(|o| o.parse::<i64>().ok())
            .is_some_and(|o| o > 1 << 20),
        _ => false,
    }
}

/// `out` is exactly one reply, canonical in `v`.
fn check_reply(out: &[u8], v: Version, args: &[Vec<u8>]) {
    let show = || {
        args.iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (reply, n) = match parse_reply(out) {
        Ok(Some(r)) => r,
        other => panic!(
            "{v:?}: `{}` replied {:?}, which does not parse: {other:?}",
            show(),
            String::from_utf8_lossy(out)
        ),
    };
    assert_eq!(
        n,
        out.len(),
        "{v:?}: `{}` wrote more than one reply: {:?}",
        show(),
        String::from_utf8_lossy(out)
    );
    assert!(
        reply.to_bytes(v) == out,
        "{v:?}: `{}` replied {:?}, not in the protocol's canonical form ({:?})",
        show(),
        String::from_utf8_lossy(out),
        String::from_utf8_lossy(&reply.to_bytes(v))
    );
    if let Reply::Error(e) = &reply {
        assert!(
            e.as_bytes().first().is_some_and(u8::is_ascii_uppercase),
            "`{}` replied an error without a code: {e:?}",
            show()
        );
    }
}

const KEYS: &[&str] = &["a", "b", "c", "key:1", "{t}x", ""];
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "10",
    "100",
    "-100",
    "3.5",
    "-0.5",
    "1e3",
    "inf",
    "-inf",
    "nan",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "0x10",
    " 1",
    "007",
    "1048576",
];
const WORDS: &[&str] = &[
    "EX",
    "PX",
    "EXAT",
    "PXAT",
    "NX",
    "XX",
    "GT",
    "LT",
    "KEEPTTL",
    "GET",
    "PERSIST",
    "MATCH",
    "COUNT",
    "TYPE",
    "string",
    "none",
    "ABORT",
    "NOSAVE",
    "SCHEDULE",
    "2",
    "3",
    "AUTH",
    "SETNAME",
    "default",
    "FILTERBY",
    "PATTERN",
    "ACLCAT",
    "MODULE",
    "LIB-NAME",
    "LIB-VER",
    "ON",
    "OFF",
    "*",
    "a*",
    "[a-c]?",
    "\\*",
    "h?llo",
    "[^a]*",
    "*a*a*a*b",
    "requirepass",
    "maxclients",
    "hz",
    "timeout",
    "proto-max-bulk-len",
    "busy-poll-us",
    "bind",
    "heap",
    "dir",
    "save",
    "keyspace",
    "server",
    "stats",
    "all",
    "everything",
    "commandstats",
];
/// Subcommands of the container commands.
const SUBCOMMANDS: &[(&str, &[&str])] = &[
    ("config", &["get", "set", "resetstat", "rewrite", "help"]),
    (
        "client",
        &[
            "id", "setname", "getname", "setinfo", "info", "list", "help", "kill", "no-evict",
            "no-touch", "reply",
        ],
    ),
    (
        "object",
        &["encoding", "freq", "idletime", "refcount", "help"],
    ),
    (
        "command",
        &["count", "list", "info", "docs", "getkeys", "help"],
    ),
];

fn pick<'a>(u: &mut Unstructured, from: &[&'a str]) -> &'a str {
    let i: u8 = u.arbitrary().unwrap_or(0);
    from[usize::from(i) % from.len()]
}

fn gen_command(u: &mut Unstructured) -> Vec<Vec<u8>> {
    let table = server::cmd::TABLE;
    let sel: u8 = u.arbitrary().unwrap_or(0);
    let mut args = Vec::new();
    let mut want: Option<usize> = None;
    if sel < 230 {
        let spec = &table[usize::from(sel) % table.len()];
        let mut name = spec.name.as_bytes().to_vec();
        let case: u8 = u.arbitrary().unwrap_or(0);
        if case & 1 == 1 {
            name.make_ascii_uppercase();
        }
        args.push(name);
        if let Some((_, subs)) = SUBCOMMANDS.iter().find(|(n, _)| *n == spec.name) {
            args.push(pick(u, subs).as_bytes().to_vec());
        }
        if case & 6 != 0 {
            // As many arguments as the arity asks (at least that many for
            // a variadic command).
            want = Some(spec.arity.unsigned_abs() as usize);
        }
    } else {
        args.push(gen_arg(u));
    }
    let n = match want {
        Some(n) => n.max(args.len()),
        None => args.len() + usize::from(u.int_in_range(0u8..=6).unwrap_or(0)),
    };
    while args.len() < n {
        args.push(gen_arg(u));
    }
    args
}

fn gen_arg(u: &mut Unstructured) -> Vec<u8> {
    let k: u8 = u.arbitrary().unwrap_or(0);
    match k % 8 {
        0..=2 => pick(u, KEYS).as_bytes().to_vec(),
        3 => pick(u, NUMBERS).as_bytes().to_vec(),
        4 | 5 => pick(u, WORDS).as_bytes().to_vec(),
        6 => {
            let n = u.int_in_range(0..=16).unwrap_or(0);
            u.bytes(n).unwrap_or_default().to_vec()
        }
        _ => {
            let n: u16 = u.int_in_range(0..=2048).unwrap_or(0);
            let b: u8 = u.arbitrary().unwrap_or(b'v');
            vec![b; usize::from(n)]
        }
    }
}
