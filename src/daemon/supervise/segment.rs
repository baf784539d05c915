//! The executor's thread and what it is given: one segment at a time (see the module above).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{Receiver, Sender};

use super::super::Live;
use super::super::counts::LastCounts;
use super::super::shutdown::Delivered;
use super::super::taps::Taps;
use crate::frame::Frame;
use crate::sinks::SinkSender;
use crate::workflow::{Executor, RunStats};

/// What the executor's thread runs until it is paused or its queues close.
pub(in crate::daemon) struct Segment {
    pub executor: Executor,
    pub queues: Vec<Receiver<Frame>>,
    pub sinks: Vec<SinkSender>,
    pub last_counts: Arc<LastCounts>,
    /// The event store's and the live stream's share of each result.
    pub taps: Arc<Taps>,
    /// Ends the segment: no more frames admitted, those in flight finish.
    pub pause: Receiver<()>,
}

/// From the executor's thread.
pub(in crate::daemon) enum FromExecutor {
    /// Drained for a swap; the thread waits for the next segment.
    Paused(RunStats, Executor),
    /// The run's workflow is over.
    Finished(RunStats, Executor),
}

/// The executor's thread: segment after segment, until one ends without a hand-over.
pub(in crate::daemon) fn executor_thread(
    first: Segment,
    next: &Receiver<Segment>,
    handing_over: &AtomicBool,
    out: &Sender<FromExecutor>,
    delivered: &Delivered,
    live: &Live,
) {
    let mut segment = first;
    loop {
        let Segment {
            mut executor,
            queues,
            sinks,
            last_counts,
            taps,
            pause,
        } = segment;
        let stats = executor.run_sources(&queues, &pause, |result| {
            if delivered.count(&result) {
                live.count_delivered(result.failure().is_some());
                last_counts.record(&result);
                taps.record(&result);
                for sink in &sinks {
                    sink.send(result.clone());
                }
            }
        });
        // The old senders go before the daemon closes the sinks they fed.
        drop((queues, sinks, last_counts, taps));
        let swap = stats.stopped_by.is_none() && handing_over.swap(false, Ordering::AcqRel);
        if !swap {
            let _ = out.send(FromExecutor::Finished(stats, executor));
            return;
        }
        if out.send(FromExecutor::Paused(stats, executor)).is_err() {
            return;
        }
        match next.recv() {
            Ok(s) => segment = s,
            Err(_) => return,
        }
    }
}
