//! The `mqtt` sink against a real `mosquitto` broker started by the test on a free port of
//! 127.0.0.1, a real subscriber (rumqttc, QoS 1, persistent session) and the real `vidflow`
//! binary: payloads and order, a broker restart mid-run, and passwords kept out of stderr.
//! Needs the Debian package `mosquitto` (scripts/install-deps).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::mqtt as broker;

use std::collections::BTreeSet;
use std::time::Duration;

use broker::{Broker, Subscriber};
use common::*;

/// Generous "it must not hang" guard.
const HANG: Duration = Duration::from_secs(120);

/// The frames in the order they first arrived; repeats (QoS 1 resends) left out.
fn first_arrivals(received: &[broker::Received]) -> (Vec<serde_json::Value>, usize) {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for r in received {
        if seen.insert(r.payload["frame"].as_u64().unwrap()) {
            out.push(r.payload.clone());
        }
    }
    let repeats = received.len() - out.len();
    (out, repeats)
}

#[test]
fn every_frame_arrives_in_order_as_its_jsonl_line() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), "");
    let sub = Subscriber::start(broker.port, "#");
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 60, 320, 240);
    let sinks = format!(
        r#"
[sinks.mqtt]
kind = "mqtt"
url = "{url}"
include = ["$steps.motion.detections"]

[sinks.alerts]
kind = "mqtt"
url = "{url}"
topic = "alerts/{{source}}"
mode = "events"
qos = 0
include = ["$steps.motion.detections"]
"#,
        url = broker.url()
    );
    let file = write(
        dir.path(),
        "p.toml",
        &common::motion_pipeline(&[("cam", clip.to_str().unwrap())], &sinks),
    );
    let out = spawn_run(&file, &["--stats-json", "stats.json"], dir.path()).finish(HANG);
    assert!(out.status.success(), "{}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    let lines = jsonl(&dir.path().join("out/lines.jsonl"));
    assert_eq!(lines.len(), 60);
    let events: Vec<_> = lines
        .iter()
        .filter(|l| {
            l["steps.motion.detections"]
                .as_array()
                .is_some_and(|d| !d.is_empty())
        })
        .cloned()
        .collect();
    assert!(!events.is_empty() && events.len() < 60, "the clip moves");
    assert_eq!(stats["sinks"]["mqtt"]["written"], 60, "{stats}");
    assert_eq!(stats["sinks"]["alerts"]["written"], events.len(), "{stats}");

    sub.wait_for(60 + events.len(), HANG);
    let received = sub.received();
    let frames: Vec<_> = received
        .iter()
        .filter(|r| r.topic == "vidflow/cam/mqtt")
        .map(|r| r.payload.clone())
        .collect();
    let alerts: Vec<_> = received
        .iter()
        .filter(|r| r.topic == "alerts/cam")
        .map(|r| r.payload.clone())
        .collect();
    assert_eq!(
        frames, lines,
        "every frame once, in order, as its jsonl line"
    );
    assert_eq!(alerts, events, "events mode: only frames with a detection");
    assert_eq!(received.len(), frames.len() + alerts.len());
}

/// How the broker goes away mid-run.
#[derive(Debug, Clone, Copy)]
enum Outage {
    /// SIGTERM: it closes the connections and saves its sessions.
    Clean,
    /// SIGSTOP, frames sent meanwhile (never acknowledged), then SIGKILL: what it had not
    /// acknowledged is gone, so the sink must send it again.
    Hard,
}

