//! A source whose frames change size or frame rate mid-run, through the real `vidflow` binary:
//! a real RTSP camera (`tests/common/rtsp.rs`) restarted at another size and back, and a file
//! whose caps change mid-stream (MPEG-TS pieces of different sizes and rates, concatenated).
//! Every decoded frame is in some `video_file` segment, each segment plays at one size, the
//! `clip`, `snapshot` and `preview` sinks go on at the new size, the stateful steps are told (the tracker
//! ends its tracks with `ended` events, motion restarts, zones warn), and the change is counted
//! per source in the stats and `/metrics`.
//!
//! The RTSP test takes its turn with nothing else of this file: it runs an encoder, a server and
//! vidflow in real time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;
use crate::common::rtsp;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::free_port;
use common::*;
use http_client::{open, read_part, scrape, value};
use opencv::core::MatTraitConst;
use rtsp::{RtspServer, RtspServerOptions};

/// Bound for anything that should take seconds; it only turns a hang into a failure.
const DEADLINE: Duration = Duration::from_secs(120);

/// Each segment of `first` (`segments`): its frames and its one size (fails on a segment with
/// frames of two sizes).
fn segment_sizes(first: &Path) -> Vec<(u64, (i32, i32))> {
    segments(first)
        .iter()
        .map(|p| {
            let (n, sizes) = frames_and_sizes(p);
            assert_eq!(
                sizes.len(),
                1,
                "{} has frames of sizes {sizes:?}",
                p.display()
            );
            (n, sizes[0])
        })
        .collect()
}

/// (frame, track ID) of every `ended` event of the tracker `track`, and whether that frame was
/// the first after a reconnection.
fn ended(lines: &[serde_json::Value]) -> Vec<(u64, u64, bool)> {
    lines
        .iter()
        .flat_map(|l| {
            let frame = l["frame"].as_u64().unwrap();
            let back = l.get("reconnected").is_some();
            l["steps.track.events"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |e| {
                    assert_eq!(e["event"], "ended", "{e}");
                    assert_eq!(e["place"], "resize", "{e}");
                    (frame, e["track_id"].as_u64().unwrap(), back)
                })
        })
        .collect()
}

/// The steps every test here runs: motion on the frame, a tracker of what moves, a zone over
/// the top-left 320x240.
const STEPS: &str = r#"
[steps.motion]
kind = "motion"
image = "$frame"
min_area = 50.0

[steps.track]
kind = "tracker"
detections = "$steps.motion.detections"
min_hits = 2

[steps.zones]
kind = "zone_count"
tracks = "$steps.track.tracks"

[steps.zones.zones]
corner = [[0, 0], [320, 0], [320, 240], [0, 240]]

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.track.tracks", "$steps.track.events"]
"#;

fn options(width: u32, height: u32) -> RtspServerOptions {
    RtspServerOptions {
        width,
        height,
        ..RtspServerOptions::default()
    }
}

/// Waits until `events.jsonl` holds `n` lines after the `k`-th reconnection (0: from the start).
fn wait_for_frames_after(events: &Path, k: usize, n: usize) {
    let what = format!("{n} frames after reconnection {k}");
    common::poll(&what, DEADLINE, Duration::from_millis(50), || {
        let text = std::fs::read_to_string(events).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let back: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains("\"reconnected\""))
            .collect();
        let from = if k == 0 {
            Some(0)
        } else {
            back.get(k - 1).copied()
        };
        (back.len() == k && from.is_some_and(|at| lines.len() > at + n)).then_some(())
    });
}

/// The size of a JPEG of `/preview/cam` encoded while it is watched (its first part may be the
/// latest JPEG of an earlier watcher: the second is not).
fn preview_size(port: u16) -> (i32, i32) {
    let (status, _, mut reader) = open(port, "/preview/cam").unwrap();
    assert_eq!(status, 200);
    read_part(&mut reader);
    let jpeg = opencv::core::Vector::<u8>::from_slice(&read_part(&mut reader));
    let mat = opencv::imgcodecs::imdecode(&jpeg, opencv::imgcodecs::IMREAD_COLOR).unwrap();
    (mat.cols(), mat.rows())
}

