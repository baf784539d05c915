//! Orchestration overhead of the executor per frame, with trivial steps.
//!
//! Run:   cargo bench --bench executor
//!        (one group: `cargo bench --bench executor -- live/chain-50`; whole file ~2 min)
//! Test:  `cargo test --benches` runs every strategy once on every topology, without timing.
//!
//! Compares, in the same run, vidflow's persistent pool (one `Pool` and one `Executor` built
//! before measuring) against two baselines written only for this benchmark:
//! - pool-per-frame: a new `Pool` + `Executor` for every frame, shut down after it;
//! - pool-per-level: a naive engine that, for every frame and every topological level of the
//!   DAG, starts fresh worker threads (`std::thread::scope`, min(workers, level width) of them),
//!   runs that level's steps and joins them.
//!
//! Also a reference that is not a baseline: `direct`, the steps called in order on the calling
//! thread (no pool, no synchronisation), i.e. what the trivial steps themselves cost.
//!
//! Topologies: chain-10, chain-50, wide-50 (50 steps all reading `$frame`), diamond
//! (a -> b, c -> d). Steps are trivial: each returns one empty detections value at once.
//! Workers = 2 everywhere.
//!
//! Modes:
//! - back-to-back (`b2b/...`): frames continuously; time per frame. `vidflow-run` feeds batches
//!   of 1000 frames through `Executor::run` with max_in_flight = 2; `vidflow-process` and the
//!   baselines take one frame at a time. Frames are built and results dropped outside the timed
//!   region.
//! - live cadence (`live/...`): a frame every ~33 ms (the sleep is outside the timed region),
//!   so the workers are parked when it arrives; only submit-to-result of each frame is timed
//!   (for pool-per-frame: pool start + the frame; the shutdown after the result is not timed).
//!   Criterion sees only the timed part, so it warns that it cannot complete the samples in the
//!   target time: expected, the target is kept tiny so that each sample is one frame.
//!
//! Also measured, chain-50, both modes: inline continuation on vs off
//! (`Executor::without_inline_continuation`) and the coordinator running an idle workflow's
//! first steps itself on vs off (`Executor::without_coordinator_steps`); and, as the floor under
//! any hand-off at live cadence, a round trip to a parked thread through two channels.
//!
//! After the criterion groups a summary prints mean time per frame (p50 too for live) of the
//! measurement samples criterion took, and the ratios baseline / vidflow.
//!
//! `cargo bench --bench executor -- --sources` runs only the sources dimension instead (two
//! cameras through the real `motion` step: throughput and latency against one camera, see
//! `executor/sources.rs`).
#![allow(
    clippy::expect_used,
    reason = "a benchmark: a broken set-up should stop it"
)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, black_box};
use opencv::core::Mat;
use vidflow::config::{ExecutorConfig, OnStepError, StepConfig};
use vidflow::frame::Frame;
use vidflow::spec::Ref;
use vidflow::steps::{Step, StepError, StepInput, StepKind, StepOutput};
use vidflow::value::{Image, Value};
use vidflow::workflow::{Executor, FrameResult, Graph, Outcome, Pool};

const WORKERS: usize = 2;
const MAX_IN_FLIGHT: usize = 2;
/// Frames per `Executor::run` call (and per untimed frame-building chunk).
const BATCH: u64 = 1000;
/// Interval between frames at live cadence (~30 fps).
const CADENCE: Duration = Duration::from_millis(33);

#[path = "executor/sources.rs"]
mod sources;

#[path = "../tests/common/kinds.rs"]
#[allow(dead_code, unreachable_pub)]
mod kinds;
use kinds::{FROM_FRAME, ONE, TWO};

// ---- trivial steps ----

/// Returns one empty detections value at once.
#[derive(Debug)]
struct Trivial;

impl Step for Trivial {
    fn run(&self, _input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        Ok(StepOutput::Values(vec![Value::Detections(Arc::from(
            Vec::new(),
        ))]))
    }
}

// ---- topologies ----

