//! The shipped unit, `systemd/vidflow@.service`, checked without systemd as PID 1: it verifies
//! against the binary this build made, `systemd-analyze security` rates it 2.0 or better, and
//! vidflow runs under what it enforces, reproduced (`common/systemd_unit.rs`): its system call
//! filter, allow lists and deny lists as `systemd-analyze syscall-filter` expands them, as a
//! seccomp program of the test's own answering EPERM as the unit does; and
//! `MemoryDenyWriteExecute=yes` with the kernel's own switch for it, `prctl(PR_SET_MDWE)`,
//! which a process keeps across `exec`. Under both, the codecs and models run, and the HTTP
//! live thread runs below the frames. The demo runs as the unit would run it (its command line,
//! environment, working directory, an unprivileged user) under `strace`: every system call it
//! makes is one the filter allows or one it refuses harmlessly (listed, with why), and it writes
//! only where the unit lets it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::http as http_client;
use crate::common::systemd_unit;

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use systemd_unit::{SERVICE_UID, Sandbox, allowed_calls, analyze, settings, writable};

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

/// Runs `vidflow run PIPELINE EXTRA...` in `dir` as `MemoryDenyWriteExecute=yes` would (no
/// memory that is both writable and executable, ever) and under the unit's system call filter.
#[cfg(target_arch = "x86_64")]
fn run_under_the_unit(dir: &Path, pipeline: &Path, extra: &[&str]) -> Finished {
    let text = std::fs::read_to_string(unit()).unwrap();
    let program = systemd_unit::allow_filter(&allowed_calls(&text));
    let mut command = vidflow();
    command
        .env("VIDFLOW_MODELS_DIR", repo_root().join("models"))
        .arg("run")
        .arg(pipeline)
        .args(extra);
    // SAFETY: only prctl, which is async-signal-safe, runs between fork and exec; the
    // program was built before the fork and outlives the call (the kernel copies it).
    unsafe {
        command.pre_exec(move || {
            const PR_SET_MDWE: libc::c_int = 65;
            const PR_MDWE_REFUSE_EXEC_GAIN: libc::c_ulong = 1;
            if libc::prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            systemd_unit::install_filter(&program)
        });
    }
    spawn_command(dir, command).finish(RUN_DEADLINE)
}

#[test]
#[cfg(target_arch = "x86_64")]
fn decoding_detecting_and_encoding_run_under_the_units_memory_and_system_call_limits() {
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
    let out = run_under_the_unit(dir.path(), &pipeline, &[]);
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
    let out = run_under_the_unit(dir.path(), &pipeline, &["--max-frames", "5"]);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("out/events.jsonl"));
    assert_eq!(lines.len(), 5);
    assert!(lines.iter().all(|l| l.get("error").is_none()), "{lines:?}");
}