#[test]
fn a_camera_back_at_another_size_is_recorded_in_new_segments_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = RtspServer::start(options(320, 240)).unwrap();
    let port = free_port();
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"{}\"\nstall_timeout_ms = 2000\n\n\
             [sources.cam.reconnect]\ninitial_delay_ms = 100\nmax_delay_ms = 500\n\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n{STEPS}\n\
             [sinks.video]\nkind = \"video_file\"\npath = \"video/cam.mkv\"\nimage = \"$frame\"\n\
             segment_seconds = 3600\n\n\
             [sinks.watch]\nkind = \"preview\"\nimage = \"$frame\"\n",
            server.url()
        ),
    );
    let events = dir.path().join("events.jsonl");
    let run = spawn(
        dir.path(),
        &["run", p.to_str().unwrap(), "--stats-json", "stats.json"],
        &[],
    );
    // 320x240, then 640x480, then 320x240 again: bigger, then smaller. At each size, a JPEG
    // of the live preview.
    wait_for_frames_after(&events, 0, 45);
    let mut previews = vec![preview_size(port)];
    for (k, (w, h)) in [(640, 480), (320, 240)].into_iter().enumerate() {
        server.stop();
        run.wait_for_stderr_times("source lost; reconnecting", k + 1, DEADLINE);
        server.restart_with(options(w, h)).unwrap();
        wait_for_frames_after(&events, k + 1, 45);
        previews.push(preview_size(port));
    }
    assert_eq!(previews, [(320, 240), (640, 480), (320, 240)]);
    let samples = scrape(port).unwrap();
    assert_eq!(
        value(
            &samples,
            "vidflow_source_size_changes_total",
            &[("source", "cam")]
        ),
        Some(2.0)
    );
    run.signal("TERM");
    let out = run.finish(DEADLINE);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);

    let stats = read_json(&dir.path().join("stats.json"));
    let cam = &stats["sources"]["cam"];
    assert_eq!(cam["size_changes"], 2, "{stats}");
    assert_eq!(cam["reconnects"], 2, "{stats}");
    // A live source on a busy machine may drop a frame from its full queue (counted): every
    // other decoded frame reaches the workflow, and every one of those is in a segment.
    let delivered = cam["decoded"].as_u64().unwrap() - cam["dropped"].as_u64().unwrap();
    assert_eq!(stats["frames_processed"], delivered, "{stats}");
    let video = &stats["sinks"]["video"];
    assert_eq!(video["written"], delivered, "{stats}");
    assert_eq!(video["skipped"], 0, "{stats}");

    let segs = segment_sizes(&dir.path().join("video/cam.mkv"));
    let sizes: Vec<(i32, i32)> = segs.iter().map(|s| s.1).collect();
    assert_eq!(sizes, [(320, 240), (640, 480), (320, 240)], "{segs:?}");
    assert_eq!(segs.iter().map(|s| s.0).sum::<u64>(), delivered, "{segs:?}");
    let lines = jsonl(&events);
    assert_eq!(lines.len() as u64, delivered);

    // The tracker ended its tracks at each change, on the first frame at the new size (the
    // first after the reconnection), and the IDs that followed are new.
    let ends = ended(&lines);
    assert!(!ends.is_empty(), "no track ended:\n{}", out.stderr);
    assert!(ends.iter().all(|&(_, _, back)| back), "{ends:?}");
    let ended_ids: BTreeSet<u64> = ends.iter().map(|e| e.1).collect();
    for l in &lines {
        let frame = l["frame"].as_u64().unwrap();
        for t in l["steps.track.tracks"].as_array().unwrap() {
            let id = t["track_id"].as_u64().unwrap();
            let after_end = ends.iter().any(|&(f, e, _)| e == id && frame >= f);
            assert!(
                !after_end,
                "track {id} reported on frame {frame} after it ended"
            );
        }
    }
    assert!(!ended_ids.is_empty());
    // Each stateful step said once per change what it means for it.
    for said in [
        "its background model restarts",
        "step \"track\": source \"cam\" went from",
        "its zones are in pixels",
    ] {
        assert_eq!(
            out.stderr.matches(said).count(),
            2,
            "{said}:\n{}",
            out.stderr
        );
    }
    assert!(
        out.stderr
            .contains("source \"cam\" changed from 320x240 at 15 fps to 640x480 at 15 fps"),
        "{}",
        out.stderr
    );
}

/// A 4:2:0 H.264 MPEG-TS piece of `frames` frames at `width` x `height` and `fps`, whose
/// timestamps start at `offset_s` (so pieces laid end to end continue each other's time).
fn ts_piece(path: &Path, frames: u32, (width, height, fps): (u32, u32, u32), offset_s: u64) {
    run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers={frames} timestamp-offset={} ! \
         video/x-raw,format=I420,width={width},height={height},framerate={fps}/1 ! \
         x264enc speed-preset=ultrafast key-int-max={fps} ! h264parse ! mpegtsmux ! \
         filesink location={}",
        offset_s * 1_000_000_000,
        path.display()
    ));
}

