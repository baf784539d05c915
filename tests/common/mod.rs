//! Helpers shared by the integration tests: real GStreamer clips, the real binary, and small
//! steps that record how the executor ran them. Each test file uses only some of them.
#![allow(
    dead_code,
    unused_imports,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer::prelude::*;

pub fn gst_init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| gst::init().unwrap());
}

/// x265enc makes the H.265 streams of the tests that call this. It is in Debian's
/// gstreamer1.0-plugins-bad, which scripts/install-deps installs: without it those tests fail
/// and say why (one that passed without any H.265 would prove nothing).
pub fn require_x265enc() {
    gst_init();
    assert!(
        gst::ElementFactory::find("x265enc").is_some(),
        "no x265enc, so no H.265 stream: install gstreamer1.0-plugins-bad (scripts/install-deps)"
    );
}

/// A port that was free a moment ago: for a server a test starts, or for an address nobody
/// listens on. Taken below the kernel's ephemeral range (`ip_local_port_range`, 32768 and up
/// by default), which is where a port bound to 0 comes from and where every outgoing
/// connection of the machine takes its local port: a port of that range, released, can be
/// taken by any connection before the test's server binds it. Below it, only another test
/// that picks the same number can; each process starts at a place of its own (its pid) and
/// never gives a number twice.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let start = (std::process::id().wrapping_mul(7_919)) % SPAN;
    let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port from {LOW} to {}", LOW + SPAN);
}

/// Runs a gst-launch description to end of stream.
pub fn run_to_eos(description: &str) {
    gst_init();
    let pipeline = gst::parse::launch(description).unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    let bus = pipeline.bus().unwrap();
    let msg = bus
        .timed_pop_filtered(
            gst::ClockTime::from_seconds(120),
            &[gst::MessageType::Eos, gst::MessageType::Error],
        )
        .expect("pipeline did not finish");
    pipeline.set_state(gst::State::Null).unwrap();
    if let gst::MessageView::Error(e) = msg.view() {
        panic!("{description}: {} ({:?})", e.error(), e.debug());
    }
}

/// Encodes `frames` frames of a test pattern as H.264 (4:2:0, as cameras send) in MP4.
pub fn make_h264_mp4(path: &Path, frames: u32, width: u32, height: u32) {
    run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers={frames} ! \
         video/x-raw,width={width},height={height},framerate=30/1 ! videoconvert ! \
         video/x-raw,format=I420 ! \
         x264enc speed-preset=ultrafast ! h264parse ! mp4mux ! filesink location={}",
        path.display()
    ));
}

/// Decodes a video file completely and counts its frames (fails if it does not play).
pub fn count_video_frames(path: &Path) -> u64 {
    frames_and_sizes(path).0
}

