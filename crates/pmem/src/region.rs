//! The mapped heap file.
//!
//! A region reserves a large virtual range once (`PROT_NONE`, no swap reservation) and
//! maps the file at its start with `MAP_FIXED`, so that growing maps more of the file
//! right after what is mapped and the base never moves: persistent pointers are
//! offsets and stay valid, and so do addresses handed to atomics.
//!
//! All raw access to mapped memory in Ember goes through the methods here, which
//! bounds-check every range (out of range is a panic naming the offset, never UB).
//! No method hands out a `&[u8]` or `&T` into the mapping, except `&AtomicU64` and
//! `&AtomicU32` (atomics permit shared mutation).
//!
//! # Concurrent access
//!
//! The mapping is shared by every thread, so the methods divide as follows:
//!
//! - **Atomic**: [`Region::atomic_u64`] / [`Region::atomic_u32`] (links, bitmap
//!   words, counters, anything two threads may update or one update while
//!   another reads). [`Region::cmp_bytes`] reads with relaxed atomic loads too,
//!   rather than through a `&[u8]` into the mapping (which would assert that
//!   no thread changes those bytes while it lives); plain writes of the same
//!   bytes stay under the protocol below.
//! - **Plain copies**: [`Region::read_bytes`], [`Region::read`],
//!   [`Region::write_bytes`], [`Region::write`], [`Region::fill`] and
//!   [`Region::write_stream`] compile to ordinary loads and stores (`memcpy`
//!   speed, which the value and log paths need). Two plain accesses to the same
//!   byte, one of them a write, race unless one *happens before* the other; a
//!   race is undefined behaviour. Their callers therefore follow one protocol,
//!   under which every such pair is ordered:
//!   1. *Private until published.* A block is written by the one thread that
//!      allocated it (or owns it: a slot's redo log, a writer's log tail) and
//!      made visible only by a `Release` store or CAS of its offset (a link, a
//!      log tail, the root); readers reach it through an `Acquire` load of that
//!      offset, so the writes happen before their reads.
//!   2. *Immutable while reachable.* Once published, those bytes are not
//!      written again until the block is unreachable and every reader that
//!      could still hold its offset has left (the index's epoch reclamation,
//!      the log head's grace period): a reuse happens after the last read.
//!   3. *Or under a lock.* Bytes that do change in place are written and read
//!      under one lock whose acquire and release order the accesses (phash's
//!      bucket locks around its redo-log transactions, the superblock's mutex,
//!      the allocator's page lock for page descriptors and chunk words).
//!
//!   Words that change outside a lock are accessed only as atomics, never
//!   through a plain copy. The signatures cannot check this: a new caller must
//!   name which case its bytes fall under.
//! - **Racy by design**: the crash simulators copy lines and pages that other
//!   threads may be writing, as a write-back would (`read_racy`), and so race
//!   with those stores in the language's model. That exception is confined to
//!   regions a test has attached a simulator to.

use crate::error::{Error, Result};
use crate::layout::*;
use crate::persist::{os_page, PersistStats, Persister, Strategy, LINE};
use crate::sim::CrashSim;
use bytemuck::Pod;
use std::fs::{File, OpenOptions as FsOpen};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// How a region is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Shared writable mapping, exclusive file lock.
    ReadWrite,
    /// Private copy-on-write mapping, shared file lock: recovery may run in memory
    /// without touching the file (used by `ember check`).
    CheckOnly,
}

pub struct Region {
    base: *mut u8,
    reserved: usize,
    size: AtomicUsize,
    file: File,
    path: PathBuf,
    access: Access,
    persister: Arc<Persister>,
    /// The cache-line crash simulator (tests); the power-loss simulator is
    /// the persister's (`Persister::sim`).
    pub(crate) sim: Option<Arc<CrashSim>>,
    sb: Mutex<Superblock>,
    /// The format parameters (fixed for the life of the heap).
    geo: Geometry,
    generation: u64,
    opened_clean: bool,
    /// The reservation's entry in the `SIGBUS` handler's registry.
    _sigbus: crate::sigbus::Registration,
}

// SAFETY: `base`, the one field that is not `Send`, points to the reservation this
// region owns and unmaps only in `Drop`; nothing about it is tied to a thread.
unsafe impl Send for Region {}
// SAFETY: shared use of `base` is sound: every access through it is bounds-checked
// against `size`, which is stored (`Release`) only after the pages below it are
// mapped, and is either atomic or a plain copy under the access protocol of the
// module documentation ("Concurrent access"), which orders conflicting accesses.
// The mapping itself only grows: `extend_mapping` (called with the allocator's
// page lock held, so one growth at a time) maps fresh pages past `size` inside the
// reservation and never moves or unmaps what is mapped.
unsafe impl Sync for Region {}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn reserve(len: usize) -> std::io::Result<*mut u8> {
    // SAFETY: anonymous PROT_NONE mapping at a kernel-chosen address; no existing
    // memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}

/// Maps `[off, off+len)` of the file at `base + off` inside our own reservation.
fn map_file(base: *mut u8, off: usize, len: usize, fd: i32, access: Access) -> std::io::Result<()> {
    let (prot, flags) = match access {
        Access::ReadWrite => (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED),
        Access::CheckOnly => (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE),
    };
    // SAFETY: `base + off .. base + off + len` lies inside the PROT_NONE reservation
    // owned by this region (callers check `off + len <= reserved`), so MAP_FIXED only
    // replaces our own reserved pages.
    let p = unsafe {
        libc::mmap(
            base.add(off) as *mut libc::c_void,
            len,
            prot,
            flags | libc::MAP_FIXED,
            fd,
            off as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Reserves the file's blocks for `[off, off + len)` (`fallocate`, mode 0:
/// the file grows to cover the range), so that no store into the mapping can
/// later find a page the file system cannot back (a `SIGBUS`). True when
/// reserved; false when the file system cannot reserve (`EOPNOTSUPP`: said
/// once per process on stderr). No room is [`Error::NoSpace`].
fn reserve_blocks(file: &File, path: &Path, off: u64, len: u64) -> Result<bool> {
    if len == 0 {
        return Ok(true);
    }
    loop {
        // SAFETY: fallocate on our own open descriptor; no memory is passed.
        let rc =
            unsafe { libc::fallocate(file.as_raw_fd(), 0, off as libc::off_t, len as libc::off_t) };
        if rc == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) => {
                static SAID: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "ember: warning: {}: the file system cannot reserve the heap's blocks (fallocate: {e}); if it fills up, a store into the heap ends the process (SIGBUS) instead of failing the write",
                        path.display()
                    );
                }
                return Ok(false);
            }
            _ if is_no_space(&e) => return Err(no_space(path, len, e)),
            _ => return Err(Error::io(path, e)),
        }
    }
}

