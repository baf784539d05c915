//! A sink on its own thread.
//!
//! Threads: one per sink, named `vidflow-sink-NAME`. Channel: bounded to [`SINK_QUEUE`] frame
//! results; when a sink falls behind, delivery waits (results are never dropped silently), which
//! in turn slows admission of new frames. The thread flushes whenever its queue runs empty.
//! Memory: a result holds its frame (decoder buffer, BGR if made) and every image its steps made;
//! since every sink takes every result in order, all sinks together hold at most
//! `SINK_QUEUE + 2` distinct results (queued, being written, being delivered): README "Memory".
//! Stop protocol: [`SinkRunner::close`] drops the sender; the thread writes what is queued,
//! closes the sink (finalizing its file) and returns its counts.

use std::thread::JoinHandle;

use crossbeam_channel::{Sender, TryRecvError};
use serde::Serialize;

use super::{Sink, SinkError};
use crate::workflow::FrameResult;

/// Frame results queued per sink: enough to ride out a slow write without stalling workers.
pub const SINK_QUEUE: usize = 16;

/// Counts of one sink.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SinkStats {
    /// Frames written.
    pub written: u64,
    /// Frames with nothing for this sink (its input was skipped or the frame failed).
    pub skipped: u64,
    /// Frames the sink failed to write.
    pub dropped: u64,
}

#[derive(Debug)]
pub struct SinkRunner {
    name: String,
    sender: Sender<FrameResult>,
    thread: JoinHandle<(SinkStats, Result<(), SinkError>)>,
}

impl SinkRunner {
    pub fn spawn(name: &str, sink: Box<dyn Sink>) -> Result<Self, SinkError> {
        let (sender, receiver) = crossbeam_channel::bounded::<FrameResult>(SINK_QUEUE);
        let label = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("vidflow-sink-{name}"))
            .spawn(move || {
                let mut sink = sink;
                let mut stats = SinkStats::default();
                let mut failing = false;
                loop {
                    let result = match receiver.try_recv() {
                        Ok(r) => r,
                        Err(TryRecvError::Empty) => {
                            if let Err(e) = sink.idle() {
                                tracing::error!(sink = %label, error = %e, "flush failed");
                            }
                            match receiver.recv() {
                                Ok(r) => r,
                                Err(_) => break,
                            }
                        }
                        Err(TryRecvError::Disconnected) => break,
                    };
                    match sink.write(&result) {
                        Ok(true) => {
                            stats.written += 1;
                            failing = false;
                        }
                        Ok(false) => stats.skipped += 1,
                        Err(e) => {
                            stats.dropped += 1;
                            if !failing {
                                tracing::error!(sink = %label, error = %e, "write failed");
                                failing = true;
                            }
                        }
                    }
                }
                (stats, sink.close())
            })
            .map_err(|e| SinkError::Other(format!("cannot spawn sink thread: {e}")))?;
        Ok(Self {
            name: name.to_owned(),
            sender,
            thread,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queues a result, waiting while the sink's queue is full.
    pub fn send(&self, result: FrameResult) {
        // Fails only if the sink thread died; its join reports that.
        let _ = self.sender.send(result);
    }

    /// Writes what is queued, finalizes the output and returns the counts.
    pub fn close(self) -> (SinkStats, Result<(), SinkError>) {
        drop(self.sender);
        self.thread.join().unwrap_or_else(|_| {
            (
                SinkStats::default(),
                Err(SinkError::Other(format!("sink \"{}\" panicked", self.name))),
            )
        })
    }
}
