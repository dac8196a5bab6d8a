//! The `memcache` target: proto's memcached codec ([`McCodec`]), fed in
//! reads of sizes the input chooses.
//!
//! The input's first byte picks the item limit (memcached's 1 MiB, or 64
//! bytes so that data blocks are swallowed), the next four bytes the sizes
//! of the reads, cycled; the rest is what the client sends. Checked:
//!
//! - [`McCodec::decode`] returns, and what it consumes or skips is at least
//!   one byte and at most the buffer;
//! - unless a connection-closing frame comes first, the requests decoded
//!   read by read are those decoded from the whole input at once (the
//!   framing does not depend on how the bytes arrive), and every key a
//!   request carries is at most 250 bytes except `get`'s (which the server
//!   refuses).

use proto::memcache::{McCmd, McCodec, McFrame, McRequest, KEY_MAX};

/// The `memcache` target (see the module documentation).
pub fn memcache(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (reads, stream) = rest.split_at(rest.len().min(4));
    let item_max = if mode & 1 == 0 { 1 << 20 } else { 64 };
    let sizes: Vec<usize> = reads.iter().map(|&b| usize::from(b) + 1).collect();
    let whole = decode_all(stream, &[stream.len().max(1)], item_max);
    let pieces = decode_all(
        stream,
        if sizes.is_empty() { &[1] } else { &sizes },
        item_max,
    );
    if let (Some(a), Some(b)) = (whole, pieces) {
        assert_eq!(
            a, b,
            "read-by-read decode differs from the one-piece decode"
        );
    }
}

/// Decodes `stream` arriving in reads of `sizes` (cycled); the requests,
/// or None when a frame closed the connection.
fn decode_all(stream: &[u8], sizes: &[usize], item_max: usize) -> Option<Vec<McRequest>> {
    let mut codec = McCodec::default();
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0;
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        match codec.decode(&buf, item_max) {
            McFrame::Incomplete => {
                if fed == stream.len() {
                    return Some(out);
                }
                let n = sizes[i % sizes.len()].min(stream.len() - fed);
                i += 1;
                buf.extend_from_slice(&stream[fed..fed + n]);
                fed += n;
            }
            McFrame::Skip(n) => {
                assert!(n >= 1 && n <= buf.len());
                buf.drain(..n);
            }
            McFrame::Request { consumed, req } => {
                assert!(consumed >= 1 && consumed <= buf.len());
                check(&req);
                buf.drain(..consumed);
                out.push(req);
            }
            McFrame::Close { .. } => return None,
        }
    }
}

fn check(req: &McRequest) {
    let key = match &req.cmd {
        McCmd::Store { key, .. }
        | McCmd::Delete { key }
        | McCmd::Arith { key, .. }
        | McCmd::Touch { key, .. }
        | McCmd::MetaGet { key, .. }
        | McCmd::MetaSet { key, .. }
        | McCmd::MetaDelete { key, .. }
        | McCmd::MetaArith { key, .. }
        | McCmd::MetaDebug { key, .. } => key,
        _ => return,
    };
    assert!(key.len() <= KEY_MAX, "a key of {} bytes", key.len());
}
