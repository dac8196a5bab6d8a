//! Serving safely on a network: TLS (with redis-cli and the `redis` crate,
//! mutual TLS, TLS only, bad peers, startup errors), client output buffer
//! limits, and the metrics endpoint's loopback-only listener.
//!
//! Certificates are made here with rcgen: a CA, a server certificate for
//! 127.0.0.1 and localhost and a client certificate signed by it, and a
//! second CA whose client certificate the server must refuse.

mod serve_common;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use redis::{ClientTlsConfig, TlsCertificates};
use serve_common::{free_port, info_field, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// PEM files in a directory: `ca.pem`, `server.pem`/`server.key` (signed by
/// the CA), `client.pem`/`client.key` (signed by the CA), and
/// `other-client.pem`/`other-client.key` (signed by another CA).
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn make(dir: &Path) -> Certs {
        let ca = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, name);
            p.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let cert = p.self_signed(&key).unwrap();
            (cert, key)
        };
        let leaf = |names: &[&str], eku, ca: &(rcgen::Certificate, KeyPair)| {
            let key = KeyPair::generate().unwrap();
            let mut p =
                CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                    .unwrap();
            p.distinguished_name.push(DnType::CommonName, names[0]);
            p.extended_key_usages = vec![eku];
            let cert = p.signed_by(&key, &ca.0, &ca.1).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let root = ca("Ember test CA");
        let other = ca("Some other CA");
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        write("ca.pem", &root.0.pem());
        let (c, k) = leaf(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            &root,
        );
        write("server.pem", &c);
        write("server.key", &k);
        let (c, k) = leaf(&["client"], ExtendedKeyUsagePurpose::ClientAuth, &root);
        write("client.pem", &c);
        write("client.key", &k);
        let (c, k) = leaf(&["stranger"], ExtendedKeyUsagePurpose::ClientAuth, &other);
        write("other-client.pem", &c);
        write("other-client.key", &k);
        Certs {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(name)).unwrap()
    }

    /// `ember serve` flags for TLS on `port` with `auth` client certificates.
    fn flags(&self, port: u16, auth: &str) -> Vec<String> {
        vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            self.path("server.pem"),
            "--tls-key-file".into(),
            self.path("server.key"),
            "--tls-ca-cert-file".into(),
            self.path("ca.pem"),
            "--tls-auth-clients".into(),
            auth.into(),
        ]
    }

    /// A `redis` crate client over TLS, with the client certificate `cert`
    /// (`client` or `other-client`) or none.
    fn redis_client(&self, port: u16, cert: Option<&str>) -> redis::Client {
        redis::Client::build_with_tls(
            format!("rediss://127.0.0.1:{port}/"),
            TlsCertificates {
                client_tls: cert.map(|c| ClientTlsConfig {
                    client_cert: self.read(&format!("{c}.pem")),
                    client_key: self.read(&format!("{c}.key")),
                }),
                root_cert: Some(self.read("ca.pem")),
            },
        )
        .unwrap()
    }

    /// redis-cli over TLS: its stdout and whether it succeeded.
    fn cli(&self, port: u16, cert: Option<&str>, args: &[&str]) -> (String, bool) {
        let mut c = Command::new("redis-cli");
        c.args(["--tls", "--cacert", &self.path("ca.pem")]);
        if let Some(n) = cert {
            c.args([
                "--cert",
                &self.path(&format!("{n}.pem")),
                "--key",
                &self.path(&format!("{n}.key")),
            ]);
        }
        let out = c
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli");
        (
            String::from_utf8_lossy(&out.stdout).trim().to_string()
                + &String::from_utf8_lossy(&out.stderr),
            out.status.success(),
        )
    }
}

fn server_with_tls(dir: &Path, certs: &Certs, auth: &str, extra: &[&str]) -> (Server, u16) {
    let port = free_port();
    let mut args = certs.flags(port, auth);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    (Server::start(dir, &args), port)
}

