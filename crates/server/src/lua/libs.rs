//! The libraries Redis gives scripts beyond Lua's own: `cjson` (as
//! lua-cjson 2.1 in Redis: encode and decode), `cmsgpack` (as
//! lua-cmsgpack 0.4: pack, unpack, unpack_one, unpack_limit), `bit`
//! (LuaBitOp 1.0) and
//! Redis's `math.random` generator (rand48, one sequence for the process).
//!
//! Errors are raised with the calling script line in front, where lua-cjson
//! and LuaBitOp report them.

use super::convert::fmt_g;
use mlua::{LightUserData, Lua, MultiValue, Table, Value, Variadic};

/// `cjson.null`: a light userdata holding NULL, as lua-cjson's.
pub fn json_null() -> Value {
    Value::LightUserData(LightUserData(std::ptr::null_mut()))
}

/// A function's result: a failure is raised at the calling line.
fn done(lua: &Lua, r: Result<Value, String>) -> mlua::Result<Value> {
    r.map_err(|e| super::raise_here(lua, &e))
}

/// Registers the functions in `raw` (the prelude puts them in `cjson` and
/// `bit`).
pub fn register(lua: &Lua, raw: &Table) -> mlua::Result<()> {
    raw.raw_set(
        "json_encode",
        lua.create_function(|lua, args: Variadic<Value>| {
            let r = if args.len() != 1 {
                Err("bad argument #1 to 'encode' (expected 1 argument)".to_string())
            } else {
                let mut out = Vec::new();
                encode(&args[0], &mut out, 0).map(|()| out).and_then(|o| {
                    lua.create_string(&o)
                        .map(Value::String)
                        .map_err(|e| e.to_string())
                })
            };
            done(lua, r)
        })?,
    )?;
    raw.raw_set(
        "json_decode",
        lua.create_function(|lua, args: Variadic<Value>| {
            let r = match args.first() {
                Some(Value::String(s)) if args.len() == 1 => decode(lua, &s.as_bytes()),
                Some(v) if args.len() == 1 => match lua.coerce_string(v.clone()) {
                    Ok(Some(s)) => decode(lua, &s.as_bytes()),
                    _ => Err(format!(
                        "bad argument #1 to 'decode' (string expected, got {})",
                        v.type_name()
                    )),
                },
                _ => Err("bad argument #1 to 'decode' (expected 1 argument)".to_string()),
            };
            done(lua, r)
        })?,
    )?;
    raw.raw_set(
        "msgpack_pack",
        lua.create_function(|lua, args: Variadic<Value>| {
            if args.is_empty() {
                return Err(super::raise_here(
                    lua,
                    "bad argument #0 to 'pack' (MessagePack pack needs input.)",
                ));
            }
            let mut out = Vec::new();
            for a in args.iter() {
                mp_encode(a, 0, &mut out)?;
            }
            lua.create_string(&out)
        })?,
    )?;
    for (name, kind) in [("unpack", 0), ("unpack_one", 1), ("unpack_limit", 2)] {
        raw.raw_set(
            format!("msgpack_{name}"),
            lua.create_function(move |lua, args: Variadic<Value>| {
                mp_unpack(lua, name, kind, &args)
            })?,
        )?;
    }
    for (name, op) in BIT_OPS {
        let op = *op;
        raw.raw_set(
            format!("bit_{name}"),
            lua.create_function(move |lua, args: Variadic<Value>| {
                let r = bit_op(lua, name, op, &args);
                done(lua, r)
            })?,
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------- cjson

/// lua-cjson's limits and defaults as Redis builds it.
const MAX_DEPTH: usize = 1000;
const SPARSE_RATIO: usize = 2;
const SPARSE_SAFE: usize = 10;

fn encode(v: &Value, out: &mut Vec<u8>, depth: usize) -> Result<(), String> {
    match v {
        Value::Nil => out.extend_from_slice(b"null"),
        Value::LightUserData(p) if p.0.is_null() => out.extend_from_slice(b"null"),
        Value::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Integer(i) => out.extend_from_slice(i.to_string().as_bytes()),
        Value::Number(n) => number(*n, out)?,
        Value::String(s) => string(&s.as_bytes(), out),
        Value::Table(t) => {
            let depth = depth + 1;
            if depth > MAX_DEPTH {
                return Err(format!("Cannot serialise, excessive nesting ({depth})"));
            }
            match array_len(t)? {
                Some(n) => {
                    out.push(b'[');
                    for i in 1..=n {
                        if i > 1 {
                            out.push(b',');
                        }
                        let v: Value = t.raw_get(i).map_err(|e| e.to_string())?;
                        encode(&v, out, depth)?;
                    }
                    out.push(b']');
                }
                None => {
                    out.push(b'{');
                    let mut first = true;
                    for pair in t.pairs::<Value, Value>() {
                        let (k, v) = pair.map_err(|e| e.to_string())?;
                        if !first {
                            out.push(b',');
                        }
                        first = false;
                        match &k {
                            Value::String(s) => string(&s.as_bytes(), out),
                            Value::Number(n) => {
                                out.push(b'"');
                                number(*n, out)?;
                                out.push(b'"');
                            }
                            Value::Integer(i) => {
                                out.extend_from_slice(format!("\"{i}\"").as_bytes())
                            }
                            _ => {
                                return Err(
                                    "Cannot serialise table: table key must be a number or string"
                                        .into(),
                                )
                            }
                        }
                        out.push(b':');
                        encode(&v, out, depth)?;
                    }
                    out.push(b'}');
                }
            }
        }
        other => {
            return Err(format!(
                "Cannot serialise {}: type not supported",
                other.type_name()
            ))
        }
    }
    Ok(())
}

/// lua-cjson's `lua_array_length`: Some(n) when every key is a positive
/// integer (n the largest, holes allowed unless excessively sparse), None
/// for an object (an empty table is an object, as Redis's build encodes
/// it).
fn array_len(t: &Table) -> Result<Option<usize>, String> {
    let (mut max, mut items) = (0usize, 0usize);
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair.map_err(|e| e.to_string())?;
        let n = match k {
            Value::Number(n) => n,
            Value::Integer(i) => i as f64,
            _ => return Ok(None),
        };
        if n < 1.0 || n.floor() != n || n > usize::MAX as f64 {
            return Ok(None);
        }
        max = max.max(n as usize);
        items += 1;
    }
    if max == 0 {
        return Ok(None);
    }
    if max > SPARSE_SAFE && max > items * SPARSE_RATIO {
        return Err("Cannot serialise table: excessively sparse array".into());
    }
    Ok(Some(max))
}

fn number(n: f64, out: &mut Vec<u8>) -> Result<(), String> {
    if !n.is_finite() {
        return Err("Cannot serialise number: must not be NaN or Inf".into());
    }
    out.extend_from_slice(fmt_g(n, 14).as_bytes());
    Ok(())
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    out.push(b'"');
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'/' => out.extend_from_slice(b"\\/"),
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0..=0x1f | 0x7f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// lua-cjson's decoder, ported for its behaviour and error texts: the
/// input is a C string (a NUL byte ends it), numbers are read as `strtod`
/// reads them (hex, `inf`, `nan`, leading zeros and `+` accepted: Redis
/// builds lua-cjson with `decode_invalid_numbers` on), strings keep their
/// bytes as they are, `\uXXXX` escapes become UTF-8.
fn decode(lua: &Lua, text: &[u8]) -> Result<Value, String> {
    if text.len() >= 2 && (text[0] == 0 || text[1] == 0) {
        return Err("JSON parser does not support UTF-16 or UTF-32".into());
    }
    let mut p = JsonParser {
        lua,
        s: text,
        pos: 0,
        depth: 0,
    };
    let t = p.next_token();
    let v = p.value(t)?;
    let t = p.next_token();
    if !matches!(t.kind, Tok::End) {
        return Err(p.expected("the end", &t));
    }
    Ok(v)
}

#[derive(Clone, Copy, PartialEq)]
enum Tok {
    ObjBegin,
    ObjEnd,
    ArrBegin,
    ArrEnd,
    Str,
    Num,
    Bool(bool),
    Null,
    Colon,
    Comma,
    End,
    Error(&'static str),
}

struct Token {
    kind: Tok,
    /// Where the token starts (0-based).
    index: usize,
    string: Vec<u8>,
    number: f64,
}

struct JsonParser<'a> {
    lua: &'a Lua,
    s: &'a [u8],
    pos: usize,
    depth: usize,
}

impl JsonParser<'_> {
    /// The byte at `i`, 0 past the end (the C string's terminator).
    fn at(&self, i: usize) -> u8 {
        self.s.get(i).copied().unwrap_or(0)
    }

    fn token(&self, kind: Tok, index: usize) -> Token {
        Token {
            kind,
            index,
            string: Vec::new(),
            number: 0.0,
        }
    }

    fn next_token(&mut self) -> Token {
        while matches!(self.at(self.pos), b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
        let index = self.pos;
        let ch = self.at(self.pos);
        let single = match ch {
            b'{' => Some(Tok::ObjBegin),
            b'}' => Some(Tok::ObjEnd),
            b'[' => Some(Tok::ArrBegin),
            b']' => Some(Tok::ArrEnd),
            b',' => Some(Tok::Comma),
            b':' => Some(Tok::Colon),
            _ => None,
        };
        if let Some(k) = single {
            self.pos += 1;
            return self.token(k, index);
        }
        if ch == 0 {
            return self.token(Tok::End, index);
        }
        let rest = &self.s[self.pos..];
        match ch {
            b'"' => self.string_token(index),
            b'-' | b'0'..=b'9' => self.number_token(index),
            _ if rest.starts_with(b"true") => {
                self.pos += 4;
                self.token(Tok::Bool(true), index)
            }
            _ if rest.starts_with(b"false") => {
                self.pos += 5;
                self.token(Tok::Bool(false), index)
            }
            _ if rest.starts_with(b"null") => {
                self.pos += 4;
                self.token(Tok::Null, index)
            }
            b'i' | b'I' | b'n' | b'N' | b'+' if self.invalid_number() => self.number_token(index),
            _ => self.token(Tok::Error("invalid token"), index),
        }
    }

    /// lua-cjson's `json_is_invalid_number`: what strict JSON refuses but
    /// `strtod` reads.
    fn invalid_number(&self) -> bool {
        let mut p = self.pos;
        if self.at(p) == b'+' {
            return true;
        }
        if self.at(p) == b'-' {
            p += 1;
        }
        let c = self.at(p);
        if c == b'0' {
            let c2 = self.at(p + 1);
            return (c2 | 0x20) == b'x' || c2.is_ascii_digit();
        }
        if c <= b'9' {
            return false;
        }
        let word = |w: &[u8]| (0..w.len()).all(|i| self.at(p + i).eq_ignore_ascii_case(&w[i]));
        word(b"inf") || word(b"nan")
    }

    fn number_token(&mut self, index: usize) -> Token {
        match strtod(&self.s[self.pos..]) {
            Some((n, used)) => {
                self.pos += used;
                let mut t = self.token(Tok::Num, index);
                t.number = n;
                t
            }
            None => self.token(Tok::Error("invalid number"), self.pos),
        }
    }

    fn string_token(&mut self, index: usize) -> Token {
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            let ch = self.at(self.pos);
            if ch == b'"' {
                break;
            }
            if ch == 0 {
                return self.token(Tok::Error("unexpected end of string"), self.pos);
            }
            if ch == b'\\' {
                let esc = match self.at(self.pos + 1) {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'/' => b'/',
                    b'b' => 8,
                    b't' => b'\t',
                    b'n' => b'\n',
                    b'f' => 12,
                    b'r' => b'\r',
                    b'u' => {
                        if self.unicode_escape(&mut out) {
                            continue;
                        }
                        return self.token(Tok::Error("invalid unicode escape code"), self.pos);
                    }
                    _ => return self.token(Tok::Error("invalid escape code"), self.pos),
                };
                out.push(esc);
                self.pos += 2;
                continue;
            }
            out.push(ch);
            self.pos += 1;
        }
        self.pos += 1;
        let mut t = self.token(Tok::Str, index);
        t.string = out;
        t
    }

    fn hex4(&self, at: usize) -> Option<u32> {
        (0..4).try_fold(0u32, |a, i| {
            (self.at(at + i) as char).to_digit(16).map(|d| (a << 4) | d)
        })
    }

    /// A `\uXXXX` escape (a surrogate pair is two) as UTF-8.
    fn unicode_escape(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(mut cp) = self.hex4(self.pos + 2) else {
            return false;
        };
        let mut len = 6;
        if cp & 0xF800 == 0xD800 {
            if cp & 0x400 != 0 || self.at(self.pos + 6) != b'\\' || self.at(self.pos + 7) != b'u' {
                return false;
            }
            let Some(low) = self.hex4(self.pos + 8) else {
                return false;
            };
            if low & 0xFC00 != 0xDC00 {
                return false;
            }
            cp = (((cp & 0x3FF) << 10) | (low & 0x3FF)) + 0x10000;
            len = 12;
        }
        let Some(c) = char::from_u32(cp) else {
            return false;
        };
        let mut buf = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        self.pos += len;
        true
    }

    fn expected(&self, what: &str, t: &Token) -> String {
        let found = match t.kind {
            Tok::Error(e) => e,
            Tok::ObjBegin => "T_OBJ_BEGIN",
            Tok::ObjEnd => "T_OBJ_END",
            Tok::ArrBegin => "T_ARR_BEGIN",
            Tok::ArrEnd => "T_ARR_END",
            Tok::Str => "T_STRING",
            Tok::Num => "T_NUMBER",
            Tok::Bool(_) => "T_BOOLEAN",
            Tok::Null => "T_NULL",
            Tok::Colon => "T_COLON",
            Tok::Comma => "T_COMMA",
            Tok::End => "T_END",
        };
        format!(
            "Expected {what} but found {found} at character {}",
            t.index + 1
        )
    }

    fn descend(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!(
                "Found too many nested data structures ({}) at character {}",
                self.depth, self.pos
            ));
        }
        Ok(())
    }

    fn value(&mut self, t: Token) -> Result<Value, String> {
        let lua_err = |e: mlua::Error| e.to_string();
        Ok(match t.kind {
            Tok::Str => Value::String(self.lua.create_string(&t.string).map_err(lua_err)?),
            Tok::Num => Value::Number(t.number),
            Tok::Bool(b) => Value::Boolean(b),
            Tok::Null => json_null(),
            Tok::ObjBegin => {
                self.descend()?;
                let tbl = self.lua.create_table().map_err(lua_err)?;
                let mut t = self.next_token();
                if t.kind != Tok::ObjEnd {
                    loop {
                        if t.kind != Tok::Str {
                            return Err(self.expected("object key string", &t));
                        }
                        let key = self.lua.create_string(&t.string).map_err(lua_err)?;
                        let colon = self.next_token();
                        if colon.kind != Tok::Colon {
                            return Err(self.expected("colon", &colon));
                        }
                        let vt = self.next_token();
                        let v = self.value(vt)?;
                        tbl.raw_set(key, v).map_err(lua_err)?;
                        let sep = self.next_token();
                        if sep.kind == Tok::ObjEnd {
                            break;
                        }
                        if sep.kind != Tok::Comma {
                            return Err(self.expected("comma or object end", &sep));
                        }
                        t = self.next_token();
                    }
                }
                self.depth -= 1;
                Value::Table(tbl)
            }
            Tok::ArrBegin => {
                self.descend()?;
                let tbl = self.lua.create_table().map_err(lua_err)?;
                let mut t = self.next_token();
                if t.kind != Tok::ArrEnd {
                    for i in 1.. {
                        let v = self.value(t)?;
                        tbl.raw_set(i, v).map_err(lua_err)?;
                        let sep = self.next_token();
                        if sep.kind == Tok::ArrEnd {
                            break;
                        }
                        if sep.kind != Tok::Comma {
                            return Err(self.expected("comma or array end", &sep));
                        }
                        t = self.next_token();
                    }
                }
                self.depth -= 1;
                Value::Table(tbl)
            }
            _ => return Err(self.expected("value", &t)),
        })
    }
}