/// Steps given as the indices of the steps they read (`None` = `$frame`).
fn steps(spec: &[Vec<Option<usize>>]) -> Vec<StepConfig> {
    spec.iter()
        .enumerate()
        .map(|(i, inputs)| {
            let kind: &'static StepKind = match inputs.as_slice() {
                [None] => &FROM_FRAME,
                [Some(_)] => &ONE,
                [Some(_), Some(_)] => &TWO,
                other => unreachable!("no kind for inputs {other:?}"),
            };
            StepConfig {
                name: format!("s{i}").into(),
                kind,
                step: Arc::new(Trivial),
                inputs: inputs
                    .iter()
                    .map(|input| {
                        Some(match input {
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
        })
        .collect()
}

fn chain(n: usize) -> Vec<StepConfig> {
    let spec: Vec<_> = (0..n)
        .map(|i| vec![if i == 0 { None } else { Some(i - 1) }])
        .collect();
    steps(&spec)
}

fn wide(n: usize) -> Vec<StepConfig> {
    steps(&vec![vec![None]; n])
}

fn diamond() -> Vec<StepConfig> {
    steps(&[
        vec![None],
        vec![Some(0)],
        vec![Some(0)],
        vec![Some(1), Some(2)],
    ])
}

fn topologies() -> Vec<(&'static str, Arc<Graph>)> {
    vec![
        ("chain-10", Arc::new(Graph::new(chain(10)))),
        ("chain-50", Arc::new(Graph::new(chain(50)))),
        ("wide-50", Arc::new(Graph::new(wide(50)))),
        ("diamond", Arc::new(Graph::new(diamond()))),
    ]
}

fn config() -> ExecutorConfig {
    ExecutorConfig {
        workers: WORKERS,
        max_in_flight: MAX_IN_FLIGHT,
        on_step_error: OnStepError::SkipFrame,
        opencv_threads: 1,
    }
}

fn frame(seq: u64) -> Frame {
    Frame::from_mat("bench".into(), seq, None, Mat::default())
}

fn frames(first: u64, n: u64) -> Vec<Frame> {
    (first..first + n).map(frame).collect()
}

// ---- strategies ----

/// vidflow's executor as it is, or with one of its shortcuts turned off to see what it saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Default,
    /// `Executor::without_inline_continuation`: every ready step goes through the pool's queue.
    NoInline,
    /// `Executor::without_coordinator_steps`: the coordinator never runs steps itself.
    NoCoordinatorSteps,
}

const VARIANTS: [Variant; 3] = [
    Variant::Default,
    Variant::NoInline,
    Variant::NoCoordinatorSteps,
];

impl Variant {
    fn suffix(self) -> &'static str {
        match self {
            Self::Default => "",
            Self::NoInline => "-no-inline",
            Self::NoCoordinatorSteps => "-no-coordinator-steps",
        }
    }
}

/// vidflow: a persistent pool and executor, built once.
#[derive(Debug)]
struct Persistent {
    executor: Executor,
    pool: Pool,
}

impl Persistent {
    fn new(graph: &Arc<Graph>, variant: Variant) -> Self {
        let pool = Pool::new(WORKERS).expect("pool");
        let executor = Executor::new(graph.clone(), pool.handle(), config());
        let executor = match variant {
            Variant::Default => executor,
            Variant::NoInline => executor.without_inline_continuation(),
            Variant::NoCoordinatorSteps => executor.without_coordinator_steps(),
        };
        Self { executor, pool }
    }

    /// Frames through one `Executor::run` (max_in_flight frames at once).
    fn run(&mut self, batch: Vec<Frame>, out: &mut Vec<FrameResult>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        for f in batch {
            tx.send(f).expect("open channel");
        }
        drop(tx);
        let never = crossbeam_channel::never();
        self.executor.run(&rx, &never, |r| out.push(r));
    }

    fn process(&mut self, frame: Frame) -> FrameResult {
        self.executor.process(frame)
    }

    fn close(self) {
        drop(self.executor);
        self.pool.shutdown().expect("pool shutdown");
    }
}

/// Baseline: a pool and an executor built for one frame, shut down after it. Returns the
/// result and the time from submitting the frame to its result (pool start included, shutdown
/// not).
fn pool_per_frame(graph: &Arc<Graph>, frame: Frame) -> (FrameResult, Duration) {
    let start = Instant::now();
    let pool = Pool::new(WORKERS).expect("pool");
    let mut executor = Executor::new(graph.clone(), pool.handle(), config());
    let result = executor.process(frame);
    let latency = start.elapsed();
    drop(executor);
    pool.shutdown().expect("pool shutdown");
    (result, latency)
}

/// Baseline: a naive engine that starts worker threads for every level of every frame.
#[derive(Debug)]
struct PerLevel {
    graph: Arc<Graph>,
    /// Nodes by topological level: a node's level is one more than its deepest input.
    levels: Vec<Vec<usize>>,
}

/// The outputs of every node for one frame (`None`: skipped or failed).
type LevelResult = Vec<OnceLock<Option<Vec<Value>>>>;

impl PerLevel {
    fn new(graph: &Arc<Graph>) -> Self {
        let mut level = vec![0usize; graph.len()];
        let mut levels: Vec<Vec<usize>> = Vec::new();
        for (i, node) in graph.nodes.iter().enumerate() {
            level[i] = node
                .inputs
                .iter()
                .flatten()
                .filter_map(|r| match r {
                    Ref::Step { step, .. } => Some(level[*step] + 1),
                    Ref::Frame => None,
                })
                .max()
                .unwrap_or(0);
            if levels.len() <= level[i] {
                levels.resize_with(level[i] + 1, Vec::new);
            }
            levels[level[i]].push(i);
        }
        Self {
            graph: graph.clone(),
            levels,
        }
    }

    fn process(&self, frame: Frame) -> LevelResult {
        let frame = Arc::new(frame);
        let slots: LevelResult = self.graph.nodes.iter().map(|_| OnceLock::new()).collect();
        for level in &self.levels {
            let next = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..WORKERS.min(level.len()) {
                    s.spawn(|| {
                        loop {
                            let k = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&node) = level.get(k) else {
                                return;
                            };
                            let out =
                                run_node(&self.graph, node, &frame, |i| slots[i].get()?.as_deref());
                            let _ = slots[node].set(out);
                        }
                    });
                }
            });
        }
        slots
    }
}

