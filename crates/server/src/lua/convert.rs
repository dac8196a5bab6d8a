//! Conversions between Redis replies and Lua values, as Redis's
//! `script_lua.c` defines them (`redisProtocolToLuaType`,
//! `luaReplyToRedisReply`, `luaArgsToRedisArgv`).
//!
//! Reply → Lua: integer → number, bulk → string, RESP2 null → false, array
//! → table, status → `{ok=...}`, error → `{err=...}`; with RESP3 (after
//! `redis.setresp(3)`): null → nil, boolean → boolean, double →
//! `{double=n}`, map → `{map={...}}`, set → `{set={member=true}}`, big
//! number → `{big_number=s}`, verbatim → `{verbatim_string={format=,
//! string=}}`.
//!
//! Lua → reply: number → integer (truncated), string → bulk, true → 1
//! (RESP3: boolean), false → null (RESP3: boolean), table → `err`, `ok`,
//! `double`, `big_number`, `verbatim_string`, `map` or `set` when it has
//! that field, else an array up to the first nil; anything else → null.

use mlua::{Lua, Table, Value};
use proto::Reply;

/// Formats `x` as C's `printf("%.<prec>g", x)`.
pub fn fmt_g(x: f64, prec: usize) -> String {
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf" } else { "inf" }.into();
    }
    let p = prec.max(1);
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // The exponent after rounding to `p` significant digits.
    let sci = format!("{:.*e}", p - 1, x);
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if exp < -4 || exp >= p as i32 {
        let mant = strip_zeros(mant);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (p as i32 - 1 - exp).max(0) as usize;
        strip_zeros(&format!("{:.*}", decimals, x)).to_string()
    }
}

/// Drops a fraction's trailing zeros (and a bare trailing point).
fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// A command argument from a Lua value: a string as is, a number as
/// `%.17g` (Redis does not use Lua's own `%.14g`, which loses precision);
/// None for any other type.
pub fn arg_bytes(v: &Value) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    arg_bytes_into(v, &mut out).then_some(out)
}

/// [`arg_bytes`] appended to `out`; false for a type that is not an
/// argument.
pub fn arg_bytes_into(v: &Value, out: &mut Vec<u8>) -> bool {
    use std::io::Write;
    match v {
        Value::String(s) => out.extend_from_slice(&s.as_bytes()),
        Value::Integer(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Number(n) => out.extend_from_slice(fmt_g(*n, 17).as_bytes()),
        _ => return false,
    }
    true
}

/// A command's reply, as RESP bytes in `buf`, converted to Lua as
/// [`reply_to_lua`] does, and whether it is an error. The common replies
/// (a status, an integer, a bulk string) are converted straight from the
/// bytes; the others are parsed first.
pub fn reply_bytes_to_lua(lua: &Lua, buf: &[u8], resp3: bool) -> mlua::Result<(Value, bool)> {
    if let Some(v) = simple_reply(lua, buf)? {
        return Ok((v, false));
    }
    let reply = match proto::parse_reply(buf) {
        Ok(Some((r, _))) => r,
        _ => Reply::Error("ERR the command gave no reply".into()),
    };
    let is_err = matches!(reply, Reply::Error(_));
    Ok((reply_to_lua(lua, &reply, resp3)?, is_err))
}

/// The conversion of a reply that is one status line, integer or bulk
/// string filling `buf` exactly; None for any other reply.
fn simple_reply(lua: &Lua, buf: &[u8]) -> mlua::Result<Option<Value>> {
    let Some(body) = buf.strip_suffix(b"\r\n") else {
        return Ok(None);
    };
    let Some((&tag, rest)) = body.split_first() else {
        return Ok(None);
    };
    let single_line = || !rest.contains(&b'\r');
    Ok(match tag {
        b'+' if single_line() => {
            let t = lua.create_table_with_capacity(0, 1)?;
            t.raw_set("ok", lua.create_string(rest)?)?;
            Some(Value::Table(t))
        }
        b':' if single_line() => proto::int::parse_i64(rest).map(|n| Value::Number(n as f64)),
        b'$' => {
            let Some(nl) = rest.iter().position(|&b| b == b'\r') else {
                return Ok(None);
            };
            let (Some(len), Some(data)) = (proto::int::parse_i64(&rest[..nl]), rest.get(nl + 2..))
            else {
                return Ok(None);
            };
            if len < 0 || rest.get(nl + 1) != Some(&b'\n') || data.len() as i64 != len {
                return Ok(None);
            }
            Some(Value::String(lua.create_string(data)?))
        }
        _ => None,
    })
}

/// The `{err=...}` table Redis's `luaPushErrorBuff` makes of an error text:
/// "-CODE msg" keeps its code, a text without a leading '-' gets "ERR";
/// trailing CR/LF are trimmed.
pub fn error_table(lua: &Lua, text: &str) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("err", error_text(text))?;
    Ok(t)
}

