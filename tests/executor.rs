//! The workflow executor on the persistent pool: how often steps run, where, when and in what
//! order (what a failure does: tests/executor_failures.rs; several sources:
//! tests/executor_sources.rs). Steps are small recording probes (tests/common: the only
//! stand-ins here, since these behaviours need steps that sleep, fail or panic on command); the
//! pool, executor and graph are the real ones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::thread::ThreadId;
use std::time::Duration;

use common::*;
use vidflow::frame::Frame;
use vidflow::steps::StepKind;
use vidflow::workflow::{Executor, FrameResult, Graph, Pool};

type Spec<'a> = Vec<(&'a str, &'static StepKind, &'a [Option<usize>])>;

/// The threads of a pool: one job per worker, each held until all have started, so each runs
/// on a different worker.
fn pool_threads(pool: &Pool) -> HashSet<ThreadId> {
    let barrier = Arc::new(Barrier::new(pool.size() + 1));
    let (tx, rx) = crossbeam_channel::unbounded();
    for _ in 0..pool.size() {
        let (barrier, tx) = (barrier.clone(), tx.clone());
        pool.handle().execute(Box::new(move || {
            tx.send(std::thread::current().id()).unwrap();
            barrier.wait();
        }));
    }
    barrier.wait();
    (0..pool.size()).map(|_| rx.recv().unwrap()).collect()
}

/// Asserts that every step in `log` ran on one of `threads` or on this thread.
fn ran_only_on(log: &Log, threads: &HashSet<ThreadId>) {
    let me = std::thread::current().id();
    let strangers: HashSet<String> = starts(log)
        .into_iter()
        .filter(|e| e.thread != me && !threads.contains(&e.thread))
        .map(|e| e.thread_name)
        .collect();
    assert!(
        strangers.is_empty(),
        "steps ran on threads of another pool: {strangers:?}"
    );
}

/// A fixed pseudo-random DAG of `n` probes: step i reads one of the three steps just before
/// it, and every third step also reads one more earlier step, so it has many levels, fan-out
/// and joins (`dag_shape` checks that it does).
fn random_dag(n: usize) -> (Vec<String>, Vec<Vec<Option<usize>>>) {
    let names = (0..n).map(|i| format!("s{i}")).collect();
    // A fixed linear congruential sequence: the same DAG every run.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |below: usize| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) as usize % below
    };
    let inputs = (0..n)
        .map(|i| {
            if i == 0 {
                return vec![None];
            }
            let near = i - 1 - next(i.min(3));
            if i % 3 == 0 && i > 1 {
                let far = next(i);
                if far != near {
                    return vec![Some(near), Some(far)];
                }
            }
            vec![Some(near)]
        })
        .collect();
    (names, inputs)
}

/// (levels, joins, nodes read by two or more) of a DAG given as inputs per step.
fn dag_shape(inputs: &[Vec<Option<usize>>]) -> (usize, usize, usize) {
    let mut level = vec![0usize; inputs.len()];
    let mut readers = vec![0usize; inputs.len()];
    for (i, ins) in inputs.iter().enumerate() {
        for p in ins.iter().flatten() {
            level[i] = level[i].max(level[*p] + 1);
            readers[*p] += 1;
        }
    }
    let levels = level.iter().max().map_or(0, |l| l + 1);
    let joins = inputs.iter().filter(|ins| ins.len() > 1).count();
    let fan_out = readers.iter().filter(|&&r| r > 1).count();
    (levels, joins, fan_out)
}

fn spec_of<'a>(names: &'a [String], inputs: &'a [Vec<Option<usize>>]) -> Spec<'a> {
    names
        .iter()
        .zip(inputs)
        .map(|(name, ins)| {
            let kind: &'static StepKind = match ins.as_slice() {
                [None] => &FROM_FRAME,
                [_] => &ONE,
                _ => &TWO,
            };
            (name.as_str(), kind, ins.as_slice())
        })
        .collect()
}