/// Runs one node with the outputs of the nodes before it (`None`: skipped or failed).
fn run_node<'a>(
    graph: &Graph,
    node: usize,
    frame: &Arc<Frame>,
    output_of: impl Fn(usize) -> Option<&'a [Value]>,
) -> Option<Vec<Value>> {
    let n = &graph.nodes[node];
    let values = n
        .inputs
        .iter()
        .map(|r| match *r {
            None => Some(None),
            Some(Ref::Frame) => Some(Some(Value::Image(Image::Frame(frame.clone())))),
            Some(Ref::Step { step, output }) => output_of(step)?.get(output).cloned().map(Some),
        })
        .collect::<Option<Vec<Option<Value>>>>()?;
    let input = StepInput {
        frame,
        values: &values,
    };
    match n.step.run(&input) {
        Ok(StepOutput::Values(v)) => Some(v),
        Ok(StepOutput::EndBranch) | Err(_) => None,
    }
}

/// Reference, not a baseline: every step called in order on the calling thread, no pool, no
/// synchronisation. What the steps themselves cost; vidflow minus this is its overhead.
fn direct(graph: &Graph, frame: Frame) -> Vec<Option<Vec<Value>>> {
    let frame = Arc::new(frame);
    let mut outputs: Vec<Option<Vec<Value>>> = Vec::with_capacity(graph.len());
    for node in 0..graph.len() {
        let out = run_node(graph, node, &frame, |i| outputs[i].as_deref());
        outputs.push(out);
    }
    outputs
}

// ---- what the summary is computed from ----

/// One call of a timed routine by criterion: `iters` frames in `elapsed`.
#[derive(Debug)]
struct Call {
    iters: u64,
    elapsed: Duration,
    /// Per-frame submit-to-result times (live cadence only).
    latencies: Vec<Duration>,
}

#[derive(Debug, Default)]
struct Record {
    /// Criterion's sample count for this benchmark: its last `samples` calls are the
    /// measurement (the ones before are warm-up).
    samples: usize,
    calls: Vec<Call>,
}

static RECORDS: Mutex<BTreeMap<String, Record>> = Mutex::new(BTreeMap::new());

fn record(id: &str, call: Call) {
    RECORDS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(id.to_owned())
        .or_default()
        .calls
        .push(call);
}

fn expect_samples(id: &str, samples: usize) {
    RECORDS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(id.to_owned())
        .or_default()
        .samples = samples;
}

