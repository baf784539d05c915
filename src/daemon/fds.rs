//! The process's file descriptors: how many it may hold (`RLIMIT_NOFILE`), raised at start-up.
//!
//! A run holds descriptors for its sources (GStreamer's sockets and pipes: 38 for two test
//! sources with three sinks, measured), its sinks' files and folder indexes, the event store
//! and the HTTP endpoint's connections. The soft limit is often 1024 (kept low for programs
//! that use `select(2)`, which vidflow does not: glib and the endpoint use `poll`), while the
//! hard limit allows far more: [`raise_limit`] takes the hard one, once, before the run starts
//! anything. The HTTP endpoint sizes its live clients' cap from what it then is (`http/live.rs`).
//! No thread.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit now. A refusal
/// (a system call filter) leaves it as it was, said at debug level: the caps below it work.
pub fn raise_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own and pass by pointer; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) == 0 {
                limit = raised;
            } else {
                tracing::debug!(
                    error = %std::io::Error::last_os_error(),
                    soft = limit.rlim_cur,
                    "cannot raise the file-descriptor limit"
                );
            }
        }
    }
    limit.rlim_cur
}

/// The soft `RLIMIT_NOFILE` now (0 if it cannot be read).
pub fn limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own and pass by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return 0;
    }
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let before = limit();
        let now = raise_limit();
        assert!(now >= before);
        assert_eq!(now, limit());
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct we own and pass by pointer.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut l) };
        assert_eq!(read, 0);
        assert_eq!(l.rlim_cur, l.rlim_max);
    }
}
