//! Why a frame of `motion` costs more CPU with two cameras than with one (issue 41, item 18):
//! the CPU time of each call of the real `motion` step (MOG2, one background model per camera),
//! measured on the thread that makes it (`CLOCK_THREAD_CPUTIME_ID`: waiting for a core does not
//! count, so other programs on the machine move it far less than wall time), in four cases:
//!
//! - `one`: one camera, its calls on one thread (the baseline);
//! - `two, in turn`: two cameras, their calls alternating on ONE thread: never two at once, but
//!   two models used in turn;
//! - `two, at once`: two cameras, each on its own thread, both running: the issue's case;
//! - the same three at a quarter of the pixels.
//!
//! A model is 100 bytes a pixel (5 Gaussians of weight, variance and three means, 32-bit
//! floats) and each call reads and writes all of it: 30.7 MB at 640x480, against the L3 cache
//! printed at the start. If two models in turn cost as much as two at once, the extra is the
//! cache's size, not running at once (threads, locks, memory bandwidth, shared cores): the
//! pool's scheduling cannot change it. The same three cases on a plain buffer of a model's
//! size (each "call" reads and writes every cache line once) give the machine's own figure,
//! without OpenCV.
//!
//! The frames are made in memory before the timing (a square moving on a dark picture, as
//! `executor/sources.rs`); each camera's first `WARMUP` calls (the model is allocated and
//! learns) are not counted. `ROUNDS` rounds, each case in turn in each: printed, the median CPU
//! ms a call and its spread (min..max, the noise), and each case's ratio to `one` of the same
//! size.
//!
//!     cargo bench --bench motion_cameras      (~1 minute on 2 cores)
//!
//! `cargo test --benches` runs it with a few calls, to check that it works (nothing timed).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark: a broken set-up should stop it"
)]

use std::sync::{Arc, Barrier};

use opencv::core::{CV_8UC3, Mat, Rect, Scalar};
use vidflow::frame::Frame;
use vidflow::steps::{Step, StepInput};
use vidflow::value::{Image, Value};

const WARMUP: usize = 20;

/// (calls counted per camera, rounds): fewer under `cargo test`, which only checks it runs.
fn sizes() -> (usize, usize) {
    if std::env::args().any(|a| a == "--bench") {
        (150, 5)
    } else {
        (3, 1)
    }
}

const PIPELINE: &str = r#"
[sources.a]
uri = "test://ball"
[steps.motion]
kind = "motion"
image = "$frame"
"#;

/// A fresh `motion` step (no model yet).
fn motion() -> Arc<dyn Step> {
    let text = vidflow::config::SourceText::new("bench.toml", PIPELINE.to_owned());
    let pipeline = vidflow::config::load_text(&text).expect("bench pipeline");
    pipeline.steps[0].step.clone()
}

/// The CPU time of the calling thread, in seconds.
fn thread_cpu() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct we own and pass by pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Frames `0..n` of camera `name`: a white square moving across a dark `w` x `h` picture.
fn frames(name: &str, n: usize, (w, h): (i32, i32)) -> Vec<Arc<Frame>> {
    let source: Arc<str> = name.into();
    (0..n)
        .map(|seq| {
            let mut m = Mat::new_rows_cols_with_default(h, w, CV_8UC3, Scalar::all(20.0)).unwrap();
            let side = w / 10;
            let x = i32::try_from(seq * 9).unwrap() % (w - side);
            let r = Rect::new(x, h / 2 - side / 2, side, side);
            opencv::imgproc::rectangle(&mut m, r, Scalar::all(255.0), -1, 8, 0).unwrap();
            let seq = u64::try_from(seq).unwrap();
            Arc::new(Frame::from_mat(source.clone(), seq, None, m))
        })
        .collect()
}

/// The thread CPU of one call of `motion` on `frame`.
fn call(step: &dyn Step, frame: &Arc<Frame>) -> f64 {
    let values = [Some(Value::Image(Image::Frame(frame.clone())))];
    let input = StepInput {
        frame,
        values: &values,
    };
    let start = thread_cpu();
    step.run(&input).expect("motion");
    thread_cpu() - start
}

/// Runs `motion` on `frames`, one call each; the thread CPU of the calls after `WARMUP`.
fn calls(step: &dyn Step, frames: &[Arc<Frame>]) -> f64 {
    let mut spent = 0.0;
    for (i, frame) in frames.iter().enumerate() {
        let cpu = call(step, frame);
        if i >= WARMUP {
            spent += cpu;
        }
    }
    spent
}

/// A plain buffer of a model's size, each pass reading and writing every cache line once.
struct Plain(Vec<u8>);

