//! Redis's glob patterns (`stringmatchlen` in Redis's util.c), matched in
//! time polynomial in the pattern and subject lengths.
//!
//! Every command that takes a pattern (KEYS, SCAN MATCH, CONFIG GET, COMMAND
//! LIST FILTERBY PATTERN, and later PSUBSCRIBE, ACL key and channel patterns,
//! HSCAN/SSCAN/ZSCAN MATCH) matches with [`Glob`]: compile the pattern once,
//! then [`Glob::matches`] each subject.
//!
//! Syntax, as Redis reads it, byte by byte:
//! - `*` matches any run of bytes (consecutive stars are one star);
//! - `?` matches one byte;
//! - `[...]` matches one byte in the class, `[^...]` one byte not in it. In a
//!   class, `\c` is the byte `c` (compared exactly, also in nocase mode), `a-z`
//!   a range (the ends may come in either order; they compare as C `char`s,
//!   which are signed, so bytes >= 0x80 sort below `\0`; an end may be `]`
//!   or `\`), and any other `]` ends the class, also right after `[` or `[^`
//!   (`[]` matches nothing, `[^]` any byte). A class the pattern ends in
//!   without its `]` ends with the pattern;
//! - `\c` outside a class is the byte `c`; a `\` that ends the pattern is
//!   itself;
//! - any other byte is itself.
//!
//! In nocase mode bytes compare after ASCII lower-casing (C's `tolower` in
//! the C locale); range ends are lower-cased after they are put in order.
//!
//! Two quirks of Redis are kept, so that replies are the same: the empty
//! subject matches only the empty pattern (`*` does not match ""; KEYS and
//! SCAN treat the pattern `*` apart), and a pattern whose match would pass
//! more than 1000 star groups that do not end the pattern matches nothing
//! (Redis's recursion depth limit, `MAX_STAR_GROUPS`: every match passes
//! each star group in turn, so the limit is a property of the pattern alone).
//!
//! Matching is the iterative algorithm that remembers only the last star:
//! when a later token fails, the last star takes one more byte and matching
//! resumes after it. An earlier star never needs to take more, because the
//! tokens between two stars each match exactly one byte: whatever an
//! earlier star could take, the last star can take instead. Each retry
//! advances the star's start by one byte, so the work is at most (subject
//! length + 1) x (tokens), with no recursion. Redis's recursive matcher
//! backtracked over every star (CVE-2022-36021) and bounds it differently.

/// One step of a compiled pattern. Every token but `Star` matches exactly
/// one byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    /// One or more consecutive `*`.
    Star,
    /// `?`.
    Any,
    /// A literal byte (already lower-cased in nocase mode).
    Byte(u8),
    /// A class: an index into `Glob::classes`.
    Class(u32),
}

/// Redis's recursion limit: the match of a pattern whose star groups, not
/// counting one that ends the pattern, number more than this fails.
const MAX_STAR_GROUPS: usize = 1000;

/// A compiled glob pattern.
#[derive(Clone, Debug)]
pub struct Glob {
    tokens: Vec<Token>,
    /// 256-bit membership sets of the classes, negation applied.
    classes: Vec<[u64; 4]>,
    nocase: bool,
    /// The pattern is empty (the only pattern matching the empty subject).
    empty: bool,
    /// Over Redis's star-group limit: matches nothing.
    dead: bool,
}

/// ASCII lower-casing of a byte taken as a C `char` value: what `tolower`
/// does in the C locale (bytes >= 0x80 are negative `char`s, unchanged).
fn lower_c(c: i32) -> i32 {
    if (i32::from(b'A')..=i32::from(b'Z')).contains(&c) {
        c + 32
    } else {
        c
    }
}

fn set_bit(set: &mut [u64; 4], b: u8) {
    set[usize::from(b >> 6)] |= 1u64 << (b & 63);
}

