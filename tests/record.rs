//! The `record` sink against a real RTSP server replaying pre-encoded files (a camera's main
//! and sub-stream, of different sizes): the segments hold the main stream's packets unchanged
//! (decoded, they equal the server's file frame for frame, by a checksum per frame, with
//! nothing missing at the cuts), what was written before a SIGKILL plays, and a main stream
//! lost and back never stops detection on the sub-stream while recording resumes in a new
//! segment; `/healthz` says when a recording writes nothing (its stream gone) or fails (its
//! folder gone), and is healthy again once it writes; H.265 is recorded as sent too, from a
//! file and over RTSP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;
use crate::common::rtsp;
use crate::common::rtsp_files;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{frame_hashes, jsonl, run_to_eos, segments, spawn_run, write};
use rtsp_files::FileServer;

/// Encodes `frames` frames of a moving test pattern at 30 fps as H.264 in MP4, with a keyframe
/// every 15 frames: a camera's stream, cut into segments at its own keyframes.
fn encode(path: &Path, frames: u32, width: u32, height: u32) {
    encode_every(path, frames, width, height, 15);
}

/// [`encode`] with a keyframe every `key_int` frames.
fn encode_every(path: &Path, frames: u32, width: u32, height: u32, key_int: u32) {
    run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers={frames} ! \
         video/x-raw,format=I420,width={width},height={height},framerate=30/1 ! \
         x264enc speed-preset=ultrafast key-int-max={key_int} ! h264parse ! mp4mux ! \
         filesink location={}",
        path.display()
    ));
}

/// A camera's pipeline: detection (`motion`) on `uri`, its frames' results in
/// `out/lines.jsonl`, and `uri`'s or `record_uri`'s packets recorded into `out/cam*.mp4`.
fn pipeline(uri: &str, record_uri: Option<&str>, segment_seconds: u32) -> String {
    pipeline_with(uri, record_uri, segment_seconds, "")
}

/// [`pipeline`] with `extra` tables added.
fn pipeline_with(uri: &str, record_uri: Option<&str>, segment_seconds: u32, extra: &str) -> String {
    let record_uri = record_uri
        .map(|r| format!("record_uri = \"{r}\"\n"))
        .unwrap_or_default();
    format!(
        r#"
[sources.cam]
uri = "{uri}"
{record_uri}transport = "tcp"
stall_timeout_ms = 2000
reconnect = {{ initial_delay_ms = 100, max_delay_ms = 500 }}

[steps.motion]
kind = "motion"
image = "$frame"

[sinks.lines]
kind = "jsonl"
path = "out/lines.jsonl"
include = ["$steps.motion.detections"]

[sinks.rec]
kind = "record"
path = "out/{{source}}.mp4"
segment_seconds = {segment_seconds}
{extra}
"#
    )
}

/// Asserts that `got` is `reference` played from its start, again and again (each pass a new
/// connection of the record stream, which the server serves from the file's first frame).
fn assert_passes_of(got: &[[u8; 32]], reference: &[[u8; 32]], what: &str) {
    for (i, h) in got.iter().enumerate() {
        assert!(
            *h == reference[i % reference.len()],
            "{what}: frame {i} is not frame {} of the server's file",
            i % reference.len()
        );
    }
}

fn files(dir: &Path) -> (PathBuf, PathBuf) {
    files_of(dir, 60)
}

/// [`files`] of `frames` frames each.
fn files_of(dir: &Path, frames: u32) -> (PathBuf, PathBuf) {
    let (main, sub) = (dir.join("main.mp4"), dir.join("sub.mp4"));
    encode(&main, frames, 320, 240);
    encode(&sub, frames, 160, 120);
    (main, sub)
}

/// A camera whose main stream (the first server, at `/main`) can go away while its
/// sub-stream (the second, at `/sub`) goes on, `frames` frames each; and the main's file.
fn camera_on_two_servers(dir: &Path, frames: u32) -> (PathBuf, FileServer, FileServer) {
    let (main, sub) = files_of(dir, frames);
    let main_server = FileServer::start(&[("/main", main.clone())]).unwrap();
    let sub_server = FileServer::start(&[("/sub", sub)]).unwrap();
    (main, main_server, sub_server)
}

