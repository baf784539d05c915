//! The workflow executor on the persistent pool: how often steps run, where, and in what order.
//! Steps are small recording probes (tests/common); the pool, executor and graph are the real
//! ones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use vidflow::workflow::{Executor, Graph, Pool};

fn run_all(
    executor: &Executor,
    frames: crossbeam_channel::Receiver<vidflow::frame::Frame>,
) -> Vec<u64> {
    let never = crossbeam_channel::never();
    let mut order = Vec::new();
    executor.run(&frames, &never, |r| order.push(r.frame().seq));
    order
}

#[test]
fn pool_is_built_once_per_run_whatever_the_number_of_frames() {
    for frames_n in [1u64, 50, 500] {
        let log = Log::default();
        let pool = Pool::new(2).unwrap();
        let executor = Executor::new(
            Arc::new(Graph::new(chain(&log, 10))),
            pool.handle(),
            config(2, 2),
        );
        run_all(&executor, frames(frames_n));
        drop(executor);
        pool.shutdown().unwrap();

        let log = log.lock().unwrap();
        assert_eq!(log.len() as u64, frames_n * 10);
        // Thread ids are never reused within a process: a pool built per frame or per step
        // would show up as more threads than the pool has.
        let threads: HashSet<_> = log.iter().map(|e| e.thread).collect();
        assert!(threads.len() <= 2, "{} threads ran steps", threads.len());
        assert!(
            log.iter()
                .all(|e| e.thread_name.starts_with("vidflow-worker-")),
            "steps ran outside the pool"
        );
    }
}

#[test]
fn every_step_runs_exactly_once_per_frame() {
    let log = Log::default();
    // A diamond with a tail: a -> (b, c) -> d -> e.
    let steps = steps(
        &log,
        &[
            ("a", &FROM_FRAME, &[None]),
            ("b", &ONE, &[Some(0)]),
            ("c", &ONE, &[Some(0)]),
            ("d", &TWO, &[Some(1), Some(2)]),
            ("e", &ONE, &[Some(3)]),
        ],
    );
    let pool = Pool::new(4).unwrap();
    let executor = Executor::new(Arc::new(Graph::new(steps)), pool.handle(), config(4, 4));
    let out = run_all(&executor, frames(300));
    assert_eq!(out.len(), 300);
    let mut counts: HashMap<(String, u64), usize> = HashMap::new();
    for e in log.lock().unwrap().iter() {
        *counts.entry((e.step.clone(), e.seq)).or_default() += 1;
    }
    assert_eq!(counts.len(), 300 * 5);
    assert!(
        counts.values().all(|&c| c == 1),
        "a step ran twice for one frame"
    );
}

fn jittery(seq: u64) -> Duration {
    // Deterministic but uneven: later frames often finish before earlier ones.
    Duration::from_micros((seq * 7919 % 13) * 150)
}

#[test]
fn frames_come_out_in_order_with_several_in_flight() {
    let log = Log::default();
    let steps = steps_with(
        &log,
        &[("a", &FROM_FRAME, &[None]), ("b", &ONE, &[Some(0)])],
        jittery,
        never,
        never,
    );
    let pool = Pool::new(2).unwrap();
    let executor = Executor::new(Arc::new(Graph::new(steps)), pool.handle(), config(2, 4));
    let out = run_all(&executor, frames(200));
    assert_eq!(out, (0..200).collect::<Vec<_>>());
    // The frames really overlapped: some frame started before the previous one finished.
    let log = log.lock().unwrap();
    let first_b = |seq| log.iter().position(|e| e.step == "b" && e.seq == seq);
    let first_a = |seq| log.iter().position(|e| e.step == "a" && e.seq == seq);
    assert!(
        (1..200).any(|s| first_a(s) < first_b(s - 1)),
        "max_in_flight = 4 never had two frames in the workflow"
    );
    drop(log);
    drop(executor);
    pool.shutdown().unwrap();
}