/// Mean time per frame and, if latencies were kept, their median.
#[derive(Debug, Clone, Copy)]
struct Measured {
    mean: Duration,
    p50: Option<Duration>,
}

fn measured(id: &str) -> Option<Measured> {
    let records = RECORDS.lock().unwrap_or_else(PoisonError::into_inner);
    let r = records.get(id)?;
    let calls = &r.calls[r.calls.len().saturating_sub(r.samples)..];
    let iters: u64 = calls.iter().map(|c| c.iters).sum();
    if iters == 0 {
        return None;
    }
    let elapsed: Duration = calls.iter().map(|c| c.elapsed).sum();
    let mut latencies: Vec<Duration> = calls.iter().flat_map(|c| c.latencies.clone()).collect();
    latencies.sort_unstable();
    Some(Measured {
        mean: elapsed.div_f64(iters as f64),
        p50: latencies.get(latencies.len() / 2).copied(),
    })
}

// ---- timed loops ----

/// Back-to-back: `iters` frames handed to `f` in untimed-built chunks; only `f` is timed.
/// Results are dropped outside the timed region.
fn back_to_back<R>(id: &str, iters: u64, mut f: impl FnMut(Vec<Frame>, &mut Vec<R>)) -> Duration {
    let mut elapsed = Duration::ZERO;
    let mut done = 0;
    let mut out = Vec::with_capacity(BATCH as usize);
    while done < iters {
        let n = BATCH.min(iters - done);
        let batch = frames(done, n);
        let start = Instant::now();
        f(batch, &mut out);
        elapsed += start.elapsed();
        black_box(&out);
        out.clear();
        done += n;
    }
    record(
        id,
        Call {
            iters,
            elapsed,
            latencies: Vec::new(),
        },
    );
    elapsed
}

/// Live cadence: for each frame, sleep (untimed) so the workers park, then time what `f`
/// reports as the frame's submit-to-result time.
fn live(id: &str, iters: u64, mut f: impl FnMut(Frame) -> Duration) -> Duration {
    let mut latencies = Vec::with_capacity(iters as usize);
    for seq in 0..iters {
        std::thread::sleep(CADENCE);
        latencies.push(f(frame(seq)));
    }
    let elapsed = latencies.iter().sum();
    record(
        id,
        Call {
            iters,
            elapsed,
            latencies,
        },
    );
    elapsed
}

// ---- criterion groups ----

const B2B_SAMPLES: usize = 20;
const B2B_SLOW_SAMPLES: usize = 10;
const LIVE_SAMPLES: usize = 60;

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// vidflow back-to-back: batches through `run`, and one frame at a time through `process`.
fn b2b_persistent(group: &mut Group<'_>, group_name: &str, graph: &Arc<Graph>, variant: Variant) {
    let mut vidflow = Persistent::new(graph, variant);
    let run = format!("vidflow-run{}", variant.suffix());
    let run_id = format!("{group_name}/{run}");
    expect_samples(&run_id, B2B_SAMPLES);
    group.bench_function(run, |b| {
        b.iter_custom(|iters| back_to_back(&run_id, iters, |batch, out| vidflow.run(batch, out)));
    });
    let process = format!("vidflow-process{}", variant.suffix());
    let process_id = format!("{group_name}/{process}");
    expect_samples(&process_id, B2B_SAMPLES);
    group.bench_function(process, |b| {
        b.iter_custom(|iters| {
            back_to_back(&process_id, iters, |batch, out| {
                out.extend(batch.into_iter().map(|f| vidflow.process(f)));
            })
        });
    });
    vidflow.close();
}

/// vidflow at live cadence, one frame at a time through `process`.
fn live_persistent(group: &mut Group<'_>, group_name: &str, graph: &Arc<Graph>, variant: Variant) {
    let mut vidflow = Persistent::new(graph, variant);
    let name = format!("vidflow{}", variant.suffix());
    let id = format!("{group_name}/{name}");
    expect_samples(&id, LIVE_SAMPLES);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            live(&id, iters, |f| {
                let start = Instant::now();
                let r = vidflow.process(f);
                let latency = start.elapsed();
                black_box(r);
                latency
            })
        });
    });
    vidflow.close();
}

