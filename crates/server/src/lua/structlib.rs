//! The `struct` library Redis gives scripts (Roberto Ierusalimschy's
//! lua-struct as Redis 7.0 builds it, on x86-64 sizes: short 2, int 4, long
//! and size_t 8, native order little-endian, largest alignment 8):
//! `struct.pack(fmt, ...)`, `struct.unpack(fmt, s [, pos])`,
//! `struct.size(fmt)`, with its error texts.

use super::raise_here;
use mlua::{Lua, MultiValue, Table, Value, Variadic};

/// lua-struct's `MAXINTSIZE`.
const MAX_INT_SIZE: usize = 32;
/// lua-struct's `MAXALIGN` on x86-64.
const MAX_ALIGN: usize = 8;

pub fn register(lua: &Lua, raw: &Table) -> mlua::Result<()> {
    raw.raw_set(
        "struct_pack",
        lua.create_function(|lua, args: Variadic<Value>| pack(lua, &args))?,
    )?;
    raw.raw_set(
        "struct_unpack",
        lua.create_function(|lua, args: Variadic<Value>| unpack(lua, &args))?,
    )?;
    raw.raw_set(
        "struct_size",
        lua.create_function(|lua, args: Variadic<Value>| size(lua, &args))?,
    )?;
    Ok(())
}

fn arg_error(lua: &Lua, n: usize, f: &str, msg: &str) -> mlua::Error {
    raise_here(lua, &format!("bad argument #{n} to '{f}' ({msg})"))
}

/// `luaL_checklstring` (numbers are converted).
fn check_str(lua: &Lua, args: &[Value], i: usize, f: &str) -> mlua::Result<Vec<u8>> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s.as_bytes().to_vec()),
        Some(v @ (Value::Number(_) | Value::Integer(_))) => Ok(lua
            .coerce_string(v.clone())?
            .map(|s| s.as_bytes().to_vec())
            .unwrap_or_default()),
        other => {
            let got = other.map(|v| v.type_name()).unwrap_or("no value");
            Err(arg_error(
                lua,
                i + 1,
                f,
                &format!("string expected, got {got}"),
            ))
        }
    }
}

fn check_num(lua: &Lua, args: &[Value], i: usize, f: &str) -> mlua::Result<f64> {
    match args.get(i) {
        Some(v) => match lua.coerce_number(v.clone())? {
            Some(n) => Ok(n),
            None => Err(arg_error(
                lua,
                i + 1,
                f,
                &format!("number expected, got {}", v.type_name()),
            )),
        },
        None => Err(arg_error(lua, i + 1, f, "number expected, got no value")),
    }
}

struct Format<'a> {
    fmt: &'a [u8],
    pos: usize,
    little: bool,
    align: usize,
}

