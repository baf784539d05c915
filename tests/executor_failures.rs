//! What a failing step does to its frame and to the run, on the real pool and executor: a
//! failed frame drains its running steps and skips the others, a panic (in a step or around it)
//! fails only its frame and is counted, a stateful step that panics has its state for that
//! source reset, a step may end its branch without failing. Steps are small recording probes,
//! for a panic whose payload panics again one written here, and for the reset the real tracker
//! with a fault injected around it (`PanicsAfter`: the tracker never panics on real input) fed
//! by a scripted detector (the only stand-ins: these behaviours need steps that fail or panic
//! on command).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use opencv::core::Rect;
use vidflow::steps::{Step, StepError, StepInput, StepOutput};
use vidflow::value::{BBox, Detection, Value};
use vidflow::workflow::Outcome;

#[test]
fn a_failed_frame_drains_its_running_siblings_before_it_is_reported() {
    let log = Log::default();
    let behaviour = Behaviour {
        work: |name, seq| {
            if name == "slow" && seq == 3 {
                Duration::from_millis(150)
            } else {
                Duration::ZERO
            }
        },
        fail: |name, seq| name == "bad" && seq == 3,
        ..Behaviour::default()
    };
    let steps = steps_with(
        &log,
        &[
            ("a", &FROM_FRAME, &[None]),
            ("slow", &ONE, &[Some(0)]),
            ("bad", &ONE, &[Some(0)]),
            ("after_bad", &ONE, &[Some(2)]),
        ],
        behaviour,
    );
    let (pool, mut executor) = hosted(steps, 2, 2);
    let never = crossbeam_channel::never();
    let mut seen_at_report = None;
    let mut failures = Vec::new();
    let stats = executor.run(&frames(10), &never, |r| {
        if r.frame().seq == 3 {
            seen_at_report = Some(log.lock().unwrap().clone());
        }
        failures.push(r.failure());
    });
    let at_report = seen_at_report.unwrap();
    assert!(
        position(&at_report, "slow", 3, true).is_some(),
        "frame 3 was reported while its slow sibling still ran"
    );
    assert!(position(&at_report, "after_bad", 3, false).is_none());
    let f = failures[3].clone().unwrap();
    assert_eq!(f.step.as_ref(), "bad");
    assert!(f.message.contains("fails on frame 3"), "{}", f.message);
    assert!(
        failures
            .iter()
            .enumerate()
            .all(|(i, f)| (i == 3) == f.is_some())
    );
    assert_eq!((stats.processed, stats.failed), (9, 1));
    finish(pool, executor);
}

#[test]
fn unstarted_steps_of_a_failed_frame_are_skipped() {
    let log = Log::default();
    let behaviour = Behaviour {
        fail: |name, _| name == "bad",
        ..Behaviour::default()
    };
    // One worker, and every ready step goes through the pool's FIFO queue (no inline
    // continuation, no batch claimed by two threads): after "a", "bad" is queued before "c"
    // and "d", so it has failed the frame before either can start, on every run.
    let steps = steps_with(
        &log,
        &[
            ("a", &FROM_FRAME, &[None]),
            ("bad", &ONE, &[Some(0)]),
            ("c", &ONE, &[Some(0)]),
            ("d", &ONE, &[Some(0)]),
            ("e", &ONE, &[Some(2)]),
        ],
        behaviour,
    );
    let (pool, executor) = hosted(steps, 1, 1);
    let mut executor = executor.without_inline_continuation();
    let out = run_all(&mut executor, frames(5));
    assert_eq!(out.len(), 5);
    for r in &out {
        assert!(matches!(r.outcome(1), Some(Outcome::Failed)));
        for node in 2..5 {
            assert!(
                matches!(r.outcome(node), Some(Outcome::Skipped)),
                "node {node}"
            );
        }
    }
    let ran: HashSet<String> = starts(&log).into_iter().map(|e| e.step).collect();
    assert_eq!(ran, HashSet::from(["a".to_owned(), "bad".to_owned()]));
    finish(pool, executor);
}

