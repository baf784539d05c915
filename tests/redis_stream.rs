//! The `redis_stream` sink against a real `redis-server` started by the test on a free port of
//! 127.0.0.1 (append-only file, so a SIGKILL keeps what it acknowledged), reading back with
//! XRANGE, and the real `vidflow` binary: fields, order per camera and trimming; a server
//! killed and restarted mid-run; a server that never answers; passwords kept out of stderr.
//! Needs the Debian package `redis-server` (scripts/install-deps).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::redis as redis_server;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::*;
use redis_server::{Entry, RedisServer};
use serde_json::Value;

/// Generous "it must not hang" guard.
const HANG: Duration = Duration::from_secs(120);

/// An entry's payload without what the sink adds: the `jsonl` line it must equal; and its
/// fields must say the same as its payload.
fn as_line(e: &Entry) -> Value {
    assert_eq!(e.payload["id"], Value::from(e.id.clone()), "{e:?}");
    assert_eq!(e.payload["source"], Value::from(e.source.clone()), "{e:?}");
    assert_eq!(e.payload["frame"], Value::from(e.frame), "{e:?}");
    let mut p = e.payload.clone();
    let obj = p.as_object_mut().unwrap();
    assert_eq!(obj.remove("schema"), Some(Value::from(1)), "{e:?}");
    assert!(obj.remove("host").is_some_and(|h| h.is_string()), "{e:?}");
    obj.remove("id");
    p
}

/// The lines of `source`, in order.
fn of(lines: &[Value], source: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l["source"] == source)
        .cloned()
        .collect()
}

/// The entries with each id's first copy only, and how many copies were left out.
fn first_copies(entries: &[Entry]) -> (Vec<Value>, usize) {
    let mut seen = BTreeSet::new();
    let kept: Vec<Value> = entries
        .iter()
        .filter(|e| seen.insert(e.id.clone()))
        .map(as_line)
        .collect();
    let copies = entries.len() - kept.len();
    (kept, copies)
}

#[test]
fn every_frame_arrives_in_order_per_camera_with_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    // Small stream nodes, so that `MAXLEN ~` trims a short stream too.
    let server = RedisServer::start(dir.path(), &["--stream-node-max-entries", "10"]);
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 60, 320, 240);
    let clip = clip.to_str().unwrap();
    let sinks = format!(
        r#"
[sinks.cams]
kind = "redis_stream"
url = "{url}"
include = ["$steps.motion.detections"]

[sinks.all]
kind = "redis_stream"
url = "{url}"
key = "site:{{sink}}"
include = ["$steps.motion.detections"]
batch = 7

[sinks.short]
kind = "redis_stream"
url = "{url}"
key = "short:{{source}}"
maxlen = 10
include = ["$steps.motion.detections"]
"#,
        url = server.url()
    );
    let file = write(
        dir.path(),
        "p.toml",
        &common::motion_pipeline(&[("door", clip), ("yard", clip)], &sinks),
    );
    let out = spawn_run(&file, &[], dir.path()).finish(HANG);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/lines.jsonl"));
    assert_eq!(lines.len(), 120);
    // One stream per camera: its frames, once each, in order.
    for source in ["door", "yard"] {
        let entries = server.entries(&format!("vidflow:{source}"));
        let got: Vec<Value> = entries.iter().map(as_line).collect();
        assert_eq!(got, of(&lines, source), "stream of {source}");
    }
    // One keyed stream: both cameras, each in order.
    let all: Vec<Value> = server.entries("site:all").iter().map(as_line).collect();
    assert_eq!(all.len(), 120);
    for source in ["door", "yard"] {
        assert_eq!(of(&all, source), of(&lines, source), "{source} in site:all");
    }
    // Trimmed to about 10: fewer than were sent, the newest kept.
    let short = server.entries("short:door");
    assert!((10..60).contains(&short.len()), "{} entries", short.len());
    assert_eq!(short.last().unwrap().frame, 59);
}

#[test]
fn a_server_killed_and_restarted_mid_run_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = RedisServer::start(dir.path(), &[]);
    // A backlog of 10: most of the outage goes through the disk spool.
    let sinks = format!(
        r#"
[sinks.bus]
kind = "redis_stream"
url = "{}"
include = ["$steps.motion.detections"]
backlog = 10
"#,
        server.url()
    );
    let file = write(
        dir.path(),
        "p.toml",
        &common::motion_pipeline(
            &[("cam", "test://ball?width=160&height=120&fps=30")],
            &sinks,
        ),
    );
    let lines_path = dir.path().join("out/lines.jsonl");
    let running = spawn_run(&file, &[], dir.path());
    server.wait_for("vidflow:cam", 20, HANG);
    common::away_and_back(
        &running,
        &lines_path,
        ("redis_stream server", 60, HANG),
        &mut server,
        (RedisServer::kill, RedisServer::restart),
    );
    let out = common::stop_after_more_frames(running, &lines_path, HANG);
    assert_eq!(
        out.stderr
            .matches("redis_stream server unreachable")
            .count(),
        1,
        "one warning per outage:\n{}",
        out.stderr
    );
    let lines = jsonl(&lines_path);
    let (got, copies) = first_copies(&server.entries("vidflow:cam"));
    assert_eq!(got, lines, "every frame, in order (first copies)");
    eprintln!("restart: {} frames, {copies} copies", lines.len());
}

/// A live camera into a server that never answers, stopped after 30 frames.
fn run_against_silence(dir: &Path) -> Finished {
    let silent = Silent::start();
    let sinks = format!(
        r#"
[sinks.bus]
kind = "redis_stream"
url = "redis://127.0.0.1:{}"
include = ["$steps.motion.detections"]
flush_timeout_ms = 1000
timeout_ms = 1000
spool_mb = 0

[daemon]
stop_timeout_s = 3
"#,
        silent.port
    );
    let text = common::motion_pipeline(
        &[("cam", "test://ball?width=160&height=120&fps=30")],
        &sinks,
    );
    let file = write(dir, "p.toml", &text);
    let running = spawn_run(&file, &[], dir);
    wait_for_lines(&dir.join("out/lines.jsonl"), 30, HANG);
    running.signal("TERM");
    running.finish(HANG)
}

#[test]
fn a_server_that_never_answers_cannot_hold_the_stop_and_the_loss_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_against_silence(dir.path());
    common::assert_loss_counted_within_the_stop(&out, "redis_stream");
}

#[test]
fn a_refused_password_never_shows() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &["--requirepass", "right-one"]);
    let pw = write(dir.path(), "redis.pw", "hunter2-wrong\n");
    for (name, login) in [
        (
            "password_file",
            format!(
                "url = \"{}\"\nusername = \"default\"\npassword_file = \"{}\"",
                server.url(),
                pw.display()
            ),
        ),
        (
            "url password",
            format!("url = \"redis://:hunter2%21@127.0.0.1:{}\"", server.port),
        ),
    ] {
        eprintln!("{name}");
        check_refused_login(
            dir.path(),
            "redis_stream",
            &login,
            "authentication failed",
            "hunter2",
        );
    }
}
