//! What `vidflow run` writes to stderr, run as the real binary: under the journal (stderr is
//! the stream `JOURNAL_STREAM` names) every line starts with the sd-daemon priority of its
//! level; anywhere else (no variable, or one naming another file) no line does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{make_h264_mp4, vidflow, write};

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

/// Runs `vidflow run PIPELINE ARGS...` in `dir` with stderr to a file; returns the exit code
/// and stderr.
fn run(
    dir: &Path,
    pipeline: &Path,
    journal: Journal,
    env: &[(&str, &str)],
    args: &[&str],
) -> (i32, String) {
    let stderr_path = dir.join("stderr.txt");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let mut command: Command = vidflow();
    command
        .current_dir(dir)
        .arg("run")
        .arg(pipeline)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    match journal {
        Journal::Stderr => command.env("JOURNAL_STREAM", device_inode(&stderr_path)),
        Journal::Elsewhere => command.env("JOURNAL_STREAM", device_inode(pipeline)),
        Journal::Unset => command.env_remove("JOURNAL_STREAM"),
    };
    let mut child = command.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            panic!("vidflow did not exit within {RUN_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&stderr_path).unwrap();
    (status.code().unwrap(), text)
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

/// Every line carries the priority of its level; returns the priorities seen.
fn assert_prioritized(stderr: &str) -> Vec<String> {
    assert!(!stderr.trim().is_empty(), "nothing logged");
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
                other => panic!("unknown level {other:?} in {line:?}"),
            };
            assert_eq!(priority, expected, "{line:?}");
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
