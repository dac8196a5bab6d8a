//! A full heap and a full disk are errors, not hangs or crashes: writes past
//! the heap's limit get `-OOM` at once while reads, PING and removes keep
//! working and free room for later writes; a file system without room for the
//! heap is a clear error at the start or a `-OOM` reply when the heap grows,
//! never a SIGBUS; a SIGBUS that still happens (the heap file truncated under
//! the server) ends the process with a message naming the heap.

mod serve_common;

use serve_common::Server;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// One field of INFO.
fn info_field(con: &mut redis::Connection, section: &str, field: &str) -> String {
    let text: String = redis::cmd("INFO").arg(section).query(con).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{text}"))
        .trim()
        .to_string()
}

fn set(con: &mut redis::Connection, k: &str, v: &[u8]) -> redis::RedisResult<()> {
    redis::cmd("SET").arg(k).arg(v).query(con)
}

fn is_oom(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM")
}

/// SETs `prefix{n}` of `val` until one gets `-OOM` (adding the acknowledged
/// ones to `model`); panics on any other error or when no OOM comes within
/// `max` writes. Returns the OOM's text.
fn fill(
    con: &mut redis::Connection,
    model: &mut BTreeMap<String, Vec<u8>>,
    prefix: &str,
    val: &[u8],
    max: usize,
) -> String {
    for n in 0..max {
        // Zero-padded: the model's order is the order of the writes.
        let k = format!("{prefix}{n:06}");
        let t = Instant::now();
        match set(con, &k, val) {
            Ok(()) => {
                model.insert(k, val.to_vec());
            }
            Err(e) if is_oom(&e) => {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "OOM took {:?}",
                    t.elapsed()
                );
                return e.to_string();
            }
            Err(e) => panic!("SET {k}: unexpected error {e}"),
        }
    }
    panic!("{max} SETs of {} bytes never filled the heap", val.len());
}

/// SET `k` until it succeeds within `secs` (removes are applied in the
/// background, and the room they free is found by the next write that needs it).
fn set_eventually(con: &mut redis::Connection, k: &str, v: &[u8], secs: u64) {
    let t = Instant::now();
    loop {
        match set(con, k, v) {
            Ok(()) => return,
            Err(e) if is_oom(&e) && t.elapsed() < Duration::from_secs(secs) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("SET {k} after freeing room: {e} (after {:?})", t.elapsed()),
        }
    }
}

/// Removes keys of `model` whose name starts with `prefix` with `cmd` (DEL,
/// UNLINK, or PEXPIREAT in the past), oldest first, until a SET of `k` to `v`
/// succeeds: each round removes the writes Bullet has waiting for room (INFO
/// `heap_full_keys`, which get the room removes free first; 0 for the direct
/// engine) and `step` more, then retries the SET for up to 2 s (removes are
/// applied in the background). Panics when the keys run out first. Returns
/// how many keys it removed.
fn make_room_for(
    con: &mut redis::Connection,
    model: &mut BTreeMap<String, Vec<u8>>,
    (prefix, cmd, step): (&str, &str, usize),
    k: &str,
    v: &[u8],
) -> usize {
    let mut removed = 0;
    loop {
        let waiting: usize = info_field(con, "ember", "heap_full_keys").parse().unwrap();
        let keys: Vec<String> = model
            .keys()
            .filter(|k| k.starts_with(prefix))
            .take(waiting + step)
            .cloned()
            .collect();
        assert!(
            !keys.is_empty(),
            "{cmd} of every {prefix}* key made no room for {k}"
        );
        for key in &keys {
            let mut c = redis::cmd(cmd);
            c.arg(key);
            if cmd == "PEXPIREAT" {
                c.arg(1);
            }
            let n: u64 = c.query(con).unwrap();
            assert_eq!(n, 1, "{cmd} {key}");
            model.remove(key);
        }
        removed += keys.len();
        let t = Instant::now();
        loop {
            match set(con, k, v) {
                Ok(()) => {
                    model.insert(k.to_string(), v.to_vec());
                    return removed;
                }
                Err(e) if is_oom(&e) && t.elapsed() < Duration::from_secs(2) => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) if is_oom(&e) => break,
                Err(e) => panic!("SET {k} after removes: {e}"),
            }
        }
    }
}

/// The model's keys all read back with their values.
fn check_model(con: &mut redis::Connection, model: &BTreeMap<String, Vec<u8>>) {
    let n: u64 = redis::cmd("DBSIZE").query(con).unwrap();
    assert_eq!(n, model.len() as u64);
    for (k, v) in model {
        let got: Vec<u8> = redis::cmd("GET").arg(k).query(con).unwrap();
        assert!(got == *v, "{k}: {} bytes, expected {}", got.len(), v.len());
    }
}

