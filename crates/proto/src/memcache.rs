//! memcached's text protocol (and its meta commands), the second codec beside
//! RESP: frames a connection's input into typed requests, with memcached
//! 1.6's tokenizing, number parsing and error texts. It knows nothing about
//! storage: what a request does is the server's business.
//!
//! A request is a command line (`\n`-terminated, a `\r` before it dropped,
//! tokens separated by single spaces as memcached's `tokenize_command` splits
//! them) and, for the storage commands, a data block of the announced length
//! followed by `\r\n`. [`McCodec::decode`] returns one [`McFrame`] at a time:
//! a request, bytes to drop (a data block too large to buffer, swallowed as
//! memcached swallows it), a need for more input, or a reason to close.
//!
//! Errors memcached detects while parsing are requests too
//! ([`McCmd::Error`]): the server replies their text (unless `noreply` hid
//! it) and goes on with the next line, as memcached does.

use base64::Engine as _;

/// memcached's `KEY_MAX_LENGTH`.
pub const KEY_MAX: usize = 250;
/// memcached's `MAX_TOKENS`: a line is split into at most 23 tokens plus the
/// rest (which only `get` and friends read on).
const MAX_TOKENS: usize = 24;
/// memcached's `MFLAG_MAX_OPT_LENGTH`: a meta command has at most this many
/// tokens (counting the terminal one).
const MFLAG_MAX_OPT: usize = 20;
/// memcached's `MFLAG_MAX_OPAQUE_LENGTH`.
const MAX_OPAQUE: usize = 32;
/// Bytes without a `\n` after which memcached closes a connection whose line
/// is not a `get`/`gets` (a multiget may be longer).
const MAX_LINE: usize = 2048;

pub const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
pub const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk";
pub const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";
pub const OUT_OF_MEMORY: &str = "SERVER_ERROR out of memory storing object";

/// How a storage command stores (memcached's `NREAD_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// A storage command's data block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    /// The value (without its `\r\n`).
    Bytes(Vec<u8>),
    /// The block did not end with `\r\n` (`CLIENT_ERROR bad data chunk`).
    BadChunk,
    /// Larger than the codec buffers; its bytes are being swallowed. The
    /// server answers `SERVER_ERROR object too large for cache`.
    TooLarge,
}

/// The flags of a meta command, as `_meta_flag_preparse` reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaFlags {
    /// The flag tokens in request order (what the reply echoes follows it).
    pub tokens: Vec<Vec<u8>>,
    /// `b`: the key was sent in base64 (and is decoded in `key`).
    pub base64: bool,
    /// `q`: quiet mode.
    pub quiet: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `T`: a new TTL (memcached exptime, not yet converted).
    pub ttl: Option<i32>,
    /// `N`: vivify on miss with this exptime.
    pub vivify: Option<i32>,
    /// `R`: recache when the TTL left is below this exptime.
    pub recache: Option<i32>,
    /// `F`: client flags (ms).
    pub client_flags: u32,
    /// `C`: compare CAS.
    pub cas: Option<u64>,
    /// `M`: mode switch (ms, ma).
    pub mode: Option<u8>,
    /// `J`: initial value (ma).
    pub initial: u64,
    /// `D`: delta (ma).
    pub delta: u64,
    /// `I`: invalidate / set stale.
    pub invalidate: bool,
    /// `u`: no LRU bump.
    pub no_update: bool,
}

/// The longest `O` token memcached echoes; mg and ma find a longer one
/// while they build their reply (after fetching, touching, incrementing),
/// and answer `CLIENT_ERROR opaque token too long` then.
pub const MAX_OPAQUE_LEN: usize = MAX_OPAQUE;

impl MetaFlags {
    /// Whether a flag token starting with `c` was given.
    pub fn has(&self, c: u8) -> bool {
        self.tokens.iter().any(|t| t.first() == Some(&c))
    }
}

