//! Every error a command replies with, and its text: the one place where
//! Redis's wording lives (the Redis command reference, and Redis 7's source
//! where the reference is silent). A handler returns a [`CmdError`]; dispatch
//! writes its [`CmdError::text`] as the error reply.

use crate::keyspace::{KsError, OOM_ERRORS, OOM_REASON};
use std::borrow::Cow;
use std::sync::atomic::Ordering;

/// Why a command failed.
#[derive(Debug)]
pub enum CmdError {
    /// `ERR syntax error`.
    Syntax,
    /// An argument or stored value that is not a 64-bit integer.
    NotInteger,
    /// An argument or stored value that is not a valid float.
    NotFloat,
    /// A key holding another type.
    WrongType,
    /// A request whose argument count the command refuses (`name` as Redis
    /// prints it: `get`, `client|setname`).
    Arity(Cow<'static, str>),
    /// A command name not in the table (the whole request, for the text).
    UnknownCommand(Vec<Vec<u8>>),
    /// A container command's unknown subcommand (`cmd` in capitals).
    UnknownSubcommand {
        cmd: &'static str,
        sub: Vec<u8>,
    },
    /// A command other than the Pub/Sub ones, PING, QUIT and RESET from a
    /// RESP2 client with subscriptions (its full name, `config|get`).
    SubscriberMode(String),
    /// A command before authentication.
    NoAuth,
    /// HELLO without authentication and without AUTH.
    HelloNoAuth,
    /// A wrong password.
    WrongPass,
    /// AUTH with no password configured.
    AuthNotConfigured,
    /// HELLO's protocol version argument is not an integer.
    ProtoVersionNotInteger,
    /// HELLO with a version other than 2 or 3.
    NoProto,
    /// An unknown HELLO option.
    HelloOption(Vec<u8>),
    /// DEBUG refused by `enable-debug-command`.
    DebugNotAllowed,
    /// An unknown DEBUG subcommand, or a wrong argument count for one.
    DebugUnknown(Vec<u8>),
    /// A non-positive or overflowing expiry (`cmd` is the command name).
    InvalidExpire(&'static str),
    /// EXPIRE's option that Redis does not know.
    ExpireOption(Vec<u8>),
    /// EXPIRE NX with XX, GT or LT.
    ExpireNxWithOthers,
    /// EXPIRE GT with LT.
    ExpireGtWithLt,
    /// A string beyond `proto-max-bulk-len`.
    StringTooLong,
    /// SETRANGE's negative offset.
    OffsetOutOfRange,
    /// A bit offset that is not a number, negative, or beyond
    /// `proto-max-bulk-len` bytes (SETBIT, GETBIT, BITFIELD).
    BitOffset,
    /// SETBIT's value other than 0 or 1.
    BitValue,
    /// BITFIELD's type other than `i1`..`i64`, `u1`..`u63`.
    BitfieldType,
    /// A string key that does not hold a HyperLogLog (PFADD, PFCOUNT, PFMERGE).
    NotHll,
    /// A HyperLogLog whose sparse encoding is damaged.
    HllCorrupt,
    /// LCS whose table would exceed `proto-max-bulk-len`.
    LcsTooLarge,
    /// PFDEBUG's unknown subcommand (as given).
    UnknownPfdebug(Vec<u8>),
    /// INCR/INCRBY past the 64-bit range.
    IncrOverflow,
    /// DECRBY of `i64::MIN`.
    DecrOverflow,
    /// INCRBYFLOAT to a NaN or infinity.
    NanOrInfinity,
    /// A SCAN cursor that is not a number.
    InvalidCursor,
    /// RENAME of an absent key.
    NoSuchKey,
    /// COPY or MOVE onto the key itself.
    SameObject,
    /// SELECT beyond a C int.
    IntRange,
    /// SELECT of a database that does not exist.
    DbIndexOutOfRange,
    /// A client name (or library field, `field` as given) with spaces or
    /// special characters.
    BadClientName,
    BadClientField(Vec<u8>),
    /// CLIENT SETINFO's unknown field.
    UnrecognizedOption(Vec<u8>),
    /// CLIENT LIST TYPE's unknown type.
    UnknownClientType(String),
    /// CLIENT LIST ID's argument.
    InvalidClientId,
    /// CONFIG SET of a parameter that cannot change at run time.
    ConfigImmutable(String),
    /// CONFIG SET of an unknown parameter.
    ConfigUnknown(String),
    /// CONFIG SET of a value the parameter refuses.
    ConfigInvalid {
        name: String,
        why: String,
    },
    /// CONFIG SET maxclients beyond the open file limit.
    ConfigMaxclients(u64),
    /// COMMAND GETKEYS of an unknown command.
    InvalidCommand,
    /// COMMAND GETKEYS with the wrong argument count for the command.
    InvalidCommandArity,
    /// COMMAND GETKEYS of a movable-keys command whose arguments locate no key.
    InvalidGetkeysArgs,
    /// COMMAND GETKEYS of a command without keys.
    NoKeyArguments,
    /// SHUTDOWN ABORT with no shutdown in progress.
    NoShutdown,
    /// A command or option Redis has and Ember does not: `what` names it,
    /// `why` (may be empty) says why.
    NotSupported {
        what: String,
        why: &'static str,
    },
    /// LSET past the list's end.
    IndexOutOfRange,
    /// LPOS RANK 0.
    RankZero,
    /// LPOS COUNT below 0.
    CountNegative,
    /// LPOS MAXLEN below 0.
    MaxlenNegative,
    /// LMPOP COUNT below 1.
    CountNotPositive,
    /// A negative count where Redis wants a positive one (SPOP).
    MustBePositive,
    /// SINTERCARD's numkeys below 1 or not a number.
    NumkeysNotPositive,
    /// SINTERCARD's numkeys beyond the arguments.
    NumkeysTooMany,
    /// SINTERCARD's negative LIMIT.
    LimitNegative,
    /// HINCRBYFLOAT's increment is infinite.
    NanOrInfinityArg,
    /// HINCRBY on a field whose value is not an integer.
    HashNotInteger,
    /// HINCRBYFLOAT on a field whose value is not a float.
    HashNotFloat,
    /// A count argument out of the range Redis takes (HRANDFIELD).
    ValueOutOfRange,
    /// An argument outside `min..=max` (Redis's `getRangeLongFromObject`).
    RangeBetween {
        min: i64,
        max: i64,
    },
    /// The keyspace or the store refused (full heap, corrupt value...).
    Store(KsError),
    /// The user may not run the command (its full name, `config|get`).
    NoPermCommand(String),
    /// The user may not touch one of the command's keys.
    NoPermKey,
    /// A Pub/Sub channel the ACL user may not use.
    NoPermChannel,
    /// ACL SETUSER's rules refused (the text after `ERR `, see
    /// `acl::apply_rules`), or ACL LOAD's errors.
    Acl(String),
    /// ACL SETUSER of a name with spaces or NUL.
    AclBadUsername,
    /// ACL DELUSER default.
    AclDeleteDefault,
    /// ACL LOAD or SAVE without an `aclfile`.
    AclNoFile,
    /// ACL SAVE failed (the cause is logged).
    AclSave,
    /// ACL CAT of an unknown category.
    AclUnknownCategory(Vec<u8>),
    /// ACL GENPASS with bits out of 1..=4096.
    AclGenpassBits,
    /// ACL DRYRUN of an unknown user.
    AclNoUser(Vec<u8>),
    /// ACL DRYRUN of an unknown command.
    AclNoCommand(Vec<u8>),
    /// An error whose text (after `ERR `) only one command gives.
    Msg(&'static str),
    /// CLIENT TRACKING with REDIRECT twice.
    TrackingRedirectTwice,
    /// CLIENT TRACKING REDIRECT to a client that does not exist.
    TrackingNoRedirectClient,
    /// CLIENT TRACKING PREFIX without BCAST.
    TrackingPrefixNeedsBcast,
    /// CLIENT TRACKING ON switching BCAST while tracking.
    TrackingBcastSwitch,
    /// CLIENT TRACKING BCAST with OPTIN or OPTOUT.
    TrackingOptWithBcast,
    /// CLIENT TRACKING OPTIN with OPTOUT.
    TrackingOptinAndOptout,
    /// CLIENT TRACKING ON switching between OPTIN and OPTOUT while tracking.
    TrackingOptSwitch,
    /// CLIENT TRACKING BCAST prefixes that would match one key; `existing`:
    /// `other` is one the client already has.
    TrackingPrefixOverlap {
        prefix: Vec<u8>,
        other: Vec<u8>,
        existing: bool,
    },
    /// CLIENT CACHING without tracking.
    TrackingCachingOff,
    /// CLIENT CACHING YES outside OPTIN mode.
    TrackingCachingYes,
    /// CLIENT CACHING NO outside OPTOUT mode.
    TrackingCachingNo,
    /// EXEC of a transaction that a refused request made fail.
    ExecAbort,
    /// An error whose whole text (its code included, such as `NOGROUP ...`)
    /// names the request's arguments; the caller formats it as Redis does.
    Text(String),
    /// ZUNION/ZINTER/ZDIFF(STORE)/ZINTERCARD with numkeys below 1 (the
    /// command's name, lower case).
    AtLeastOneKey(String),
    /// A blocking command's timeout that is not a number.
    TimeoutNotFloat,
    /// A blocking command's negative timeout.
    TimeoutNegative,
    /// CLIENT UNBLOCK's reason other than TIMEOUT or ERROR.
    UnblockReason,
    /// The reply of a client that CLIENT UNBLOCK ... ERROR unblocked.
    UnblockedByClient,
    /// A longitude or latitude beyond Redis's geo limits.
    GeoLonLat(f64, f64),
    /// GEOSEARCH(STORE) without FROMMEMBER or FROMLONLAT (the command name
    /// as given).
    GeoSearchFrom(Vec<u8>),
    /// GEOSEARCH(STORE) without BYRADIUS or BYBOX.
    GeoSearchBy(Vec<u8>),
    /// SORT with BY or GET patterns by a user who may not read every key
    /// (the option's name).
    SortPatternDenied(&'static str),
    /// OBJECT FREQ without an LFU maxmemory policy.
    NoLfuPolicy,
    /// OBJECT IDLETIME under an LFU maxmemory policy.
    LfuPolicy,
    /// A write refused because eviction could not bring the used memory
    /// under `maxmemory` (see [`crate::evict`]).
    OomMaxmemory,
    /// A container's subcommand with an argument count it refuses, where
    /// Redis checks it in the subcommand (`sub` as given).
    SubcommandArgs {
        cmd: &'static str,
        sub: Vec<u8>,
    },
    /// A scripting error whose whole text (its code included) depends on the
    /// script or the request (see `crate::lua`).
    Script(String),
}

impl From<KsError> for CmdError {
    fn from(e: KsError) -> Self {
        CmdError::Store(e)
    }
}

impl From<engine::Error> for CmdError {
    fn from(e: engine::Error) -> Self {
        CmdError::Store(KsError::Store(e))
    }
}

/// A client-given text as Redis's `%.128s` prints it: up to its first NUL
/// byte, at most 128 bytes.
fn c_str(a: &[u8]) -> Cow<'_, str> {
    let a = until_nul(a);
    String::from_utf8_lossy(&a[..a.len().min(128)])
}

/// The bytes before the first NUL: what C prints of a string argument.
fn until_nul(a: &[u8]) -> &[u8] {
    a.split(|&b| b == 0).next().unwrap_or_default()
}

impl CmdError {
    /// The error reply's text (without the leading `-`).
    pub fn text(&self) -> Cow<'static, str> {
        use CmdError as E;
        let lossy = |a: &[u8]| String::from_utf8_lossy(a).into_owned();
        Cow::Owned(match self {
            E::Syntax => return "ERR syntax error".into(),
            E::NotInteger => return "ERR value is not an integer or out of range".into(),
            E::NotFloat => return "ERR value is not a valid float".into(),
            E::WrongType => {
                return "WRONGTYPE Operation against a key holding the wrong kind of value".into()
            }
            E::Arity(name) => format!("ERR wrong number of arguments for '{name}' command"),
            E::UnknownCommand(args) => unknown_command(args),
            E::UnknownSubcommand { cmd, sub } => {
                format!("ERR unknown subcommand '{}'. Try {cmd} HELP.", c_str(sub))
            }
            E::SubscriberMode(name) => format!("ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"),
            E::NoAuth => return "NOAUTH Authentication required.".into(),
            E::HelloNoAuth => return "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".into(),
            E::WrongPass => {
                return "WRONGPASS invalid username-password pair or user is disabled.".into()
            }
            E::AuthNotConfigured => return "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?".into(),
            E::ProtoVersionNotInteger => {
                return "ERR Protocol version is not an integer or out of range".into()
            }
            E::NoProto => return "NOPROTO unsupported protocol version".into(),
            E::HelloOption(o) => format!("ERR Syntax error in HELLO option '{}'", lossy(o)),
            E::DebugNotAllowed => return "ERR DEBUG command not allowed. If the enable-debug-command option is set to \"local\", you can run it from a local connection, otherwise you need to set this option in the configuration file, and then restart the server.".into(),
            E::DebugUnknown(sub) => format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'. Try DEBUG HELP.",
                c_str(sub)
            ),
            E::InvalidExpire(cmd) => format!("ERR invalid expire time in '{cmd}' command"),
            E::ExpireOption(o) => format!("ERR Unsupported option {}", lossy(o)),
            E::ExpireNxWithOthers => {
                return "ERR NX and XX, GT or LT options at the same time are not compatible"
                    .into()
            }
            E::ExpireGtWithLt => {
                return "ERR GT and LT options at the same time are not compatible".into()
            }
            E::StringTooLong => {
                return "ERR string exceeds maximum allowed size (proto-max-bulk-len)".into()
            }
            E::OffsetOutOfRange => return "ERR offset is out of range".into(),
            E::BitOffset => return "ERR bit offset is not an integer or out of range".into(),
            E::BitValue => return "ERR bit is not an integer or out of range".into(),
            E::BitfieldType => return "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.".into(),
            E::NotHll => return "WRONGTYPE Key is not a valid HyperLogLog string value.".into(),
            E::HllCorrupt => return "INVALIDOBJ Corrupted HLL object detected".into(),
            E::UnknownPfdebug(sub) => {
                format!("ERR Unknown PFDEBUG subcommand '{}'", c_str(sub))
            }
            E::LcsTooLarge => return "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len".into(),
            E::IncrOverflow => return "ERR increment or decrement would overflow".into(),
            E::DecrOverflow => return "ERR decrement would overflow".into(),
            E::NanOrInfinity => return "ERR increment would produce NaN or Infinity".into(),
            E::InvalidCursor => return "ERR invalid cursor".into(),
            E::NoSuchKey => return "ERR no such key".into(),
            E::SameObject => return "ERR source and destination objects are the same".into(),
            E::IndexOutOfRange => return "ERR index out of range".into(),
            E::RankZero => {
                return "ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list".into()
            }
            E::CountNegative => return "ERR COUNT can't be negative".into(),
            E::MaxlenNegative => return "ERR MAXLEN can't be negative".into(),
            E::CountNotPositive => return "ERR count should be greater than 0".into(),
            E::MustBePositive => return "ERR value is out of range, must be positive".into(),
            E::NumkeysNotPositive => return "ERR numkeys should be greater than 0".into(),
            E::NumkeysTooMany => {
                return "ERR Number of keys can't be greater than number of args".into()
            }
            E::LimitNegative => return "ERR LIMIT can't be negative".into(),
            E::NanOrInfinityArg => return "ERR value is NaN or Infinity".into(),
            E::HashNotInteger => return "ERR hash value is not an integer".into(),
            E::HashNotFloat => return "ERR hash value is not a float".into(),
            E::ValueOutOfRange => return "ERR value is out of range".into(),
            E::RangeBetween { min, max } => {
                format!("ERR value is out of range, value must between {min} and {max}")
            }
            E::IntRange => format!(
                "ERR value is out of range, value must between {} and {}",
                i32::MIN,
                i32::MAX
            ),
            E::DbIndexOutOfRange => return "ERR DB index is out of range".into(),
            E::BadClientName => {
                return "ERR Client names cannot contain spaces, newlines or special characters."
                    .into()
            }
            E::BadClientField(f) => format!(
                "ERR {} cannot contain spaces, newlines or special characters.",
                lossy(f).to_ascii_lowercase()
            ),
            E::UnrecognizedOption(o) => format!("ERR Unrecognized option '{}'", lossy(o)),
            E::UnknownClientType(t) => format!("ERR Unknown client type '{t}'"),
            E::InvalidClientId => return "ERR Invalid client ID".into(),
            E::ConfigImmutable(name) => format!(
                "ERR CONFIG SET failed (possibly related to argument '{name}') - can't set immutable config"
            ),
            E::ConfigUnknown(name) => {
                format!("ERR Unknown option or number of arguments for CONFIG SET - '{name}'")
            }
            E::ConfigInvalid { name, why } => {
                format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {why}")
            }
            E::ConfigMaxclients(room) => format!(
                "ERR CONFIG SET failed (possibly related to argument 'maxclients') - The operating system is not able to handle the specified number of clients, try with {room}"
            ),
            E::InvalidCommand => return "ERR Invalid command specified".into(),
            E::InvalidCommandArity => {
                return "ERR Invalid number of arguments specified for command".into()
            }
            E::NoKeyArguments => return "ERR The command has no key arguments".into(),
            E::InvalidGetkeysArgs => return "ERR Invalid arguments specified for command".into(),
            E::NoShutdown => return "ERR No shutdown in progress.".into(),
            E::NotSupported { what, why } => format!("ERR {what} is not supported by Ember{why}"),
            E::Store(KsError::Corrupt) => {
                return "ERR corrupt value in the heap (run `ember check`)".into()
            }
            E::Store(KsError::Store(e)) => return store_error_text(e),
            E::Store(KsError::Repl(e)) => return crate::cluster::error_text(e).into(),
            E::Store(KsError::Undeclared) => {
                return "ERR the command touched a key that the transaction or script did not declare".into()
            }
            E::NoPermCommand(name) => {
                format!("NOPERM this user has no permissions to run the '{name}' command")
            }
            E::NoPermKey => return "NOPERM this user has no permissions to access one of the keys used as arguments".into(),
            E::NoPermChannel => return "NOPERM this user has no permissions to access one of the channels used as arguments".into(),
            E::Acl(text) => format!("ERR {text}"),
            E::AclBadUsername => {
                return "ERR Usernames can't contain spaces or null characters".into()
            }
            E::AclDeleteDefault => return "ERR The 'default' user cannot be removed".into(),
            E::AclNoFile => return "ERR This Redis instance is not configured to use an ACL file. You may want to specify users via the ACL SETUSER command and then issue a CONFIG REWRITE (assuming you have a Redis configuration file set) in order to store users in the Redis configuration.".into(),
            E::AclSave => return "ERR There was an error trying to save the ACLs. Please check the server logs for more information".into(),
            E::AclUnknownCategory(c) => format!("ERR Unknown category '{}'", c_str(c)),
            E::AclGenpassBits => return "ERR ACL GENPASS argument must be the number of bits for the output password, a positive number up to 4096".into(),
            E::AclNoUser(u) => format!("ERR User '{}' not found", lossy(until_nul(u))),
            E::AclNoCommand(c) => format!("ERR Command '{}' not found", lossy(until_nul(c))),
            E::Msg(text) => format!("ERR {text}"),
            E::TrackingRedirectTwice => return "ERR A client can only redirect to a single other client".into(),
            E::TrackingNoRedirectClient => return "ERR The client ID you want redirect to does not exist".into(),
            E::TrackingPrefixNeedsBcast => return "ERR PREFIX option requires BCAST mode to be enabled".into(),
            E::TrackingBcastSwitch => return "ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.".into(),
            E::TrackingOptWithBcast => return "ERR OPTIN and OPTOUT are not compatible with BCAST".into(),
            E::TrackingOptinAndOptout => return "ERR You can't specify both OPTIN mode and OPTOUT mode".into(),
            E::TrackingOptSwitch => return "ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode.".into(),
            E::TrackingPrefixOverlap { prefix, other, existing } => format!(
                "ERR Prefix '{}' overlaps with {} prefix '{}'. Prefixes for a single client must not overlap.",
                lossy(until_nul(prefix)),
                if *existing { "an existing" } else { "another provided" },
                lossy(until_nul(other)),
            ),
            E::TrackingCachingOff => return "ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled".into(),
            E::TrackingCachingYes => return "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.".into(),
            E::TrackingCachingNo => return "ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.".into(),
            E::Text(t) => return t.clone().into(),
            E::ExecAbort => {
                return "EXECABORT Transaction discarded because of previous errors.".into()
            }
            E::GeoLonLat(lon, lat) => {
                format!("ERR invalid longitude,latitude pair {lon:.6},{lat:.6}")
            }
            E::GeoSearchFrom(cmd) => format!(
                "ERR exactly one of FROMMEMBER or FROMLONLAT can be specified for {}",
                String::from_utf8_lossy(until_nul(cmd))
            ),
            E::GeoSearchBy(cmd) => format!(
                "ERR exactly one of BYRADIUS and BYBOX can be specified for {}",
                String::from_utf8_lossy(until_nul(cmd))
            ),
            E::SortPatternDenied(opt) => {
                format!("ERR {opt} option of SORT denied due to insufficient ACL permissions.")
            }
            E::LfuPolicy => return "ERR An LFU maxmemory policy is selected, idle time not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.".into(),
            E::OomMaxmemory => {
                return "OOM command not allowed when used memory > 'maxmemory'.".into()
            }
            E::NoLfuPolicy => "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.".to_string(),
            E::AtLeastOneKey(cmd) => {
                format!("ERR at least 1 input key is needed for '{cmd}' command")
            }
            E::TimeoutNotFloat => return "ERR timeout is not a float or out of range".into(),
            E::TimeoutNegative => return "ERR timeout is negative".into(),
            E::UnblockReason => {
                return "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR".into()
            }
            E::UnblockedByClient => return "UNBLOCKED client unblocked via CLIENT UNBLOCK".into(),
            E::Script(text) => text.clone(),
            E::SubcommandArgs { cmd, sub } => format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'. Try {cmd} HELP.",
                c_str(sub)
            ),
        })
    }
}