#[test]
fn pool_is_built_once_per_run_regardless_of_frames_and_levels() {
    for frames_n in [1u64, 50, 500] {
        for levels in [1usize, 10, 30] {
            let log = Log::default();
            let (pool, mut executor) = hosted(chain(&log, levels), 2, 2);
            let host = pool_threads(&pool);
            run_all(&mut executor, frames(frames_n));
            // No pool besides the host's: every step ran on its workers or the coordinator.
            ran_only_on(&log, &host);
            finish(pool, executor);

            let log = starts(&log);
            assert_eq!(log.len() as u64, frames_n * levels as u64);
            // Thread ids are never reused within a process: a pool built per frame or per
            // level would show up as more threads than the pool's two workers and the
            // coordinator (this thread, which runs the steps of a frame arriving to an idle
            // workflow).
            let me = std::thread::current().id();
            let workers: HashSet<_> = log.iter().map(|e| e.thread).filter(|t| *t != me).collect();
            assert!(workers.len() <= 2, "{} threads ran steps", workers.len());
            assert!(
                log.iter()
                    .all(|e| e.thread == me || e.thread_name.starts_with("vidflow-worker-")),
                "steps ran outside the pool"
            );
        }
    }
}

#[test]
fn an_executor_without_a_host_pool_builds_one_at_first_dispatch_and_only_one() {
    let log = Log::default();
    let mut executor = Executor::owning(Arc::new(Graph::new(chain(&log, 20))), config(2, 2));
    assert_eq!(executor.metrics().pools_built.load(Ordering::Relaxed), 0);
    assert!(
        executor.pool_metrics().is_none(),
        "built before any dispatch"
    );
    let out = run_all(&mut executor, frames(300));
    assert_eq!(out.len(), 300);
    assert_eq!(executor.metrics().pools_built.load(Ordering::Relaxed), 1);
    let me = std::thread::current().id();
    let threads: HashSet<_> = starts(&log)
        .iter()
        .map(|e| e.thread)
        .filter(|t| *t != me)
        .collect();
    assert!(threads.len() <= 2);
    executor.close().unwrap();
}

