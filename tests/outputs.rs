//! Outputs never lose data, through the real binary with real signals, real files and real
//! encoders: SIGTERM at random moments (every decoded frame is in the JSONL and in the video
//! segments), SIGKILL (every segment decodes, every line parses, a second run appends and leaves
//! the first run's files alone), and a sink that fails mid-run (a full disk: a real small
//! tmpfs; a write error: the segments' folder replaced by a file mid-run, so the next segment
//! cannot be created) while the other sinks go on, `written` counting only the frames of the
//! segments the sink finished.
//!
//! Random moments come from a seed printed at the start of each test (`OUTPUTS_SEED=...`
//! replays it). Frames are counted by decoding each segment with GStreamer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{Running, file_decoder, jsonl, make_h264_mp4, read_json, segments, spawn, write};
use gstreamer as gst;
use gstreamer::prelude::*;

/// Only turns a hang into a failure; a run that hits its own stop deadline exits 70 instead.
const DEADLINE: Duration = Duration::from_secs(90);

/// Decodes `path` with GStreamer: the frames it gave, and the error if it ended on one rather
/// than at its end. Unlike `common::count_video_frames`, a file that cannot start (a segment
/// killed before its first fragment) returns instead of waiting for samples forever.
fn decode(path: &Path) -> (u64, Option<String>) {
    let (pipeline, sink) = file_decoder(path, "");
    let frames = Arc::new(AtomicU64::new(0));
    let counter = frames.clone();
    sink.set_callbacks(
        gstreamer_app::AppSinkCallbacks::builder()
            .new_sample(move |s| {
                let _ = s.pull_sample();
                counter.fetch_add(1, Ordering::Relaxed);
                Ok(gst::FlowSuccess::Ok)
            })
            .build(),
    );
    let _ = pipeline.set_state(gst::State::Playing);
    let msg = pipeline.bus().unwrap().timed_pop_filtered(
        gst::ClockTime::from_seconds(60),
        &[gst::MessageType::Eos, gst::MessageType::Error],
    );
    pipeline.set_state(gst::State::Null).unwrap();
    let error = match msg.as_ref().map(|m| m.view()) {
        Some(gst::MessageView::Eos(_)) => None,
        Some(gst::MessageView::Error(e)) => Some(e.error().to_string()),
        _ => Some("no end of stream within 60 s".to_owned()),
    };
    (frames.load(Ordering::Relaxed), error)
}

/// Frames in a file that must play to its end.
fn count_video_frames(path: &Path) -> u64 {
    match decode(path) {
        (n, None) => n,
        (_, Some(e)) => panic!("{} does not play: {e}", path.display()),
    }
}

/// Frames in every segment of `first`, each of which must play to its end.
fn count_segment_frames(first: &Path) -> u64 {
    segments(first).iter().map(|p| count_video_frames(p)).sum()
}

/// One real-time encoder at a time: the trials must not starve each other.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// xorshift64, seeded from the clock; the seed is printed so a failure can be replayed.
struct Random(u64);

impl Random {
    fn new(test: &str) -> Self {
        let seed = std::env::var("OUTPUTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok());
        let seed = seed.unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            (nanos as u64) | 1
        });
        println!("{test}: seed {seed} (OUTPUTS_SEED={seed} replays it)");
        Self(seed)
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(lo + self.0 % (hi - lo))
    }
}

/// A pipeline: `uri` through a blur (so frames are in flight), into `events` (jsonl) and
/// `video` (segments of one second).
fn pipeline(dir: &Path, uri: &str, video: &str, extra_sinks: &str) -> PathBuf {
    write(
        dir,
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "{uri}"
# Two seconds of a live source: a loaded machine must not make it drop from its queue, which
# these tests would take for a loss (a file source waits instead, and ignores this).
queue = 60

[executor]
workers = 2
max_in_flight = 2

[daemon]
stop_timeout_s = 30

[steps.soft]
kind = "blur"
image = "$frame"
kernel = 5

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = ["$steps.soft.image"]

[sinks.video]
kind = "video_file"
path = "{video}"
image = "$steps.soft.image"
segment_seconds = 1
preset = "ultrafast"
{extra_sinks}
"#
        ),
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

/// Waits until the process catches SIGTERM (its handler is installed).
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

#[test]
fn sigterm_at_random_moments_loses_no_frame_in_jsonl_or_segments() {
    let _serial = serial();
    let mut random = Random::new("sigterm");
    let clip_dir = tempfile::tempdir().unwrap();
    let clip = clip_dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 150, 320, 240);
    for trial in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let (uri, video) = if trial % 2 == 0 {
            (
                "test://ball?width=320&height=240&fps=30&live=true".to_owned(),
                "out/{source}.mkv",
            )
        } else {
            (clip.to_string_lossy().into_owned(), "out/{source}.mp4")
        };
        let p = pipeline(dir.path(), &uri, video, "");
        let run = start(dir.path(), &p);
        let after = random.ms(300, 3500);
        std::thread::sleep(after);
        let state = format!("trial {trial} ({uri}), SIGTERM after {after:?}");
        run.signal("TERM");
        let out = run.finish(DEADLINE);
        assert_eq!(out.status.code(), Some(0), "{state}: {}", out.stderr);
        let stats = read_json(&dir.path().join("stats.json"));
        let decoded = stats["frames_decoded"].as_u64().unwrap();
        let processed = stats["frames_processed"].as_u64().unwrap();
        assert_eq!(decoded, processed, "{state}: {stats}");
        let lines = jsonl(&dir.path().join("out/events.jsonl"));
        assert_eq!(lines.len() as u64, processed, "{state}");
        let first = dir.path().join(video.replace("{source}", "cam"));
        let in_video = count_segment_frames(&first);
        assert_eq!(in_video, processed, "{state}: {:?}", segments(&first));
        println!(
            "{state}: {processed} frames in {} segment(s)",
            segments(&first).len()
        );
    }
}