#[test]
fn a_panicking_step_fails_its_frame_and_the_pool_keeps_its_size() {
    let log = Log::default();
    let behaviour = Behaviour {
        work: |_, _| Duration::from_millis(1),
        panic: |name, seq| name == "b" && seq % 10 == 5,
        ..Behaviour::default()
    };
    let steps = steps_with(
        &log,
        &[
            ("a", &FROM_FRAME, &[None]),
            ("b", &ONE, &[Some(0)]),
            ("c", &ONE, &[Some(0)]),
        ],
        behaviour,
    );
    let (pool, mut executor) = hosted(steps, 2, 2);
    let out = run_all(&mut executor, frames(100));
    for r in &out {
        let seq = r.frame().seq;
        match r.failure() {
            Some(f) => {
                assert_eq!(seq % 10, 5);
                assert_eq!(f.step.as_ref(), "b");
                assert!(f.message.contains("panicked"), "{}", f.message);
            }
            None => assert_ne!(seq % 10, 5),
        }
    }
    assert_eq!(pool.size(), 2);
    // Every panic is counted, though the pool never sees one (the executor catches it).
    assert_eq!(executor.metrics().step_panics.load(Ordering::Relaxed), 10);
    // Both workers survived the ten panics: the last frames still ran on both workers (the
    // coordinator, this thread, runs some steps too), and on no new thread.
    let me = std::thread::current().id();
    let workers = |frames: std::ops::Range<u64>| -> HashSet<_> {
        starts(&log)
            .into_iter()
            .filter(|e| frames.contains(&e.seq) && e.thread != me)
            .map(|e| e.thread)
            .collect()
    };
    let all = workers(0..100);
    assert_eq!(all.len(), 2, "new threads appeared");
    assert_eq!(workers(80..100), all, "a worker died");
    finish(pool, executor);
}

#[test]
fn a_step_that_ends_its_branch_skips_its_dependents_without_failing_the_frame() {
    let log = Log::default();
    let behaviour = Behaviour {
        end_branch: |name, seq| name == "gate" && seq % 2 == 0,
        ..Behaviour::default()
    };
    let steps = steps_with(
        &log,
        &[
            ("a", &FROM_FRAME, &[None]),
            ("gate", &ONE, &[Some(0)]),
            ("after_gate", &ONE, &[Some(1)]),
            ("other", &ONE, &[Some(0)]),
        ],
        behaviour,
    );
    let (pool, mut executor) = hosted(steps, 2, 2);
    let never = crossbeam_channel::never();
    let mut out = Vec::new();
    let stats = executor.run(&frames(20), &never, |r| out.push(r));
    assert_eq!((stats.processed, stats.failed), (20, 0));
    for r in &out {
        let even = r.frame().seq % 2 == 0;
        assert!(r.failure().is_none());
        assert_eq!(matches!(r.outcome(2), Some(Outcome::Skipped)), even);
        assert!(matches!(r.outcome(3), Some(Outcome::Done(_))));
    }
    let log = starts(&log);
    assert!(
        log.iter()
            .all(|e| !(e.step == "after_gate" && e.seq % 2 == 0))
    );
    assert_eq!(log.iter().filter(|e| e.step == "after_gate").count(), 10);
    finish(pool, executor);
}

/// Outputs one detection when its optional input had a value on the frame, none otherwise.
#[derive(Debug)]
struct SaysWhetherItSawItsInput;

impl Step for SaysWhetherItSawItsInput {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let seen = input.optional::<[Detection]>(0)?.is_some();
        let out: Vec<Detection> = if seen {
            vec![Detection::new(
                "seen".into(),
                1.0,
                BBox::from(Rect::new(0, 0, 1, 1)),
            )]
        } else {
            Vec::new()
        };
        Ok(StepOutput::Values(vec![Value::Detections(out.into())]))
    }
}