/// C's `strtod` on the front of `s` (the C locale): the number and how many
/// bytes it took; None when no number starts there.
fn strtod(s: &[u8]) -> Option<(f64, usize)> {
    let at = |i: usize| s.get(i).copied().unwrap_or(0);
    let mut i = 0;
    let neg = match at(0) {
        b'-' => {
            i = 1;
            true
        }
        b'+' => {
            i = 1;
            false
        }
        _ => false,
    };
    let sign = |v: f64| if neg { -v } else { v };
    let word =
        |from: usize, w: &[u8]| (0..w.len()).all(|k| at(from + k).eq_ignore_ascii_case(&w[k]));
    if word(i, b"infinity") {
        return Some((sign(f64::INFINITY), i + 8));
    }
    if word(i, b"inf") {
        return Some((sign(f64::INFINITY), i + 3));
    }
    if word(i, b"nan") {
        let mut end = i + 3;
        // nan(chars)
        if at(end) == b'(' {
            let mut k = end + 1;
            while at(k).is_ascii_alphanumeric() || at(k) == b'_' {
                k += 1;
            }
            if at(k) == b')' {
                end = k + 1;
            }
        }
        return Some((sign(f64::NAN), end));
    }
    if at(i) == b'0' && (at(i + 1) | 0x20) == b'x' {
        let mut k = i + 2;
        let (mut mant, mut exp, mut digits) = (0f64, 0i32, 0);
        while let Some(d) = (at(k) as char).to_digit(16) {
            mant = mant * 16.0 + d as f64;
            digits += 1;
            k += 1;
        }
        if at(k) == b'.' {
            k += 1;
            while let Some(d) = (at(k) as char).to_digit(16) {
                mant = mant * 16.0 + d as f64;
                exp -= 4;
                digits += 1;
                k += 1;
            }
        }
        if digits == 0 {
            // "0x" without digits: strtod reads the "0".
            return Some((sign(0.0), i + 1));
        }
        if (at(k) | 0x20) == b'p' {
            let mut e = k + 1;
            let eneg = match at(e) {
                b'-' => {
                    e += 1;
                    true
                }
                b'+' => {
                    e += 1;
                    false
                }
                _ => false,
            };
            if at(e).is_ascii_digit() {
                let mut v = 0i32;
                while at(e).is_ascii_digit() {
                    v = v.saturating_mul(10).saturating_add((at(e) - b'0') as i32);
                    e += 1;
                }
                exp = exp.saturating_add(if eneg { -v } else { v });
                k = e;
            }
        }
        return Some((sign(mant * 2f64.powi(exp)), k));
    }
    let start = i;
    let mut k = i;
    while at(k).is_ascii_digit() {
        k += 1;
    }
    let int_digits = k - start;
    let mut frac_digits = 0;
    if at(k) == b'.' {
        let mut f = k + 1;
        while at(f).is_ascii_digit() {
            f += 1;
        }
        frac_digits = f - k - 1;
        if int_digits > 0 || frac_digits > 0 {
            k = f;
        }
    }
    if int_digits == 0 && frac_digits == 0 {
        return None;
    }
    if (at(k) | 0x20) == b'e' {
        let mut e = k + 1;
        if at(e) == b'-' || at(e) == b'+' {
            e += 1;
        }
        if at(e).is_ascii_digit() {
            while at(e).is_ascii_digit() {
                e += 1;
            }
            k = e;
        }
    }
    let text = std::str::from_utf8(&s[start..k]).ok()?;
    let v: f64 = text.parse().ok()?;
    Some((sign(v), k))
}