/// A parsed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum McCmd {
    /// get/gets/gat/gats (`touch`: the exptime of gat/gats). A key longer
    /// than [`KEY_MAX`] makes the reply `CLIENT_ERROR bad command line
    /// format` once the keys before it were fetched (as memcached does).
    Get {
        keys: Vec<Vec<u8>>,
        cas: bool,
        touch: Option<i32>,
    },
    Store {
        mode: StoreMode,
        key: Vec<u8>,
        flags: u32,
        exptime: i32,
        cas: u64,
        data: Data,
    },
    Delete {
        key: Vec<u8>,
    },
    Arith {
        incr: bool,
        key: Vec<u8>,
        delta: u64,
    },
    Touch {
        key: Vec<u8>,
        exptime: i32,
    },
    /// flush_all [delay]: `delay` 0 or negative is now.
    FlushAll {
        delay: i32,
    },
    Version,
    Verbosity,
    /// stats [subcommand ...]: the tokens after `stats`.
    Stats {
        args: Vec<Vec<u8>>,
    },
    Quit,
    /// mn.
    MetaNoop,
    /// mg.
    MetaGet {
        key: Vec<u8>,
        flags: MetaFlags,
    },
    /// ms (`data` read whatever the flags say, as memcached swallows it).
    MetaSet {
        key: Vec<u8>,
        flags: MetaFlags,
        data: Data,
    },
    /// md.
    MetaDelete {
        key: Vec<u8>,
        flags: MetaFlags,
    },
    /// ma.
    MetaArith {
        key: Vec<u8>,
        flags: MetaFlags,
    },
    /// me (`binary`: the key was base64).
    MetaDebug {
        key: Vec<u8>,
        binary: bool,
    },
    /// A reply decided while parsing (an error, or `ERROR` for an unknown
    /// command); `noreply` hides it.
    Error(&'static str),
}

/// A request with the `noreply` state memcached gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McRequest {
    pub cmd: McCmd,
    /// `noreply` (text commands) or `q` (meta: the server decides which
    /// replies it hides).
    pub noreply: bool,
}

/// One step of [`McCodec::decode`].
#[derive(Debug, PartialEq, Eq)]
pub enum McFrame {
    /// More input is needed (keep the bytes).
    Incomplete,
    /// Drop this many bytes (a swallowed data block) and call again.
    Skip(usize),
    /// A request; drop `consumed` bytes.
    Request { consumed: usize, req: McRequest },
    /// Close the connection after writing `reply` (may be empty): a line
    /// too long, an HTTP request, the binary protocol.
    Close { reply: &'static str },
}

/// A memcached connection's framing state.
#[derive(Debug, Default)]
pub struct McCodec {
    /// Bytes of a too-large data block still to drop.
    swallow: usize,
    /// The first byte has been seen (the binary protocol is recognised by the
    /// first byte of a connection only, as memcached negotiates it).
    negotiated: bool,
}

impl McCodec {
    /// Frames the request at the front of `buf`. `item_max` is the largest
    /// data block buffered (larger ones are swallowed and reported
    /// [`Data::TooLarge`]).
    pub fn decode(&mut self, buf: &[u8], item_max: usize) -> McFrame {
        if self.swallow > 0 {
            if buf.is_empty() {
                return McFrame::Incomplete;
            }
            let n = self.swallow.min(buf.len());
            self.swallow -= n;
            return McFrame::Skip(n);
        }
        if buf.is_empty() {
            return McFrame::Incomplete;
        }
        if !self.negotiated {
            self.negotiated = true;
            if buf[0] == 0x80 {
                return McFrame::Close {
                    reply: "SERVER_ERROR the binary protocol is not supported (it is deprecated); use the text or meta protocol\r\n",
                };
            }
        }
        let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
            if buf.len() > MAX_LINE {
                let start = buf.iter().take_while(|&&b| b == b' ').count();
                let rest = &buf[start..];
                if start > 100 || !(rest.starts_with(b"get ") || rest.starts_with(b"gets ")) {
                    return McFrame::Close { reply: "" };
                }
            }
            return McFrame::Incomplete;
        };
        let mut line = &buf[..nl];
        if line.len() > 1 && line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        // C strings: a NUL ends the line.
        if let Some(z) = line.iter().position(|&b| b == 0) {
            line = &line[..z];
        }
        let after = nl + 1;
        let toks: Vec<&[u8]> = line
            .split(|&b| b == b' ')
            .filter(|t| !t.is_empty())
            .collect();
        let (cmd, noreply, data_len) = parse_line(&toks);
        let Some(vlen) = data_len else {
            return McFrame::Request {
                consumed: after,
                req: McRequest { cmd, noreply },
            };
        };
        let total = vlen + 2;
        if total > item_max.saturating_add(4096) {
            // Swallowed as it arrives, never buffered.
            let here = (buf.len() - after).min(total);
            self.swallow = total - here;
            return McFrame::Request {
                consumed: after + here,
                req: McRequest {
                    cmd: with_data(cmd, Data::TooLarge),
                    noreply,
                },
            };
        }
        if buf.len() < after + total {
            return McFrame::Incomplete;
        }
        let block = &buf[after..after + total];
        let data = if &block[vlen..] == b"\r\n" {
            Data::Bytes(block[..vlen].to_vec())
        } else {
            Data::BadChunk
        };
        McFrame::Request {
            consumed: after + total,
            req: McRequest {
                cmd: with_data(cmd, data),
                noreply,
            },
        }
    }

