use proto::{d2string, format_double, parse_reply, ProtoError, Reply, Version};

fn both(r: &Reply, v2: &[u8], v3: &[u8]) {
    assert_eq!(
        String::from_utf8_lossy(&r.to_bytes(Version::Resp2)),
        String::from_utf8_lossy(v2),
        "RESP2 {r:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&r.to_bytes(Version::Resp3)),
        String::from_utf8_lossy(v3),
        "RESP3 {r:?}"
    );
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

#[test]
fn encode_every_type() {
    both(&Reply::ok(), b"+OK\r\n", b"+OK\r\n");
    both(&Reply::Simple("a\r\nb".into()), b"+a  b\r\n", b"+a  b\r\n");
    both(
        &Reply::Error("ERR unknown command 'foo'".into()),
        b"-ERR unknown command 'foo'\r\n",
        b"-ERR unknown command 'foo'\r\n",
    );
    both(&Reply::Integer(-42), b":-42\r\n", b":-42\r\n");
    both(
        &Reply::Integer(i64::MIN),
        b":-9223372036854775808\r\n",
        b":-9223372036854775808\r\n",
    );
    both(&bulk("hello"), b"$5\r\nhello\r\n", b"$5\r\nhello\r\n");
    both(&bulk(""), b"$0\r\n\r\n", b"$0\r\n\r\n");
    both(&Reply::Null, b"$-1\r\n", b"_\r\n");
    both(&Reply::NullArray, b"*-1\r\n", b"_\r\n");
    both(
        &Reply::Array(vec![bulk("a"), Reply::Integer(1), Reply::Null]),
        b"*3\r\n$1\r\na\r\n:1\r\n$-1\r\n",
        b"*3\r\n$1\r\na\r\n:1\r\n_\r\n",
    );
    both(&Reply::Array(vec![]), b"*0\r\n", b"*0\r\n");
    both(
        &Reply::Map(vec![(bulk("k"), Reply::Integer(1)), (bulk("j"), bulk("v"))]),
        b"*4\r\n$1\r\nk\r\n:1\r\n$1\r\nj\r\n$1\r\nv\r\n",
        b"%2\r\n$1\r\nk\r\n:1\r\n$1\r\nj\r\n$1\r\nv\r\n",
    );
    both(
        &Reply::Set(vec![bulk("x"), bulk("y")]),
        b"*2\r\n$1\r\nx\r\n$1\r\ny\r\n",
        b"~2\r\n$1\r\nx\r\n$1\r\ny\r\n",
    );
    both(&Reply::Double(1.5), b"$3\r\n1.5\r\n", b",1.5\r\n");
    both(&Reply::Double(3.0), b"$1\r\n3\r\n", b",3\r\n");
    both(&Reply::Double(f64::INFINITY), b"$3\r\ninf\r\n", b",inf\r\n");
    both(
        &Reply::Double(f64::NEG_INFINITY),
        b"$4\r\n-inf\r\n",
        b",-inf\r\n",
    );
    both(&Reply::Double(f64::NAN), b"$3\r\nnan\r\n", b",nan\r\n");
    both(&Reply::Boolean(true), b":1\r\n", b"#t\r\n");
    both(&Reply::Boolean(false), b":0\r\n", b"#f\r\n");
    both(
        &Reply::Verbatim {
            format: *b"txt",
            text: b"Some string".to_vec(),
        },
        b"$11\r\nSome string\r\n",
        b"=15\r\ntxt:Some string\r\n",
    );
    both(
        &Reply::BigNumber("3492890328409238509324850943850943825024385".into()),
        b"$43\r\n3492890328409238509324850943850943825024385\r\n",
        b"(3492890328409238509324850943850943825024385\r\n",
    );
    both(
        &Reply::Push(vec![bulk("message"), bulk("ch"), bulk("hi")]),
        b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
        b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
    );
}

#[test]
fn double_formatting() {
    // Redis 7.0.15's replies (ZSCORE / ZRANGE WITHSCORES, RESP2) for these.
    let cases: &[(f64, &str)] = &[
        (0.0, "0"),
        (-0.0, "-0"),
        (1.0, "1"),
        (-17.0, "-17"),
        (0.1, "0.10000000000000001"),
        (12.375, "12.375"),
        (1e-5, "1.0000000000000001e-05"),
        (0.0001, "0.0001"),
        (1.5e300, "1.5000000000000001e+300"),
        (4503599627370496.0, "4503599627370496"),
        (1e17, "1e+17"),
        (123456789.125, "123456789.125"),
        (f64::INFINITY, "inf"),
        (f64::NEG_INFINITY, "-inf"),
        (2.5e-5, "2.5000000000000001e-05"),
        (99999999999999999.0, "1e+17"),
        (1234567890123456.7, "1234567890123456.8"),
    ];
    for (d, want) in cases {
        assert_eq!(&format_double(*d), want, "{d}");
    }
    // d2string (ZSCAN's scores): integers up to 2^62 printed whole.
    let cases: &[(f64, &str)] = &[
        (1e17, "100000000000000000"),
        (0.1, "0.10000000000000001"),
        (-0.0, "-0"),
        (3.0, "3"),
        (1e19, "1e+19"),
        (f64::NEG_INFINITY, "-inf"),
    ];
    for (d, want) in cases {
        assert_eq!(&d2string(*d), want, "{d}");
    }
}

fn one(buf: &[u8]) -> Reply {
    match parse_reply(buf) {
        Ok(Some((r, n))) => {
            assert_eq!(n, buf.len(), "consumed for {buf:?}");
            r
        }
        other => panic!("{buf:?}: {other:?}"),
    }
}

#[test]
fn parse_every_type() {
    assert_eq!(one(b"+OK\r\n"), Reply::ok());
    assert_eq!(one(b"-ERR x\r\n"), Reply::Error("ERR x".into()));
    assert_eq!(one(b"!5\r\nERR x\r\n"), Reply::Error("ERR x".into()));
    assert_eq!(one(b":-3\r\n"), Reply::Integer(-3));
    assert_eq!(one(b"$2\r\nhi\r\n"), bulk("hi"));
    assert_eq!(one(b"$-1\r\n"), Reply::Null);
    assert_eq!(one(b"_\r\n"), Reply::Null);
    assert_eq!(one(b"*-1\r\n"), Reply::NullArray);
    assert_eq!(one(b"*1\r\n:1\r\n"), Reply::Array(vec![Reply::Integer(1)]));
    assert_eq!(one(b"~1\r\n:1\r\n"), Reply::Set(vec![Reply::Integer(1)]));
    assert_eq!(one(b">1\r\n:1\r\n"), Reply::Push(vec![Reply::Integer(1)]));
    assert_eq!(
        one(b"%1\r\n+a\r\n:1\r\n"),
        Reply::Map(vec![(Reply::Simple("a".into()), Reply::Integer(1))])
    );
    assert_eq!(one(b",1.5\r\n"), Reply::Double(1.5));
    assert_eq!(one(b",-inf\r\n"), Reply::Double(f64::NEG_INFINITY));
    assert_eq!(one(b",1.5e+300\r\n"), Reply::Double(1.5e300));
    assert!(matches!(one(b",nan\r\n"), Reply::Double(d) if d.is_nan()));
    assert_eq!(one(b"#t\r\n"), Reply::Boolean(true));
    assert_eq!(one(b"(-123\r\n"), Reply::BigNumber("-123".into()));
    assert_eq!(
        one(b"=7\r\nmkd:# x\r\n"),
        Reply::Verbatim {
            format: *b"mkd",
            text: b"# x".to_vec()
        }
    );
    // Attributes are skipped.
    assert_eq!(one(b"|1\r\n+k\r\n+v\r\n:7\r\n"), Reply::Integer(7));
}

#[test]
fn parse_incomplete_and_errors() {
    let whole = b"*2\r\n$3\r\nfoo\r\n%1\r\n+a\r\n,2.5\r\n";
    for i in 0..whole.len() {
        assert_eq!(parse_reply(&whole[..i]), Ok(None), "prefix {i}");
    }
    assert!(parse_reply(whole).unwrap().is_some());
    assert_eq!(parse_reply(b"$536870912\r\n"), Ok(None));
    assert_eq!(parse_reply(b"*2147483647\r\n"), Ok(None));
    for bad in [
        &b"?\r\n"[..],
        b":x\r\n",
        b"$-2\r\n",
        b"$2\r\nabcd",
        b"#x\r\n",
        b",abc\r\n",
        b"(1a\r\n",
        b"=2\r\nab\r\n",
        b"+a\rb",
        b"%-1\r\n",
    ] {
        assert!(
            matches!(parse_reply(bad), Err(ProtoError::BadReply(_))),
            "{bad:?}"
        );
    }
    let deep = b"*1\r\n".repeat(1000);
    assert!(parse_reply(&deep).is_err());
}