/// What a run under the calls `allowed` (every other one EPERM) shows of its live thread: its
/// nice value and the executor's, `/api/health`'s `live`, and the log.
#[cfg(target_arch = "x86_64")]
fn live_priority_under(allowed: &BTreeSet<String>) -> (i64, i64, serde_json::Value, String) {
    let program = systemd_unit::allow_filter(allowed);
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
        command.pre_exec(move || systemd_unit::install_filter(&program));
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
    let allowed = allowed_calls(&text);
    // The allow list (@system-service), less the deny lists (@privileged @resources), with
    // setpriority given back.
    assert!(
        allowed.contains("openat") && allowed.contains("setpriority"),
        "{allowed:?}"
    );
    assert!(
        !allowed.contains("setrlimit")
            && !allowed.contains("chroot")
            && !allowed.contains("ptrace"),
        "{allowed:?}"
    );
    let (live, executor, health, stderr) = live_priority_under(&allowed);
    assert_eq!(live, (executor + 10).min(19), "{stderr}");
    assert_eq!(health["below_frames"], true, "{health}");
    assert!(!stderr.contains("cannot lower its priority"), "{stderr}");

    // The unit's filter without the line that gives setpriority back: refused, and said so
    // once, in the log and in /api/health, the thread at the executor's priority.
    let without = text.replace("\nSystemCallFilter=setpriority\n", "\n");
    let allowed = allowed_calls(&without);
    assert!(!allowed.contains("setpriority"), "{allowed:?}");
    let (live, executor, health, stderr) = live_priority_under(&allowed);
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

/// The calls the demo makes that the unit refuses (EPERM), each with who makes it and why the
/// refusal costs nothing: the run below makes them under the filter and processes every frame.
const REFUSED_AND_HARMLESS: &[(&str, &str)] = &[
    (
        "sched_setattr",
        "GLib tries it once on the thread making a thread pool, to see whether the pool's threads \
         may copy its scheduling; refused, it starts them from a thread of its own",
    ),
    (
        "sched_setaffinity",
        "hwloc, for oneTBB inside OpenVINO: binds a thread to each core in turn to map the CPUs; \
         refused, it reads the map from /sys",
    ),
    (
        "mbind",
        "OpenVINO's CPU plugin placing its buffers on the NUMA node of their thread (one node \
         here, and on the boxes vidflow runs on)",
    ),
    ("set_mempolicy", "the same, for a whole thread"),
];

/// The pid of the vidflow process `run` (strace) started, once it runs vidflow: strace may
/// start short-lived processes of its own first (its checks of what the kernel can trace).
fn child_of(run: &mut Running) -> libc::pid_t {
    let parent = run.pid();
    let children = format!("/proc/{parent}/task/{parent}/children");
    let binary = std::fs::canonicalize(env!("CARGO_BIN_EXE_vidflow")).unwrap();
    poll(
        "strace to start vidflow",
        RUN_DEADLINE,
        Duration::from_millis(20),
        || {
            assert!(run.is_running(), "strace ended: {}", run.stderr());
            let text = std::fs::read_to_string(&children).ok()?;
            text.split_whitespace()
                .find(|pid| {
                    std::fs::read_link(format!("/proc/{pid}/exe")).ok() == Some(binary.clone())
                })?
                .parse()
                .ok()
        },
    )
}

/// Kills the traced vidflow when the test ends: strace, killed by [`Running`]'s drop on a
/// failure, would leave it running, detached.
struct KillOnDrop(libc::pid_t);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill with the pid of our grandchild; if it ended, its pid is not reused
        // within the test's last moments (ESRCH then, ignored).
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn the_demo_as_the_unit_runs_it_makes_only_calls_it_allows_and_writes_only_where_it_may() {
    let text = std::fs::read_to_string(unit()).unwrap();
    let allowed = allowed_calls(&text);
    for (call, _) in REFUSED_AND_HARMLESS {
        assert!(
            !allowed.contains(*call),
            "{call} is allowed now: drop it from the list"
        );
    }
    let sandbox = Sandbox::new();
    let roots = writable(&text, &sandbox);
    let value = |k: &str| systemd_unit::values(&text, k);
    let state = PathBuf::from(sandbox.map(value("WorkingDirectory")[0]));
    let traces = sandbox.folder("/var/lib/trace", true);
    let port = free_port();
    let demo = std::fs::read_to_string(repo_root().join("pipelines/demo.toml")).unwrap();
    let asset = format!("\"{}\"", asset("vtest.avi").display());
    let demo = demo.replace("\"assets/vtest.avi\"", &asset);
    let demo = demo.replace("127.0.0.1:9464", &format!("127.0.0.1:{port}"));
    assert!(demo.contains(&asset) && demo.contains(&port.to_string()));
    write(&sandbox.folder("/etc/vidflow", false), "demo.toml", &demo);
    let notify = std::os::unix::net::UnixDatagram::bind(sandbox.root.join("notify")).unwrap();
    std::fs::set_permissions(
        sandbox.root.join("notify"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    notify.set_nonblocking(true).unwrap();

    // Without PR_SET_MDWE: the demo's OpenVINO needs the drop-in MemoryDenyWriteExecute=no
    // (docs/guides/security.md); the other test runs the engines and codecs under both.
    // strace's own calls, which the unit refuses: vidflow inherits them, and the census below
    // finds it never makes them.
    let mut calls = allowed.clone();
    calls.extend(["ptrace", "process_vm_readv", "setreuid"].map(String::from));
    let program = systemd_unit::allow_filter(&calls);
    let trace = traces.join("trace.txt");
    let mut command = Command::new("strace");
    command
        .args(["-f", "-qq", "-y", "-s", "4096", "-o"])
        .arg(&trace)
        .arg("--");
    command.args(
        value("ExecStart")[0]
            .split_whitespace()
            .map(|w| sandbox.map(w)),
    );
    // What systemd gives a service: its PATH, a dynamic user's home (/), the directories it
    // made, the notify socket, and the unit's own Environment= lines.
    command
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/")
        .env("STATE_DIRECTORY", &state)
        .env("NOTIFY_SOCKET", sandbox.root.join("notify"));
    for cache in value("CacheDirectory") {
        command.env(
            "CACHE_DIRECTORY",
            sandbox.map(&format!("/var/cache/{cache}")),
        );
    }
    for line in value("Environment") {
        let (key, v) = line.split_once('=').unwrap();
        command.env(key, sandbox.map(v));
    }
    // SAFETY: only setgroups, setgid, setuid and prctl, all async-signal-safe, run between
    // fork and exec; the program was built before the fork and outlives the call.
    unsafe {
        command.pre_exec(move || {
            if libc::geteuid() == 0
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(SERVICE_UID) != 0
                    || libc::setuid(SERVICE_UID) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            systemd_unit::install_filter(&program)
        });
    }
    let mut run = spawn_command_to(&state, command, &traces.join("out"), &traces.join("err"));
    let pid = child_of(&mut run);
    let _kill = KillOnDrop(pid);
    let mut message = [0u8; 4096];
    poll("READY=1", RUN_DEADLINE, Duration::from_millis(50), || {
        assert!(run.is_running(), "it ended: {}", run.stderr());
        let n = notify.recv(&mut message).ok()?;
        String::from_utf8_lossy(&message[..n])
            .contains("READY=1")
            .then_some(())
    });
    http_client::wait_until("the page", RUN_DEADLINE, || {
        http_client::get(port, "/api/health").filter(|(status, _)| *status == 200)
    });
    // SAFETY: kill with a pid of our own grandchild, still running (strace waits for it).
    let signal = |signal| unsafe { libc::kill(pid, signal) };
    assert_eq!(
        signal(libc::SIGHUP),
        0,
        "{}",
        std::io::Error::last_os_error()
    );
    run.wait_for_stderr("reload: nothing changed that runs", RUN_DEADLINE);
    assert_eq!(
        signal(libc::SIGTERM),
        0,
        "{}",
        std::io::Error::last_os_error()
    );
    let finished = run.finish(RUN_DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);

    // It did its work: frames through the detector, the tracker and both sinks.
    let stats = read_json(&state.join("demo.stats.json"));
    assert!(stats["frames_processed"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["frames_failed"], 0, "{stats}");
    assert!(!jsonl(&state.join("out/events.jsonl")).is_empty());
    assert!(state.join("out/annotated.mp4").is_file());
    // Nothing it needed was refused: no error of a refusal (EPERM, EACCES, EROFS) in its log,
    // nor GLib's criticals. (Warnings of load, such as a slow end of stream under strace on a
    // busy machine, are not the sandbox's.)
    let refusals = [
        "not permitted",
        "ermission denied",
        "ead-only file system",
        "os error 1)",
        "os error 13)",
        "os error 30)",
        "CRITICAL",
    ];
    let complaints: Vec<&str> = finished
        .stderr
        .lines()
        .filter(|l| refusals.iter().any(|r| l.contains(r)))
        .collect();
    assert!(complaints.is_empty(), "{complaints:#?}");

    let census = systemd_unit::read_trace(&trace, &state);
    let harmless: BTreeSet<&str> = REFUSED_AND_HARMLESS.iter().map(|(c, _)| *c).collect();
    let refused: Vec<(&String, &usize)> = census
        .calls
        .iter()
        .filter(|(call, _)| !allowed.contains(*call) && !harmless.contains(call.as_str()))
        .collect();
    assert!(
        refused.is_empty(),
        "calls the unit refuses (times made): {refused:?}"
    );
    let outside: Vec<&(String, PathBuf)> = census
        .writes
        .iter()
        .filter(|(_, path)| !roots.iter().any(|root| path.starts_with(root)))
        .collect();
    assert!(
        outside.is_empty(),
        "written outside {roots:?}: {outside:#?}"
    );
    // GStreamer's plugin registry, kept for the next start, in the unit's cache directory.
    let cache = sandbox.map(&format!("/var/cache/{}", value("CacheDirectory")[0]));
    assert!(
        Path::new(&cache)
            .join(".cache/gstreamer-1.0/registry.x86_64.bin")
            .is_file()
    );
}