    /// Forgets a request in progress (the input was dropped).
    pub fn reset(&mut self) {
        self.swallow = 0;
    }
}

fn with_data(cmd: McCmd, d: Data) -> McCmd {
    match cmd {
        McCmd::Store {
            mode,
            key,
            flags,
            exptime,
            cas,
            ..
        } => McCmd::Store {
            mode,
            key,
            flags,
            exptime,
            cas,
            data: d,
        },
        McCmd::MetaSet { key, flags, .. } => McCmd::MetaSet {
            key,
            flags,
            data: d,
        },
        // An error decided on the line still swallows the block (ms).
        other => other,
    }
}

fn err(s: &'static str) -> McCmd {
    McCmd::Error(s)
}

/// Parses one command line: the request, its noreply state, and the length
/// of the data block that follows it (memcached reads, or swallows, a block
/// exactly when this is `Some`).
fn parse_line(toks: &[&[u8]]) -> (McCmd, bool, Option<usize>) {
    // memcached's ntokens: at most 23 tokens, plus the terminal one.
    let ntokens = toks.len().min(MAX_TOKENS - 1) + 1;
    if ntokens < 2 || toks[0].len() < 2 {
        return (err("ERROR"), false, None);
    }
    let name = toks[0];
    if name.len() == 2 && name[0] == b'm' {
        return match name[1] {
            b'g' => meta_get(toks, ntokens),
            b's' => meta_set(toks, ntokens),
            b'd' => meta_delete(toks, ntokens, false),
            b'a' => meta_delete(toks, ntokens, true),
            b'n' => (McCmd::MetaNoop, false, None),
            b'e' => meta_debug(toks, ntokens),
            _ => (err("ERROR"), false, None),
        };
    }
    let noreply_tok = || ntokens >= 3 && toks.get(ntokens - 2) == Some(&&b"noreply"[..]);
    let (cmd, nr): (McCmd, bool) = match name {
        b"get" | b"gets" | b"gat" | b"gats" | b"bget" => {
            if ntokens < 3 {
                return (err("ERROR"), false, None);
            }
            let cas = name == b"gets" || name == b"gats";
            let (touch, keys) = if name.starts_with(b"gat") {
                match safe_strtol(toks[1]) {
                    Some(t) => (Some(t), &toks[2..]),
                    None => return (err("CLIENT_ERROR invalid exptime argument"), false, None),
                }
            } else {
                (None, &toks[1..])
            };
            // A key longer than KEY_MAX is the server's to refuse: memcached
            // fetches the keys before it first.
            let keys = keys.iter().map(|k| k.to_vec()).collect();
            (McCmd::Get { keys, cas, touch }, false)
        }
        b"set" | b"add" | b"append" | b"replace" | b"prepend" | b"cas" => {
            let (mode, want) = match name {
                b"set" => (StoreMode::Set, 6),
                b"add" => (StoreMode::Add, 6),
                b"append" => (StoreMode::Append, 6),
                b"replace" => (StoreMode::Replace, 6),
                b"prepend" => (StoreMode::Prepend, 6),
                _ => (StoreMode::Cas, 7),
            };
            if ntokens != want && ntokens != want + 1 {
                return (err("ERROR"), false, None);
            }
            let nr = noreply_tok();
            if toks[1].len() > KEY_MAX {
                return (err(BAD_FORMAT), nr, None);
            }
            let (Some(flags), Some(exptime), Some(vlen)) = (
                safe_strtoul(toks[2]),
                safe_strtol(toks[3]),
                safe_strtol(toks[4]),
            ) else {
                return (err(BAD_FORMAT), nr, None);
            };
            let mut cas = 0;
            if mode == StoreMode::Cas {
                match safe_strtoull(toks[5]) {
                    Some(c) => cas = c,
                    None => return (err(BAD_FORMAT), nr, None),
                }
            }
            if !(0..=i32::MAX - 2).contains(&vlen) {
                return (err(BAD_FORMAT), nr, None);
            }
            let cmd = McCmd::Store {
                mode,
                key: toks[1].to_vec(),
                flags,
                exptime,
                cas,
                data: Data::BadChunk,
            };
            return (cmd, nr, Some(vlen as usize));
        }
        b"incr" | b"decr" => {
            if ntokens != 4 && ntokens != 5 {
                return (err("ERROR"), false, None);
            }
            let nr = noreply_tok();
            if toks[1].len() > KEY_MAX {
                return (err(BAD_FORMAT), nr, None);
            }
            match safe_strtoull(toks[2]) {
                Some(delta) => (
                    McCmd::Arith {
                        incr: name == b"incr",
                        key: toks[1].to_vec(),
                        delta,
                    },
                    nr,
                ),
                None => (err("CLIENT_ERROR invalid numeric delta argument"), nr),
            }
        }
        b"delete" => {
            if !(3..=5).contains(&ntokens) {
                return (err("ERROR"), false, None);
            }
            let mut nr = false;
            if ntokens > 3 {
                let hold_zero = toks[2] == b"0";
                nr = noreply_tok();
                let valid =
                    (ntokens == 4 && (hold_zero || nr)) || (ntokens == 5 && hold_zero && nr);
                if !valid {
                    return (
                        err("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"),
                        nr,
                        None,
                    );
                }
            }
            if toks[1].len() > KEY_MAX {
                return (err(BAD_FORMAT), nr, None);
            }
            (
                McCmd::Delete {
                    key: toks[1].to_vec(),
                },
                nr,
            )
        }
        b"touch" => {
            if ntokens != 4 && ntokens != 5 {
                return (err("ERROR"), false, None);
            }
            let nr = noreply_tok();
            if toks[1].len() > KEY_MAX {
                return (err(BAD_FORMAT), nr, None);
            }
            match safe_strtol(toks[2]) {
                Some(exptime) => (
                    McCmd::Touch {
                        key: toks[1].to_vec(),
                        exptime,
                    },
                    nr,
                ),
                None => (err("CLIENT_ERROR invalid exptime argument"), nr),
            }
        }
        b"flush_all" => {
            if !(2..=4).contains(&ntokens) {
                return (err("ERROR"), false, None);
            }
            let nr = noreply_tok();
            let mut delay = 0;
            if ntokens != if nr { 3 } else { 2 } {
                match safe_strtol(toks[1]) {
                    Some(d) => delay = d,
                    None => return (err("CLIENT_ERROR invalid exptime argument"), nr, None),
                }
            }
            (McCmd::FlushAll { delay }, nr)
        }
        b"version" => (McCmd::Version, false),
        b"quit" => (McCmd::Quit, false),
        b"verbosity" => {
            if ntokens != 3 && ntokens != 4 {
                return (err("ERROR"), false, None);
            }
            let nr = noreply_tok();
            match safe_strtoul(toks[1]) {
                Some(_) => (McCmd::Verbosity, nr),
                None => (err(BAD_FORMAT), nr),
            }
        }
        b"stats" => (
            McCmd::Stats {
                args: toks[1..ntokens - 1].iter().map(|t| t.to_vec()).collect(),
            },
            false,
        ),
        _ => {
            if toks[ntokens - 2].starts_with(b"HTTP/") {
                return (McCmd::Quit, false, None);
            }
            (err("ERROR"), false)
        }
    };
    (cmd, nr, None)
}