#[test]
fn tls_serves_redis_cli_and_the_redis_crate_beside_plain_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::make(dir.path());
    let (srv, port) = server_with_tls(dir.path(), &certs, "no", &[]);
    assert!(
        srv.log().contains(&format!("TLS port {port}")),
        "{}",
        srv.log()
    );
    // redis-cli 7.0, built with OpenSSL.
    assert_eq!(certs.cli(port, None, &["PING"]), ("PONG".into(), true));
    assert_eq!(
        certs.cli(port, None, &["SET", "k", "over tls"]),
        ("OK".into(), true)
    );
    assert_eq!(
        certs.cli(port, None, &["GET", "k"]),
        ("over tls".into(), true)
    );
    // The plain port serves the same data at the same time.
    let mut plain = srv.client();
    let v: String = redis::cmd("GET").arg("k").query(&mut plain).unwrap();
    assert_eq!(v, "over tls");
    // The redis crate (rustls), a pipeline of many requests and big values
    // both ways: records split across reads and partial socket writes.
    let mut con = certs.redis_client(port, None).get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let _: () = redis::cmd("SET")
        .arg("big")
        .arg(&big)
        .query(&mut con)
        .unwrap();
    let mut p = redis::pipe();
    for i in 0..2000 {
        p.cmd("SET").arg(format!("p:{i}")).arg(i).ignore();
    }
    for i in 0..2000 {
        p.cmd("GET").arg(format!("p:{i}"));
    }
    p.cmd("GET").arg("big");
    let (vals, got_big): (Vec<i64>, Vec<u8>) = {
        let mut r: Vec<redis::Value> = p.query(&mut con).unwrap();
        let last = r.pop().unwrap();
        let vals = r
            .iter()
            .map(|v| redis::from_redis_value(v).unwrap())
            .collect();
        (vals, redis::from_redis_value(&last).unwrap())
    };
    assert_eq!(vals, (0..2000).collect::<Vec<i64>>());
    assert!(got_big == big, "the 3 MB value came back different");
    let n: i64 = redis::cmd("DBSIZE").query(&mut plain).unwrap();
    assert_eq!(n, 2002);
    // CONFIG GET reports the TLS parameters as Redis names them.
    let cfg: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("tls-*")
        .query(&mut con)
        .unwrap();
    let get = |k: &str| {
        let i = cfg
            .iter()
            .position(|x| x == k)
            .unwrap_or_else(|| panic!("{k}: {cfg:?}"));
        cfg[i + 1].clone()
    };
    assert_eq!(get("tls-port"), port.to_string());
    assert_eq!(get("tls-auth-clients"), "no");
    assert_eq!(get("tls-cert-file"), certs.path("server.pem"));
    assert_eq!(get("tls-key-file"), certs.path("server.key"));
    assert_eq!(get("tls-ca-cert-file"), certs.path("ca.pem"));
    let e = redis::cmd("CONFIG")
        .arg("SET")
        .arg("tls-port")
        .arg("1")
        .query::<()>(&mut con)
        .unwrap_err();
    assert!(e.to_string().contains("can't set immutable config"), "{e}");
    // Over maxclients a TLS client is closed: the error would be plain text
    // inside its TLS stream.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg("2")
        .query(&mut plain)
        .unwrap();
    let (out, ok) = certs.cli(port, None, &["PING"]);
    assert!(!(ok && out == "PONG"), "{out}");
    // At least this client was refused (redis-cli may try more than one
    // connection: the exact count was 2 in one loaded run).
    let rejected: u64 = info_field(&mut plain, "stats", "rejected_connections")
        .parse()
        .unwrap();
    assert!(rejected >= 1, "rejected_connections {rejected}");
}

