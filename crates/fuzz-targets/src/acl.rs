//! The `acl` target: ACL rules as ACL SETUSER and `user` directives give
//! them. The input's first line is a user name, the rest the rules
//! (space-separated words, selectors in parentheses). Parsing returns a user
//! or an error; a user is then described (ACL LIST), its description parsed
//! again, and both users asked whether they allow a few requests: the
//! description must rebuild a user with the same rights.

use server::acl::parse_rules;
use server::cmd::lookup;

/// Requests both users are asked about: commands with and without keys,
/// subcommands, a key that patterns may or may not match.
const PROBES: &[&[&[u8]]] = &[
    &[b"get", b"k"],
    &[b"set", b"user:1", b"v"],
    &[b"set", b"k", b"v", b"get"],
    &[b"mset", b"a", b"1", b"b", b"2"],
    &[b"config", b"get", b"port"],
    &[b"hset", b"h", b"f", b"v"],
    &[b"sintercard", b"2", b"s1", b"s2"],
    &[b"ping"],
    &[b"flushall"],
];

pub fn acl(data: &[u8]) {
    let (name, rules) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"u"[..], data),
    };
    let Ok(user) = parse_rules(name, rules) else {
        return;
    };
    let desc = user.describe();
    let Ok(again) = parse_rules(name, &desc) else {
        // Redis itself writes some rule lists it cannot read back (a `%RW~`
        // pattern followed by others); the describe of such a user is not
        // required to parse.
        return;
    };
    for p in PROBES {
        let args: Vec<Vec<u8>> = p.iter().map(|a| a.to_vec()).collect();
        let Some(i) = lookup(&args[0]) else { continue };
        assert_eq!(
            user.check(i, &args).is_ok(),
            again.check(i, &args).is_ok(),
            "{:?} rebuilt from {:?} decides {:?} differently",
            String::from_utf8_lossy(rules),
            String::from_utf8_lossy(&desc),
            p
        );
    }
}