impl Format<'_> {
    fn next(&mut self) -> Option<u8> {
        let c = *self.fmt.get(self.pos)?;
        // A NUL ends the format, as in C.
        if c == 0 {
            return None;
        }
        self.pos += 1;
        Some(c)
    }

    /// A size written after an option (`default` when none).
    fn num(&mut self, lua: &Lua, default: usize) -> mlua::Result<usize> {
        if !self.fmt.get(self.pos).is_some_and(u8::is_ascii_digit) {
            return Ok(default);
        }
        let mut a: usize = 0;
        while let Some(d) = self.fmt.get(self.pos).filter(|c| c.is_ascii_digit()) {
            let d = (d - b'0') as usize;
            if a > (i32::MAX as usize) / 10 || a * 10 > i32::MAX as usize - d {
                return Err(raise_here(lua, "integral size overflow"));
            }
            a = a * 10 + d;
            self.pos += 1;
        }
        Ok(a)
    }

    fn size(&mut self, lua: &Lua, opt: u8) -> mlua::Result<usize> {
        Ok(match opt {
            b'B' | b'b' | b'x' => 1,
            b'H' | b'h' => 2,
            b'L' | b'l' | b'T' | b'd' => 8,
            b'f' => 4,
            b'c' => self.num(lua, 1)?,
            b'i' | b'I' => {
                let sz = self.num(lua, 4)?;
                if sz > MAX_INT_SIZE {
                    return Err(raise_here(
                        lua,
                        &format!("integral size {sz} is larger than limit of {MAX_INT_SIZE}"),
                    ));
                }
                sz
            }
            _ => 0,
        })
    }

    fn to_align(&self, len: usize, opt: u8, size: usize) -> usize {
        if size == 0 || opt == b'c' {
            return 0;
        }
        let size = size.min(self.align);
        (size - (len & (size - 1))) & (size - 1)
    }

    /// The options that are not values (`controloptions`).
    fn control(&mut self, lua: &Lua, opt: u8, f: &str) -> mlua::Result<()> {
        match opt {
            b' ' => {}
            b'>' => self.little = false,
            b'<' => self.little = true,
            b'!' => {
                let a = self.num(lua, MAX_ALIGN)?;
                if a == 0 || a & (a - 1) != 0 {
                    return Err(raise_here(
                        lua,
                        &format!("alignment {a} is not a power of 2"),
                    ));
                }
                self.align = a;
            }
            _ => {
                return Err(arg_error(
                    lua,
                    1,
                    f,
                    &format!("invalid format option '{}'", opt as char),
                ))
            }
        }
        Ok(())
    }
}

fn format<'a>(fmt: &'a [u8]) -> Format<'a> {
    Format {
        fmt,
        pos: 0,
        little: true,
        align: 1,
    }
}

fn pack(lua: &Lua, args: &[Value]) -> mlua::Result<mlua::String> {
    let fmt = check_str(lua, args, 0, "pack")?;
    // lua-struct pushes a nil after the arguments: the first missing one
    // reads as nil.
    let mut args = args.to_vec();
    args.push(Value::Nil);
    let args = &args[..];
    let mut h = format(&fmt);
    let mut out: Vec<u8> = Vec::new();
    let mut arg = 1;
    while let Some(opt) = h.next() {
        let mut size = h.size(lua, opt)?;
        let pad = h.to_align(out.len(), opt, size);
        out.resize(out.len() + pad, 0);
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let n = check_num(lua, args, arg, "pack")?;
                arg += 1;
                let v: u64 = if n < 0.0 { n as i64 as u64 } else { n as u64 };
                let bytes: Vec<u8> = (0..size)
                    .map(|i| if i < 8 { (v >> (8 * i)) as u8 } else { 0 })
                    .collect();
                if h.little {
                    out.extend_from_slice(&bytes);
                } else {
                    out.extend(bytes.iter().rev());
                }
            }
            b'x' => out.push(0),
            b'f' => {
                let f = check_num(lua, args, arg, "pack")? as f32;
                arg += 1;
                out.extend_from_slice(&if h.little {
                    f.to_le_bytes()
                } else {
                    f.to_be_bytes()
                });
            }
            b'd' => {
                let d = check_num(lua, args, arg, "pack")?;
                arg += 1;
                out.extend_from_slice(&if h.little {
                    d.to_le_bytes()
                } else {
                    d.to_be_bytes()
                });
            }
            b'c' | b's' => {
                let s = check_str(lua, args, arg, "pack")?;
                arg += 1;
                if size == 0 {
                    size = s.len();
                }
                if s.len() < size {
                    // lua-struct names the argument after the string.
                    return Err(arg_error(lua, arg + 1, "pack", "string too short"));
                }
                out.extend_from_slice(&s[..size]);
                if opt == b's' {
                    out.push(0);
                }
            }
            _ => h.control(lua, opt, "pack")?,
        }
    }
    lua.create_string(&out)
}

