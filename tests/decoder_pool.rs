//! A source whose frames come from a small fixed pool (a camera driver's, a hardware decoder's)
//! keeps streaming however many frames the workflow and the sinks hold: once its frames hold
//! the buffers the pool can spare, the next frames are copied out of it and the buffers go back
//! at once, so the producer never waits for one and the stall timeout never fires.
//!
//! The pool is GStreamer's own: the test source's `pool=4` (a `test://` option made for this:
//! no element available here has a fixed pool, so the appsink answers the allocation query with
//! one of 4 buffers, as a `v4l2src` camera would have) makes `videotestsrc` draw into a pool of
//! 4 and wait while all 4 are out. The frames go through the real source and the real executor
//! with a step that is slow on some frames (the frames behind a slow one wait in the reorder
//! buffer), to a sink stand-in that keeps every result until the end: a sink whose queue holds
//! every frame.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use vidflow::source::{Reconnect, SourceConfig, SourceOptions, SourceUri};

const FRAMES: u64 = 40;

#[test]
fn a_small_decoder_pool_never_stalls_its_source_while_the_workflow_holds_its_frames() {
    gst_init();
    let config = SourceConfig {
        name: "cam".into(),
        uri: SourceUri::parse("test://ball?width=64&height=48&fps=30&pool=4").unwrap(),
        options: SourceOptions {
            // Room for every frame: none is dropped, whatever the workflow holds.
            queue: FRAMES as usize,
            // A producer starved of buffers stalls quickly and comes back quickly.
            stall_timeout: Duration::from_millis(500),
            reconnect: Reconnect {
                initial_delay: Duration::from_millis(100),
                ..Reconnect::default()
            },
            ..SourceOptions::default()
        },
        uri_span: 0..0,
        record: None,
    };
    let (tx, rx) = crossbeam_channel::bounded(FRAMES as usize);
    let source = vidflow::source::start(&config, tx, &rx, Some(FRAMES)).unwrap();
    let counters = source.counters().clone();
    let log = Log::default();
    let behaviour = Behaviour {
        work: |_, seq| {
            if seq % 8 == 3 {
                Duration::from_millis(300)
            } else {
                Duration::ZERO
            }
        },
        ..Behaviour::default()
    };
    let steps = steps_with(&log, &[("slow", &FROM_FRAME, &[None])], behaviour);
    let (pool, mut executor) = hosted(steps, 2, 8);
    let never = crossbeam_channel::never();
    let mut kept = Vec::new();
    let stats = executor.run(&rx, &never, |r| kept.push(r));
    source.join().unwrap();
    finish(pool, executor);

    assert_eq!(counters.reconnects.load(Ordering::Relaxed), 0, "it stalled");
    assert_eq!(counters.attempts.load(Ordering::Relaxed), 1, "it stalled");
    assert_eq!(counters.decoded.load(Ordering::Relaxed), FRAMES);
    assert_eq!(counters.dropped.load(Ordering::Relaxed), 0);
    assert_eq!((stats.processed, stats.failed), (FRAMES, 0));
    assert_eq!(seqs(&kept), (0..FRAMES).collect::<Vec<_>>());
    // Half the pool is held zero-copy (the rest is the producer's); the others are copies.
    let zero_copy = kept.iter().filter(|r| r.frame().is_zero_copy()).count() as u64;
    assert_eq!(zero_copy, 2);
    assert_eq!(counters.copied.load(Ordering::Relaxed), FRAMES - zero_copy);
}