/// A heap that fills up, with small numbers: a heap of 32 MiB growing to
/// 64 MiB, 1 MiB values. SETs until `-OOM`; further SETs get `-OOM` promptly;
/// GET and PING work; DEL, UNLINK, EXPIRE and FLUSHDB each free room for
/// later SETs; SIGTERM exits; after a restart every acknowledged key is there.
/// For Bullet and for the backend alone (`--engine direct`).
#[test]
fn a_full_heap_answers_oom_and_deletes_make_room() {
    for engine in ["bullet", "direct"] {
        let dir = tmp();
        let mut srv = Server::start(
            dir.path(),
            &[
                "--engine",
                engine,
                "--heap-size",
                "32mb",
                "--heap-max-size",
                "64mb",
                "--threads",
                "1",
            ],
        );
        let mut con = srv.client();
        let mut model = BTreeMap::new();
        let val = vec![b'v'; 1 << 20];
        let oom = fill(&mut con, &mut model, "key", &val, 200);
        assert!(oom.contains("heap is full"), "{engine}: {oom}");
        assert!(model.len() >= 5, "{engine}: only {} SETs fit", model.len());
        // Every further write is refused promptly; reads and PING work.
        for i in 0..10 {
            let t = Instant::now();
            let e = set(&mut con, &format!("more{i}"), &val).unwrap_err();
            assert!(is_oom(&e), "{engine}: {e}");
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "{engine}: OOM took {:?}",
                t.elapsed()
            );
            let p: String = redis::cmd("PING").query(&mut con).unwrap();
            assert_eq!(p, "PONG");
        }
        let got: Vec<u8> = redis::cmd("GET").arg("key000000").query(&mut con).unwrap();
        assert_eq!(got, val);
        assert_ne!(info_field(&mut con, "ember", "heap_oom_errors"), "0");
        assert!(info_field(&mut con, "ember", "heap_full_reason").contains("heap is full"));
        // DEL frees room.
        make_room_for(
            &mut con,
            &mut model,
            ("key", "DEL", 2),
            "after-del",
            b"room",
        );
        // UNLINK, EXPIRE (in the past: the key goes) and FLUSHDB too, each
        // after the heap is full again.
        fill(&mut con, &mut model, "a", &val, 200);
        make_room_for(
            &mut con,
            &mut model,
            ("a0", "UNLINK", 2),
            "after-unlink",
            b"x",
        );
        fill(&mut con, &mut model, "b", &val, 200);
        make_room_for(
            &mut con,
            &mut model,
            ("b0", "PEXPIREAT", 2),
            "after-expire",
            b"y",
        );
        check_model(&mut con, &model);
        // FLUSHDB on database 1, filled until the heap is full.
        let _: () = redis::cmd("SELECT").arg(1).query(&mut con).unwrap();
        let mut db1 = BTreeMap::new();
        fill(&mut con, &mut db1, "c", &val, 200);
        let _: () = redis::cmd("FLUSHDB").query(&mut con).unwrap();
        set_eventually(&mut con, "after-flush", b"z", 10);
        let _: () = redis::cmd("SELECT").arg(0).query(&mut con).unwrap();
        drop(con);
        assert!(
            srv.terminate(),
            "{engine}: SIGTERM did not exit cleanly:\n{}",
            srv.log()
        );
        srv.restart();
        let mut con = srv.client();
        check_model(&mut con, &model);
        let _: () = redis::cmd("SELECT").arg(1).query(&mut con).unwrap();
        let n: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
        assert_eq!(n, 1, "{engine}: database 1 after FLUSHDB");
        drop(con);
        assert!(srv.terminate(), "{engine}:\n{}", srv.log());
    }
}

