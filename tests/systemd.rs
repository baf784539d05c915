//! The shipped unit, `systemd/vidflow@.service`, checked without systemd as PID 1: it verifies
//! against the binary this build made, `systemd-analyze security` rates it 2.0 or better, and
//! the codecs and models run under the strictest setting it asks for that could break them,
//! `MemoryDenyWriteExecute=yes` (reproduced with the kernel's own switch for it,
//! `prctl(PR_SET_MDWE)`, which a process keeps across `exec`: no systemd needed), and the HTTP
//! live thread runs below the frames under its system call filter (its deny lists reproduced
//! as a seccomp program of the test's own, answering EPERM as the unit does).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::http as http_client;

use std::collections::BTreeSet;
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
    // Descriptors for every live client the endpoint would take, beside the run's reserve.
    let nofile: u64 = keys
        .iter()
        .find(|(k, _)| *k == "LimitNOFILE")
        .and_then(|(_, v)| v.parse().ok())
        .expect("LimitNOFILE, a number");
    // Forty cameras, each recorded, with five sinks and the event store.
    let pipeline = vidflow::daemon::fds::Pipeline {
        sources: 40,
        record_streams: 40,
        sinks: 5,
        event_store: true,
    }
    .descriptors();
    assert_eq!(
        vidflow::daemon::http::max_live_clients(nofile, pipeline),
        vidflow::daemon::http::max_live_clients(u64::MAX, pipeline),
        "{nofile}"
    );
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

/// The system calls the unit's `SystemCallFilter=` lines refuse, by name: each `~` list adds
/// its calls, and a plain list after the first line takes calls back (systemd's rule: the
/// first line sets the default, the later ones edit the set). The first line's allow list
/// (`@system-service`) is not reproduced: calls outside it pass here.
fn refused_by(unit_text: &str) -> BTreeSet<String> {
    let mut refused = BTreeSet::new();
    let lines: Vec<&str> = settings(unit_text)
        .into_iter()
        .filter(|(k, _)| *k == "SystemCallFilter")
        .map(|(_, v)| v)
        .collect();
    for value in lines.iter().skip(1) {
        match value.strip_prefix('~') {
            Some(names) => refused.extend(expand(names)),
            None => expand(value).iter().for_each(|n| {
                refused.remove(n);
            }),
        }
    }
    refused
}

/// System call names and `@groups` (as `systemd-analyze syscall-filter` lists them, nested
/// groups too), as names.
fn expand(names: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for name in names.split_whitespace() {
        if name.starts_with('@') {
            let listed = analyze(&["syscall-filter", name]);
            assert!(listed.status.success(), "{name}");
            let text = String::from_utf8(listed.stdout).unwrap();
            for line in text.lines().skip(1).map(str::trim) {
                if !line.is_empty() && !line.starts_with('#') {
                    out.extend(expand(line));
                }
            }
        } else {
            out.insert(name.to_owned());
        }
    }
    out
}

/// x86-64's system call numbers, by name, from the kernel's header (linux-libc-dev).
#[cfg(target_arch = "x86_64")]
fn syscall_numbers() -> std::collections::BTreeMap<String, u32> {
    let header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
    std::fs::read_to_string(header)
        .unwrap_or_else(|e| panic!("{header}: {e} (package linux-libc-dev)"))
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("#define __NR_")?.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.parse().ok()?))
        })
        .collect()
}