#[test]
fn segments_hold_the_main_streams_frames_unchanged_across_every_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (main, sub) = files(dir.path());
    let server = FileServer::start(&[("/main", main.clone()), ("/sub", sub)]).unwrap();
    let text = pipeline(&server.url("/sub"), Some(&server.url("/main")), 1);
    let file = write(dir.path(), "p.toml", &text);
    let running = spawn_run(&file, &[], dir.path());
    // The server's file ends after 2 s; the record stream reconnects and gets it again.
    running.wait_for_stderr("record stream is back", Duration::from_secs(40));
    std::thread::sleep(Duration::from_millis(800));
    running.signal("TERM");
    let out = running.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);

    let reference = frame_hashes(&main);
    assert_eq!(reference.len(), 60);
    let parts = segments(&dir.path().join("out/cam.mp4"));
    // Two segments of the first pass (cut at 1 s, at a keyframe), then the second pass's.
    assert!(parts.len() >= 3, "{parts:?}\n{}", out.stderr);
    let got: Vec<[u8; 32]> = parts.iter().flat_map(|p| frame_hashes(p)).collect();
    assert!(
        got.len() > 60,
        "{} frames recorded\n{}",
        got.len(),
        out.stderr
    );
    assert_passes_of(&got, &reference, "segments");
    // The sub-stream was decoded at its own size, not the main stream's.
    let lines = jsonl(&dir.path().join("out/lines.jsonl"));
    // (A live source drops its oldest frame when the workflow falls behind: a loaded machine.)
    assert!(lines.len() >= 10, "{} frames decoded", lines.len());
    let first = &lines[0]["steps.motion.detections"][0]["box"];
    assert_eq!(first["width"], 160.0, "{first}");
}

#[test]
fn what_was_recorded_before_a_sigkill_plays() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("main.mp4");
    encode(&main, 300, 320, 240);
    let server = FileServer::start(&[("/main", main.clone())]).unwrap();
    let text = pipeline(&server.url("/main"), None, 60);
    let file = write(dir.path(), "p.toml", &text);
    let running = spawn_run(&file, &[], dir.path());
    running.wait_for_stderr("new video segment", Duration::from_secs(30));
    // Mid-segment: about 3 s of a 60 s segment, several MP4 fragments written.
    std::thread::sleep(Duration::from_secs(3));
    running.signal("KILL");
    let out = running.finish(Duration::from_secs(10));
    assert!(!out.status.success());

    let got = frame_hashes(&dir.path().join("out/cam.mp4"));
    assert!(got.len() >= 30, "{} frames play after the kill", got.len());
    assert_passes_of(&got, &frame_hashes(&main), "killed segment");
}

