//! The TCP transport between nodes (`repl::net`): what reaches a peer
//! that restarted, and what a node hears when a peer's process is gone.

use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use repl::net::{Net, Transport};
use repl::node::Event;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn msg(index: u64) -> Message {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgHeartbeat);
    m.from = 1;
    m.to = 2;
    m.index = index;
    m
}

/// Reads one frame (4-byte LE length, protobuf message) within `wait`.
fn read_frame(s: &mut TcpStream, wait: Duration) -> Option<Message> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut buf).ok()?;
    Message::parse_from_bytes(&buf).ok()
}

/// A peer that restarts (its process, its listener and its end of the
/// connection gone, then a new listener on the same port) gets the first
/// message sent after it: the sender sees the old connection closed before
/// writing into it. Before, that message went into the dead connection and
/// was lost (at an election: the vote request, which raft-rs resends only
/// after an election timeout).
#[test]
fn a_restarted_peer_gets_the_first_message_sent_after_its_restart() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, _rx) = std::sync::mpsc::channel::<Event>();
    let t = Transport::start(&[(2, addr.clone())], stop.clone(), tx);
    t.send(msg(1));
    let (mut c, _) = l.accept().unwrap();
    assert_eq!(read_frame(&mut c, Duration::from_secs(5)).unwrap().index, 1);
    // The peer restarts.
    drop(c);
    drop(l);
    let l = TcpListener::bind(&addr).unwrap();
    // Let the close reach the sender's socket.
    std::thread::sleep(Duration::from_millis(50));
    t.send(msg(2));
    l.set_nonblocking(true).unwrap();
    let t0 = Instant::now();
    let mut c = loop {
        match l.accept() {
            Ok((c, _)) => break c,
            Err(_) if t0.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("the sender never connected again: {e}"),
        }
    };
    c.set_nonblocking(false).unwrap();
    let m = read_frame(&mut c, Duration::from_secs(5)).expect("a message on the new connection");
    assert_eq!(m.index, 2, "the first message after the restart was lost");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// A probe reports a peer down when its address refuses connections, and
/// nothing while something listens there.
#[test]
fn a_probe_reports_a_peer_down_only_when_nothing_listens() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    let mut t = Transport::start(&[(2, addr)], stop.clone(), tx);
    t.probe(2);
    // Every attempt is accepted (by the kernel): no report.
    let quiet = repl::net::PROBE_GAP * repl::net::PROBE_ATTEMPTS + Duration::from_millis(300);
    assert!(rx.recv_timeout(quiet).is_err(), "a live peer reported down");
    drop(l);
    t.probe(2);
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Event::PeerDown(2)) => {}
        Ok(_) => panic!("another event"),
        Err(e) => panic!("no report of a peer whose port refuses: {e}"),
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
}
