//! systemd's notify protocol as systemd sees it: a unix datagram socket bound in a temporary
//! directory stands for systemd's, and the messages are read in the order they arrive.
//!
//! - The real `vidflow run` binary on a live test pattern, given `NOTIFY_SOCKET` and
//!   `WATCHDOG_USEC` in its environment as under systemd: `READY=1` first, taken once a frame
//!   was decoded; `WATCHDOG=1` while frames flow; `STATUS=` naming the source; `STOPPING=1`
//!   after SIGTERM and no ping after it; exit 0.
//! - An in-process `daemon::run` whose step blocks on command: no `WATCHDOG=1` while it is
//!   held, though the source still streams and the clock still runs; pings again once it is
//!   released.
//!
//! Mocked, because a hang cannot be produced for real on demand: the step that hangs, a
//! code-built probe that blocks while the test holds it. The rest is real: the GStreamer
//! source, the executor and its pool, the notify thread and the socket, which the in-process
//! run gets through `RunOptions` (setting NOTIFY_SOCKET in a threaded test process is unsound).
//! Windows are counted in the run's own `STATUS=` messages, not in seconds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::net::TcpListener;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::*;
use vidflow::config::{SourceText, load_text};
use vidflow::daemon::{self, Live, NotifyConfig, NotifySocket, RunOptions, Shutdown};

/// Turns a hang into a failure; never a measure of speed.
const GUARD: Duration = Duration::from_secs(60);

/// The watchdog timeout given to the runs: a check every half second.
const WATCHDOG: Duration = Duration::from_secs(1);

/// systemd's end of the notify socket.
struct Systemd {
    socket: UnixDatagram,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Systemd {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        Self {
            socket,
            path,
            _dir: dir,
        }
    }

    /// The next message, or `None` if none came within `wait`.
    fn next(&self, wait: Duration) -> Option<String> {
        self.socket.set_read_timeout(Some(wait)).unwrap();
        let mut buf = [0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8(buf[..n].to_vec()).unwrap()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Messages up to and including the first for which `done` holds.
    fn until(&self, what: &str, mut done: impl FnMut(&str) -> bool) -> Vec<String> {
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            let left = GUARD.saturating_sub(start.elapsed());
            let Some(message) = self.next(left.max(Duration::from_millis(1))) else {
                panic!("never got {what}; got {seen:?}");
            };
            let stop = done(&message);
            seen.push(message);
            if stop {
                return seen;
            }
        }
    }

    /// `vidflow run PIPELINE` in `dir`, told of this socket and of a [`WATCHDOG`] as systemd
    /// tells a service (no `WATCHDOG_PID`: meant for whoever reads it).
    fn run(&self, dir: &Path, pipeline: &Path) -> Running {
        let usec = WATCHDOG.as_micros().to_string();
        spawn(
            dir,
            &["run", pipeline.to_str().unwrap()],
            &[
                ("NOTIFY_SOCKET", self.path.to_str().unwrap()),
                ("WATCHDOG_USEC", &usec),
            ],
        )
    }

    /// Messages until `n` more `STATUS=` have come (the run's own clock).
    fn statuses(&self, n: usize) -> Vec<String> {
        let mut left = n;
        self.until(&format!("{n} STATUS= messages"), |m| {
            if m.starts_with("STATUS=") {
                left -= 1;
            }
            left == 0
        })
    }
}

fn count(messages: &[String], message: &str) -> usize {
    messages.iter().filter(|m| *m == message).count()
}

const LIVE: &str = r#"
[sources.street]
uri = "test://ball?width=320&height=240&fps=30"

[steps.motion]
kind = "motion"
image = "$frame"

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = ["$steps.motion.detections"]
"#;

#[test]
fn a_run_tells_systemd_it_is_ready_alive_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let systemd = Systemd::new();
    let pipeline = write(dir.path(), "live.toml", LIVE);
    let running = systemd.run(dir.path(), &pipeline);

    let first = systemd.next(GUARD).expect("no message at all");
    assert_eq!(first, "READY=1", "{}", running.stderr());
    // The status that goes with READY=1 is read at the same moment: the source had given a
    // frame (it streams).
    let status = systemd.next(GUARD).unwrap();
    assert_eq!(status, "STATUS=street streaming", "{}", running.stderr());