/// Decodes a base64 key as memcached's `base64_decode` accepts it (the
/// standard alphabet); None when it does not decode to at least one byte.
fn decode_key(k: &[u8]) -> Option<Vec<u8>> {
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    engine.decode(k).ok().filter(|d| !d.is_empty())
}

/// Encodes a key for a reply (`k` flag of a base64 key).
pub fn encode_key(k: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(k)
}

/// `_meta_flag_preparse`: reads the flag tokens; the error text when one is
/// wrong (None: the caller's default). Decodes a base64 key in `key`.
fn preparse(flags: &[&[u8]], key: &mut Vec<u8>) -> Result<MetaFlags, Option<&'static str>> {
    let mut f = MetaFlags::default();
    let mut seen = [false; 128];
    let mut error: Option<Option<&'static str>> = None;
    let bad_token = Some("CLIENT_ERROR bad token in command line format");
    for t in flags {
        let o = t[0];
        if o >= 127 || seen[o as usize] {
            return Err(Some("CLIENT_ERROR duplicate flag"));
        }
        seen[o as usize] = true;
        let arg = &t[1..];
        match o {
            b'b' => {
                match decode_key(key) {
                    Some(k) => *key = k,
                    None => {
                        key.clear();
                        error = Some(Some("CLIENT_ERROR error decoding key"));
                    }
                }
                f.base64 = true;
            }
            b'N' => match safe_strtol(arg) {
                Some(v) => f.vivify = Some(v),
                None => error = Some(bad_token),
            },
            b'T' => match safe_strtol(arg) {
                Some(v) => f.ttl = Some(v),
                None => error = Some(bad_token),
            },
            b'R' => match safe_strtol(arg) {
                Some(v) => f.recache = Some(v),
                None => error = Some(bad_token),
            },
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' => {}
            b'v' => f.value = true,
            b'u' => f.no_update = true,
            b'q' => f.quiet = true,
            b'F' => match safe_strtoul(arg) {
                Some(v) => f.client_flags = v,
                None => error = Some(error.flatten()),
            },
            b'C' => match safe_strtoull(arg) {
                Some(v) => f.cas = Some(v),
                None => error = Some(bad_token),
            },
            b'M' => {
                if t.len() != 2 {
                    error = Some(Some("CLIENT_ERROR incorrect length for M token"));
                } else {
                    f.mode = Some(t[1]);
                }
            }
            b'J' => match safe_strtoull(arg) {
                Some(v) => f.initial = v,
                None => error = Some(Some("CLIENT_ERROR invalid numeric initial value")),
            },
            b'D' => match safe_strtoull(arg) {
                Some(v) => f.delta = v,
                None => error = Some(Some("CLIENT_ERROR invalid numeric delta value")),
            },
            b'I' => f.invalidate = true,
            _ => return Err(Some("CLIENT_ERROR invalid flag")),
        }
    }
    if let Some(e) = error {
        return Err(e);
    }
    f.tokens = flags.iter().map(|t| t.to_vec()).collect();
    Ok(f)
}