/// The files of a folder, with their contents.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

/// Frames a SIGKILL may cost the video against the JSONL: at 30 fps, 4 s (the x264 queue, the
/// one-second GOP splitmuxsink holds to decide its cut, and the fragment being written).
const MAX_LOST_AT_KILL: u64 = 120;

#[test]
fn after_sigkill_every_segment_plays_every_line_parses_and_a_second_run_appends() {
    let _serial = serial();
    let mut random = Random::new("sigkill");
    for (trial, video) in ["out/{source}.mp4", "out/{source}.mkv"].iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let uri = "test://ball?width=320&height=240&fps=30&live=true";
        let p = pipeline(dir.path(), uri, video, "");
        // Segments of 8 s with a keyframe every second, killed 14 to 15 s in (recording starts
        // within a second): the second segment is then 5 to 7 s old, with whole fragments (or
        // clusters) to play.
        let text = std::fs::read_to_string(&p).unwrap().replace(
            "segment_seconds = 1",
            "segment_seconds = 8\nkeyframe_seconds = 1",
        );
        std::fs::write(&p, text).unwrap();
        let run = start(dir.path(), &p);
        let after = random.ms(14000, 15000);
        std::thread::sleep(after);
        let state = format!("trial {trial} ({video}), SIGKILL after {after:?}");
        run.signal("KILL");
        let out = run.finish(DEADLINE);
        assert!(!out.status.success(), "{state}");

        // Every segment decodes, the one being written up to its last fragment.
        let first = dir.path().join(video.replace("{source}", "cam"));
        let written = segments(&first);
        assert!(written.len() >= 2, "{state}: {written:?}");
        let decoded: Vec<(u64, Option<String>)> = written.iter().map(|s| decode(s)).collect();
        println!("{state}: frames per segment {decoded:?}");
        let (last, closed) = decoded.split_last().unwrap();
        assert!(
            closed.iter().all(|(n, e)| *n > 0 && e.is_none()),
            "{state}: {decoded:?}"
        );
        // The segment being written plays up to its last fragment (a fragment cut short by
        // the kill may end it with an error): the video lacks at most what the encoder, the
        // GOP being cut and the fragment being written held (a few seconds), not the segment.
        assert!(last.0 > 0, "{state}: {decoded:?}");
        // Every line parses (`jsonl` panics otherwise), numbered from 0 without a gap.
        let events = dir.path().join("out/events.jsonl");
        let lines = jsonl(&events);
        let in_video: u64 = decoded.iter().map(|(n, _)| n).sum();
        let lost = (lines.len() as u64).saturating_sub(in_video);
        assert!(
            lost <= MAX_LOST_AT_KILL,
            "{state}: {} lines, {in_video} frames in video {decoded:?}",
            lines.len()
        );
        assert!(!lines.is_empty(), "{state}");
        // In order. (A live source may drop from its full queue on a loaded machine: its
        // frame numbers then have gaps, counted as dropped.)
        assert!(
            lines
                .windows(2)
                .all(|w| w[0]["frame"].as_u64() < w[1]["frame"].as_u64()),
            "{state}"
        );

        // A crash in the middle of a line, as a SIGKILL during a write leaves it.
        let before = snapshot(&dir.path().join("out"));
        let whole = std::fs::read_to_string(&events).unwrap();
        std::fs::write(&events, format!("{whole}{{\"source\":\"cam\",\"fra")).unwrap();

        let run = start(dir.path(), &p);
        common::wait_for_lines(&events, lines.len() + 30, DEADLINE);
        run.signal("TERM");
        let out = run.finish(DEADLINE);
        assert_eq!(out.status.code(), Some(0), "{state}: {}", out.stderr);
        assert!(out.stderr.contains("partial line"), "{}", out.stderr);
        let text = std::fs::read_to_string(&events).unwrap();
        assert!(
            text.starts_with(&whole),
            "{state}: the first run's lines changed"
        );
        let second = jsonl(&events).len() - lines.len();
        let stats = read_json(&dir.path().join("stats.json"));
        assert_eq!(second as u64, stats["frames_processed"].as_u64().unwrap());
        // The first run's segments are untouched; the second run's are new files.
        // (The retention index beside them only grew: the second run's files were added.)
        for (path, bytes) in &before {
            let now = std::fs::read(path).unwrap();
            if path.ends_with(vidflow::storage::index::INDEX) {
                assert!(now.starts_with(bytes), "{state}: the index was rewritten");
            } else if path != &events {
                assert_eq!(&now, bytes, "{}", path.display());
            }
        }
        let all = segments(&first);
        let new: u64 = all[written.len()..]
            .iter()
            .map(|s| count_video_frames(s))
            .sum();
        assert_eq!(new, second as u64, "{state}: {all:?}");
    }
}

