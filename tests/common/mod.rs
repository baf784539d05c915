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
use std::sync::{Arc, Mutex, Once};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer::prelude::*;

pub fn gst_init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| gst::init().unwrap());
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
    gst_init();
    let pipeline = gst::parse::launch(&format!(
        "filesrc location={} ! decodebin ! videoconvert ! appsink name=out sync=false",
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
    pipeline.set_state(gst::State::Playing).unwrap();
    let mut n = 0;
    while sink.pull_sample().is_ok() {
        n += 1;
    }
    let bus = pipeline.bus().unwrap();
    let error = bus.pop_filtered(&[gst::MessageType::Error]);
    pipeline.set_state(gst::State::Null).unwrap();
    if let Some(msg) = error {
        if let gst::MessageView::Error(e) = msg.view() {
            panic!("{} does not play: {}", path.display(), e.error());
        }
    }
    n
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
    // Numbered after what the directory holds, so that several runs in one directory keep
    // their own output.
    let first = std::fs::read_dir(dir).unwrap().count();
    let n = (first..)
        .find(|n| !dir.join(format!("stderr-{n}.txt")).exists())
        .unwrap();
    let stdout = dir.join(format!("stdout-{n}.txt"));
    let stderr = dir.join(format!("stderr-{n}.txt"));
    let child = vidflow()
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    Running {
        child,
        stdout,
        stderr,
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
    let start = Instant::now();
    while start.elapsed() < deadline {
        if std::fs::read_to_string(path).is_ok_and(|s| s.lines().count() >= n) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{} never reached {n} lines", path.display());
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

// ---- steps that record how the executor runs them ----

use opencv::core::Mat;
use vidflow::config::{ExecutorConfig, OnStepError, Ref, StepConfig};
use vidflow::frame::Frame;
use vidflow::steps::{Step, StepError, StepInput, StepKind, StepOutput};
use vidflow::value::Value;

mod kinds;
pub use kinds::{FROM_FRAME, ONE, STATEFUL, TWO};

/// The start or the end of one execution of a step: which step, which frame, on which thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub step: String,
    /// The frame's source.
    pub source: String,
    pub seq: u64,
    pub thread: ThreadId,
    pub thread_name: String,
    /// The thread's entry in /proc (`/proc/PID/task/TID`): gone once the thread has exited.
    pub os_thread: String,
    pub end: bool,
}

/// Only the starts of executions (one per run of a step).
pub fn starts(log: &Log) -> Vec<Execution> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|e| !e.end)
        .cloned()
        .collect()
}

/// Position in the log of the start (or end) of `step` on frame `seq`.
pub fn position(log: &[Execution], step: &str, seq: u64, end: bool) -> Option<usize> {
    log.iter()
        .position(|e| e.step == step && e.seq == seq && e.end == end)
}

pub type Log = Arc<Mutex<Vec<Execution>>>;

/// What a probe does on a frame, given its own name and the frame's number.
#[derive(Debug, Clone, Copy)]
pub struct Behaviour {
    /// How long it works (sleeps).
    pub work: fn(&str, u64) -> Duration,
    pub fail: fn(&str, u64) -> bool,
    pub panic: fn(&str, u64) -> bool,
    /// Ends its branch (dependents skipped) instead of producing a value.
    pub end_branch: fn(&str, u64) -> bool,
}

pub fn no_work(_: &str, _: u64) -> Duration {
    Duration::ZERO
}
pub fn never(_: &str, _: u64) -> bool {
    false
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            work: no_work,
            fail: never,
            panic: never,
            end_branch: never,
        }
    }
}

/// A step that logs the start and end of each run, behaves as told, and outputs an empty
/// detections value.
#[derive(Debug)]
pub struct Probe {
    pub name: String,
    pub log: Log,
    pub behaviour: Behaviour,
}