fn restart_mid_run(outage: Outage) {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(dir.path(), "");
    let subscribed = std::time::SystemTime::now();
    let sub = Subscriber::start(broker.port, "vidflow/#");
    // The subscriber's session must survive a SIGKILL of the broker.
    broker.wait_saved_after(subscribed);
    let sinks = format!(
        r#"
[sinks.mqtt]
kind = "mqtt"
url = "{}"
include = ["$steps.motion.detections"]
"#,
        broker.url()
    );
    let file = write(
        dir.path(),
        "p.toml",
        &common::motion_pipeline(
            &[("cam", "test://ball?width=320&height=240&fps=30")],
            &sinks,
        ),
    );
    let lines_path = dir.path().join("out/lines.jsonl");
    let running = spawn_run(&file, &["--stats-json", "stats.json"], dir.path());
    sub.wait_for(20, HANG);

    let before = jsonl(&lines_path).len();
    // 45 frames made while the broker is away: they wait in the backlog.
    let (at_stop, after) = common::away_and_back(
        &running,
        &lines_path,
        ("mqtt broker", 45, HANG),
        &mut broker,
        (
            |broker: &mut Broker| match outage {
                Outage::Clean => broker.stop(),
                Outage::Hard => {
                    broker.signal("STOP");
                    wait_for_lines(&lines_path, before + 15, HANG);
                    broker.kill();
                }
            },
            Broker::restart,
        ),
    );
    let out = common::stop_after_more_frames(running, &lines_path, HANG);
    assert_eq!(
        out.stderr.matches("mqtt broker unreachable").count(),
        1,
        "one warning per outage, not per try:\n{}",
        out.stderr
    );
    let stats = read_json(&dir.path().join("stats.json"));
    let processed = stats["frames_processed"].as_u64().unwrap() as usize;
    let lines = jsonl(&lines_path);
    assert_eq!(lines.len(), processed);
    assert!(processed >= at_stop + 60);

    // Everything reaches the subscriber, repeats allowed (QoS 1), order kept.
    let start = std::time::Instant::now();
    loop {
        let (unique, _) = first_arrivals(&sub.received());
        if unique.len() >= processed {
            break;
        }
        assert!(
            start.elapsed() < HANG,
            "{} of {processed} frames arrived",
            unique.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (unique, repeats) = first_arrivals(&sub.received());
    assert_eq!(unique, lines, "every frame, in order, as its jsonl line");
    // Repeats: the sink's unacknowledged window (100) and what the broker had saved for the
    // subscriber but not yet seen acknowledged (at most a second of frames).
    assert!(repeats <= 200, "{repeats} repeats");
    eprintln!(
        "broker restart ({outage:?}): {processed} frames, {} made while it was away, {repeats} repeats",
        after - before
    );
}

#[test]
fn a_broker_restart_mid_run_loses_nothing() {
    restart_mid_run(Outage::Clean);
}

#[test]
fn a_broker_killed_while_frozen_loses_nothing() {
    restart_mid_run(Outage::Hard);
}

#[test]
fn a_refused_password_never_shows_and_the_loss_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let passwd = dir.path().join("passwd");
    let made = std::process::Command::new("mosquitto_passwd")
        .args(["-c", "-b"])
        .arg(&passwd)
        .args(["vid", "right-one"])
        .status()
        .expect("mosquitto_passwd (package mosquitto)");
    assert!(made.success());
    let broker = Broker::start(dir.path(), &format!("password_file {}", passwd.display()));
    let sinks = format!(
        r#"
[sinks.mqtt]
kind = "mqtt"
url = "mqtt://vid:hunter2%21@127.0.0.1:{}"
include = ["$steps.motion.detections"]
flush_timeout_ms = 300
"#,
        broker.port
    );
    let file = write(
        dir.path(),
        "p.toml",
        &common::motion_pipeline(
            &[("cam", "test://ball?width=160&height=120&fps=30")],
            &sinks,
        ),
    );
    let running = spawn_run(&file, &[], dir.path());
    running.wait_for_stderr("mqtt broker unreachable", HANG);
    wait_for_lines(&dir.path().join("out/lines.jsonl"), 10, HANG);
    running.signal("TERM");
    let out = running.finish(HANG);
    let stderr = &out.stderr;
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(stderr.contains("mqtt://vid:***@127.0.0.1"), "{stderr}");
    assert!(
        stderr.contains("not delivered by the flush deadline"),
        "{stderr}"
    );
    assert!(
        !out.status.success(),
        "a loss is not a clean exit: {stderr}"
    );
}

#[test]
fn home_assistant_finds_each_count_as_a_sensor_available_while_the_daemon_runs() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), "");
    let text = format!(
        r#"
[sources.cam]
uri = "test://ball?width=160&height=120&fps=30"

[steps.motion]
kind = "motion"
image = "$frame"

[steps.follow]
kind = "tracker"
detections = "$steps.motion.detections"

[steps.zones]
kind = "zone_count"
tracks = "$steps.follow.tracks"
zones = {{ all = [[0, 0], [160, 0], [160, 120], [0, 120]], corner = [[0, 0], [20, 0], [20, 20], [0, 20]], "car park" = [[0, 0], [80, 0], [80, 60], [0, 60]], car_park = [[80, 60], [160, 60], [160, 120], [80, 120]] }}

[steps.door]
kind = "line_counter"
tracks = "$steps.follow.tracks"
line = [[80, 0], [80, 120]]
name = "door"

[sinks.lines]
kind = "jsonl"
path = "out/lines.jsonl"
include = ["$steps.zones.counts", "$steps.door.counts"]

[sinks.ha]
kind = "mqtt"
url = "{}"
include = ["$steps.zones.counts", "$steps.door.counts", "$steps.motion.detections"]
discovery = true
"#,
        broker.url()
    );
    let file = write(dir.path(), "p.toml", &text);
    let running = spawn_run(&file, &[], dir.path());
    let lines_path = dir.path().join("out/lines.jsonl");
    wait_for_lines(&lines_path, 30, HANG);

    // What Home Assistant reads when it subscribes: the retained configs and availability.
    // Two zones, "car park" and "car_park", whose names write as one id: each its own
    // sensor, on its own retained topic (one topic would keep the second config only).
    let configs = Subscriber::start(broker.port, "homeassistant/#");
    configs.wait_for(6, HANG);
    let received = configs.received();
    drop(configs);
    let topics: BTreeSet<&str> = received.iter().map(|r| r.topic.as_str()).collect();
    assert_eq!(topics.len(), 6, "{topics:?}");
    let found: Vec<serde_json::Value> = received
        .iter()
        .map(|r| {
            assert!(
                r.topic.starts_with("homeassistant/sensor/vidflow_"),
                "{}",
                r.topic
            );
            assert!(r.topic.ends_with("/config"), "{}", r.topic);
            r.payload.clone()
        })
        .collect();
    // One sensor per count: the zones "all", "corner", "car park" and "car_park", the line's
    // "in" and "out"; none for the detections (not counts).
    let mut templates: Vec<String> = found
        .iter()
        .map(|c| c["value_template"].as_str().unwrap().to_owned())
        .collect();
    templates.sort();
    assert_eq!(
        templates,
        [
            r#"{{ value_json["steps.door.counts"]["in"] }}"#,
            r#"{{ value_json["steps.door.counts"]["out"] }}"#,
            r#"{{ value_json["steps.zones.counts"]["all"] }}"#,
            r#"{{ value_json["steps.zones.counts"]["car park"] }}"#,
            r#"{{ value_json["steps.zones.counts"]["car_park"] }}"#,
            r#"{{ value_json["steps.zones.counts"]["corner"] }}"#,
        ]
    );
    let unique: BTreeSet<&str> = found
        .iter()
        .map(|c| c["unique_id"].as_str().unwrap())
        .collect();
    assert_eq!(unique.len(), 6, "{found:?}");
    let availability = found[0]["availability_topic"].as_str().unwrap().to_owned();
    for c in &found {
        assert_eq!(c["state_topic"], "vidflow/cam/ha", "{c}");
        assert_eq!(c["availability_topic"], availability.as_str(), "{c}");
        assert_eq!(c["payload_available"], "online");
        assert_eq!(c["payload_not_available"], "offline");
    }
    // The state topic carries the counts the templates read, as the jsonl line has them.
    let last = jsonl(&lines_path).pop().unwrap();
    assert!(last["steps.zones.counts"]["all"].is_u64(), "{last}");

    let status = |want: &str| {
        let sub = Subscriber::start(broker.port, &availability);
        let start = std::time::Instant::now();
        loop {
            let got = sub.received();
            if got.last().is_some_and(|r| r.raw == want.as_bytes()) {
                return;
            }
            assert!(start.elapsed() < HANG, "availability never {want}: {got:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    status("online");
    // Killed, it says nothing: the broker publishes its last will.
    running.signal("KILL");
    drop(running.finish(HANG));
    status("offline");
}