/// A small tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Self(at.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Runs until the video sink has failed (`fail` is called once the run is started: to make it
/// fail), checks that the workflow and the JSONL sink go on, then stops: the exit is within the
/// deadline, non-zero, and the loss is counted. Returns the video sink's `written`.
fn failing_video_sink_is_alone(dir: &Path, p: &Path, fail: impl FnOnce(&Running)) -> u64 {
    let run = start(dir, p);
    fail(&run);
    run.wait_for_stderr("write failed", DEADLINE);
    let events = dir.join("out/events.jsonl");
    let at_failure = jsonl(&events).len();
    common::wait_for_lines(&events, at_failure + 60, DEADLINE);
    run.signal("TERM");
    let out = run.finish(DEADLINE);
    assert_eq!(out.status.code(), Some(70), "{}", out.stderr);
    assert!(out.stderr.contains("sink \"video\" lost"), "{}", out.stderr);
    let stats = read_json(&dir.join("stats.json"));
    let processed = stats["frames_processed"].as_u64().unwrap();
    // Nothing decoded disappears: a live source may drop from its full queue under load, and
    // says so.
    assert_eq!(
        stats["frames_decoded"].as_u64().unwrap(),
        processed + stats["frames_dropped"].as_u64().unwrap(),
        "{stats}"
    );
    assert_eq!(stats["frames_failed"], 0, "{stats}");
    assert_eq!(stats["sinks"]["events"]["written"], processed, "{stats}");
    assert_eq!(jsonl(&events).len() as u64, processed);
    let video = &stats["sinks"]["video"];
    assert!(video["dropped"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(
        video["written"].as_u64().unwrap() + video["dropped"].as_u64().unwrap(),
        processed,
        "{stats}"
    );
    video["written"].as_u64().unwrap()
}

#[test]
fn a_full_disk_fails_the_video_sink_alone() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let Some(_full) = Tmpfs::mount(&dir.path().join("full"), "512k") else {
        panic!("cannot mount a tmpfs (this test needs root, as CI has)");
    };
    let p = pipeline(
        dir.path(),
        "test://snow?width=320&height=240&fps=30&live=true",
        "full/{source}.mkv",
        "",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace(
        "preset = \"ultrafast\"",
        "preset = \"ultrafast\"\nbitrate_kbps = 20000",
    );
    std::fs::write(&p, text).unwrap();
    let written = failing_video_sink_is_alone(dir.path(), &p, |_| {});
    // The segment the disk filled plays up to its last cluster, but was not finished: what it
    // holds is not counted as written; the segments before it are.
    let segments = segments(&dir.path().join("full/cam.mkv"));
    let (cut, finished) = segments.split_last().expect("no segment at all");
    let in_finished: u64 = finished.iter().map(|p| count_video_frames(p)).sum();
    assert_eq!(written, in_finished, "{segments:?}");
    println!(
        "{written} frame(s) written, {} in the cut segment",
        decode(cut).0
    );
}

#[test]
fn a_write_error_fails_the_video_sink_alone_and_written_counts_finished_segments() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(
        dir.path(),
        "test://ball?width=320&height=240&fps=30&live=true",
        "rec/{source}.mkv",
        "",
    );
    // Once the third segment has started, its folder is moved away (the segment being written
    // goes on there and is finished) and a file takes its name: the fourth cannot be created.
    let (rec, moved) = (dir.path().join("rec"), dir.path().join("rec.old"));
    let replace_folder = |run: &Running| {
        run.wait_for_stderr_times("new video segment", 3, DEADLINE);
        std::fs::rename(&rec, &moved).unwrap();
        std::fs::write(&rec, "not a folder").unwrap();
    };
    let written = failing_video_sink_is_alone(dir.path(), &p, replace_folder);
    let segments = segments(&moved.join("cam.mkv"));
    assert_eq!(segments.len(), 3, "{segments:?}");
    let in_files: u64 = segments.iter().map(|p| count_video_frames(p)).sum();
    assert_eq!(written, in_files, "{segments:?}");
}
