//! Linear hashing over pieces: a hash's fields, a set's members, a sorted
//! set's member → score map.
//!
//! The table has `2^level + split` buckets, each a piece. A field with hash
//! `h` lives in bucket `h mod 2^level`, or `h mod 2^(level+1)` when that is
//! below `split` (those buckets have been split already). When the average
//! load passes [`GROW_LOAD`], bucket `split` is split into `split` and
//! `split + 2^level` and `split` advances (at `2^level` the level goes up and
//! `split` back to 0); below [`SHRINK_LOAD`] the last bucket is merged back
//! into its buddy. Every insert or delete thus touches one bucket, plus two
//! on a split or merge: O(1) pieces, no directory.
//!
//! The hash is xxh3 seeded with the table's `seed` (random per collection),
//! so a client cannot choose fields that all land in one bucket.
//!
//! Bucket piece, little-endian:
//! ```text
//! u8 kind = 3 ‖ u16 n ‖ n × (varint field len ‖ field ‖ varint value len ‖ value)
//! ```

use super::edit::Edit;
use super::node::{corrupt, put_varint, varint_len, Reader};
use crate::Result;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub const BUCKET: u8 = 3;
/// Average fields per bucket above which a bucket splits.
pub const GROW_LOAD: u64 = 48;
/// Average below which the last bucket merges back (a quarter of the
/// growth load, so a table does not split and merge in turn).
pub const SHRINK_LOAD: u64 = 12;
/// Bucket pieces' ids: this bit set, the bucket index below it (so a sorted
/// set's tree and its table share one id space).
pub const BUCKET_ID: u64 = 1 << 63;

/// A field and its value.
pub type Pair = (Vec<u8>, Vec<u8>);

/// A bucket, decoded: (field, value) pairs in no particular order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bucket(pub Vec<Pair>);

impl Bucket {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            3 + self
                .0
                .iter()
                .map(|(f, v)| {
                    varint_len(f.len() as u64) + f.len() + varint_len(v.len() as u64) + v.len()
                })
                .sum::<usize>(),
        );
        out.push(BUCKET);
        out.extend_from_slice(&(self.0.len() as u16).to_le_bytes());
        for (f, v) in &self.0 {
            put_varint(&mut out, f.len() as u64);
            out.extend_from_slice(f);
            put_varint(&mut out, v.len() as u64);
            out.extend_from_slice(v);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Bucket> {
        let mut r = Reader { b, at: 0 };
        if r.u8()? != BUCKET {
            return Err(corrupt("not a bucket piece".into()));
        }
        let n = u16::from_le_bytes([r.u8()?, r.u8()?]) as usize;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let fl = usize::try_from(r.varint()?).map_err(|_| corrupt("field length".into()))?;
            let f = r.bytes(fl)?.to_vec();
            let vl = usize::try_from(r.varint()?).map_err(|_| corrupt("value length".into()))?;
            v.push((f, r.bytes(vl)?.to_vec()));
        }
        if r.at != b.len() {
            return Err(corrupt("trailing bytes in a bucket".into()));
        }
        Ok(Bucket(v))
    }

    /// The value of `field` in an encoded bucket, read in place (no pair is
    /// copied: a lookup in a large hash, set or sorted set costs one scan of
    /// one bucket's bytes).
    pub fn lookup<'b>(b: &'b [u8], field: &[u8]) -> Result<Option<&'b [u8]>> {
        let mut r = Reader { b, at: 0 };
        if r.u8()? != BUCKET {
            return Err(corrupt("not a bucket piece".into()));
        }
        let n = u16::from_le_bytes([r.u8()?, r.u8()?]) as usize;
        for _ in 0..n {
            let fl = usize::try_from(r.varint()?).map_err(|_| corrupt("field length".into()))?;
            let f = r.bytes(fl)?;
            let vl = usize::try_from(r.varint()?).map_err(|_| corrupt("value length".into()))?;
            let v = r.bytes(vl)?;
            if f == field {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    pub fn find(&self, field: &[u8]) -> Option<usize> {
        self.0.iter().position(|(f, _)| f == field)
    }

    /// Sets `field` (true when it was new).
    pub fn set(&mut self, field: &[u8], value: &[u8]) -> bool {
        match self.find(field) {
            Some(i) => {
                self.0[i].1 = value.to_vec();
                false
            }
            None => {
                self.0.push((field.to_vec(), value.to_vec()));
                true
            }
        }
    }

    /// Deletes `field` (true when it was there).
    pub fn del(&mut self, field: &[u8]) -> bool {
        match self.find(field) {
            Some(i) => {
                // In order: a small hash lists its fields in insertion order,
                // as Redis's listpack does.
                self.0.remove(i);
                true
            }
            None => false,
        }
    }
}

/// The table's state, kept by its owner (in the collection's head value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub level: u32,
    pub split: u64,
    pub count: u64,
    pub seed: u64,
}

