//! A stop always wins: SIGTERM at a random moment in every state a source can be in (starting,
//! setting up a connection to a server that never answers or to a black hole where the TCP
//! connect itself hangs, backing off between reconnection attempts, stalled with its connection
//! open, looping a file), 20 trials, each through the
//! real `vidflow run` binary with real signals against the real RTSP test server
//! (`tests/common/rtsp.rs`). Every trial must exit 0 (a run that hits the stop deadline exits
//! 70) with `decoded = processed + failed + dropped`, one JSONL line per processed frame and a
//! video that plays with every frame written to it.
//!
//! The random moments come from a seed printed at the start of each test; the trials take
//! turns with each other (one real-time server and encoder at a time).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::rtsp;

use std::io::Read as _;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{Running, count_segment_frames, jsonl, make_h264_mp4, read_json, spawn, write};
use rtsp::{RtspServer, RtspServerOptions};

/// Only turns a hang into a failure; a run that hits its own stop deadline exits 70 instead.
const DEADLINE: Duration = Duration::from_secs(60);
/// The pipelines' stop deadline.
const STOP_TIMEOUT_S: u32 = 15;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// xorshift64, seeded from the clock; the seed is printed so a failure can be replayed.
struct Random(u64);

impl Random {
    fn new(test: &str) -> Self {
        let seed = std::env::var("STOP_SEED").ok().and_then(|s| s.parse().ok());
        let seed = seed.unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            (nanos as u64) | 1
        });
        println!("{test}: seed {seed} (STOP_SEED={seed} replays it)");
        Self(seed)
    }

    /// A duration in `lo..hi` milliseconds.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(lo + self.0 % (hi - lo))
    }
}

/// The pipeline file: one source, motion, JSONL of every frame and an MP4 of it.
fn pipeline(dir: &Path, source: &str) -> std::path::PathBuf {
    write(
        dir,
        "p.toml",
        &format!(
            "{source}\n\n[daemon]\nstop_timeout_s = {STOP_TIMEOUT_S}\n\n\
             [executor]\nworkers = 2\n\n\
             [steps.motion]\nkind = \"motion\"\nimage = \"$frame\"\n\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n\
             include = [\"$steps.motion.detections\"]\n\n\
             [sinks.video]\nkind = \"video_file\"\npath = \"out.mp4\"\nimage = \"$frame\"\n"
        ),
    )
}

fn rtsp_source(url: &str) -> String {
    format!(
        "[sources.cam]\nuri = \"{url}\"\nstall_timeout_ms = 1000\n\n\
         [sources.cam.reconnect]\ninitial_delay_ms = 300\nmax_delay_ms = 1000"
    )
}

fn start(dir: &Path, p: &Path) -> Running {
    let run = spawn(
        dir,
        &["run", p.to_str().unwrap(), "--stats-json", "stats.json"],
        &[],
    );
    wait_for_signal_handler(run.pid());
    run
}

/// Waits until the process catches SIGTERM (its handler is installed): a signal before that
/// would only test the default action.
fn wait_for_signal_handler(pid: u32) {
    const SIGTERM_BIT: u64 = 1 << (15 - 1);
    let start = Instant::now();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|mask| mask & SIGTERM_BIT != 0);
        if caught {
            return;
        }
        assert!(start.elapsed() < DEADLINE, "vidflow never caught SIGTERM");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends SIGTERM and checks how the run ended.
fn stop_and_check(run: Running, dir: &Path, state: &str) {
    run.signal("TERM");
    let out = run.finish(DEADLINE);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{state}: exit {:?}\n{}",
        out.status,
        out.stderr
    );
    assert!(
        out.stderr.contains("stop requested"),
        "{state}: {}",
        out.stderr
    );
    // The stop is taken up in whatever state the source is in: never lost and left to the
    // source's grace to end by force.
    assert!(
        !out.stderr.contains("stopping hard"),
        "{state}: the stop was not taken up\n{}",
        out.stderr
    );
    let stats = read_json(&dir.join("stats.json"));
    let n = |k: &str| stats[k].as_u64().unwrap();
    let processed = n("frames_processed");
    assert_eq!(
        n("frames_decoded"),
        processed + n("frames_failed") + n("frames_dropped"),
        "{state}: {stats}"
    );
    let lines = match std::fs::read_to_string(dir.join("events.jsonl")) {
        Ok(_) => jsonl(&dir.join("events.jsonl")).len() as u64,
        Err(_) => 0,
    };
    assert_eq!(lines, processed, "{state}: {stats}");
    let written = stats["sinks"]["video"]["written"].as_u64().unwrap();
    assert_eq!(written, processed, "{state}: {stats}");
    let video = dir.join("out.mp4");
    if written > 0 {
        // Every segment: a looping file passes 60 s of video (1800 frames) in about 2 s, and
        // the sink then starts `out.1.mp4`.
        assert_eq!(count_segment_frames(&video), written, "{state}: {stats}");
    } else {
        // The encoder starts at the first image; the sink only created the file, to fail at
        // start if it cannot: no frame, an empty file.
        let size = std::fs::metadata(&video).map_or(0, |m| m.len());
        assert_eq!(size, 0, "{state}: a video without frames has {size} bytes");
    }
    println!(
        "{state}: decoded {} processed {processed} dropped {}",
        n("frames_decoded"),
        n("frames_dropped")
    );
}

fn wait_for_events(dir: &Path, lines: usize) {
    common::wait_for_lines(&dir.join("events.jsonl"), lines, DEADLINE);
}