/// The text of an error table for `text` (see [`error_table`]).
pub fn error_text(text: &str) -> String {
    let (code, msg) = match text.strip_prefix('-') {
        Some(rest) => match rest.split_once(' ') {
            Some((code, msg)) => (code, msg),
            None => ("ERR", rest),
        },
        None => ("ERR", text),
    };
    format!("{code} {}", msg.trim_matches(|c| c == '\r' || c == '\n'))
}

/// A command's reply as a Lua value; `resp3` is the protocol the script
/// asked for (it decides what a null is).
pub fn reply_to_lua(lua: &Lua, r: &Reply, resp3: bool) -> mlua::Result<Value> {
    Ok(match r {
        Reply::Simple(s) => {
            let t = lua.create_table()?;
            t.raw_set("ok", lua.create_string(s)?)?;
            Value::Table(t)
        }
        Reply::Error(e) => {
            let t = error_table(lua, &format!("-{e}"))?;
            t.raw_set("ignore_error_stats_update", true)?;
            Value::Table(t)
        }
        Reply::Integer(n) => Value::Number(*n as f64),
        Reply::Bulk(b) => Value::String(lua.create_string(b)?),
        Reply::Null | Reply::NullArray => {
            if resp3 {
                Value::Nil
            } else {
                Value::Boolean(false)
            }
        }
        Reply::Array(items) | Reply::Push(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, reply_to_lua(lua, item, resp3)?)?;
            }
            Value::Table(t)
        }
        Reply::Map(pairs) => {
            let inner = lua.create_table()?;
            for (k, v) in pairs {
                let k = reply_to_lua(lua, k, resp3)?;
                if k.is_nil() {
                    continue;
                }
                inner.raw_set(k, reply_to_lua(lua, v, resp3)?)?;
            }
            wrap(lua, "map", Value::Table(inner))?
        }
        Reply::Set(items) => {
            let inner = lua.create_table()?;
            for item in items {
                let k = reply_to_lua(lua, item, resp3)?;
                if k.is_nil() {
                    continue;
                }
                inner.raw_set(k, true)?;
            }
            wrap(lua, "set", Value::Table(inner))?
        }
        Reply::Double(d) => wrap(lua, "double", Value::Number(*d))?,
        Reply::Boolean(b) => Value::Boolean(*b),
        Reply::BigNumber(s) => wrap(lua, "big_number", Value::String(lua.create_string(s)?))?,
        Reply::Verbatim { format, text } => {
            let inner = lua.create_table()?;
            inner.raw_set("string", lua.create_string(text)?)?;
            inner.raw_set("format", lua.create_string(format)?)?;
            wrap(lua, "verbatim_string", Value::Table(inner))?
        }
    })
}

/// `{field = v}`.
fn wrap(lua: &Lua, field: &str, v: Value) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    t.raw_set(field, v)?;
    Ok(Value::Table(t))
}

/// How deep a returned table may nest before the conversion gives up
/// (Redis fails with "reached lua stack limit" when Lua's C stack runs
/// out).
const MAX_DEPTH: usize = 1000;

/// A script's return value as a reply; `resp3` is the protocol the script
/// set with `redis.setresp` (it decides how booleans convert).
pub fn lua_to_reply(v: &Value, resp3: bool) -> Reply {
    to_reply(v, resp3, 0)
}