/// Whether an `O` token is longer than memcached echoes.
fn opaque_too_long(flags: &[&[u8]]) -> bool {
    flags.iter().any(|t| t[0] == b'O' && t.len() > MAX_OPAQUE)
}

fn meta_get(toks: &[&[u8]], ntokens: usize) -> (McCmd, bool, Option<usize>) {
    if ntokens < 3 {
        return (err("ERROR"), false, None);
    }
    if toks[1].len() > KEY_MAX {
        return (err(BAD_FORMAT), false, None);
    }
    if ntokens > MFLAG_MAX_OPT {
        return (err("CLIENT_ERROR options flags are too long"), false, None);
    }
    let mut key = toks[1].to_vec();
    let flag_toks = &toks[2..ntokens - 1];
    let flags = match preparse(flag_toks, &mut key) {
        Ok(f) => f,
        Err(e) => return (err(e.unwrap_or(BAD_FORMAT)), false, None),
    };
    let q = flags.quiet;
    (McCmd::MetaGet { key, flags }, q, None)
}

fn meta_set(toks: &[&[u8]], ntokens: usize) -> (McCmd, bool, Option<usize>) {
    if ntokens < 3 {
        return (err("ERROR"), false, None);
    }
    if toks[1].len() > KEY_MAX || ntokens == 3 {
        return (err(BAD_FORMAT), false, None);
    }
    if ntokens > MFLAG_MAX_OPT {
        return (err("CLIENT_ERROR options flags too long"), false, None);
    }
    let vlen = match safe_strtol(toks[2]) {
        Some(v) if (0..=i32::MAX - 2).contains(&v) => v as usize,
        _ => return (err(BAD_FORMAT), false, None),
    };
    // From here on the data block is swallowed whatever goes wrong.
    let mut key = toks[1].to_vec();
    let flag_toks = &toks[3..ntokens - 1];
    let flags = match preparse(flag_toks, &mut key) {
        Ok(f) => f,
        Err(e) => return (err(e.unwrap_or(BAD_FORMAT)), false, Some(vlen)),
    };
    let q = flags.quiet;
    if opaque_too_long(flag_toks) {
        return (err("CLIENT_ERROR opaque token too long"), false, Some(vlen));
    }
    if !matches!(flags.mode, None | Some(b'E' | b'A' | b'P' | b'R' | b'S')) {
        return (
            err("CLIENT_ERROR invalid mode for ms M token"),
            false,
            Some(vlen),
        );
    }
    (
        McCmd::MetaSet {
            key,
            flags,
            data: Data::BadChunk,
        },
        q,
        Some(vlen),
    )
}