#[test]
fn sigterm_during_start_up_and_connection_set_up() {
    let _turn = serial();
    let mut random = Random::new("start-up");
    let server = RtspServer::start(RtspServerOptions::default()).unwrap();
    // 5 trials against a server that answers, from 0 to 1.2 s after the signal handler is
    // in place: GStreamer set-up, the RTSP handshake, the first frames.
    for trial in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let p = pipeline(dir.path(), &rtsp_source(&server.url()));
        let run = start(dir.path(), &p);
        let wait = random.ms(0, 1200);
        std::thread::sleep(wait);
        stop_and_check(run, dir.path(), &format!("start-up {trial} (+{wait:?})"));
    }
    // 2 trials against a server that accepts the connection and never answers, 2 against a
    // black hole (the TCP connect itself hangs).
    let (mute, accepted) = mute_server();
    let hole = black_hole();
    for (trial, (what, port)) in [("never answers", mute), ("black hole", hole)]
        .into_iter()
        .flat_map(|t| [t, t])
        .enumerate()
    {
        let accepted_before = accepted.load(Ordering::SeqCst);
        let dir = tempfile::tempdir().unwrap();
        let p = pipeline(
            dir.path(),
            &rtsp_source(&format!("rtsp://127.0.0.1:{port}/x")),
        );
        let run = start(dir.path(), &p);
        run.wait_for_stderr("source started", DEADLINE);
        // The state of the trial: the connection is being set up. The mute server has taken
        // it; to the black hole, this process's connect is stuck in SYN-SENT.
        common::wait_until(what, DEADLINE, || {
            if port == mute {
                accepted.load(Ordering::SeqCst) > accepted_before
            } else {
                connecting_to(port)
            }
        });
        let wait = random.ms(0, 800);
        std::thread::sleep(wait);
        stop_and_check(run, dir.path(), &format!("{what} {trial} (+{wait:?})"));
    }
    drop(hole_guard(None));
}

/// A port whose server accepts connections and never says a word, and how many it accepted.
fn mute_server() -> (u16, Arc<AtomicUsize>) {
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut conn in mute.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 256];
            let _ = conn.set_nonblocking(true);
            let _ = conn.read(&mut buf);
            held.push(conn);
        }
    });
    (port, accepted)
}

/// Whether a TCP connection to `port` on 127.0.0.1 is in SYN-SENT (`/proc/net/tcp`, state 02):
/// a connect that hangs.
fn connecting_to(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .any(|f| f.len() > 3 && f[2] == remote && f[3] == "02")
}

/// A port where a TCP connect hangs (SYN-SENT), as to a black-holed host: a listener that
/// never accepts, its accept queue filled by connections made here, so the kernel drops the
/// SYNs of any further one. The listener and the filling connections stay open for the test.
fn black_hole() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fill = Vec::new();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(conn) => fill.push(conn),
            Err(_) => break,
        }
        assert!(fill.len() < 10_000, "the accept queue never filled");
    }
    hole_guard(Some((listener, fill)));
    addr.port()
}

type Hole = (TcpListener, Vec<TcpStream>);

/// Keeps the black hole's sockets until the test ends (`None` takes them back to drop them).
fn hole_guard(keep: Option<Hole>) -> Option<Hole> {
    static HOLE: Mutex<Option<Hole>> = Mutex::new(None);
    let mut hole = HOLE.lock().unwrap_or_else(|p| p.into_inner());
    match keep {
        Some(h) => hole.replace(h),
        None => hole.take(),
    }
}

#[test]
fn sigterm_while_backing_off_or_stalled() {
    let _turn = serial();
    let mut random = Random::new("back-off and stall");
    // 4 trials: the server goes away; the signal comes while the source waits between
    // attempts (initial delay 300 ms) or makes one.
    for trial in 0..4 {
        let mut server = RtspServer::start(RtspServerOptions::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = pipeline(dir.path(), &rtsp_source(&server.url()));
        let run = start(dir.path(), &p);
        wait_for_events(dir.path(), 3);
        server.stop();
        run.wait_for_stderr("source lost; reconnecting", DEADLINE);
        let wait = random.ms(0, 900);
        std::thread::sleep(wait);
        stop_and_check(run, dir.path(), &format!("back-off {trial} (+{wait:?})"));
    }
    // 3 trials: the server stops sending frames and keeps the connection; the signal comes
    // while the source waits for its stall timeout (1 s), or reconnects after it.
    for trial in 0..3 {
        let server = RtspServer::start(RtspServerOptions::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = pipeline(dir.path(), &rtsp_source(&server.url()));
        let run = start(dir.path(), &p);
        wait_for_events(dir.path(), 3);
        assert_eq!(server.pause_frames(), 1);
        let wait = random.ms(0, 1600);
        std::thread::sleep(wait);
        stop_and_check(run, dir.path(), &format!("stall {trial} (+{wait:?})"));
    }
}

#[test]
fn sigterm_while_looping_a_file() {
    let _turn = serial();
    let mut random = Random::new("looping file");
    let media = tempfile::tempdir().unwrap();
    let clip = media.path().join("clip.mp4");
    make_h264_mp4(&clip, 20, 160, 120);
    // 4 trials: the file is decoded again and again as fast as the workflow takes it; the
    // signal comes anywhere in a pass or between passes.
    for trial in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let p = pipeline(
            dir.path(),
            &format!("[sources.clip]\nuri = \"{}\"\nloop = true", clip.display()),
        );
        let run = start(dir.path(), &p);
        // The state of the trial: the file is being looped through the workflow.
        wait_for_events(dir.path(), 1);
        let wait = random.ms(0, 1500);
        std::thread::sleep(wait);
        stop_and_check(
            run,
            dir.path(),
            &format!("looping file {trial} (+{wait:?})"),
        );
    }
}
