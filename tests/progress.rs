//! The progress of `vidflow run` as a person sees it: the real binary in a real terminal (tmux,
//! a server of the test's own), the screen read back with `capture-pane`. A file shows its frames
//! done of its total; a looping file, which has no total, shows its frames, and log lines written
//! while its bar is drawn stay whole lines; with stderr to a file there is no progress at all.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{make_h264_mp4, write};

/// Only a guard against a hang: a short clip, or a few seconds of a looping one.
const DEADLINE: Duration = Duration::from_secs(60);
/// The terminal: wide enough for a bar and a log line each on one row.
const COLUMNS: &str = "160";
const ROWS: &str = "50";
/// The tmux window the runs happen in.
const WINDOW: &str = "vidflow";
/// What the shell in the pane says when vidflow has exited, before its exit code.
const EXITED: &str = "vidflow exited with ";

/// A tmux server of this test's own (its socket in a temporary directory), with one window whose
/// pane stays on the screen after its command ends.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn start(dir: &Path) -> Self {
        let found = Command::new("tmux").arg("-V").output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "tmux is missing: scripts/install-deps installs it (apt-get install tmux)"
        );
        let tmux = Self {
            socket: dir.join("tmux.sock"),
        };
        tmux.command(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            WINDOW,
            "-x",
            COLUMNS,
            "-y",
            ROWS,
            "sleep 600",
        ]);
        tmux.command(&["set-option", "-g", "remain-on-exit", "on"]);
        tmux
    }

    fn command(&self, args: &[&str]) -> Output {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .env("TERM", "xterm-256color")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs `vidflow run PIPELINE` (then `redirect`, e.g. `2> file`) in the pane, in `dir`, from
    /// a shell that says how it exited (tmux itself does not always learn that of a process it
    /// did not start through a shell) and whose pid goes to `dir/shell.pid`.
    fn run(&self, dir: &Path, pipeline: &Path, redirect: &str) {
        let command = format!(
            "echo $$ > shell.pid; env -u JOURNAL_STREAM -u GST_DEBUG VIDFLOW_LOG=info {} run {} \
             {redirect}; echo \"{EXITED}$?\"",
            env!("CARGO_BIN_EXE_vidflow"),
            pipeline.display()
        );
        let dir = dir.to_str().unwrap();
        self.command(&["respawn-pane", "-k", "-t", WINDOW, "-c", dir, &command]);
    }

    /// The pane's text, its history included, wrapped lines joined.
    fn screen(&self) -> String {
        let out = self.command(&["capture-pane", "-p", "-J", "-S", "-", "-t", WINDOW]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen shows what `done` looks for.
    fn wait_for_screen(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(start.elapsed() < DEADLINE, "never saw {what}:\n{screen}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for vidflow to end; returns its exit code and the screen.
    fn wait_for_exit(&self) -> (i32, String) {
        let screen = self.wait_for_screen("vidflow's exit", |s| s.contains(EXITED));
        let code = screen
            .lines()
            .find_map(|l| l.strip_prefix(EXITED))
            .and_then(|code| code.trim().parse().ok())
            .unwrap_or_else(|| panic!("no exit code:\n{screen}"));
        (code, screen)
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// A 120-frame clip (4 s at 30 frames/s) as the source `clip`, `options` added to its table.
fn clip_pipeline(dir: &Path, options: &str) -> PathBuf {
    let clip = dir.join("clip.mp4");
    make_h264_mp4(&clip, 120, 160, 120);
    write(
        dir,
        "p.toml",
        &format!(
            "[sources.clip]\nuri = \"{}\"\n{options}\n[sinks.out]\nkind = \"jsonl\"\n\
             path = \"out.jsonl\"\n",
            clip.display()
        ),
    )
}

/// A log line of vidflow's: its timestamp first, as `2026-...T...Z`.
fn is_log_line(line: &str) -> bool {
    line.get(..4)
        .is_some_and(|y| y.bytes().all(|b| b.is_ascii_digit()))
        && line.get(10..11) == Some("T")
}

#[test]
fn a_file_shows_its_frames_done_of_its_total_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let p = clip_pipeline(dir.path(), "");
    let tmux = Tmux::start(dir.path());
    tmux.run(dir.path(), &p, "");
    let (status, screen) = tmux.wait_for_exit();
    assert_eq!(status, 0, "{screen}");
    let bar = screen
        .lines()
        .find(|l| l.starts_with("clip ["))
        .unwrap_or_else(|| panic!("no progress bar:\n{screen}"));
    assert!(bar.contains("] 120/120 frames, "), "{bar}\n{screen}");
    assert!(bar.contains(" frames/s, in "), "{bar}\n{screen}");
    assert!(screen.contains("INFO pipeline finished"), "{screen}");
}

#[test]
fn a_looping_file_shows_its_frames_and_log_lines_stay_whole_while_it_is_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let p = clip_pipeline(dir.path(), "loop = true");
    let tmux = Tmux::start(dir.path());
    tmux.run(dir.path(), &p, "");
    // No total: frames and frames/s. Past the first pass, so the bar has been drawn a while.
    tmux.wait_for_screen("the progress of a second pass", |screen| {
        screen.lines().any(|l| {
            l.strip_prefix("clip ")
                .and_then(|rest| rest.split_once(" frames, "))
                .is_some_and(|(n, rest)| {
                    n.parse::<u64>().is_ok_and(|n| n > 120) && rest.contains(" frames/s")
                })
        })
    });
    // Logged while the bar is on the screen.
    let shell = std::fs::read_to_string(dir.path().join("shell.pid")).unwrap();
    let shell = shell.trim();
    let vidflow = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
    let killed = Command::new("kill")
        .args(["-INT", vidflow.trim()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (status, screen) = tmux.wait_for_exit();
    assert_eq!(status, 0, "{screen}");
    for text in ["INFO stop requested", "INFO pipeline finished"] {
        let line = screen
            .lines()
            .find(|l| l.contains(text))
            .unwrap_or_else(|| panic!("no {text:?}:\n{screen}"));
        assert!(is_log_line(line), "{line:?}\n{screen}");
    }
    // Log lines and the bar never share a line.
    for line in screen.lines().filter(|l| l.contains("frames/s")) {
        assert!(line.starts_with("clip "), "{line:?}\n{screen}");
        assert!(!line.contains(" INFO "), "{line:?}\n{screen}");
    }
    let last = screen.lines().rfind(|l| l.starts_with("clip ")).unwrap();
    assert!(
        !last.contains('[') && last.contains(" frames/s, in "),
        "{last}\n{screen}"
    );
}

#[test]
fn with_stderr_to_a_file_there_is_no_progress() {
    let dir = tempfile::tempdir().unwrap();
    let p = clip_pipeline(dir.path(), "");
    let tmux = Tmux::start(dir.path());
    // stdout is the terminal still; stderr, where the bars would be, is not.
    tmux.run(dir.path(), &p, "2> stderr.txt");
    let (status, screen) = tmux.wait_for_exit();
    assert_eq!(status, 0, "{screen}");
    assert!(!screen.contains("frames/s"), "{screen}");
    let stderr = std::fs::read_to_string(dir.path().join("stderr.txt")).unwrap();
    assert!(stderr.contains("INFO pipeline finished"), "{stderr}");
    assert!(!stderr.contains("frames/s"), "{stderr}");
    assert!(
        !stderr.contains('\r') && !stderr.contains('\x1b'),
        "{stderr:?}"
    );
    assert!(stderr.lines().all(is_log_line), "{stderr}");
}
