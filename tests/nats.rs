//! The `nats` sink against real `nats-server` processes (JetStream, file storage) started by
//! the test on free ports of 127.0.0.1, a real reader (async-nats) of what the stream stored,
//! and the real `vidflow` binary: payloads, ids and order; a server killed and restarted
//! mid-run; a cluster losing its stream leader; a server that never answers; a spool left at a
//! stop and replayed by the next run; passwords and tokens kept out of stderr.
//! Needs the Debian package `nats-server` (scripts/install-deps).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::nats;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::*;
use nats::{NatsServer, Reader, Stored};
use serde_json::Value;

/// Generous "it must not hang" guard.
const HANG: Duration = Duration::from_secs(120);
/// The stream the sink creates.
const STREAM: &str = "VIDFLOW";

/// A message's payload without the fields the sink adds: the `jsonl` line it must equal.
fn as_line(payload: &Value) -> Value {
    let mut p = payload.clone();
    let obj = p.as_object_mut().unwrap();
    assert_eq!(obj.remove("schema"), Some(Value::from(1)), "{payload}");
    assert!(
        obj.remove("host").is_some_and(|h| h.is_string()),
        "{payload}"
    );
    obj.remove("id");
    p
}

/// Checks what `stored` holds against the `jsonl` lines: every line once per id (de-duplicated
/// by the stream), each id in its header and payload, in frame order per subject. Returns the
/// number of copies the stream stored beyond one per id (0 when de-duplication worked).
fn check_stream(stored: &[Stored], lines: &[Value], subject_of: impl Fn(&str) -> String) -> usize {
    let mut by_id = BTreeMap::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut copies = 0;
    for m in stored {
        assert_eq!(m.payload["id"], Value::from(m.msg_id.clone()), "{m:?}");
        let source = m.payload["source"].as_str().unwrap();
        assert_eq!(m.subject, subject_of(source), "{m:?}");
        let frame = m.payload["frame"].as_u64().unwrap();
        if by_id
            .insert(m.msg_id.clone(), as_line(&m.payload))
            .is_some()
        {
            copies += 1;
            continue;
        }
        if let Some(before) = last.insert(m.subject.clone(), frame) {
            assert!(
                frame > before,
                "{}: frame {frame} stored after frame {before}",
                m.subject
            );
        }
    }
    let mut got: Vec<Value> = by_id.into_values().collect();
    let key = |v: &Value| {
        (
            v["source"].as_str().unwrap().to_owned(),
            v["frame"].as_u64().unwrap(),
        )
    };
    got.sort_by_key(key);
    let mut want = lines.to_vec();
    want.sort_by_key(key);
    let keys = |v: &[Value]| v.iter().map(key).collect::<std::collections::BTreeSet<_>>();
    let (got_keys, want_keys) = (keys(&got), keys(&want));
    assert_eq!(
        got.len(),
        want.len(),
        "messages stored once per id vs jsonl lines; lines not stored: {:?}; stored, no line: {:?}",
        want_keys.difference(&got_keys).collect::<Vec<_>>(),
        got_keys.difference(&want_keys).collect::<Vec<_>>()
    );
    assert_eq!(got, want, "each message is its jsonl line");
    copies
}

fn nats_sink(url: &str, extra: &str) -> String {
    format!(
        r#"
[sinks.bus]
kind = "nats"
url = "{url}"
stream = "{STREAM}"
include = ["$steps.motion.detections"]
{extra}
"#
    )
}