fn has_bit(set: &[u64; 4], b: u8) -> bool {
    set[usize::from(b >> 6)] & (1u64 << (b & 63)) != 0
}

impl Glob {
    /// Compiles `pattern`; `nocase` folds ASCII case (CONFIG GET, COMMAND
    /// LIST) as Redis's `nocase` argument does.
    pub fn new(pattern: &[u8], nocase: bool) -> Glob {
        let p = pattern;
        let mut tokens = Vec::new();
        let mut classes = Vec::new();
        let mut i = 0;
        while i < p.len() {
            match p[i] {
                b'*' => {
                    while i < p.len() && p[i] == b'*' {
                        i += 1;
                    }
                    tokens.push(Token::Star);
                    continue;
                }
                b'?' => tokens.push(Token::Any),
                b'[' => {
                    i += 1;
                    let negated = p.get(i) == Some(&b'^');
                    if negated {
                        i += 1;
                    }
                    let mut set = [0u64; 4];
                    // Items until `]` (consumed below) or the pattern's end.
                    while i < p.len() && p[i] != b']' {
                        if p[i] == b'\\' && i + 1 < p.len() {
                            // Escaped: this exact byte, whatever the case mode.
                            i += 1;
                            set_bit(&mut set, p[i]);
                        } else if i + 2 < p.len() && p[i + 1] == b'-' {
                            // A range: its end may be any byte, `]` and `\` too.
                            let (a, z) = (i32::from(p[i] as i8), i32::from(p[i + 2] as i8));
                            let (mut lo, mut hi) = (a.min(z), a.max(z));
                            if nocase {
                                lo = lower_c(lo);
                                hi = lower_c(hi);
                            }
                            for b in 0..=255u8 {
                                let mut c = i32::from(b as i8);
                                if nocase {
                                    c = lower_c(c);
                                }
                                if lo <= c && c <= hi {
                                    set_bit(&mut set, b);
                                }
                            }
                            i += 2;
                        } else if nocase {
                            let l = p[i].to_ascii_lowercase();
                            set_bit(&mut set, l);
                            set_bit(&mut set, l.to_ascii_uppercase());
                        } else {
                            set_bit(&mut set, p[i]);
                        }
                        i += 1;
                    }
                    if negated {
                        for w in &mut set {
                            *w = !*w;
                        }
                    }
                    tokens.push(Token::Class(classes.len() as u32));
                    classes.push(set);
                    // `i` is at the `]` (skipped below) or at the end.
                }
                b'\\' if i + 1 < p.len() => {
                    i += 1;
                    tokens.push(Token::Byte(Self::fold(p[i], nocase)));
                }
                c => tokens.push(Token::Byte(Self::fold(c, nocase))),
            }
            i += 1;
        }
        let stars = tokens.iter().filter(|t| **t == Token::Star).count();
        let trailing = tokens.last() == Some(&Token::Star);
        Glob {
            dead: stars - usize::from(trailing) > MAX_STAR_GROUPS,
            tokens,
            classes,
            nocase,
            empty: pattern.is_empty(),
        }
    }

    fn fold(b: u8, nocase: bool) -> u8 {
        if nocase {
            b.to_ascii_lowercase()
        } else {
            b
        }
    }

    /// Whether a one-byte token matches `b`.
    #[inline]
    fn one(&self, t: Token, b: u8) -> bool {
        match t {
            Token::Any => true,
            Token::Byte(c) => Self::fold(b, self.nocase) == c,
            Token::Class(k) => has_bit(&self.classes[k as usize], b),
            Token::Star => false,
        }
    }

