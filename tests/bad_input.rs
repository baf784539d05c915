//! Hostile and damaged input through the real `vidflow run` binary (issue 25): a camera path
//! that is no camera, frames too big to decode safely, and files that decode only in part. Each
//! input is real: made here with GStreamer (encoded, then cut or damaged), or a real device
//! node.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{Finished, make_h264_mp4, read_json, run_to_eos, spawn, write};

/// Only turns a hang into a failure (a camera path retried forever would hang).
const DEADLINE: Duration = Duration::from_secs(60);

fn run(dir: &Path, source: &str) -> Finished {
    let p = write(
        dir,
        "p.toml",
        &format!("{source}\n[sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n"),
    );
    spawn(
        dir,
        &["run", p.to_str().unwrap(), "--stats-json", "stats.json"],
        &[],
    )
    .finish(DEADLINE)
}

/// Item 7: `v4l2:///dev/null` was retried forever; a missing device gave 69 at once.
#[test]
fn a_path_that_is_not_a_camera_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (path, says) in [
        ("/dev/null", "not a V4L2 camera"),
        ("/dev/zero", "not a V4L2 camera"),
        ("/dev/shm", "not a camera: not a device file"),
        ("/dev/video-none", "no such camera device"),
    ] {
        // The default reconnection policy of a camera: never give up.
        let out = run(
            dir.path(),
            &format!("[sources.cam]\nuri = \"v4l2://{path}\"\n"),
        );
        assert_eq!(out.status.code(), Some(69), "{path}: {}", out.stderr);
        assert!(
            out.stderr
                .contains(&format!("source \"cam\" (v4l2://{path}): {says}")),
            "{path}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("retrying"), "{path}: {}", out.stderr);
    }
}

/// Runs like [`run`], watching the process's peak resident set (VmHWM) until it exits: in MB.
fn run_watching_memory(dir: &Path, source: &str) -> (Finished, u64) {
    let p = write(
        dir,
        "p.toml",
        &format!("{source}\n[sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n"),
    );
    let mut running = spawn(dir, &["run", p.to_str().unwrap()], &[]);
    let status = format!("/proc/{}/status", running.pid());
    let mut peak_kb = 0u64;
    while running.is_running() {
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        let hwm = text
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
        peak_kb = peak_kb.max(hwm.unwrap_or(0));
        std::thread::sleep(Duration::from_millis(5));
    }
    (running.finish(DEADLINE), peak_kb / 1024)
}

/// Item 5: a file of two 16000x16000 MJPEG frames took 4.6 GB. Frames over
/// `max_frame_pixels` (40 megapixels by default) are refused before a decoder exists: the run
/// never holds even one such frame (an 8000x8000 frame is 96 MB decoded; the whole run stays
/// near vidflow's own size, about 90 MB). 8K (7680x4320, 33 megapixels) passes by default.
#[test]
fn frames_over_max_frame_pixels_are_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.mkv");
    run_to_eos(&format!(
        "videotestsrc pattern=black num-buffers=2 ! \
         video/x-raw,format=I420,width=8000,height=8000,framerate=1/1 ! jpegenc quality=10 ! \
         matroskamux ! filesink location={}",
        big.display()
    ));
    let source = format!("[sources.big]\nuri = \"{}\"\n", big.display());
    let (out, peak) = run_watching_memory(dir.path(), &source);
    println!("refused: peak RSS {peak} MB\n{}", out.stderr);
    assert_eq!(out.status.code(), Some(69), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "its frames are 8000x8000 (64.0 megapixels), over max_frame_pixels (40000000); \
             refused before decoding (raise [sources.big] max_frame_pixels to take them)"
        ),
        "{}",
        out.stderr
    );
    assert!(peak < 150, "a refused run peaked at {peak} MB");

    // Raised, the same file decodes, and its frames take the memory they take.
    let (out, decoding) = run_watching_memory(
        dir.path(),
        &format!("{source}max_frame_pixels = 64000000\n"),
    );
    println!("decoded: peak RSS {decoding} MB");
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(
        decoding > peak + 90,
        "{decoding} MB decoding, {peak} MB refused"
    );
    let lines = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 2);

    // Frames no decoder makes (a raw camera, a test pattern) are refused at the appsink.
    let out = run(
        dir.path(),
        "[sources.raw]\nuri = \"test://ball?width=8000&height=8000&frames=2&live=false\"\n",
    );
    assert_eq!(out.status.code(), Some(69), "{}", out.stderr);
    assert!(
        out.stderr.contains("its frames are 8000x8000"),
        "{}",
        out.stderr
    );
    // 8K by default.
    let out = run(
        dir.path(),
        "[sources.uhd]\nuri = \"test://ball?width=7680&height=4320&frames=2&live=false\"\n",
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
}