#[test]
fn mutual_tls_requires_or_verifies_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::make(dir.path());
    // tls-auth-clients yes (Redis's default): no certificate, or one from
    // another CA, is refused; the CA's client certificate is served.
    let (mut srv, port) = server_with_tls(dir.path(), &certs, "yes", &[]);
    let (out, ok) = certs.cli(port, None, &["PING"]);
    assert!(!(ok && out == "PONG"), "no client certificate: {out}");
    let (out, ok) = certs.cli(port, Some("other-client"), &["PING"]);
    assert!(!(ok && out == "PONG"), "a stranger's certificate: {out}");
    assert_eq!(
        certs.cli(port, Some("client"), &["PING"]),
        ("PONG".into(), true)
    );
    let refused = certs
        .redis_client(port, None)
        .get_connection()
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(refused.is_err(), "{refused:?}");
    let mut con = certs
        .redis_client(port, Some("client"))
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("m")
        .arg("tls")
        .query(&mut con)
        .unwrap();
    let v: String = redis::cmd("GET").arg("m").query(&mut con).unwrap();
    assert_eq!(v, "tls");
    assert!(srv.log().contains("closing TLS client"), "{}", srv.log());
    srv.kill9();
    // optional: with or without a certificate, but a certificate presented
    // must verify.
    let (_srv, port) = server_with_tls(dir.path(), &certs, "optional", &[]);
    assert_eq!(certs.cli(port, None, &["PING"]), ("PONG".into(), true));
    assert_eq!(
        certs.cli(port, Some("client"), &["PING"]),
        ("PONG".into(), true)
    );
    let (out, ok) = certs.cli(port, Some("other-client"), &["PING"]);
    assert!(!(ok && out == "PONG"), "a stranger's certificate: {out}");
    let mut con = certs.redis_client(port, None).get_connection().unwrap();
    let v: String = redis::cmd("GET").arg("m").query(&mut con).unwrap();
    assert_eq!(v, "tls");
}

/// `port 0` with a TLS port serves TLS only; the TLS parameters come from a
/// configuration file as from flags.
#[test]
fn port_0_serves_tls_only_from_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::make(dir.path());
    let port = free_port();
    let conf = dir.path().join("ember.conf");
    std::fs::write(
        &conf,
        format!(
            "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients optional\n",
            certs.path("server.pem"),
            certs.path("server.key"),
            certs.path("ca.pem"),
        ),
    )
    .unwrap();
    let log = dir.path().join("tls-only.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("serve")
        .arg("--config")
        .arg(&conf)
        .args(["--heap-size", "64mb", "--logs", "2", "--log-size", "4mb"])
        .arg("--heap")
        .arg(dir.path().join("ember.heap"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("ember: serving")
    {
        assert!(t.elapsed() < Duration::from_secs(60), "did not start");
        assert!(child.try_wait().unwrap().is_none(), "exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(certs.cli(port, None, &["PING"]), ("PONG".into(), true));
    let mut con = certs
        .redis_client(port, Some("client"))
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
    assert!(info.contains("\r\ntcp_port:0\r\n"), "{info}");
    let cfg: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query(&mut con)
        .unwrap();
    assert_eq!(cfg, ["port", "0"]);
    // Plain text on the TLS port is not served.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"PING\r\n").unwrap();
    let mut b = Vec::new();
    let _ = s.read_to_end(&mut b);
    assert!(!b.starts_with(b"+PONG"), "{b:?}");
    // Nothing else listens: the server's sockets are the TLS listener and
    // the connections to it.
    let listening = listening_sockets(child.id());
    assert!(
        !listening.is_empty() && listening.iter().all(|(_, p)| *p == port),
        "listening on {listening:?}"
    );
    let _ = child.kill();
    let _ = child.wait();
    // Neither port: refused at startup.
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--port", "0", "--heap"])
        .arg(dir.path().join("none.heap"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listen nowhere"), "{err}");
    assert!(!dir.path().join("none.heap").exists());
}

/// The listening TCP sockets of process `pid`: (local address as
/// /proc/net/tcp writes it, port), from the process's socket descriptors.
fn listening_sockets(pid: u32) -> Vec<(String, u16)> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.display().to_string();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let w: Vec<&str> = line.split_whitespace().collect();
            // State 0A is LISTEN; the tenth column the socket's inode.
            if w.len() < 10 || w[3] != "0A" || !inodes.iter().any(|i| i == w[9]) {
                continue;
            }
            let (addr, port) = w[1].split_once(':').unwrap();
            out.push((addr.to_string(), u16::from_str_radix(port, 16).unwrap()));
        }
    }
    out.sort();
    out
}

/// A plain-text client, random bytes, a handshake that stops half way and
/// a client that hangs up mid-handshake, all on the TLS port while a good
/// TLS client runs: each bad connection is closed (and logged), the good
/// client sees every reply.
#[test]
fn bad_tls_peers_do_not_disturb_a_good_client() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::make(dir.path());
    let (srv, port) = server_with_tls(dir.path(), &certs, "no", &["--threads", "1"]);
    let good = {
        let client = certs.redis_client(port, None);
        std::thread::spawn(move || {
            let mut con = client.get_connection().unwrap();
            con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            for i in 0..3000 {
                let _: () = redis::cmd("SET")
                    .arg(format!("g:{i}"))
                    .arg(i)
                    .query(&mut con)
                    .unwrap();
                let v: i64 = redis::cmd("GET")
                    .arg(format!("g:{i}"))
                    .query(&mut con)
                    .unwrap();
                assert_eq!(v, i);
            }
        })
    };
    let closed = |mut s: TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = Vec::new();
        let r = s.read_to_end(&mut b);
        assert!(
            r.is_ok()
                || r.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "not closed: {r:?}"
        );
        b
    };
    // Silent clients that stay connected: one half way through a handshake.
    let mut half = TcpStream::connect(("127.0.0.1", port)).unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc])
        .unwrap();
    let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for round in 0..20 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"PING\r\n*1\r\n$4\r\nPING\r\n").unwrap();
        let b = closed(s);
        assert!(!b.windows(4).any(|w| w == b"PONG"), "{b:?}");
        // Random bytes after a byte that is no TLS record type.
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut junk: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(round) >> 13) as u8)
            .collect();
        junk[0] = 0x99;
        let _ = s.write_all(&junk);
        closed(s);
        // A well-framed ClientHello whose body is garbage (a session id
        // longer than the message).
        let mut hello = vec![
            0x16, 0x03, 0x01, 0x00, 0x40, 0x01, 0x00, 0x00, 0x3c, 0x03, 0x03,
        ];
        hello.extend_from_slice(&junk[1..33]);
        hello.push(0xff);
        hello.resize(5 + 0x40, 0x42);
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&hello).unwrap();
        closed(s);
        // A TLS record header announcing a handshake, then a hang-up.
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00, 0x01]).unwrap();
        drop(s);
    }
    good.join().unwrap();
    // Still served, plain and TLS.
    assert_eq!(
        certs.cli(port, None, &["GET", "g:2999"]),
        ("2999".into(), true)
    );
    let mut plain = srv.client();
    let n: i64 = redis::cmd("DBSIZE").query(&mut plain).unwrap();
    assert_eq!(n, 3000);
    let log = srv.log();
    assert!(log.contains("closing TLS client"), "{log}");
    drop(half);
}