/// A pipeline decoding the video file at `path` into an appsink through `convert` (e.g.
/// `"video/x-raw,format=I420"`; empty for what videoconvert gives), not yet playing.
pub fn file_decoder(path: &Path, convert: &str) -> (gst::Pipeline, gstreamer_app::AppSink) {
    gst_init();
    let caps = if convert.is_empty() {
        String::new()
    } else {
        format!("{convert} ! ")
    };
    let pipeline = gst::parse::launch(&format!(
        "filesrc location=\"{}\" ! decodebin ! videoconvert ! {caps}appsink name=out sync=false",
        path.display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let sink = pipeline
        .by_name("out")
        .unwrap()
        .downcast::<gstreamer_app::AppSink>()
        .unwrap();
    (pipeline, sink)
}

/// The SHA-256 of each decoded frame of a video file, in order (panics if it does not play).
pub fn frame_hashes(path: &Path) -> Vec<[u8; 32]> {
    let (pipeline, sink) = file_decoder(path, "video/x-raw,format=I420");
    pipeline.set_state(gst::State::Playing).unwrap();
    let mut hashes = Vec::new();
    // A file that does not play may give neither a frame nor an error: bounded.
    while let Some(sample) = sink.try_pull_sample(gst::ClockTime::from_seconds(10)) {
        let map = sample.buffer().unwrap().map_readable().unwrap();
        hashes.push(<sha2::Sha256 as sha2::Digest>::digest(map.as_slice()).into());
    }
    assert!(sink.is_eos(), "{} does not play to its end", path.display());
    let error = pipeline
        .bus()
        .unwrap()
        .pop_filtered(&[gst::MessageType::Error]);
    pipeline.set_state(gst::State::Null).unwrap();
    if let Some(msg) = error
        && let gst::MessageView::Error(e) = msg.view()
    {
        panic!("{} does not play: {}", path.display(), e.error());
    }
    hashes
}

/// Decodes a video file completely: its frame count, and the sizes (width, height) its frames
/// came in, in order of appearance (fails if it does not play).
pub fn frames_and_sizes(path: &Path) -> (u64, Vec<(i32, i32)>) {
    let (pipeline, sink) = file_decoder(path, "");
    pipeline.set_state(gst::State::Playing).unwrap();
    let (mut n, mut sizes) = (0, Vec::<(i32, i32)>::new());
    while let Ok(sample) = sink.pull_sample() {
        n += 1;
        let caps = sample.caps().and_then(|c| c.structure(0));
        let size = caps.map(|s| (s.get("width").unwrap(), s.get("height").unwrap()));
        if let Some(size) = size
            && sizes.last() != Some(&size)
        {
            sizes.push(size);
        }
    }
    let bus = pipeline.bus().unwrap();
    let error = bus.pop_filtered(&[gst::MessageType::Error]);
    pipeline.set_state(gst::State::Null).unwrap();
    if let Some(msg) = error
        && let gst::MessageView::Error(e) = msg.view()
    {
        panic!("{} does not play: {}", path.display(), e.error());
    }
    (n, sizes)
}

/// The segment files of a `video_file` path without `{start}`: the path itself, then
/// `NAME.1.EXT`, `NAME.2.EXT`, ... as long as they exist, in order.
pub fn segments(first: &Path) -> Vec<PathBuf> {
    let stem = first.file_stem().unwrap().to_string_lossy().into_owned();
    let ext = first.extension().unwrap().to_string_lossy().into_owned();
    let mut out = Vec::new();
    for n in 0.. {
        let path = if n == 0 {
            first.to_owned()
        } else {
            first.with_file_name(format!("{stem}.{n}.{ext}"))
        };
        if !path.exists() {
            break;
        }
        out.push(path);
    }
    out
}

/// Frames in every segment of `first` (see [`segments`]), each decoded with GStreamer.
pub fn count_segment_frames(first: &Path) -> u64 {
    segments(first).iter().map(|p| count_video_frames(p)).sum()
}

/// What the library logs in this test process, from every thread, as plain text: the first
/// call installs the process's subscriber (at `info`); later ones share its buffer.
pub fn captured_logs() -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    use std::sync::{Arc, Mutex, OnceLock};
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || LogWriter(writer.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        logs
    })
    .clone()
}

struct LogWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn vidflow() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vidflow"));
    c.env("VIDFLOW_LOG", "info");
    c
}

