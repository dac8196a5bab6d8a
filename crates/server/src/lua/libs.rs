//! The libraries Redis gives scripts beyond Lua's own: `cjson` (as
//! lua-cjson 2.1 in Redis: encode and decode), `bit` (LuaBitOp 1.0) and
//! Redis's `math.random` generator (rand48, one sequence for the process).
//!
//! Errors are raised with the calling script line in front, where lua-cjson
//! and LuaBitOp report them.

use super::convert::fmt_g;
use mlua::{LightUserData, Lua, Table, Value, Variadic};

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

fn decode(lua: &Lua, text: &[u8]) -> Result<Value, String> {
    let v: serde_json::Value = serde_json::from_slice(text).map_err(|e| {
        // lua-cjson counts characters from 1; serde_json reports a line
        // and a column: turn them into an offset.
        let (line, col) = (e.line(), e.column());
        let mut pos = 0usize;
        for (i, l) in text.split(|&b| b == b'\n').enumerate() {
            if i + 1 == line {
                pos += col;
                break;
            }
            pos += l.len() + 1;
        }
        format!(
            "Expected value but found invalid token at character {}",
            pos.max(1)
        )
    })?;
    to_lua(lua, &v, 0).map_err(|e| e.to_string())
}

fn to_lua(lua: &Lua, v: &serde_json::Value, depth: usize) -> mlua::Result<Value> {
    use serde_json::Value as J;
    if depth > MAX_DEPTH {
        return Err(mlua::Error::runtime(format!(
            "Found too many nested data structures ({depth}) at character 1"
        )));
    }
    Ok(match v {
        J::Null => json_null(),
        J::Bool(b) => Value::Boolean(*b),
        J::Number(n) => Value::Number(n.as_f64().unwrap_or(f64::NAN)),
        J::String(s) => Value::String(lua.create_string(s)?),
        J::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item, depth + 1)?)?;
            }
            Value::Table(t)
        }
        J::Object(map) => {
            let t = lua.create_table_with_capacity(0, map.len())?;
            for (k, item) in map {
                t.raw_set(lua.create_string(k)?, to_lua(lua, item, depth + 1)?)?;
            }
            Value::Table(t)
        }
    })
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
