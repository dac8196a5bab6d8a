//! Protocol errors, with Redis's exact wording.

use thiserror::Error;

/// A request or reply the codec refuses.
///
/// For request errors the `Display` text is exactly what Redis puts after
/// `-ERR ` before closing the connection; [`ProtoError::to_reply`] builds that
/// reply.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtoError {
    /// The `*` count is not a valid integer or exceeds `max_multibulk_len`.
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    /// A `$` length is not a valid integer, is negative, or exceeds
    /// `max_bulk_len`.
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    /// An argument of a multibulk request did not start with `$`.
    #[error("Protocol error: expected '$', got '{}'", char::from(*.0))]
    ExpectedDollar(u8),
    /// An inline request has no newline within `max_inline_len` bytes.
    #[error("Protocol error: too big inline request")]
    TooBigInline,
    /// The `*` count line has no `\r` within `max_inline_len` bytes.
    #[error("Protocol error: too big mbulk count string")]
    TooBigMbulkCount,
    /// A `$` length line has no `\r` within `max_inline_len` bytes.
    #[error("Protocol error: too big bulk count string")]
    TooBigBulkCount,
    /// An inline request has an unterminated quote, or a closing quote not
    /// followed by a space.
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// The pending, incomplete request exceeds `max_query_buffer`. Redis closes
    /// such a client without a reply; the text is for logs.
    #[error("Closing client that reached max query buffer length")]
    QueryBufferLimit,
    /// A reply could not be parsed (reply parser only).
    #[error("Protocol error: {0}")]
    BadReply(&'static str),
}

impl ProtoError {
    /// The error reply Redis sends for this error: `-ERR <text>`.
    pub fn to_reply(&self) -> crate::Reply {
        crate::Reply::Error(format!("ERR {self}"))
    }
}
