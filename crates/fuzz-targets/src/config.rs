//! The `config` target: the redis.conf-syntax file parser
//! ([`Config::apply_text`], what `--config FILE` runs) and the directive
//! parser that `CONFIG SET` and the flags go through ([`Config::apply`]).
//!
//! The input is parsed as a config file (lines whose first word is `include`
//! are left out: they name other files to read, and the fuzzer must not make
//! the parser read `/dev/zero`), then, from its first bytes, as a sequence of
//! `CONFIG SET name value` pairs with names mostly taken from the parameter
//! lists. Checked: parsing returns a value or an error, and a parameter
//! CONFIG SET accepted reads back (CONFIG GET) as a value that CONFIG SET
//! accepts again and that reads back unchanged.

use arbitrary::Unstructured;
use server::config::{Config, HONOURED, NO_EFFECT};
use std::path::Path;

/// The `config` target (see the module documentation).
pub fn config(data: &[u8]) {
    let text = without_includes(data);
    let mut c = Config::default();
    let _ = c.apply_text(&text, Path::new("fuzz.conf"));

    let mut c = Config::default();
    let mut u = Unstructured::new(data);
    for _ in 0..8 {
        if u.is_empty() {
            break;
        }
        let name = pick_name(&mut u);
        let value = pick_value(&mut u);
        if c.apply(&name, std::slice::from_ref(&value)).is_err() {
            continue;
        }
        let name = name.to_ascii_lowercase();
        let Some(shown) = c.get(&name) else {
            continue;
        };
        if let Err(e) = c.apply(&name, std::slice::from_ref(&shown)) {
            panic!("CONFIG SET {name} {value:?} was accepted, but its CONFIG GET value {shown:?} is refused: {e}");
        }
        assert_eq!(
            c.get(&name).as_deref(),
            Some(shown.as_str()),
            "CONFIG SET {name} of its own CONFIG GET value {shown:?} changed it"
        );
    }
}

/// The text without the lines an `include` directive starts.
fn without_includes(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    for line in data.split(|&b| b == b'\n') {
        let first = proto::split_args(line.trim_ascii())
            .and_then(|w| w.into_iter().next())
            .unwrap_or_default();
        if !first.eq_ignore_ascii_case(b"include") {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
    }
    out
}

fn pick_name(u: &mut Unstructured) -> String {
    let k: u8 = u.arbitrary().unwrap_or(0);
    let i = usize::from(k >> 2);
    match k & 3 {
        0 | 1 => HONOURED[i % HONOURED.len()].0.to_string(),
        2 => NO_EFFECT[i % NO_EFFECT.len()].to_string(),
        _ => short_text(u),
    }
}

/// Values that parameters take, or bytes from the input.
fn pick_value(u: &mut Unstructured) -> String {
    const VALUES: &[&str] = &[
        "0",
        "1",
        "-1",
        "yes",
        "no",
        "local",
        "1mb",
        "1gb",
        "64kb",
        "1k",
        "18446744073709551615",
        "18446744073709551616",
        "127.0.0.1 ::1",
        "-::1",
        "bullet",
        "direct-phash",
        "msync",
        "",
        " ",
    ];
    let k: u8 = u.arbitrary().unwrap_or(0);
    if k < 128 {
        VALUES[usize::from(k) % VALUES.len()].to_string()
    } else {
        short_text(u)
    }
}

fn short_text(u: &mut Unstructured) -> String {
    let n = u.int_in_range(0..=24).unwrap_or(0);
    String::from_utf8_lossy(u.bytes(n).unwrap_or_default()).into_owned()
}