fn to_reply(v: &Value, resp3: bool, depth: usize) -> Reply {
    if depth > MAX_DEPTH {
        return Reply::Error("ERR reached lua stack limit".into());
    }
    match v {
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Boolean(b) if resp3 => Reply::Boolean(*b),
        Value::Boolean(true) => Reply::Integer(1),
        Value::Boolean(false) => Reply::Null,
        Value::Integer(i) => Reply::Integer(*i),
        Value::Number(n) => Reply::Integer(trunc_i64(*n)),
        Value::Table(t) => table_reply(t, resp3, depth),
        _ => Reply::Null,
    }
}

/// C's `(long long)d` for a double in range; saturating outside it (C's
/// conversion is undefined there; x86 gives i64::MIN).
fn trunc_i64(d: f64) -> i64 {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0; // 2^63
    if (-LIMIT..LIMIT).contains(&d) {
        d as i64
    } else {
        i64::MIN
    }
}

fn table_reply(t: &Table, resp3: bool, depth: usize) -> Reply {
    let get = |k: &str| t.raw_get::<Value>(k).unwrap_or(Value::Nil);
    if let Value::String(e) = get("err") {
        return Reply::Error(e.to_string_lossy().to_string());
    }
    if let Value::String(s) = get("ok") {
        return Reply::Simple(s.to_string_lossy().to_string());
    }
    match get("double") {
        Value::Number(d) => return Reply::Double(d),
        Value::Integer(i) => return Reply::Double(i as f64),
        _ => {}
    }
    if let Value::String(s) = get("big_number") {
        return Reply::BigNumber(s.to_string_lossy().to_string());
    }
    if let Value::Table(vt) = get("verbatim_string") {
        if let (Ok(Value::String(f)), Ok(Value::String(s))) =
            (vt.raw_get::<Value>("format"), vt.raw_get::<Value>("string"))
        {
            let fb = f.as_bytes();
            let mut format = *b"txt";
            for (i, b) in fb.iter().take(3).enumerate() {
                format[i] = *b;
            }
            return Reply::Verbatim {
                format,
                text: s.as_bytes().to_vec(),
            };
        }
    }
    if let Value::Table(m) = get("map") {
        let mut pairs = Vec::new();
        for (k, v) in m.pairs::<Value, Value>().flatten() {
            pairs.push((
                to_reply(&k, resp3, depth + 1),
                to_reply(&v, resp3, depth + 1),
            ));
        }
        return Reply::Map(pairs);
    }
    if let Value::Table(s) = get("set") {
        let mut items = Vec::new();
        for (k, _) in s.pairs::<Value, Value>().flatten() {
            items.push(to_reply(&k, resp3, depth + 1));
        }
        return Reply::Set(items);
    }
    let mut items = Vec::new();
    for i in 1.. {
        match t.raw_get::<Value>(i) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(v) => items.push(to_reply(&v, resp3, depth + 1)),
        }
    }
    Reply::Array(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversion straight from a reply's bytes gives what parsing it
    /// first gives, for the replies it takes a shortcut on and the others.
    #[test]
    fn reply_bytes_convert_as_parsed_replies() {
        let lua = Lua::new();
        let cases: &[&[u8]] = &[
            b"+OK\r\n",
            b"+\r\n",
            b":42\r\n",
            b":-7\r\n",
            b"$3\r\nabc\r\n",
            b"$0\r\n\r\n",
            b"$4\r\na\r\nb\r\n",
            b"$-1\r\n",
            b"-ERR bad\r\n",
            b"*2\r\n:1\r\n$1\r\nx\r\n",
        ];
        let show = |v: &Value| -> String {
            match v {
                Value::Table(t) => {
                    let mut kv: Vec<String> = t
                        .clone()
                        .pairs::<Value, Value>()
                        .map(|p| {
                            let (k, v) = p.unwrap();
                            format!("{k:?}={v:?}")
                        })
                        .collect();
                    kv.sort();
                    kv.join(",")
                }
                other => format!("{other:?}"),
            }
        };
        for &bytes in cases {
            for resp3 in [false, true] {
                let (fast, err) = reply_bytes_to_lua(&lua, bytes, resp3).unwrap();
                let (r, _) = proto::parse_reply(bytes).unwrap().unwrap();
                let slow = reply_to_lua(&lua, &r, resp3).unwrap();
                assert_eq!(show(&fast), show(&slow), "{bytes:?}");
                assert_eq!(err, matches!(r, Reply::Error(_)), "{bytes:?}");
            }
        }
    }

    #[test]
    fn g_formatting_matches_c() {
        assert_eq!(fmt_g(1.0, 17), "1");
        assert_eq!(fmt_g(0.1, 17), "0.10000000000000001");
        assert_eq!(fmt_g(3.5, 14), "3.5");
        assert_eq!(fmt_g(1e20, 14), "1e+20");
        assert_eq!(fmt_g(123456789012345.0, 14), "1.2345678901234e+14");
        assert_eq!(fmt_g(0.0001, 14), "0.0001");
        assert_eq!(fmt_g(0.00001, 14), "1e-05");
        assert_eq!(fmt_g(-2.5e-7, 14), "-2.5e-07");
        assert_eq!(fmt_g(100.0, 14), "100");
        assert_eq!(fmt_g(1.0 / 3.0, 14), "0.33333333333333");
        assert_eq!(fmt_g(f64::INFINITY, 14), "inf");
    }

    #[test]
    fn error_texts_take_codes_as_redis() {
        assert_eq!(error_text("-WRONGTYPE Operation"), "WRONGTYPE Operation");
        assert_eq!(error_text("plain words"), "ERR plain words");
        assert_eq!(error_text("-NOCODE"), "ERR NOCODE");
        assert_eq!(error_text("-ERR x\r\n"), "ERR x");
    }

    #[test]
    fn replies_convert_both_ways() {
        let lua = Lua::new();
        let r = Reply::Array(vec![
            Reply::Integer(3),
            Reply::Bulk(b"x".to_vec()),
            Reply::Null,
            Reply::Simple("OK".into()),
        ]);
        let v = reply_to_lua(&lua, &r, false).unwrap();
        let Value::Table(t) = &v else { panic!() };
        assert_eq!(t.raw_get::<f64>(1).unwrap(), 3.0);
        assert!(!t.raw_get::<bool>(3).unwrap());
        let ok: Table = t.raw_get(4).unwrap();
        assert_eq!(ok.raw_get::<String>("ok").unwrap(), "OK");
        // Back: false becomes a null, {ok=} a status.
        assert_eq!(
            lua_to_reply(&v, false),
            Reply::Array(vec![
                Reply::Integer(3),
                Reply::Bulk(b"x".to_vec()),
                Reply::Null,
                Reply::Simple("OK".into()),
            ])
        );
        // RESP3 null is nil: the array stops there on the way back.
        let v3 = reply_to_lua(&lua, &r, true).unwrap();
        assert_eq!(
            lua_to_reply(&v3, true),
            Reply::Array(vec![Reply::Integer(3), Reply::Bulk(b"x".to_vec())])
        );
        let e = reply_to_lua(&lua, &Reply::Error("WRONGTYPE bad".into()), false).unwrap();
        assert_eq!(
            lua_to_reply(&e, false),
            Reply::Error("WRONGTYPE bad".into())
        );
        let d = reply_to_lua(&lua, &Reply::Double(1.5), true).unwrap();
        assert_eq!(lua_to_reply(&d, true), Reply::Double(1.5));
        assert_eq!(lua_to_reply(&Value::Number(3.99), false), Reply::Integer(3));
        assert_eq!(
            lua_to_reply(&Value::Number(-3.99), false),
            Reply::Integer(-3)
        );
        assert_eq!(
            lua_to_reply(&Value::Boolean(true), true),
            Reply::Boolean(true)
        );
        assert_eq!(
            lua_to_reply(&Value::Boolean(true), false),
            Reply::Integer(1)
        );
        assert_eq!(lua_to_reply(&Value::Nil, false), Reply::Null);
    }

    #[test]
    fn arguments_format_numbers_with_17_digits() {
        assert_eq!(
            arg_bytes(&Value::Number(0.1)).unwrap(),
            b"0.10000000000000001"
        );
        assert_eq!(arg_bytes(&Value::Number(5.0)).unwrap(), b"5");
        assert!(arg_bytes(&Value::Boolean(true)).is_none());
    }
}