fn bench_back_to_back(c: &mut Criterion, name: &str, graph: &Arc<Graph>) {
    let group_name = format!("b2b/{name}");
    let mut group = c.benchmark_group(&group_name);
    group
        .sample_size(B2B_SAMPLES)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500));
    let id = |strategy: &str| format!("{group_name}/{strategy}");

    for variant in VARIANTS {
        if variant == Variant::Default || name == "chain-50" {
            b2b_persistent(&mut group, &group_name, graph, variant);
        }
    }

    let direct_id = id("direct");
    expect_samples(&direct_id, B2B_SAMPLES);
    group.bench_function("direct", |b| {
        b.iter_custom(|iters| {
            back_to_back(&direct_id, iters, |batch, out| {
                out.extend(batch.into_iter().map(|f| direct(graph, f)));
            })
        });
    });

    group
        .sample_size(B2B_SLOW_SAMPLES)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500));
    let per_frame_id = id("pool-per-frame");
    expect_samples(&per_frame_id, B2B_SLOW_SAMPLES);
    group.bench_function("pool-per-frame", |b| {
        b.iter_custom(|iters| {
            back_to_back(&per_frame_id, iters, |batch, out| {
                out.extend(batch.into_iter().map(|f| pool_per_frame(graph, f).0));
            })
        });
    });
    let engine = PerLevel::new(graph);
    let per_level_id = id("pool-per-level");
    expect_samples(&per_level_id, B2B_SLOW_SAMPLES);
    group.bench_function("pool-per-level", |b| {
        b.iter_custom(|iters| {
            back_to_back(&per_level_id, iters, |batch, out| {
                out.extend(batch.into_iter().map(|f| engine.process(f)));
            })
        });
    });
    group.finish();
}

fn bench_live(c: &mut Criterion, name: &str, graph: &Arc<Graph>) {
    let group_name = format!("live/{name}");
    let mut group = c.benchmark_group(&group_name);
    // Criterion sees only the timed part (microseconds) of frames that take ~33 ms: a tiny
    // warm-up and target with flat sampling keep it at one frame of warm-up and one frame per
    // sample.
    group
        .sample_size(LIVE_SAMPLES)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_nanos(1))
        .measurement_time(Duration::from_nanos(1));
    let id = |strategy: &str| format!("{group_name}/{strategy}");

    for variant in VARIANTS {
        if variant == Variant::Default || name == "chain-50" {
            live_persistent(&mut group, &group_name, graph, variant);
        }
    }

    let direct_id = id("direct");
    expect_samples(&direct_id, LIVE_SAMPLES);
    group.bench_function("direct", |b| {
        b.iter_custom(|iters| {
            live(&direct_id, iters, |f| {
                let start = Instant::now();
                let r = direct(graph, f);
                let latency = start.elapsed();
                black_box(r);
                latency
            })
        });
    });

    let per_frame_id = id("pool-per-frame");
    expect_samples(&per_frame_id, LIVE_SAMPLES);
    group.bench_function("pool-per-frame", |b| {
        b.iter_custom(|iters| live(&per_frame_id, iters, |f| pool_per_frame(graph, f).1));
    });
    let engine = PerLevel::new(graph);
    let per_level_id = id("pool-per-level");
    expect_samples(&per_level_id, LIVE_SAMPLES);
    group.bench_function("pool-per-level", |b| {
        b.iter_custom(|iters| {
            live(&per_level_id, iters, |f| {
                let start = Instant::now();
                let r = engine.process(f);
                let latency = start.elapsed();
                black_box(r);
                latency
            })
        });
    });
    group.finish();
}

/// The floor under any design that hands a frame to a parked thread: one round trip through
/// two crossbeam channels to a thread blocked in `recv`, at live cadence.
fn bench_handoff_floor(c: &mut Criterion) {
    let mut group = c.benchmark_group("live/handoff-floor");
    group
        .sample_size(LIVE_SAMPLES)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_nanos(1))
        .measurement_time(Duration::from_nanos(1));
    let (to_tx, to_rx) = crossbeam_channel::unbounded::<Frame>();
    let (back_tx, back_rx) = crossbeam_channel::unbounded::<Frame>();
    let echo = std::thread::spawn(move || {
        for f in to_rx {
            if back_tx.send(f).is_err() {
                return;
            }
        }
    });
    let id = "live/handoff-floor/parked-thread-round-trip";
    expect_samples(id, LIVE_SAMPLES);
    group.bench_function("parked-thread-round-trip", |b| {
        b.iter_custom(|iters| {
            live(id, iters, |f| {
                let start = Instant::now();
                to_tx.send(f).expect("echo thread");
                let f = back_rx.recv().expect("echo thread");
                let latency = start.elapsed();
                black_box(f);
                latency
            })
        });
    });
    group.finish();
    drop(to_tx);
    echo.join().expect("echo thread");
}

