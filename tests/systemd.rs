//! The shipped unit, `systemd/vidflow@.service`, checked without systemd as PID 1: it verifies
//! against the binary this build made, `systemd-analyze security` rates it 2.0 or better, and
//! the codecs and models run under the strictest setting it asks for that could break them,
//! `MemoryDenyWriteExecute=yes` (reproduced with the kernel's own switch for it,
//! `prctl(PR_SET_MDWE)`, which a process keeps across `exec`: no systemd needed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// The worst overall exposure the unit may have (systemd's scale: 0 safe .. 10 unsafe).
const MAX_EXPOSURE: f64 = 2.0;
/// Only a guard against a hang: a few frames through two networks, unoptimized.
const RUN_DEADLINE: Duration = Duration::from_secs(300);

fn unit() -> PathBuf {
    repo_root().join("systemd/vidflow@.service")
}

/// The unit with its `ExecStart` binary replaced by `binary`, written into `dir`.
fn unit_for(dir: &Path, binary: &str) -> PathBuf {
    let text = std::fs::read_to_string(unit()).unwrap();
    assert!(text.contains("/usr/local/bin/vidflow"), "{text}");
    let path = dir.join("vidflow@.service");
    std::fs::write(&path, text.replace("/usr/local/bin/vidflow", binary)).unwrap();
    path
}

/// The unit's `KEY=VALUE` lines, comments left out, in order.
fn settings(text: &str) -> Vec<(&str, &str)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .collect()
}

fn analyze(args: &[&str]) -> std::process::Output {
    Command::new("systemd-analyze")
        .args(args)
        .output()
        .expect("systemd-analyze (package systemd, installed by scripts/install-deps)")
}

#[test]
fn the_unit_verifies_against_the_built_binary() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for(dir.path(), env!("CARGO_BIN_EXE_vidflow"));
    let out = analyze(&["verify", unit.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.trim().is_empty(), "warnings: {stderr}");

    // The check has teeth: a binary that is not there fails it.
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for(dir.path(), "/nonexistent/vidflow");
    let out = analyze(&["verify", unit.to_str().unwrap()]);
    assert!(!out.status.success());
}

#[test]
fn the_unit_is_rated_2_0_or_better_by_systemd_analyze_security() {
    let out = analyze(&["security", "--offline=yes", unit().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no rating in {stdout}"));
    let exposure: f64 = line
        .split(':')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("cannot read {line:?}"));
    assert!(exposure <= MAX_EXPOSURE, "{line}\n{stdout}");
}

#[test]
fn the_unit_keeps_restarts_for_failures_restarting_can_fix() {
    let text = std::fs::read_to_string(unit()).unwrap();
    let keys = settings(&text);
    let has = |k: &str, v: &str| keys.iter().any(|&(key, value)| key == k && value == v);
    // Validation happens in the main process: its exit 78 is what stops the restarts. An
    // ExecStartPre's exit code is not, so a bad file would restart forever.
    assert!(!keys.iter().any(|(k, _)| *k == "ExecStartPre"), "{text}");
    assert!(has("RestartPreventExitStatus", "78"), "{text}");
    assert!(has("Restart", "on-failure"), "{text}");
    assert!(has("MemoryDenyWriteExecute", "yes"), "{text}");
    // systemd's SIGKILL must come after the daemon's own stop deadline (default 20 s).
    let stop: u64 = keys
        .iter()
        .find(|(k, _)| *k == "TimeoutStopSec")
        .and_then(|(_, v)| v.parse().ok())
        .expect("TimeoutStopSec in seconds");
    assert!(
        stop > vidflow::config::DEFAULT_STOP_TIMEOUT.as_secs() + 10,
        "{stop}"
    );
}

#[test]
fn the_unit_has_a_watchdog_and_reloads_with_sighup() {
    let text = std::fs::read_to_string(unit()).unwrap();
    let keys = settings(&text);
    let value = |k: &str| keys.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
    assert_eq!(value("Type"), Some("notify"), "{text}");
    assert_eq!(value("NotifyAccess"), Some("main"), "{text}");
    assert_eq!(
        value("ExecReload"),
        Some("/bin/kill -HUP $MAINPID"),
        "{text}"
    );
    // A camera whose frames stop still streams until its stall timeout ends the connection;
    // a ping needs a frame through the workflow every half of WatchdogSec.
    let watchdog: u64 = value("WatchdogSec")
        .and_then(|v| v.parse().ok())
        .expect("WatchdogSec in seconds");
    let stall = vidflow::source::SourceOptions::default().stall_timeout;
    assert!(
        std::time::Duration::from_secs(watchdog / 2) > 2 * stall,
        "{watchdog}"
    );
}

/// Runs `vidflow run PIPELINE EXTRA...` in `dir` as `MemoryDenyWriteExecute=yes` would: no
/// memory that is both writable and executable, ever.
fn run_without_write_execute(dir: &Path, pipeline: &Path, extra: &[&str]) -> Finished {
    let mut command = vidflow();
    command
        .env("VIDFLOW_MODELS_DIR", repo_root().join("models"))
        .arg("run")
        .arg(pipeline)
        .args(extra);
    // SAFETY: only prctl, which is async-signal-safe, runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            const PR_SET_MDWE: libc::c_int = 65;
            const PR_MDWE_REFUSE_EXEC_GAIN: libc::c_ulong = 1;
            if libc::prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    spawn_command(dir, command).finish(RUN_DEADLINE)
}

#[test]
fn decoding_detecting_and_encoding_run_without_writable_executable_memory() {
    let dir = tempfile::tempdir().unwrap();
    // H.264 decoded, both networks, background subtraction, drawing, x264 encoding.
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 10, 320, 240);
    let steps = r#"
[steps.people]
kind = "object_detection"
image = "$frame"
input_size = 320

[steps.faces]
kind = "face_detection"
image = "$frame"

[steps.motion]
kind = "motion"
image = "$frame"

[steps.overlay]
kind = "annotate"
image = "$frame"
detections = "$steps.people.detections"

[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = ["$steps.people.detections", "$steps.faces.detections", "$steps.motion.detections"]
"#;
    let pipeline = write(
        dir.path(),
        "h264.toml",
        &format!(
            "[sources.h264]\nuri = \"file://{}\"\n{steps}\n[sinks.video]\nkind = \"video_file\"\n\
             path = \"out/annotated.mp4\"\nimage = \"$steps.overlay.image\"\n",
            clip.display()
        ),
    );
    let out = run_without_write_execute(dir.path(), &pipeline, &[]);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len(), 10);
    assert!(lines.iter().all(|l| l.get("error").is_none()), "{lines:?}");
    assert_eq!(
        count_video_frames(&dir.path().join("out/annotated.mp4")),
        10
    );

    // MPEG-4 part 2 (the street video) through libav's other decoder.
    let dir = tempfile::tempdir().unwrap();
    let pipeline = write(
        dir.path(),
        "mpeg4.toml",
        &format!(
            "[sources.street]\nuri = \"file://{}\"\n{steps}",
            asset("vtest.avi").display()
        ),
    );
    let out = run_without_write_execute(dir.path(), &pipeline, &["--max-frames", "5"]);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len(), 5);
    assert!(lines.iter().all(|l| l.get("error").is_none()), "{lines:?}");
}
