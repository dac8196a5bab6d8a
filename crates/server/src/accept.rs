//! The acceptor thread: accepts connections on every listener, refuses
//! those over maxclients or outside protected mode, and hands the rest to
//! the workers (`worker`) round-robin. Also the listen backlog `server::run`
//! sets, and the cross-protocol attack check a worker makes on each command.

use crate::server::Shared;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};
use rustls::ServerConfig;
use std::io::{ErrorKind, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The acceptor's waker (its listeners are tokens 0..n).
pub(crate) const ACCEPT_WAKER: Token = Token(usize::MAX);
/// An accepted connection on its way from the acceptor to a worker, with
/// the TLS configuration of the port it came in on (None: plain TCP), and
/// whether that port is the memcached port.
pub(crate) type NewConn = (
    std::net::TcpStream,
    SocketAddr,
    Option<Arc<ServerConfig>>,
    bool,
);
/// A listening socket, its TLS configuration when it is the TLS port, and
/// whether it is the memcached port.
pub(crate) type Listener = (TcpListener, Option<Arc<ServerConfig>>, bool);

/// The acceptor: accepts, enforces maxclients and protected mode, and hands
/// connections to workers round-robin.
pub(crate) fn accept_loop(
    sh: Arc<Shared>,
    mut poll: Poll,
    mut listeners: Vec<Listener>,
    workers: Vec<(Sender<NewConn>, Arc<Waker>)>,
) {
    for (i, (l, _, _)) in listeners.iter_mut().enumerate() {
        if let Err(e) = poll.registry().register(l, Token(i), Interest::READABLE) {
            eprintln!("ember: acceptor: {e}");
            sh.begin_shutdown();
            return;
        }
    }
    let mut events = Events::with_capacity(64);
    let mut rr = 0usize;
    // After an accept error (EMFILE, ENFILE, ENOBUFS) the connections left in
    // the backlog raise no new edge: retry every listener shortly.
    let mut retry = false;
    let mut last_error_log: Option<Instant> = None;
    let mut todo: Vec<usize> = Vec::new();
    while !sh.shutdown.load(Ordering::Acquire) {
        let timeout = Duration::from_millis(if retry { 10 } else { 100 });
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != ErrorKind::Interrupted {
                eprintln!("ember: acceptor poll: {e}");
                break;
            }
        }
        todo.clear();
        if retry {
            todo.extend(0..listeners.len());
            retry = false;
        } else {
            todo.extend(
                events
                    .iter()
                    .map(|ev| ev.token().0)
                    .filter(|&i| i < listeners.len()),
            );
        }
        for &i in &todo {
            let (l, tls, mc) = &listeners[i];
            loop {
                match l.accept() {
                    Ok((s, peer)) => {
                        // mio hands out nonblocking sockets; go back to std to
                        // pass it across threads.
                        let s: std::net::TcpStream = {
                            use std::os::fd::{FromRawFd, IntoRawFd};
                            // SAFETY: `into_raw_fd` consumes the mio stream and
                            // gives up its ownership of the open, just accepted
                            // socket: the std stream is its only owner and
                            // closes it exactly once.
                            unsafe { std::net::TcpStream::from_raw_fd(s.into_raw_fd()) }
                        };
                        sh.stats.total_connections.fetch_add(1, Ordering::Relaxed);
                        let refusal = {
                            let c = sh.cfg();
                            admission(
                                sh.connected.load(Ordering::Acquire),
                                c.maxclients,
                                c.protected_mode,
                                !sh.acl.default_nopass(),
                                peer.ip(),
                            )
                        };
                        if let Some(msg) = refusal {
                            sh.stats.rejected.fetch_add(1, Ordering::Relaxed);
                            // On the TLS port the error would arrive as plain
                            // text inside a TLS stream: the connection is
                            // closed without it.
                            if tls.is_none() {
                                refuse(s, if *mc { memcached_refusal(msg) } else { msg });
                            }
                            continue;
                        }
                        sh.connected.fetch_add(1, Ordering::AcqRel);
                        let (tx, waker) = &workers[rr % workers.len()];
                        rr += 1;
                        if tx.send((s, peer, tls.clone(), *mc)).is_err() {
                            sh.connected.fetch_sub(1, Ordering::AcqRel);
                            continue;
                        }
                        let _ = waker.wake();
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        // EMFILE and friends: log (once a second at most),
                        // keep serving, retry soon.
                        if last_error_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                            eprintln!("ember: accept failed: {e}");
                            last_error_log = Some(Instant::now());
                        }
                        retry = true;
                        break;
                    }
                }
            }
        }
    }
    for (l, _, _) in &mut listeners {
        let _ = poll.registry().deregister(l);
    }
}