impl Plain {
    fn pass(&mut self) -> f64 {
        let start = thread_cpu();
        for line in self.0.chunks_mut(64) {
            line[0] = line[0].wrapping_add(1);
        }
        std::hint::black_box(&self.0);
        thread_cpu() - start
    }
}

/// CPU ms a call for each case: one, two in turn, two at once.
fn cases(size: (i32, i32), counted: usize) -> [f64; 3] {
    let n = WARMUP + counted;
    let (a, b) = (frames("a", n, size), frames("b", n, size));
    let one = calls(&*motion(), &a) / counted as f64;
    // In turn: a frame of a, a frame of b, on this thread.
    let step = motion();
    let mut spent = 0.0;
    for (i, (fa, fb)) in a.iter().zip(&b).enumerate() {
        let both = call(&*step, fa) + call(&*step, fb);
        if i >= WARMUP {
            spent += both;
        }
    }
    let in_turn = spent / (2 * counted) as f64;
    // At once: each camera on its own thread, started together.
    let step = motion();
    let barrier = Barrier::new(2);
    let run = |frames: &[Arc<Frame>]| {
        barrier.wait();
        calls(&*step, frames)
    };
    let at_once: f64 = std::thread::scope(|scope| {
        let (ta, tb) = (scope.spawn(|| run(&a)), scope.spawn(|| run(&b)));
        ta.join().unwrap() + tb.join().unwrap()
    }) / (2 * counted) as f64;
    [one, in_turn, at_once].map(|s| s * 1e3)
}

/// The same three cases on plain buffers of `bytes` each.
fn plain_cases(bytes: usize, passes: usize) -> [f64; 3] {
    let mut a = Plain(vec![0; bytes]);
    let mut b = Plain(vec![0; bytes]);
    let warm = |p: &mut Plain| {
        (0..3).for_each(|_| {
            p.pass();
        })
    };
    warm(&mut a);
    warm(&mut b);
    let one: f64 = (0..passes).map(|_| a.pass()).sum::<f64>() / passes as f64;
    let in_turn: f64 = (0..passes).map(|_| a.pass() + b.pass()).sum::<f64>() / (2 * passes) as f64;
    let barrier = Barrier::new(2);
    let run = |p: &mut Plain| {
        barrier.wait();
        (0..passes).map(|_| p.pass()).sum::<f64>()
    };
    let at_once = std::thread::scope(|scope| {
        let (ta, tb) = (scope.spawn(|| run(&mut a)), scope.spawn(|| run(&mut b)));
        ta.join().unwrap() + tb.join().unwrap()
    }) / (2 * passes) as f64;
    [one, in_turn, at_once].map(|s| s * 1e3)
}

/// A row: its three cases measured once, CPU ms a call each.
type Case = Box<dyn Fn() -> [f64; 3]>;

/// "median (min..max)" of `v`.
fn spread(v: &mut [f64]) -> (f64, String) {
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    let text = format!("{median:.3} ({:.3}..{:.3})", v[0], v[v.len() - 1]);
    (median, text)
}

fn main() {
    // As the daemon sets it (opencv_threads = 1): each call on its own thread only.
    opencv::core::set_num_threads(1).expect("opencv threads");
    let (counted, rounds) = sizes();
    let l3 = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size")
        .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
    println!(
        "== motion_cameras: CPU ms a call, {counted} calls a camera, {rounds} rounds; L3 {l3}, \
         {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let rows: [(&str, Case); 4] = [
        (
            "motion 640x480",
            Box::new(move || cases((640, 480), counted)),
        ),
        (
            "motion 320x240",
            Box::new(move || cases((320, 240), counted)),
        ),
        (
            "plain 30.7 MB",
            Box::new(move || plain_cases(30_720_000, counted)),
        ),
        (
            "plain 7.7 MB",
            Box::new(move || plain_cases(7_680_000, counted)),
        ),
    ];
    let mut results = vec![[const { Vec::new() }; 3]; rows.len()];
    for _ in 0..rounds {
        for (row, (_, case)) in rows.iter().enumerate() {
            for (i, ms) in case().into_iter().enumerate() {
                results[row][i].push(ms);
            }
        }
    }
    println!(
        "{:<16} {:>26} {:>34} {:>34}",
        "", "one", "two, in turn", "two, at once"
    );
    for ((name, _), mut cells) in rows.iter().zip(results) {
        let (one, one_text) = spread(&mut cells[0]);
        let (turn, turn_text) = spread(&mut cells[1]);
        let (once, once_text) = spread(&mut cells[2]);
        println!(
            "{name:<16} {one_text:>26} {:>34} {:>34}",
            format!("{turn_text} {:.2}x", turn / one),
            format!("{once_text} {:.2}x", once / one),
        );
    }
}