#[test]
fn a_main_stream_lost_and_back_never_stops_detection_and_records_in_a_new_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (main, mut main_server, sub_server) = camera_on_two_servers(dir.path(), 450);
    let port = common::free_port();
    let http = format!("[http]\nlisten = \"127.0.0.1:{port}\"\n");
    let text = pipeline_with(
        &sub_server.url("/sub"),
        Some(&main_server.url("/main")),
        60,
        &http,
    );
    let file = write(dir.path(), "p.toml", &text);
    let running = spawn_run(&file, &["--stats-json", "stats.json"], dir.path());
    running.wait_for_stderr("new video segment", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    let lost_at = Instant::now();
    main_server.stop();
    running.wait_for_stderr("source lost; reconnecting", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(1500));
    main_server.restart().unwrap();
    running.wait_for_stderr("record stream is back", Duration::from_secs(20));
    let back_at = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    // Each stream's own state: only the record stream reconnected.
    let samples = http_client::scrape(port).unwrap();
    let metric = |name: &str, labels: &[(&str, &str)]| {
        http_client::value(&samples, name, labels).unwrap_or_else(|| panic!("no {name}"))
    };
    let cam = [("source", "cam")];
    assert_eq!(metric("vidflow_record_stream_reconnects_total", &cam), 1.0);
    assert_eq!(metric("vidflow_source_reconnects_total", &cam), 0.0);
    let streaming = [("source", "cam"), ("state", "streaming")];
    assert_eq!(metric("vidflow_record_stream_state", &streaming), 1.0);
    let rec = [("sink", "rec"), ("source", "cam")];
    assert_eq!(metric("vidflow_record_segments_total", &rec), 2.0);
    assert_eq!(metric("vidflow_record_gaps_total", &rec), 1.0);
    assert!(metric("vidflow_record_bytes_total", &rec) > 10_000.0);
    // A keyframe every 15 frames at 30 fps, in RTP's 90 kHz clock.
    let interval = metric("vidflow_record_keyframe_interval_ms", &rec);
    assert!((490.0..=510.0).contains(&interval), "{interval}");
    running.signal("TERM");
    let out = running.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);

    // The run's stats: each stream's own counts, the record stream's apart from the frames'.
    let stats = common::read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["sources"]["cam"]["reconnects"], 0, "{stats}");
    assert_eq!(stats["record_streams"]["cam"]["reconnects"], 1, "{stats}");
    // What the sink wrote, as /metrics said it.
    let recorded = &stats["recordings"]["rec"]["cam"];
    assert_eq!(recorded["segments"], 2, "{stats}");
    assert_eq!(recorded["gaps"], 1, "{stats}");
    assert_eq!(recorded["ring_dropped"], 0, "{stats}");
    assert!(recorded["bytes"].as_u64().unwrap() > 10_000, "{stats}");
    assert!(
        stats["record_streams"]["cam"]["attempts"].as_u64().unwrap() >= 2,
        "{stats}"
    );
    // Only the record stream was lost.
    let losses: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("source lost") || l.contains("cannot connect"))
        .collect();
    assert!(!losses.is_empty());
    assert!(
        losses.iter().all(|l| l.contains("source=cam/record")),
        "{losses:#?}"
    );
    // Detection went on through the outage: no second without a decoded frame.
    let times: Vec<humantime::Timestamp> = jsonl(&dir.path().join("out/lines.jsonl"))
        .iter()
        .map(|l| l["time"].as_str().unwrap().parse().unwrap())
        .collect();
    let outage = back_at.duration_since(lost_at);
    assert!(
        times.len() as f64 >= 25.0 * (outage.as_secs_f64() + 4.0),
        "{}",
        times.len()
    );
    for pair in times.windows(2) {
        let (a, b): (std::time::SystemTime, std::time::SystemTime) =
            (pair[0].into(), pair[1].into());
        let gap = b.duration_since(a).unwrap_or_default();
        assert!(gap < Duration::from_secs(1), "no frame decoded for {gap:?}");
    }
    // The recording resumed in a new segment: the server's file from its start again.
    let parts = segments(&dir.path().join("out/cam.mp4"));
    assert_eq!(parts.len(), 2, "{parts:?}");
    let reference = frame_hashes(&main);
    let before = frame_hashes(&parts[0]);
    let after = frame_hashes(&parts[1]);
    assert!(
        before.len() >= 45 && after.len() >= 30,
        "{} {}",
        before.len(),
        after.len()
    );
    assert_passes_of(&before, &reference, "before the loss");
    assert_passes_of(&after, &reference, "after the loss");
}

/// `/healthz` of a run recording `main` (1 s segments) while detecting on `sub`, until it
/// answers `status`; its body.
fn healthz_until(port: u16, status: u16, what: &str) -> String {
    http_client::wait_until(what, Duration::from_secs(30), || {
        http_client::get(port, "/healthz").filter(|(s, _)| *s == status)
    })
    .1
}

