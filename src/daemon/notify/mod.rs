//! systemd's notify protocol (`Type=notify`): what a run tells systemd, and when.
//!
//! Messages, each one datagram to `$NOTIFY_SOCKET` (a path, or `@name` in the abstract
//! namespace):
//! - `READY=1` once every source has settled: it gave its first frame, or (a camera, a stream)
//!   it is retrying under its reconnect policy after a failed attempt, or it ended (see
//!   [`rules::ready`]). Then a first `STATUS=`.
//! - `STATUS=` every [`STATUS_INTERVAL`]: each source's state and frames per second, e.g.
//!   `street streaming 9.9 fps; cam2 retrying`.
//! - `WATCHDOG=1` at each check, every half of `$WATCHDOG_USEC`, only if the run earned it
//!   since the last ping: frames completed the workflow ([`Live::delivered`] advanced), or no
//!   source streams and a live one is retrying within its policy ([`rules::earned_ping`]). A
//!   workflow that is stuck stops the pings, whatever the clock does, and systemd aborts and
//!   restarts the service. No ping before `READY=1` (systemd's start timeout covers that).
//!   So a frame must complete at least every half of `WatchdogSec=`, and a camera whose frames
//!   stop still counts as streaming until its `stall_timeout_ms` ends the connection: both must
//!   stay well under it.
//! - `STOPPING=1` at the first stop request ([`Notifier::stopping`]), or once the run drains by
//!   itself (every source ended), or at the end of the run at the latest; once.
//! - `RELOADING=1` with `MONOTONIC_USEC=` ([`Notifier::reloading`]) when a reload starts, and
//!   `READY=1` ([`Notifier::ready`]) when it is done.
//!
//! While draining there are no pings at all: after `STOPPING=1` systemd no longer watches the
//! watchdog (it does only while the service runs or reloads), and a ping would arm its timer
//! again in some versions. The drain is bounded by the run's own stop deadline
//! (`stop_timeout_s`, default 20 s), then by systemd's `TimeoutStopSec=` (45 s in the unit).
//!
//! Thread: one, `vidflow-notify`, started by `daemon::run` once [`Live`] shows the run's parts,
//! only if there is a socket to send to (not under systemd: no thread, nothing sent). It blocks
//! on its channel with a timeout: the next check, status or (before `READY=1`) readiness poll;
//! it never spins. The frame path is never touched: it reads `Live`'s atomics and parts.
//!
//! Channel: `events` (unbounded) carries the run's requests: a stop request, a reload's start
//! and end. A handful per run, each handled at once, and the caller's thread (which also takes
//! stop requests) never waits on it.
//!
//! Files: `rules.rs` decides (readiness, pings, the status text, the watchdog variables),
//! `reporter.rs` is the thread's loop, `socket.rs` sends the datagrams.
//!
//! Stop protocol: [`Notifier::stop`] (or dropping the [`Notifier`]) drops the sender; the thread
//! sees the channel disconnect, sends `STOPPING=1` if it has not yet, and returns; the caller
//! joins it. Sending never blocks (a non-blocking socket), so the join is prompt.

use std::ffi::OsStr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

use super::Live;

mod reporter;
mod rules;
mod socket;

use reporter::Reporter;
use socket::Datagrams;
pub use socket::NotifySocket;

/// How often `STATUS=` is sent: fresh enough for `systemctl status`, rare enough to cost
/// nothing.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(5);

/// Before `READY=1`, how often the thread looks at the sources: systemd hears of the first
/// frame a moment after it; the poll ends with readiness.
const READY_POLL: Duration = Duration::from_millis(50);

/// The shortest time between two watchdog checks, so that a `WATCHDOG_USEC` of a few
/// microseconds cannot make the thread spin.
const MIN_CHECK_PERIOD: Duration = Duration::from_millis(10);

/// Why part of the notify set-up read from the environment is ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET \"{0}\": not an absolute path or an abstract socket (@name)")]
    Socket(String),
    #[error("WATCHDOG_USEC \"{0}\": not a positive number of microseconds")]
    WatchdogUsec(String),
    #[error("WATCHDOG_PID \"{0}\": not a process id")]
    WatchdogPid(String),
}

