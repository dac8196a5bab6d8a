//! ACL users, differential: the same ACL requests, logins and requests of
//! restricted users go to `ember serve` and to a real `redis-server` 7.0, and
//! the replies must be equal, error texts included.
//!
//! What is compared loosely, and why:
//! - the command rules of ACL GETUSER and ACL LIST (`-@all +get +set`): the
//!   first rule exactly, the others as a set, as Redis walks its command
//!   table in hash order (seeded per process). Rules that name categories
//!   are compared through ACL DRYRUN instead (`dryrun_matrix`): Redis
//!   describes them from its whole command table, which holds commands
//!   Ember does not have, so the texts differ where the permissions agree;
//! - ACL CAT of a category: Ember's list must be Redis's list restricted to
//!   the commands Ember has;
//! - ACL LOG: count, reason, context, object and username exactly, and of
//!   the client information the `cmd=` and `user=` fields (the others are
//!   addresses, ids and ages).
//!
//! Also here: the config file's `user` directives, the ACL file's LOAD/SAVE
//! round trip, and a `redis` crate client logging in as a user.

mod serve_common;

use proto::{split_args, Reply};
use serve_common::redis_server::{Conn, RedisServer};
use serve_common::Server;
use std::collections::BTreeSet;
use std::time::Duration;

fn args(line: &str) -> Vec<Vec<u8>> {
    split_args(line.as_bytes()).unwrap_or_else(|| panic!("bad test line {line}"))
}

