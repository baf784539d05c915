//! The sources dimension of the executor: does one camera wait for another?
//!
//! Run:  cargo bench --bench executor -- --sources     (~1 min; scripts/bench-throughput runs it)
//!
//! The real `motion` step (MOG2 background subtraction, stateful: one model per source) from a
//! pipeline file, on 640x480 frames of a moving square made in memory (no decoding), on the
//! real executor and a persistent pool of two workers, `max_in_flight` = 4.
//!
//! - throughput: `THROUGHPUT_FRAMES` frames per camera, each camera fed as fast as the
//!   workflow takes them through a queue of 2 (as a file source); baseline, in the same run:
//!   one camera; then two cameras. Frames per second and the ratio two / one (target >= 1.7x:
//!   the stateful step of one camera runs one frame at a time, so one camera uses one worker;
//!   two cameras must use both).
//! - latency: camera "a" live at 30 fps for `LIVE_FRAMES` frames, alone (baseline, same run),
//!   then with camera "b" live at 2 fps alongside. Latency is from the frame's creation (its
//!   `captured` time, just before it is queued) to its delivery by the executor; p50 and p99 of
//!   a's frames and the ratio with / without b (target: p99 within 10%).
//!
//! Frame making is part of each feeder thread, in the baseline and the measured run alike
//! (it stands in for decoding).
//!
//! The machine's own ceiling, measured in the same run, without the executor: the same frames
//! made and the same `motion` calls on one bare thread, then on two bare threads at once (one
//! camera each). On a machine whose two vCPUs do not give twice the work of one, two cameras
//! cannot either: the executor's figure is also printed against this ceiling. Likewise for
//! latency, camera "a" through the executor beside a bare thread doing camera b's 2 fps work:
//! what b's CPU use alone costs a, with no executor in b's path.
//!
//! Also printed, for the two-camera throughput run: the share of the wall time during which two
//! `motion` calls were running at once (from each call's start and end). It does not depend on
//! how much of the machine the run gets: it is 0 whenever a stateful step runs one frame at a
//! time for all cameras together, whatever the load.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::Receiver;
use opencv::core::{CV_8UC3, Mat, Rect, Scalar};
use vidflow::frame::Frame;
use vidflow::steps::{Step, StepError, StepInput, StepOutput};
use vidflow::value::{Image, Value};
use vidflow::workflow::{Executor, Graph, Pool};

const THROUGHPUT_FRAMES: u64 = 300;
const LIVE_FRAMES: u64 = 300;
const LIVE_A: Duration = Duration::from_micros(33_333);
const LIVE_B: Duration = Duration::from_millis(500);
const WORKERS: usize = 2;
const MAX_IN_FLIGHT: usize = 4;
/// Frames waiting per camera, as a source's `queue`.
const QUEUE: usize = 2;

const PIPELINE: &str = r#"
[sources.a]
uri = "test://ball"
[steps.motion]
kind = "motion"
image = "$frame"
"#;

/// Start and end of each call of a step.
type Spans = Arc<Mutex<Vec<(Instant, Instant)>>>;

/// A step that notes when each of its calls starts and ends.
#[derive(Debug)]
struct Timed {
    inner: Arc<dyn Step>,
    spans: Spans,
}

impl Step for Timed {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let start = Instant::now();
        let out = self.inner.run(input);
        let end = Instant::now();
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((start, end));
        out
    }
}

/// The real `motion` step of `PIPELINE`, on its own.
fn motion() -> Arc<dyn Step> {
    let text = vidflow::config::SourceText::new("sources.toml", PIPELINE.to_owned());
    let pipeline = vidflow::config::load_text(&text).expect("bench pipeline");
    pipeline.steps[0].step.clone()
}

