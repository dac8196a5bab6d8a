//! Value blocks: `{tag u32 "EVAL", len u32, owner u64, bytes}`. A value block is
//! written once, made durable, then published by swapping a node's value link, so
//! readers never see a torn value. `owner` is the node whose value link publishes
//! it: recovery uses it to decide reachability exactly (the owner is reachable and
//! its value link points here).

use crate::Result;
use pmem::{PPtr, Region, ThreadHeap};

pub const VAL_TAG: u32 = 0x4c41_5645; // "EVAL"
pub const HDR: u64 = 16;

/// Allocates and writes a value block owned by `owner`; flushed, not fenced (the
/// caller fences before publishing it).
pub fn alloc_value(th: &mut ThreadHeap, owner: u64, v: &[u8]) -> Result<PPtr<u8>> {
    let p = alloc_value_unflushed(th, owner, v)?;
    th.region().flush(p.offset(), (HDR as usize) + v.len());
    Ok(p)
}

/// [`alloc_value`] without the flush: the caller flushes the block's
/// `HDR + v.len()` bytes before the fence that precedes its publication (a
/// batch flushes all its blocks after all its allocations: an allocation's
/// locked instructions would otherwise wait for the flushes before it).
pub fn alloc_value_unflushed(th: &mut ThreadHeap, owner: u64, v: &[u8]) -> Result<PPtr<u8>> {
    let p = th.alloc(HDR + v.len() as u64)?;
    let r = th.region();
    let o = p.offset();
    r.write::<u32>(o, &VAL_TAG);
    r.write::<u32>(o + 4, &(v.len() as u32));
    r.write::<u64>(o + 8, &owner);
    r.write_bytes(o + HDR, v);
    Ok(p)
}

/// Copies a published value into `out` (cleared first).
pub fn read_value(r: &Region, p: u64, out: &mut Vec<u8>) {
    let len: u32 = r.read(p + 4);
    out.clear();
    out.resize(len as usize, 0);
    r.read_bytes(p + HDR, out);
}

/// Length of a published value.
pub fn value_len(r: &Region, p: u64) -> u64 {
    r.read::<u32>(p + 4) as u64
}

/// For a block slot of `slot_size` bytes at `p`: the owner recorded in it if it
/// looks like a value block (tag matches and the length fits the slot).
pub fn value_owner(r: &Region, p: u64, slot_size: u64) -> Option<u64> {
    if slot_size < HDR || !r.contains(p, HDR) {
        return None;
    }
    if r.read::<u32>(p) != VAL_TAG {
        return None;
    }
    let len = r.read::<u32>(p + 4) as u64;
    if HDR + len > slot_size {
        return None;
    }
    Some(r.read::<u64>(p + 8))
}

/// Checks a value block reached from `owner` (for `verify`).
pub fn verify_value(r: &Region, p: u64, owner: u64) -> std::result::Result<u64, String> {
    if p == 0 || !r.contains(p, HDR) {
        return Err(format!(
            "node {owner:#x}: value pointer {p:#x} outside the heap"
        ));
    }
    if r.read::<u32>(p) != VAL_TAG {
        return Err(format!("node {owner:#x}: value block {p:#x} has a bad tag"));
    }
    let len = r.read::<u32>(p + 4) as u64;
    if !r.contains(p, HDR + len) {
        return Err(format!(
            "node {owner:#x}: value block {p:#x} overruns the heap"
        ));
    }
    let o = r.read::<u64>(p + 8);
    if o != owner {
        return Err(format!(
            "value block {p:#x} names owner {o:#x}, but node {owner:#x} links it"
        ));
    }
    Ok(len)
}