/// A request followed at once by the client's close_notify (in one TCP
/// segment, the connection left open): the request is answered, then the
/// server ends the session. Likewise a request followed by a TCP half-close.
#[test]
fn tls_end_of_stream_right_after_a_request_is_answered() {
    use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::make(dir.path());
    let (_srv, port) = server_with_tls(dir.path(), &certs, "no", &[]);
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(&certs.read("ca.pem")).unwrap())
        .unwrap();
    let cfg = std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    for half_close in [false, true] {
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
        let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        while tls.is_handshaking() {
            tls.complete_io(&mut sock).unwrap();
        }
        tls.writer().write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        if !half_close {
            tls.send_close_notify();
        }
        // Everything queued leaves in one write.
        let mut out = Vec::new();
        while tls.wants_write() {
            tls.write_tls(&mut out).unwrap();
        }
        sock.write_all(&out).unwrap();
        if half_close {
            sock.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut got = Vec::new();
        let ended = loop {
            match tls.read_tls(&mut sock) {
                Ok(0) => break true,
                Ok(_) => {
                    let st = tls.process_new_packets().unwrap();
                    let mut b = vec![0u8; st.plaintext_bytes_to_read()];
                    tls.reader().read_exact(&mut b).unwrap();
                    got.extend_from_slice(&b);
                    if st.peer_has_closed() {
                        break true;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(e) => panic!("half_close {half_close}: {e} after {got:?}"),
            }
        };
        assert_eq!(got, b"+PONG\r\n", "half_close {half_close}");
        assert!(ended);
    }
}

/// A missing, unreadable or mismatched certificate or key stops the start
/// with a message naming the file, before the heap is created.
#[test]
fn tls_startup_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::make(dir.path());
    let heap = dir.path().join("never.heap");
    let port = free_port().to_string();
    let p = |n: &str| certs.path(n);
    let missing = dir.path().join("missing.pem").display().to_string();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let garbage = garbage.display().to_string();
    let (sc, sk, ck) = (&p("server.pem"), &p("server.key"), &p("client.key"));
    let (m, g) = (&missing, &garbage);
    // (certificate, key, CA, tls-auth-clients, what the error must say).
    let cases: &[(&str, &str, &str, &str, &[&str])] = &[
        (m, sk, "", "no", &[m, "tls-cert-file"]),
        (sc, m, "", "no", &[m, "tls-key-file"]),
        (g, sk, "", "no", &[g, "no PEM certificate"]),
        (sc, g, "", "no", &[g, "no PEM private key"]),
        // The client's key is not the server certificate's.
        (sc, ck, "", "no", &[ck, "not the private key"]),
        // Client certificates verified (the default) need a CA.
        (sc, sk, "", "yes", &["tls-ca-cert-file"]),
        (sc, sk, m, "yes", &[m, "tls-ca-cert-file"]),
        (sc, "", "", "no", &["tls-key-file"]),
        (sc, sk, "", "maybe", &["no, yes, optional"]),
    ];
    for (cert, key, ca, auth, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args([
                "serve",
                "--port",
                &free_port().to_string(),
                "--tls-port",
                &port,
            ])
            .args(["--tls-cert-file", cert, "--tls-key-file", key])
            .args(["--tls-ca-cert-file", ca, "--tls-auth-clients", auth])
            .arg("--heap")
            .arg(&heap)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "started with {cert} {key} {ca} {auth}"
        );
        assert!(!heap.exists(), "created the heap: {err}");
        assert!(want.iter().all(|w| err.contains(w)), "want {want:?}: {err}");
    }
}