// ---- summary ----

fn us(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 10.0 {
        format!("{us:.2} µs")
    } else if us < 1000.0 {
        format!("{us:.1} µs")
    } else {
        format!("{us:.0} µs")
    }
}

impl Measured {
    /// The median where per-frame times were kept (live: robust to the outliers of a shared
    /// machine), else the mean.
    fn typical(self) -> Duration {
        self.p50.unwrap_or(self.mean)
    }
}

/// slow / fast, of their typical times.
fn ratio(slow: Option<Measured>, fast: Option<Measured>) -> String {
    match (slow, fast) {
        (Some(s), Some(f)) if !f.typical().is_zero() => {
            format!(
                "{:.1}x",
                s.typical().as_secs_f64() / f.typical().as_secs_f64()
            )
        }
        _ => "-".to_owned(),
    }
}

fn show(m: Option<Measured>) -> String {
    match m {
        None => "-".to_owned(),
        Some(Measured { mean, p50: None }) => us(mean),
        Some(Measured {
            mean,
            p50: Some(p50),
        }) => format!("{} (p50 {})", us(mean), us(p50)),
    }
}

fn target(label: &str, m: Option<Measured>, check: impl Fn(Measured) -> bool) -> String {
    match m {
        None => format!("{label}: not measured"),
        Some(m) => format!("{label}: {}", if check(m) { "met" } else { "MISSED" }),
    }
}

fn summary(names: &[&str]) {
    // Nothing ran (`--list`, or a filter that matched nothing): no summary.
    if RECORDS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
        .all(|r| r.calls.is_empty())
    {
        return;
    }
    println!();
    println!(
        "== executor overhead per frame (workers = {WORKERS}; from criterion's measurement \
         samples: mean, and p50 at live cadence; ratios of means back-to-back, of p50 live)"
    );
    for name in names {
        let b = |s: &str| measured(&format!("b2b/{name}/{s}"));
        let (run, process) = (b("vidflow-run"), b("vidflow-process"));
        let (frame, level, alone) = (b("pool-per-frame"), b("pool-per-level"), b("direct"));
        if [run, process, frame, level, alone]
            .iter()
            .any(Option::is_some)
        {
            println!(
                "{name} back-to-back: vidflow run {} = R (batches of {BATCH}, max_in_flight \
                 {MAX_IN_FLIGHT}), vidflow process {} = P (one at a time); pool-per-frame {} \
                 (/R = {}, /P = {}); pool-per-level {} (/R = {}, /P = {}); steps alone (direct \
                 calls, no executor) {}",
                show(run),
                show(process),
                show(frame),
                ratio(frame, run),
                ratio(frame, process),
                show(level),
                ratio(level, run),
                ratio(level, process),
                show(alone),
            );
        }
        let l = |s: &str| measured(&format!("live/{name}/{s}"));
        let (vidflow, frame, level) = (l("vidflow"), l("pool-per-frame"), l("pool-per-level"));
        let alone = l("direct");
        if [vidflow, frame, level, alone].iter().any(Option::is_some) {
            println!(
                "{name} live: vidflow {} = V, pool-per-frame {} (/V = {}), pool-per-level {} \
                 (/V = {}); steps alone {}",
                show(vidflow),
                show(frame),
                ratio(frame, vidflow),
                show(level),
                ratio(level, vidflow),
                show(alone),
            );
        }
    }

    let b = |s: &str| measured(&format!("b2b/chain-50/{s}"));
    let l = |s: &str| measured(&format!("live/chain-50/{s}"));
    println!(
        "chain-50 inline continuation (off/on): back-to-back run {} vs {} ({}), \
         process {} vs {} ({}), live {} vs {} ({})",
        show(b("vidflow-run-no-inline")),
        show(b("vidflow-run")),
        ratio(b("vidflow-run-no-inline"), b("vidflow-run")),
        show(b("vidflow-process-no-inline")),
        show(b("vidflow-process")),
        ratio(b("vidflow-process-no-inline"), b("vidflow-process")),
        show(l("vidflow-no-inline")),
        show(l("vidflow")),
        ratio(l("vidflow-no-inline"), l("vidflow")),
    );
    println!(
        "chain-50 coordinator steps (off/on): back-to-back process {} vs {} ({}), live {} vs {} \
         ({}); handoff floor (round trip to a parked thread, live): {}",
        show(b("vidflow-process-no-coordinator-steps")),
        show(b("vidflow-process")),
        ratio(
            b("vidflow-process-no-coordinator-steps"),
            b("vidflow-process")
        ),
        show(l("vidflow-no-coordinator-steps")),
        show(l("vidflow")),
        ratio(l("vidflow-no-coordinator-steps"), l("vidflow")),
        show(measured("live/handoff-floor/parked-thread-round-trip")),
    );
    let hundredfold = |m: Measured, level: Option<Measured>| {
        level.is_some_and(|l| l.typical().as_secs_f64() >= 100.0 * m.typical().as_secs_f64())
    };
    println!(
        "targets (chain-50): {}; {}; {}; {}",
        target("back-to-back <= 2 µs (run)", b("vidflow-run"), |m| {
            m.mean <= Duration::from_micros(2)
        }),
        target("live <= 10 µs (p50)", l("vidflow"), |m| {
            m.typical() <= Duration::from_micros(10)
        }),
        target(
            ">= 100x faster than pool-per-level back-to-back (run)",
            b("vidflow-run"),
            |m| hundredfold(m, b("pool-per-level")),
        ),
        target(
            ">= 100x faster than pool-per-level live (p50)",
            l("vidflow"),
            |m| hundredfold(m, l("pool-per-level")),
        ),
    );
}

