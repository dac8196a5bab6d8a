//! The open file limit: raised at startup (`server::run`) and by CONFIG SET
//! maxclients so that the configured number of clients fits.

/// File descriptors kept beyond maxclients (listeners, heap, logs, metrics).
const RESERVED_FDS: u64 = 64;

/// Raises the soft RLIMIT_NOFILE towards `maxclients` + a reserve (never
/// lowers it, never above the hard limit). Returns how many clients the limit
/// allows. Called at startup and by CONFIG SET maxclients.
pub fn raise_nofile_limit(maxclients: u64) -> u64 {
    let want = maxclients.saturating_add(RESERVED_FDS);
    // SAFETY: `rlimit` is two integers: all-zero bytes are a valid value.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes one `rlimit` into `r`, exclusively borrowed
    // for the call, and keeps no pointer to it.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        eprintln!(
            "ember: cannot read the open file limit: {}",
            std::io::Error::last_os_error()
        );
        return maxclients;
    }
    let cur = r.rlim_cur as u64;
    if r.rlim_cur == libc::RLIM_INFINITY || cur >= want {
        return maxclients.max(cur.saturating_sub(RESERVED_FDS));
    }
    let target = if r.rlim_max == libc::RLIM_INFINITY {
        want
    } else {
        want.min(r.rlim_max as u64)
    };
    let mut got = cur;
    if target > cur {
        r.rlim_cur = target as libc::rlim_t;
        // SAFETY: setrlimit only reads one `rlimit` from `r`, borrowed for the
        // call, and keeps no pointer to it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } == 0 {
            got = target;
        } else {
            eprintln!(
                "ember: cannot raise the open file limit from {cur} to {target}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    got.saturating_sub(RESERVED_FDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nofile_limit_is_raised_not_lowered() {
        let get = || {
            // SAFETY: `rlimit` is two integers: all-zero bytes are a valid value.
            let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
            // SAFETY: getrlimit writes one `rlimit` into `r`, exclusively
            // borrowed for the call, and keeps no pointer to it.
            assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
            r
        };
        let before = get();
        assert!(raise_nofile_limit(16) >= 16);
        assert_eq!(get().rlim_cur, before.rlim_cur, "lowered");
        raise_nofile_limit(u64::MAX);
        let after = get();
        assert!(after.rlim_cur >= before.rlim_cur);
        assert_eq!(after.rlim_max, before.rlim_max);
    }
}