#[test]
fn a_recording_that_writes_nothing_or_fails_is_unhealthy_with_its_reason_until_it_writes_again() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut main_server, sub_server) = camera_on_two_servers(dir.path(), 900);
    let port = common::free_port();
    let http = format!("[http]\nlisten = \"127.0.0.1:{port}\"\n");
    let text = pipeline_with(
        &sub_server.url("/sub"),
        Some(&main_server.url("/main")),
        1,
        &http,
    );
    let file = write(dir.path(), "p.toml", &text);
    let running = spawn_run(&file, &[], dir.path());
    running.wait_for_stderr("new video segment", Duration::from_secs(30));
    assert_eq!(healthz_until(port, 200, "healthy while recording"), "ok\n");

    // The main stream goes away; the sub-stream, and detection on it, go on.
    main_server.stop();
    let reason = healthz_until(port, 503, "unhealthy without the record stream");
    assert!(
        reason.contains("sink \"rec\": nothing recorded of source \"cam\" for"),
        "{reason}"
    );
    assert!(!reason.contains("no frame for"), "{reason}");
    main_server.restart().unwrap();
    assert_eq!(
        healthz_until(port, 200, "healthy once it records again"),
        "ok\n"
    );

    // The segments' folder replaced by a file: the next segment cannot be written (as root
    // too, where a read-only folder would still be written).
    let out = dir.path().join("out");
    std::fs::rename(&out, dir.path().join("out.moved")).unwrap();
    std::fs::write(&out, b"not a folder").unwrap();
    let reason = healthz_until(port, 503, "unhealthy when its writes fail");
    assert!(
        reason.contains("sink \"rec\": source \"cam\": its last write failed"),
        "{reason}"
    );
    std::fs::remove_file(&out).unwrap();
    std::fs::create_dir(&out).unwrap();
    assert_eq!(
        healthz_until(port, 200, "healthy once it writes again"),
        "ok\n"
    );
    // It wrote again, into a new segment.
    let written: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert!(!written.is_empty());

    running.signal("TERM");
    let out = running.finish(Duration::from_secs(30));
    // The run still says, at its end, that a write failed.
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("sink \"rec\": ") && out.stderr.contains("Not a directory"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_record_sink_changed_by_a_reload_hands_over_without_overlap_and_its_counts_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("main.mp4");
    // A keyframe every frame: a new writer may start at any packet (the widest overlap).
    encode_every(&main, 900, 320, 240, 1);
    let reference = frame_hashes(&main);
    let distinct: std::collections::HashSet<_> = reference.iter().collect();
    assert_eq!(
        distinct.len(),
        reference.len(),
        "each frame of the file is its own"
    );
    let server = FileServer::start(&[("/main", main)]).unwrap();
    let port = common::free_port();
    let http = format!("[http]\nlisten = \"127.0.0.1:{port}\"\n");
    let text = pipeline_with(&server.url("/main"), None, 60, &http);
    let file = write(dir.path(), "p.toml", &text);
    let running = spawn_run(&file, &[], dir.path());
    running.wait_for_stderr("new video segment", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    let rec = [("sink", "rec"), ("source", "cam")];
    let segments_total = || {
        let samples = http_client::scrape(port).unwrap();
        http_client::value(&samples, "vidflow_record_segments_total", &rec).unwrap()
    };
    assert_eq!(segments_total(), 1.0);

    // The record sink changed (its segments' length): a new one replaces it.
    write(
        dir.path(),
        "p.toml",
        &text.replace("segment_seconds = 60", "segment_seconds = 50"),
    );
    running.signal("HUP");
    running.wait_for_stderr("reload applied", Duration::from_secs(30));
    running.wait_for_stderr_times("new video segment", 2, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        segments_total(),
        2.0,
        "the new sink's segment counted after the old one's"
    );
    running.signal("TERM");
    let out = running.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);

    // The old sink's segment, then the new one's: the file from its start, without a frame
    // written twice.
    let parts = segments(&dir.path().join("out/cam.mp4"));
    assert_eq!(parts.len(), 2, "{parts:?}");
    let (old, new) = (frame_hashes(&parts[0]), frame_hashes(&parts[1]));
    assert!(
        old.len() >= 30 && new.len() >= 30,
        "{} {}",
        old.len(),
        new.len()
    );
    assert_eq!(old[..], reference[..old.len()], "the old segment");
    let at = reference.iter().position(|h| *h == new[0]).unwrap();
    assert_eq!(new[..], reference[at..at + new.len()], "the new segment");
    assert!(
        at >= old.len(),
        "the new segment starts at frame {at}, which the old one (frames 0 to {}) holds",
        old.len() - 1
    );
}

