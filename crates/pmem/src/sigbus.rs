//! A `SIGBUS` in a heap mapping ends the process with a message naming the heap.
//!
//! A store or load into a page of a shared file mapping that the file cannot
//! back raises `SIGBUS`: the page lies past the end of the file (the file was
//! truncated under the running process), or the file system could not allocate
//! a block for a page of a sparse file. Regions reserve their blocks
//! (`fallocate`) so the second should not happen; the first still can. The
//! default action kills the process with no word of why. The handler here
//! checks whether the faulting address lies inside a heap's reservation; if
//! so it writes one line naming the heap file and the offset to stderr and
//! ends the process with [`SIGBUS_EXIT_CODE`]. Acknowledged writes are durable
//! already (a write is acknowledged only after its fence), so nothing is lost
//! by ending here. A fault elsewhere goes to the handler installed before
//! (Rust's own stack-overflow handler, or the default action).
//!
//! Everything the handler reads is a fixed-size static array of atomics, and
//! it calls only `write(2)` and `_exit(2)`: async-signal-safe.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Once;

/// The exit status of a process ended by a `SIGBUS` in a heap mapping.
pub const SIGBUS_EXIT_CODE: i32 = 86;

const SLOTS: usize = 64;

/// One registered reservation: `[start, start + len)`, and the heap's path
/// (bytes owned by the registration, freed after it is cleared).
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    path: AtomicPtr<u8>,
    path_len: AtomicUsize,
    /// Taken by a registration (start is set after the other fields).
    used: std::sync::atomic::AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    path: AtomicPtr::new(std::ptr::null_mut()),
    path_len: AtomicUsize::new(0),
    used: std::sync::atomic::AtomicBool::new(false),
};

static RANGES: [Slot; SLOTS] = [EMPTY; SLOTS];

/// The action in place before ours (called for faults outside every heap).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Once = Once::new();

/// A registered heap reservation; dropping it unregisters the range.
pub(crate) struct Registration {
    slot: Option<usize>,
    /// The bytes the slot points at: dropped after `drop` clears the slot.
    _path: Box<[u8]>,
}

/// Registers `[base, base + len)` as the reservation of the heap at `path`
/// and installs the handler (once per process). Without a free slot (more
/// than 64 heaps open at once) the range is not registered: a fault in it
/// then takes the previous action.
pub(crate) fn register(base: usize, len: usize, path: &std::path::Path) -> Registration {
    install();
    use std::os::unix::ffi::OsStrExt;
    let mut path: Box<[u8]> = path.as_os_str().as_bytes().into();
    for (i, s) in RANGES.iter().enumerate() {
        if s.used.load(Ordering::Relaxed)
            || s.used
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        s.path.store(path.as_mut_ptr(), Ordering::Relaxed);
        s.path_len.store(path.len(), Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        s.start.store(base, Ordering::Release);
        return Registration {
            slot: Some(i),
            _path: path,
        };
    }
    Registration {
        slot: None,
        _path: path,
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let s = &RANGES[i];
            s.start.store(0, Ordering::Release);
            s.len.store(0, Ordering::Relaxed);
            s.path_len.store(0, Ordering::Relaxed);
            s.path.store(std::ptr::null_mut(), Ordering::Relaxed);
            s.used.store(false, Ordering::Release);
        }
    }
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid value to fill in; the handler
        // has the SA_SIGINFO signature; `old` receives the previous action,
        // kept alive for the life of the process (leaked on purpose: the
        // handler may read it at any time).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            let old = Box::into_raw(Box::new(std::mem::zeroed::<libc::sigaction>()));
            if libc::sigaction(libc::SIGBUS, &act, old) == 0 {
                PREVIOUS.store(old, Ordering::Release);
            } else {
                drop(Box::from_raw(old));
            }
        }
    });
}

/// Formats `v` in decimal into `buf`, returning the digits.
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

fn write_err(b: &[u8]) {
    // SAFETY: write(2) on stderr with a valid buffer; async-signal-safe.
    unsafe {
        libc::write(2, b.as_ptr() as *const libc::c_void, b.len());
    }
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in RANGES.iter() {
        let start = s.start.load(Ordering::Acquire);
        if start == 0 {
            continue;
        }
        let len = s.len.load(Ordering::Relaxed);
        if addr < start || addr - start >= len {
            continue;
        }
        let p = s.path.load(Ordering::Relaxed);
        let n = s.path_len.load(Ordering::Relaxed);
        let mut buf = [0u8; 20];
        write_err(b"ember: SIGBUS at offset ");
        write_err(decimal((addr - start) as u64, &mut buf));
        write_err(b" of the heap ");
        if !p.is_null() {
            // SAFETY: the registration owns `n` bytes at `p` until it clears
            // `start`, and the faulting access is into its live mapping.
            write_err(unsafe { std::slice::from_raw_parts(p, n) });
        }
        write_err(
            b": the file cannot back its mapping (truncated under the server, or its \
              file system could not allocate a block); exiting (acknowledged writes are durable)\n",
        );
        // SAFETY: _exit is async-signal-safe and ends the process at once.
        unsafe { libc::_exit(SIGBUS_EXIT_CODE) };
    }
    // Not a heap: the previous action.
    let prev = PREVIOUS.load(Ordering::Acquire);
    // SAFETY: `prev` is null or the leaked previous sigaction (never freed).
    unsafe {
        if !prev.is_null() {
            let a = &*prev;
            let h = a.sa_sigaction;
            if h != libc::SIG_DFL && h != libc::SIG_IGN {
                if a.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(h);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
                    f(sig);
                }
                return;
            }
        }
        // The default action: restore it and return; the access faults again.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
    }
}