/// md and ma (`arith`), which parse alike.
fn meta_delete(toks: &[&[u8]], ntokens: usize, arith: bool) -> (McCmd, bool, Option<usize>) {
    if ntokens < 3 {
        return (err("ERROR"), false, None);
    }
    if toks[1].len() > KEY_MAX {
        return (err(BAD_FORMAT), false, None);
    }
    if ntokens > MFLAG_MAX_OPT {
        return (err("CLIENT_ERROR options flags too long"), false, None);
    }
    let mut key = toks[1].to_vec();
    let flag_toks = &toks[2..ntokens - 1];
    let Ok(flags) = preparse(flag_toks, &mut key) else {
        return (err("CLIENT_ERROR invalid or duplicate flag"), false, None);
    };
    let q = flags.quiet;
    if arith && !matches!(flags.mode, None | Some(b'I' | b'+' | b'D' | b'-')) {
        return (err("CLIENT_ERROR invalid mode for ma M token"), false, None);
    }
    if !arith && opaque_too_long(flag_toks) {
        return (err("CLIENT_ERROR opaque token too long"), false, None);
    }
    if arith {
        (McCmd::MetaArith { key, flags }, q, None)
    } else {
        (McCmd::MetaDelete { key, flags }, q, None)
    }
}

fn meta_debug(toks: &[&[u8]], ntokens: usize) -> (McCmd, bool, Option<usize>) {
    if ntokens < 3 || toks[1].len() > KEY_MAX {
        return (err(BAD_FORMAT), false, None);
    }
    if ntokens >= 4 && toks[2] == b"b" {
        return match decode_key(toks[1]) {
            Some(key) => (McCmd::MetaDebug { key, binary: true }, false, None),
            None => (err(BAD_FORMAT), false, None),
        };
    }
    (
        McCmd::MetaDebug {
            key: toks[1].to_vec(),
            binary: false,
        },
        false,
        None,
    )
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// C's `strtoull`/`strtol` on a token: leading white space, a sign, decimal
/// digits. Returns (negative, magnitude or None on overflow past u64, end).
fn c_digits(s: &[u8]) -> Option<(bool, Option<u64>, usize)> {
    let mut i = s.iter().take_while(|&&b| is_c_space(b)).count();
    let mut neg = false;
    if let Some(&c) = s.get(i) {
        if c == b'+' || c == b'-' {
            neg = c == b'-';
            i += 1;
        }
    }
    let start = i;
    let mut v: Option<u64> = Some(0);
    while let Some(&c) = s.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        v = v
            .and_then(|v| v.checked_mul(10))
            .and_then(|v| v.checked_add(u64::from(c - b'0')));
        i += 1;
    }
    if i == start {
        return None;
    }
    // The rest must be white space or the end (`xisspace(*endptr)`).
    if i < s.len() && !is_c_space(s[i]) {
        return None;
    }
    Some((neg, v, i))
}

/// memcached's `safe_strtoull`.
pub fn safe_strtoull(s: &[u8]) -> Option<u64> {
    let (neg, v, _) = c_digits(s)?;
    let v = v?;
    let ull = if neg { v.wrapping_neg() } else { v };
    if (ull as i64) < 0 && s.contains(&b'-') {
        return None;
    }
    Some(ull)
}

/// memcached's `safe_strtoul` (an unsigned long, stored in 32 bits).
pub fn safe_strtoul(s: &[u8]) -> Option<u32> {
    safe_strtoull(s).map(|v| v as u32)
}

