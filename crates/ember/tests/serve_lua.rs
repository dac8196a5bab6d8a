//! Lua scripting and functions against a real redis-server 7.0: the same
//! EVAL/FCALL/SCRIPT/FUNCTION requests give the same replies, error texts
//! included, in RESP2 and RESP3 (conversions both ways, pcall errors, the
//! globals protection, cjson, cmsgpack, struct and bit, the redis.* API,
//! shebang flags,
//! read-only scripts, register_function's checks). Then what only Ember
//! can show: function libraries survive a restart and a SIGKILL; a script's
//! writes are isolated from other workers and all-or-nothing across a
//! SIGKILL; a script past busy-reply-threshold makes other workers answer
//! BUSY until SCRIPT KILL stops it (UNKILLABLE once it wrote), and so does
//! the script's own worker for its other connections; redis-py's
//! Lock and register_script work.

mod serve_common;

use proto::{encode_request, parse_reply, Reply};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serve_common::redis_server::{reply_int, Conn, RedisServer};
use serve_common::Server;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests sent to both servers in order (scripts first set up their
/// keys). Each is compared reply for reply.
const CASES: &[&[&str]] = &[
    // Errors and their positions.
    &["EVAL", "x = 5", "0"],
    &["EVAL", "return y", "0"],
    &["EVAL", "return redis.call('nosuch')", "0"],
    &["EVAL", "return redis.call('get','a','b')", "0"],
    &["EVAL", "return redis.pcall('get','a','b')", "0"],
    &["EVAL", "error('boom')", "0"],
    &["EVAL", "error({err='MY x'})", "0"],
    &["EVAL", "local a = 1\nlocal b = 2\nerror('line three')", "0"],
    &["SET", "s", "abc"],
    &["EVAL", "return redis.call('incr', 's')", "0"],
    &["EVAL", "return redis.call('lpush', 's', 1)", "0"],
    &["EVAL", "return redis.call('eval','return 1',0)", "0"],
    &["EVAL", "return redis.call('hello')", "0"],
    &["EVAL", "return redis.call('function', 'flush')", "0"],
    &["EVAL", "return redis.call('script', 'kill')", "0"],
    &["EVAL", "return redis.pcall('client', 'id')", "0"],
    &["EVAL", "return redis.call('multi')", "0"],
    &["MULTI"],
    &["EVAL", "return redis.call('incr', KEYS[1])", "1", "m"],
    &["EVAL", "return redis.call('incr', 'undeclared_m')", "0"],
    &["EXEC"],
    &["EVAL", "return redis.call('set', 'f', true)", "0"],
    &["EVAL", "return redis.call()", "0"],
    &["EVAL", "return 'a' .. ", "0"],
    &["EVAL", "string.x = 1", "0"],
    &["EVAL", "return rawset(_G, 'x', 1)", "0"],
    &["EVAL", "_G.x = 1", "0"],
    &["EVAL", "loadstring('x = 1')()", "0"],
    &["EVAL", "return print", "0"],
    &["EVAL", "return os", "0"],
    &["EVAL", "return type(loadstring)", "0"],
    &["EVAL", "return loadstring('return 7')()", "0"],
    &["EVALSHA", "aaa", "0"],
    &["EVALSHA", "ffffffffffffffffffffffffffffffffffffffff", "0"],
    &["EVAL", "return coroutine.wrap(function() return redis.call('ping') end)()", "0"],
    &["EVAL", "local co = coroutine.create(function() error('in co') end) return {coroutine.resume(co)}", "0"],
    &["EVAL", "local function f(n) if n == 0 then return 0 end return 1 + f(n-1) end return f(10000)", "0"],
    &["EVAL", "return getmetatable('').__index", "0"],
    &["EVAL", "return setmetatable(_G, nil)", "0"],
    &["EVAL", "local t = setmetatable({}, {__index = function() return 5 end}) return t.x", "0"],
    &["EVAL", "local ok, e = xpcall(function() error('x') end, function(e) return 'handled ' .. e end) return e", "0"],
    &["EVAL", "redis.call('select', 1) redis.call('set', 'indb1', 'x') return redis.call('get', 'indb1')", "0"],
    &["GET", "indb1"],
    &["EVAL", "return {math.huge, -math.huge, 0/0}", "0"],
    &["FUNCTION", "LOAD", "#!lua name=inf\nwhile true do end"],
    // Conversions.
    &["EVAL", "return {1,2,3.7,'x',nil,4}", "0"],
    &["EVAL", "return {err='x'}", "0"],
    &["EVAL", "return redis.error_reply('x')", "0"],
    &["EVAL", "return redis.error_reply('-CODE x')", "0"],
    &["EVAL", "return redis.status_reply('fine')", "0"],
    &["EVAL", "return {ok='fine'}", "0"],
    &["EVAL", "return true", "0"],
    &["EVAL", "return false", "0"],
    &["EVAL", "return nil", "0"],
    &["EVAL", "return -3.99", "0"],
    &["EVAL", "return {double=1.5}", "0"],
    &["EVAL", "return {big_number='123456789012345678901234567890'}", "0"],
    &["EVAL", "return {verbatim_string={format='txt', string='hello'}}", "0"],
    &["EVAL", "return {map={a=1}}", "0"],
    &["EVAL", "return {set={a=true}}", "0"],
    &["EVAL", "return redis.call('get','nokey') == false", "0"],
    &["HSET", "h", "f", "v"],
    &["SADD", "st", "a"],
    &["ZADD", "z", "1.5", "a"],
    &["EVAL", "return redis.call('hgetall', 'h')", "0"],
    &["EVAL", "redis.setresp(3) return redis.call('hgetall', 'h')", "0"],
    &["EVAL", "redis.setresp(3) return redis.call('smembers', 'st')", "0"],
    &["EVAL", "redis.setresp(3) return redis.call('zscore', 'z', 'a')", "0"],
    &["EVAL", "redis.setresp(3) return redis.call('get','nokey') == nil", "0"],
    &["EVAL", "redis.setresp(3) return {1, true, false, {map={x=2}}}", "0"],
    &["EVAL", "redis.setresp(3) return redis.pcall('incr', 'st')", "0"],
    &["EVAL", "redis.setresp(3) local r = redis.call('hgetall', 'h') return r.map.f", "0"],
    &["EVAL", "return redis.setresp(4)", "0"],
    &["EVAL", "return redis.call('set', 'f', 0.1)", "0"],
    &["GET", "f"],
    &["EVAL", "return {KEYS[1], KEYS[2], ARGV[1], #ARGV}", "2", "k1", "k2", "a1"],
    // pcall and the API.
    &["EVAL", "return pcall(function() error({err='E x'}) end)", "0"],
    &["EVAL", "local ok, e = pcall(function() error({err='E x'}) end) return e", "0"],
    &["EVAL", "local ok, e = pcall(redis.call, 'nosuch') return e", "0"],
    &["EVAL", "local ok, e = pcall(error, 'plain') return e", "0"],
    &["EVAL", "return redis.pcall('nosuch')", "0"],
    &["EVAL", "return redis.sha1hex('abc')", "0"],
    &["EVAL", "return redis.sha1hex()", "0"],
    &["EVAL", "redis.log(redis.LOG_WARNING, 'from a test')", "0"],
    &["EVAL", "redis.log()", "0"],
    &["EVAL", "redis.log('x', 'y')", "0"],
    &["EVAL", "return redis.replicate_commands()", "0"],
    &["EVAL", "redis.set_repl(redis.REPL_ALL) return 1", "0"],
    &["EVAL", "redis.set_repl(9)", "0"],
    &["EVAL", "return redis.breakpoint()", "0"],
    &["EVAL", "return redis.acl_check_cmd('get', 'x')", "0"],
    &["EVAL", "return redis.acl_check_cmd('nosuch')", "0"],
    &["EVAL", "return string.format('%5.2f', 3.14159)", "0"],
    &["EVAL", "return ('abc'):upper()", "0"],
    &["EVAL", "return tostring(0.1)", "0"],
    &["EVAL", "return math.random(100)", "0"],
    &["EVAL", "math.randomseed(3) return {math.random(100), math.random(5, 9)}", "0"],
    &["EVAL", "return math.random(0)", "0"],
    // cjson and bit.
    &["EVAL", "return cjson.encode({1,2,{a=1.5}})", "0"],
    &["EVAL", "return cjson.encode({})", "0"],
    &["EVAL", "return cjson.encode({f=function() end})", "0"],
    &["EVAL", "return cjson.encode({[1]=1,[20]=2})", "0"],
    &["EVAL", "return cjson.encode({1,2,nil,4})", "0"],
    &["EVAL", "return cjson.encode({a='x/y\"\\\\\\n', b=true, c=cjson.null, d=0.1, e=1e20, [3]=5})", "0"],
    &["EVAL", "return cjson.encode(1/3)", "0"],
    &["EVAL", "local t = cjson.decode('[1,2.5,\"x\",null,{\"a\":[]}]') return {t[1], t[2], t[3], type(t[4]), type(t[5].a)}", "0"],
    &["EVAL", "return cjson.decode('{\"a\":{\"b\":[1,2,3]}}').a.b[3]", "0"],
    &["EVAL", "return cjson.decode('12345678901234567890')", "0"],
    &["EVAL", "return cjson.decode('{a:1}')", "0"],
    &["EVAL", "return cjson.decode('[1,2')", "0"],
    &["EVAL", "return cjson.encode(cjson.decode('[1e500]'))", "0"],
    &["EVAL", "return {cjson.decode('0x10'), cjson.decode('012'), cjson.decode('+5'), cjson.decode('1.5e3'), cjson.decode('5.')}", "0"],
    &["EVAL", "return tostring(cjson.decode('-Infinity')) .. tostring(cjson.decode('nan'))", "0"],
    &["EVAL", "local b = string.char(92) return cjson.decode('\"a' .. b .. 'u00e9' .. b .. 'ud83d' .. b .. 'ude00' .. b .. 'n\"')", "0"],
    &["EVAL", "local b = string.char(92) return cjson.decode('\"' .. b .. 'ud83d\"')", "0"],
    &["EVAL", "local b = string.char(92) return cjson.decode('\"' .. b .. 'q\"')", "0"],
    &["EVAL", "return cjson.decode('\"abc')", "0"],
    &["EVAL", "return cjson.decode('')", "0"],
    &["EVAL", "return cjson.decode('[] x')", "0"],
    &["EVAL", "return cjson.decode('tru')", "0"],
    &["EVAL", "return cjson.decode('{\"a\" 1}')", "0"],
    &["EVAL", "return cjson.decode('{\"a\":1 \"b\"}')", "0"],
    &["EVAL", "return cjson.decode(string.rep('[', 1001))", "0"],
    &["EVAL", "return cjson.decode('-')", "0"],
    &["EVAL", "return cjson.decode('.5')", "0"],
    &["EVAL", "return cjson.decode('1e')", "0"],
    &["EVAL", "return cjson.decode('[1,]')", "0"],
    &["EVAL", "return cjson.decode()", "0"],
    &["EVAL", "return cjson.decode('\"x' .. string.char(0) .. 'y\"')", "0"],
    &["EVAL", "return cjson.decode(string.char(0) .. '1')", "0"],
    &["EVAL", "return cjson.decode('\"' .. string.char(200, 1) .. '\"')", "0"],
    &["EVAL", "return bit.tohex(65535)", "0"],
    &["EVAL", "return bit.tohex(-1, -4)", "0"],
    &["EVAL", "return bit.lshift(1, 40)", "0"],
    &["EVAL", "return {bit.band(0xff, 0x0f), bit.bor(1, 2, 4), bit.bxor(5, 1), bit.bnot(0)}", "0"],
    &["EVAL", "return {bit.rshift(-1, 28), bit.arshift(-256, 4), bit.rol(1, 33), bit.ror(1, 1), bit.bswap(1)}", "0"],
    &["EVAL", "return bit.tobit(4294967297)", "0"],
    &["EVAL", "return bit.band()", "0"],
    &["EVAL", "return bit.tobit('x')", "0"],
    &["EVAL", "return cmsgpack.pack(1, -1, 200, -200, 70000, -70000, 5000000000, -5000000000, 1.5, 0.1, 'abc', true, false, nil)", "0"],
    &["EVAL", "return cmsgpack.pack({1,2,3}, {a=1}, {}, {[1]=1,[3]=3}, string.rep('x', 40), string.rep('y', 300), string.rep('z', 70000))", "0"],
    &["EVAL", "return cmsgpack.pack(1/0, -1/0, 2^63, -2^63, 2^53)", "0"],
    &["EVAL", "local t = {} t.t = t return cmsgpack.pack(t)", "0"],
    &["EVAL", "return {cmsgpack.unpack(cmsgpack.pack(1, 'two', {3, 4}, {a='b'}))}", "0"],
    &["EVAL", "local t = cmsgpack.unpack(cmsgpack.pack({a={b={c=1}}})) return t.a.b.c", "0"],
    &["EVAL", "return {cmsgpack.unpack_one(cmsgpack.pack(1, 2, 3), 1)}", "0"],
    &["EVAL", "return {cmsgpack.unpack_limit(cmsgpack.pack(1, 2, 3), 2)}", "0"],
    &["EVAL", "return {cmsgpack.unpack_one(cmsgpack.pack(1), 5)}", "0"],
    &["EVAL", "return cmsgpack.unpack(string.char(0x92, 1))", "0"],
    &["EVAL", "return cmsgpack.unpack(string.char(0xc1))", "0"],
    &["EVAL", "return cmsgpack.pack()", "0"],
    &["EVAL", "return struct.pack('>I2 <i4 b B h H l L T', 258, -5, -1, 255, -300, 65535, -7, 7, 9)", "0"],
    &["EVAL", "return struct.pack('!4 b i d f', 1, 2, 1.5, 2.5)", "0"],
    &["EVAL", "return struct.pack('c5 s c0', 'abcdefg', 'zz', 'xyz')", "0"],
    &["EVAL", "return struct.pack('c5', 'ab')", "0"],
    &["EVAL", "return struct.pack('q', 1)", "0"],
    &["EVAL", "return struct.pack('i40', 1)", "0"],
    &["EVAL", "return struct.pack('!3 i', 1)", "0"],
    &["EVAL", "return struct.pack('i')", "0"],
    &["EVAL", "return struct.pack('i', 'x')", "0"],
    &["EVAL", "return struct.pack()", "0"],
    &["EVAL", "return {struct.unpack('>I2 <i4 b B h H l L T', struct.pack('>I2 <i4 b B h H l L T', 258, -5, -1, 255, -300, 65535, -7, 7, 9))}", "0"],
    &["EVAL", "return {struct.unpack('!4 b i d f', struct.pack('!4 b i d f', 1, 2, 1.5, 2.5))}", "0"],
    &["EVAL", "return {struct.unpack('c5 s', struct.pack('c5 s', 'abcdefg', 'zz'))}", "0"],
    &["EVAL", "return {struct.unpack('b c0', struct.pack('b c0', 3, 'abc'))}", "0"],
    &["EVAL", "return {struct.unpack('c0', 'abc')}", "0"],
    &["EVAL", "return {struct.unpack('i', 'ab')}", "0"],
    &["EVAL", "return {struct.unpack('s', 'abc')}", "0"],
    &["EVAL", "return {struct.unpack('b', 'abc', 0)}", "0"],
    &["EVAL", "return {struct.unpack('b', 'abc', 2)}", "0"],
    &["EVAL", "return struct.size('i h !8 d')", "0"],
    &["EVAL", "return struct.size('s')", "0"],
    &["EVAL", "return struct.size('c0')", "0"],
    &["EVAL", "return struct.size('i q')", "0"],
    &["EVAL", "return {struct.unpack('>i3', string.char(255, 255, 254))}", "0"],
    &["EVAL", "return {struct.unpack('<I3 >i2', string.char(1, 2, 3, 128, 0))}", "0"],
    &["EVAL", "local t = {} for k,v in pairs(_G) do t[#t+1]=k end table.sort(t) return table.concat(t,' ')", "0"],
    // Arguments, flags, read-only scripts.
    &["EVAL", "return 1", "-1"],
    &["EVAL", "return 1", "2", "a"],
    &["EVAL", "return 1", "x"],
    &["EVAL", "return redis.call('set', KEYS[1], ARGV[1])", "1", "k", "v"],
    &["EVAL_RO", "return redis.call('get', KEYS[1])", "1", "k"],
    &["EVAL_RO", "return redis.call('set', KEYS[1], ARGV[1])", "1", "k", "v"],
    &["EVAL", "#!lua flags=no-writes\nreturn redis.call('set', 'k', 'v')", "0"],
    &["EVAL", "#!lua flags=no-writes\nreturn redis.call('get', 'k')", "0"],
    &["EVAL_RO", "#!lua\nreturn 1", "0"],
    &["EVAL", "#!lua flags=bogus\nreturn 1", "0"],
    &["EVAL", "#!lua foo=bar\nreturn 1", "0"],
    &["EVAL", "#!python\nreturn 1", "0"],
    &["EVAL", "#!lua", "0"],
    &["EVAL", "return redis.call('select', 1)", "0"],
    &["EVAL", "return redis.call('blmpop', 1, 1, 'nolist', 'LEFT')", "0"],
    // SCRIPT.
    &["SCRIPT", "LOAD", "return 1"],
    &["SCRIPT", "EXISTS", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "aaa"],
    &["EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"],
    &["EVALSHA", "E0E1F9FABFC9D4800C877A703B823AC0578FF8DB", "0"],
    &["EVALSHA_RO", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"],
    &["SCRIPT", "LOAD", "return +"],
    &["SCRIPT", "FLUSH"],
    &["EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"],
    &["SCRIPT", "FLUSH", "ASYNC"],
    &["SCRIPT", "FLUSH", "bogus"],
    &["SCRIPT", "KILL"],
    &["SCRIPT", "bogus"],
    &["SCRIPT", "LOAD"],
    &["SCRIPT", "HELP"],
    // FUNCTION.
    &["FUNCTION", "LOAD", "#!lua name=t1\nlocal x = string.format('%d', 1)\nredis.register_function('f1', function(keys, args) return x end)"],
    &["FUNCTION", "LOAD", "#!lua name=t2\nredis.call('set','a','b')"],
    &["FUNCTION", "LOAD", "#!lua name=t3\nredis.register_function('f3', function(keys, args) return {keys, args, KEYS} end)"],
    &["FCALL", "f3", "1", "a", "b"],
    &["FUNCTION", "LOAD", "#!lua name=t4\nredis.register_function{function_name='f4', callback=function(keys, args) return redis.call('set', keys[1], 'v') end, flags={'no-writes'}, description='desc'}"],
    &["FCALL", "f4", "1", "a"],
    &["FCALL_RO", "f4", "1", "a"],
    &["FUNCTION", "LIST", "LIBRARYNAME", "t4"],
    &["FUNCTION", "LIST", "LIBRARYNAME", "t4", "WITHCODE"],
    &["FUNCTION", "LOAD", "#!lua name=t5\nerror('x')"],
    &["FUNCTION", "LOAD", "#!lua name=t5\nreturn 1"],
    &["FUNCTION", "LOAD", "#!lua name=t5\nx = 1"],
    &["FUNCTION", "LOAD", "#!lua name=t6\nredis.register_function('f6', function() y = 1 end)"],
    &["FCALL", "f6", "0"],
    &["FCALL", "nosuch", "0"],
    &["FUNCTION", "LOAD", "#!lua name=t6\nredis.register_function('f6', function() return 1 end)"],
    &["FUNCTION", "LOAD", "REPLACE", "#!lua name=t6\nredis.register_function('f6', function() return 2 end)"],
    &["FCALL", "f6", "0"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function('f6', function() return 1 end)"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function('f7', function() return 1 end)\nredis.register_function('f7', function() return 1 end)"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function('f 7', function() return 1 end)"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function()"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function(1)"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function({function_name='x'})"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function({callback=function() end})"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function({function_name='x', callback=function() end, flags={'bad'}})"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function({function_name='x', callback=function() end, other=1})"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function('x', 1)"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nreturn redis.call('ping')"],
    &["FUNCTION", "LOAD", "#!lua name=t7\nredis.register_function('f7', function() return redis.REDIS_VERSION ~= nil end)"],
    &["FCALL", "f7", "0"],
    &["FUNCTION", "LOAD", "#!lua\nreturn 1"],
    &["FUNCTION", "LOAD", "#!lua name=a name=b\nreturn 1"],
    &["FUNCTION", "LOAD", "#!lua foo=b\nreturn 1"],
    &["FUNCTION", "LOAD", "#!js name=b\nreturn 1"],
    &["FUNCTION", "LOAD", "return 1"],
    &["FUNCTION", "LOAD", "#!lua name=x-y\nreturn 1"],
    &["FUNCTION", "LOAD", "#!lua name=x"],
    &["FUNCTION", "LOAD", "bogus", "#!lua name=x\nreturn 1"],
    &["FUNCTION", "LOAD"],
    &["FUNCTION", "DELETE", "t1"],
    &["FUNCTION", "DELETE", "t1"],
    &["FCALL", "f1", "0"],
    &["FCALL", "f3", "x"],
    &["FCALL", "f3", "5"],
    &["FUNCTION", "LOAD", "#!lua name=t8\nredis.register_function('f8', function(keys, args) return redis.call('set', keys[1], args[1]) end)"],
    &["FCALL_RO", "f8", "1", "a", "b"],
    &["FCALL", "f8", "1", "a", "b"],
    &["GET", "a"],
    &["FUNCTION", "LOAD", "#!lua name=t9\nredis.register_function{function_name='f9', callback=function(keys, args) return 1 end, flags={'allow-oom', 'no-cluster', 'allow-stale', 'allow-cross-slot-keys'}}"],
    &["FUNCTION", "LIST", "LIBRARYNAME", "t9"],
    &["FUNCTION", "LIST", "bogus"],
    &["FUNCTION", "LIST", "LIBRARYNAME"],
    &["FUNCTION", "RESTORE", "bogus"],
    &["FUNCTION", "RESTORE", "bogus", "bogus"],
    &["FUNCTION", "STATS"],
    &["FUNCTION", "KILL"],
    &["FUNCTION", "HELP"],
    &["FUNCTION", "bogus"],
    &["FUNCTION", "FLUSH", "bogus"],
    &["FUNCTION", "FLUSH"],
    &["FUNCTION", "LIST"],
    &["FCALL", "f9", "0"],
];

fn compare(resp3: bool) {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let redis = RedisServer::start();
    let mut e = Conn::open(ember.port);
    let mut r = Conn::open(redis.port);
    if resp3 {
        for c in [&mut e, &mut r] {
            assert!(matches!(c.call(&["HELLO", "3"]), Reply::Map(_)));
        }
    }
    let mut mismatches = Vec::new();
    for case in CASES {
        let (a, b) = (e.call(case), r.call(case));
        if a != b {
            mismatches.push(format!("{case:?}\n  ember: {a:?}\n  redis: {b:?}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} replies differ (RESP{}):\n{}",
        mismatches.len(),
        CASES.len(),
        if resp3 { 3 } else { 2 },
        mismatches.join("\n")
    );
}

#[test]
fn scripts_match_redis_resp2() {
    compare(false);
}

#[test]
fn scripts_match_redis_resp3() {
    compare(true);
}

/// FUNCTION DUMP and RESTORE round trip (with each policy), and the
/// libraries are still there after a clean restart and after a SIGKILL.
#[test]
fn function_libraries_persist() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &[]);
    let mut c = Conn::open(srv.port);
    let lib = "#!lua name=lib\nredis.register_function('hello', function(keys, args) return 'hi ' .. args[1] end)";
    assert_eq!(
        c.call(&["FUNCTION", "LOAD", lib]),
        Reply::Bulk(b"lib".to_vec())
    );
    let Reply::Bulk(dump) = c.call(&["FUNCTION", "DUMP"]) else {
        panic!("FUNCTION DUMP");
    };
    assert_eq!(
        c.call(&[b"FUNCTION".as_slice(), b"RESTORE", &dump]),
        Reply::Error("ERR Library lib already exists".into())
    );
    assert_eq!(
        c.call(&[b"FUNCTION".as_slice(), b"RESTORE", &dump, b"REPLACE"]),
        Reply::Simple("OK".into())
    );
    let mut bad = dump.clone();
    bad[10] ^= 1;
    assert_eq!(
        c.call(&[b"FUNCTION".as_slice(), b"RESTORE", &bad]),
        Reply::Error("ERR DUMP payload version or checksum are wrong".into())
    );
    assert_eq!(c.call(&["FUNCTION", "FLUSH"]), Reply::Simple("OK".into()));
    assert_eq!(
        c.call(&["FCALL", "hello", "0", "x"]),
        Reply::Error("ERR Function not found".into())
    );
    assert_eq!(
        c.call(&[b"FUNCTION".as_slice(), b"RESTORE", &dump, b"FLUSH"]),
        Reply::Simple("OK".into())
    );
    let hi = Reply::Bulk(b"hi there".to_vec());
    assert_eq!(c.call(&["FCALL", "hello", "0", "there"]), hi);
    // Restarts: clean, then SIGKILL after a second library.
    drop(c);
    assert!(srv.terminate());
    srv.restart();
    let mut c = Conn::open(srv.port);
    assert_eq!(c.call(&["FCALL", "hello", "0", "there"]), hi);
    let lib2 = "#!lua name=lib2\nredis.register_function('two', function() return 2 end)";
    assert_eq!(
        c.call(&["FUNCTION", "LOAD", lib2]),
        Reply::Bulk(b"lib2".to_vec())
    );
    assert_eq!(
        c.call(&["FUNCTION", "DELETE", "lib"]),
        Reply::Simple("OK".into())
    );
    drop(c);
    srv.kill9();
    srv.restart();
    let mut c = Conn::open(srv.port);
    assert_eq!(c.call(&["FCALL", "two", "0"]), Reply::Integer(2));
    assert_eq!(
        c.call(&["FCALL", "hello", "0", "x"]),
        Reply::Error("ERR Function not found".into())
    );
    // Functions are not keys.
    assert_eq!(c.call(&["DBSIZE"]), Reply::Integer(0));
    assert_eq!(c.call(&["FLUSHALL"]), Reply::Simple("OK".into()));
    assert_eq!(c.call(&["FCALL", "two", "0"]), Reply::Integer(2));
}

/// FUNCTION DUMP is Redis's payload: the same bytes for one library, and
/// dumps move both ways between redis-server and Ember (with several
/// libraries, and the errors of payloads that are not functions).
#[test]
fn function_dump_is_redis_format() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &[]);
    let redis = RedisServer::start();
    let mut e = Conn::open(srv.port);
    let mut r = Conn::open(redis.port);
    let one = "#!lua name=one\nredis.register_function('f1', function() return 1 end)";
    let two = "#!lua name=two\nredis.register_function('f2', function() return 2 end)";
    for c in [&mut e, &mut r] {
        assert_eq!(
            c.call(&["FUNCTION", "LOAD", one]),
            Reply::Bulk(b"one".to_vec())
        );
    }
    let dump = |c: &mut Conn| match c.call(&["FUNCTION", "DUMP"]) {
        Reply::Bulk(b) => b,
        other => panic!("FUNCTION DUMP: {other:?}"),
    };
    assert_eq!(dump(&mut e), dump(&mut r));
    // Redis's dump of two libraries restores on Ember, and Ember's on Redis.
    assert_eq!(
        r.call(&["FUNCTION", "LOAD", two]),
        Reply::Bulk(b"two".to_vec())
    );
    let from_redis = dump(&mut r);
    assert_eq!(
        e.call(&[b"FUNCTION".as_slice(), b"RESTORE", &from_redis, b"FLUSH"]),
        Reply::Simple("OK".into())
    );
    assert_eq!(e.call(&["FCALL", "f2", "0"]), Reply::Integer(2));
    assert_eq!(r.call(&["FUNCTION", "FLUSH"]), Reply::Simple("OK".into()));
    let from_ember = dump(&mut e);
    assert_eq!(
        r.call(&[b"FUNCTION".as_slice(), b"RESTORE", &from_ember]),
        Reply::Simple("OK".into())
    );
    assert_eq!(r.call(&["FCALL", "f1", "0"]), Reply::Integer(1));
    assert_eq!(r.call(&["FCALL", "f2", "0"]), Reply::Integer(2));
    // A key's DUMP is not a function payload: the same error on both.
    for c in [&mut e, &mut r] {
        assert_eq!(c.call(&["SET", "k", "v"]), Reply::Simple("OK".into()));
    }
    let key_dump = match r.call(&["DUMP", "k"]) {
        Reply::Bulk(b) => b,
        other => panic!("DUMP: {other:?}"),
    };
    let want = r.call(&[b"FUNCTION".as_slice(), b"RESTORE", &key_dump]);
    assert_eq!(
        want,
        Reply::Error("ERR given type is not a function".into())
    );
    assert_eq!(
        e.call(&[b"FUNCTION".as_slice(), b"RESTORE", &key_dump]),
        want
    );
}

/// Read-modify-write scripts from clients on two workers lose no update:
/// each script is one unit holding its key's lock.
#[test]
fn scripts_are_isolated_across_workers() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &["--threads", "2"]);
    let port = srv.port;
    let script = "local v = tonumber(redis.call('get', KEYS[1]) or '0') \
                  redis.call('set', KEYS[1], v + 1) \
                  redis.call('set', 'undeclared', v + 1) return v + 1";
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                for _ in 0..300 {
                    assert!(matches!(
                        c.call(&["EVAL", script, "1", "ctr"]),
                        Reply::Integer(_)
                    ));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut c = Conn::open(port);
    assert_eq!(c.call(&["GET", "ctr"]), Reply::Bulk(b"1200".to_vec()));
    assert_eq!(
        c.call(&["GET", "undeclared"]),
        Reply::Bulk(b"1200".to_vec())
    );
}

/// Scripts under SIGKILL: each client runs a script that increments two
/// keys and pushes to a list; after a restart the three agree (all of a
/// script's writes or none) and hold every acknowledged script and at most
/// one more.
#[test]
fn sigkill_keeps_script_writes_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &["--threads", "2"]);
    let mut rng = SmallRng::seed_from_u64(11);
    let script = "redis.call('incr', KEYS[1]) redis.call('rpush', KEYS[2], 'x') \
                  return redis.call('incr', KEYS[3])";
    // After a restart the script cache is empty: EVALSHA's NOSCRIPT makes
    // the client send EVAL, as client libraries do.
    let sha = match Conn::open(srv.port).call(&["SCRIPT", "LOAD", script]) {
        Reply::Bulk(b) => String::from_utf8(b).unwrap(),
        r => panic!("SCRIPT LOAD: {r:?}"),
    };
    for cycle in 0..3 {
        let stop = Arc::new(AtomicBool::new(false));
        let port = srv.port;
        let handles: Vec<_> = (0..3)
            .map(|id| {
                let stop = stop.clone();
                let sha = sha.clone();
                let id = cycle * 3 + id;
                std::thread::spawn(move || {
                    let mut c = Conn::open(port);
                    let mut acked = 0i64;
                    let keys = [format!("a:{id}"), format!("l:{id}"), format!("b:{id}")];
                    while !stop.load(Ordering::Relaxed) {
                        let mut req = Vec::new();
                        encode_request(
                            &["EVALSHA", &sha, "3", &keys[0], &keys[1], &keys[2]],
                            &mut req,
                        );
                        let r = match c.request(&req) {
                            Ok(Reply::Error(e)) if e.starts_with("NOSCRIPT") => {
                                let mut req = Vec::new();
                                encode_request(
                                    &["EVAL", script, "3", &keys[0], &keys[1], &keys[2]],
                                    &mut req,
                                );
                                c.request(&req)
                            }
                            r => r,
                        };
                        match r {
                            Ok(Reply::Integer(n)) => {
                                acked += 1;
                                assert_eq!(n, acked);
                            }
                            Ok(other) => panic!("script: {other:?}"),
                            Err(_) => break,
                        }
                    }
                    (id, acked)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(300..900u64)));
        srv.kill9();
        stop.store(true, Ordering::Relaxed);
        let results: Vec<(usize, i64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        srv.restart();
        let mut c = Conn::open(srv.port);
        for (id, acked) in results {
            let int = reply_int;
            let a = int(c.call(&["GET", &format!("a:{id}")]));
            let l = int(c.call(&["LLEN", &format!("l:{id}")]));
            let b = int(c.call(&["GET", &format!("b:{id}")]));
            assert_eq!((a, l), (b, b), "client {id}: a script's writes are split");
            assert!(
                acked <= b && b <= acked + 1,
                "client {id}: {acked} acknowledged, {b} present"
            );
        }
    }
}

/// One request on a fresh connection with a read timeout: None when the
/// server does not answer in time (the connection may be on the worker
/// that runs a script).
fn try_call(port: u16, args: &[&str], timeout: Duration) -> (TcpStream, Option<Reply>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut req = Vec::new();
    encode_request(args, &mut req);
    s.write_all(&req).unwrap();
    let r = read_reply(&mut s);
    (s, r)
}

fn read_reply(s: &mut TcpStream) -> Option<Reply> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some((r, _))) = parse_reply(&buf) {
            return Some(r);
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A connection served by another worker than the one running the script:
/// it answers PING with BUSY (a connection on the script's worker waits).
fn busy_connection(port: u16) -> TcpStream {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        let (s, r) = try_call(port, &["PING"], Duration::from_millis(500));
        match r {
            Some(Reply::Error(e)) if e.starts_with("BUSY") => return s,
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    panic!("no connection answered BUSY");
}

fn call_on(s: &mut TcpStream, args: &[&str]) -> Reply {
    let mut req = Vec::new();
    encode_request(args, &mut req);
    s.write_all(&req).unwrap();
    read_reply(s).expect("reply")
}

/// A script past busy-reply-threshold: other workers answer BUSY (EVAL
/// too), FUNCTION KILL and FUNCTION STATS name the right command, SCRIPT
/// KILL stops it (the script's client gets the kill error), and a script
/// that wrote cannot be killed and finishes.
#[test]
fn busy_script_and_script_kill() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &["--threads", "2"]);
    let mut c = Conn::open(srv.port);
    assert_eq!(
        c.call(&["CONFIG", "SET", "busy-reply-threshold", "200"]),
        Reply::Simple("OK".into())
    );
    assert_eq!(
        c.call(&["CONFIG", "GET", "lua-time-limit"]),
        Reply::Array(vec![
            Reply::Bulk(b"lua-time-limit".to_vec()),
            Reply::Bulk(b"200".to_vec())
        ])
    );
    let port = srv.port;
    let runner = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        c.call(&["EVAL", "local i = 0 while true do i = i + 1 end", "0"])
    });
    let mut other = busy_connection(port);
    let busy =
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";
    assert_eq!(
        call_on(&mut other, &["GET", "x"]),
        Reply::Error(busy.into())
    );
    assert_eq!(
        call_on(&mut other, &["EVAL", "return 1", "0"]),
        Reply::Error(busy.into())
    );
    assert_eq!(
        call_on(&mut other, &["FUNCTION", "STATS"]),
        Reply::Error(busy.into())
    );
    assert_eq!(
        call_on(&mut other, &["FUNCTION", "KILL"]),
        Reply::Error(busy.into())
    );
    assert_eq!(
        call_on(&mut other, &["SCRIPT", "KILL"]),
        Reply::Simple("OK".into())
    );
    let r = runner.join().unwrap();
    let Reply::Error(e) = r else {
        panic!("killed script replied {r:?}");
    };
    assert!(
        e.starts_with("ERR Script killed by user with SCRIPT KILL... script: ")
            && e.ends_with("on @user_script:1."),
        "{e}"
    );
    assert_eq!(call_on(&mut other, &["GET", "x"]), Reply::Null);
    assert_eq!(
        call_on(&mut other, &["SCRIPT", "KILL"]),
        Reply::Error("NOTBUSY No scripts in execution right now.".into())
    );
    // A script that wrote: UNKILLABLE, and it runs to its end. pcall does
    // not catch a kill either (checked with the first script's kind).
    let runner = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        c.call(&[
            "EVAL",
            "redis.call('set', KEYS[1], 'w') local i = 0 while i < 60000000 do i = i + 1 end return i",
            "1",
            "x",
        ])
    });
    let mut other = busy_connection(port);
    let r = call_on(&mut other, &["SCRIPT", "KILL"]);
    let Reply::Error(e) = r else {
        panic!("SCRIPT KILL replied {r:?}");
    };
    assert!(
        e.starts_with("UNKILLABLE Sorry the script already executed write commands"),
        "{e}"
    );
    assert_eq!(runner.join().unwrap(), Reply::Integer(60_000_000));
    assert_eq!(
        call_on(&mut other, &["GET", "x"]),
        Reply::Bulk(b"w".to_vec())
    );
    // A function: FUNCTION KILL stops it, even through pcall.
    let lib = "#!lua name=spin\nredis.register_function('spin', function() \
               while true do pcall(function() local i = 0 while i < 1000 do i = i + 1 end end) end end)";
    assert_eq!(
        call_on(&mut other, &["FUNCTION", "LOAD", lib]),
        Reply::Bulk(b"spin".to_vec())
    );
    let runner = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        c.call(&["FCALL", "spin", "0"])
    });
    let mut other = busy_connection(port);
    let busy_f =
        "BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE.";
    assert_eq!(
        call_on(&mut other, &["SCRIPT", "KILL"]),
        Reply::Error(busy_f.into())
    );
    // RESP2: the map is a flat array (running_script, its map, engines...).
    let Reply::Array(stats) = call_on(&mut other, &["FUNCTION", "STATS"]) else {
        panic!("FUNCTION STATS");
    };
    assert!(matches!(&stats[1], Reply::Array(m) if m[1] == Reply::Bulk(b"spin".to_vec())));
    assert_eq!(
        call_on(&mut other, &["FUNCTION", "KILL"]),
        Reply::Simple("OK".into())
    );
    let r = runner.join().unwrap();
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("ERR Script killed by user with SCRIPT KILL...")),
        "{r:?}"
    );
}