// ---------------------------------------------------------------- cmsgpack

/// lua-cmsgpack's `LUACMSGPACK_MAX_NESTING`: deeper tables encode as nil.
const MP_MAX_NESTING: usize = 16;

fn mp_encode(v: &Value, level: usize, out: &mut Vec<u8>) -> mlua::Result<()> {
    match v {
        Value::String(s) => mp_bytes(&s.as_bytes(), out),
        Value::Boolean(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Value::Integer(i) => mp_int(*i, out),
        Value::Number(n) => {
            // An integral number that fits an int64 is an integer.
            if n.is_finite() && (*n as i64) as f64 == *n && *n < 9.223_372_036_854_776e18 {
                mp_int(*n as i64, out)
            } else if (*n as f32) as f64 == *n {
                out.push(0xca);
                out.extend_from_slice(&(*n as f32).to_be_bytes());
            } else {
                out.push(0xcb);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        Value::Table(t) if level < MP_MAX_NESTING => {
            if mp_is_array(t)? {
                let n = t.raw_len();
                mp_header(n as u64, 0x90, 0xdc, 0xdd, out);
                for j in 1..=n {
                    mp_encode(&t.get::<Value>(j)?, level + 1, out)?;
                }
            } else {
                let pairs: Vec<(Value, Value)> =
                    t.pairs::<Value, Value>().collect::<mlua::Result<_>>()?;
                mp_header(pairs.len() as u64, 0x80, 0xde, 0xdf, out);
                for (k, v) in &pairs {
                    mp_encode(k, level + 1, out)?;
                    mp_encode(v, level + 1, out)?;
                }
            }
        }
        _ => out.push(0xc0),
    }
    Ok(())
}

/// lua-cmsgpack's `table_is_an_array`: keys 1..n, no hole.
fn mp_is_array(t: &Table) -> mlua::Result<bool> {
    let (mut count, mut max) = (0i64, 0i64);
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let n = match k {
            Value::Number(n) => n,
            Value::Integer(i) => i as f64,
            _ => return Ok(false),
        };
        if n <= 0.0 || n > i32::MAX as f64 || n.fract() != 0.0 {
            return Ok(false);
        }
        max = max.max(n as i64);
        count += 1;
    }
    Ok(max == count)
}

fn mp_header(n: u64, fix: u8, b16: u8, b32: u8, out: &mut Vec<u8>) {
    if n <= 15 {
        out.push(fix | n as u8);
    } else if n <= 0xffff {
        out.push(b16);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(b32);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

fn mp_bytes(s: &[u8], out: &mut Vec<u8>) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n <= 0xff {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s);
}

fn mp_int(n: i64, out: &mut Vec<u8>) {
    if n >= 0 {
        if n <= 127 {
            out.push(n as u8);
        } else if n <= 0xff {
            out.extend_from_slice(&[0xcc, n as u8]);
        } else if n <= 0xffff {
            out.push(0xcd);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else if n <= 0xffff_ffff {
            out.push(0xce);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    } else if n >= -32 {
        out.push(n as i8 as u8);
    } else if n >= -128 {
        out.extend_from_slice(&[0xd0, n as i8 as u8]);
    } else if n >= -32768 {
        out.push(0xd1);
        out.extend_from_slice(&(n as i16).to_be_bytes());
    } else if n >= -2_147_483_648 {
        out.push(0xd2);
        out.extend_from_slice(&(n as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// Why a decode stopped.
enum MpError {
    Eof,
    BadFormat,
}

/// Most values one unpack returns (Lua's C stack allows about 8,000).
const MP_MAX_RESULTS: usize = 7_900;
/// Deepest nesting decoded (the C version recurses without a bound).
const MP_MAX_DEPTH: usize = 1_000;

struct MpCur<'a> {
    b: &'a [u8],
    pos: usize,
}

impl MpCur<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], MpError> {
        let end = self.pos.checked_add(n).ok_or(MpError::Eof)?;
        let s = self.b.get(self.pos..end).ok_or(MpError::Eof)?;
        self.pos = end;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, MpError> {
        Ok(self.take(n)?.iter().fold(0u64, |a, &b| (a << 8) | b as u64))
    }
}

fn mp_decode(lua: &Lua, c: &mut MpCur, depth: usize) -> Result<Value, MpError> {
    if depth > MP_MAX_DEPTH {
        return Err(MpError::BadFormat);
    }
    let tag = c.take(1)?[0];
    let str_of = |lua: &Lua, b: &[u8]| {
        lua.create_string(b)
            .map(Value::String)
            .map_err(|_| MpError::BadFormat)
    };
    Ok(match tag {
        0xc0 => Value::Nil,
        0xc2 => Value::Boolean(false),
        0xc3 => Value::Boolean(true),
        0xcc => Value::Number(c.be(1)? as f64),
        0xcd => Value::Number(c.be(2)? as f64),
        0xce => Value::Number(c.be(4)? as f64),
        0xcf => Value::Number(c.be(8)? as f64),
        0xd0 => Value::Number(c.be(1)? as u8 as i8 as f64),
        0xd1 => Value::Number(c.be(2)? as u16 as i16 as f64),
        0xd2 => Value::Number(c.be(4)? as u32 as i32 as f64),
        0xd3 => Value::Number(c.be(8)? as i64 as f64),
        0xca => Value::Number(f32::from_bits(c.be(4)? as u32) as f64),
        0xcb => Value::Number(f64::from_bits(c.be(8)?)),
        0xd9..=0xdb => {
            let n = c.be(1 << (tag - 0xd9))? as usize;
            let b = c.take(n)?;
            str_of(lua, b)?
        }
        0xdc | 0xdd => {
            let n = c.be(if tag == 0xdc { 2 } else { 4 })? as usize;
            mp_array(lua, c, n, depth)?
        }
        0xde | 0xdf => {
            let n = c.be(if tag == 0xde { 2 } else { 4 })? as usize;
            mp_map(lua, c, n, depth)?
        }
        t if t & 0x80 == 0 => Value::Number(t as f64),
        t if t & 0xe0 == 0xe0 => Value::Number(t as i8 as f64),
        t if t & 0xe0 == 0xa0 => {
            let b = c.take((t & 0x1f) as usize)?;
            str_of(lua, b)?
        }
        t if t & 0xf0 == 0x90 => mp_array(lua, c, (t & 0xf) as usize, depth)?,
        t if t & 0xf0 == 0x80 => mp_map(lua, c, (t & 0xf) as usize, depth)?,
        _ => return Err(MpError::BadFormat),
    })
}

fn mp_array(lua: &Lua, c: &mut MpCur, n: usize, depth: usize) -> Result<Value, MpError> {
    let t = lua.create_table().map_err(|_| MpError::BadFormat)?;
    for i in 1..=n {
        let v = mp_decode(lua, c, depth + 1)?;
        t.raw_set(i, v).map_err(|_| MpError::BadFormat)?;
    }
    Ok(Value::Table(t))
}

fn mp_map(lua: &Lua, c: &mut MpCur, n: usize, depth: usize) -> Result<Value, MpError> {
    let t = lua.create_table().map_err(|_| MpError::BadFormat)?;
    for _ in 0..n {
        let k = mp_decode(lua, c, depth + 1)?;
        let v = mp_decode(lua, c, depth + 1)?;
        // A nil key (or NaN) cannot be set: lua-cmsgpack would raise there.
        if !k.is_nil() {
            t.raw_set(k, v).map_err(|_| MpError::BadFormat)?;
        }
    }
    Ok(Value::Table(t))
}

/// `cmsgpack.unpack(s)` (kind 0), `unpack_one(s [, offset])` (1),
/// `unpack_limit(s, limit [, offset])` (2): the latter two return the
/// offset of what is left (-1: nothing) before the values.
fn mp_unpack(lua: &Lua, name: &str, kind: u8, args: &[Value]) -> mlua::Result<MultiValue> {
    let s = match args.first() {
        Some(Value::String(s)) => s.as_bytes().to_vec(),
        Some(v @ (Value::Number(_) | Value::Integer(_))) => lua
            .coerce_string(v.clone())?
            .map(|s| s.as_bytes().to_vec())
            .unwrap_or_default(),
        other => {
            let got = other.map(|v| v.type_name()).unwrap_or("no value");
            return Err(super::raise_here(
                lua,
                &format!("bad argument #1 to '{name}' (string expected, got {got})"),
            ));
        }
    };
    let int_arg = |i: usize, default: i64| -> mlua::Result<i64> {
        match args.get(i) {
            None | Some(Value::Nil) if default >= 0 => Ok(default),
            Some(v) => match lua.coerce_number(v.clone())? {
                Some(n) => Ok(n as i64),
                None => Err(super::raise_here(
                    lua,
                    &format!(
                        "bad argument #{} to '{name}' (number expected, got {})",
                        i + 1,
                        v.type_name()
                    ),
                )),
            },
            None => Err(super::raise_here(
                lua,
                &format!(
                    "bad argument #{} to '{name}' (number expected, got no value)",
                    i + 1
                ),
            )),
        }
    };
    let (limit, offset) = match kind {
        0 => (0, 0),
        1 => (1, int_arg(1, 0)?),
        _ => (int_arg(1, -1)?, int_arg(2, 0)?),
    };
    let len = s.len();
    if offset < 0 || limit < 0 {
        return Err(super::raise_here(
            lua,
            &format!("Invalid request to unpack with offset of {offset} and limit of {len}."),
        ));
    }
    if offset as usize > len {
        return Err(super::raise_here(
            lua,
            &format!("Start offset {offset} greater than input length {len}."),
        ));
    }
    let all = limit == 0 && offset == 0;
    let limit = if all { usize::MAX } else { limit as usize };
    let mut c = MpCur {
        b: &s,
        pos: offset as usize,
    };
    let mut out = Vec::new();
    while c.pos < len && out.len() < limit {
        if out.len() >= MP_MAX_RESULTS {
            return Err(super::raise_here(
                lua,
                "stack overflow (too many return values at once; use unpack_one or unpack_limit instead.)",
            ));
        }
        match mp_decode(lua, &mut c, 0) {
            Ok(v) => out.push(v),
            Err(MpError::Eof) => return Err(super::raise_here(lua, "Missing bytes in input.")),
            Err(MpError::BadFormat) => {
                return Err(super::raise_here(lua, "Bad data format in input."))
            }
        }
    }
    if !all {
        let next = if c.pos >= len { -1.0 } else { c.pos as f64 };
        out.insert(0, Value::Number(next));
    }
    Ok(MultiValue::from_vec(out))
}

// ---------------------------------------------------------------- bit

#[derive(Clone, Copy)]
enum BitOp {
    Tobit,
    Tohex,
    Bnot,
    Band,
    Bor,
    Bxor,
    Lshift,
    Rshift,
    Arshift,
    Rol,
    Ror,
    Bswap,
}

const BIT_OPS: &[(&str, BitOp)] = &[
    ("tobit", BitOp::Tobit),
    ("tohex", BitOp::Tohex),
    ("bnot", BitOp::Bnot),
    ("band", BitOp::Band),
    ("bor", BitOp::Bor),
    ("bxor", BitOp::Bxor),
    ("lshift", BitOp::Lshift),
    ("rshift", BitOp::Rshift),
    ("arshift", BitOp::Arshift),
    ("rol", BitOp::Rol),
    ("ror", BitOp::Ror),
    ("bswap", BitOp::Bswap),
];

/// LuaBitOp's `barg`: the number's low 32 bits after rounding to an integer
/// (adding 2^52 + 2^51 puts the rounded integer in the mantissa's low bits).
pub fn tobit(n: f64) -> i32 {
    (n + 6_755_399_441_055_744.0).to_bits() as u32 as i32
}

fn bit_arg(lua: &Lua, name: &str, args: &[Value], i: usize) -> Result<i32, String> {
    let bad = |got: &str| {
        format!(
            "bad argument #{} to '{name}' (number expected, got {got})",
            i + 1
        )
    };
    match args.get(i) {
        None => Err(bad("no value")),
        Some(Value::Number(n)) => Ok(tobit(*n)),
        Some(Value::Integer(n)) => Ok(tobit(*n as f64)),
        Some(v @ Value::String(_)) => match lua.coerce_number(v.clone()) {
            Ok(Some(n)) => Ok(tobit(n)),
            _ => Err(bad("string")),
        },
        Some(v) => Err(bad(v.type_name())),
    }
}

fn bit_op(lua: &Lua, name: &str, op: BitOp, args: &[Value]) -> Result<Value, String> {
    let a = |i| bit_arg(lua, name, args, i);
    let r: i32 = match op {
        BitOp::Tobit => a(0)?,
        BitOp::Bnot => !a(0)?,
        BitOp::Band | BitOp::Bor | BitOp::Bxor => {
            let mut r = a(0)?;
            for i in 1..args.len() {
                let b = a(i)?;
                r = match op {
                    BitOp::Band => r & b,
                    BitOp::Bor => r | b,
                    _ => r ^ b,
                };
            }
            r
        }
        BitOp::Lshift => ((a(0)? as u32) << (a(1)? as u32 & 31)) as i32,
        BitOp::Rshift => ((a(0)? as u32) >> (a(1)? as u32 & 31)) as i32,
        BitOp::Arshift => a(0)? >> (a(1)? as u32 & 31),
        BitOp::Rol => (a(0)? as u32).rotate_left(a(1)? as u32 & 31) as i32,
        BitOp::Ror => (a(0)? as u32).rotate_right(a(1)? as u32 & 31) as i32,
        BitOp::Bswap => a(0)?.swap_bytes(),
        BitOp::Tohex => {
            let b = a(0)? as u32;
            let n = if args.len() > 1 { a(1)? } else { 8 };
            let upper = n < 0;
            let n = (n.unsigned_abs().min(8)) as usize;
            let masked = if n == 8 {
                b
            } else {
                b & ((1u32 << (4 * n)) - 1)
            };
            let s = if upper {
                format!("{masked:0n$X}")
            } else {
                format!("{masked:0n$x}")
            };
            return lua
                .create_string(&s)
                .map(Value::String)
                .map_err(|e| e.to_string());
        }
    };
    Ok(Value::Number(r as f64))
}

// ---------------------------------------------------------------- random

/// Redis's `redisLrand48`/`redisSrand48` (rand48: x = a·x + c mod 2^48),
/// one state for the process as in Redis: scripts see one sequence, which
/// starts the same at every start.
pub struct Rand48(std::sync::Mutex<u64>);

const RAND48_A: u64 = 0x5_DEEC_E66D;
const RAND48_C: u64 = 0xB;
const RAND48_MASK: u64 = (1 << 48) - 1;
/// Redis's `REDIS_LRAND48_MAX` (INT32_MAX).
pub const LRAND48_MAX: i64 = i32::MAX as i64;

impl Default for Rand48 {
    fn default() -> Self {
        Rand48(std::sync::Mutex::new(0x1234_ABCD_330E))
    }
}

impl Rand48 {
    /// The next 31-bit value.
    pub fn next(&self) -> i64 {
        let mut x = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *x = (RAND48_A.wrapping_mul(*x).wrapping_add(RAND48_C)) & RAND48_MASK;
        (*x >> 17) as i64
    }

    /// `srand48(seed)`.
    pub fn seed(&self, seed: i32) {
        let mut x = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *x = ((seed as u32 as u64) << 16) | 0x330E;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rand48_follows_redis() {
        // redis-server 7.0.15 just started: math.random(100) twice gives
        // these (after one math.random() call).
        let r = Rand48::default();
        let f = |v: i64| (v % LRAND48_MAX) as f64 / LRAND48_MAX as f64;
        let first = f(r.next());
        assert!(first < 1.0);
        assert_eq!((f(r.next()) * 100.0).floor() + 1.0, 85.0);
        r.seed(3);
        assert_eq!((f(r.next()) * 100.0).floor() + 1.0, 79.0);
    }

    #[test]
    fn tobit_wraps_and_rounds() {
        assert_eq!(tobit(4294967295.0), -1);
        assert_eq!(tobit(2147483648.0), i32::MIN);
        assert_eq!(tobit(1.5), 2);
        assert_eq!(tobit(2.5), 2);
        assert_eq!(tobit(-1.0), -1);
    }

    #[test]
    fn json_strings_escape_as_cjson() {
        let mut out = Vec::new();
        string(b"a/\"\\\n\x01\x7f", &mut out);
        assert_eq!(out, b"\"a\\/\\\"\\\\\\n\\u0001\\u007f\"");
    }
}
