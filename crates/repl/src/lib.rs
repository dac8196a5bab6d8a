//! Replication: a Raft cluster of Ember nodes (Blizzard, §5–§6).
//!
//! The consensus is TiKV's raft-rs (a `RawNode` driven by our own thread:
//! no async runtime, deterministic given its inputs); this crate supplies
//! what raft-rs leaves to its user:
//! - [`storage`]: the Raft log kept in the node's persistent heap, through
//!   the same store as the data, one crash-atomic batch per Ready;
//! - [`net`]: the transport, Raft messages over TCP between nodes;
//! - [`node`]: the thread that drives raft-rs, proposals and their waiters;
//! - [`apply`]: the apply threads that hand committed entries to the
//!   server's [`node::StateMachine`], in log order or in parallel where
//!   entries commute, which persists the applied index with each entry's
//!   effects (exactly-once apply).
//!
//! An entry's data is opaque here: the server proposes a command's write
//! batch (its effects, with every non-deterministic choice already made)
//! and applies it on every node.

pub mod apply;
pub mod check;
pub mod net;
pub mod node;
pub mod storage;

pub use apply::{MakeStateMachine, MAX_LANES};
pub use node::{parse_peers, Handle, NodeConfig, Peer, ReplError, StateMachine, Status};
pub use storage::{entry_key, read_applied, HeapStorage, APPLIED_KEY, RAFT_PREFIX};