// ------------------------------------------------------ output buffer limits

/// The server's resident memory in KiB.
fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Sends `n` pipelined `GET key` and reads nothing.
fn flood_gets(port: u16, key: &str, n: usize) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let req = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).repeat(n);
    s.write_all(req.as_bytes()).unwrap();
    s
}

/// Waits (at most 20 s) until INFO counts `n` clients closed by the output
/// buffer limit.
fn wait_disconnections(con: &mut redis::Connection, n: u64) {
    let t = Instant::now();
    loop {
        let v: u64 = info_field(con, "stats", "client_output_buffer_limit_disconnections")
            .parse()
            .unwrap();
        assert!(v <= n, "{v} disconnections");
        if v == n {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{v} disconnections");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads what `s` holds: true when the stream then ends (closed by the
/// server) within 20 s.
fn closed_by_server(s: &mut TcpStream) -> bool {
    let t = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    while t.elapsed() < Duration::from_secs(20) {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            _ => {}
        }
    }
    false
}

fn obuf_limits(con: &mut redis::Connection) -> String {
    let cfg: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("client-output-buffer-limit")
        .query(con)
        .unwrap();
    cfg[1].clone()
}

fn set_obuf_limits(con: &mut redis::Connection, v: &str) -> redis::RedisResult<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("client-output-buffer-limit")
        .arg(v)
        .query(con)
}

#[test]
fn output_buffer_limit_disconnects_a_client_that_does_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(
        dir.path(),
        &[
            "--client-output-buffer-limit",
            "normal 1mb 512kb 1",
            "--threads",
            "1",
        ],
    );
    let mut con = srv.client();
    assert_eq!(
        obuf_limits(&mut con),
        "normal 1048576 524288 1 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
    );
    let value = vec![b'v'; 100_000];
    let _: () = redis::cmd("SET")
        .arg("v")
        .arg(&value)
        .query(&mut con)
        .unwrap();
    let before = rss_kb(srv.pid());
    // 2,000 replies of 100 KB (200 MB) to a client that reads none: the
    // socket's buffers take a few MB, then the output passes the hard limit.
    let mut greedy = flood_gets(srv.port, "v", 2000);
    wait_disconnections(&mut con, 1);
    let grown_mb = rss_kb(srv.pid()).saturating_sub(before) / 1024;
    // Without the limit the worker would have buffered up to its 64 MB
    // output high water for this client.
    assert!(grown_mb < 40, "RSS grew by {grown_mb} MB");
    // Others are served meanwhile and after.
    let got: Vec<u8> = redis::cmd("GET").arg("v").query(&mut con).unwrap();
    assert!(got == value);
    assert!(closed_by_server(&mut greedy), "not disconnected");
    let log = srv.log();
    assert!(
        log.contains("closed for overcoming of output buffer limits") && log.contains("cmd=get"),
        "{log}"
    );
    // The soft limit: above 512 KB for more than a second, with no hard
    // limit and no new output (the client's pipeline is a few MB only).
    set_obuf_limits(&mut con, "normal 0 512kb 1").unwrap();
    let t = Instant::now();
    let mut slow = flood_gets(srv.port, "v", 150);
    wait_disconnections(&mut con, 2);
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(closed_by_server(&mut slow), "not disconnected");
    // Redis's CONFIG SET errors for this parameter.
    for (bad, why) in [
        (
            "normal 1 2",
            "Wrong number of arguments in buffer limit configuration.",
        ),
        (
            "master 1 2 3",
            "Invalid client class specified in buffer limit configuration.",
        ),
        (
            "normal x 2 3",
            "Error in hard, soft or soft_seconds setting in buffer limit configuration.",
        ),
    ] {
        let e = set_obuf_limits(&mut con, bad).unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "CONFIG SET failed (possibly related to argument 'client-output-buffer-limit') - {why}"
            )),
            "{bad}: {e}"
        );
    }
    // Replica is Redis's other name for the slave class.
    set_obuf_limits(&mut con, "replica 1mb 1mb 5 pubsub 0 0 0").unwrap();
    assert_eq!(
        obuf_limits(&mut con),
        "normal 0 524288 1 slave 1048576 1048576 5 pubsub 0 0 0"
    );
    assert!(srv.terminate());
}