impl Meta {
    pub fn new(seed: u64) -> Meta {
        Meta {
            level: 0,
            split: 0,
            count: 0,
            seed,
        }
    }

    pub fn buckets(&self) -> u64 {
        (1u64 << self.level) + self.split
    }

    pub fn hash(&self, field: &[u8]) -> u64 {
        xxh3_64_with_seed(field, self.seed)
    }

    /// The bucket of a hash.
    pub fn bucket_of(&self, h: u64) -> u64 {
        let b = h & ((1u64 << self.level) - 1);
        if b < self.split {
            h & ((2u64 << self.level) - 1)
        } else {
            b
        }
    }
}

/// A table over pieces `P`, with its state `meta`.
pub struct Table<'a, P: super::tree::Pieces> {
    pub p: &'a mut P,
    pub meta: &'a mut Meta,
}

fn bucket_id(b: u64) -> u64 {
    BUCKET_ID | b
}

/// Reverses the bits of `v` above the low `bits` (Redis's SCAN cursor step:
/// the cursor counts up in reverse bit order, so classes split or merged
/// between two steps are neither missed nor, mostly, repeated).
fn next_cursor(v: u64, bits: u32) -> u64 {
    let mask = (1u64 << bits) - 1;
    (v | !mask).reverse_bits().wrapping_add(1).reverse_bits()
}

impl<'a, P: super::tree::Pieces> Table<'a, P> {
    pub fn new(p: &'a mut P, meta: &'a mut Meta) -> Self {
        Table { p, meta }
    }

    fn load(&mut self, b: u64) -> Result<Bucket> {
        match self.p.get(bucket_id(b))? {
            Some(bytes) => Bucket::decode(&bytes),
            None => Ok(Bucket::default()),
        }
    }

    fn store(&mut self, b: u64, bucket: &Bucket) -> Result<()> {
        if bucket.0.is_empty() {
            if self.p.get(bucket_id(b))?.is_some() {
                self.p.remove(bucket_id(b))?;
            }
            Ok(())
        } else {
            self.p.put(bucket_id(b), bucket.encode())
        }
    }

    /// Fills an empty table with `pairs` (distinct fields) in one pass: the
    /// level is chosen so that the load is at most [`GROW_LOAD`], and every
    /// bucket is written once.
    pub fn bulk_load(&mut self, pairs: Vec<Pair>) -> Result<()> {
        if self.meta.count != 0 || self.meta.level != 0 || self.meta.split != 0 {
            return Err(corrupt("bulk load into a non-empty table".into()));
        }
        let n = pairs.len() as u64;
        let mut level = 0;
        while n > GROW_LOAD << level {
            level += 1;
        }
        self.meta.level = level;
        let mut buckets: Vec<Bucket> = vec![Bucket::default(); 1usize << level];
        for (f, v) in pairs {
            let b = self.meta.bucket_of(self.meta.hash(&f));
            buckets[b as usize].0.push((f, v));
        }
        for (b, bucket) in buckets.iter().enumerate() {
            if !bucket.0.is_empty() {
                self.p.put(bucket_id(b as u64), bucket.encode())?;
            }
        }
        self.meta.count = n;
        Ok(())
    }

    pub fn get(&mut self, field: &[u8]) -> Result<Option<Vec<u8>>> {
        let b = self.meta.bucket_of(self.meta.hash(field));
        match self.p.get(bucket_id(b))? {
            Some(bytes) => Ok(Bucket::lookup(&bytes, field)?.map(|v| v.to_vec())),
            None => Ok(None),
        }
    }

    /// Sets `field` to `value`; true when the field is new.
    pub fn set(&mut self, field: &[u8], value: &[u8]) -> Result<bool> {
        let b = self.meta.bucket_of(self.meta.hash(field));
        let id = bucket_id(b);
        let created = match self.p.get(id)? {
            None => {
                self.p
                    .put(id, Bucket(vec![(field.to_vec(), value.to_vec())]).encode())?;
                true
            }
            Some(bytes) => {
                let created = Bucket::lookup(&bytes, field)?.is_none();
                let e = Edit::BucketSet {
                    field: field.to_vec(),
                    value: value.to_vec(),
                };
                self.p.edit(id, false, &e)?;
                created
            }
        };
        if created {
            self.meta.count += 1;
            if self.meta.count > GROW_LOAD * self.meta.buckets() {
                self.split()?;
            }
        }
        Ok(created)
    }

