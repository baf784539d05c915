//! What `vidflow run` writes to stderr, run as the real binary: under the journal (stderr is
//! the stream `JOURNAL_STREAM` names) every line starts with the sd-daemon priority of its
//! level; anywhere else (no variable, or one naming another file) no line does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Running, make_h264_mp4, spawn_command_to, vidflow, write};

/// Only a guard against a hang: a few test frames, or a source that is not there.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

/// How stderr is attached to the run.
#[derive(Debug, Clone, Copy)]
enum Journal {
    /// `JOURNAL_STREAM` names the file stderr goes to.
    Stderr,
    /// `JOURNAL_STREAM` names another file.
    Elsewhere,
    /// No `JOURNAL_STREAM`.
    Unset,
}

/// `DEVICE:INODE` of a file, as systemd writes `JOURNAL_STREAM`.
fn device_inode(path: &Path) -> String {
    let m = std::fs::metadata(path).unwrap();
    format!("{}:{}", m.dev(), m.ino())
}

/// Starts `vidflow run PIPELINE ARGS...` in `dir` with stderr to a file, `env` added to its
/// environment (GStreamer's own `GST_DEBUG` removed unless given).
fn start(
    dir: &Path,
    pipeline: &Path,
    journal: Journal,
    env: &[(&str, &str)],
    args: &[&str],
) -> Running {
    let stderr = dir.join("stderr.txt");
    std::fs::File::create(&stderr).unwrap();
    let mut command = vidflow();
    command
        .arg("run")
        .arg(pipeline)
        .args(args)
        .env_remove("GST_DEBUG")
        .envs(env.iter().copied());
    match journal {
        Journal::Stderr => command.env("JOURNAL_STREAM", device_inode(&stderr)),
        Journal::Elsewhere => command.env("JOURNAL_STREAM", device_inode(pipeline)),
        Journal::Unset => command.env_remove("JOURNAL_STREAM"),
    };
    spawn_command_to(dir, command, &dir.join("stdout.txt"), &stderr)
}

/// Waits for the end of a run; returns its exit code and stderr.
fn finish(run: Running) -> (i32, String) {
    let out = run.finish(RUN_DEADLINE);
    (out.status.code().unwrap(), out.stderr)
}

/// Runs `vidflow run PIPELINE ARGS...` to its end (see [`start`]).
fn run(
    dir: &Path,
    pipeline: &Path,
    journal: Journal,
    env: &[(&str, &str)],
    args: &[&str],
) -> (i32, String) {
    finish(start(dir, pipeline, journal, env, args))
}

/// A pipeline with one source (its table's further lines in `options`) and a JSONL sink.
fn pipeline_with(dir: &Path, uri: &str, options: &str) -> PathBuf {
    write(
        dir,
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"{uri}\"\n{options}\n[sinks.out]\nkind = \"jsonl\"\n\
             path = \"out.jsonl\"\n"
        ),
    )
}

fn pipeline(dir: &Path, uri: &str) -> PathBuf {
    pipeline_with(dir, uri, "")
}

/// The priority prefix a line starts with and the level word after it.
fn priority_and_level(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix('<')?;
    let (priority, rest) = rest.split_once('>')?;
    Some((priority, rest.split_whitespace().next()?))
}

/// Every line carries the priority of its level (a continuation line, that of the line it
/// continues); returns the priorities seen.
fn assert_prioritized(stderr: &str) -> Vec<String> {
    assert!(!stderr.trim().is_empty(), "nothing logged");
    let mut last: Option<&str> = None;
    stderr
        .lines()
        .map(|line| {
            let (priority, level) = priority_and_level(line)
                .unwrap_or_else(|| panic!("line without a priority: {line:?}\n{stderr}"));
            let expected = match level {
                "ERROR" => "3",
                "WARN" => "4",
                "INFO" => "6",
                "DEBUG" | "TRACE" => "7",
                _ => last.unwrap_or_else(|| panic!("no level in {line:?}")),
            };
            assert_eq!(priority, expected, "{line:?}\n{stderr}");
            last = Some(expected);
            priority.to_owned()
        })
        .collect()
}

#[test]
fn under_the_journal_every_line_starts_with_the_priority_of_its_level() {
    let dir = tempfile::tempdir().unwrap();
    // A looping clip logs each new pass at debug level.
    let clip = dir.path().join("clip.mp4");
    make_h264_mp4(&clip, 3, 64, 64);
    let p = pipeline_with(dir.path(), &clip.to_string_lossy(), "loop = true");
    let (code, stderr) = run(
        dir.path(),
        &p,
        Journal::Stderr,
        &[("VIDFLOW_LOG", "debug")],
        &["--max-frames", "8"],
    );
    assert_eq!(code, 0, "{stderr}");
    let seen = assert_prioritized(&stderr);
    assert!(seen.iter().any(|p| p == "6"), "no info line:\n{stderr}");
    assert!(seen.iter().any(|p| p == "7"), "no debug line:\n{stderr}");
    assert!(stderr.contains("<6>INFO source started"), "{stderr}");
    // journald stamps the entries: no timestamp of vidflow's own.
    assert!(!stderr.contains(" INFO "), "{stderr}");

    // A file source that is not there: exit 69, said at error priority.
    let p = pipeline(dir.path(), "/nonexistent/clip.mp4");
    let (code, stderr) = run(dir.path(), &p, Journal::Stderr, &[], &[]);
    assert_eq!(code, 69, "{stderr}");
    let seen = assert_prioritized(&stderr);
    assert!(seen.iter().any(|p| p == "3"), "no error line:\n{stderr}");
    assert!(stderr.contains("/nonexistent/clip.mp4"), "{stderr}");
}