/// One camera's work without the executor: make each frame and run `motion` on it, on this
/// thread, one frame every `interval` (zero: back to back).
fn bare_camera(step: &dyn Step, name: &str, frames: u64, interval: Duration) {
    let source: Arc<str> = name.into();
    let start = Instant::now();
    for seq in 0..frames {
        if !interval.is_zero() {
            let due = start + interval * u32::try_from(seq).unwrap_or(u32::MAX);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        let frame = Arc::new(frame(&source, seq));
        let values = [Some(Value::Image(Image::Frame(frame.clone())))];
        let input = StepInput {
            frame: &frame,
            values: &values,
        };
        step.run(&input).expect("motion");
    }
}

/// Wall time of `cameras` bare threads at once, `frames` frames each, back to back.
fn bare(cameras: &[&str], frames: u64) -> Duration {
    let step = motion();
    let start = Instant::now();
    std::thread::scope(|scope| {
        for name in cameras {
            let step = step.clone();
            scope.spawn(move || bare_camera(&*step, name, frames, Duration::ZERO));
        }
    });
    start.elapsed()
}

/// The real steps of `PIPELINE`, each timed into `spans`.
fn graph(spans: &Spans) -> Arc<Graph> {
    let text = vidflow::config::SourceText::new("sources.toml", PIPELINE.to_owned());
    let mut pipeline = vidflow::config::load_text(&text).expect("bench pipeline");
    for step in &mut pipeline.steps {
        step.step = Arc::new(Timed {
            inner: step.step.clone(),
            spans: spans.clone(),
        });
    }
    Arc::new(Graph::new(pipeline.steps))
}

/// How long two or more of `spans` ran at once.
fn overlapped(spans: &[(Instant, Instant)]) -> Duration {
    let mut events: Vec<(Instant, i32)> = spans
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut running, mut since, mut total) = (0, None, Duration::ZERO);
    for (at, change) in events {
        running += change;
        match (running >= 2, since) {
            (true, None) => since = Some(at),
            (false, Some(from)) => {
                total += at.duration_since(from);
                since = None;
            }
            _ => {}
        }
    }
    total
}

/// Frame `seq` of `source`: a white square moving across a dark 640x480 image.
fn frame(source: &Arc<str>, seq: u64) -> Frame {
    let mut m =
        Mat::new_rows_cols_with_default(480, 640, CV_8UC3, Scalar::all(20.0)).expect("frame image");
    let x = i32::try_from(seq * 9 % 560).unwrap_or(0);
    opencv::imgproc::rectangle(
        &mut m,
        Rect::new(x, 200, 60, 60),
        Scalar::all(255.0),
        -1,
        opencv::imgproc::LINE_8,
        0,
    )
    .expect("draw");
    Frame::from_mat(source.clone(), seq, None, m)
}

