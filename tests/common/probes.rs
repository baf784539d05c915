//! Steps that record how the executor runs them, and the small graphs, configs and frame
//! channels the executor tests build in code, and an executor hosted on a pool as a host would.

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use opencv::core::Mat;
use vidflow::config::{ExecutorConfig, OnStepError, StepConfig};
use vidflow::frame::Frame;
use vidflow::spec::Ref;
use vidflow::steps::{Step, StepError, StepInput, StepKind, StepOutput};
use vidflow::value::Value;
use vidflow::workflow::{Executor, FrameResult, Graph, Pool};

pub use super::kinds::{FROM_FRAME, ONE, OPTIONAL, STATEFUL, TWO};

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
            .map(|i| {
                Some(match i {
                    None => Ref::Frame,
                    Some(step) => Ref::Step {
                        step: *step,
                        output: 0,
                    },
                })
            })
            .collect(),
        every: 1,
    }
}

/// An empty detections value, what probes output.
pub fn empty_output() -> StepOutput {
    StepOutput::Values(vec![Value::Detections(Arc::from(Vec::new()))])
}

// ---- hosting an executor in a test ----

/// How long a test waits for what must happen before it calls it a hang.
pub const HANG_GUARD: Duration = Duration::from_secs(20);

pub fn run_all(
    executor: &mut Executor,
    frames: crossbeam_channel::Receiver<Frame>,
) -> Vec<FrameResult> {
    let never = crossbeam_channel::never();
    let mut out = Vec::new();
    executor.run(&frames, &never, |r| out.push(r));
    out
}

/// An executor on a pool the test builds for it, as a host would.
pub fn hosted(steps: Vec<StepConfig>, workers: usize, max_in_flight: usize) -> (Pool, Executor) {
    let pool = Pool::new(workers).unwrap();
    let executor = Executor::new(
        Arc::new(Graph::new(steps)),
        pool.handle(),
        config(workers, max_in_flight),
    );
    (pool, executor)
}

/// Takes them down in the host's order: executor first, then the pool, joined.
pub fn finish(pool: Pool, executor: Executor) {
    drop(executor);
    pool.shutdown().unwrap();
}

pub fn seqs(results: &[FrameResult]) -> Vec<u64> {
    results.iter().map(|r| r.frame().seq).collect()
}

pub fn jittery(_: &str, seq: u64) -> Duration {
    // Deterministic but uneven: later frames often finish before earlier ones.
    Duration::from_micros((seq * 7919 % 13) * 150)
}

// ---- whether threads have settled ----

/// The calling thread's entry in /proc (`/proc/thread-self` -> `PID/task/TID`), as a path
/// under `/proc`.
pub fn os_thread() -> String {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    format!("/proc/{}", link.display())
}

/// The names of this process's threads but the calling one (a test's own thread is named
/// after the test, `module::name`, whose `::` would read as a GStreamer streaming thread's
/// `element:pad`).
pub fn other_threads() -> Vec<String> {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    let me = link.file_name().map(std::ffi::OsStr::to_owned);
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| {
            let path = t.ok()?.path();
            if path.file_name().map(std::ffi::OsStr::to_owned) == me {
                return None;
            }
            std::fs::read_to_string(path.join("comm")).ok()
        })
        .map(|n| n.trim().to_owned())
        .collect()
}

/// The OS threads of a pool's workers: one job per worker, each held until all have started,
/// so each runs on a different worker.
pub fn worker_os_threads(pool: &Pool) -> Vec<String> {
    let barrier = Arc::new(std::sync::Barrier::new(pool.size() + 1));
    let (tx, rx) = crossbeam_channel::unbounded();
    for _ in 0..pool.size() {
        let (barrier, tx) = (barrier.clone(), tx.clone());
        pool.handle().execute(Box::new(move || {
            tx.send(os_thread()).unwrap();
            barrier.wait();
        }));
    }
    barrier.wait();
    (0..pool.size()).map(|_| rx.recv().unwrap()).collect()
}

/// Whether a thread (its /proc entry) is asleep in the kernel (state `S`: blocked, as in a
/// futex wait), not running nor about to run.
pub fn asleep(os_thread: &str) -> bool {
    let stat = std::fs::read_to_string(format!("{os_thread}/stat")).unwrap();
    // The state follows the command name, which is in parentheses and may hold anything.
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('S'))
}

/// Waits until every thread of `threads` is asleep while `counters` stay the same across the
/// look: whatever they were doing is done and counted, and nothing is about to run. Returns
/// the counters then. Fails after [`HANG_GUARD`].
pub fn wait_until_asleep<T: PartialEq + std::fmt::Debug>(
    threads: &[String],
    counters: impl Fn() -> T,
) -> T {
    let start = std::time::Instant::now();
    loop {
        let before = counters();
        if threads.iter().all(|t| asleep(t)) && counters() == before {
            return before;
        }
        assert!(
            start.elapsed() < HANG_GUARD,
            "threads {threads:?} never all asleep (counters {before:?})"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---- stand-ins around real steps ----

/// A detector that finds what `script` says on each frame of each source, given the frame's
/// source and number.
#[derive(Debug)]
pub struct Scripted {
    pub script: fn(&str, u64) -> Vec<vidflow::value::Detection>,
}

impl Step for Scripted {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let found = (self.script)(&input.frame.source, input.frame.seq);
        Ok(StepOutput::Values(vec![Value::Detections(Arc::from(
            found,
        ))]))
    }
}

/// A real step with a fault injected: on the frames `when` picks (by source and number) it
/// runs the step, which updates its state, then panics, as a bug halfway through would. Its
/// state is the real step's: a reset reaches it.
#[derive(Debug)]
pub struct PanicsAfter {
    pub step: Arc<dyn Step>,
    pub when: fn(&str, u64) -> bool,
}

impl Step for PanicsAfter {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let out = self.step.run(input)?;
        if (self.when)(&input.frame.source, input.frame.seq) {
            panic!(
                "injected fault on frame {} of {}",
                input.frame.seq, input.frame.source
            );
        }
        Ok(out)
    }

    fn reset_source(&self, source: &str) -> bool {
        self.step.reset_source(source)
    }
}
