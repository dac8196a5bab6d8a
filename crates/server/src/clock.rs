//! The request path's clock: one read per command, for commandstats, the
//! latency histogram and CLIENT LIST's `idle`.
//!
//! `Instant::now` reads the time-stamp counter through the vDSO with an
//! ordered read (LFENCE; RDTSC): the fence waits for every load before it, so
//! after a pipeline's prefetches each clock read also waited for the cache
//! misses in flight, a visible share of a pipelined worker's time. Where
//! the CPU's counter is invariant (constant rate, running in every C-state:
//! CPUID 0x8000_0007 EDX bit 8), a plain RDTSC scaled to nanoseconds is used
//! instead; a command's time can then be off by the few instructions the CPU
//! reorders around the read, which is below the microsecond commandstats
//! count in. Stamps taken on different CPUs are compared (a client's creation
//! and its last command, a worker moved between two reads), so the counter is
//! used only where the kernel itself keeps time with it (clocksource `tsc`:
//! it checked that the CPUs' counters agree). Elsewhere, and until the rate
//! is calibrated, it is `Instant`; a counter read below the base (a reset)
//! falls back to `Instant` too.
//!
//! The rate is measured against `Instant`, over the time since the clock's
//! base: at first after `CALIBRATE_AFTER`, then again by [`recalibrate`]
//! (workers call it once a tick), so it grows more exact as the process runs.
//! Each pairing of a counter read with `Instant` is bracketed by two
//! `Instant` reads and dropped if they are more than `PAIR_SLACK` apart (the
//! thread was interrupted in between). Two stamps taken across a
//! recalibration may be off by the correction; differences saturate at zero.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A point in time: nanoseconds since the clock's base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(u64);

impl Stamp {
    /// Now.
    #[inline]
    pub fn now() -> Stamp {
        let b = base();
        if b.tsc {
            let scale = b.scale.load(Ordering::Relaxed);
            let ticks = rdtsc().wrapping_sub(b.tsc0);
            if scale != 0 && ticks < 1 << 62 {
                return Stamp(((u128::from(ticks) * u128::from(scale)) >> 32) as u64);
            }
        }
        Stamp(b.instant0.elapsed().as_nanos() as u64)
    }

    /// Whole microseconds from `earlier` to `self` (0 if `earlier` is later).
    #[inline]
    pub fn micros_since(self, earlier: Stamp) -> u64 {
        self.0.saturating_sub(earlier.0) / 1_000
    }

    /// Whole milliseconds from `earlier` to `self` (0 if `earlier` is later).
    #[inline]
    pub fn millis_since(self, earlier: Stamp) -> u64 {
        self.0.saturating_sub(earlier.0) / 1_000_000
    }
}

/// After this long since the base, the counter's rate is first measured.
const CALIBRATE_AFTER: Duration = Duration::from_millis(20);

/// A counter read is paired with `Instant` only if the `Instant` reads
/// around it are at most this far apart.
const PAIR_SLACK: Duration = Duration::from_micros(5);

struct Base {
    instant0: Instant,
    /// The counter's value at `instant0`.
    tsc0: u64,
    /// The counter is invariant (usable as a clock).
    tsc: bool,
    /// Nanoseconds per tick, times 2^32; 0 until calibrated.
    scale: AtomicU64,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let tsc = invariant_tsc() && kernel_clock_is_tsc();
        // A pair read without interruption (a few tries; the last one
        // otherwise, whose error the calibration over a longer time shrinks).
        let mut pair = (Instant::now(), rdtsc());
        for _ in 0..8 {
            if let Some(p) = paired() {
                pair = p;
                break;
            }
        }
        Base {
            instant0: pair.0,
            tsc0: pair.1,
            tsc,
            scale: AtomicU64::new(0),
        }
    })
}

/// A counter read and the `Instant` it was taken at (the midpoint of two
/// reads around it), or `None` if they were too far apart.
fn paired() -> Option<(Instant, u64)> {
    let a = Instant::now();
    let t = rdtsc();
    let b = Instant::now();
    let gap = b - a;
    (gap <= PAIR_SLACK).then(|| (a + gap / 2, t))
}

/// Measures the counter's rate again (a worker calls this once a tick).
pub fn recalibrate() {
    let b = base();
    if !b.tsc {
        return;
    }
    let Some((at, t)) = paired() else {
        return;
    };
    let ticks = t.wrapping_sub(b.tsc0);
    let ns = at.saturating_duration_since(b.instant0);
    if ns < CALIBRATE_AFTER || ticks == 0 || ticks >= 1 << 62 {
        return;
    }
    let scale = (ns.as_nanos() << 32) / u128::from(ticks);
    b.scale
        .store(u64::try_from(scale).unwrap_or(0), Ordering::Relaxed);
}

/// Whether the kernel keeps time with the TSC (it then checked that the
/// CPUs' counters are in step).
fn kernel_clock_is_tsc() -> bool {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> u64 {
    // SAFETY: compiled for x86_64 only, where RDTSC is baseline (every such
    // CPU has it); it reads the time-stamp counter and touches no memory.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn rdtsc() -> u64 {
    0
}

#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use std::arch::x86_64::__cpuid;
    // SAFETY: CPUID is baseline x86_64; leaf 0x8000_0007 is read only when the
    // maximum extended leaf says it exists.
    #[allow(unused_unsafe)]
    unsafe {
        __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn invariant_tsc() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stamps follow `Instant` within a few percent over 100 ms, once
    /// calibrated.
    #[test]
    fn follows_instant() {
        let _ = Stamp::now();
        std::thread::sleep(CALIBRATE_AFTER + Duration::from_millis(5));
        recalibrate();
        if base().tsc {
            // (Unless every pairing was interrupted: then it is `Instant`.)
            for _ in 0..100 {
                if base().scale.load(Ordering::Relaxed) != 0 {
                    break;
                }
                recalibrate();
            }
            assert_ne!(base().scale.load(Ordering::Relaxed), 0, "calibrated");
        }
        let (s0, i0) = (Stamp::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(100));
        let (s1, i1) = (Stamp::now(), Instant::now());
        let want = (i1 - i0).as_micros() as f64;
        let got = s1.micros_since(s0) as f64;
        assert!(
            (got - want).abs() < want * 0.05,
            "stamp says {got} µs, Instant {want} µs"
        );
        assert_eq!(s0.micros_since(s1), 0, "saturates");
        assert_eq!(Stamp(5_000_000).millis_since(Stamp(1_000_000)), 4, "millis");
    }
}
