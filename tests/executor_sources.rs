//! Several sources through one workflow, on the real pool and executor: a stateful step sees
//! the frames of each source in that source's order, one at a time, and sources never wait for
//! each other (neither at a stateful step nor for their results). Steps are small recording
//! probes and, where a step must wait for another source, one written here (the only
//! stand-ins: these behaviours need steps that sleep or wait on command).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use common::*;
use vidflow::frame::Frame;
use vidflow::steps::{Step, StepError, StepInput, StepOutput};

#[test]
fn stateful_steps_see_frames_in_order_with_four_in_flight() {
    let log = Log::default();
    let behaviour = Behaviour {
        work: jittery,
        ..Behaviour::default()
    };
    let steps = steps_with(
        &log,
        &[
            ("a", &FROM_FRAME, &[None]),
            ("state", &STATEFUL, &[Some(0)]),
            ("after", &ONE, &[Some(1)]),
        ],
        behaviour,
    );
    let (pool, mut executor) = hosted(steps, 4, 4);
    let out = run_all(&mut executor, frames(300));
    assert_eq!(out.len(), 300);
    let log = log.lock().unwrap().clone();
    // The stateful step's starts and ends alternate, in frame order: one frame at a time.
    let stateful: Vec<(u64, bool)> = log
        .iter()
        .filter(|e| e.step == "state")
        .map(|e| (e.seq, e.end))
        .collect();
    let expected: Vec<(u64, bool)> = (0..300).flat_map(|s| [(s, false), (s, true)]).collect();
    assert_eq!(stateful, expected);
    // Meanwhile stateless steps of later frames did run alongside.
    assert!(
        (1..300).any(|s| position(&log, "a", s, false) < position(&log, "state", s - 1, true)),
        "stateless steps never overlapped the stateful one"
    );
    finish(pool, executor);
}

/// A stateful step for two sources. Frame 0 of "slow" feeds the frames of "fast" into their
/// channel and then waits, inside the step, until all of them have passed this same step (or
/// `HANG_GUARD` expires); each frame of "fast" counts itself through.
#[derive(Debug)]
struct WaitsForTheOtherSource {
    fast: Mutex<Option<crossbeam_channel::Sender<Frame>>>,
    fast_frames: u64,
    passed: Arc<(Mutex<u64>, Condvar)>,
    saw_all_pass: Arc<AtomicBool>,
}

impl Step for WaitsForTheOtherSource {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let (count, changed) = &*self.passed;
        if &*input.frame.source == "slow" {
            if input.frame.seq == 0 {
                let fast = self.fast.lock().unwrap().take().unwrap();
                let name: Arc<str> = "fast".into();
                for seq in 0..self.fast_frames {
                    fast.send(Frame::from_mat(name.clone(), seq, None, Default::default()))
                        .unwrap();
                }
                drop(fast);
                let (n, _) = changed
                    .wait_timeout_while(count.lock().unwrap(), HANG_GUARD, |n| {
                        *n < self.fast_frames
                    })
                    .unwrap();
                self.saw_all_pass
                    .store(*n == self.fast_frames, Ordering::SeqCst);
            }
        } else {
            *count.lock().unwrap() += 1;
            changed.notify_all();
        }
        Ok(empty_output())
    }
}