impl Step for Probe {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let seq = input.frame.seq;
        let t = std::thread::current();
        // The link reads "PID/task/TID", relative to /proc.
        let os_thread = std::fs::read_link("/proc/thread-self")
            .map(|p| format!("/proc/{}", p.display()))
            .unwrap_or_default();
        let record = |end| Execution {
            step: self.name.clone(),
            source: input.frame.source.to_string(),
            seq,
            thread: t.id(),
            thread_name: t.name().unwrap_or_default().to_owned(),
            os_thread: os_thread.clone(),
            end,
        };
        let b = self.behaviour;
        let name = self.name.as_str();
        self.log.lock().unwrap().push(record(false));
        let work = (b.work)(name, seq);
        if !work.is_zero() {
            std::thread::sleep(work);
        }
        self.log.lock().unwrap().push(record(true));
        if (b.panic)(name, seq) {
            panic!("probe {name} panics on frame {seq}");
        }
        if (b.fail)(name, seq) {
            return Err(StepError::Other(format!(
                "probe {name} fails on frame {seq}"
            )));
        }
        if (b.end_branch)(name, seq) {
            return Ok(StepOutput::EndBranch);
        }
        Ok(StepOutput::Values(vec![Value::Detections(Arc::from(
            Vec::new(),
        ))]))
    }
}

/// Builds step configs from `(name, kind, inputs)` where inputs index earlier entries
/// (`None` = `$frame`).
pub fn steps(log: &Log, spec: &[(&str, &'static StepKind, &[Option<usize>])]) -> Vec<StepConfig> {
    steps_with(log, spec, Behaviour::default())
}

pub fn steps_with(
    log: &Log,
    spec: &[(&str, &'static StepKind, &[Option<usize>])],
    behaviour: Behaviour,
) -> Vec<StepConfig> {
    spec.iter()
        .map(|(name, kind, inputs)| {
            let probe = Probe {
                name: (*name).to_owned(),
                log: log.clone(),
                behaviour,
            };
            step_config(name, kind, Arc::new(probe), inputs)
        })
        .collect()
}

/// A chain of `n` probes: p0 reads the frame, each next one the previous.
pub fn chain(log: &Log, n: usize) -> Vec<StepConfig> {
    chain_with(log, n, Behaviour::default())
}

pub fn chain_with(log: &Log, n: usize, behaviour: Behaviour) -> Vec<StepConfig> {
    let names: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
    let inputs: Vec<[Option<usize>; 1]> = (0..n)
        .map(|i| [if i == 0 { None } else { Some(i - 1) }])
        .collect();
    let spec: Vec<(&str, &'static StepKind, &[Option<usize>])> = (0..n)
        .map(|i| {
            let kind: &'static StepKind = if i == 0 { &FROM_FRAME } else { &ONE };
            (names[i].as_str(), kind, &inputs[i][..])
        })
        .collect();
    steps_with(log, &spec, behaviour)
}

pub fn config(workers: usize, max_in_flight: usize) -> ExecutorConfig {
    ExecutorConfig {
        workers,
        max_in_flight,
        on_step_error: OnStepError::SkipFrame,
        opencv_threads: 1,
    }
}

/// A closed channel holding `n` frames of source `cam`, numbered from 0.
pub fn frames(n: u64) -> crossbeam_channel::Receiver<Frame> {
    frames_of("cam", n)
}

/// A closed channel holding `n` frames of `source`, numbered from 0 (all sharing one name
/// allocation, as a source's frames do).
pub fn frames_of(source: &str, n: u64) -> crossbeam_channel::Receiver<Frame> {
    let source: Arc<str> = source.into();
    let (tx, rx) = crossbeam_channel::unbounded();
    for seq in 0..n {
        tx.send(Frame::from_mat(source.clone(), seq, None, Mat::default()))
            .unwrap();
    }
    rx
}

/// The config of one step built in code.
pub fn step_config(
    name: &str,
    kind: &'static StepKind,
    step: Arc<dyn Step>,
    inputs: &[Option<usize>],
) -> StepConfig {
    StepConfig {
        name: name.into(),
        kind,
        step,
        inputs: inputs
            .iter()
            .map(|i| match i {
                None => Ref::Frame,
                Some(step) => Ref::Step {
                    step: *step,
                    output: 0,
                },
            })
            .collect(),
    }
}

/// An empty detections value, what probes output.
pub fn empty_output() -> StepOutput {
    StepOutput::Values(vec![Value::Detections(Arc::from(Vec::new()))])
}