/// A store error in Redis's wording where Redis has one (its text, for
/// callers outside a command's error path).
pub(crate) fn store_text(e: &engine::Error) -> String {
    store_error_text(e).into_owned()
}

/// A store error in Redis's wording where Redis has one.
fn store_error_text(e: &engine::Error) -> Cow<'static, str> {
    use engine::ErrorKind as K;
    Cow::Owned(match e.kind() {
        K::NoRoom { disk } => {
            let why = if disk {
                "the heap's file system is full"
            } else {
                "the heap is full"
            };
            OOM_ERRORS.fetch_add(1, Ordering::Relaxed);
            let reason = format!("{why} ({e})");
            let text = format!("OOM command not allowed when {reason}");
            *OOM_REASON.lock().unwrap_or_else(|e| e.into_inner()) = reason;
            text
        }
        // The store key carries the database byte in front of the client's.
        K::KeyTooLarge { len, max } => format!(
            "ERR key of {len} bytes is too large (Ember's limit is {} bytes)",
            max - 1
        ),
        K::ValueTooLarge => return CmdError::StringTooLong.text(),
        K::RecordTooLarge { len, log } => format!(
            "ERR write of {len} bytes does not fit in a persistent log of {log} bytes (raise --log-size)"
        ),
        K::NotInteger => return CmdError::NotInteger.text(),
        K::Overflow => return CmdError::IncrOverflow.text(),
        K::Internal => format!("ERR internal error: {e}"),
    })
}

