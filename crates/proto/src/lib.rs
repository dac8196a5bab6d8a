//! Ember's Redis protocol codec (RESP2 and RESP3), with no storage dependency.
//!
//! - [`parse_request`] ([`parse`]): the server side. It reads one client request
//!   from the front of a byte buffer that may hold nothing, part of a request,
//!   one request, or several pipelined requests. Both request forms are
//!   accepted: multibulk (`*N\r\n$len\r\narg\r\n...`) and inline (a line of
//!   space-separated words with Redis's `sdssplitargs` quoting: `"..."` with
//!   `\n \r \t \b \a \\ \" \xHH` escapes, `'...'` with only `\'`). The parser
//!   is stateless: on [`Parsed::Incomplete`] keep the bytes and call again when
//!   more arrive; on [`Parsed::Complete`] drop `consumed` bytes.
//! - [`Reply`] ([`reply`]): every RESP2/RESP3 reply type, encoded for the
//!   connection's [`Version`]. RESP3-only types degrade as Redis degrades them
//!   on a RESP2 connection (maps flatten to arrays, doubles become bulk strings,
//!   booleans become integers, ...).
//! - [`parse_reply`]: the client side, for tests and a future client.
//! - [`memcache`]: memcached's text and meta protocol, the second codec
//!   ([`memcache::McCodec`]: command lines and data blocks into typed requests).
//!
//! # Limits
//!
//! [`Limits`] mirrors Redis's knobs, with Redis's defaults:
//!
//! | field | Redis | default | when exceeded |
//! |---|---|---|---|
//! | `max_bulk_len` | `proto-max-bulk-len` | 512 MiB | `Protocol error: invalid bulk length` |
//! | `max_multibulk_len` | `INT_MAX` check | `i32::MAX` | `Protocol error: invalid multibulk length` |
//! | `max_inline_len` | `PROTO_INLINE_MAX_SIZE` | 64 KiB | `too big inline request` / `too big mbulk count string` / `too big bulk count string` |
//! | `max_query_buffer` | `client-query-buffer-limit` | 1 GiB | [`ProtoError::QueryBufferLimit`] (Redis closes the client silently) |
//!
//! The inline limit applies to bytes pending *without* a terminator: a line
//! with no `\n` (inline) or a `*`/`$` header with no `\r` longer than the
//! limit is refused. Lengths announced by the client are never trusted for
//! allocation: arguments are copied out only once the whole request is in the
//! buffer, so `$536870912\r\n` followed by nothing costs nothing.
//!
//! Every [`ProtoError`] from the request parser displays as Redis's text;
//! the server replies [`ProtoError::to_reply`] (`-ERR Protocol error: ...`)
//! and closes the connection. As in Redis, the two bytes after a bulk payload
//! are skipped without checking that they are `\r\n`.
//!
//! # Example
//!
//! ```
//! use proto::{parse_request, Limits, Parsed, Reply, Version};
//!
//! let buf = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n";
//! let Parsed::Complete { args, consumed } = parse_request(buf, &Limits::default()) else {
//!     panic!()
//! };
//! assert_eq!(args, [b"GET".to_vec(), b"k".to_vec()]);
//! assert!(matches!(
//!     parse_request(&buf[consumed..], &Limits::default()),
//!     Parsed::Complete { consumed: 6, .. }
//! ));
//!
//! let mut out = Vec::new();
//! Reply::Double(1.5).encode(Version::Resp3, &mut out);
//! assert_eq!(out, b",1.5\r\n");
//! ```

#![forbid(unsafe_code)]

pub mod codec;
pub mod error;
pub mod int;
pub mod memcache;
pub mod parse;
pub mod reply;

pub use codec::{Codec, RespCodec};
pub use error::ProtoError;
pub use parse::{
    encode_request, parse_request, parse_request_into, peek_request_args, peek_requests,
    split_args, Args, Limits, Parsed,
};
pub use reply::{d2string, format_double, parse_reply, Reply, Version};
