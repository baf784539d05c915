//! The `webhook` sink against a minimal real HTTP/1.1 server started by the test (a std
//! `TcpListener` thread: it reads each request's headers and `content-length` body and answers
//! with a status it chooses, closing the connection) and the real `vidflow` binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// Generous "it must not hang" guard.
const HANG: Duration = Duration::from_secs(120);

/// One request as the server read it, and the status it answered.
#[derive(Debug, Clone)]
struct Request {
    path: String,
    headers: BTreeMap<String, String>,
    body: serde_json::Value,
    status: u16,
}

/// Serves until the process ends; `status(n, frame)` picks the answer to the n-th request
/// (from 0) carrying `frame`.
fn serve(status: fn(usize, u64) -> u16) -> (u16, Arc<Mutex<Vec<Request>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
            let mut headers = BTreeMap::new();
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).unwrap();
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap();
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
            }
            let len: usize = headers["content-length"].parse().unwrap();
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let frame = body["frame"].as_u64().unwrap();
            let mut requests = seen.lock().unwrap();
            let n = requests
                .iter()
                .filter(|r: &&Request| r.body["frame"] == frame)
                .count();
            let code = status(n, frame);
            requests.push(Request {
                path,
                headers,
                body,
                status: code,
            });
            drop(requests);
            let reason = if code == 200 { "OK" } else { "Error" };
            let _ = write!(
                stream,
                "HTTP/1.1 {code} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    (port, log)
}

#[test]
fn every_frame_is_delivered_once_through_500s() {
    // Frame 0 fails three times (all its retries but the last), every 7th frame once.
    let (port, log) = serve(|n, frame| match frame {
        0 if n < 3 => 500,
        f if f % 7 == 0 && n == 0 => 503,
        _ => 200,
    });
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 40, 320, 240);
    let file = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "{}"

[steps.motion]
kind = "motion"
image = "$frame"

[sinks.lines]
kind = "jsonl"
path = "out/lines.jsonl"
include = ["$steps.motion.detections"]

[sinks.hook]
kind = "webhook"
url = "http://127.0.0.1:{port}/events"
headers = {{ X-Token = "hunter2" }}
retries = 3
include = ["$steps.motion.detections"]
"#,
            clip.display()
        ),
    );
    let out = spawn_run(&file, &["--stats-json", "stats.json"], dir.path()).finish(HANG);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    assert_eq!(
        out.stderr.matches("webhook failing").count(),
        1 + 5,
        "one warning per outage (frame 0's three tries are one), not per try: {}",
        out.stderr
    );
    let lines = jsonl(&dir.path().join("out/lines.jsonl"));
    assert_eq!(lines.len(), 40);
    let requests = log.lock().unwrap().clone();
    let accepted: Vec<_> = requests
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.body.clone())
        .collect();
    assert_eq!(
        accepted, lines,
        "every frame once, in order, as its jsonl line"
    );
    let refused = requests.iter().filter(|r| r.status != 200).count();
    assert_eq!(refused, 3 + 5, "frame 0 three times, frames 7..35 once");
    assert!(requests.iter().all(|r| r.path == "/events"
        && r.headers["x-token"] == "hunter2"
        && r.headers["content-type"] == "application/json"));
}

#[test]
fn a_server_that_never_accepts_costs_its_frames_not_the_daemon() {
    let (port, log) = serve(|_, _| 500);
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 10, 160, 120);
    let file = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "{}"

[sinks.lines]
kind = "jsonl"
path = "out/lines.jsonl"

[sinks.hook]
kind = "webhook"
url = "http://127.0.0.1:{port}/"
retries = 1
flush_timeout_ms = 60000
"#,
            clip.display()
        ),
    );
    let out = spawn_run(&file, &[], dir.path()).finish(HANG);
    assert!(!out.status.success(), "a loss is not a clean exit");
    assert!(
        out.stderr
            .contains("10 (from source \"cam\" frame 0 to source \"cam\" frame 9) given up"),
        "{}",
        out.stderr
    );
    assert_eq!(jsonl(&dir.path().join("out/lines.jsonl")).len(), 10);
    assert_eq!(log.lock().unwrap().len(), 20, "two attempts per frame");
}
