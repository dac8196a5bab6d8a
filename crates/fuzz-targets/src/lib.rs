//! The bodies of Ember's fuzz targets, as plain functions of the input bytes.
//!
//! Each `pub fn NAME(data: &[u8])` is one target: it must return for every
//! input, quickly, and panics (an `assert!` of an invariant, or a bug in the
//! code under test) only on a finding. The cargo-fuzz crate in `fuzz/` at
//! the repository root calls them from its `fuzz_targets/NAME.rs` (libFuzzer
//! turns a panic into a crash and saves the input), and `tests/replay.rs`
//! runs every file of `fuzz/corpus/NAME/` through them as part of the normal
//! test suite, so what the fuzzer once found stays fixed.
//!
//! | target | what it feeds | what it checks |
//! |---|---|---|
//! | [`resp`] | request bytes, read in chunks the input chooses; RESP replies | the codec agrees with the stateless parser on every read and with a one-piece decode; reply encode → parse → encode is the identity |
//! | [`command`] | argument vectors, mostly real commands on a few keys | every command replies with exactly one well-formed RESP2 (or, after `HELLO 3`, RESP3) reply |
//! | [`config`] | a config file's text; `CONFIG SET`-style directives | parsing returns a value or an error |
//! | [`heap`] | patches (offset, bytes) to a small valid heap file | `ember check` on the patched file returns, and nothing it runs panics |
//! | [`memcache`] | memcached text and meta requests, read in chunks the input chooses | the codec consumes within the buffer and frames the same requests however the bytes arrive |
//! | [`acl`] | a user name and ACL rules | parsing returns a user or an error; the user's description (ACL LIST) rebuilds a user that allows the same requests |

#![forbid(unsafe_code)]

pub mod acl;
pub mod command;
pub mod config;
pub mod heap;
pub mod memcache;
pub mod resp;

pub use acl::acl;
pub use command::command;
pub use config::config;
pub use heap::heap;
pub use memcache::memcache;
pub use resp::resp;

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target by name, as `tests/replay.rs` and the corpus directories
/// (`fuzz/corpus/NAME/`) know them.
pub const TARGETS: &[(&str, Target)] = &[
    ("resp", resp),
    ("command", command),
    ("config", config),
    ("heap", heap),
    ("acl", acl),
    ("memcache", memcache),
];
