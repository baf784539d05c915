//! RTSP servers that misbehave, against the real `vidflow run` binary (issue 25): one that
//! answers `RTSP/1.0 200 OK\r\nX-Junk: ` and then sends `A` forever with no line end (it held
//! rtspsrc's teardown for good: no retry, no exit 69, and a stop that waited out its whole
//! deadline to exit 70), and one that accepts the connection and never says a word.
//!
//! The servers are real TCP listeners on 127.0.0.1 in this test process, speaking just enough
//! RTSP to misbehave: gst-rtsp-server cannot be made to do either.
//!
//! The two deadlines asserted are the behaviour the issue asks for, with room for a loaded
//! 2-core machine: 69 within 40 s with `max_attempts = 3` (4 connections of a 5 s stall
//! timeout each, plus the backoff), and a stop under the flood within 10 s (its deadline is
//! 20 s). The measured times are printed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{Running, read_json, spawn, write};

/// Only turns a hang into a failure.
const DEADLINE: Duration = Duration::from_secs(120);

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A server that answers every request with the start of a header that never ends.
struct Flood {
    port: u16,
    /// Connections accepted.
    accepted: Arc<AtomicUsize>,
    /// Bytes of `A` sent, over all connections.
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Flood {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s, st) = (Arc::clone(&accepted), Arc::clone(&sent), Arc::clone(&stop));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                a.fetch_add(1, Ordering::SeqCst);
                let (s, st) = (Arc::clone(&s), Arc::clone(&st));
                std::thread::spawn(move || flood(conn, &s, &st));
            }
        });
        Self {
            port,
            accepted,
            sent,
            stop,
        }
    }

    fn url(&self) -> String {
        format!("rtsp://127.0.0.1:{}/cam", self.port)
    }
}

/// Reads the request, then sends the endless header until the client goes away.
fn flood(mut conn: TcpStream, sent: &AtomicU64, stop: &AtomicBool) {
    let mut request = [0u8; 2048];
    let _ = conn.read(&mut request);
    if conn.write_all(b"RTSP/1.0 200 OK\r\nX-Junk: ").is_err() {
        return;
    }
    let junk = [b'A'; 16 * 1024];
    while !stop.load(Ordering::SeqCst) {
        match conn.write(&junk) {
            Ok(n) if n > 0 => {
                sent.fetch_add(n as u64, Ordering::SeqCst);
            }
            _ => return,
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn pipeline(dir: &Path, source: &str) -> std::path::PathBuf {
    write(
        dir,
        "p.toml",
        &format!("{source}\n[sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n"),
    )
}

fn run(dir: &Path, p: &Path) -> Running {
    spawn(
        dir,
        &["run", p.to_str().unwrap(), "--stats-json", "stats.json"],
        &[],
    )
}

#[test]
fn a_flooding_server_is_given_up_on_after_its_attempts_with_exit_69() {
    let _turn = serial();
    let server = Flood::start();
    let dir = tempfile::tempdir().unwrap();
    // Defaults but for the attempts: stall_timeout_ms 5000, initial_delay_ms 500.
    let p = pipeline(
        dir.path(),
        &format!(
            "[sources.cam]\nuri = \"{}\"\n[sources.cam.reconnect]\nmax_attempts = 3\n",
            server.url()
        ),
    );
    let started = Instant::now();
    let out = run(dir.path(), &p).finish(DEADLINE);
    let took = started.elapsed();
    println!(
        "exit {:?} after {took:?}; {} connections, {} bytes of junk\n{}",
        out.status.code(),
        server.accepted.load(Ordering::SeqCst),
        server.sent.load(Ordering::SeqCst),
        out.stderr
    );
    assert_eq!(out.status.code(), Some(69), "{}", out.stderr);
    assert!(
        took < Duration::from_secs(40),
        "69 came after {took:?}, not within 40 s"
    );
    assert!(
        out.stderr
            .contains("gave up after 3 reconnection attempts; last: no answer from the server"),
        "{}",
        out.stderr
    );
    // Every attempt reached the server, and each was cut when its teardown was held.
    let stats = read_json(&dir.path().join("stats.json"));
    let cam = &stats["sources"]["cam"];
    assert_eq!(cam["attempts"], 4, "{stats}");
    assert_eq!(server.accepted.load(Ordering::SeqCst), 4);
    assert_eq!(cam["cut"], 4, "{stats}");
    assert_eq!(cam["abandoned"], 0, "{stats}");
    assert_eq!(
        out.stderr.matches("connection cut").count(),
        4,
        "{}",
        out.stderr
    );
}

#[test]
fn a_stop_under_a_flood_ends_the_run_at_once_and_cleanly() {
    let _turn = serial();
    let server = Flood::start();
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(
        dir.path(),
        &format!("[sources.cam]\nuri = \"{}\"\n", server.url()),
    );
    let running = run(dir.path(), &p);
    // The state meant: rtspsrc is reading the endless header (a megabyte of it so far).
    common::wait_until("the flood under way", DEADLINE, || {
        server.sent.load(Ordering::SeqCst) > 1 << 20
    });
    let signalled = Instant::now();
    running.signal("TERM");
    let out = running.finish(DEADLINE);
    let took = signalled.elapsed();
    println!(
        "exit {:?} {took:?} after SIGTERM\n{}",
        out.status.code(),
        out.stderr
    );
    assert!(
        took < Duration::from_secs(10),
        "the stop took {took:?} (its deadline is 20 s)"
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(!out.stderr.contains("abandoned"), "{}", out.stderr);
    // The connection was cut, not left behind.
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["sources"]["cam"]["cut"], 1, "{stats}");
    assert_eq!(stats["sources"]["cam"]["abandoned"], 0, "{stats}");
}

/// Issue 25, item 8: a server that takes the connection and never answers was reported as
/// "no frame for 5000 ms".
#[test]
fn a_server_that_never_answers_is_named_as_such() {
    let _turn = serial();
    let silent = common::Silent::start();
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(
        dir.path(),
        &format!(
            "[sources.cam]\nuri = \"rtsp://127.0.0.1:{}/cam\"\nstall_timeout_ms = 1000\n\
             [sources.cam.reconnect]\nmax_attempts = 1\ninitial_delay_ms = 100\n",
            silent.port
        ),
    );
    let out = run(dir.path(), &p).finish(DEADLINE);
    println!("{}", out.stderr);
    assert_eq!(out.status.code(), Some(69), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("no answer from the server within 1000 ms"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("no frame for"), "{}", out.stderr);
}