/// memcached's `safe_strtol` (a long, stored in 32 bits).
pub fn safe_strtol(s: &[u8]) -> Option<i32> {
    let (neg, v, _) = c_digits(s)?;
    let v = v?;
    let l: i64 = if neg {
        if v > 1u64 << 63 {
            return None;
        }
        (v as i128).wrapping_neg() as i64
    } else {
        i64::try_from(v).ok()?
    };
    Some(l as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(buf: &[u8]) -> (McCmd, bool, usize) {
        match McCodec::default().decode(buf, 1 << 20) {
            McFrame::Request { consumed, req } => (req.cmd, req.noreply, consumed),
            f => panic!("{f:?}"),
        }
    }

    #[test]
    fn numbers_parse_as_memcached_does() {
        assert_eq!(safe_strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(safe_strtoull(b"18446744073709551616"), None);
        assert_eq!(safe_strtoull(b"-1"), None);
        assert_eq!(safe_strtoull(b"-0"), Some(0));
        assert_eq!(safe_strtoull(b"+5"), Some(5));
        assert_eq!(safe_strtoull(b"5x"), None);
        assert_eq!(safe_strtoull(b""), None);
        assert_eq!(safe_strtol(b"-1"), Some(-1));
        assert_eq!(safe_strtol(b"4294967296"), Some(0));
        assert_eq!(safe_strtoul(b"4294967297"), Some(1));
        assert_eq!(safe_strtol(b"99999999999999999999"), None);
    }

    #[test]
    fn storage_commands_frame_their_data() {
        let (c, nr, n) = one(b"set k 5 0 3 noreply\r\nabc\r\nget k\r\n");
        assert!(nr);
        assert_eq!(n, 26);
        assert!(
            matches!(c, McCmd::Store { flags: 5, data: Data::Bytes(ref d), .. } if d == b"abc")
        );
        let (c, _, n) = one(b"set k 0 0 3\r\nabcde\r\n");
        assert_eq!((c.clone(), n), (with_data(c, Data::BadChunk), 18));
        assert_eq!(
            McCodec::default().decode(b"set k 0 0 3\r\nab", 1 << 20),
            McFrame::Incomplete
        );
        let (c, _, n) = one(b"set k x 0 3\r\nabc\r\n");
        assert_eq!((c, n), (McCmd::Error(BAD_FORMAT), 13));
    }

    #[test]
    fn too_large_blocks_are_swallowed() {
        let mut c = McCodec::default();
        let f = c.decode(b"set k 0 0 100000\r\nxx", 1000);
        assert!(matches!(f, McFrame::Request { consumed: 20, .. }));
        assert_eq!(c.decode(&[b'x'; 99_998], 1000), McFrame::Skip(99_998));
        assert_eq!(c.decode(b"\r\nget k\r\n", 1000), McFrame::Skip(2));
        assert!(matches!(
            c.decode(b"get k\r\n", 1000),
            McFrame::Request { .. }
        ));
    }

    #[test]
    fn errors_and_meta() {
        assert_eq!(one(b"\r\n").0, McCmd::Error("ERROR"));
        assert_eq!(one(b"bogus\r\n").0, McCmd::Error("ERROR"));
        assert_eq!(one(b"get\r\n").0, McCmd::Error("ERROR"));
        let (c, q, _) = one(b"mg Zm9v b v q k O123\r\n");
        assert!(q);
        match c {
            McCmd::MetaGet { key, flags } => {
                assert_eq!(key, b"foo");
                assert!(flags.base64 && flags.value && flags.has(b'k'));
            }
            c => panic!("{c:?}"),
        }
        assert_eq!(
            one(b"mg k v v\r\n").0,
            McCmd::Error("CLIENT_ERROR duplicate flag")
        );
        assert_eq!(
            one(b"mg k E5\r\n").0,
            McCmd::Error("CLIENT_ERROR invalid flag")
        );
        assert_eq!(
            one(b"md k X\r\n").0,
            McCmd::Error("CLIENT_ERROR invalid or duplicate flag")
        );
        assert_eq!(one(b"mn\r\n").0, McCmd::MetaNoop);
        assert!(matches!(
            McCodec::default().decode(b"\x80\x00", 100),
            McFrame::Close { .. }
        ));
        assert!(matches!(
            McCodec::default().decode(&[b'x'; 3000], 100),
            McFrame::Close { .. }
        ));
    }
}