#[test]
fn away_from_the_journal_no_line_has_a_priority() {
    let dir = tempfile::tempdir().unwrap();
    for journal in [Journal::Unset, Journal::Elsewhere] {
        let p = pipeline(dir.path(), "test://ball?frames=5&live=false");
        let (code, stderr) = run(dir.path(), &p, journal, &[], &[]);
        assert_eq!(code, 0, "{journal:?}: {stderr}");
        assert!(
            stderr.contains(" INFO source started"),
            "{journal:?}: {stderr}"
        );
        let p = pipeline(dir.path(), "/nonexistent/clip.mp4");
        let (code, stderr) = run(dir.path(), &p, journal, &[], &[]);
        assert_eq!(code, 69, "{journal:?}: {stderr}");
        assert!(stderr.contains("ERROR"), "{journal:?}: {stderr}");
        for line in stderr.lines() {
            assert!(!line.starts_with('<'), "{journal:?}: {line:?}");
            // A timestamp first, as on a terminal.
            assert!(
                line.starts_with(|c: char| c.is_ascii_digit()),
                "{journal:?}: {line:?}"
            );
        }
    }
}

/// A pipeline whose RTSP camera refuses connections (nothing listens on its port), retried
/// every 100 to 200 ms; `userinfo` (`user:password@`) goes into its URL.
fn refused_camera(dir: &Path, userinfo: &str) -> PathBuf {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    pipeline_with(
        dir,
        &format!("rtsp://{userinfo}127.0.0.1:{port}/cam"),
        "[sources.cam.reconnect]\ninitial_delay_ms = 100\nmax_delay_ms = 200\n",
    )
}

/// GStreamer's own format: `0:00:00.012738740  PID  THREAD LEVEL ...`.
fn in_gstreamer_format(line: &str) -> bool {
    line.split_whitespace().next().is_some_and(|first| {
        let parts: Vec<_> = first.split(':').collect();
        parts.len() == 3
            && parts
                .iter()
                .all(|p| p.chars().all(|c| c.is_ascii_digit() || c == '.'))
    })
}

/// What rtspsrc's connection says when nothing listens: the cause of the failure.
const REFUSED: &str = "failed to connect: Could not connect to 127.0.0.1: Connection refused";

#[test]
fn gstreamer_warnings_are_vidflow_log_lines_once_then_debug_while_they_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let p = refused_camera(dir.path(), "");
    let run = start(
        dir.path(),
        &p,
        Journal::Stderr,
        &[("VIDFLOW_LOG", "debug")],
        &[],
    );
    // The first attempt, then three retries that fail the same way.
    run.wait_for_stderr_times("retry failed", 3, RUN_DEADLINE);
    run.signal("INT");
    let (code, stderr) = finish(run);
    assert_eq!(code, 0, "{stderr}");
    // Every line is vidflow's, with its priority: the continuation lines of the bus error's
    // debug text too; none in GStreamer's format.
    assert_prioritized(&stderr);
    let refused: Vec<_> = stderr.lines().filter(|l| l.contains(REFUSED)).collect();
    assert!(
        refused[0].starts_with(&format!("<4>WARN {REFUSED}"))
            && refused[0].contains("gst_category=\"default\""),
        "{stderr}"
    );
    // Each retry gave the same again: at debug level.
    assert!(refused.len() >= 4, "{stderr}");
    for line in &refused[1..] {
        assert!(
            line.starts_with(&format!("<7>DEBUG {REFUSED}")),
            "{line}\n{stderr}"
        );
    }
    // What only restates the bus error is debug from the first: one warning of GStreamer's.
    let warnings: Vec<_> = stderr
        .lines()
        .filter(|l| l.starts_with("<4>") && l.contains("gst_category="))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");

    // Away from the journal: the same lines in vidflow's format, none in GStreamer's.
    let run = start(dir.path(), &p, Journal::Unset, &[], &[]);
    run.wait_for_stderr("cannot connect; retrying", RUN_DEADLINE);
    run.wait_for_stderr(REFUSED, RUN_DEADLINE);
    run.signal("INT");
    let (code, stderr) = finish(run);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains(&format!(" WARN {REFUSED}")), "{stderr}");
    assert!(!stderr.lines().any(in_gstreamer_format), "{stderr}");
}

#[test]
fn gst_debug_chooses_what_gstreamer_logs_all_of_it_shown_without_passwords() {
    let dir = tempfile::tempdir().unwrap();
    // rtspsrc quotes its URL at debug level: it is given neither user nor password.
    let p = refused_camera(dir.path(), "user:s3cret-pw@");
    // Only rtspsrc, up to its debug level; vidflow's own lines stay at info.
    let run = start(
        dir.path(),
        &p,
        Journal::Unset,
        &[("GST_DEBUG", "rtspsrc:5"), ("VIDFLOW_LOG", "info")],
        &[],
    );
    run.wait_for_stderr("cannot connect; retrying", RUN_DEADLINE);
    run.signal("INT");
    let (code, stderr) = finish(run);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(" DEBUG ") && l.contains("gst_category=\"rtspsrc\"")),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret-pw"), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("gst_category") && l.contains("rtsp://127.0.0.1:")),
        "{stderr}"
    );
    // The warning of category `default` is not asked for any more.
    assert!(!stderr.contains(REFUSED), "{stderr}");
    assert!(!stderr.contains("next attempt after backoff"), "{stderr}");
    assert!(!stderr.lines().any(in_gstreamer_format), "{stderr}");
}