#[test]
fn an_owned_pool_is_shut_down_by_close_once_even_when_a_step_fails() {
    let log = Log::default();
    let behaviour = Behaviour {
        fail: |name, _| name == "p3",
        ..Behaviour::default()
    };
    // Two branches: one runs on the calling thread, the other needs the pool.
    let steps = steps_with(
        &log,
        &[
            ("p0", &FROM_FRAME, &[None]),
            ("p1", &FROM_FRAME, &[None]),
            ("p2", &ONE, &[Some(1)]),
            ("p3", &ONE, &[Some(2)]),
        ],
        behaviour,
    );
    let mut workflow = vidflow::workflow::Workflow::new(steps, config(2, 1));
    let r = workflow.run_once(Frame::from_mat("cam".into(), 0, None, Default::default()));
    assert_eq!(r.failure().unwrap().step.as_ref(), "p3");
    let r = workflow.run_once(Frame::from_mat("cam".into(), 1, None, Default::default()));
    assert!(r.failure().is_some());
    assert_eq!(workflow.metrics().pools_built.load(Ordering::Relaxed), 1);
    let workers: HashSet<String> = starts(&log)
        .into_iter()
        .filter(|e| e.thread_name.starts_with("vidflow-worker-"))
        .map(|e| e.os_thread)
        .collect();
    assert!(!workers.is_empty(), "no step ran on the pool");
    assert!(workers.iter().all(|t| Path::new(t).exists()));
    workflow.close().unwrap();
    // Shut down by `close` itself, not later: its workers have exited when it returns. A
    // joined thread's /proc task can outlive the join by a moment (pthread_join returns when
    // the kernel clears the thread's id, before it reaps the task): up to 2 s for that, far
    // less than a pool left running would need to go away on its own (never).
    let gone_by = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while workers.iter().any(|t| Path::new(t).exists()) && std::time::Instant::now() < gone_by {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let alive: Vec<&String> = workers.iter().filter(|t| Path::new(t).exists()).collect();
    assert!(
        alive.is_empty(),
        "workers still running after close: {alive:?}"
    );
}

#[test]
fn no_pool_is_built_when_the_host_supplies_one_and_its_pool_works_afterwards() {
    let log = Log::default();
    let pool = Pool::new(2).unwrap();
    let host = pool_threads(&pool);
    let mut executor = Executor::new(
        Arc::new(Graph::new(chain(&log, 5))),
        pool.handle(),
        config(2, 2),
    );
    run_all(&mut executor, frames(100));
    ran_only_on(&log, &host);
    executor.close().unwrap();

    // The executor is gone; the host's pool still takes work on its own threads.
    let (tx, rx) = crossbeam_channel::unbounded();
    for _ in 0..10 {
        let tx = tx.clone();
        assert!(pool.handle().execute(Box::new(move || {
            tx.send(std::thread::current().name().unwrap_or_default().to_owned())
                .unwrap();
        })));
    }
    for _ in 0..10 {
        let name = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(name.starts_with("vidflow-worker-"));
    }
    pool.shutdown().unwrap();
}

#[test]
fn owned_and_supplied_pools_give_identical_results() {
    // Real steps from a real pipeline file, on frames with a moving square.
    let text = r#"
[sources.cam]
uri = "test://ball"
[executor]
workers = 2
max_in_flight = 3
[steps.small]
kind = "resize"
image = "$frame"
width = 160
height = 120
[steps.motion]
kind = "motion"
image = "$steps.small.image"
min_area = 10.0
[steps.big]
kind = "filter"
detections = "$steps.motion.detections"
min_area = 50.0
"#;
    let load = || {
        vidflow::config::load_text(&vidflow::config::SourceText::new("t.toml", text.to_owned()))
            .unwrap()
    };
    let moving_square = |seq: u64| {
        use opencv::core::{CV_8UC3, Mat, Rect, Scalar};
        let mut m = Mat::new_rows_cols_with_default(240, 320, CV_8UC3, Scalar::all(0.0)).unwrap();
        let x = (seq as i32 * 7) % 280;
        opencv::imgproc::rectangle(
            &mut m,
            Rect::new(x, 100, 30, 30),
            Scalar::all(255.0),
            -1,
            opencv::imgproc::LINE_8,
            0,
        )
        .unwrap();
        Frame::from_mat("cam".into(), seq, None, m)
    };
    let frames = || {
        let (tx, rx) = crossbeam_channel::unbounded();
        for seq in 0..60 {
            tx.send(moving_square(seq)).unwrap();
        }
        rx
    };
    let as_json = |results: &[FrameResult]| -> Vec<String> {
        let r = vidflow::spec::Ref::Step { step: 2, output: 0 };
        results
            .iter()
            .map(|res| {
                format!(
                    "{:?}",
                    res.value(r)
                        .and_then(|v| v.get::<[vidflow::value::Detection]>().map(<[_]>::to_vec))
                )
            })
            .collect()
    };

    let host = Pool::new(2).unwrap();
    let p = load();
    let mut supplied = Executor::new(Arc::new(Graph::new(p.steps)), host.handle(), p.executor);
    let with_host = as_json(&run_all(&mut supplied, frames()));
    supplied.close().unwrap();
    host.shutdown().unwrap();

    let p = load();
    let mut owning = Executor::owning(Arc::new(Graph::new(p.steps)), p.executor);
    let with_own = as_json(&run_all(&mut owning, frames()));
    owning.close().unwrap();

    assert_eq!(with_host, with_own);
    assert!(
        with_own.iter().filter(|d| d.contains("motion")).count() > 30,
        "the square's motion was not found: {with_own:?}"
    );
}

#[test]
fn a_fast_branch_successor_starts_before_a_slow_sibling_ends() {
    let log = Log::default();
    let behaviour = Behaviour {
        work: |name, _| {
            if name == "slow" {
                Duration::from_millis(150)
            } else {
                Duration::ZERO
            }
        },
        ..Behaviour::default()
    };
    let steps = steps_with(
        &log,
        &[
            ("a", &FROM_FRAME, &[None]),
            ("slow", &ONE, &[Some(0)]),
            ("fast", &ONE, &[Some(0)]),
            ("after_fast", &ONE, &[Some(2)]),
        ],
        behaviour,
    );
    let (pool, mut executor) = hosted(steps, 2, 1);
    run_all(&mut executor, frames(3));
    let log = log.lock().unwrap().clone();
    for seq in 0..3 {
        let started = position(&log, "after_fast", seq, false).unwrap();
        let slow_ended = position(&log, "slow", seq, true).unwrap();
        assert!(
            started < slow_ended,
            "frame {seq}: after_fast waited for the slow sibling's level"
        );
    }
    finish(pool, executor);
}

#[test]
fn every_step_runs_exactly_once_per_frame_under_stress() {
    let (names, inputs) = random_dag(20);
    let (levels, joins, fan_out) = dag_shape(&inputs);
    assert!(
        levels >= 8 && joins >= 3 && fan_out >= 3,
        "the stress DAG lost its shape: {levels} levels, {joins} joins, {fan_out} fan-outs"
    );
    for workers in 1..=8 {
        let log = Log::default();
        let (pool, mut executor) = hosted(steps(&log, &spec_of(&names, &inputs)), workers, 4);
        let out = run_all(&mut executor, frames(2000));
        assert_eq!(seqs(&out), (0..2000).collect::<Vec<_>>());
        let mut counts: HashMap<(String, u64), usize> = HashMap::new();
        for e in starts(&log) {
            *counts.entry((e.step, e.seq)).or_default() += 1;
        }
        assert_eq!(
            counts.len(),
            2000 * 20,
            "{workers} workers: a step never ran"
        );
        assert!(
            counts.values().all(|&c| c == 1),
            "{workers} workers: a step ran twice for one frame"
        );
        // A queued step is never queued again: at most one dispatch per step and frame.
        let dispatches = pool.metrics().dispatches.load(Ordering::Relaxed);
        assert!(
            dispatches <= 2000 * 20,
            "{dispatches} dispatches for 40000 steps"
        );
        finish(pool, executor);
    }
}

#[test]
fn frames_come_out_in_order_with_several_in_flight() {
    let log = Log::default();
    let behaviour = Behaviour {
        work: jittery,
        ..Behaviour::default()
    };
    let steps = steps_with(
        &log,
        &[("a", &FROM_FRAME, &[None]), ("b", &ONE, &[Some(0)])],
        behaviour,
    );
    let (pool, mut executor) = hosted(steps, 2, 4);
    let out = run_all(&mut executor, frames(200));
    assert_eq!(seqs(&out), (0..200).collect::<Vec<_>>());
    // The frames really overlapped: some frame started before the previous one finished.
    let log = log.lock().unwrap().clone();
    assert!(
        (1..200).any(|s| position(&log, "a", s, false) < position(&log, "b", s - 1, true)),
        "max_in_flight = 4 never had two frames in the workflow"
    );
    finish(pool, executor);
}

#[test]
fn nothing_wakes_up_while_no_frame_arrives() {
    let log = Log::default();
    let pool = Pool::new(2).unwrap();
    let mut executor = Executor::new(
        Arc::new(Graph::new(chain(&log, 10))),
        pool.handle(),
        config(2, 2),
    );
    let metrics = executor.metrics().clone();
    let mut threads = worker_os_threads(&pool);
    let (frames_tx, frames_rx) = crossbeam_channel::unbounded();
    let (results_tx, results_rx) = crossbeam_channel::unbounded();
    let (os_thread_tx, os_thread_rx) = crossbeam_channel::bounded(1);
    let coordinator = std::thread::spawn(move || {
        os_thread_tx.send(os_thread()).unwrap();
        let never = crossbeam_channel::never();
        executor.run(&frames_rx, &never, |r| {
            results_tx.send(r.frame().seq).unwrap()
        })
    });
    for seq in 0..20 {
        frames_tx
            .send(Frame::from_mat("cam".into(), seq, None, Default::default()))
            .unwrap();
    }
    for _ in 0..20 {
        results_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    let snapshot = || {
        (
            pool.metrics().wakeups.load(Ordering::Relaxed),
            pool.metrics().dispatches.load(Ordering::Relaxed),
            metrics.coordinator_wakeups.load(Ordering::Relaxed),
        )
    };
    // Once the workers and the coordinator are parked, a second with no frames must not move
    // any counter.
    threads.push(os_thread_rx.recv_timeout(HANG_GUARD).unwrap());
    let before = wait_until_asleep(&threads, snapshot);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        snapshot(),
        before,
        "(worker wake-ups, dispatches, coordinator wake-ups)"
    );
    drop(frames_tx);
    let stats = coordinator.join().unwrap();
    assert_eq!(stats.processed, 20);
    pool.shutdown().unwrap();
}

/// With every place taken in turn (two workers, two frames in flight, frames always waiting),
/// the coordinator runs a frame's steps itself only while they are cheap: a frame of
/// milliseconds (a detector's) goes to the pool once one has been timed, so the coordinator
/// stays free to deliver and admit while a worker that finished waits for work.
#[test]
fn the_coordinator_runs_cheap_frames_itself_and_leaves_heavy_ones_to_the_pool() {
    fn heavy(_: &str, _: u64) -> Duration {
        Duration::from_millis(3)
    }
    let me = std::thread::current().id();
    for (behaviour, heavy_frames) in [
        (Behaviour::default(), false),
        (
            Behaviour {
                work: heavy,
                ..Behaviour::default()
            },
            true,
        ),
    ] {
        let log = Log::default();
        let (pool, mut executor) = hosted(chain_with(&log, 2, behaviour), 2, 2);
        assert_eq!(run_all(&mut executor, frames(40)).len(), 40);
        finish(pool, executor);
        let on_coordinator: Vec<u64> = starts(&log)
            .iter()
            .filter(|e| e.thread == me)
            .map(|e| e.seq)
            .collect();
        if heavy_frames {
            // The first frames run before any has been timed.
            assert!(
                on_coordinator.iter().all(|seq| *seq < 4),
                "heavy frames on the coordinator: {on_coordinator:?}"
            );
        } else {
            assert!(
                on_coordinator.len() >= 10,
                "cheap frames on the coordinator: {on_coordinator:?}"
            );
        }
    }
}

/// Set once frame 3 has started, for the test below (its probes are plain functions).
static FRAME_3_STARTED: (std::sync::Mutex<bool>, std::sync::Condvar) =
    (std::sync::Mutex::new(false), std::sync::Condvar::new());

/// With the default places in flight (`ExecutorConfig::for_workers`), a worker that finished a
/// frame takes the next ones while an earlier, slow frame still runs on the other worker: its
/// results wait for delivery without holding the next frames out. Frame 0 here runs until frame
/// 3 has started; with one place per worker, frame 1's result (waiting for frame 0's delivery)
/// and frame 0 would take both places, and frame 0 would wait out the deadline, ending first.
/// The deadline only keeps that failure from hanging: nothing here is timed.
#[test]
fn a_worker_never_waits_for_a_slower_frame_of_the_other_with_the_default_places() {
    fn frame_0_waits_for_frame_3(_: &str, seq: u64) -> Duration {
        let (started, changed) = &FRAME_3_STARTED;
        let mut started = started.lock().unwrap();
        match seq {
            0 => {
                let _ = changed
                    .wait_timeout_while(started, Duration::from_secs(20), |s| !*s)
                    .unwrap();
            }
            3 => {
                *started = true;
                changed.notify_all();
            }
            _ => {}
        }
        Duration::ZERO
    }
    let config = vidflow::config::ExecutorConfig::for_workers(2);
    let log = Log::default();
    let behaviour = Behaviour {
        work: frame_0_waits_for_frame_3,
        ..Behaviour::default()
    };
    let (pool, mut executor) = hosted(
        chain_with(&log, 1, behaviour),
        config.workers,
        config.max_in_flight,
    );
    let results = run_all(&mut executor, frames(12));
    finish(pool, executor);
    assert_eq!(
        seqs(&results),
        (0..12).collect::<Vec<_>>(),
        "results out of order"
    );
    assert_eq!(
        starts(&log).len(),
        12,
        "a step ran more or less than once per frame"
    );
    let log = log.lock().unwrap().clone();
    let frame_3 = position(&log, "p0", 3, false).unwrap();
    let frame_0_done = position(&log, "p0", 0, true).unwrap();
    assert!(
        frame_3 < frame_0_done,
        "frame 3 started only after frame 0 ended: the other worker waited for it"
    );
}