/// With the default limits (none for normal clients) a reply of 30 MB is
/// delivered whole to a client that reads it slowly.
#[test]
fn without_a_limit_a_slow_reader_gets_everything() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &["--threads", "1"]);
    let mut con = srv.client();
    let value: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let _: () = redis::cmd("SET")
        .arg("v")
        .arg(&value)
        .query(&mut con)
        .unwrap();
    let n = 300;
    let mut s = flood_gets(srv.port, "v", n);
    let one = format!("${}\r\n", value.len()).into_bytes();
    let want = n * (one.len() + value.len() + 2);
    std::thread::sleep(Duration::from_secs(2));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::with_capacity(want);
    let mut buf = vec![0u8; 256 * 1024];
    while got.len() < want {
        let k = s.read(&mut buf).unwrap();
        assert!(k > 0, "closed after {} of {want} bytes", got.len());
        got.extend_from_slice(&buf[..k]);
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut reply = one.clone();
    reply.extend_from_slice(&value);
    reply.extend_from_slice(b"\r\n");
    assert!(got.chunks(reply.len()).all(|c| c == reply.as_slice()));
    assert_eq!(
        info_field(
            &mut con,
            "stats",
            "client_output_buffer_limit_disconnections"
        ),
        "0"
    );
}

// ---------------------------------------------------------------- metrics

/// The metrics endpoint listens on the loopback address only, even when the
/// server binds every address.
#[test]
fn metrics_listen_on_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let mport = free_port();
    let srv = Server::start(
        dir.path(),
        &[
            "--bind",
            "0.0.0.0",
            "--protected-mode",
            "yes",
            "--metrics-port",
            &mport.to_string(),
        ],
    );
    let socks = listening_sockets(srv.pid());
    let on = |port: u16| -> Vec<&str> {
        socks
            .iter()
            .filter(|(_, p)| *p == port)
            .map(|(a, _)| a.as_str())
            .collect()
    };
    // 127.0.0.1 and 0.0.0.0 as /proc/net/tcp writes them.
    assert_eq!(on(mport), ["0100007F"], "{socks:?}");
    assert_eq!(on(srv.port), ["00000000"], "{socks:?}");
    let mut s = TcpStream::connect(("127.0.0.1", mport)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut b = String::new();
    s.read_to_string(&mut b).unwrap();
    assert!(b.starts_with("HTTP/1.0 200 OK"), "{b}");
}