/// One file of `pieces` (frames, (width, height, fps)), each starting where the one before
/// ended in time: a stream whose caps change mid-stream.
fn concatenated(dir: &Path, pieces: &[(u32, (u32, u32, u32))]) -> PathBuf {
    let mut all = Vec::new();
    let mut offset_s = 0;
    for (i, &(frames, format)) in pieces.iter().enumerate() {
        let piece = dir.join(format!("piece{i}.ts"));
        ts_piece(&piece, frames, format, offset_s);
        offset_s += u64::from(frames / format.2) + 1;
        all.extend(std::fs::read(&piece).unwrap());
    }
    let path = dir.join("changing.ts");
    std::fs::write(&path, all).unwrap();
    path
}

#[test]
fn a_file_whose_caps_change_mid_stream_has_every_frame_in_a_segment_of_its_size() {
    let dir = tempfile::tempdir().unwrap();
    // Smaller to larger, then the frame rate alone, then larger to smaller.
    let pieces = [
        (45, (320, 240, 15)),
        (45, (640, 480, 15)),
        (60, (640, 480, 30)),
        (45, (320, 240, 15)),
    ];
    let clip = concatenated(dir.path(), &pieces);
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"{}\"\n{STEPS}\n\
             [sinks.video]\nkind = \"video_file\"\npath = \"video/cam.mp4\"\nimage = \"$frame\"\n\n\
             [sinks.clips]\nkind = \"clip\"\ndir = \"clips\"\nimage = \"$frame\"\n\
             when = \"$steps.motion.detections\"\npre_roll_s = 0.5\npost_roll_s = 0.5\n\n\
             [sinks.snap]\nkind = \"snapshot\"\ndir = \"snap\"\nimage = \"$frame\"\n\
             cooldown_s = 1.0\n",
            clip.display()
        ),
    );
    let out = spawn(
        dir.path(),
        &["run", p.to_str().unwrap(), "--stats-json", "stats.json"],
        &[],
    )
    .finish(DEADLINE);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);

    let stats = read_json(&dir.path().join("stats.json"));
    let cam = &stats["sources"]["cam"];
    let decoded = cam["decoded"].as_u64().unwrap();
    let sent: u32 = pieces.iter().map(|p| p.0).sum();
    assert_eq!(decoded, u64::from(sent), "{stats}");
    assert_eq!(cam["size_changes"], 3, "{stats}");
    assert_eq!(stats["sinks"]["video"]["written"], decoded, "{stats}");

    // One segment per piece, each at its size, every frame in one of them.
    let segs = segment_sizes(&dir.path().join("video/cam.mp4"));
    let want: Vec<(u64, (i32, i32))> = pieces
        .iter()
        .map(|&(n, (w, h, _))| (u64::from(n), (w as i32, h as i32)))
        .collect();
    assert_eq!(segs, want);

    // Clips: motion is found all along (the ball never stops), so each piece's frames from
    // the first motion on are in clips of that piece's size; no clip mixes sizes.
    let index = jsonl(&dir.path().join("clips/clips.jsonl"));
    let mut clip_sizes = Vec::new();
    for line in &index {
        let path = dir
            .path()
            .join("clips")
            .join(line["path"].as_str().unwrap());
        let (frames, sizes) = frames_and_sizes(&path);
        assert_eq!(sizes.len(), 1, "{} has sizes {sizes:?}", path.display());
        assert_eq!(frames, line["frames"].as_u64().unwrap(), "{line}");
        clip_sizes.push(sizes[0]);
    }
    clip_sizes.dedup();
    assert_eq!(
        clip_sizes,
        [(320, 240), (640, 480), (320, 240)],
        "{index:?}"
    );

    // Snapshots are taken at whatever size the frame has.
    let mut snaps: Vec<PathBuf> = std::fs::read_dir(dir.path().join("snap"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    snaps.sort();
    let mut snap_sizes: Vec<(i32, i32)> = snaps
        .iter()
        .map(|p| {
            let m = opencv::imgcodecs::imread_def(p.to_str().unwrap()).unwrap();
            (m.cols(), m.rows())
        })
        .collect();
    snap_sizes.dedup();
    assert_eq!(snap_sizes, [(320, 240), (640, 480), (320, 240)]);
}