// ---- test mode ----

/// `cargo test --benches`: every strategy once on every topology, checked, nothing timed.
fn smoke_test(topologies: &[(&str, Arc<Graph>)]) {
    let all_done =
        |r: &FrameResult, n: usize| (0..n).all(|i| matches!(r.outcome(i), Some(Outcome::Done(_))));
    for (name, graph) in topologies {
        let n = graph.len();
        for variant in VARIANTS {
            let mut vidflow = Persistent::new(graph, variant);
            let mut out = Vec::new();
            vidflow.run(frames(0, 10), &mut out);
            assert_eq!(out.len(), 10, "{name}: run delivers every frame");
            for (seq, r) in (0u64..).zip(&out) {
                assert_eq!(r.frame().seq, seq, "{name}: in order");
                assert!(all_done(r, n), "{name}: every step ran");
            }
            let r = vidflow.process(frame(10));
            assert!(all_done(&r, n), "{name}: process ran every step");
            vidflow.close();
        }
        let (r, _) = pool_per_frame(graph, frame(0));
        assert!(all_done(&r, n), "{name}: pool-per-frame ran every step");
        let slots = PerLevel::new(graph).process(frame(0));
        assert!(
            slots.iter().all(|s| matches!(s.get(), Some(Some(_)))),
            "{name}: pool-per-level ran every step"
        );
    }
    println!("executor bench: every strategy ran on every topology (test mode, nothing timed)");
}

fn main() {
    if std::env::args().any(|a| a == "--sources") {
        sources::main();
        return;
    }
    let topologies = topologies();
    // `cargo bench` passes --bench; `cargo test` does not, and may pass libtest options
    // (--test-threads) that criterion's parser rejects, so test mode does not go through it.
    if !std::env::args().any(|a| a == "--bench") {
        smoke_test(&topologies);
        return;
    }
    let mut c = Criterion::default()
        .without_plots()
        .nresamples(10_000)
        .configure_from_args();
    for (name, graph) in &topologies {
        bench_back_to_back(&mut c, name, graph);
    }
    for (name, graph) in &topologies {
        bench_live(&mut c, name, graph);
    }
    bench_handoff_floor(&mut c);
    c.final_summary();
    let names: Vec<&str> = topologies.iter().map(|(name, _)| *name).collect();
    summary(&names);
}
