use proto::{encode_request, parse_request, split_args, Limits, Parsed, ProtoError};

fn parse(buf: &[u8]) -> Parsed {
    parse_request(buf, &Limits::default())
}

fn complete(buf: &[u8]) -> (Vec<Vec<u8>>, usize) {
    match parse(buf) {
        Parsed::Complete { args, consumed } => (args, consumed),
        other => panic!("expected Complete for {buf:?}, got {other:?}"),
    }
}

fn err_text(buf: &[u8], limits: &Limits) -> String {
    match parse_request(buf, limits) {
        Parsed::Error(e) => e.to_string(),
        other => panic!("expected Error for {buf:?}, got {other:?}"),
    }
}

fn v(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

#[test]
fn multibulk_basic() {
    let buf = b"*3\r\n$3\r\nSET\r\n$5\r\nmykey\r\n$7\r\nmyvalue\r\n";
    assert_eq!(complete(buf), (v(&["SET", "mykey", "myvalue"]), buf.len()));
    // Binary-safe payload containing CRLF.
    let buf = b"*1\r\n$4\r\na\r\nb\r\n";
    assert_eq!(complete(buf), (vec![b"a\r\nb".to_vec()], buf.len()));
    // Empty argument.
    assert_eq!(complete(b"*1\r\n$0\r\n\r\n"), (vec![vec![]], 10));
}

#[test]
fn empty_multibulk_is_consumed() {
    assert_eq!(complete(b"*0\r\n"), (vec![], 4));
    assert_eq!(complete(b"*-1\r\n"), (vec![], 5));
    assert_eq!(complete(b"*-7\r\nPING\r\n"), (vec![], 5));
}

#[test]
fn inline_basic() {
    assert_eq!(complete(b"PING\r\n"), (v(&["PING"]), 6));
    assert_eq!(complete(b"PING\n"), (v(&["PING"]), 5));
    assert_eq!(complete(b"  set  a   b \r\n"), (v(&["set", "a", "b"]), 15));
    // Empty lines are consumed with no arguments.
    assert_eq!(complete(b"\r\n"), (vec![], 2));
    assert_eq!(complete(b"\n"), (vec![], 1));
    assert_eq!(complete(b"   \r\nPING\r\n"), (vec![], 5));
}

#[test]
fn inline_quoting() {
    let q = |s: &[u8]| split_args(s);
    assert_eq!(q(br#"set "a b" 'c d'"#), Some(v(&["set", "a b", "c d"])));
    // \xZZ is not a hex escape: it reads as 'x' followed by "ZZ".
    assert_eq!(
        q(br#""\n\r\t\b\a\\\"\x41\x7a\xZZ\q""#),
        Some(vec![b"\n\r\t\x08\x07\\\"AzxZZq".to_vec()])
    );
    assert_eq!(q(br"'it\'s' 'a\nb'"), Some(v(&["it's", "a\\nb"])));
    assert_eq!(q(br#""" ''"#), Some(vec![vec![], vec![]]));
    // A quote opens mid-word, as in sdssplitargs.
    assert_eq!(q(br#"a"b" c"#), Some(v(&["ab", "c"])));
    assert_eq!(q(b""), Some(vec![]));
    assert_eq!(q(br#""abc"#), None);
    assert_eq!(q(br"'abc"), None);
    assert_eq!(q(br#""abc"d"#), None);
    assert_eq!(q(br"'abc'd"), None);
    assert_eq!(q(br#""ab\"#), None);
}

#[test]
fn error_texts() {
    let l = Limits::default();
    let cases: &[(&[u8], &str)] = &[
        (b"*x\r\n", "Protocol error: invalid multibulk length"),
        (b"*+1\r\n", "Protocol error: invalid multibulk length"),
        (b"*01\r\n", "Protocol error: invalid multibulk length"),
        (b"*\r\n", "Protocol error: invalid multibulk length"),
        (
            b"*2147483648\r\n",
            "Protocol error: invalid multibulk length",
        ),
        (
            b"*99999999999999999999999\r\n",
            "Protocol error: invalid multibulk length",
        ),
        (b"*1\r\n$x\r\n", "Protocol error: invalid bulk length"),
        (b"*1\r\n$-1\r\n", "Protocol error: invalid bulk length"),
        (
            b"*1\r\n$536870913\r\n",
            "Protocol error: invalid bulk length",
        ),
        (b"*1\r\nfoo\r\n", "Protocol error: expected '$', got 'f'"),
        (
            b"*2\r\n$1\r\na\r\n:1\r\n",
            "Protocol error: expected '$', got ':'",
        ),
        (
            b"SET \"a\r\n",
            "Protocol error: unbalanced quotes in request",
        ),
        (
            b"SET 'a'b\r\n",
            "Protocol error: unbalanced quotes in request",
        ),
    ];
    for (buf, want) in cases {
        assert_eq!(&err_text(buf, &l), want, "input {buf:?}");
    }

    let small = Limits {
        max_inline_len: 16,
        ..Limits::default()
    };
    assert_eq!(
        err_text(&[b'A'; 17], &small),
        "Protocol error: too big inline request"
    );
    assert_eq!(parse_request(&[b'A'; 16], &small), Parsed::Incomplete);
    let mut mb = b"*".to_vec();
    mb.extend_from_slice(&[b'1'; 16]);
    assert_eq!(
        err_text(&mb, &small),
        "Protocol error: too big mbulk count string"
    );
    let mut b = b"*1\r\n$".to_vec();
    b.extend_from_slice(&[b'1'; 16]);
    assert_eq!(
        err_text(&b, &small),
        "Protocol error: too big bulk count string"
    );

    let tight = Limits {
        max_bulk_len: 3,
        max_multibulk_len: 2,
        ..Limits::default()
    };
    assert_eq!(
        err_text(b"*1\r\n$4\r\n", &tight),
        "Protocol error: invalid bulk length"
    );
    assert_eq!(
        err_text(b"*3\r\n", &tight),
        "Protocol error: invalid multibulk length"
    );
    assert!(matches!(
        parse_request(b"*1\r\n$3\r\nabc\r\n", &tight),
        Parsed::Complete { .. }
    ));

    let qb = Limits {
        max_query_buffer: 10,
        ..Limits::default()
    };
    assert_eq!(
        parse_request(b"*1\r\n$100\r\nabc", &qb),
        Parsed::Error(ProtoError::QueryBufferLimit)
    );

    assert_eq!(
        ProtoError::InvalidBulkLength
            .to_reply()
            .to_bytes(proto::Version::Resp2),
        b"-ERR Protocol error: invalid bulk length\r\n"
    );
}

#[test]
fn incomplete_cases() {
    for buf in [
        &b""[..],
        b"*",
        b"*3",
        b"*3\r",
        b"*1\r\n",
        b"*1\r\n$",
        b"*1\r\n$3\r",
        b"*1\r\n$3\r\nab",
        b"*1\r\n$3\r\nabc",
        b"*1\r\n$3\r\nabc\r",
        b"PING",
        b"PING\r",
        b"*1\r\nfoo",
    ] {
        assert_eq!(parse(buf), Parsed::Incomplete, "input {buf:?}");
    }
}

#[test]
fn pipelining() {
    let mut buf = Vec::new();
    let reqs: Vec<Vec<Vec<u8>>> = vec![
        v(&["SET", "k", "v"]),
        v(&["GET", "k"]),
        v(&["PING"]),
        v(&["DEL", "k", "x", "y"]),
    ];
    encode_request(&reqs[0], &mut buf);
    encode_request(&reqs[1], &mut buf);
    buf.extend_from_slice(b"PING\r\n");
    encode_request(&reqs[3], &mut buf);
    buf.extend_from_slice(b"*2\r\n$3\r\nGE"); // partial tail

    let mut pos = 0;
    let mut got = Vec::new();
    loop {
        match parse(&buf[pos..]) {
            Parsed::Complete { args, consumed } => {
                assert!(consumed > 0);
                pos += consumed;
                got.push(args);
            }
            Parsed::Incomplete => break,
            Parsed::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, reqs);
    assert_eq!(&buf[pos..], b"*2\r\n$3\r\nGE");
}

#[test]
fn split_delivery_byte_by_byte() {
    let mut whole = Vec::new();
    encode_request(&[&b"SET"[..], b"key", b"a\r\nbinary\x00value"], &mut whole);
    let inline = b"set \"a\\x41\" 'b c'\r\n".to_vec();
    for req in [whole, inline] {
        let expected = parse(&req);
        assert!(matches!(expected, Parsed::Complete { consumed, .. } if consumed == req.len()));
        for i in 0..req.len() {
            assert_eq!(parse(&req[..i]), Parsed::Incomplete, "prefix {i}");
        }
        assert_eq!(parse(&req), expected);
    }
}

#[test]
fn huge_announced_lengths_cost_nothing() {
    // 512 MiB bulk announced, nothing sent.
    let buf = b"*2\r\n$3\r\nSET\r\n$536870912\r\n";
    assert_eq!(parse(buf), Parsed::Incomplete);
    // A few bytes of the payload: still incomplete.
    let mut buf2 = buf.to_vec();
    buf2.extend_from_slice(&[b'x'; 1000]);
    assert_eq!(parse(&buf2), Parsed::Incomplete);
    // Huge argument count with nothing behind it.
    assert_eq!(parse(b"*2147483647\r\n"), Parsed::Incomplete);
    assert_eq!(parse(b"*2147483647\r\n$1\r\na\r\n"), Parsed::Incomplete);
}

#[test]
fn redis_skips_the_two_bytes_after_a_bulk() {
    // Redis does not verify the CRLF after a payload; neither do we.
    assert_eq!(complete(b"*1\r\n$1\r\naXY"), (v(&["a"]), 11));
}