fn text(r: &Reply) -> String {
    match r {
        Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        Reply::Simple(s) | Reply::Error(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

/// A reply for a failure message: strings as text.
fn show(r: &Reply) -> String {
    match r {
        Reply::Array(v) | Reply::Set(v) => {
            format!("[{}]", v.iter().map(show).collect::<Vec<_>>().join(", "))
        }
        Reply::Map(v) => format!(
            "{{{}}}",
            v.iter()
                .map(|(k, x)| format!("{}: {}", show(k), show(x)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Reply::Bulk(b) => format!("{:?}", String::from_utf8_lossy(b)),
        other => format!("{other:?}"),
    }
}

/// Command rules with every rule after the first sorted (see the module
/// doc); other words as they are. Each selector, ` (...)`, on its own.
fn norm_rules(s: &str) -> String {
    let one = |s: &str| -> String {
        let words: Vec<&str> = s.split(' ').collect();
        match words.iter().position(|w| *w == "+@all" || *w == "-@all") {
            Some(i) => {
                let mut tail: Vec<&str> = words[i + 1..].to_vec();
                tail.sort_unstable();
                let mut out: Vec<&str> = words[..=i].to_vec();
                out.extend(tail);
                out.join(" ")
            }
            None => s.to_string(),
        }
    };
    let mut parts = s.split(" (");
    let mut out = one(parts.next().unwrap_or(""));
    for p in parts {
        let inner = p.strip_suffix(')').unwrap_or(p);
        out.push_str(&format!(" ({})", one(inner)));
    }
    out
}

/// A reply with its command rules normalised (GETUSER's `commands` field,
/// LIST's lines).
fn norm(r: &Reply) -> Reply {
    match r {
        Reply::Bulk(b) => Reply::Bulk(norm_rules(&String::from_utf8_lossy(b)).into_bytes()),
        Reply::Array(v) => Reply::Array(v.iter().map(norm).collect()),
        Reply::Map(v) => Reply::Map(v.iter().map(|(k, x)| (k.clone(), norm(x))).collect()),
        other => other.clone(),
    }
}

/// A connection to each server.
struct Pair {
    ember: Conn,
    redis: Conn,
    failures: Vec<String>,
}

impl Pair {
    fn open(ember: u16, redis: u16) -> Pair {
        Pair {
            ember: Conn::open(ember),
            redis: Conn::open(redis),
            failures: Vec::new(),
        }
    }

    fn both(&mut self, line: &str) -> (Reply, Reply) {
        let a = args(line);
        (self.ember.call(&a), self.redis.call(&a))
    }

    fn check(&mut self, line: &str, e: Reply, r: Reply) {
        if e != r {
            self.failures.push(format!(
                "{line}\n  ember: {}\n  redis: {}",
                show(&e),
                show(&r)
            ));
        }
    }

    /// Both replies equal.
    fn exact(&mut self, line: &str) -> Reply {
        let (e, r) = self.both(line);
        self.check(line, e, r.clone());
        r
    }

    /// Both replies equal once command rules are normalised.
    fn rules(&mut self, line: &str) {
        let (e, r) = self.both(line);
        self.check(line, norm(&e), norm(&r));
    }

    fn done(self, what: &str) {
        assert!(
            self.failures.is_empty(),
            "{what}: {} divergences:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

/// The ACL field `field=value` of a CLIENT LIST line.
fn client_field<'a>(line: &'a str, field: &str) -> &'a str {
    line.split(' ')
        .find_map(|kv| kv.strip_prefix(field).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("")
}

/// ACL LOG's entries as the fields compared (see the module doc).
fn log_view(r: &Reply) -> Vec<Vec<(String, String)>> {
    let Reply::Array(entries) = r else {
        return vec![vec![("not an array".into(), format!("{r:?}"))]];
    };
    entries
        .iter()
        .map(|e| {
            let kv: Vec<(String, String)> = match e {
                Reply::Array(v) => v
                    .chunks(2)
                    .map(|p| (text(&p[0]), text(p.get(1).unwrap_or(&Reply::Null))))
                    .collect(),
                Reply::Map(v) => v.iter().map(|(k, x)| (text(k), text(x))).collect(),
                other => vec![("entry".into(), format!("{other:?}"))],
            };
            kv.into_iter()
                .filter(|(k, _)| k != "age-seconds")
                .map(|(k, v)| {
                    if k == "client-info" {
                        let v = format!(
                            "cmd={} user={}",
                            client_field(&v, "cmd"),
                            client_field(&v, "user")
                        );
                        (k, v)
                    } else {
                        (k, v)
                    }
                })
                .collect()
        })
        .collect()
}

fn start_both(extra: &[&str]) -> (tempfile::TempDir, Server, RedisServer) {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), extra);
    let redis = RedisServer::start_with(extra);
    (dir, ember, redis)
}

/// Users made with many rule forms, described, listed and refused as Redis
/// does.
#[test]
fn setuser_getuser_list_match_redis() {
    let (_d, ember, redis) = start_both(&[]);
    let mut p = Pair::open(ember.port, redis.port);
    for line in [
        "ACL SETUSER alice on >p1 >p2 ~cached:* +get +set",
        "ACL SETUSER bob on nopass -@all +get +mget -mget ~* &chan:* &other",
        "ACL SETUSER carol on #5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8 %R~r:* %W~w:* %RW~rw:* allcommands",
        "ACL SETUSER dave on >x +select|0 +select|1 +SELECT|0 +config|get resetchannels",
        "ACL SETUSER eve >a >b <a reset",
        "ACL SETUSER frank on allkeys allchannels nocommands +ping +client|id",
        "ACL SETUSER grace on >pw %R~a %RW~a %W~b ~c* resetkeys ~d",
        "ACL SETUSER henry +@all -get -client|kill skip-sanitize-payload",
        "ACL SETUSER ivan +@all -get +get sanitize-payload",
        "ACL SETUSER judy on >pw -@all +acl|whoami +acl|getuser +client|id +object|encoding",
        "ACL SETUSER kim",
        "ACL SETUSER kim on",
        "ACL SETUSER kim >secret nopass",
        "ACL SETUSER kim resetpass >s2 !5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
        "ACL SETUSER leo clearselectors on \"\"",
        "ACL SETUSER sel on >s ~a* +get (~b* +set) (%R~c* &ch +get +mget)",
        "ACL SETUSER sel2 on (+@all ~*) clearselectors (~x +get) resetkeys",
        "ACL SETUSER sel3 (\"~q\" +get) (allkeys allchannels +@all -get)",
        "ACL SETUSER sel4 on ( ~a +get ) (~b +select|1)",
    ] {
        p.exact(line);
    }
    for u in [
        "alice", "bob", "carol", "dave", "eve", "frank", "grace", "henry", "ivan", "judy", "kim",
        "leo", "sel", "sel2", "sel3", "sel4", "default", "nobody",
    ] {
        p.rules(&format!("ACL GETUSER {u}"));
    }
    p.rules("ACL LIST");
    p.exact("ACL USERS");
    // Refused rules, names and arities.
    for line in [
        "ACL SETUSER x +nosuch",
        "ACL SETUSER x -nosuch",
        "ACL SETUSER x +@nosuch",
        "ACL SETUSER x ~a allkeys ~b",
        "ACL SETUSER x allchannels &b",
        "ACL SETUSER x #abc",
        "ACL SETUSER x #5E884898DA28047151D0E56F8DC6292773603D0D6AABBDD62A11EF721D1542D8",
        "ACL SETUSER x !abc",
        "ACL SETUSER x <nopw",
        "ACL SETUSER x +config|get|x",
        "ACL SETUSER x +get|",
        "ACL SETUSER x +config|nosuch",
        "ACL SETUSER x -select|0",
        "ACL SETUSER x foo",
        "ACL SETUSER x %X~a",
        "ACL SETUSER x %RR~a",
        "ACL SETUSER x \"~a b\"",
        "ACL SETUSER x (~a +get",
        "ACL SETUSER x on +get (",
        "ACL SETUSER x (+nosuch)",
        "ACL SETUSER x (~a allkeys ~b)",
        "ACL SETUSER x (on)",
        "ACL SETUSER \"a b\" on",
        "ACL SETUSER",
        "ACL GETUSER",
        "ACL GETUSER a b",
        "ACL DELUSER",
        "ACL DELUSER default",
        "ACL DELUSER alice default",
        "ACL USERS x",
        "ACL FOO",
        "ACL HELP",
        "ACL HELP x",
        "ACL CAT a b",
        "ACL CAT nosuch",
        "ACL GENPASS 0",
        "ACL GENPASS 4097",
        "ACL GENPASS x",
        "ACL GENPASS 1 2",
        "ACL LOG x",
        "ACL LOG 1 2",
        "ACL LOAD",
        "ACL SAVE",
        "ACL LOAD x",
        "ACL WHOAMI",
        "ACL WHOAMI x",
        "ACL DRYRUN",
        "ACL DRYRUN alice",
        "ACL DRYRUN alice get",
        "ACL DRYRUN nouser get a",
        "ACL DRYRUN alice nosuchcmd a",
        "ACL DRYRUN alice config nosuch",
        "ACL DRYRUN alice get a b",
        "ACL DRYRUN alice config get",
    ] {
        p.exact(line);
    }
    // Nothing of a refused SETUSER is applied.
    p.exact("ACL SETUSER alice off +del +nosuch");
    p.rules("ACL GETUSER alice");
    p.exact("ACL CAT");
    p.exact("ACL DELUSER eve nobody eve");
    p.exact("ACL USERS");
    // GENPASS: lengths.
    for (line, len) in [
        ("ACL GENPASS", 64),
        ("ACL GENPASS 1", 1),
        ("ACL GENPASS 5", 2),
        ("ACL GENPASS 4096", 1024),
    ] {
        let (e, r) = p.both(line);
        for x in [&e, &r] {
            let t = text(x);
            assert_eq!(t.len(), len, "{line}: {x:?}");
            assert!(t
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        }
    }
    p.done("setuser/getuser/list");
}

/// ACL CAT of each category: Redis's list restricted to Ember's commands.
#[test]
fn acl_cat_matches_redis_on_embers_commands() {
    let (_d, ember, redis) = start_both(&[]);
    let mut p = Pair::open(ember.port, redis.port);
    let Reply::Array(cats) = p.exact("ACL CAT") else {
        panic!("ACL CAT")
    };
    let names = |r: Reply| -> BTreeSet<String> {
        match r {
            Reply::Array(v) => v.iter().map(text).collect(),
            other => panic!("{other:?}"),
        }
    };
    let mut per_cat = Vec::new();
    let (mut ours, mut all) = (BTreeSet::new(), BTreeSet::new());
    for c in &cats {
        let (e, r) = p.both(&format!("ACL CAT {}", text(c)));
        let (e, r) = (names(e), names(r));
        ours.extend(e.iter().cloned());
        all.extend(r.iter().cloned());
        per_cat.push((text(c), e, r));
    }
    assert!(ours.contains("get") && ours.contains("config|get") && ours.contains("acl|log"));
    // Every command is in @fast or @slow: `ours` and `all` are every
    // command each server has (Ember has a few of Redis 7.2's).
    for (c, e, r) in per_cat {
        let theirs: BTreeSet<&String> = r.intersection(&ours).collect();
        let mine: BTreeSet<&String> = e.intersection(&all).collect();
        assert_eq!(mine, theirs, "ACL CAT {c}");
    }
    p.done("acl cat");
}

/// Users with category and command rules allow and deny the same requests
/// (ACL DRYRUN on both servers, for every user and request).
#[test]
fn dryrun_matrix() {
    let (_d, ember, redis) = start_both(&[]);
    let mut p = Pair::open(ember.port, redis.port);
    let users = [
        "u1 on allkeys +@read",
        "u2 on allkeys +@all -@dangerous",
        "u3 on allkeys +@string -@write +del",
        "u4 on allkeys +@keyspace -@slow",
        "u5 on allkeys +@admin",
        "u6 on allkeys +@connection -client|kill",
        "u7 on ~a* %R~r* %W~w* +@all",
        "u8 on allkeys +config -config|set +client|id +select|2",
        "u9 on allkeys +@fast +@slow -@admin",
        "u10 on resetkeys +@all",
        "u11 on allkeys -@all +object|encoding +@write -@string",
        "u12 on ~a* +get +mget +rename (~w* +set +mget) (%R~r* +@read)",
        "u13 on (allkeys +@keyspace) (~r* +@string)",
    ];
    for u in users {
        p.exact(&format!("ACL SETUSER {u}"));
    }
    let requests = [
        "get a",
        "get r1",
        "set a 1",
        "set w1 1",
        "set r1 1",
        "set w1 1 get",
        "set w1 1 GET ex 10",
        "set a 1 xx",
        "mget a r1 w1",
        "mset a 1 b 2",
        "del a",
        "unlink a",
        "exists a",
        "incr a",
        "append a x",
        "rename a b",
        "rename r1 w1",
        "expire a 10",
        "ttl a",
        "keys *",
        "scan 0",
        "dbsize",
        "flushdb",
        "flushall",
        "ping",
        "echo x",
        "select 0",
        "select 2",
        "info",
        "config get port",
        "config set hz 10",
        "config resetstat",
        "client id",
        "client list",
        "client kill 1.2.3.4:5",
        "client setname x",
        "object encoding a",
        "object encoding r1",
        "object help",
        "command count",
        "command",
        "acl whoami",
        "acl log",
        "acl setuser z",
        "time",
        "lastsave",
        "save",
        "shutdown",
        "debug sleep 0",
        "auth a b",
        "hello",
        "getdel w1",
        "setrange w1 0 x",
        "strlen r1",
    ];
    for u in &users {
        let name = u.split(' ').next().unwrap_or("");
        for r in requests {
            p.exact(&format!("ACL DRYRUN {name} {r}"));
        }
    }
    p.done("dryrun matrix");
}

/// A restricted user's requests: allowed ones run, denied ones get Redis's
/// NOPERM texts and are recorded in ACL LOG; logins that fail are recorded
/// too. Changing the user applies to its connection at once; deleting it
/// closes the connection.
#[test]
fn restricted_user_requests_and_log_match_redis() {
    let (_d, ember, redis) = start_both(&[]);
    let mut admin = Pair::open(ember.port, redis.port);
    admin.exact("ACL SETUSER alice on >p1 ~cached:* %R~r:* %W~w:* +@string +ping +client|info +acl|whoami +select|0");
    admin.exact("ACL SETUSER bob off >p2 +@all ~*");
    admin.exact("ACL LOG RESET");
    let mut u = Pair::open(ember.port, redis.port);
    for line in [
        "AUTH alice wrong",
        "AUTH nouser p1",
        "AUTH bob p2",
        "AUTH p1",
        "AUTH a b c",
        "HELLO 2 AUTH alice wrong",
        "ACL WHOAMI",
        "AUTH alice p1",
        "ACL WHOAMI",
        "PING",
        "SET cached:1 v",
        "GET cached:1",
        "GET other",
        "SET r:1 v",
        "GET r:1",
        "SET w:1 v",
        "GET w:1",
        "APPEND w:1 x",
        "MGET cached:1 r:1 other",
        "MSET cached:2 v other v",
        "DEL cached:1",
        "DEL cached:1",
        "CONFIG GET port",
        "CONFIG FOO",
        "CONFIG GET",
        "CLIENT ID",
        "SELECT 0",
        "SELECT 1",
        "ACL LIST",
        "ACL WHOAMI",
        "KEYS *",
        "FLUSHALL",
        "OBJECT ENCODING cached:2",
        "NOSUCHCOMMAND x",
        "GET",
    ] {
        u.exact(line);
    }
    // CLIENT INFO names the user.
    let (e, r) = u.both("CLIENT INFO");
    assert_eq!(client_field(&text(&e), "user"), "alice", "{e:?}");
    assert_eq!(client_field(&text(&r), "user"), "alice", "{r:?}");
    let (e, r) = admin.both("ACL LOG");
    assert_eq!(
        log_view(&e),
        log_view(&r),
        "ACL LOG\n ember {e:?}\n redis {r:?}"
    );
    for line in ["ACL LOG 2", "ACL LOG 0", "ACL LOG -1"] {
        let (e, r) = admin.both(line);
        assert_eq!(log_view(&e), log_view(&r), "{line}");
    }
    // A change to the user applies to its connection's next request.
    admin.exact("ACL SETUSER alice -get +del allkeys");
    for line in ["GET cached:2", "DEL other", "ACL WHOAMI"] {
        u.exact(line);
    }
    admin.exact("ACL SETUSER alice resetpass");
    u.exact("SET other 1");
    // RESET logs out to the default user.
    u.exact("RESET");
    u.exact("ACL WHOAMI");
    u.exact("AUTH alice p1");
    u.exact("AUTH default anything");
    u.exact("ACL WHOAMI");
    // Deleting a user closes its connections (not the others).
    let mut v = Pair::open(ember.port, redis.port);
    admin.exact("ACL SETUSER carol on >pc +@all ~*");
    v.exact("AUTH carol pc");
    v.exact("ACL WHOAMI");
    admin.exact("ACL DELUSER carol");
    std::thread::sleep(Duration::from_millis(200));
    let req = proto_req(&["ACL", "WHOAMI"]);
    let e = v.ember.request(&req);
    let r = v.redis.request(&req);
    assert!(e.is_err() && r.is_err(), "closed: ember {e:?} redis {r:?}");
    // A connection deleting its own user gets the reply, then is closed.
    let mut w = Pair::open(ember.port, redis.port);
    admin.exact("ACL SETUSER dan on >pd +@all ~*");
    w.exact("AUTH dan pd");
    w.exact("ACL DELUSER dan");
    let e = w.ember.request(&req);
    let r = w.redis.request(&req);
    assert!(e.is_err() && r.is_err(), "closed: ember {e:?} redis {r:?}");
    admin.exact("ACL WHOAMI");
    // acllog-max-len trims the log at its next entry.
    for line in [
        "CONFIG GET acllog-max-len",
        "CONFIG SET acllog-max-len 2",
        "AUTH nouser1 x",
        "AUTH nouser2 x",
        "AUTH nouser3 x",
    ] {
        admin.exact(line);
    }
    let (e, r) = admin.both("ACL LOG");
    assert_eq!(log_view(&e), log_view(&r), "ACL LOG after acllog-max-len 2");
    assert_eq!(log_view(&e).len(), 2);
    admin.exact("CONFIG SET acllog-max-len 128");
    admin.exact("ACL LOG RESET");
    admin.exact("ACL LOG");
    admin.done("admin");
    u.done("restricted user");
}

fn proto_req(a: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    proto::encode_request(a, &mut out);
    out
}

/// `requirepass` is the default user's password; CONFIG SET requirepass
/// changes it; AUTH's one-argument form and HELLO AUTH.
#[test]
fn requirepass_is_the_default_users_password() {
    let (_d, ember, redis) = start_both(&["--requirepass", "pw"]);
    let mut p = Pair::open(ember.port, redis.port);
    for line in [
        "GET a",
        "ACL WHOAMI",
        "AUTH wrong",
        "AUTH default wrong",
        "HELLO 2 AUTH default wrong",
        "AUTH pw",
        "ACL WHOAMI",
        "AUTH default pw",
        "ACL GETUSER default",
        "ACL LIST",
        "CONFIG SET requirepass other",
        "ACL GETUSER default",
        "AUTH pw",
        "AUTH other",
        "CONFIG SET requirepass \"\"",
        "ACL GETUSER default",
        "AUTH x",
        "AUTH default x",
        "ACL SETUSER default >np",
        "AUTH x",
        "AUTH np",
    ] {
        p.rules(line);
    }
    let (e, r) = p.both("ACL LOG");
    assert_eq!(log_view(&e), log_view(&r));
    // A new connection needs to log in again (the default user has a
    // password once more); HELLO AUTH logs in.
    let mut q = Pair::open(ember.port, redis.port);
    q.exact("GET a");
    let (e, r) = q.both("HELLO 2 AUTH default np");
    assert!(
        !matches!(e, Reply::Error(_)) && !matches!(r, Reply::Error(_)),
        "{e:?} {r:?}"
    );
    q.exact("ACL WHOAMI");
    // The default user off: nobody logs in as it, its connections stay.
    p.exact("ACL SETUSER default off");
    let mut n = Pair::open(ember.port, redis.port);
    n.exact("AUTH np");
    n.exact("GET a");
    p.exact("GET a");
    p.exact("ACL SETUSER default on");
    p.done("requirepass");
    q.done("hello");
    n.done("default off");
}

/// `user` directives in the configuration file, and refused ones.
#[test]
fn config_file_users() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("ember.conf");
    std::fs::write(
        &conf,
        "user alice on >pa ~a:* +get +set\nuser default on nopass ~* &* +@all -flushall\n",
    )
    .unwrap();
    let ember = Server::start(dir.path(), &["--config", conf.to_str().unwrap()]);
    let mut c = Conn::open(ember.port);
    let want = Reply::Array(vec![
        Reply::Bulk(
            format!(
                "user alice on #{} ~a:* resetchannels -@all +get +set",
                sha256_hex("pa")
            )
            .into_bytes(),
        ),
        // A `user default` directive resets the user first, as Redis does.
        Reply::Bulk(b"user default on nopass sanitize-payload ~* &* +@all -flushall".to_vec()),
    ]);
    assert_eq!(c.call(&args("ACL LIST")), want);
    assert_eq!(
        c.call(&args("FLUSHALL")),
        Reply::Error("NOPERM this user has no permissions to run the 'flushall' command".into())
    );
    assert_eq!(c.call(&args("AUTH alice pa")), Reply::Simple("OK".into()));
    assert_eq!(
        c.call(&args("GET b:1")),
        Reply::Error(
            "NOPERM this user has no permissions to access one of the keys used as arguments"
                .into()
        )
    );
    drop(ember);
    // Refused at startup: a bad rule, a duplicate user, `user` with aclfile.
    for (text, why) in [
        ("user bob on +nosuch\n", "Unknown command"),
        ("user bob on\nuser bob off\n", "Duplicate user"),
        ("user bob on\naclfile /nonexistent/users.acl\n", "not both"),
    ] {
        std::fs::write(&conf, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["serve", "--port", "0", "--config", conf.to_str().unwrap()])
            .arg("--heap")
            .arg(dir.path().join("x.heap"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{text}: {err}");
    }
}

fn sha256_hex(s: &str) -> String {
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut ch| {
            use std::io::Write;
            ch.stdin.take().unwrap().write_all(s.as_bytes())?;
            ch.wait_with_output()
        })
        .unwrap();
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

/// ACL SAVE writes the users to the ACL file; ACL LOAD reads them back,
/// closing the connections of the users it replaces; a bad file changes
/// nothing. The same file loads in redis-server with the same users.
#[test]
fn aclfile_save_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users.acl");
    std::fs::write(&file, "user default on nopass ~* &* +@all\n").unwrap();
    let ember = Server::start(dir.path(), &["--aclfile", file.to_str().unwrap()]);
    let mut c = Conn::open(ember.port);
    let ok = Reply::Simple("OK".into());
    for line in [
        "ACL SETUSER alice on >pa ~a:* %R~r:* &ch +get +set +select|0",
        "ACL SETUSER bob off #5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8 allkeys +@all -@dangerous",
    ] {
        assert_eq!(c.call(&args(line)), ok, "{line}");
    }
    let before = c.call(&args("ACL LIST"));
    assert_eq!(c.call(&args("ACL SAVE")), ok);
    let saved = std::fs::read_to_string(&file).unwrap();
    assert_eq!(saved.lines().count(), 3, "{saved}");
    assert!(
        !std::fs::read_dir(dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp-")),
        "no temporary file left"
    );
    // Changes after the save are undone by LOAD; alice's connection closes.
    let mut a = Conn::open(ember.port);
    assert_eq!(a.call(&args("AUTH alice pa")), ok);
    assert_eq!(c.call(&args("ACL DELUSER bob")), Reply::Integer(1));
    assert_eq!(c.call(&args("ACL SETUSER carol on")), ok);
    assert_eq!(c.call(&args("ACL LOAD")), ok);
    assert_eq!(c.call(&args("ACL LIST")), before);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        a.request(&proto_req(&["PING"])).is_err(),
        "alice's connection closed"
    );
    assert_eq!(
        c.call(&args("ACL WHOAMI")),
        Reply::Bulk(b"default".to_vec())
    );
    // A file with errors is refused whole.
    std::fs::write(
        &file,
        "user zed on\n# a comment\nuser zed off\nuser yan +nosuch ~a allkeys ~b\n",
    )
    .unwrap();
    let r = c.call(&args("ACL LOAD"));
    let f = file.display();
    assert_eq!(
        r,
        Reply::Error(format!(
            "ERR {f}:2 should start with user keyword followed by the username. \
             WARNING: Duplicate user 'zed' found on line 3. \
             {f}:4: Error in applying operation '+nosuch': Unknown command or category name in ACL. \
             {f}:4: Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of patterns. \
             WARNING: ACL errors detected, no change to the previously active ACL rules was performed"
        ))
    );
    assert_eq!(c.call(&args("ACL LIST")), before);
    // The saved file gives redis-server the same users.
    std::fs::write(&file, &saved).unwrap();
    let redis = RedisServer::start_with(&["--aclfile", file.to_str().unwrap()]);
    let mut r = Conn::open(redis.port);
    assert_eq!(norm(&r.call(&args("ACL LIST"))), norm(&before));
    assert_eq!(c.call(&args("ACL LOAD")), ok);
    assert_eq!(norm(&c.call(&args("ACL LIST"))), norm(&before));
}

/// A client library logs in as a user and is refused what the user may not
/// do.
#[test]
fn redis_crate_client_logs_in_as_a_user() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut admin = ember.client();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "app",
            "on",
            ">s3cret",
            "~app:*",
            "+@read",
            "+@write",
            "-@dangerous",
        ])
        .query(&mut admin)
        .unwrap();
    let c = redis::Client::open(format!("redis://app:s3cret@127.0.0.1:{}/", ember.port)).unwrap();
    let mut con = c.get_connection().unwrap();
    let who = redis::cmd("ACL")
        .arg("WHOAMI")
        .query::<String>(&mut con)
        .unwrap_err()
        .to_string();
    assert!(who.contains("NOPERM"), "{who}");
    let _: () = redis::cmd("SET")
        .arg("app:1")
        .arg("v")
        .query(&mut con)
        .unwrap();
    let v: String = redis::cmd("GET").arg("app:1").query(&mut con).unwrap();
    assert_eq!(v, "v");
    let e = redis::cmd("GET")
        .arg("other")
        .query::<Option<String>>(&mut con)
        .unwrap_err();
    assert!(e.to_string().contains("NOPERM"), "{e}");
    let e = redis::cmd("FLUSHALL").query::<()>(&mut con).unwrap_err();
    assert!(e.to_string().contains("flushall"), "{e}");
    let bad = redis::Client::open(format!("redis://app:wrong@127.0.0.1:{}/", ember.port)).unwrap();
    let e = bad.get_connection().map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), redis::ErrorKind::AuthenticationFailed, "{e}");
}