/// A camera on its own thread: `frames` frames, one every `interval` (zero: as fast as they
/// are taken).
fn camera(name: &str, frames: u64, interval: Duration) -> Receiver<Frame> {
    let (tx, rx) = crossbeam_channel::bounded(QUEUE);
    let source: Arc<str> = name.into();
    std::thread::spawn(move || {
        let start = Instant::now();
        for seq in 0..frames {
            if !interval.is_zero() {
                let due = start + interval * u32::try_from(seq).unwrap_or(u32::MAX);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            if tx.send(frame(&source, seq)).is_err() {
                return;
            }
        }
    });
    rx
}

/// What one run measured.
struct Measured {
    wall: Duration,
    /// Per delivered frame: its source and its latency.
    latencies: Vec<(Arc<str>, Duration)>,
    /// How long two step calls ran at once.
    overlapped: Duration,
}

/// Runs the cameras through one executor.
fn run(cameras: &[Receiver<Frame>]) -> Measured {
    let spans = Spans::default();
    let pool = Pool::new(WORKERS).expect("pool");
    let config = vidflow::config::ExecutorConfig {
        workers: WORKERS,
        max_in_flight: MAX_IN_FLIGHT,
        on_step_error: vidflow::config::OnStepError::SkipFrame,
        opencv_threads: 1,
    };
    let mut executor = Executor::new(graph(&spans), pool.handle(), config);
    let never = crossbeam_channel::never();
    let mut latencies = Vec::new();
    let start = Instant::now();
    let stats = executor.run_sources(cameras, &never, |r| {
        let latency = SystemTime::now()
            .duration_since(r.frame().captured)
            .unwrap_or_default();
        latencies.push((r.frame().source.clone(), latency));
    });
    let wall = start.elapsed();
    assert_eq!(stats.failed, 0, "a frame failed");
    drop(executor);
    pool.shutdown().expect("pool shutdown");
    let spans = spans.lock().unwrap_or_else(PoisonError::into_inner);
    Measured {
        wall,
        latencies,
        overlapped: overlapped(&spans),
    }
}

fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

pub(crate) fn main() {
    // The step's own OpenCV calls on one thread, as the daemon sets it (opencv_threads = 1).
    opencv::core::set_num_threads(1).expect("opencv threads");
    // Warm-up: OpenCV and the allocator set up what they keep.
    run(&[camera("a", 30, Duration::ZERO)]);

    println!(
        "== sources: motion (MOG2) on 640x480, workers {WORKERS}, max_in_flight {MAX_IN_FLIGHT}"
    );
    let one = run(&[camera("a", THROUGHPUT_FRAMES, Duration::ZERO)]);
    let two = run(&[
        camera("a", THROUGHPUT_FRAMES, Duration::ZERO),
        camera("b", THROUGHPUT_FRAMES, Duration::ZERO),
    ]);
    let bare_one = bare(&["a"], THROUGHPUT_FRAMES);
    let bare_two = bare(&["a", "b"], THROUGHPUT_FRAMES);
    let fps_one = THROUGHPUT_FRAMES as f64 / one.wall.as_secs_f64();
    let fps_two = 2.0 * THROUGHPUT_FRAMES as f64 / two.wall.as_secs_f64();
    let ratio = fps_two / fps_one;
    let ceiling = 2.0 * bare_one.as_secs_f64() / bare_two.as_secs_f64();
    println!(
        "throughput ({THROUGHPUT_FRAMES} frames per camera, as fast as taken): one camera \
         {fps_one:.1} frames/s (baseline), two cameras {fps_two:.1} frames/s: {ratio:.2}x \
         (target >= 1.7x: {}); two motion calls at once during {:.0}% of the two-camera run \
         ({:.0}% with one camera)",
        if ratio >= 1.7 { "met" } else { "MISSED" },
        100.0 * two.overlapped.as_secs_f64() / two.wall.as_secs_f64(),
        100.0 * one.overlapped.as_secs_f64() / one.wall.as_secs_f64(),
    );
    println!(
        "machine ceiling, same run, no executor: the same frames and motion calls on one bare \
         thread {:.1} frames/s, on two bare threads at once {:.1} frames/s: {ceiling:.2}x; \
         vidflow's two-camera gain is {:.0}% of what this machine gives",
        THROUGHPUT_FRAMES as f64 / bare_one.as_secs_f64(),
        2.0 * THROUGHPUT_FRAMES as f64 / bare_two.as_secs_f64(),
        100.0 * ratio / ceiling,
    );

    let a_of = |latencies: Vec<(Arc<str>, Duration)>| -> Vec<Duration> {
        latencies
            .into_iter()
            .filter(|(s, _)| &**s == "a")
            .map(|(_, l)| l)
            .collect()
    };
    let alone = run(&[camera("a", LIVE_FRAMES, LIVE_A)]).latencies;
    let b_frames =
        (LIVE_A * u32::try_from(LIVE_FRAMES).unwrap_or(u32::MAX)).as_millis() / LIVE_B.as_millis();
    let beside = run(&[
        camera("a", LIVE_FRAMES, LIVE_A),
        camera("b", u64::try_from(b_frames).unwrap_or(0), LIVE_B),
    ])
    .latencies;
    // b's work on a bare thread beside a alone in the executor: the cost of b's CPU use alone.
    let beside_bare = std::thread::scope(|scope| {
        let step = motion();
        let b_frames = u64::try_from(b_frames).unwrap_or(0);
        scope.spawn(move || bare_camera(&*step, "b", b_frames, LIVE_B));
        run(&[camera("a", LIVE_FRAMES, LIVE_A)]).latencies
    });
    let p99_beside_bare = percentile(a_of(beside_bare), 0.99);
    let (alone, beside) = (a_of(alone), a_of(beside));
    let (p50_alone, p99_alone) = (percentile(alone.clone(), 0.5), percentile(alone, 0.99));
    let (p50_beside, p99_beside) = (percentile(beside.clone(), 0.5), percentile(beside, 0.99));
    let ratio = p99_beside.as_secs_f64() / p99_alone.as_secs_f64();
    println!(
        "latency of camera a (30 fps live, {LIVE_FRAMES} frames): alone p50 {} p99 {} \
         (baseline); beside camera b at 2 fps p50 {} p99 {}: p99 {ratio:.2}x (target within \
         10%: {})",
        ms(p50_alone),
        ms(p99_alone),
        ms(p50_beside),
        ms(p99_beside),
        if ratio <= 1.1 { "met" } else { "MISSED" }
    );
    println!(
        "  beside b's same work on a bare thread (no executor in b's path) p99 {}: through the \
         executor b costs a {:.2}x of what b's CPU use alone costs it",
        ms(p99_beside_bare),
        p99_beside.as_secs_f64() / p99_beside_bare.as_secs_f64()
    );
}