    /// Deletes `field`; true when it was there.
    pub fn del(&mut self, field: &[u8]) -> Result<bool> {
        let b = self.meta.bucket_of(self.meta.hash(field));
        let id = bucket_id(b);
        let Some(bytes) = self.p.get(id)? else {
            return Ok(false);
        };
        if Bucket::lookup(&bytes, field)?.is_none() {
            return Ok(false);
        }
        // The pair count (after the kind byte): the bucket's last pair goes
        // with the bucket.
        if bytes.get(1..3) == Some(&1u16.to_le_bytes()[..]) {
            self.p.remove(id)?;
        } else {
            self.p.edit(
                id,
                false,
                &Edit::BucketDel {
                    field: field.to_vec(),
                },
            )?;
        }
        self.meta.count = self
            .meta
            .count
            .checked_sub(1)
            .ok_or_else(|| corrupt("field count below zero".into()))?;
        if self.meta.buckets() > 1 && self.meta.count < SHRINK_LOAD * self.meta.buckets() {
            self.merge()?;
        }
        Ok(true)
    }

    fn split(&mut self) -> Result<()> {
        let s = self.meta.split;
        let old = self.load(s)?;
        let high = 1u64 << self.meta.level;
        let (mut stay, mut moved) = (Bucket::default(), Bucket::default());
        for (f, v) in old.0 {
            if self.meta.hash(&f) & high != 0 {
                moved.0.push((f, v));
            } else {
                stay.0.push((f, v));
            }
        }
        self.store(s, &stay)?;
        self.store(s + high, &moved)?;
        self.meta.split += 1;
        if self.meta.split == high {
            self.meta.level += 1;
            self.meta.split = 0;
        }
        Ok(())
    }

    fn merge(&mut self) -> Result<()> {
        if self.meta.split == 0 {
            self.meta.level -= 1;
            self.meta.split = 1u64 << self.meta.level;
        }
        self.meta.split -= 1;
        let s = self.meta.split;
        let high = s + (1u64 << self.meta.level);
        let mut into = self.load(s)?;
        let from = self.load(high)?;
        if from.0.is_empty() {
            return Ok(());
        }
        into.0.extend(from.0);
        self.store(high, &Bucket::default())?;
        self.store(s, &into)
    }

    /// One step of a cursor scan (Redis's HSCAN/SSCAN): calls `f` with every
    /// pair of the class the cursor names and returns the next cursor (0:
    /// done). A field present for the whole scan is returned at least once.
    pub fn scan(&mut self, cursor: u64, mut f: impl FnMut(&[u8], &[u8])) -> Result<u64> {
        let level = self.meta.level;
        let b = cursor & ((1u64 << level) - 1);
        let mut visit = vec![b];
        if b < self.meta.split {
            visit.push(b + (1u64 << level));
        }
        for b in visit {
            for (k, v) in &self.load(b)?.0 {
                f(k, v);
            }
        }
        Ok(next_cursor(cursor, level))
    }

    /// Every pair (HGETALL, SMEMBERS): O(n).
    pub fn for_each(&mut self, mut f: impl FnMut(&[u8], &[u8])) -> Result<()> {
        for b in 0..self.meta.buckets() {
            for (k, v) in &self.load(b)?.0 {
                f(k, v);
            }
        }
        Ok(())
    }

    /// A pair chosen at random: a random non-empty bucket, then a random
    /// pair of it (not uniform over pairs when buckets differ in size, as
    /// Redis's dict is not). `rand(n)` returns a number below `n`.
    pub fn random(
        &mut self,
        mut rand: impl FnMut(u64) -> u64,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        if self.meta.count == 0 {
            return Ok(None);
        }
        let n = self.meta.buckets();
        let start = rand(n);
        for i in 0..n {
            let bucket = self.load((start + i) % n)?;
            if !bucket.0.is_empty() {
                let j = rand(bucket.0.len() as u64) as usize;
                return Ok(Some(bucket.0[j].clone()));
            }
        }
        Err(corrupt("a table with a count but no fields".into()))
    }

    /// Every bucket piece in use (to free the table).
    pub fn pieces(&mut self) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        for b in 0..self.meta.buckets() {
            if self.p.get(bucket_id(b))?.is_some() {
                out.push(bucket_id(b));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