#[test]
fn a_step_with_an_optional_input_runs_without_it_when_that_branch_ended() {
    let log = Log::default();
    let behaviour = Behaviour {
        end_branch: |name, seq| name == "gate" && seq % 2 == 0,
        fail: |name, seq| name == "gate" && seq % 5 == 3,
        ..Behaviour::default()
    };
    let mut steps = steps_with(
        &log,
        &[
            ("a", &FROM_FRAME, &[None]),
            ("gate", &ONE, &[Some(0)]),
            ("required", &ONE, &[Some(1)]),
        ],
        behaviour,
    );
    steps.push(step_config(
        "optional",
        &OPTIONAL,
        Arc::new(SaysWhetherItSawItsInput),
        &[Some(1)],
    ));
    let (pool, mut executor) = hosted(steps, 2, 2);
    let out = run_all(&mut executor, frames(20));
    assert_eq!(out.len(), 20);
    for r in &out {
        let seq = r.frame().seq;
        if seq % 5 == 3 {
            // A failed frame runs nothing more, optional inputs or not.
            assert!(r.failure().is_some());
            assert!(!matches!(r.outcome(3), Some(Outcome::Done(_))), "{seq}");
            continue;
        }
        let ended = seq % 2 == 0;
        assert_eq!(
            matches!(r.outcome(2), Some(Outcome::Skipped)),
            ended,
            "{seq}"
        );
        let Some(Outcome::Done(values)) = r.outcome(3) else {
            panic!("the optional reader did not run on frame {seq}");
        };
        let seen = values[0].get::<[Detection]>().unwrap().len() == 1;
        assert_eq!(seen, !ended, "frame {seq}");
    }
    finish(pool, executor);
}

/// A panic payload that panics again when dropped: the panic escapes the catch around
/// `Step::run` (whose handler drops the payload), like any panic outside the step.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("payload dropped");
    }
}

/// Panics with a [`PanicOnDrop`] payload on frames 2, 7, 12...
#[derive(Debug)]
struct PanicsOutsideItsCatch;

impl Step for PanicsOutsideItsCatch {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        if input.frame.seq % 5 == 2 {
            std::panic::panic_any(PanicOnDrop);
        }
        Ok(empty_output())
    }
}

#[test]
fn a_panic_outside_a_step_still_finishes_its_node_and_fails_only_its_frame() {
    let log = Log::default();
    let mut graph = steps(&log, &[("a", &FROM_FRAME, &[None])]);
    // Stateful: its gate must pass to the next frame even after the panic.
    graph.push(step_config(
        "bad",
        &STATEFUL,
        Arc::new(PanicsOutsideItsCatch),
        &[Some(0)],
    ));
    // (Inputs index the whole graph: "after" reads "bad".)
    graph.extend(steps(&log, &[("after", &ONE, &[Some(1)])]));
    let (pool, mut executor) = hosted(graph, 2, 3);
    let metrics = executor.metrics().clone();
    // The run is on its own thread so that a hang fails the test instead of stalling it.
    let (tx, rx) = crossbeam_channel::bounded(1);
    let coordinator = std::thread::spawn(move || {
        let never = crossbeam_channel::never();
        let mut out = Vec::new();
        let stats = executor.run(&frames(20), &never, |r| out.push(r));
        tx.send((stats, out)).unwrap();
        executor
    });
    let (stats, out) = rx
        .recv_timeout(HANG_GUARD)
        .expect("the run never ended: a node did not finish");
    assert_eq!(seqs(&out), (0..20).collect::<Vec<_>>());
    assert_eq!((stats.processed, stats.failed), (16, 4));
    for r in &out {
        let bad = r.frame().seq % 5 == 2;
        assert_eq!(r.failure().is_some(), bad, "frame {}", r.frame().seq);
        if let Some(f) = r.failure() {
            assert_eq!(f.step.as_ref(), "bad");
            assert!(f.message.contains("panicked"), "{}", f.message);
            assert!(matches!(r.outcome(2), Some(Outcome::Skipped)));
        }
    }
    // Each bad frame: the step's panic, then its payload's when dropped.
    assert_eq!(metrics.step_panics.load(Ordering::Relaxed), 8);
    assert_eq!(pool.metrics().panics.load(Ordering::Relaxed), 0);
    finish(pool, coordinator.join().unwrap());
}