/// Frames the file gave, what its stats say is missing, and how the run ended.
fn partial(dir: &Path, file: &Path) -> (Finished, u64, u64) {
    let out = run(
        dir,
        &format!("[sources.clip]\nuri = \"{}\"\n", file.display()),
    );
    let stats = read_json(&dir.join("stats.json"));
    let decoded = stats["sources"]["clip"]["decoded"].as_u64().unwrap();
    let missing = stats["sources"]["clip"]["missing"].as_u64().unwrap();
    assert_eq!(stats["frames_processed"], decoded, "{stats}");
    (out, decoded, missing)
}

/// Item 6: an MP4 cut at half gave 147 of its 300 frames, one with 20% of its media data
/// damaged gave 1, and both exited 0 in silence. Each says how many it gave of how many, counts
/// the rest as `missing`, and exits 65 (EX_DATAERR); every frame it gave was processed.
#[test]
fn a_file_that_ends_short_of_its_frames_says_so_and_exits_65() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole.mp4");
    // The index first (as cameras and phones write it), so that a cut file still knows its
    // length.
    run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers=300 ! \
         video/x-raw,width=320,height=240,framerate=30/1 ! x264enc speed-preset=ultrafast ! \
         h264parse ! mp4mux faststart=true ! filesink location={}",
        whole.display()
    ));
    let (out, decoded, missing) = partial(dir.path(), &whole);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert_eq!((decoded, missing), (300, 0));

    let bytes = std::fs::read(&whole).unwrap();
    let half = dir.path().join("half.mp4");
    std::fs::write(&half, &bytes[..bytes.len() / 2]).unwrap();
    let (out, decoded, missing) = partial(dir.path(), &half);
    println!("cut at half: {decoded} frames\n{}", out.stderr);
    assert_eq!(out.status.code(), Some(65), "{}", out.stderr);
    assert!(decoded > 0 && decoded < 290, "{decoded}");
    assert_eq!(missing, 300 - decoded);
    assert!(
        out.stderr.contains(&format!(
            "the file gave {decoded} of its 300 frames (its duration at its frame rate); \
             the rest could not be decoded: a truncated or damaged file?"
        )),
        "{}",
        out.stderr
    );

    // 20% of the media data overwritten, from a tenth of the way in.
    let plain = dir.path().join("plain.mp4");
    make_h264_mp4(&plain, 300, 320, 240);
    let mut bytes = std::fs::read(&plain).unwrap();
    let (at, size) = mdat(&bytes);
    let mut noise = 0x2545_f491_4f6c_dd1d_u64;
    for b in &mut bytes[at + size / 10..at + size / 10 + size / 5] {
        noise ^= noise << 13;
        noise ^= noise >> 7;
        noise ^= noise << 17;
        *b = noise as u8;
    }
    let damaged = dir.path().join("damaged.mp4");
    std::fs::write(&damaged, &bytes).unwrap();
    let (out, decoded, missing) = partial(dir.path(), &damaged);
    println!("damaged: {decoded} frames\n{}", out.stderr);
    assert_eq!(out.status.code(), Some(65), "{}", out.stderr);
    assert_eq!(missing, 300 - decoded);
    assert!(missing > 3, "{decoded}");
}

/// Where the payload of the `mdat` box of an MP4 starts, and its size.
fn mdat(bytes: &[u8]) -> (usize, usize) {
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let size = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if &bytes[at + 4..at + 8] == b"mdat" {
            return (at + 8, size - 8);
        }
        at += size;
    }
    panic!("no mdat box");
}