/// A seccomp program that answers EPERM to each of `numbers` (as the unit's
/// `SystemCallErrorNumber=EPERM`) and lets every other call through.
#[cfg(target_arch = "x86_64")]
fn eperm_filter(numbers: &[u32]) -> Vec<libc::sock_filter> {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let op = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: u16::try_from(code).unwrap(),
        jt,
        jf,
        k,
    };
    let eperm = libc::SECCOMP_RET_ERRNO | u32::try_from(libc::EPERM).unwrap();
    let mut program = vec![
        // seccomp_data.arch: another ABI's calls pass (the unit allows the native one only).
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4, 0, 0),
        op(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            AUDIT_ARCH_X86_64,
            1,
            0,
        ),
        op(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW, 0, 0),
        // seccomp_data.nr
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
    ];
    for &n in numbers {
        program.push(op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, n, 0, 1));
        program.push(op(libc::BPF_RET | libc::BPF_K, eperm, 0, 0));
    }
    program.push(op(
        libc::BPF_RET | libc::BPF_K,
        libc::SECCOMP_RET_ALLOW,
        0,
        0,
    ));
    program
}

/// What a run under the calls `refused` (EPERM) shows of its live thread: its nice value and
/// the executor's, `/api/health`'s `live`, and the log.
#[cfg(target_arch = "x86_64")]
fn live_priority_under(refused: &BTreeSet<String>) -> (i64, i64, serde_json::Value, String) {
    let table = syscall_numbers();
    let numbers: Vec<u32> = refused
        .iter()
        .filter_map(|n| table.get(n).copied())
        .collect();
    let program = eperm_filter(&numbers);
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let pipeline = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"test://ball?width=160&height=120&fps=10\"\n\n\
             [steps.moving]\nkind = \"motion\"\nimage = \"$frame\"\n\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\n\
             [sinks.frames]\nkind = \"jsonl\"\npath = \"frames.jsonl\"\n"
        ),
    );
    let mut command = vidflow();
    command.arg("run").arg(&pipeline);
    // SAFETY: only prctl, which is async-signal-safe, runs between fork and exec; the
    // program was built before the fork and outlives the call (the kernel copies it).
    unsafe {
        command.pre_exec(move || {
            let fprog = libc::sock_fprog {
                len: u16::try_from(program.len()).unwrap_or(u16::MAX),
                filter: program.as_ptr().cast_mut(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &raw const fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let run = spawn_command(dir.path(), command);
    let health = http_client::wait_until("the live thread started", RUN_DEADLINE, || {
        let (status, body) = http_client::get(port, "/api/health")?;
        let health: serde_json::Value = serde_json::from_str(&body).ok()?;
        (status == 200 && !health["live"]["below_frames"].is_null()).then_some(health)
    });
    let threads = nice_by_thread(run.pid());
    let nice = |name: &str| {
        threads
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no thread {name:?} in {threads:?}"))
            .1
    };
    let (live, executor) = (nice("vidflow-http-li"), nice("vidflow-executo"));
    run.signal("TERM");
    let finished = run.finish(RUN_DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
    (live, executor, health["live"].clone(), finished.stderr)
}

#[test]
#[cfg(target_arch = "x86_64")]
fn the_live_thread_runs_below_the_frames_under_the_units_system_call_filter() {
    let text = std::fs::read_to_string(unit()).unwrap();
    let refused = refused_by(&text);
    assert!(
        refused.contains("setrlimit") && refused.contains("chroot"),
        "{refused:?}"
    );
    let (live, executor, health, stderr) = live_priority_under(&refused);
    assert_eq!(live, (executor + 10).min(19), "{stderr}");
    assert_eq!(health["below_frames"], true, "{health}");
    assert!(!stderr.contains("cannot lower its priority"), "{stderr}");

    // The unit's filter without the line that gives setpriority back: refused, and said so
    // once, in the log and in /api/health, the thread at the executor's priority.
    let without = text.replace("\nSystemCallFilter=setpriority\n", "\n");
    let refused = refused_by(&without);
    assert!(refused.contains("setpriority"), "{refused:?}");
    let (live, executor, health, stderr) = live_priority_under(&refused);
    assert_eq!(live, executor, "{stderr}");
    assert_eq!(health["below_frames"], false, "{health}");
    assert_eq!(
        stderr
            .matches("the live thread cannot lower its priority")
            .count(),
        1,
        "{stderr}"
    );
}