/// One object per frame: at the left on frames 0 to 4, far to the right from frame 5 on.
fn left_then_right(_: &str, seq: u64) -> Vec<Detection> {
    let x = if seq < 5 { 0.0 } else { 300.0 };
    let bbox = BBox {
        x,
        y: 0.0,
        width: 40.0,
        height: 40.0,
    };
    vec![Detection::new("thing".into(), 0.9, bbox)]
}

#[test]
fn a_panic_in_a_stateful_step_resets_its_state_for_that_source_only() {
    let logs = captured_logs();
    // The real tracker, as a pipeline file builds it, with a fault injected: on frame 5 of
    // source "a" it tracks (its state moves on), then panics.
    let text = r#"
[sources.cam]
uri = "test://ball"
[steps.found]
kind = "motion"
image = "$frame"
[steps.tracks]
kind = "tracker"
detections = "$steps.found.detections"
min_hits = 1
# The object that leaves is reported as predicted for a few frames (the default reports none).
report_lost = 5
"#;
    let mut p =
        vidflow::config::load_text(&vidflow::config::SourceText::new("t.toml", text.to_owned()))
            .unwrap();
    let mut tracks = p.steps.remove(1);
    assert!(tracks.kind.stateful);
    tracks.step = Arc::new(PanicsAfter {
        step: tracks.step,
        when: |source, seq| source == "a" && seq == 5,
    });
    let found = step_config(
        "found",
        &FROM_FRAME,
        Arc::new(Scripted {
            script: left_then_right,
        }),
        &[None],
    );
    let (pool, mut executor) = hosted(vec![found, tracks], 2, 4);
    let never = crossbeam_channel::never();
    let mut out = Vec::new();
    executor.run_sources(&[frames_of("a", 8), frames_of("b", 8)], &never, |r| {
        out.push(r)
    });
    // Per source and frame: the tracks as (ID, predicted), or None for a failed frame.
    let seen = |source: &str| -> Vec<Option<Vec<(u64, bool)>>> {
        let mut frames: Vec<_> = out
            .iter()
            .filter(|r| r.frame().source.as_ref() == source)
            .collect();
        frames.sort_by_key(|r| r.frame().seq);
        frames
            .iter()
            .map(|r| {
                let tracks = r.value(vidflow::spec::Ref::Step { step: 1, output: 0 })?;
                let tracks = tracks.get::<[vidflow::value::Track]>().unwrap();
                Some(tracks.iter().map(|t| (t.track_id, t.predicted)).collect())
            })
            .collect()
    };
    let left = Some(vec![(1, false)]);
    // Source b: the object on the left is predicted on, and the one on the right is track 2.
    let both = Some(vec![(1, true), (2, false)]);
    let b = seen("b");
    assert_eq!(b[..5], vec![left.clone(); 5]);
    assert_eq!(b[5..], vec![both.clone(); 3]);
    // Source a: frame 5 failed; its tracks were dropped, so the object on the right is the
    // first track of a fresh tracker, and nothing is predicted on the left.
    let a = seen("a");
    assert_eq!(a[..5], vec![left.clone(); 5]);
    assert_eq!(a[5], None);
    assert_eq!(a[6..], vec![left; 2], "the state of a was not reset");
    let metrics = executor.metrics();
    assert_eq!(metrics.step_panics.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.step_state_resets.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.steps[1].state_resets.load(Ordering::Relaxed), 1);
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let line = |source: &str| {
        format!(
            "step \"tracks\" panicked on source \"{source}\"; its state for that source was reset"
        )
    };
    assert!(logs.contains(&line("a")), "{logs}");
    assert!(!logs.contains(&line("b")), "{logs}");
    assert!(
        logs.lines()
            .any(|l| l.contains(" WARN ") && l.contains(&line("a"))),
        "{logs}"
    );
    finish(pool, executor);
}