/// Waits for `s` to answer `args` with BUSY (the script went past the
/// threshold); the connection may be on the script's own worker.
fn until_busy(s: &mut TcpStream, args: &[&str]) {
    let t = Instant::now();
    loop {
        match call_on(s, args) {
            Reply::Error(e) if e.starts_with("BUSY") => return,
            r => assert!(t.elapsed() < Duration::from_secs(20), "still {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One worker (the two-core default): the script's own worker answers its
/// other connections while the script is busy — BUSY to most commands,
/// SCRIPT KILL, AUTH, HELLO and SHUTDOWN NOSAVE run — including a
/// connection opened after the script started (as `redis-cli -a pw script
/// kill` would: AUTH then SCRIPT KILL). WATCH waits for the script's end,
/// with what follows it. SHUTDOWN NOSAVE stops a script that wrote (which
/// SCRIPT KILL refuses) and drops its writes.
#[test]
fn busy_script_on_its_own_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &["--threads", "1", "--requirepass", "pw"]);
    let port = srv.port;
    let open = || {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        assert_eq!(call_on(&mut c, &["AUTH", "pw"]), Reply::Simple("OK".into()));
        c
    };
    let mut c = open();
    assert_eq!(
        call_on(&mut c, &["CONFIG", "SET", "busy-reply-threshold", "100"]),
        Reply::Simple("OK".into())
    );
    let mut early = open();
    let runner = std::thread::spawn(move || {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert_eq!(call_on(&mut c, &["AUTH", "pw"]), Reply::Simple("OK".into()));
        call_on(
            &mut c,
            &["EVAL", "local i = 0 while true do i = i + 1 end", "0"],
        )
    });
    until_busy(&mut early, &["GET", "x"]);
    let busy =
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";
    // Checks before BUSY, as Redis orders them.
    assert_eq!(
        call_on(&mut early, &["NOSUCH"]),
        Reply::Error("ERR unknown command 'NOSUCH', with args beginning with: ".into())
    );
    assert_eq!(
        call_on(&mut early, &["GET"]),
        Reply::Error("ERR wrong number of arguments for 'get' command".into())
    );
    assert_eq!(call_on(&mut early, &["PING"]), Reply::Error(busy.into()));
    // A new connection: not yet authenticated, then AUTH runs.
    let mut late = TcpStream::connect(("127.0.0.1", port)).unwrap();
    late.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(
        call_on(&mut late, &["PING"]),
        Reply::Error("NOAUTH Authentication required.".into())
    );
    assert_eq!(
        call_on(&mut late, &["AUTH", "pw"]),
        Reply::Simple("OK".into())
    );
    let Reply::Map(hello) = call_on(&mut late, &["HELLO", "3"]) else {
        panic!("HELLO 3");
    };
    assert_eq!(hello[2].1, Reply::Integer(3));
    assert_eq!(call_on(&mut late, &["MULTI"]), Reply::Simple("OK".into()));
    assert_eq!(call_on(&mut late, &["GET", "x"]), Reply::Error(busy.into()));
    assert_eq!(call_on(&mut late, &["DISCARD"]), Reply::Simple("OK".into()));
    // WATCH waits for the script, and so does the PING sent after it.
    let mut req = Vec::new();
    encode_request(&["WATCH", "x"], &mut req);
    encode_request(&["PING"], &mut req);
    early.write_all(&req).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        call_on(&mut late, &["SCRIPT", "KILL"]),
        Reply::Simple("OK".into())
    );
    let r = runner.join().unwrap();
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("ERR Script killed by user with SCRIPT KILL...")),
        "{r:?}"
    );
    let mut buf = Vec::new();
    let mut chunk = [0u8; 256];
    while buf != b"+OK\r\n+PONG\r\n" {
        let n = early.read(&mut chunk).unwrap();
        assert!(
            n > 0 && buf.len() + n <= 12,
            "{:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(
        call_on(&mut early, &["SET", "kept", "1"]),
        Reply::Simple("OK".into())
    );

    // A script that wrote: SCRIPT KILL refuses, SHUTDOWN without NOSAVE is
    // BUSY, SHUTDOWN NOSAVE stops the server without the script's writes.
    let runner = std::thread::spawn(move || {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert_eq!(call_on(&mut c, &["AUTH", "pw"]), Reply::Simple("OK".into()));
        let mut req = Vec::new();
        encode_request(
            &[
                "EVAL",
                "redis.call('set', 'dropped', 1) while true do end",
                "0",
            ],
            &mut req,
        );
        c.write_all(&req).unwrap();
        read_reply(&mut c)
    });
    until_busy(&mut early, &["GET", "x"]);
    let r = call_on(&mut late, &["SCRIPT", "KILL"]);
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("UNKILLABLE")),
        "{r:?}"
    );
    assert_eq!(call_on(&mut late, &["SHUTDOWN"]), Reply::Error(busy.into()));
    let mut req = Vec::new();
    encode_request(&["SHUTDOWN", "NOSAVE"], &mut req);
    late.write_all(&req).unwrap();
    assert!(srv.wait_exit(), "the server did not exit");
    assert_eq!(runner.join().unwrap(), None);
    srv.restart();
    // (A restart may take another port.)
    let mut c = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    assert_eq!(call_on(&mut c, &["AUTH", "pw"]), Reply::Simple("OK".into()));
    assert_eq!(
        call_on(&mut c, &["GET", "kept"]),
        Reply::Bulk(b"1".to_vec())
    );
    assert_eq!(call_on(&mut c, &["EXISTS", "dropped"]), Reply::Integer(0));
}