/// Whether a failed file operation found no room (full, over quota, over
/// the file-size limit).
fn is_no_space(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
    )
}

/// The error for a reservation of `len` bytes that found no room, naming the
/// file system by the heap's directory and what it has left.
fn no_space(path: &Path, len: u64, source: std::io::Error) -> Error {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let available = fs_available(&dir).unwrap_or(0);
    Error::NoSpace {
        path: path.to_path_buf(),
        dir,
        requested: len,
        available,
        source,
    }
}

/// Bytes available to this user on the file system holding `dir`.
fn fs_available(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is plain C data, for which all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated string that outlives the call, and `st` a
    // live, writable struct the call only fills in.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Parameters for creating a heap file.
#[derive(Clone, Debug)]
pub struct CreateParams {
    pub size: u64,
    pub geometry: Geometry,
}

impl Region {
    /// Creates a new heap file of at least `size` bytes, its blocks reserved
    /// (`reserve_blocks`), and maps it. A file system without room for it is
    /// [`Error::NoSpace`], and the file is removed again.
    pub(crate) fn create(
        path: &Path,
        params: &CreateParams,
        reserve_len: u64,
        persister: Persister,
    ) -> Result<Region> {
        params.geometry.validate().map_err(Error::InvalidOptions)?;
        let size = params.geometry.round_size(params.size);
        let file = FsOpen::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Error::Exists {
                        path: path.to_path_buf(),
                    }
                } else {
                    Error::io(path, e)
                }
            })?;
        lock_file(&file, path, Access::ReadWrite)?;
        let sized = file
            .set_len(size)
            .map_err(|e| Error::io(path, e))
            .and_then(|()| reserve_blocks(&file, path, 0, size));
        if let Err(e) = sized {
            drop(file);
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        let sb = Superblock {
            version: FORMAT_VERSION,
            uuid: *uuid::Uuid::new_v4().as_bytes(),
            seq: 0,
            size,
            generation: 1,
            root: 0,
            clean: false,
            geometry: params.geometry,
            created: now_unix(),
        };
        let region = Self::map(file, path, sb, reserve_len, Access::ReadWrite, persister)?;
        // Format every chunk header, then publish the superblock: a crash before the
        // superblock is durable leaves a file that is refused as "not an Ember heap".
        for c in 0..params.geometry.chunks_in(size) {
            let off = params.geometry.chunk_off(c);
            region.write(off, &chunk_word(CHUNK_NORMAL, 0));
            region.flush(off, 8);
        }
        region.fence();
        region.write_superblock(sb)?;
        // The file's length itself must survive a crash too.
        region.sync_metadata()?;
        Ok(region)
    }

    /// Opens an existing heap file and validates its superblock.
    pub(crate) fn open(
        path: &Path,
        access: Access,
        reserve_len: u64,
        persister: Persister,
    ) -> Result<Region> {
        let file = FsOpen::new()
            .read(true)
            .write(access == Access::ReadWrite)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if !meta.is_file() {
            return Err(Error::NotAHeap {
                path: path.to_path_buf(),
                detail: "not a regular file".into(),
            });
        }
        let flen = meta.len();
        if flen < SB_B + SB_LEN as u64 {
            return Err(Error::NotAHeap {
                path: path.to_path_buf(),
                detail: format!("file is only {flen} bytes"),
            });
        }
        lock_file(&file, path, access)?;
        let sb = read_superblock(&file, path)?;
        if sb.size > flen {
            return Err(Error::Truncated {
                path: path.to_path_buf(),
                expected: sb.size,
                actual: flen,
            });
        }
        if access == Access::ReadWrite {
            // A heap written before its blocks were reserved (or copied
            // sparse) has holes: reserve them now, so that a full file system
            // is this error at the start rather than a SIGBUS later.
            use std::os::unix::fs::MetadataExt;
            if meta.blocks().saturating_mul(512) < sb.size {
                reserve_blocks(&file, path, 0, sb.size)?;
            }
        }
        let mut region = Self::map(file, path, sb, reserve_len, access, persister)?;
        if access == Access::ReadWrite {
            let mut nsb = sb;
            nsb.generation = nsb
                .generation
                .checked_add(1)
                .ok_or_else(|| Error::Corrupt {
                    path: path.to_path_buf(),
                    detail: "superblock generation at its maximum".into(),
                })?;
            nsb.clean = false;
            nsb.version = FORMAT_VERSION;
            region.generation = nsb.generation;
            region.write_superblock(nsb)?;
        }
        Ok(region)
    }

    fn map(
        file: File,
        path: &Path,
        sb: Superblock,
        reserve_len: u64,
        access: Access,
        persister: Persister,
    ) -> Result<Region> {
        let reserved = reserve_len.max(sb.size).next_multiple_of(PAGE) as usize;
        let base = reserve(reserved).map_err(|e| Error::io(path, e))?;
        let persister = Arc::new_cyclic(|this| Persister {
            this: this.clone(),
            base: base as usize,
            ..persister
        });
        let sigbus = crate::sigbus::register(base as usize, reserved, path);
        let region = Region {
            base,
            reserved,
            size: AtomicUsize::new(0),
            file,
            path: path.to_path_buf(),
            access,
            persister,
            sim: None,
            sb: Mutex::new(sb),
            geo: sb.geometry,
            generation: sb.generation,
            opened_clean: sb.clean,
            _sigbus: sigbus,
        };
        map_file(base, 0, sb.size as usize, region.file.as_raw_fd(), access)
            .map_err(|e| Error::io(path, e))?;
        region.size.store(sb.size as usize, Ordering::Release);
        Ok(region)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn access(&self) -> Access {
        self.access
    }
    /// Bytes currently mapped and in use.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire) as u64
    }
    /// The largest size this mapping can grow to without moving.
    pub fn reserved(&self) -> u64 {
        self.reserved as u64
    }
    /// Whether the superblock said "clean shutdown" when this region was opened.
    pub fn opened_clean(&self) -> bool {
        self.opened_clean
    }
    /// The open generation (bumped at every read-write open).
    pub fn generation(&self) -> u64 {
        self.generation
    }
    pub fn superblock(&self) -> Superblock {
        *self.sb.lock().unwrap()
    }
    pub fn geometry(&self) -> Geometry {
        self.geo
    }
    pub fn strategy(&self) -> Strategy {
        self.persister.strategy
    }
    pub fn fence_ns(&self) -> u64 {
        self.persister.fence_ns
    }
    /// The emulated extra latency per index node read, in ns (0 = none).
    pub fn read_ns(&self) -> u64 {
        self.persister.read_ns
    }
    /// Charges one index node read of emulated latency (nothing unless
    /// `HeapOptions::read_ns` is set). Index searches call it per node.
    #[inline]
    pub fn emulate_read(&self) {
        let ns = self.persister.read_ns;
        if ns != 0 {
            crate::persist::spin_ns(ns);
        }
    }
    /// Whether every persist so far succeeded. After a failed `msync`, `fsync`,
    /// write through the file or file extension (an I/O error of the medium, or
    /// no space) durability is no longer guaranteed: callers must stop
    /// acknowledging writes. A failure stays: a later sync that succeeds does not
    /// say the pages whose write-back failed reached the file.
    pub fn health(&self) -> Result<()> {
        match self.persister.failed.load(Ordering::SeqCst) {
            0 => Ok(()),
            errno => Err(Error::io(
                &self.path,
                std::io::Error::from_raw_os_error(errno),
            )),
        }
    }

    pub fn persist_stats(&self) -> PersistStats {
        self.persister.counters.snapshot()
    }

    /// Records a failed file operation (see `health`) and returns it as an error.
    fn io_failed(&self, e: std::io::Error) -> Error {
        self.persister
            .record_failure(e.raw_os_error().unwrap_or(libc::EIO));
        Error::io(&self.path, e)
    }

    /// The error injected for the next fsync or file extension
    /// (`fail_next_file_op`), taken.
    fn injected(&self) -> std::io::Result<()> {
        match self.persister.inject.swap(0, Ordering::SeqCst) {
            0 => Ok(()),
            errno => Err(std::io::Error::from_raw_os_error(errno)),
        }
    }

    /// Tests: the next `fsync` of the file or extension of it fails with
    /// `errno`, as a write-back error reported by the kernel would.
    #[doc(hidden)]
    pub fn fail_next_file_op(&self, errno: i32) {
        self.persister.inject.store(errno, Ordering::SeqCst);
    }

    /// Whether `[off, off+len)` lies inside the heap.
    #[inline]
    pub fn contains(&self, off: u64, len: u64) -> bool {
        off.checked_add(len).is_some_and(|e| e <= self.size())
    }

    #[inline]
    #[track_caller]
    fn check(&self, off: u64, len: usize) -> *mut u8 {
        let end = off.checked_add(len as u64);
        match end {
            Some(e) if e <= self.size.load(Ordering::Acquire) as u64 => {
                // SAFETY: `off + len <= size <= reserved` (checked just above),
                // so `base + off` stays inside the reservation, one allocation.
                unsafe { self.base.add(off as usize) }
            }
            _ => panic!(
                "persistent heap access out of bounds: [{off:#x}, +{len}) beyond {:#x} in {}",
                self.size(),
                self.path.display()
            ),
        }
    }

    /// Copies bytes out of the heap.
    ///
    /// A plain (non-atomic) copy: the bytes must not be written by another
    /// thread during the copy, which the access protocol of the module
    /// documentation ("Concurrent access") guarantees. Words that threads
    /// change concurrently are read with [`Region::atomic_u64`] instead.
    #[inline]
    #[track_caller]
    pub fn read_bytes(&self, off: u64, dst: &mut [u8]) {
        let p = self.check(off, dst.len());
        // SAFETY: `p..p+len` is mapped (checked) and stays mapped while `self`
        // lives; `dst` is a Rust buffer, so it cannot overlap the mapping. No
        // other thread writes these bytes during the copy (the access protocol,
        // module documentation), so the non-atomic reads race with nothing.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies bytes out of the heap that other threads may be writing at the
    /// same moment: the crash simulators' copies of lines and pages still in
    /// use, which must see memory as a write-back would (a byte written during
    /// the copy is seen old or new). A plain copy, as `read_bytes`, so it races
    /// with those stores in the language's memory model: the one exception to
    /// the access protocol, confined to regions a test has attached a simulator
    /// to. (Relaxed atomic loads would remove the race with atomic words only,
    /// not with other threads' plain stores into the same pages, and made the
    /// simulators' whole-heap page copies several times slower.)
    #[track_caller]
    pub(crate) fn read_racy(&self, off: u64, dst: &mut [u8]) {
        let p = self.check(off, dst.len());
        // SAFETY: `p..p+len` is mapped (checked) and stays mapped while `self`
        // lives; `dst` is a Rust buffer, disjoint from the mapping. Stores of
        // other threads may race with the copy: the simulators' exception
        // stated above, which no production path takes.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) }
    }

    /// Compares the `len` bytes at `off` with `other` in memcmp order (the
    /// order of `<[u8]>::cmp`: the first differing byte, then the length),
    /// without copying them out and without a `&[u8]` into the mapping: the
    /// heap's bytes are read 8 at a time (one at a time at unaligned ends)
    /// with relaxed atomic loads, at about the cost of a `memcmp` for keys of
    /// a few words. For a meaningful answer the bytes must not change during
    /// the call: a published key, written before its node is published and
    /// never again while the node is reachable (the access protocol of the
    /// module documentation, as for [`Region::read_bytes`]).
    #[inline]
    #[track_caller]
    pub fn cmp_bytes(&self, off: u64, len: usize, other: &[u8]) -> std::cmp::Ordering {
        let p = self.check(off, len);
        // SAFETY: `p..p+len` is mapped (checked), readable and writable, and
        // stays mapped while `self` lives. No other thread writes these bytes
        // during the call (access protocol): no store, plain or atomic, races
        // with the loads.
        unsafe { cmp_relaxed(p, len, other) }
    }

    /// Copies bytes into the heap (not yet durable: flush and fence).
    ///
    /// A plain (non-atomic) copy: no other thread may read or write these
    /// bytes during it, which the access protocol of the module documentation
    /// ("Concurrent access") guarantees: the bytes are private to this thread
    /// until published, or guarded by a lock.
    #[inline]
    #[track_caller]
    pub fn write_bytes(&self, off: u64, src: &[u8]) {
        let p = self.check(off, src.len());
        // SAFETY: `p..p+len` is mapped writable (checked) and stays mapped while
        // `self` lives; `src` is a Rust buffer, so it cannot overlap the mapping.
        // No other thread accesses these bytes during the copy (the access
        // protocol, module documentation), so the non-atomic stores race with
        // nothing.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) }
    }

    /// Writes `src` at `off` through the file (`pwrite` into the page cache)
    /// instead of through the mapping, which sees the bytes at once (one page
    /// cache). For bytes written in bulk and made durable by an msync soon
    /// after (a group commit's log records): their pages are never dirtied
    /// through the mapping, so they take no write-protect faults and their
    /// write-back needs no TLB shootdown (ARCHITECTURE.md, "Log writes under
    /// msync"). Durable after a fence covering a `flush` of the range, as a
    /// store would be. A failure is recorded as a failed msync is (`health`).
    /// A read-only region refuses, and so does one under the cache-line
    /// simulator (which sees only stores and flushes); the power-loss
    /// simulator models the write (the page cache changes, nothing is
    /// durable yet).
    pub fn write_through(&self, off: u64, src: &[u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        if self.access != Access::ReadWrite || self.sim.is_some() {
            return Err(Error::ReadOnly);
        }
        self.check(off, src.len());
        if let Some(sim) = self.persister.sim.get() {
            sim.on_write_through(self);
        }
        if let Err(e) = self.file.write_all_at(src, off) {
            return Err(self.io_failed(e));
        }
        self.persister.counted_write_through();
        Ok(())
    }

    /// Whether the cache-line crash simulator watches this region (it sees
    /// only stores and flushes: writes through the file are refused). The
    /// power-loss simulator, which models the file, does not count here.
    pub fn simulated(&self) -> bool {
        self.sim.is_some()
    }

    /// The power-loss simulator watching this region, if any.
    pub fn power_loss_sim(&self) -> Option<&Arc<CrashSim>> {
        self.persister.sim.get()
    }

    /// Fills a range with one byte value. Non-atomic, as
    /// [`Region::write_bytes`] (same requirement).
    #[track_caller]
    pub fn fill(&self, off: u64, len: usize, byte: u8) {
        let p = self.check(off, len);
        // SAFETY: as for `write_bytes`: mapped writable (checked), and no other
        // thread accesses the range during the fill (access protocol).
        unsafe { std::ptr::write_bytes(p, byte, len) }
    }

    /// Reads a plain-data value (unaligned copy). Non-atomic, as
    /// [`Region::read_bytes`] (same requirement).
    #[inline]
    #[track_caller]
    pub fn read<T: Pod>(&self, off: u64) -> T {
        let p = self.check(off, std::mem::size_of::<T>());
        // SAFETY: `size_of::<T>()` bytes at `p` are mapped (checked);
        // `read_unaligned` needs no alignment, and `T: Pod` makes every bit
        // pattern a valid `T`. No other thread writes them during the read
        // (access protocol).
        unsafe { std::ptr::read_unaligned(p as *const T) }
    }

    /// Writes a plain-data value (unaligned copy). Non-atomic, as
    /// [`Region::write_bytes`] (same requirement).
    #[inline]
    #[track_caller]
    pub fn write<T: Pod>(&self, off: u64, v: &T) {
        let p = self.check(off, std::mem::size_of::<T>());
        // SAFETY: `size_of::<T>()` bytes at `p` are mapped writable (checked);
        // `write_unaligned` needs no alignment, and `T: Pod` has no padding, so
        // every byte written is initialised. No other thread accesses them
        // during the write (access protocol).
        unsafe { std::ptr::write_unaligned(p as *mut T, *v) }
    }

    /// The 8-byte word at `off` (8-aligned) as an atomic.
    #[inline]
    #[track_caller]
    pub fn atomic_u64(&self, off: u64) -> &AtomicU64 {
        assert!(off.is_multiple_of(8), "unaligned atomic at {off:#x}");
        let p = self.check(off, 8);
        // SAFETY: in bounds, 8-aligned (the base is page aligned); the mapping lives
        // as long as `self` and never moves, so the reference cannot dangle. Atomics
        // permit shared mutation.
        unsafe { &*(p as *const AtomicU64) }
    }

    /// The 4-byte word at `off` (4-aligned) as an atomic.
    #[inline]
    #[track_caller]
    pub fn atomic_u32(&self, off: u64) -> &AtomicU32 {
        assert!(off.is_multiple_of(4), "unaligned atomic at {off:#x}");
        let p = self.check(off, 4);
        // SAFETY: as for atomic_u64.
        unsafe { &*(p as *const AtomicU32) }
    }

    /// A hint: starts fetching the cache line at `off` (ignored outside the
    /// mapping; never faults).
    #[inline]
    pub fn prefetch(&self, off: u64) {
        if off < self.size.load(Ordering::Acquire) as u64 {
            prefetch_line(self.base.wrapping_add(off as usize));
        }
    }

    /// A hint: maps the pages covering `[off, off+len)` writable now, so that the
    /// first stores to them do not each take a page fault (on a file, each such
    /// fault also reserves the page's block and zeroes it). Changes no byte of the
    /// heap and no durability state. Returns whether the kernel did it: false on a
    /// private check mapping, under the crash simulator, outside the heap, or where
    /// the kernel lacks `MADV_POPULATE_WRITE` (Linux < 5.14) or refused it (no
    /// space for the blocks: the first store would then fault and fail as before).
    pub fn populate(&self, off: u64, len: u64) -> bool {
        self.populate_with(off, len, libc::MADV_POPULATE_WRITE)
    }

    /// As `populate`, but maps the pages read-only (`MADV_POPULATE_READ`): for
    /// pages written through the file (`write_through`), which then only need
    /// to be in memory, and whose write-back finds no writable mapping to
    /// clean.
    pub fn populate_read(&self, off: u64, len: u64) -> bool {
        self.populate_with(off, len, libc::MADV_POPULATE_READ)
    }

    /// A hint: unmaps from this process the pages wholly inside
    /// `[off, off+len)` (`MADV_DONTNEED`), so that they leave its resident set
    /// until next touched. The heap is a shared file mapping: the pages' bytes
    /// stay in the file's page cache (dirty ones are written back as usual) and
    /// the next access maps the same bytes again, so no byte of the heap and no
    /// durability state changes. For space that is not read again soon, such
    /// as a log's records already applied. Returns whether the kernel did it:
    /// false on a private check mapping (where it would drop the private
    /// copies), under the crash simulator, or outside the heap.
    pub fn release(&self, off: u64, len: u64) -> bool {
        // Inward: only pages that lie wholly inside the range. The mapping
        // is MAP_SHARED on the file (`Access::ReadWrite`, checked by
        // `advise`), for which MADV_DONTNEED keeps every byte.
        self.advise(off, len, libc::MADV_DONTNEED, true)
    }

    /// Diagnostics and tests: how many of the pages covering `[off, off+len)`
    /// are in this process's page tables now (its resident set), from
    /// `/proc/self/pagemap`; `None` where that cannot be read or the range is
    /// outside the heap.
    pub fn resident_pages(&self, off: u64, len: u64) -> Option<u64> {
        use std::io::{Read, Seek, SeekFrom};
        if len == 0 || !self.contains(off, len) {
            return None;
        }
        let page = os_page() as u64;
        let first = (self.base as u64 + off) / page;
        let last = (self.base as u64 + off + len).div_ceil(page);
        let mut f = std::fs::File::open("/proc/self/pagemap").ok()?;
        f.seek(SeekFrom::Start(first * 8)).ok()?;
        let mut buf = vec![0u8; ((last - first) * 8) as usize];
        f.read_exact(&mut buf).ok()?;
        Some(
            buf.chunks_exact(8)
                .filter(|e| u64::from_le_bytes((*e).try_into().unwrap_or_default()) >> 63 == 1)
                .count() as u64,
        )
    }

    fn populate_with(&self, off: u64, len: u64, advice: libc::c_int) -> bool {
        self.advise(off, len, advice, false)
    }

    /// `madvise` over the pages covering `[off, off+len)` (`inward`: only
    /// those wholly inside it), on the shared read-write mapping only: the
    /// advice given (populate, or drop from the page tables) changes no byte
    /// of the heap and no durability state there.
    fn advise(&self, off: u64, len: u64, advice: libc::c_int, inward: bool) -> bool {
        if self.access != Access::ReadWrite || self.sim.is_some() || len == 0 {
            return false;
        }
        if !self.contains(off, len) {
            return false;
        }
        let page = os_page() as u64;
        let (a, b) = if inward {
            (off.div_ceil(page) * page, (off + len) & !(page - 1))
        } else {
            (off & !(page - 1), (off + len).div_ceil(page) * page)
        };
        let b = b.min(self.size());
        if a >= b {
            return false;
        }
        // SAFETY: `[a, b)` lies inside the mapped part of our own reservation
        // (checked against `size` above; the mapping only ever grows), a
        // MAP_SHARED file mapping: populating faults pages in as an access
        // would, and MADV_DONTNEED only unmaps them (the page cache keeps
        // their bytes; the next access maps them again).
        let rc = unsafe {
            libc::madvise(
                self.base.add(a as usize) as *mut libc::c_void,
                (b - a) as usize,
                advice,
            )
        };
        rc == 0
    }

    /// Writes back the cache lines covering `[off, off+len)`.
    #[inline]
    #[track_caller]
    pub fn flush(&self, off: u64, len: usize) {
        let p = self.check(off, len) as usize;
        self.persister.flush(p, len);
        if let Some(sim) = &self.sim {
            sim.on_flush(off, len);
        }
    }

    /// Writes and flushes `src` at `off` in one pass (`write_bytes` + `flush`),
    /// with non-temporal stores where the strategy writes lines back: for bytes
    /// nobody reads soon, such as a log record. Durable after this thread's next
    /// fence; other threads are only sure to see the bytes after that fence too,
    /// so publish them after it.
    #[inline]
    #[track_caller]
    pub fn write_stream(&self, off: u64, src: &[u8]) {
        let p = self.check(off, src.len()) as usize;
        self.persister.stream(p, src);
        if let Some(sim) = &self.sim {
            sim.on_flush(off, src.len());
        }
    }

    /// Waits until this thread's earlier flushes are durable.
    #[inline]
    pub fn fence(&self) {
        if let Some(sim) = &self.sim {
            sim.on_fence(self);
        }
        self.persister.fence();
    }

    /// A fence taken apart: what this thread flushed so far, detached from the
    /// thread, for [`Region::complete_fence`] to make durable later, on any
    /// thread (a pipelined group commit: the msync runs on another thread while
    /// this one goes on). This thread's next fence no longer covers these
    /// flushes. Only the msync strategy defers the sync: with the others the
    /// fence is an instruction, cheap, and happens here (the crash simulator's
    /// view of it is deferred all the same).
    pub fn detach_fence(&self) -> DetachedFence {
        let sim_lines = self.sim.as_ref().map(|s| s.detach());
        let ranges = if self.persister.strategy == Strategy::Msync {
            self.persister.take_dirty()
        } else {
            // The hardware fence orders this thread's write-backs: here.
            self.persister.fence();
            Vec::new()
        };
        DetachedFence {
            ranges,
            sim_lines,
            owner: Arc::downgrade(&self.persister),
        }
    }

    /// Makes the flushes of a [`Region::detach_fence`] durable (any thread).
    /// Check [`Region::health`] after it, as after a fence.
    pub fn complete_fence(&self, mut f: DetachedFence) {
        if let (Some(sim), Some(lines)) = (&self.sim, f.sim_lines.take()) {
            sim.on_fence_lines(self, lines);
        }
        if self.persister.strategy == Strategy::Msync {
            self.persister.sync(std::mem::take(&mut f.ranges));
            self.persister.counted_fence();
        }
    }

    /// flush + fence.
    #[inline]
    #[track_caller]
    pub fn persist(&self, off: u64, len: usize) {
        self.flush(off, len);
        self.fence();
    }

    /// A snapshot of `[0, size)` (tests and the crash simulator). Other
    /// threads may be writing meanwhile only under a simulator (`read_racy`).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.size() as usize];
        self.read_racy(0, &mut v);
        v
    }

    /// Compares one cache line of the mapping with `img`, without a reference
    /// into the mapping (relaxed atomic loads, as `cmp_bytes`). Other threads
    /// may be writing the line meanwhile: the crash simulator's exception to
    /// the access protocol (see `read_racy`).
    pub(crate) fn line_differs(&self, off: u64, img: &[u8]) -> bool {
        let line = &img[off as usize..off as usize + LINE];
        let p = self.check(off, LINE);
        // SAFETY: the line is mapped (checked), readable and writable, and stays
        // mapped while `self` lives. A line is 8-aligned, so these loads race
        // with no update of an 8-byte atomic word; other threads' plain stores
        // into it are the simulators' exception (`read_racy`).
        unsafe { cmp_relaxed(p, LINE, line) != std::cmp::Ordering::Equal }
    }

    /// Writes a new superblock into the copy that is not current and persists it.
    pub(crate) fn write_superblock(&self, sb: Superblock) -> Result<()> {
        self.update_superblock(|cur| *cur = sb)
    }

    /// Updates superblock fields through a closure and persists the result. The
    /// read-modify-write runs under one lock, so concurrent updates (a root change
    /// and a growth) never lose each other's fields.
    pub(crate) fn update_superblock(&self, f: impl FnOnce(&mut Superblock)) -> Result<()> {
        let mut cur = self.sb.lock().unwrap();
        let mut sb = *cur;
        f(&mut sb);
        if self.access != Access::ReadWrite {
            // A private check mapping only records changes in memory.
            *cur = sb;
            return Ok(());
        }
        sb.seq = cur.seq.checked_add(1).ok_or_else(|| Error::Corrupt {
            path: self.path.clone(),
            detail: "superblock sequence at its maximum".into(),
        })?;
        let off = if sb.seq.is_multiple_of(2) { SB_A } else { SB_B };
        self.write_bytes(off, &sb.encode());
        self.persist(off, SB_LEN);
        *cur = sb;
        Ok(())
    }

    /// `fsync` of the file's metadata (its length after create or grow), and
    /// with it every dirty page. A failure is recorded (`health`): the
    /// write-back error it reports belongs to pages that later msyncs of the
    /// same file would no longer report.
    pub(crate) fn sync_metadata(&self) -> Result<()> {
        if self.access == Access::ReadWrite && self.sim.is_none() {
            if let Some(sim) = self.persister.sim.get() {
                sim.on_fsync(self);
            }
            self.injected()
                .and_then(|()| self.file.sync_all())
                .map_err(|e| self.io_failed(e))?;
        }
        Ok(())
    }

    /// Extends the file and the mapping to `new_size` (no superblock change; the
    /// caller formats what it added and then publishes the size).
    pub(crate) fn extend_mapping(&self, new_size: u64) -> Result<()> {
        if self.access != Access::ReadWrite {
            // A private mapping past the end of the file would fault on first touch.
            return Err(Error::ReadOnly);
        }
        let old = self.size();
        if new_size <= old {
            return Ok(());
        }
        if new_size > self.reserved as u64 {
            return Err(Error::HeapFull {
                requested: new_size - old,
                heap_size: old,
                max_size: self.reserved as u64,
            });
        }
        if self.access == Access::ReadWrite {
            let flen = self
                .file
                .metadata()
                .map_err(|e| Error::io(&self.path, e))?
                .len();
            // The new part's blocks are reserved before any store can reach
            // them; without room the growth fails here, as a full heap does,
            // and whatever the failed call allocated is given back. Finding
            // no room loses nothing written before (the heap stays healthy,
            // and a later growth may succeed once room is freed); any other
            // failure to extend the file is recorded as a failed persist
            // (`health`).
            let reserved = match self.injected() {
                Err(e) if is_no_space(&e) => Err(no_space(&self.path, new_size - old, e)),
                Err(e) => Err(self.io_failed(e)),
                Ok(()) => reserve_blocks(&self.file, &self.path, old, new_size - old),
            };
            match reserved {
                Ok(true) => {}
                Ok(false) => {
                    if flen < new_size {
                        self.file.set_len(new_size).map_err(|e| {
                            if is_no_space(&e) {
                                no_space(&self.path, new_size - old, e)
                            } else {
                                self.io_failed(e)
                            }
                        })?;
                    }
                }
                Err(e) => {
                    if !matches!(e, Error::NoSpace { .. }) {
                        self.persister.record_failure(libc::EIO);
                    }
                    let _ = self.file.set_len(flen);
                    return Err(e);
                }
            }
        }
        map_file(
            self.base,
            old as usize,
            (new_size - old) as usize,
            self.file.as_raw_fd(),
            self.access,
        )
        .map_err(|e| Error::io(&self.path, e))?;
        if let Some(sim) = self.sim.as_ref().or(self.persister.sim.get()) {
            sim.on_grow(self, old, new_size);
        }
        self.size.store(new_size as usize, Ordering::Release);
        Ok(())
    }

    /// A private view's open generation moves one past the file's, as a
    /// writable open's does, without writing the superblock.
    pub(crate) fn next_generation_in_memory(&mut self) -> Result<()> {
        self.generation = self
            .generation
            .checked_add(1)
            .ok_or_else(|| Error::Corrupt {
                path: self.path.clone(),
                detail: "superblock generation at its maximum".into(),
            })?;
        Ok(())
    }

    pub(crate) fn attach_sim(&mut self, sim: Arc<CrashSim>) {
        sim.reset_from(self);
        if sim.is_power_loss() {
            let _ = self.persister.sim.set(sim);
        } else {
            self.sim = Some(sim);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.access == Access::ReadWrite && self.persister.strategy == Strategy::Msync {
            // Flushes some thread never fenced (its list still holds them)
            // are synced here, as cache-line write-backs never fenced still
            // complete: under msync too, what was flushed is durable once the
            // region is closed.
            let size = self.size();
            if size > 0 {
                self.persister.sync(vec![(
                    self.base as usize,
                    self.base as usize + size as usize,
                )]);
            }
        }
        // No sync from a thread's exit or a dropped detached fence runs from
        // now on.
        self.persister.close();
        // SAFETY: `base..base+reserved` is the reservation created in `map`, which
        // includes every file mapping we placed inside it; nothing borrows it any more
        // (all borrows are tied to `&self`).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.reserved);
        }
    }
}