    // Frames flow: pings, and a status measured over an interval.
    let mut pings = 0;
    let mut rated = None;
    let flowing = systemd.until("3 pings and a measured status", |m| {
        pings += usize::from(m == "WATCHDOG=1");
        if m.starts_with("STATUS=street streaming ") && m.ends_with(" fps") {
            rated = Some(m.to_owned());
        }
        pings >= 3 && rated.is_some()
    });
    assert!(
        flowing
            .iter()
            .all(|m| m == "WATCHDOG=1" || m.starts_with("STATUS=street ")),
        "{flowing:?}"
    );
    wait_for_lines(&dir.path().join("out/events.jsonl"), 1, GUARD);

    running.signal("TERM");
    let before_stop = systemd.until("STOPPING=1", |m| m == "STOPPING=1");
    assert_eq!(count(&before_stop, "READY=1"), 0, "{before_stop:?}");
    let out = running.finish(GUARD);
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        out.stderr
    );
    let mut after_stop = Vec::new();
    while let Some(m) = systemd.next(Duration::from_millis(1)) {
        after_stop.push(m);
    }
    assert!(
        after_stop
            .iter()
            .all(|m| m.starts_with("STATUS=draining: street ")),
        "after STOPPING=1: {after_stop:?}"
    );
    eprintln!(
        "notify sequence: {first:?} {status:?} {flowing:?} {before_stop:?} {after_stop:?} \
         (rated: {rated:?})"
    );
}

/// `NOTIFY_SOCKET` naming a socket nobody listens on (systemd gone, a stale variable): every
/// message fails to send, and the run does its whole work all the same, exit 0, with one
/// warning for all of them (the later failures are debug lines).
#[test]
fn a_notify_socket_nobody_listens_on_costs_the_run_one_warning_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = write(
        dir.path(),
        "p.toml",
        "[sources.street]\nuri = \"test://ball?width=160&height=120&fps=20&frames=40&live=true\"\n\
         # Room for the whole stream: this test is not about live drops.\nqueue = 40\n\
         [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n",
    );
    let gone = dir.path().join("gone.sock");
    let usec = WATCHDOG.as_micros().to_string();
    let out = spawn(
        dir.path(),
        &["run", pipeline.to_str().unwrap()],
        &[
            ("NOTIFY_SOCKET", gone.to_str().unwrap()),
            ("WATCHDOG_USEC", &usec),
            ("VIDFLOW_LOG", "debug"),
        ],
    )
    .finish(GUARD);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!(jsonl(&dir.path().join("events.jsonl")).len(), 40);
    let failures: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("systemd notify: cannot send"))
        .collect();
    let warnings = failures.iter().filter(|l| l.contains("WARN")).count();
    // READY=1 and STOPPING=1 at least, and pings while the 2 s of frames flowed.
    assert!(failures.len() >= 3, "{}", out.stderr);
    assert_eq!(warnings, 1, "{failures:#?}");
    assert!(failures[0].contains("WARN"), "{failures:#?}");
}

/// SIGHUP: `RELOADING=1` with the monotonic time systemd matches it by, then `READY=1` once the
/// new file is swapped in, or refused: either way the service is ready again and running.
#[test]
fn a_reload_says_reloading_then_ready_whether_applied_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let systemd = Systemd::new();
    let pipeline = write(dir.path(), "live.toml", LIVE);
    let running = systemd.run(dir.path(), &pipeline);
    systemd.until("READY=1", |m| m == "READY=1");

    for (file, outcome) in [
        (
            LIVE.replace("kind = \"motion\"", "kind = \"motion\"\nmin_area = 50"),
            "reload applied",
        ),
        (
            LIVE.replace("kind = \"motion\"", "kind = \"motoin\""),
            "reload refused",
        ),
    ] {
        write(dir.path(), "live.toml", &file);
        running.signal("HUP");
        let reloading = systemd.until("RELOADING=1", |m| m.starts_with("RELOADING=1"));
        let message = reloading.last().unwrap();
        let usec: u64 = message
            .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
            .unwrap_or_else(|| panic!("{message:?}"))
            .parse()
            .unwrap();
        assert!(usec > 0);
        systemd.until("READY=1 after the reload", |m| m == "READY=1");
        running.wait_for_stderr(outcome, GUARD);
        // Still alive: pings follow.
        systemd.until("a ping after the reload", |m| m == "WATCHDOG=1");
    }
    running.signal("TERM");
    systemd.until("STOPPING=1", |m| m == "STOPPING=1");
    let out = running.finish(GUARD);
    assert!(out.status.success(), "{}", out.stderr);
}

