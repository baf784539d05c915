//! The end of a run: the pool is joined before the sinks close, the sinks close even when the
//! pool fails, and runs leave no threads or file descriptors behind. These tests count the
//! threads of this process, so they take turns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vidflow::daemon::{self, RunOptions, Shutdown};
use vidflow::sinks::{Sink, SinkError, SinkRunner};
use vidflow::workflow::{FrameResult, Pool, PoolError};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn task_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_owned())
        .collect()
}

fn workers_alive() -> usize {
    // Thread names are cut to 15 bytes in /proc: "vidflow-worker-".
    task_names()
        .iter()
        .filter(|n| n.starts_with("vidflow-worker"))
        .count()
}

/// A sink that notes, when it is closed, how many pool workers still exist. It stands in for
/// a file sink because it must look at the process at the very moment of closing.
struct Witness {
    workers_at_close: Arc<AtomicUsize>,
    closed: Arc<AtomicBool>,
}

impl Sink for Witness {
    fn write(&mut self, _: &FrameResult) -> Result<bool, SinkError> {
        Ok(true)
    }

    fn close(self: Box<Self>) -> Result<(), SinkError> {
        self.workers_at_close
            .store(workers_alive(), Ordering::SeqCst);
        self.closed.store(true, Ordering::SeqCst);
        Ok(())
    }
}

fn witness() -> (SinkRunner, Arc<AtomicUsize>, Arc<AtomicBool>) {
    let workers = Arc::new(AtomicUsize::new(usize::MAX));
    let closed = Arc::new(AtomicBool::new(false));
    let sink = Witness {
        workers_at_close: workers.clone(),
        closed: closed.clone(),
    };
    (
        SinkRunner::spawn("witness", Box::new(sink)).unwrap(),
        workers,
        closed,
    )
}

#[test]
fn the_pool_is_joined_before_the_sinks_close() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::new(3).unwrap();
    // Each thread names itself once it runs.
    let start = std::time::Instant::now();
    while workers_alive() < 3 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(workers_alive(), 3);
    let (sink, workers_at_close, closed) = witness();
    let (pool_result, sinks) = daemon::close_in_order(|| pool.shutdown(), vec![sink]);
    pool_result.unwrap();
    assert!(closed.load(Ordering::SeqCst));
    assert_eq!(workers_at_close.load(Ordering::SeqCst), 0);
    assert!(sinks[0].2.is_ok());
}

/// A panic payload that panics again when dropped: the worker catches the first panic, then
/// dies dropping the payload, so joining it fails for real.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("payload dropped");
    }
}

#[test]
fn the_sinks_close_even_when_joining_the_pool_fails() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::new(2).unwrap();
    pool.handle()
        .execute(Box::new(|| std::panic::panic_any(PanicOnDrop)));
    let (sink, _, closed) = witness();
    let (pool_result, sinks) = daemon::close_in_order(|| pool.shutdown(), vec![sink]);
    assert!(
        matches!(pool_result, Err(PoolError::Join(1))),
        "{pool_result:?}"
    );
    assert!(closed.load(Ordering::SeqCst), "the sink was not closed");
    assert!(sinks[0].2.is_ok());
}

fn descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn consecutive_runs_in_one_process_leave_no_threads_or_descriptors_behind() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[sources.cam]
uri = "test://ball?width=160&height=120&frames=30&live=false"
[executor]
workers = 2
[steps.motion]
kind = "motion"
image = "$frame"
[steps.overlay]
kind = "annotate"
image = "$frame"
detections = "$steps.motion.detections"
[sinks.events]
kind = "jsonl"
path = "{dir}/events.jsonl"
include = ["$steps.motion.detections"]
[sinks.video]
kind = "video_file"
path = "{dir}/out.mp4"
image = "$steps.overlay.image"
"#,
        dir = dir.path().display()
    );
    let run = || {
        let pipeline = vidflow::config::load_text(&vidflow::config::SourceText::new(
            "runs.toml",
            text.clone(),
        ))
        .unwrap();
        let report = daemon::run(pipeline, &RunOptions::default(), &Shutdown::new()).unwrap();
        assert_eq!(report.frames_processed, 30);
    };
    // The first run lets GStreamer and OpenCV set up what they keep for the whole process.
    run();
    let settle = || std::thread::sleep(Duration::from_millis(200));
    settle();
    let threads = task_names().len();
    let fds = descriptors();
    for i in 0..3 {
        run();
        settle();
        assert_eq!(workers_alive(), 0, "run {i}: pool workers left");
        assert_eq!(task_names().len(), threads, "run {i}: {:?}", task_names());
        assert_eq!(descriptors(), fds, "run {i}: file descriptors left");
    }
}
