//! Messages that name the real cause, through the real `vidflow run` binary (issue 25, item
//! 8): an audio-only file ("Internal data stream error ... not-linked"), an output whose folder
//! is a file ("File exists (os error 17)"), an output under /proc ("/proc: No such file or
//! directory") and a relative source path (shown as `file://in/input.mp4`). The RTSP server
//! that never answers is in `rtsp_hostile.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{Finished, run_to_eos, spawn, write};

/// Only turns a hang into a failure.
const DEADLINE: Duration = Duration::from_secs(60);

fn run(dir: &Path, text: &str) -> Finished {
    let p = write(dir, "p.toml", text);
    spawn(dir, &["run", p.to_str().unwrap()], &[]).finish(DEADLINE)
}

const TEST_SOURCE: &str = "[sources.cam]\nuri = \"test://ball?frames=3&live=false\"\n";

#[test]
fn an_audio_only_file_says_it_has_no_video() {
    let dir = tempfile::tempdir().unwrap();
    for (name, mux) in [
        ("audio.ogg", "vorbisenc ! oggmux"),
        ("audio.mkv", "opusenc ! matroskamux"),
    ] {
        let file = dir.path().join(name);
        run_to_eos(&format!(
            "audiotestsrc num-buffers=50 ! audioconvert ! {mux} ! filesink location={}",
            file.display()
        ));
        let out = run(
            dir.path(),
            &format!(
                "[sources.a]\nuri = \"{}\"\n[sinks.e]\nkind = \"jsonl\"\npath = \"e.jsonl\"\n",
                file.display()
            ),
        );
        assert_eq!(out.status.code(), Some(69), "{name}: {}", out.stderr);
        assert!(
            out.stderr.contains(&format!(
                "source \"a\" (file://{}): no video stream in it (it has audio/x-raw)",
                file.display()
            )),
            "{name}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("not-linked"), "{name}: {}", out.stderr);
    }
}

/// A run of a test pattern into one `sink` writing `path`: it must fail to start (exit 73)
/// saying `says` after the path.
fn check_output(dir: &Path, sink: &str, path: &str, says: &str) {
    let image = if sink == "video_file" {
        "image = \"$frame\"\n"
    } else {
        ""
    };
    let out = run(
        dir,
        &format!("{TEST_SOURCE}[sinks.out]\nkind = \"{sink}\"\npath = \"{path}\"\n{image}"),
    );
    assert_eq!(out.status.code(), Some(73), "{path}: {}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("sink \"out\": {path}: {says}")),
        "{path}: {}",
        out.stderr
    );
}

#[test]
fn an_output_whose_folder_is_a_file_says_so() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "blocker", "a file, not a folder\n");
    for (sink, path, error) in [
        ("jsonl", "blocker/out.jsonl", "File exists"),
        ("jsonl", "blocker/deeper/out.jsonl", "Not a directory"),
        ("video_file", "blocker/out.mp4", "File exists"),
    ] {
        let says = format!("\"blocker\" is a file, not a folder ({error}");
        check_output(dir.path(), sink, path, &says);
    }
}

#[test]
fn an_output_under_proc_says_no_file_can_be_made_there() {
    let dir = tempfile::tempdir().unwrap();
    for (sink, path) in [
        ("jsonl", "/proc/out.jsonl"),
        ("jsonl", "/proc/vidflow/out.jsonl"),
        ("video_file", "/proc/out.mp4"),
    ] {
        let says = "\"/proc\" is the kernel's proc filesystem, where no file can be created";
        check_output(dir.path(), sink, path, says);
    }
}

#[test]
fn a_relative_source_path_is_shown_as_the_absolute_path_it_tried() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        "[sources.clip]\nuri = \"in/input.mp4\"\n[sinks.e]\nkind = \"jsonl\"\npath = \"e.jsonl\"\n",
    );
    assert_eq!(out.status.code(), Some(69), "{}", out.stderr);
    // The run's working directory is the test's folder (seen through any symbolic link).
    let tried = dir.path().canonicalize().unwrap().join("in/input.mp4");
    let plain = dir.path().join("in/input.mp4");
    assert!(
        out.stderr
            .contains(&format!("source \"clip\" (file://{})", tried.display()))
            || out
                .stderr
                .contains(&format!("source \"clip\" (file://{})", plain.display())),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("file://in/"), "{}", out.stderr);
}