/// A camera that cannot be reached is not waited for: READY=1 once it retries under its
/// policy (its first attempt had to end first), and pings while it retries.
#[test]
fn a_camera_that_does_not_answer_is_ready_once_it_retries() {
    let dir = tempfile::tempdir().unwrap();
    let systemd = Systemd::new();
    // A server that never answers: a listener that accepts nothing (the kernel completes the
    // connection, nobody reads the request). Each attempt ends at the stall timeout.
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port();
    let pipeline = write(
        dir.path(),
        "cam.toml",
        &format!(
            "[sources.cam]\nuri = \"rtsp://127.0.0.1:{port}/x\"\nstall_timeout_ms = 1000\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"out/events.jsonl\"\n"
        ),
    );
    let running = systemd.run(dir.path(), &pipeline);
    assert_eq!(systemd.next(GUARD).as_deref(), Some("READY=1"));
    let status = systemd.next(GUARD).unwrap();
    assert!(
        ["STATUS=cam stalled", "STATUS=cam retrying"].contains(&status.as_str()),
        "{status}\n{}",
        running.stderr()
    );
    let mut pings = 0;
    let retrying = systemd.until("pings while it retries", |m| {
        pings += usize::from(m == "WATCHDOG=1");
        pings == 2
    });
    running.signal("TERM");
    systemd.until("STOPPING=1", |m| m == "STOPPING=1");
    let out = running.finish(GUARD);
    assert!(out.status.success(), "{}", out.stderr);
    drop(mute);
    eprintln!("notify sequence: READY=1 {status:?} {retrying:?} STOPPING=1");
}

/// Whether steps block now, and how many are blocked.
static HOLD: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());
static BLOCKED: AtomicUsize = AtomicUsize::new(0);

/// The probe's work: none, unless the test holds it; then it blocks until released.
fn held_on_command(_: &str, _: u64) -> Duration {
    let (lock, cv) = &HOLD;
    let mut held = lock.lock().unwrap();
    if *held {
        BLOCKED.fetch_add(1, Ordering::SeqCst);
        while *held {
            held = cv.wait(held).unwrap();
        }
        BLOCKED.fetch_sub(1, Ordering::SeqCst);
    }
    Duration::ZERO
}

fn hold(on: bool) {
    *HOLD.0.lock().unwrap() = on;
    HOLD.1.notify_all();
}

#[test]
fn no_watchdog_ping_while_a_step_hangs() {
    let systemd = Systemd::new();
    let text = "[sources.cam]\nuri = \"test://ball?width=160&height=120&fps=30\"\n\
                [executor]\nworkers = 2\n";
    let mut pipeline = load_text(&SourceText::new("hang.toml", text.to_owned())).unwrap();
    let log = Log::default();
    let probe = Behaviour {
        work: held_on_command,
        ..Behaviour::default()
    };
    pipeline.steps = steps_with(&log, &[("probe", &FROM_FRAME, &[None])], probe);
    let live = Arc::new(Live::new());
    let options = RunOptions {
        live: live.clone(),
        notify: NotifyConfig {
            socket: Some(NotifySocket::Path(systemd.path.clone())),
            watchdog: Some(WATCHDOG),
            // A status per watchdog check: the windows below are counted in them.
            status_every: WATCHDOG / 2,
        },
        ..RunOptions::default()
    };
    let shutdown = Shutdown::new();
    let run = {
        let shutdown = shutdown.clone();
        std::thread::spawn(move || daemon::run(pipeline, &options, &shutdown))
    };

    systemd.until("READY=1", |m| m == "READY=1");
    let mut pings = 0;
    systemd.until("pings while frames flow", |m| {
        pings += usize::from(m == "WATCHDOG=1");
        pings == 2
    });

    hold(true);
    let start = Instant::now();
    while BLOCKED.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < GUARD, "the step never blocked");
        std::thread::sleep(Duration::from_millis(10));
    }
    let stuck_at = live.delivered().0;
    // Frames that were past the step when it blocked may still complete and earn one ping.
    let grace = systemd.statuses(2);
    let window = systemd.statuses(8);
    let still_stuck = live.delivered().0;
    hold(false);
    assert_eq!(
        count(&window, "WATCHDOG=1"),
        0,
        "pinged while the step hung (delivered {stuck_at} then {still_stuck}): {grace:?} {window:?}"
    );
    // The source kept streaming all along: only the workflow was stuck.
    assert!(
        window.iter().any(|m| m.starts_with("STATUS=cam streaming")),
        "{window:?}"
    );

    systemd.until("a ping once released", |m| m == "WATCHDOG=1");
    shutdown.request();
    systemd.until("STOPPING=1", |m| m == "STOPPING=1");
    let report = run.join().unwrap().unwrap();
    assert!(report.frames_processed > still_stuck, "{report:?}");
}