    /// Whether `s` matches the pattern. At most (`s.len()` + 1) x tokens
    /// steps.
    pub fn matches(&self, s: &[u8]) -> bool {
        if s.is_empty() {
            return self.empty;
        }
        if self.dead {
            return false;
        }
        let t = &self.tokens;
        let (mut ti, mut si) = (0usize, 0usize);
        // The token after the last star passed, and where in `s` its match
        // is being tried (the star took the bytes before it).
        let mut resume: Option<(usize, usize)> = None;
        while si < s.len() {
            if ti < t.len() {
                if t[ti] == Token::Star {
                    ti += 1;
                    if ti == t.len() {
                        // A final star takes whatever is left.
                        return true;
                    }
                    resume = Some((ti, si));
                    continue;
                }
                if self.one(t[ti], s[si]) {
                    ti += 1;
                    si += 1;
                    continue;
                }
            }
            // A mismatch, or pattern left over bytes: the last star takes one
            // more byte.
            let Some((rt, rs)) = resume else {
                return false;
            };
            resume = Some((rt, rs + 1));
            ti = rt;
            si = rs + 1;
        }
        t[ti..].iter().all(|t| *t == Token::Star)
    }
}

/// Whether `s` matches `pattern` (compiles it each call; a caller matching
/// many subjects compiles a [`Glob`] once).
pub fn glob_match(pattern: &[u8], s: &[u8], nocase: bool) -> bool {
    Glob::new(pattern, nocase).matches(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: Redis's semantics read straight off the pattern bytes,
    /// recursing at every star over every split (exponential; small inputs
    /// only). `stars` counts the star groups entered, for Redis's limit.
    fn reference(p: &[u8], s: &[u8], nocase: bool) -> bool {
        if s.is_empty() {
            return p.is_empty();
        }
        rec(p, s, nocase, 0)
    }

    fn low(b: u8) -> u8 {
        b.to_ascii_lowercase()
    }

    /// `s` is not empty here.
    fn rec(p: &[u8], s: &[u8], nocase: bool, stars: usize) -> bool {
        let Some(&first) = p.first() else {
            return false;
        };
        let same = |a: u8, b: u8| if nocase { low(a) == low(b) } else { a == b };
        // What one byte consumes: the pattern after the token, and whether
        // s[0] matched it.
        let (rest, ok): (&[u8], bool) = match first {
            b'*' => {
                let mut q = p;
                while q.first() == Some(&b'*') {
                    q = &q[1..];
                }
                if q.is_empty() {
                    return true;
                }
                if stars + 1 > MAX_STAR_GROUPS {
                    return false;
                }
                return (0..s.len()).any(|k| rec(q, &s[k..], nocase, stars + 1));
            }
            b'?' => (&p[1..], true),
            b'[' => {
                let mut q = &p[1..];
                let neg = q.first() == Some(&b'^');
                if neg {
                    q = &q[1..];
                }
                let c = s[0];
                let mut hit = false;
                loop {
                    match q {
                        [] => break,
                        [b']', tail @ ..] => {
                            q = tail;
                            break;
                        }
                        [b'\\', e, tail @ ..] => {
                            hit |= *e == c;
                            q = tail;
                        }
                        [a, b'-', z, tail @ ..] => {
                            let (a, z, mut x) = (*a as i8 as i32, *z as i8 as i32, c as i8 as i32);
                            let (mut a, mut z) = if a <= z { (a, z) } else { (z, a) };
                            if nocase {
                                a = lower_c(a);
                                z = lower_c(z);
                                x = lower_c(x);
                            }
                            hit |= a <= x && x <= z;
                            q = tail;
                        }
                        [b, tail @ ..] => {
                            hit |= same(*b, c);
                            q = tail;
                        }
                    }
                }
                (q, hit != neg)
            }
            b'\\' if p.len() >= 2 => (&p[2..], same(p[1], s[0])),
            b => (&p[1..], same(b, s[0])),
        };
        if !ok {
            return false;
        }
        let s = &s[1..];
        if s.is_empty() {
            return rest.iter().all(|&b| b == b'*');
        }
        rec(rest, s, nocase, stars)
    }

    fn m(p: &str, s: &str) -> bool {
        glob_match(p.as_bytes(), s.as_bytes(), false)
    }

    #[test]
    fn like_redis() {
        assert!(m("*", "abc"));
        assert!(m("a*c", "abbbc"));
        assert!(!m("a*c", "abbb"));
        assert!(m("h?llo", "hello"));
        assert!(!m("h?llo", "hllo"));
        assert!(m("h[ae]llo", "hallo"));
        assert!(!m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo"));
        assert!(!m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo"));
        assert!(m("h[b-a]llo", "hallo"), "reversed range");
        assert!(m("a\\*b", "a*b"));
        assert!(!m("a\\*b", "axb"));
        assert!(m("key:*:x", "key:12:x"));
        assert!(glob_match(b"HeLLo", b"hello", true));
        assert!(!glob_match(b"HeLLo", b"hello", false));
        assert!(!m("abc", "abcd"));
        assert!(!m("abcd", "abc"));
        assert!(m("a**", "a"));
        assert!(m("a*", "a"));
        assert!(m("*a", "a"));
        assert!(m("*a*", "xay"));
        assert!(!m("*a*", "xy"));
    }

    #[test]
    fn empty_subject_and_pattern() {
        assert!(m("", ""));
        assert!(!m("*", ""), "Redis: only the empty pattern matches \"\"");
        assert!(!m("**", ""));
        assert!(!m("", "a"));
    }

    #[test]
    fn classes_edges() {
        // `]` first closes the class: `[]` matches nothing, `[^]` anything.
        assert!(!m("[]", "a"));
        assert!(!m("[]", "]"));
        assert!(!m("[]]", "]"), "an empty class, then a literal ]");
        assert!(!m("[]]", "]]"));
        assert!(!m("[]a]", "a"));
        assert!(m("[^]", "x"));
        assert!(m("[^]", "]"));
        assert!(m("[^]a", "xa"));
        // Unterminated classes end with the pattern.
        assert!(m("[abc", "b"));
        assert!(!m("[abc", "d"));
        assert!(!m("[", "["), "a lone [ is an empty class");
        assert!(!m("a[", "a"));
        assert!(m("[^", "x"), "a lone [^ matches any byte");
        assert!(m("a[^", "ab"));
        assert!(!m("a[^", "a"));
        // Escapes in a class; a range can end in ] or \.
        assert!(m("[\\]]", "]"));
        assert!(m("[\\^a]", "^"));
        assert!(m("[\\-]", "-"));
        assert!(!m("[\\-]", "\\"));
        // One class: the range a-] (0x5d..=0x61), then x, then its ].
        assert!(m("[a-]x]y", "]y"));
        assert!(m("[a-]x]y", "_y"));
        assert!(m("[a-]x]y", "ay"));
        assert!(m("[a-]x]y", "xy"));
        assert!(!m("[a-]x]y", "by"));
        assert!(!m("[a-]x]y", "-y"));
        assert!(m("[Z-\\]", "\\"), "range Z-\\ and no ] (unterminated)");
        assert!(m("[-a]", "-"));
        // `[a-]` is the range a-] (unterminated), not a and -.
        assert!(!m("[a-]", "-"));
        assert!(m("[a-]", "a"));
        assert!(m("[a-]", "_"));
        assert!(!m("[a-]", "b"));
        // Only a - with fewer than two bytes after it is a literal.
        assert!(m("[a-", "-"));
        assert!(m("[a-", "a"));
        assert!(!m("[a-", "b"));
        // A trailing backslash in a class is a literal.
        assert!(m("[\\", "\\"));
        // Other specials are literals in a class.
        assert!(m("[*?]", "*"));
        assert!(m("[*?]", "?"));
        assert!(!m("[*?]", "a"));
        assert!(m("[^a-c]", "d"));
        assert!(!m("[^a-c]", "b"));
    }

    #[test]
    fn escapes_outside_classes() {
        assert!(m("\\?", "?"));
        assert!(!m("\\?", "a"));
        assert!(m("\\[a]", "[a]"));
        assert!(m("a\\", "a\\"), "a trailing backslash is itself");
        assert!(m("\\\\", "\\"));
        assert!(m("\\a", "a"));
    }

    #[test]
    fn nocase() {
        let n = |p: &str, s: &str| glob_match(p.as_bytes(), s.as_bytes(), true);
        assert!(n("maxCLIENTS", "maxclients"));
        assert!(n("MAX*", "maxclients"));
        assert!(n("[A-C]x", "bX"));
        assert!(n("[a-c]x", "BX"));
        assert!(n("[Q]", "q"));
        assert!(n("\\Q", "q"), "an escape outside a class folds case");
        assert!(!n("[\\Q]", "q"), "an escape inside a class is exact");
        assert!(n("[\\Q]", "Q"));
        // Range ends fold after ordering: Z-a becomes z..a, empty.
        assert!(!n("[Z-a]", "_"));
        assert!(m("[Z-a]", "_"));
        // Only ASCII folds.
        assert!(!glob_match(b"\xc0", b"\xe0", true));
    }

    #[test]
    fn high_bytes_are_signed_chars() {
        assert!(!glob_match(b"[a-\xff]", b"\x80", false));
        assert!(glob_match(b"[\x80-a]", b"\xff", false));
        assert!(glob_match(b"[\x80-a]", b"\0", false));
        assert!(glob_match(b"[\x80-a]", b"a", false));
        assert!(!glob_match(b"[\x80-a]", b"b", false));
        assert!(glob_match(b"[\xff-\x80]", b"\x90", false));
        assert!(glob_match(b"?", b"\xff", false));
        assert!(glob_match(b"\xfe*", b"\xfe\x00", false));
    }

    #[test]
    fn redis_star_group_limit() {
        // 1000 groups that do not end the pattern are passed; 1001 are not.
        let p = |groups: usize, tail: &str| format!("{}{tail}", "*a".repeat(groups));
        let s = "a".repeat(1100);
        assert!(m(&p(1000, ""), &s));
        assert!(m(&p(1000, "*"), &s), "a 1001st group ending the pattern");
        assert!(!m(&p(1001, ""), &s));
        assert!(!m(&p(1001, "*"), &s));
        // Stars in classes or escaped are not groups.
        assert!(m(&format!("{}[*]", "*a".repeat(1000)), &format!("{s}*")));
        assert!(m(&format!("{}\\*", "*a".repeat(1000)), &format!("{s}*")));
        assert!(!m(
            &"*".repeat(2000).replace("**", "*a"),
            "b".repeat(10).as_str()
        ));
    }

    /// Patterns that make an exponential backtracker retry every split at
    /// every star. Here it is (key length + 1) x tokens steps.
    #[test]
    fn adversarial_patterns_are_fast() {
        let t = std::time::Instant::now();
        let key = "a".repeat(40);
        assert!(!m(&format!("{}b", "a*".repeat(20)), &key));
        let long = "a".repeat(100_000);
        assert!(!m(&format!("{}b", "*a".repeat(1000)), &long));
        assert!(m(&format!("{}*", "*a".repeat(1000)), &long));
        assert!(!glob_match(
            format!("{}b", "*?".repeat(500)).as_bytes(),
            long.as_bytes(),
            true
        ));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn compiled_pattern_is_reusable() {
        let g = Glob::new(b"user:[0-9]*", false);
        assert!(g.matches(b"user:1"));
        assert!(g.matches(b"user:42:name"));
        assert!(!g.matches(b"user:x"));
        assert!(!g.matches(b""));
        assert!(Glob::new(b"", false).matches(b""));
    }

    /// Patterns and subjects from a small alphabet holding every special
    /// byte, a letter in both cases and a high byte.
    fn alphabet() -> impl Strategy<Value = u8> {
        prop::sample::select(vec![
            b'a', b'b', b'A', b'-', b'*', b'?', b'[', b']', b'^', b'\\', 0xe1,
        ])
    }

    /// Pattern pieces, each with subject pieces it matches or nearly does.
    type Piece = (&'static [u8], &'static [&'static [u8]]);
    const PIECES: &[Piece] = &[
        (b"a", &[b"a", b"A", b"b"]),
        (b"b", &[b"b", b"B"]),
        (b"A", &[b"A", b"a"]),
        (b"*", &[b"", b"a", b"ab", b"]-"]),
        (b"**", &[b"", b"b"]),
        (b"?", &[b"a", b"\xe1", b"?"]),
        (b"[", &[b"[", b"a", b""]),
        (b"]", &[b"]"]),
        (b"^", &[b"^", b""]),
        (b"-", &[b"-", b""]),
        (b"\\", &[b"\\", b"a", b""]),
        (b"\xe1", &[b"\xe1", b"\xc1"]),
        (b"[ab]", &[b"a", b"b", b"B", b"c"]),
        (b"[^a]", &[b"a", b"A", b"b"]),
        (b"[a-b]", &[b"a", b"B", b"c"]),
        (b"[b-a]", &[b"a", b"b", b"c"]),
        (b"[A-b]", &[b"_", b"a", b"B", b"c", b"Z", b"z"]),
        (b"[Z-a]", &[b"_", b"z", b"Z", b"a", b"A"]),
        (b"[\\A]", &[b"a", b"A"]),
        (b"[\\]]", &[b"]", b"\\"]),
        (b"[]", &[b"a", b"]"]),
        (b"[^]", &[b"x", b"]"]),
        (b"[a-]", &[b"a", b"-", b"_", b"]"]),
        (b"[^-a]", &[b"-", b"a", b"b"]),
        (b"[]a]", &[b"a", b"]"]),
        (b"\\*", &[b"*", b"a"]),
        (b"\\a", &[b"a", b"A"]),
        (b"\\A", &[b"a", b"A"]),
        (b"\\[", &[b"["]),
        (b"[\x80-a]", &[b"\x00", b"\xff", b"a", b"b"]),
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        #[test]
        fn matches_the_reference(
            p in prop::collection::vec(alphabet(), 0..10),
            s in prop::collection::vec(alphabet(), 0..8),
            nocase in any::<bool>(),
        ) {
            prop_assert_eq!(
                Glob::new(&p, nocase).matches(&s),
                reference(&p, &s, nocase),
                "pattern {:?} subject {:?} nocase {}",
                String::from_utf8_lossy(&p),
                String::from_utf8_lossy(&s),
                nocase
            );
        }

        /// Patterns assembled from pieces that exercise each rule (classes,
        /// ranges in both orders and across cases, escapes in and out of
        /// classes, `]` and `-` in odd places, raw special bytes), and
        /// subjects assembled from bytes each piece matches or nearly
        /// matches, so that both answers are common.
        #[test]
        fn matches_the_reference_on_structured_patterns(
            picks in prop::collection::vec(
                (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
                0..7,
            ),
            edit in prop::option::of((any::<prop::sample::Index>(), any::<u8>())),
            nocase in any::<bool>(),
        ) {
            let (mut p, mut s) = (Vec::new(), Vec::new());
            for (piece, cand) in &picks {
                let (pat, cands) = PIECES[piece.index(PIECES.len())];
                p.extend_from_slice(pat);
                s.extend_from_slice(cands[cand.index(cands.len())]);
            }
            if let Some((at, b)) = edit {
                // One byte inserted or removed.
                let at = at.index(s.len() + 1);
                if b & 1 == 0 || at == s.len() {
                    s.insert(at, b);
                } else {
                    s.remove(at);
                }
            }
            prop_assert_eq!(
                Glob::new(&p, nocase).matches(&s),
                reference(&p, &s, nocase),
                "pattern {:?} subject {:?} nocase {}",
                String::from_utf8_lossy(&p),
                String::from_utf8_lossy(&s),
                nocase
            );
        }
    }
}