/// How long a heap's lock is retried before the heap is reported in use.
///
/// The lock (`flock`) belongs to the open file, which a child this process is
/// spawning shares: between its `clone` and its `exec` the child holds a copy
/// of every descriptor, so a heap closed and reopened by one thread while
/// another spawns a process can find its own lock still held for a moment. The copy goes at the `exec` (the descriptor is close-on-exec): a
/// lock held for longer than this is another process's.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

fn lock_file(file: &File, path: &Path, access: Access) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        let r = match access {
            Access::ReadWrite => file.try_lock(),
            Access::CheckOnly => file.try_lock_shared(),
        };
        match r {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < LOCK_RETRY => {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::InUse {
                    path: path.to_path_buf(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(path, e)),
        }
    }
}

fn read_superblock(file: &File, path: &Path) -> Result<Superblock> {
    use std::os::unix::fs::FileExt;
    let mut a = [0u8; SB_LEN];
    let mut b = [0u8; SB_LEN];
    file.read_exact_at(&mut a, SB_A)
        .map_err(|e| Error::io(path, e))?;
    file.read_exact_at(&mut b, SB_B)
        .map_err(|e| Error::io(path, e))?;
    if a[0..7] != MAGIC[0..7] && b[0..7] != MAGIC[0..7] {
        return Err(Error::NotAHeap {
            path: path.to_path_buf(),
            detail: "bad magic".into(),
        });
    }
    let sa = Superblock::decode(path, &a)?;
    let sbb = Superblock::decode(path, &b)?;
    match (sa, sbb) {
        (Some(x), Some(y)) => Ok(if x.seq >= y.seq { x } else { y }),
        (Some(x), None) | (None, Some(x)) => Ok(x),
        (None, None) => Err(Error::Corrupt {
            path: path.to_path_buf(),
            detail: "both superblock copies fail their checksum".into(),
        }),
    }
}