/// Where and how often a run tells systemd how it is. The default sends nothing; the command
/// line builds it from the environment ([`NotifyConfig::from_env`]); tests pass their own socket
/// (setting environment variables in a threaded test process is unsound).
#[derive(Debug, Clone)]
pub struct NotifyConfig {
    /// `$NOTIFY_SOCKET`; `None`: nothing is sent.
    pub socket: Option<NotifySocket>,
    /// systemd's watchdog timeout (`$WATCHDOG_USEC`, if meant for this process); the run checks
    /// for a ping every half of it. `None`: no pings.
    pub watchdog: Option<Duration>,
    /// How often `STATUS=` is sent.
    pub status_every: Duration,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            socket: None,
            watchdog: None,
            status_every: STATUS_INTERVAL,
        }
    }
}

impl NotifyConfig {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` (as `sd_notify` and
    /// `sd_watchdog_enabled` do); a value that cannot be used is logged and ignored.
    pub fn from_env() -> Self {
        let var = |name| std::env::var_os(name);
        let lossy = |v: Option<std::ffi::OsString>| v.map(|v| v.to_string_lossy().into_owned());
        let (config, problems) = Self::from_vars(
            var("NOTIFY_SOCKET").as_deref(),
            lossy(var("WATCHDOG_USEC")).as_deref(),
            lossy(var("WATCHDOG_PID")).as_deref(),
            std::process::id(),
        );
        for problem in problems {
            tracing::warn!("systemd notify: {problem}; ignored");
        }
        config
    }

    /// [`NotifyConfig::from_env`] given the variables' values and this process's id.
    pub fn from_vars(
        notify_socket: Option<&OsStr>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
        own_pid: u32,
    ) -> (Self, Vec<NotifyError>) {
        let mut problems = Vec::new();
        let socket = notify_socket
            .map(NotifySocket::parse)
            .transpose()
            .unwrap_or_else(|e| {
                problems.push(e);
                None
            });
        let watchdog = rules::watchdog_timeout(watchdog_usec, watchdog_pid, own_pid)
            .unwrap_or_else(|e| {
                problems.push(e);
                None
            });
        let config = Self {
            socket,
            watchdog,
            ..Self::default()
        };
        (config, problems)
    }
}

/// What the run asks the notify thread to say.
#[derive(Debug)]
enum Event {
    Stopping,
    Reloading { monotonic_usec: u64 },
    Ready,
}

/// The run's handle on its `vidflow-notify` thread (inert when there is no socket). Dropping it
/// stops and joins the thread.
#[derive(Debug, Default)]
pub struct Notifier {
    events: Option<Sender<Event>>,
    thread: Option<JoinHandle<()>>,
}

impl Notifier {
    /// Starts the thread if `config` has a socket; otherwise a notifier that sends nothing.
    pub(in crate::daemon) fn start(config: &NotifyConfig, live: Arc<Live>) -> Self {
        let Some(target) = config.socket.clone() else {
            return Self::default();
        };
        let datagrams = match Datagrams::open(target) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "systemd notify: cannot open a socket; systemd will not hear from this run");
                return Self::default();
            }
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let reporter = Reporter::new(datagrams, live, config);
        let spawned = std::thread::Builder::new()
            .name("vidflow-notify".to_owned())
            .spawn(move || reporter.run(&rx));
        match spawned {
            Ok(thread) => Self {
                events: Some(tx),
                thread: Some(thread),
            },
            Err(e) => {
                tracing::error!(error = %e, "systemd notify: cannot start its thread; systemd will not hear from this run");
                Self::default()
            }
        }
    }

    /// The first stop request: `STOPPING=1` (once per run, whoever asks).
    pub fn stopping(&self) {
        self.tell(Event::Stopping);
    }

    /// A reload starts: `RELOADING=1` with `MONOTONIC_USEC=` of now, which systemd matches
    /// against the SIGHUP it sent. Call [`Notifier::ready`] when it is done.
    pub fn reloading(&self) {
        self.tell(Event::Reloading {
            monotonic_usec: monotonic_usec(),
        });
    }

    /// A reload is done: `READY=1` again. Before the run's first `READY=1` this does nothing:
    /// that one still waits for the sources (systemd ignores `RELOADING=1` while starting).
    pub fn ready(&self) {
        self.tell(Event::Ready);
    }

    fn tell(&self, event: Event) {
        if let Some(events) = &self.events {
            // Fails only if the thread is gone (it panicked): nothing to tell.
            let _ = events.send(event);
        }
    }

    /// Stops the thread (it sends `STOPPING=1` if it had not) and joins it.
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        drop(self.events.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("systemd notify: its thread panicked");
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.finish();
    }
}

/// CLOCK_MONOTONIC in microseconds, as systemd reads `MONOTONIC_USEC=`.
fn monotonic_usec() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec that outlives the call; clock_gettime only
    // writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if rc != 0 {
        return 0;
    }
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let micros = u64::try_from(now.tv_nsec).unwrap_or(0) / 1_000;
    seconds.saturating_mul(1_000_000).saturating_add(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_read_as_libsystemd_reads_it() {
        let (config, problems) = NotifyConfig::from_vars(
            Some(OsStr::new("/run/systemd/notify")),
            Some("30000000"),
            Some("42"),
            42,
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            config.socket,
            Some(NotifySocket::Path("/run/systemd/notify".into()))
        );
        assert_eq!(config.watchdog, Some(Duration::from_secs(30)));

        // Not under systemd: nothing to send, nothing wrong.
        let (config, problems) = NotifyConfig::from_vars(None, None, None, 42);
        assert!(problems.is_empty());
        assert!(config.socket.is_none() && config.watchdog.is_none());

        // What cannot be used is ignored and said, each part on its own.
        let (config, problems) =
            NotifyConfig::from_vars(Some(OsStr::new("@sd")), Some("soon"), None, 42);
        assert_eq!(config.socket, Some(NotifySocket::Abstract(b"sd".to_vec())));
        assert_eq!(config.watchdog, None);
        assert_eq!(problems, [NotifyError::WatchdogUsec("soon".to_owned())]);
    }

    /// Set in the child process of [`the_default_sends_nothing_and_starts_no_thread`].
    const CHILD: &str = "VIDFLOW_TEST_DEFAULT_NOTIFIER_CHILD";

    /// The default notifier, told everything a run tells it, under a `NOTIFY_SOCKET` that
    /// names a real socket: a default that read the environment after all would send there.
    /// The environment cannot be set in this threaded process, so the test runs itself again
    /// as a child with `NOTIFY_SOCKET` set; the child ends by sending `END` itself, so the
    /// socket is known to have been reachable.
    #[test]
    fn the_default_sends_nothing_and_starts_no_thread() {
        if let Some(target) = std::env::var_os(CHILD) {
            let notifier = Notifier::start(&NotifyConfig::default(), Arc::default());
            let started = notifier.thread.is_some() || notifier.events.is_some();
            notifier.stopping();
            notifier.reloading();
            notifier.ready();
            notifier.stop();
            let end = std::os::unix::net::UnixDatagram::unbound().unwrap();
            end.send_to(b"END", target).unwrap();
            assert!(!started, "the default notifier started a thread");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let systemd = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let test = module_path!().split_once("::").unwrap().1.to_owned()
            + "::the_default_sends_nothing_and_starts_no_thread";
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &test, "--test-threads=1", "--nocapture"])
            .env("NOTIFY_SOCKET", &path)
            .env(CHILD, &path)
            .output()
            .unwrap();
        let output = String::from_utf8_lossy(&child.stdout).into_owned()
            + &String::from_utf8_lossy(&child.stderr);
        systemd.set_nonblocking(true).unwrap();
        let mut received = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = systemd.recv(&mut buf) {
            received.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert_eq!(received, ["END"], "what the socket received\n{output}");
        assert!(child.status.success(), "{output}");
        assert!(
            output.contains("1 passed"),
            "the child ran no test:\n{output}"
        );
    }

    /// CLOCK_`clock` in microseconds, read here.
    fn clock_usec(clock: libc::clockid_t) -> u64 {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec that outlives the call.
        assert_eq!(unsafe { libc::clock_gettime(clock, &mut now) }, 0);
        u64::try_from(now.tv_sec).unwrap() * 1_000_000 + u64::try_from(now.tv_nsec).unwrap() / 1_000
    }

    #[test]
    fn monotonic_usec_is_clock_monotonic() {
        let before = clock_usec(libc::CLOCK_MONOTONIC);
        let value = monotonic_usec();
        let after = clock_usec(libc::CLOCK_MONOTONIC);
        assert!(
            before <= value && value <= after,
            "{value} is not between CLOCK_MONOTONIC readings {before} and {after}"
        );
        // Not the wall clock: that one counts from 1970, CLOCK_MONOTONIC from boot.
        let realtime = clock_usec(libc::CLOCK_REALTIME);
        assert!(
            realtime.abs_diff(value) > 1_000_000,
            "{value} is CLOCK_REALTIME ({realtime})"
        );
    }
}