/// Whether `peer` is a loopback address (an IPv4 one mapped into IPv6
/// included).
pub(crate) fn is_loopback(peer: std::net::IpAddr) -> bool {
    match peer {
        std::net::IpAddr::V4(a) => a.is_loopback(),
        // An IPv4 client on a dual-stack socket (::ffff:127.0.0.1).
        std::net::IpAddr::V6(a) => {
            a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Whether a new connection is served: `None`, or the error it gets before
/// being closed (maxclients; protected mode: no password and not loopback).
fn admission(
    connected: u64,
    maxclients: u64,
    protected: bool,
    has_password: bool,
    peer: std::net::IpAddr,
) -> Option<&'static str> {
    if connected >= maxclients {
        return Some("-ERR max number of clients reached\r\n");
    }
    if protected && !has_password && !is_loopback(peer) {
        return Some(PROTECTED_MSG);
    }
    None
}

/// Redis's answer to a cross-protocol attack: an HTTP request sent to the
/// Redis port parses as the commands `POST` or `Host:`.
pub(crate) fn is_http_attack(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"post") || name.eq_ignore_ascii_case(b"host:")
}

/// mio listens with the standard library's backlog (128): a burst of
/// connects overflows it while the acceptor is descheduled, and each dropped
/// SYN costs that client a one-second retransmit. `listen` again with
/// `tcp-backlog` (Linux takes a new backlog on a listening socket).
pub(crate) fn set_backlog(l: &TcpListener, backlog: u32) {
    use std::os::fd::AsRawFd;
    let n = backlog.min(i32::MAX as u32) as i32;
    // SAFETY: listen(2) takes an fd and an integer, no memory; the fd is
    // `l`'s, open for the call since `l` is borrowed.
    if unsafe { libc::listen(l.as_raw_fd(), n) } != 0 {
        eprintln!(
            "ember: cannot set tcp-backlog {backlog}: {}",
            std::io::Error::last_os_error()
        );
    }
    if let Some(max) = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        if max < backlog {
            eprintln!("ember: tcp-backlog {backlog} cannot be enforced: /proc/sys/net/core/somaxconn is {max}");
        }
    }
}

const PROTECTED_MSG: &str = "-DENIED Ember is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers to Ember you may adopt one of the following solutions: 1) Disable protected mode with 'CONFIG SET protected-mode no' from the loopback interface. 2) Set a password with --requirepass or 'requirepass' in the configuration file. 3) Bind to the loopback interface only (the default).\r\n";

/// A refusal in memcached's words: its own text when too many clients are
/// connected, the protected-mode explanation as a `SERVER_ERROR`.
fn memcached_refusal(msg: &str) -> &'static str {
    if msg == PROTECTED_MSG {
        "SERVER_ERROR Ember is running in protected mode: memcached connections are accepted from the loopback interface only while no password is set for the default user\r\n"
    } else {
        "ERROR Too many open connections\r\n"
    }
}

fn refuse(mut s: std::net::TcpStream, msg: &str) {
    let _ = s.set_nonblocking(true);
    let _ = s.write(msg.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn admission_maxclients_and_protected_mode() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: IpAddr = "::1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let far: IpAddr = "10.1.2.3".parse().unwrap();
        let far6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(admission(0, 10, true, false, lo), None);
        assert_eq!(admission(9, 10, true, false, lo6), None);
        assert_eq!(admission(9, 10, true, false, mapped), None);
        assert_eq!(
            admission(10, 10, true, false, lo),
            Some("-ERR max number of clients reached\r\n")
        );
        // Protected mode: remote peers only with a password or mode off.
        assert_eq!(admission(0, 10, true, false, far), Some(PROTECTED_MSG));
        assert_eq!(admission(0, 10, true, false, far6), Some(PROTECTED_MSG));
        assert_eq!(admission(0, 10, true, true, far), None);
        assert_eq!(admission(0, 10, false, false, far), None);
        // maxclients first, as Redis checks it first.
        assert_eq!(
            admission(10, 10, true, false, far),
            Some("-ERR max number of clients reached\r\n")
        );
        assert!(PROTECTED_MSG.starts_with("-DENIED ") && PROTECTED_MSG.ends_with("\r\n"));
        assert!(!PROTECTED_MSG[..PROTECTED_MSG.len() - 2].contains(['\r', '\n']));
    }

    #[test]
    fn http_requests_are_attacks() {
        assert!(is_http_attack(b"POST"));
        assert!(is_http_attack(b"Host:"));
        assert!(!is_http_attack(b"GET"));
        assert!(!is_http_attack(b"host"));
    }
}