/// Compares the `len` bytes at `p` with `other` in memcmp order with relaxed
/// atomic loads: one byte at a time up to the first 8-aligned address and
/// after the last, 8 bytes at a time between; no copy, no reference into the
/// mapping. A word that differs decides by its big-endian value, which orders
/// as its bytes do.
///
/// # Safety
///
/// `p..p + len` must be mapped readable and writable (atomic loads require
/// memory valid for writes too) for the whole call. Any write into the range
/// by another thread during the call must be an atomic store 8 bytes wide on
/// an 8-aligned word (`Region::atomic_u64`), the width these loads use there:
/// a plain store racing with them is a data race, and racing atomic accesses
/// of different sizes are undefined unless all are reads.
#[inline]
unsafe fn cmp_relaxed(p: *mut u8, len: usize, other: &[u8]) -> std::cmp::Ordering {
    let n = len.min(other.len());
    let head = ((p as usize).wrapping_neg() % 8).min(n);
    let mut i = 0;
    let byte = |i: usize| {
        // SAFETY: `i < n <= len`: `p + i` is in the caller's range; any address
        // is aligned for `AtomicU8`.
        unsafe { AtomicU8::from_ptr(p.add(i)) }.load(Ordering::Relaxed)
    };
    while i < head {
        let b = byte(i);
        if b != other[i] {
            return b.cmp(&other[i]);
        }
        i += 1;
    }
    while i + 8 <= n {
        // SAFETY: `p + i .. p + i + 8` is in the caller's range (`i + 8 <= n <=
        // len`), and 8-aligned (`p + head` is, and `i - head` is a multiple of 8).
        let w = unsafe { AtomicU64::from_ptr(p.add(i) as *mut u64) }.load(Ordering::Relaxed);
        let o = u64::from_ne_bytes(other[i..i + 8].try_into().expect("8 bytes"));
        if w != o {
            return u64::from_be(w).cmp(&u64::from_be(o));
        }
        i += 8;
    }
    while i < n {
        let b = byte(i);
        if b != other[i] {
            return b.cmp(&other[i]);
        }
        i += 1;
    }
    len.cmp(&other.len())
}