#[test]
fn every_frame_arrives_once_per_id_in_order_per_camera() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start(dir.path(), "");
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 60, 320, 240);
    let clip = clip.to_str().unwrap();
    let sinks = nats_sink(&server.url(), "spool_dir = \"spool/bus\"");
    let file = write(
        dir.path(),
        "p.toml",
        &common::motion_pipeline(&[("door", clip), ("yard", clip)], &sinks),
    );
    let out = spawn_run(&file, &["--stats-json", "stats.json"], dir.path()).finish(HANG);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/lines.jsonl"));
    assert_eq!(lines.len(), 120);
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["sinks"]["bus"]["written"], 120, "{stats}");

    let reader = Reader::connect(&server.url());
    let stored = reader.messages(STREAM);
    // The stream captures vidflow.*.bus only: the alerts (no stream of theirs) are not in it.
    let copies = check_stream(&stored, &lines, |s| format!("vidflow.{s}.bus"));
    assert_eq!(copies, 0, "a clean run sends each message once");
    // Every message of a run names this host and one run.
    let ids: BTreeSet<String> = stored
        .iter()
        .map(|m| {
            m.msg_id
                .rsplit_once(':')
                .unwrap()
                .0
                .split_once(':')
                .unwrap()
                .1
                .to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 2, "one id prefix per source: {ids:?}");
    // The spool of a run that delivered everything is left empty.
    let spooled: Vec<_> = std::fs::read_dir(dir.path().join("spool/bus"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter(|n| n.ends_with(".spool"))
        .collect();
    assert!(spooled.is_empty(), "{spooled:?}");
}

#[test]
fn events_mode_and_every_n_frames_choose_what_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start(dir.path(), "");
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 60, 320, 240);
    let sinks = nats_sink(
        &server.url(),
        "subject = \"alerts.{source}\"\nmode = \"events\"\nevery_n_frames = 2",
    );
    let file = write(
        dir.path(),
        "p.toml",
        &common::motion_pipeline(&[("cam", clip.to_str().unwrap())], &sinks),
    );
    let out = spawn_run(&file, &[], dir.path()).finish(HANG);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/lines.jsonl"));
    let events: Vec<Value> = lines
        .into_iter()
        .filter(|l| {
            l["frame"].as_u64().unwrap() % 2 == 0
                && l["steps.motion.detections"]
                    .as_array()
                    .is_some_and(|d| !d.is_empty())
        })
        .collect();
    assert!(!events.is_empty() && events.len() < 30, "the clip moves");
    let stored = Reader::connect(&server.url()).messages(STREAM);
    check_stream(&stored, &events, |s| format!("alerts.{s}"));
}

/// Runs a live camera into `server` (its `bus` sink given `extra`), calls `outage` once 20
/// messages are stored, then stops the run after 15 more frames; returns the jsonl lines and
/// vidflow's stderr.
fn run_through_outage(
    dir: &Path,
    url: &str,
    extra: &str,
    outage: impl FnOnce(&common::Running, &Path),
) -> (Vec<Value>, String) {
    let sinks = nats_sink(url, extra);
    let file = write(
        dir,
        "p.toml",
        &common::motion_pipeline(
            &[("cam", "test://ball?width=160&height=120&fps=30")],
            &sinks,
        ),
    );
    let lines_path = dir.join("out/lines.jsonl");
    let running = spawn_run(&file, &["--stats-json", "stats.json"], dir);
    Reader::connect(url).wait_for(STREAM, 20, HANG);
    outage(&running, &lines_path);
    let out = common::stop_after_more_frames(running, &lines_path, HANG);
    (jsonl(&lines_path), out.stderr)
}

#[test]
fn a_server_killed_and_restarted_mid_run_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = NatsServer::start(dir.path(), "");
    let url = server.url();
    // A backlog of 10: most of the outage goes through the disk spool.
    let (lines, stderr) = run_through_outage(dir.path(), &url, "backlog = 10", |running, lines| {
        common::away_and_back(
            running,
            lines,
            ("nats server", 60, HANG),
            &mut server,
            (NatsServer::kill, NatsServer::restart),
        );
    });
    assert_eq!(
        stderr.matches("nats server unreachable").count(),
        1,
        "one warning per outage:\n{stderr}"
    );
    let reader = Reader::connect(&url);
    reader.wait_for(STREAM, lines.len() as u64, HANG);
    let copies = check_stream(&reader.messages(STREAM), &lines, |s| {
        format!("vidflow.{s}.bus")
    });
    eprintln!(
        "restart: {} frames, {copies} copies kept by the stream",
        lines.len()
    );
    assert_eq!(copies, 0, "the stream de-duplicates what was sent again");
}

#[test]
fn a_cluster_losing_its_stream_leader_loses_nothing() {
    // Three nodes, three replicas: JetStream's Raft needs a majority to store, so a stream of
    // two replicas on two nodes stops accepting when either is down. Three keep a quorum of
    // two with one node killed.
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = nats::cluster(dir.path(), 3);
    let urls: Vec<String> = nodes.iter().map(NatsServer::url).collect();
    let url = urls.join(",");
    // Where stderr stood when the leader was killed.
    let at_kill = std::cell::Cell::new(0);
    // The stop waits for the backlog (up to 20 s): what the election held back is delivered,
    // not spooled for a next run.
    let extra = "replicas = 3\nflush_timeout_ms = 20000\n\n[daemon]\nstop_timeout_s = 40";
    let (lines, stderr) = run_through_outage(dir.path(), &url, extra, |running, lines| {
        let leader = Reader::connect(&url)
            .leader(STREAM)
            .expect("a stream leader");
        let node = nodes.iter_mut().find(|n| n.name == leader).unwrap();
        at_kill.set(running.stderr().len());
        node.kill();
        let at_kill = jsonl(lines).len();
        wait_for_lines(lines, at_kill + 60, HANG);
    });
    let alive: Vec<String> = nodes
        .iter()
        .filter(|n| TcpProbe::listening(n.port))
        .map(NatsServer::url)
        .collect();
    let reader = Reader::connect(&alive.join(","));
    reader.wait_for(STREAM, lines.len() as u64, HANG);
    let copies = check_stream(&reader.messages(STREAM), &lines, |s| {
        format!("vidflow.{s}.bus")
    });
    eprintln!("leader killed: {} frames, {copies} copies", lines.len());
    assert!(!stderr.contains("kept in the spool"), "{stderr}");
    // (A new cluster may also refuse the stream's creation until it has elected a leader.)
    assert!(
        stderr[at_kill.get()..]
            .matches("nats server unreachable")
            .count()
            <= 1,
        "one warning per outage:\n{stderr}"
    );
}