/// H.265 with B-frames (reordered), in closed GOPs as cameras send: an open GOP's leading
/// pictures after a cut refer to the segment before, and do not decode in a segment alone.
#[test]
fn an_h265_file_is_recorded_as_it_is_into_matroska_segments() {
    common::require_x265enc();
    let dir = tempfile::tempdir().unwrap();
    let (main, sub) = (dir.path().join("main.mp4"), dir.path().join("sub.mp4"));
    run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers=60 ! \
         video/x-raw,format=I420,width=320,height=240,framerate=30/1 ! \
         x265enc speed-preset=ultrafast key-int-max=15 option-string=open-gop=0:bframes=2 ! \
         h265parse ! mp4mux ! \
         filesink location={}",
        main.display()
    ));
    encode(&sub, 60, 160, 120);
    let text = pipeline(&sub.to_string_lossy(), Some(&main.to_string_lossy()), 1)
        .replace("transport = \"tcp\"\n", "")
        .replace("out/{source}.mp4", "out/{source}.mkv");
    let file = write(dir.path(), "p.toml", &text);
    let out = spawn_run(&file, &[], dir.path()).finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    // The file is read to its end before the run ends: every frame, cut at its keyframes.
    let parts = segments(&dir.path().join("out/cam.mkv"));
    assert!(parts.len() >= 2, "{parts:?}");
    let got: Vec<[u8; 32]> = parts.iter().flat_map(|p| frame_hashes(p)).collect();
    assert_eq!(got, frame_hashes(&main));
}

/// H.265 from a camera over RTSP (`rtph265pay`), without B-frames as cameras send it live:
/// recorded as sent, frame for frame.
#[test]
fn an_h265_camera_over_rtsp_is_recorded_as_it_sent() {
    common::require_x265enc();
    let dir = tempfile::tempdir().unwrap();
    let (main, sub) = (dir.path().join("main.mp4"), dir.path().join("sub.mp4"));
    run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers=90 ! \
         video/x-raw,format=I420,width=320,height=240,framerate=30/1 ! \
         x265enc speed-preset=ultrafast key-int-max=15 option-string=bframes=0 ! \
         h265parse ! mp4mux ! filesink location={}",
        main.display()
    ));
    encode(&sub, 90, 160, 120);
    let server = FileServer::start(&[("/main", main.clone()), ("/sub", sub)]).unwrap();
    let text = pipeline(&server.url("/sub"), Some(&server.url("/main")), 1);
    let file = write(dir.path(), "p.toml", &text);
    let running = spawn_run(&file, &[], dir.path());
    running.wait_for_stderr("new video segment", Duration::from_secs(30));
    // The file lasts 3 s: more than one segment of it.
    std::thread::sleep(Duration::from_millis(2500));
    running.signal("TERM");
    let out = running.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);

    let parts = segments(&dir.path().join("out/cam.mp4"));
    assert!(parts.len() >= 2, "{parts:?}\n{}", out.stderr);
    let got: Vec<[u8; 32]> = parts.iter().flat_map(|p| frame_hashes(p)).collect();
    assert!(
        got.len() >= 45,
        "{} frames recorded\n{}",
        got.len(),
        out.stderr
    );
    assert_passes_of(&got, &frame_hashes(&main), "H.265 segments");
}

/// A camera whose payloader sends its parameter sets in packets of their own (the test
/// server's `rtph264pay config-interval=-1`, x264 live, a keyframe a second): each keyframe
/// reaches vidflow as two buffers, the picture's without a timestamp. Every second of it is
/// recorded, the run ends well, and the file holds one frame per picture the camera sent.
#[test]
fn a_camera_that_sends_its_parameter_sets_apart_is_recorded_past_its_second_keyframe() {
    let dir = tempfile::tempdir().unwrap();
    let server = rtsp::RtspServer::start(rtsp::RtspServerOptions::default()).unwrap();
    let text = pipeline(&server.url(), None, 60);
    let file = write(dir.path(), "p.toml", &text);
    let running = spawn_run(&file, &[], dir.path());
    // 15 fps: 45 frames are three keyframes.
    common::wait_for_lines(
        &dir.path().join("out/lines.jsonl"),
        45,
        Duration::from_secs(60),
    );
    running.signal("TERM");
    let out = running.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(!out.stderr.contains("segment failed"), "{}", out.stderr);
    let frames: usize = segments(&dir.path().join("out/cam.mp4"))
        .iter()
        .map(|p| frame_hashes(p).len())
        .sum();
    // The record stream connects apart from the decoded one: allow it a second's start.
    assert!(frames >= 30, "{frames} frames recorded\n{}", out.stderr);
}
