//! The process's file descriptors: how many it may hold (`RLIMIT_NOFILE`), raised at start-up.
//!
//! A run holds descriptors for its sources (GStreamer's sockets and pipes: 38 for two test
//! sources with three sinks, measured), its sinks' files and folder indexes, the event store
//! and the HTTP endpoint's connections. The soft limit is often 1024 (kept low for programs
//! that use `select(2)`, which vidflow does not: glib and the endpoint use `poll`), while the
//! hard limit allows far more: [`raise_limit`] takes the hard one, once, before the run starts
//! anything. The HTTP endpoint sizes its live clients' cap from what it then is, less what the
//! pipeline holds ([`Pipeline::descriptors`], an estimate from its parts) and its own
//! (`http/live.rs`). No thread.

/// Descriptors the process holds whatever its pipeline: standard streams, the log, glib's
/// and GStreamer's wake-up pipes and event descriptors, the pool's threads' (none), the
/// listener, libraries' files, with room for what a library opens meanwhile. The estimates
/// below are upper bounds: `pipelines/analytics.toml` (a file source, five sinks, the event
/// store) held 28 descriptors while it ran, measured in /proc/PID/fd, against 152 estimated;
/// a camera's RTSP connection and a reconnect's overlap are what the room is for.
const PROCESS_FDS: usize = 64;
/// Per source: its GStreamer pipeline's bus and queues' wake-up descriptors (4 to 6 for a
/// test source, measured), and for a camera its connection: RTSP over TCP, RTP and RTCP
/// over UDP (two sockets each way), a reconnect's new sockets before the old ones close.
const SOURCE_FDS: usize = 16;
/// Per record stream (a source a `record` sink or a packets `clip` takes): its own connection,
/// as a source's, never decoded.
const RECORD_STREAM_FDS: usize = 16;
/// Per sink: its thread's wake-ups and the folder index it keeps; and per source it takes, the
/// file it writes and, for an encoding sink, its encoder's pipeline (6 for a `video_file`
/// segment, measured).
const SINK_FDS: usize = 4;
const SINK_PER_SOURCE_FDS: usize = 8;
/// The event store: SQLite's database, its write-ahead log and shared memory, the writer's and
/// the readers' connections (three each).
const EVENT_STORE_FDS: usize = 12;

/// What a run opens, counted by part, to estimate the descriptors it holds (see the constants
/// above for each part's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pipeline {
    pub sources: usize,
    /// Sources whose record stream a sink takes.
    pub record_streams: usize,
    pub sinks: usize,
    /// Whether it keeps an event store (`[events]`).
    pub event_store: bool,
}

impl Pipeline {
    /// Descriptors the run may hold for this pipeline, at most (an estimate with room).
    pub fn descriptors(&self) -> usize {
        PROCESS_FDS
            + self.sources * SOURCE_FDS
            + self.record_streams * RECORD_STREAM_FDS
            + self.sinks * (SINK_FDS + self.sources * SINK_PER_SOURCE_FDS)
            + if self.event_store { EVENT_STORE_FDS } else { 0 }
    }
}

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
    fn the_reserve_grows_with_the_cameras_sinks_recordings_and_the_event_store() {
        let one = Pipeline {
            sources: 1,
            ..Pipeline::default()
        };
        assert_eq!(one.descriptors(), 80);
        let ten = Pipeline {
            sources: 10,
            record_streams: 10,
            sinks: 3,
            event_store: true,
        };
        // 64 + 10 * 16 + 10 * 16 + 3 * (4 + 10 * 8) + 12
        assert_eq!(ten.descriptors(), 648);
        let more = Pipeline { sources: 11, ..ten };
        assert!(more.descriptors() > ten.descriptors());
        let stored = Pipeline {
            event_store: false,
            ..ten
        };
        assert!(stored.descriptors() < ten.descriptors());
    }

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