/// A running `vidflow` whose stdout and stderr go to files in its directory, so that both can
/// be read while it runs and searched afterwards.
pub struct Running {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// How a `vidflow` process ended.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Starts `vidflow ARGS...` in `dir`, with `env` added to its environment.
pub fn spawn(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Running {
    let mut command = vidflow();
    command.args(args).envs(env.iter().copied());
    spawn_command(dir, command)
}

/// Starts `command` (made by [`vidflow`], then given its arguments) in `dir`.
pub fn spawn_command(dir: &Path, command: Command) -> Running {
    // Numbered after what the directory holds, so that several runs in one directory keep
    // their own output.
    let first = std::fs::read_dir(dir).unwrap().count();
    let n = (first..)
        .find(|n| !dir.join(format!("stderr-{n}.txt")).exists())
        .unwrap();
    let stdout = dir.join(format!("stdout-{n}.txt"));
    let stderr = dir.join(format!("stderr-{n}.txt"));
    spawn_command_to(dir, command, &stdout, &stderr)
}

/// Starts `command` in `dir` with stdout and stderr to these files, emptied first (not made
/// anew: a test may have named the stderr file to the process already, as `JOURNAL_STREAM`).
pub fn spawn_command_to(dir: &Path, mut command: Command, stdout: &Path, stderr: &Path) -> Running {
    let open = |path: &Path| {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap()
    };
    let child = command
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(open(stdout))
        .stderr(open(stderr))
        .spawn()
        .unwrap();
    Running {
        child,
        stdout: stdout.to_owned(),
        stderr: stderr.to_owned(),
    }
}

/// Starts `vidflow run PIPELINE EXTRA...` in `dir`.
pub fn spawn_run(pipeline: &Path, extra: &[&str], dir: &Path) -> Running {
    let pipeline = pipeline.to_str().unwrap();
    let args: Vec<&str> = ["run", pipeline]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    spawn(dir, &args, &[])
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// What it has written to stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// What it has written to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until stderr contains `text` (a hang is a failure, not a slow machine).
    pub fn wait_for_stderr(&self, text: &str, deadline: Duration) {
        self.wait_for_stderr_times(text, 1, deadline);
    }

    /// Waits until `text` shows in stderr `times` times.
    pub fn wait_for_stderr_times(&self, text: &str, times: usize, deadline: Duration) {
        let start = Instant::now();
        while start.elapsed() < deadline {
            if self.stderr().matches(text).count() >= times {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "stderr never showed {text:?} {times} times:\n{}",
            self.stderr()
        );
    }

    /// Sends a real signal.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Sends SIGTERM and checks the run ends with success within `deadline`.
    pub fn terminate_cleanly(self, deadline: Duration) {
        self.signal("TERM");
        let finished = self.finish(deadline);
        assert!(finished.status.success(), "{}", finished.stderr);
    }

    /// Waits for the exit; past `deadline` it kills the process and fails.
    pub fn finish(mut self, deadline: Duration) -> Finished {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "vidflow did not exit within {deadline:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Finished {
            status,
            stdout: std::fs::read_to_string(&self.stdout).unwrap(),
            stderr: std::fs::read_to_string(&self.stderr).unwrap(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until `path` holds at least `n` lines.
pub fn wait_for_lines(path: &Path, n: usize, deadline: Duration) {
    let what = format!("{} to reach {n} lines", path.display());
    poll(&what, deadline, Duration::from_millis(50), || {
        std::fs::read_to_string(path)
            .is_ok_and(|s| s.lines().count() >= n)
            .then_some(())
    });
}

/// A server or broker away mid-run and back: `away` takes `server` down; once the sink has
/// said `{what} unreachable` and `frames` more frames were written to `lines` (they wait in
/// the sink's backlog or spool), `back` brings it up; returns once the sink said `{what}
/// reachable again`, with the lines written when it was said away and when back. Each wait is
/// bounded by `deadline`.
pub fn away_and_back<S>(
    running: &Running,
    lines: &Path,
    (what, frames, deadline): (&str, usize, Duration),
    server: &mut S,
    (away, back): (impl FnOnce(&mut S), impl FnOnce(&mut S)),
) -> (usize, usize) {
    away(server);
    running.wait_for_stderr(&format!("{what} unreachable"), deadline);
    let at_away = jsonl(lines).len();
    wait_for_lines(lines, at_away + frames, deadline);
    back(server);
    running.wait_for_stderr(&format!("{what} reachable again"), deadline);
    (at_away, jsonl(lines).len())
}

/// A run whose `kind` sink could not deliver by its flush deadline: it kept the stop deadline,
/// named the loss, and did not exit cleanly.
pub fn assert_loss_counted_within_the_stop(out: &Finished, kind: &str) {
    let stderr = &out.stderr;
    assert!(
        stderr.contains(&format!("{kind}: messages lost:"))
            && stderr.contains("not delivered by the flush deadline"),
        "{stderr}"
    );
    assert!(
        !out.status.success(),
        "a loss is not a clean exit: {stderr}"
    );
    assert!(!stderr.contains("stop deadline"), "{stderr}");
}

/// Stops the run with SIGTERM once 15 more frames are written to `lines`; it must end cleanly
/// (each wait bounded by `deadline`).
pub fn stop_after_more_frames(running: Running, lines: &Path, deadline: Duration) -> Finished {
    let now = jsonl(lines).len();
    wait_for_lines(lines, now + 15, deadline);
    running.signal("TERM");
    let out = running.finish(deadline);
    assert!(out.status.success(), "{}", out.stderr);
    out
}

/// Starts a server `program` with `args`, stderr appended to `log`, and waits until it accepts
/// connections on 127.0.0.1:`port` (the tests' brokers and streaming servers).
pub fn start_server(program: &str, args: &[&std::ffi::OsStr], log: &Path, port: u16) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}; run scripts/install-deps"));
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{program} did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// A TCP port that accepts connections and never says a word: a server that never answers.
pub struct Silent {
    pub port: u16,
    _listener: std::net::TcpListener,
}

impl Silent {
    pub fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        Self {
            port: listener.local_addr().unwrap().port(),
            _listener: listener,
        }
    }
}

/// Runs a live camera into a stream sink of `kind` whose server refuses its `login` (the
/// sink's url and credential keys), with debug logs, until it says `{kind} server unreachable`
/// and 10 frames are written, then stops it. Checks what every such run must show: the
/// server's refusal (`refusal`), no `secret`, and a failed exit (the frames are lost).
pub fn check_refused_login(dir: &Path, kind: &str, login: &str, refusal: &str, secret: &str) {
    let text = format!(
        r#"
[sources.cam]
uri = "test://ball?width=160&height=120&fps=30"

[sinks.lines]
kind = "jsonl"
path = "out/lines.jsonl"

[sinks.bus]
kind = "{kind}"
{login}
flush_timeout_ms = 300
spool_mb = 0
"#
    );
    let file = write(dir, "refused.toml", &text);
    let mut command = vidflow();
    command
        .args(["run", file.to_str().unwrap()])
        .env("VIDFLOW_LOG", "debug");
    let running = spawn_command(dir, command);
    running.wait_for_stderr(
        &format!("{kind} server unreachable"),
        Duration::from_secs(120),
    );
    let lines = dir.join("out/lines.jsonl");
    wait_for_lines(&lines, 10, Duration::from_secs(120));
    running.signal("TERM");
    let out = running.finish(Duration::from_secs(120));
    let stderr = &out.stderr;
    assert!(stderr.contains(refusal), "{login}: {stderr}");
    assert!(!stderr.contains(secret), "{login}: {stderr}");
    assert!(!out.status.success(), "{login}: {stderr}");
    std::fs::remove_file(lines).unwrap();
}

pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fetched asset (scripts/fetch-assets), or a clear failure saying how to get it.
pub fn asset(name: &str) -> PathBuf {
    let p = repo_root().join("assets").join(name);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-assets (make test does)",
        p.display()
    );
    p
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

pub mod browser;
pub mod http;
mod kinds;
pub mod mp4;
pub mod mqtt;
pub mod nats;
mod probes;
pub mod redis;
pub mod rtsp;
pub mod rtsp_files;
pub mod shapes;
pub mod systemd_unit;
pub mod vision;
pub mod wait;
pub use probes::*;
pub use wait::{poll, wait_until};

/// The steps that find `test://ball` (320 x 240) by its motion, track it and count it across
/// the middle line (`$steps.crossing`, line `middle`), for a `format!` pipeline.
pub const BALL_CROSSINGS: &str = r#"[steps.moving]
kind = "motion"
image = "$frame"
class = "ball"
min_area = 50.0

[steps.tracks]
kind = "tracker"
detections = "$steps.moving.detections"

[steps.crossing]
kind = "line_counter"
tracks = "$steps.tracks.tracks"
line = [[160, 240], [160, 0]]
name = "middle"
"#;

/// A pipeline of `sources` (name, URI) through `motion`, with a `jsonl` sink of its detections
/// at `out/lines.jsonl` and the `sinks` given: what the network sinks' tests compare against.
pub fn motion_pipeline(sources: &[(&str, &str)], sinks: &str) -> String {
    let mut text = String::new();
    for (name, uri) in sources {
        text += &format!("[sources.{name}]\nuri = \"{uri}\"\nqueue = 60\n\n");
    }
    text + &format!(
        r#"
[executor]
workers = 2
max_in_flight = 2

[steps.motion]
kind = "motion"
image = "$frame"

[sinks.lines]
kind = "jsonl"
path = "out/lines.jsonl"
include = ["$steps.motion.detections"]
{sinks}
"#
    )
}

/// The nice value of each of `pid`'s threads, by the name /proc shows (15 bytes of it).
#[cfg(target_os = "linux")]
pub fn nice_by_thread(pid: u32) -> Vec<(String, i64)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| {
            let task = task.ok()?.path();
            let name = std::fs::read_to_string(task.join("comm")).ok()?;
            let stat = std::fs::read_to_string(task.join("stat")).ok()?;
            // Field 19 of stat(5); the name, field 2, is in parentheses and may hold spaces.
            let (_, fields) = stat.rsplit_once(')')?;
            let nice = fields.split_whitespace().nth(16)?.parse().ok()?;
            Some((name.trim().to_owned(), nice))
        })
        .collect()
}

/// Raises this process's soft `RLIMIT_NOFILE` to `needed` descriptors if it is lower (the
/// `vidflow` processes a test starts inherit it), for a test that holds that many at once (a
/// thousand clients): the usual soft limit, 1024, or a lower one (`ulimit -Sn 256`) would fail
/// it with "too many open files", a fault of the machine's limit rather than vidflow's. The
/// hard limit bounds it: when it is below `needed`, nothing is raised, the reason is printed
/// and false returned, and the test skips itself (returns).
pub fn raise_fd_limit(needed: u64, test: &str) -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own and pass by pointer.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) };
    assert_eq!(read, 0);
    if limit.rlim_cur >= needed {
        return true;
    }
    if limit.rlim_max < needed {
        eprintln!(
            "SKIPPED {test}: it holds {needed} file descriptors at once and the hard limit is {} \
             (raise it: `ulimit -Hn {needed}` as root, or LimitNOFILE= in a unit)",
            limit.rlim_max
        );
        return false;
    }
    limit.rlim_cur = needed;
    // SAFETY: setrlimit reads the struct we own and pass by pointer.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    true
}