/// Whether something listens on a port of 127.0.0.1.
struct TcpProbe;

impl TcpProbe {
    fn listening(port: u16) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }
}

/// A pipeline of a live camera into a server that never answers, stopped after 30 frames.
fn run_against_silence(dir: &Path, extra: &str) -> common::Finished {
    let silent = Silent::start();
    let sinks = nats_sink(
        &format!("nats://127.0.0.1:{}", silent.port),
        &format!("flush_timeout_ms = 1000\n{extra}"),
    );
    let text = common::motion_pipeline(
        &[("cam", "test://ball?width=160&height=120&fps=30")],
        &sinks,
    ) + "\n[daemon]\nstop_timeout_s = 3\n";
    let file = write(dir, "p.toml", &text);
    let running = spawn_run(&file, &[], dir);
    wait_for_lines(&dir.join("out/lines.jsonl"), 30, HANG);
    running.signal("TERM");
    running.finish(HANG)
}

#[test]
fn a_server_that_never_answers_cannot_hold_the_stop_and_the_loss_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_against_silence(dir.path(), "spool_mb = 0");
    // Nothing abandoned, and the sink's loss fails the run.
    assert!(!out.stderr.contains("abandoned"), "{}", out.stderr);
    common::assert_loss_counted_within_the_stop(&out, "nats");
}

#[test]
fn a_spool_left_at_a_stop_is_replayed_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let first = run_against_silence(dir.path(), "spool_dir = \"spool\"");
    assert!(
        first.status.success(),
        "kept in the spool is not lost: {}",
        first.stderr
    );
    assert!(
        first.stderr.contains("kept in the spool for the next run"),
        "{}",
        first.stderr
    );
    let lines = jsonl(&dir.path().join("out/lines.jsonl"));
    // The next run, with a server, sends what the first left before its own frames.
    let server = NatsServer::start(dir.path(), "");
    std::fs::remove_file(dir.path().join("out/lines.jsonl")).unwrap();
    let sinks = nats_sink(&server.url(), "spool_dir = \"spool\"");
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 10, 160, 120);
    let file = write(
        dir.path(),
        "p2.toml",
        &common::motion_pipeline(&[("cam", clip.to_str().unwrap())], &sinks),
    );
    let out = spawn_run(&file, &[], dir.path()).finish(HANG);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stderr.contains("replaying the spool"), "{}", out.stderr);
    let second = jsonl(&dir.path().join("out/lines.jsonl"));
    // One subject: the first run's frames (from the spool), in order, then the second run's.
    let stored: Vec<Value> = Reader::connect(&server.url())
        .messages(STREAM)
        .iter()
        .map(|m| as_line(&m.payload))
        .collect();
    let want: Vec<Value> = lines.iter().chain(&second).cloned().collect();
    assert_eq!(stored.len(), want.len());
    assert_eq!(
        stored, want,
        "the spooled run first, then the new one, each in order"
    );
}

#[test]
fn a_refused_password_or_token_never_shows() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start(
        dir.path(),
        "authorization {\n  users: [ { user: vid, password: \"right-one\" } ]\n}",
    );
    let pw = write(dir.path(), "nats.pw", "hunter2-wrong\n");
    for (name, login) in [
        (
            "password_file",
            format!(
                "url = \"{}\"\nusername = \"vid\"\npassword_file = \"{}\"",
                server.url(),
                pw.display()
            ),
        ),
        (
            "url password",
            format!("url = \"nats://vid:hunter2%21@127.0.0.1:{}\"", server.port),
        ),
        (
            "url token",
            format!("url = \"nats://hunter2tok@127.0.0.1:{}\"", server.port),
        ),
    ] {
        eprintln!("{name}");
        check_refused_login(dir.path(), "nats", &login, "authorization", "hunter2");
    }
}