/// A hint: starts fetching the cache line holding `p` into the cache. Any
/// address will do: a prefetch never faults.
#[inline(always)]
pub fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is baseline x86_64 (SSE) and never faults, whatever the
    // address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The flushes of a fence taken apart ([`Region::detach_fence`]); durable once
/// given to [`Region::complete_fence`]. Dropped instead, they are as durable
/// as unfenced flushes are: under msync the drop syncs them (if the region is
/// still open; a region syncs its whole mapping when it closes), with no
/// health check; under the cache-line strategies their write-backs were
/// issued and complete by themselves. The cache-line simulator, which
/// persists a thread's lines only at a fence, never persists them.
#[must_use = "the flushes are durable only once completed"]
pub struct DetachedFence {
    ranges: Vec<(usize, usize)>,
    sim_lines: Option<Vec<u64>>,
    owner: Weak<Persister>,
}

impl Drop for DetachedFence {
    fn drop(&mut self) {
        if self.ranges.is_empty() {
            return;
        }
        if let Some(p) = self.owner.upgrade() {
            p.sync_detached(std::mem::take(&mut self.ranges));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cmp_relaxed` orders as `<[u8]>::cmp` at every alignment and length
    /// around the 8-byte words, with the first difference at every position.
    #[test]
    fn relaxed_compare_matches_slices() {
        let mut buf: Vec<u64> = vec![0; 16];
        let base = buf.as_mut_ptr() as *mut u8;
        let pattern: Vec<u8> = (0..128u32).map(|i| (i * 37 + 11) as u8).collect();
        for (i, b) in pattern.iter().enumerate() {
            // SAFETY: `i < 128`, inside the 128-byte buffer.
            unsafe { base.add(i).write(*b) };
        }
        for start in 0..9usize {
            for len in 0..40usize {
                let mine = &pattern[start..start + len];
                for olen in [0, len.saturating_sub(1), len, len + 1] {
                    let mut other: Vec<u8> = pattern[start..].iter().copied().take(olen).collect();
                    other.resize(olen, 0);
                    for flip in 0..=olen {
                        let mut o = other.clone();
                        if flip < olen {
                            o[flip] = o[flip].wrapping_add(if flip % 2 == 0 { 1 } else { 255 });
                        }
                        // SAFETY: `start + len <= 48 < 128`: inside the buffer,
                        // which nothing else touches.
                        let got = unsafe { cmp_relaxed(base.add(start), len, &o) };
                        assert_eq!(got, mine.cmp(&o[..]), "at {start} len {len} vs {o:?}");
                    }
                }
            }
        }
    }
}