#[test]
fn a_source_held_in_a_stateful_step_does_not_hold_back_another_source() {
    let log = Log::default();
    let (fast_tx, fast_rx) = crossbeam_channel::unbounded();
    let passed = Arc::new((Mutex::new(0), Condvar::new()));
    let saw_all_pass = Arc::new(AtomicBool::new(false));
    let waits = WaitsForTheOtherSource {
        fast: Mutex::new(Some(fast_tx)),
        fast_frames: 10,
        passed: passed.clone(),
        saw_all_pass: saw_all_pass.clone(),
    };
    let mut graph = steps(&log, &[("a", &FROM_FRAME, &[None])]);
    graph.push(step_config("state", &STATEFUL, Arc::new(waits), &[Some(0)]));
    // Two workers: one is held by "slow" frame 0 in the stateful step, the other (and the
    // coordinator) must carry "fast" through the same step meanwhile.
    let (pool, mut executor) = hosted(graph, 2, 4);
    let never = crossbeam_channel::never();
    let mut delivered = Vec::new();
    let sources = [frames_of("slow", 2), fast_rx];
    let stats = executor.run_sources(&sources, &never, |r| {
        delivered.push((r.frame().source.to_string(), r.frame().seq));
    });
    assert!(
        saw_all_pass.load(Ordering::SeqCst),
        "\"fast\" frames waited at the stateful step behind \"slow\" frame 0"
    );
    assert_eq!((stats.processed, stats.failed), (12, 0));
    let of = |source: &str| -> Vec<u64> {
        delivered
            .iter()
            .filter(|(s, _)| s == source)
            .map(|(_, seq)| *seq)
            .collect()
    };
    assert_eq!(of("fast"), (0..10).collect::<Vec<_>>());
    assert_eq!(of("slow"), [0, 1]);
    // "slow" frame 0 was admitted first, yet "fast" results did not wait for it: each "fast"
    // frame enters the step only once the one before has finished (and gone back to the
    // coordinator), so at least nine were delivered before "slow" frame 0 (the tenth may
    // still be finishing when "slow" frame 0 wakes).
    let slow_0 = delivered.iter().position(|d| d.0 == "slow").unwrap();
    assert!(slow_0 >= 9, "delivered: {delivered:?}");
    finish(pool, executor);
}

#[test]
fn each_source_passes_a_stateful_step_in_its_own_order_with_sources_interleaved() {
    let log = Log::default();
    let behaviour = Behaviour {
        work: jittery,
        ..Behaviour::default()
    };
    let steps = steps_with(
        &log,
        &[
            ("a", &FROM_FRAME, &[None]),
            ("state", &STATEFUL, &[Some(0)]),
            ("after", &ONE, &[Some(1)]),
        ],
        behaviour,
    );
    let (pool, mut executor) = hosted(steps, 4, 6);
    let never = crossbeam_channel::never();
    let mut delivered: HashMap<String, Vec<u64>> = HashMap::new();
    let sources = [frames_of("left", 150), frames_of("right", 150)];
    executor.run_sources(&sources, &never, |r| {
        delivered
            .entry(r.frame().source.to_string())
            .or_default()
            .push(r.frame().seq);
    });
    let log = log.lock().unwrap().clone();
    for source in ["left", "right"] {
        assert_eq!(delivered[source], (0..150).collect::<Vec<_>>(), "{source}");
        // The stateful step's starts and ends alternate, in frame order: one frame at a time.
        let stateful: Vec<(u64, bool)> = log
            .iter()
            .filter(|e| e.step == "state" && e.source == source)
            .map(|e| (e.seq, e.end))
            .collect();
        let expected: Vec<(u64, bool)> = (0..150).flat_map(|s| [(s, false), (s, true)]).collect();
        assert_eq!(stateful, expected, "{source}");
    }
    finish(pool, executor);
}

#[test]
fn with_several_sources_open_the_coordinator_runs_no_step() {
    let log = Log::default();
    let (pool, mut executor) = hosted(chain(&log, 3), 2, 2);
    let never = crossbeam_channel::never();
    // Both channels stay open until every frame is delivered, so two sources are open
    // throughout (a source alone may have its steps run by the coordinator).
    let (mut senders, sources): (Vec<_>, Vec<_>) = ["left", "right"]
        .into_iter()
        .map(|name| {
            let (tx, rx) = crossbeam_channel::unbounded();
            let source: Arc<str> = name.into();
            for seq in 0..50 {
                tx.send(Frame::from_mat(
                    source.clone(),
                    seq,
                    None,
                    Default::default(),
                ))
                .unwrap();
            }
            (Some(tx), rx)
        })
        .unzip();
    let mut delivered = 0;
    let stats = executor.run_sources(&sources, &never, |_| {
        delivered += 1;
        if delivered == 100 {
            senders.iter_mut().for_each(|tx| drop(tx.take()));
        }
    });
    assert_eq!(stats.processed, 100);
    let me = std::thread::current().id();
    let here = starts(&log).iter().filter(|e| e.thread == me).count();
    assert_eq!(here, 0, "the coordinator ran {here} steps itself");
    finish(pool, executor);
}

