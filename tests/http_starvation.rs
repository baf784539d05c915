//! The HTTP endpoint cannot be starved: on a real `vidflow` process, 200 idle connections, a
//! slowloris client, a 1 MB header and idle connections that exhaust the process's file
//! descriptors each leave `/healthz` answering a good client within 1 s, and once they are
//! over the daemon's threads and file descriptors are back to where they were.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Running, free_port, spawn_run, write};
use http_client::{
    Load, assert_healthz_answers_quickly, get, load, wait_for_baseline, wait_for_frames,
};

/// Guards against a hang only: a loaded machine may be slow, never wrong.
const DEADLINE: Duration = Duration::from_secs(120);
/// How long the slowloris client keeps going before the test calls it never cut off.
const SLOWLORIS_BYTES: usize = 60;

/// A live source and the endpoint; returns once frames flow, with the daemon's load then.
fn start(dir: &Path) -> (Running, u16, Load) {
    let port = free_port();
    let p = write(
        dir,
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"test://ball?width=160&height=120&fps=10\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n"
        ),
    );
    let run = spawn_run(&p, &[], dir);
    wait_for_frames(port, "cam", 5, DEADLINE);
    let baseline = load(run.pid());
    (run, port, baseline)
}

#[test]
fn healthz_and_metrics_answer_while_200_idle_connections_are_open_and_those_are_let_go() {
    // This process holds the 200 connections and its own descriptors; so may vidflow.
    let test =
        "healthz_and_metrics_answer_while_200_idle_connections_are_open_and_those_are_let_go";
    if !common::raise_fd_limit(400, test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (run, port, baseline) = start(dir.path());
    let idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    assert_healthz_answers_quickly(port);
    assert_eq!(get(port, "/metrics").map(|(status, _)| status), Some(200));
    // Idle connections cost the daemon no thread.
    assert!(
        load(run.pid()).threads <= baseline.threads,
        "{:?}",
        load(run.pid())
    );
    // The daemon lets them go (head deadline, or evicted for newer ones) while they stay open.
    wait_for_baseline(run.pid(), baseline, DEADLINE);
    drop(idle);
    assert_healthz_answers_quickly(port);
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn a_slowloris_client_is_cut_off_at_the_head_deadline_while_healthz_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port, baseline) = start(dir.path());
    let slow = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_nonblocking(true).unwrap();
        let request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".iter();
        let mut answer = Vec::new();
        for &byte in request
            .chain(std::iter::repeat(&b'a'))
            .take(SLOWLORIS_BYTES)
        {
            if stream.write_all(&[byte]).is_err() {
                return (true, answer);
            }
            std::thread::sleep(Duration::from_secs(1));
            let mut buf = [0u8; 1024];
            match stream.read(&mut buf) {
                Ok(0) => return (true, answer),
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return (true, answer),
            }
        }
        (false, answer)
    });
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(1));
        assert_healthz_answers_quickly(port);
    }
    let (cut_off, answer) = slow.join().unwrap();
    assert!(
        cut_off,
        "a byte a second for {SLOWLORIS_BYTES} s was never cut off"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    wait_for_baseline(run.pid(), baseline, DEADLINE);
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn a_1_mb_header_is_refused_at_once_while_healthz_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port, baseline) = start(dir.path());
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let big = std::thread::spawn(move || {
        let mut request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".to_vec();
        request.resize(request.len() + (1 << 20), b'a');
        writer.write_all(&request)
    });
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    // The daemon stops reading past 8 kB: it answers 431, or its close with the rest unread
    // resets the connection before the answer is read.
    match read {
        Ok(_) => assert!(answer.starts_with("HTTP/1.1 431 "), "{answer:?}"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
    let _ = big.join().unwrap();
    assert_healthz_answers_quickly(port);
    drop(stream);
    wait_for_baseline(run.pid(), baseline, DEADLINE);
    run.terminate_cleanly(DEADLINE);
}

/// Sets the soft `RLIMIT_NOFILE` of `pid` (util-linux `prlimit`).
fn set_fd_limit(pid: u32, soft: usize) {
    let status = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:")])
        .status()
        .unwrap();
    assert!(status.success(), "prlimit failed");
}

/// The soft `RLIMIT_NOFILE` of `pid`.
fn fd_limit(pid: u32) -> usize {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

#[test]
fn out_of_file_descriptors_idle_connections_make_room_for_healthz_with_one_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port, baseline) = start(dir.path());
    let original = fd_limit(run.pid());
    // A few descriptors above what the daemon holds: the idle connections exhaust them.
    set_fd_limit(run.pid(), baseline.fds + 8);
    let idle: Vec<TcpStream> = (0..30)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    run.wait_for_stderr("http: cannot accept connections", DEADLINE);
    for _ in 0..5 {
        assert_healthz_answers_quickly(port);
    }
    let warnings = run
        .stderr()
        .matches("http: cannot accept connections")
        .count();
    assert_eq!(warnings, 1, "{}", run.stderr());
    drop(idle);
    set_fd_limit(run.pid(), original);
    wait_for_baseline(run.pid(), baseline, DEADLINE);
    run.terminate_cleanly(DEADLINE);
}