/// A tmpfs of `mb` MiB mounted at `dir` for the test (unmounted on drop), or
/// None where mounting is not allowed (then the test says so and the
/// file-size limit stands in).
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, mb: u64) -> Option<Mount> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount(dir.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A server process started by hand: killed when dropped (a failed test
/// leaves no server holding the test's file system).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server started by hand, for the file-system tests: `limit` sets
/// RLIMIT_FSIZE (bytes) in the child (SIGXFSZ ignored, so that a write past
/// it is the error EFBIG, as a full file system's ENOSPC is).
fn spawn(heap: &Path, log: &Path, args: &[&str], limit: Option<u64>) -> (Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.arg("serve")
        .arg("--port")
        .arg(port.to_string())
        .arg("--heap")
        .arg(heap)
        .args(["--logs", "4", "--log-size", "4mb", "--threads", "1"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if let Some(l) = limit {
        use std::os::unix::process::CommandExt;
        // SAFETY: only async-signal-safe calls (signal, setrlimit) between
        // fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let r = libc::rlimit {
                    rlim_cur: l,
                    rlim_max: l,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    (Child(cmd.spawn().unwrap()), port)
}

/// Waits for PING to answer, or for the process to exit (its status).
fn wait_ready(child: &mut Child, port: u16) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        if let Ok(Some(st)) = child.0.try_wait() {
            return Some(st);
        }
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut b = [0u8; 7];
            if s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut b).is_ok() {
                return None;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("server neither served nor exited");
}

fn wait_exit(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Ok(Some(st)) = child.0.try_wait() {
            return st;
        }
        if t.elapsed() > Duration::from_secs(secs) {
            let _ = child.0.kill();
            panic!("the server did not exit within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    wait_exit(child, 60)
}

fn connect(port: u16) -> redis::Connection {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let con = c.get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    con
}

/// A full disk, small: a heap on a file system of 80 MiB (a
/// tmpfs the test mounts, or a file-size limit of 80 MiB where mounting is
/// not allowed). A 200 MiB heap is refused at the start with a message
/// naming the heap and its file system, and no signal. A 16 MiB heap that may
/// grow to 512 MiB takes 4 KiB SETs until it cannot grow: then every SET gets
/// `-OOM` naming the full file system (INFO says so too), reads keep working,
/// DELs make room for new SETs, SIGTERM exits, and a restart finds every
/// acknowledged key.
#[test]
fn a_full_disk_is_an_error_reply_and_a_clear_start_error() {
    let dir = tmp();
    let fs = dir.path().join("fs");
    std::fs::create_dir(&fs).unwrap();
    let mount = Mount::tmpfs(&fs, 80);
    let limit = if mount.is_some() {
        None
    } else {
        eprintln!("mounting a tmpfs is not allowed here: RLIMIT_FSIZE of 80 MiB stands in");
        Some(80u64 << 20)
    };
    let heap = fs.join("ember.heap");
    let log = dir.path().join("server.log");
    // Too large for the file system: a clear error at the start.
    let (mut child, port) = spawn(&heap, &log, &["--heap-size", "200mb"], limit);
    let st = wait_ready(&mut child, port).expect("a 200 MiB heap on 80 MiB started");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(st.code(), Some(1), "{st:?}: {text}");
    assert!(
        text.contains("has no room") && text.contains(&heap.display().to_string()),
        "{text}"
    );
    assert!(!heap.exists(), "the refused heap file was left behind");
    // A heap that grows until the file system is full.
    let args = ["--heap-size", "16mb", "--heap-max-size", "512mb"];
    let (mut child, port) = spawn(&heap, &log, &args, limit);
    assert!(
        wait_ready(&mut child, port).is_none(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let mut con = connect(port);
    let mut model = BTreeMap::new();
    let val = vec![b'd'; 4096];
    let oom = fill(&mut con, &mut model, "k", &val, 100_000);
    assert!(oom.contains("file system is full"), "{oom}");
    assert!(model.len() > 1000, "only {} SETs", model.len());
    for i in 0..5 {
        let e = set(&mut con, &format!("more{i}"), &val).unwrap_err();
        assert!(is_oom(&e), "{e}");
    }
    assert!(info_field(&mut con, "ember", "heap_full_reason").contains("file system is full"));
    let got: Vec<u8> = redis::cmd("GET").arg("k000000").query(&mut con).unwrap();
    assert_eq!(got, val);
    make_room_for(&mut con, &mut model, ("k0", "DEL", 500), "after", &val);
    drop(con);
    let st = sigterm(&mut child);
    assert!(
        st.success(),
        "{st:?}: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    let (mut child, port) = spawn(&heap, &log, &args, limit);
    assert!(
        wait_ready(&mut child, port).is_none(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let mut con = connect(port);
    check_model(&mut con, &model);
    drop(con);
    assert!(sigterm(&mut child).success());
    drop(mount);
}

/// The heap file truncated under a running server: the next write touches a
/// page the file no longer has; the process ends with exit code 86 and a
/// message naming the heap, not a bare SIGBUS.
#[test]
fn a_sigbus_in_the_heap_names_the_heap() {
    let dir = tmp();
    let heap = dir.path().join("ember.heap");
    let log = dir.path().join("server.log");
    let (mut child, port) = spawn(&heap, &log, &["--heap-size", "32mb"], None);
    assert!(wait_ready(&mut child, port).is_none());
    let mut con = connect(port);
    for i in 0..100 {
        set(&mut con, &format!("k{i}"), b"before").unwrap();
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&heap)
        .unwrap()
        .set_len(4096)
        .unwrap();
    // The write faults; its connection is closed by the exit.
    let _ = set(&mut con, "after", &[b'x'; 100_000]);
    let st = wait_exit(&mut child, 30);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(st.code(), Some(pmem::SIGBUS_EXIT_CODE), "{st:?}: {text}");
    assert!(
        text.contains("SIGBUS") && text.contains(&heap.display().to_string()),
        "{text}"
    );
}