/// redis-py's Lock (Lua scripts for release, extend, reacquire) and
/// register_script, and a small job queue written as a Lua script.
#[test]
fn redis_py_lock_and_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &[]);
    let script = format!(
        r##"
import redis
r = redis.Redis(port={port})
lock = r.lock("resource", timeout=10)
assert lock.acquire(blocking=False)
assert not r.lock("resource").acquire(blocking=False)
assert lock.extend(5)
assert lock.reacquire()
lock.release()
assert r.get("resource") is None
with r.lock("other", blocking_timeout=1):
    assert r.exists("other") == 1
assert r.exists("other") == 0
add = r.register_script("return redis.call('incrby', KEYS[1], ARGV[1])")
assert add(keys=["n"], args=[5]) == 5
r.script_flush()
assert add(keys=["n"], args=[2]) == 7
# A job queue: move a job from 'queue' to 'running' with its start time.
take = r.register_script('''
local job = redis.call('rpop', KEYS[1])
if not job then return false end
redis.call('hset', KEYS[2], job, ARGV[1])
return job
''')
r.lpush("queue", "j1", "j2")
assert take(keys=["queue", "running"], args=[123]) == b"j1"
assert take(keys=["queue", "running"], args=[124]) == b"j2"
assert take(keys=["queue", "running"], args=[125]) is None
assert r.hgetall("running") == {{b"j1": b"123", b"j2": b"124"}}
r.function_load("#!lua name=pylib\nredis.register_function('echo2', function(k, a) return a[1] .. a[1] end)")
assert r.fcall("echo2", 0, "ab") == b"abab"
print("redis-py ok")
"##,
        port = srv.port
    );
    serve_common::run_redis_py(&script);
}
