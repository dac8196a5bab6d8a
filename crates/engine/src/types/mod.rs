//! Redis's collection types as pieces of the store (the design:
//! docs/design-collections.md): bounded pieces under internal keys, changed
//! by edits that a command logs instead of the pieces' new bytes.
//!
//! - [`head`]: a collection's head value (inline, or the root of its pieces).
//! - [`node`]: the encoding of a counted B+-tree's pieces.
//! - [`edit`]: the edits of a piece (merge operations) and how they apply.
//! - [`tree`]: the counted B+-tree (lists by position, sorted sets by score).
//! - [`lhash`]: linear hashing (hashes, sets, a sorted set's member → score).
//! - [`stream`]: a stream's head, entries and pending entries.

pub mod edit;
pub mod head;
pub mod lhash;
pub mod node;
pub mod stream;
pub mod tree;
