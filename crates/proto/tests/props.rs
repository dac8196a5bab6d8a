use proptest::prelude::*;
use proto::{
    encode_request, parse_reply, parse_request, parse_request_into, peek_requests, Args, Limits,
    Parsed, Reply, Version,
};

fn small_limits() -> Limits {
    Limits {
        max_bulk_len: 1 << 20,
        max_multibulk_len: 1 << 16,
        max_inline_len: 256,
        max_query_buffer: 1 << 20,
    }
}

fn line_text() -> impl Strategy<Value = String> {
    "[ -~]{0,12}"
}

fn reply_strategy() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        line_text().prop_map(Reply::Simple),
        line_text().prop_map(Reply::Error),
        any::<i64>().prop_map(Reply::Integer),
        prop::collection::vec(any::<u8>(), 0..16).prop_map(Reply::Bulk),
        Just(Reply::Null),
        any::<f64>()
            .prop_filter("NaN never compares equal", |d| !d.is_nan())
            .prop_map(Reply::Double),
        any::<bool>().prop_map(Reply::Boolean),
        (
            prop::array::uniform3(b'a'..=b'z'),
            prop::collection::vec(any::<u8>(), 0..16)
        )
            .prop_map(|(format, text)| Reply::Verbatim { format, text }),
        "-?[1-9][0-9]{0,40}".prop_map(Reply::BigNumber),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Reply::Array),
            prop::collection::vec(inner.clone(), 0..4).prop_map(Reply::Set),
            prop::collection::vec(inner.clone(), 0..4).prop_map(Reply::Push),
            prop::collection::vec((inner.clone(), inner), 0..3).prop_map(Reply::Map),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The look-ahead sees exactly the requests the parser would return, in
    /// order, up to the first incomplete, inline or malformed one, or `max`.
    #[test]
    fn peek_agrees_with_the_parser(
        reqs in prop::collection::vec(
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..12), 0..4),
            0..8,
        ),
        tail in prop::collection::vec(any::<u8>(), 0..24),
        cut in any::<prop::sample::Index>(),
        max in 0usize..10,
    ) {
        let mut buf = Vec::new();
        for r in &reqs {
            encode_request(r, &mut buf);
        }
        buf.extend_from_slice(&tail);
        let buf = &buf[..cut.index(buf.len() + 1)];
        let mut peeked: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let n = peek_requests(buf, max, |a, b| peeked.push((a.to_vec(), b.map(|b| b.to_vec()))));
        prop_assert_eq!(n, peeked.len());
        prop_assert!(n <= max);
        let mut expect = Vec::new();
        let mut args = Args::default();
        let mut pos = 0;
        while expect.len() < max && buf.get(pos) == Some(&b'*') {
            match parse_request_into(&buf[pos..], &Limits::default(), &mut args) {
                Ok(Some(used)) => {
                    pos += used;
                    let a = args.as_slice();
                    if !a.is_empty() {
                        expect.push((a[0].clone(), a.get(1).cloned()));
                    }
                }
                _ => break,
            }
        }
        // The parser may go on where the look-ahead stops (a request it
        // accepts that the look-ahead does not try): the look-ahead's list is
        // a prefix of the parser's.
        prop_assert!(peeked.len() <= expect.len());
        prop_assert_eq!(&peeked[..], &expect[..peeked.len()]);
        // With nothing cut off and nothing after them, every request counts.
        let full = reqs.iter().map(|r| {
            let mut b = Vec::new();
            encode_request(r, &mut b);
            b.len()
        }).sum::<usize>();
        if buf.len() == full {
            let whole = reqs.iter().filter(|r| !r.is_empty()).count();
            prop_assert_eq!(peeked.len(), whole.min(max));
        }
    }

    #[test]
    fn request_parser_never_panics(buf in prop::collection::vec(any::<u8>(), 0..300)) {
        for limits in [Limits::default(), small_limits()] {
            match parse_request(&buf, &limits) {
                Parsed::Complete { consumed, .. } => {
                    prop_assert!(consumed > 0 && consumed <= buf.len());
                }
                Parsed::Incomplete | Parsed::Error(_) => {}
            }
        }
    }

    #[test]
    fn request_parser_never_panics_on_protocol_like_input(
        parts in prop::collection::vec(
            prop_oneof![
                Just(b"*".to_vec()), Just(b"$".to_vec()), Just(b"\r\n".to_vec()),
                Just(b"\r".to_vec()), Just(b"\n".to_vec()), Just(b"-1".to_vec()),
                Just(b"\"".to_vec()), Just(b"'".to_vec()), Just(b"\\x".to_vec()),
                Just(b" ".to_vec()), "[0-9]{1,3}".prop_map(String::into_bytes),
                prop::collection::vec(any::<u8>(), 0..4),
            ],
            0..40,
        )
    ) {
        let buf = parts.concat();
        if let Parsed::Complete { consumed, .. } = parse_request(&buf, &small_limits()) {
            prop_assert!(consumed > 0 && consumed <= buf.len());
        }
        let _ = parse_reply(&buf);
    }

    #[test]
    fn reply_parser_never_panics(buf in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(Some((_, consumed))) = parse_reply(&buf) {
            prop_assert!(consumed > 0 && consumed <= buf.len());
        }
    }

    #[test]
    fn multibulk_round_trip(
        args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..8),
        tail in prop::collection::vec(any::<u8>(), 0..10),
    ) {
        let mut buf = Vec::new();
        encode_request(&args, &mut buf);
        let len = buf.len();
        buf.extend_from_slice(&tail);
        prop_assert_eq!(
            parse_request(&buf, &Limits::default()),
            Parsed::Complete { args: args.clone(), consumed: len }
        );
        // Any strict prefix is incomplete.
        let cut = len / 2;
        prop_assert_eq!(parse_request(&buf[..cut], &Limits::default()), Parsed::Incomplete);
    }

    /// One `Args` reused across a pipelined stream (multibulk and inline
    /// requests of varying sizes) yields what fresh parses yield, slot reuse
    /// leaking nothing from an earlier, longer request.
    #[test]
    fn reused_args_match_fresh_parses(
        reqs in prop::collection::vec(
            (any::<bool>(), prop::collection::vec(prop::collection::vec(any::<u8>(), 0..90), 1..6)),
            1..12,
        ),
        junk in prop::collection::vec(any::<u8>(), 0..20),
    ) {
        let mut buf = Vec::new();
        for (inline, args) in &reqs {
            if *inline {
                let words: Vec<String> = args.iter().map(|a| format!("w{}", a.len())).collect();
                buf.extend_from_slice(words.join(" ").as_bytes());
                buf.extend_from_slice(b"\r\n");
            } else {
                encode_request(args, &mut buf);
            }
        }
        buf.extend_from_slice(&junk);
        let mut reused = Args::default();
        let mut pos = 0;
        loop {
            let fresh = parse_request(&buf[pos..], &small_limits());
            let r = parse_request_into(&buf[pos..], &small_limits(), &mut reused);
            match (fresh, r) {
                (Parsed::Complete { args, consumed }, Ok(Some(c))) => {
                    prop_assert_eq!(consumed, c);
                    prop_assert_eq!(args.as_slice(), reused.as_slice());
                    pos += c;
                }
                (Parsed::Incomplete, Ok(None)) => {
                    prop_assert!(reused.as_slice().is_empty());
                    break;
                }
                (Parsed::Error(e), Err(e2)) => {
                    prop_assert_eq!(e, e2);
                    break;
                }
                (f, r) => prop_assert!(false, "fresh {:?} vs reused {:?}", f, r),
            }
            reused.trim();
        }
    }

    #[test]
    fn reply_round_trip_resp3(reply in reply_strategy(), tail in prop::collection::vec(any::<u8>(), 0..4)) {
        let mut buf = reply.to_bytes(Version::Resp3);
        let len = buf.len();
        buf.extend_from_slice(&tail);
        prop_assert_eq!(parse_reply(&buf), Ok(Some((reply, len))));
        prop_assert_eq!(parse_reply(&buf[..len - 1]), Ok(None));
    }

    #[test]
    fn reply_resp2_parses(reply in reply_strategy()) {
        let buf = reply.to_bytes(Version::Resp2);
        let parsed = parse_reply(&buf);
        prop_assert!(matches!(parsed, Ok(Some((_, n))) if n == buf.len()));
    }
}