/// Holds frame 0 until `release` says so (or `HANG_GUARD` expires); counts the other frames
/// through.
#[derive(Debug)]
struct HoldsFrameZero {
    release: crossbeam_channel::Receiver<()>,
    passed: Arc<(Mutex<u64>, Condvar)>,
}

impl Step for HoldsFrameZero {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        if input.frame.seq == 0 {
            let _ = self.release.recv_timeout(HANG_GUARD);
        } else {
            let (count, changed) = &*self.passed;
            *count.lock().unwrap() += 1;
            changed.notify_all();
        }
        Ok(empty_output())
    }
}

#[test]
fn a_slow_frame_holds_at_most_max_in_flight_frames_in_the_workflow() {
    const FRAMES: u64 = 20;
    const MAX_IN_FLIGHT: usize = 4;
    let (release_tx, release_rx) = crossbeam_channel::bounded(1);
    let passed = Arc::new((Mutex::new(0), Condvar::new()));
    let step = HoldsFrameZero {
        release: release_rx,
        passed: passed.clone(),
    };
    let graph = vec![step_config("hold", &FROM_FRAME, Arc::new(step), &[None])];
    let (pool, mut executor) = hosted(graph, 2, MAX_IN_FLIGHT);
    let workers = worker_os_threads(&pool);
    let wakeups = executor.metrics().clone();
    let (tx, rx) = crossbeam_channel::unbounded();
    let name: Arc<str> = "cam".into();
    for seq in 0..FRAMES {
        tx.send(Frame::from_mat(name.clone(), seq, None, Default::default()))
            .unwrap();
    }
    drop(tx);
    let waiting = rx.clone();
    let never = crossbeam_channel::never();
    let (coordinator_tx, coordinator) = crossbeam_channel::bounded(1);
    let delivered = std::thread::scope(|scope| {
        let running = scope.spawn(|| {
            coordinator_tx.send(os_thread()).unwrap();
            let mut delivered = Vec::new();
            executor.run(&rx, &never, |r| delivered.push(r.frame().seq));
            delivered
        });
        // Frames 1 to 3 pass while frame 0 is held: finished, but not deliverable before it.
        let (count, changed) = &*passed;
        let n = changed
            .wait_timeout_while(count.lock().unwrap(), HANG_GUARD, |n| {
                *n < MAX_IN_FLIGHT as u64 - 1
            })
            .unwrap()
            .0;
        assert_eq!(*n, MAX_IN_FLIGHT as u64 - 1);
        drop(n);
        // Until the coordinator and the workers have settled: every finished frame taken in
        // and nothing about to run. A coordinator that counted finished frames as gone would
        // have taken more frames by then.
        let mut threads = workers.clone();
        threads.push(coordinator.recv_timeout(HANG_GUARD).unwrap());
        wait_until_asleep(&threads, || {
            (
                wakeups.coordinator_wakeups.load(Ordering::Relaxed),
                waiting.len(),
            )
        });
        let left = waiting.len();
        release_tx.send(()).unwrap();
        let delivered = running.join().unwrap();
        assert_eq!(
            left,
            (FRAMES - MAX_IN_FLIGHT as u64) as usize,
            "the executor took more frames than max_in_flight while one was held"
        );
        delivered
    });
    assert_eq!(delivered, (0..FRAMES).collect::<Vec<_>>());
    finish(pool, executor);
}