fn unpack(lua: &Lua, args: &[Value]) -> mlua::Result<MultiValue> {
    let fmt = check_str(lua, args, 0, "unpack")?;
    let data = check_str(lua, args, 1, "unpack")?;
    let ld = data.len();
    let start = match args.get(2) {
        None | Some(Value::Nil) => 1.0,
        Some(_) => check_num(lua, args, 2, "unpack")?,
    } as i64;
    if start <= 0 {
        return Err(arg_error(lua, 3, "unpack", "offset must be 1 or greater"));
    }
    let mut pos = start as usize - 1;
    let mut h = format(&fmt);
    let mut out: Vec<Value> = Vec::new();
    let short = || arg_error(lua, 2, "unpack", "data string too short");
    while let Some(opt) = h.next() {
        let mut size = h.size(lua, opt)?;
        pos += h.to_align(pos, opt, size);
        if size > ld || pos > ld - size {
            return Err(short());
        }
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let bytes = &data[pos..pos + size];
                let mut l: u64 = 0;
                let mut push = |b: u8| l = (l << 8) | b as u64;
                if h.little {
                    bytes.iter().rev().for_each(|&b| push(b));
                } else {
                    bytes.iter().for_each(|&b| push(b));
                }
                let v = if opt.is_ascii_lowercase() {
                    if size > 0 && size < 8 && l & (1 << (size * 8 - 1)) != 0 {
                        l |= u64::MAX << (size * 8 - 1);
                    }
                    l as i64 as f64
                } else {
                    l as f64
                };
                out.push(Value::Number(v));
            }
            b'x' => {}
            b'f' => {
                let b: [u8; 4] = data[pos..pos + 4].try_into().expect("4 bytes");
                let f = if h.little {
                    f32::from_le_bytes(b)
                } else {
                    f32::from_be_bytes(b)
                };
                out.push(Value::Number(f as f64));
            }
            b'd' => {
                let b: [u8; 8] = data[pos..pos + 8].try_into().expect("8 bytes");
                let d = if h.little {
                    f64::from_le_bytes(b)
                } else {
                    f64::from_be_bytes(b)
                };
                out.push(Value::Number(d));
            }
            b'c' => {
                if size == 0 {
                    let prev = match out.last() {
                        Some(Value::Number(n)) => Some(*n),
                        Some(v @ Value::String(_)) => lua.coerce_number(v.clone())?,
                        _ => None,
                    };
                    let Some(n) = prev else {
                        return Err(raise_here(lua, "format 'c0' needs a previous size"));
                    };
                    out.pop();
                    size = n as usize;
                    if size > ld || pos > ld - size {
                        return Err(short());
                    }
                }
                out.push(Value::String(lua.create_string(&data[pos..pos + size])?));
            }
            b's' => {
                let Some(e) = data[pos..].iter().position(|&b| b == 0) else {
                    return Err(raise_here(lua, "unfinished string in data"));
                };
                out.push(Value::String(lua.create_string(&data[pos..pos + e])?));
                size = e + 1;
            }
            _ => h.control(lua, opt, "unpack")?,
        }
        pos += size;
    }
    out.push(Value::Number((pos + 1) as f64));
    Ok(MultiValue::from_vec(out))
}

fn size(lua: &Lua, args: &[Value]) -> mlua::Result<f64> {
    let fmt = check_str(lua, args, 0, "size")?;
    let mut h = format(&fmt);
    let mut pos = 0usize;
    while let Some(opt) = h.next() {
        let size = h.size(lua, opt)?;
        pos += h.to_align(pos, opt, size);
        if opt == b's' {
            return Err(arg_error(lua, 1, "size", "option 's' has no fixed size"));
        }
        if opt == b'c' && size == 0 {
            return Err(arg_error(lua, 1, "size", "option 'c0' has no fixed size"));
        }
        if !opt.is_ascii_alphanumeric() {
            h.control(lua, opt, "size")?;
        }
        pos += size;
    }
    Ok(pos as f64)
}