/// Redis's "unknown command" error text. Redis formats it with `%.128s` and
/// `'%.*s' `: byte counts, and each argument ends at its first NUL byte (C
/// strings); the text is built from bytes the same way, then made UTF-8.
fn unknown_command(args: &[Vec<u8>]) -> String {
    let mut rest: Vec<u8> = Vec::new();
    for a in &args[1..] {
        if rest.len() >= 128 {
            break;
        }
        let a = until_nul(a);
        let room = 128 - rest.len();
        rest.push(b'\'');
        rest.extend_from_slice(&a[..a.len().min(room)]);
        rest.extend_from_slice(b"' ");
    }
    let name = until_nul(&args[0]);
    let mut msg = b"ERR unknown command '".to_vec();
    msg.extend_from_slice(&name[..name.len().min(128)]);
    msg.extend_from_slice(b"', with args beginning with: ");
    msg.extend_from_slice(&rest);
    String::from_utf8_lossy(&msg).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(e: CmdError) -> String {
        e.text().into_owned()
    }

    #[test]
    fn unknown_command_text_matches_redis() {
        let a: Vec<Vec<u8>> = vec![b"foo".to_vec(), b"a".to_vec(), b"b c".to_vec()];
        assert_eq!(
            text(CmdError::UnknownCommand(a)),
            "ERR unknown command 'foo', with args beginning with: 'a' 'b c' "
        );
        let a: Vec<Vec<u8>> = vec![b"foo".to_vec()];
        assert_eq!(
            text(CmdError::UnknownCommand(a)),
            "ERR unknown command 'foo', with args beginning with: "
        );
        let a: Vec<Vec<u8>> = vec![
            b"get\0x".to_vec(),
            b"ab\0cd".to_vec(),
            vec![b'a'; 200],
            b"z".to_vec(),
        ];
        assert_eq!(
            text(CmdError::UnknownCommand(a)),
            format!(
                "ERR unknown command 'get', with args beginning with: 'ab' '{}' ",
                "a".repeat(123)
            )
        );
    }

    #[test]
    fn texts_take_client_bytes_as_redis_prints_them() {
        assert_eq!(
            text(CmdError::UnknownSubcommand {
                cmd: "CONFIG",
                sub: b"x\0y".to_vec()
            }),
            "ERR unknown subcommand 'x'. Try CONFIG HELP."
        );
        assert_eq!(
            text(CmdError::Arity("client|setname".into())),
            "ERR wrong number of arguments for 'client|setname' command"
        );
        assert_eq!(
            text(CmdError::DebugUnknown(vec![b'z'; 300])),
            format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'. Try DEBUG HELP.",
                "z".repeat(128)
            )
        );
    }
}
