//! A sink on its own thread.
//!
//! Threads: one per sink, named `vidflow-sink-NAME`. Channel: bounded to [`SINK_QUEUE`] frame
//! results; when a sink falls behind, delivery waits (results are never dropped silently), which
//! in turn slows admission of new frames. The thread flushes whenever its queue runs empty.
//! Memory: a result holds its frame (decoder buffer, BGR if made) and every image its steps made;
//! since every sink takes every result in order, all sinks together hold at most
//! `SINK_QUEUE + 2` distinct results (queued, being written, being delivered): README "Memory".
//!
//! Stop protocol: [`SinkRunner::close`] drops the sender and a `close` signal; the thread writes
//! what is queued, closes the sink (finalizing its file) and returns its counts. The signal lets
//! the sink close even while a clone of the sender is still held elsewhere (an executor thread
//! abandoned at the stop deadline): results queued by then are written, later ones are refused.
//! [`SinkRunner::close_until`] waits for that only until a deadline; a sink still busy then is
//! abandoned (its thread detached, never joined).

use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use serde::Serialize;

use super::{Sink, SinkError};
use crate::outcome::FrameResult;

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

/// What a sink thread hands back when it ends: its counts and how closing went.
type Closed = (SinkStats, Result<(), SinkError>);

#[derive(Debug)]
pub struct SinkRunner {
    name: String,
    sender: Sender<FrameResult>,
    /// Dropped to tell the thread to write what is queued and close.
    close: Sender<()>,
    /// The thread's last act sends its counts here, so closing can wait with a deadline.
    closed: Receiver<Closed>,
    thread: JoinHandle<()>,
}

impl SinkRunner {
    pub fn spawn(name: &str, sink: Box<dyn Sink>) -> Result<Self, SinkError> {
        let (sender, receiver) = crossbeam_channel::bounded::<FrameResult>(SINK_QUEUE);
        let (close, close_rx) = crossbeam_channel::bounded::<()>(0);
        let (closed_tx, closed) = crossbeam_channel::bounded::<Closed>(1);
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
                            crossbeam_channel::select! {
                                recv(receiver) -> r => match r {
                                    Ok(r) => r,
                                    Err(_) => break,
                                },
                                recv(close_rx) -> _ => break,
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
                let _ = closed_tx.send((stats, sink.close()));
            })
            .map_err(|e| SinkError::Other(format!("cannot spawn sink thread: {e}")))?;
        Ok(Self {
            name: name.to_owned(),
            sender,
            close,
            closed,
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

    /// Another way to queue results for this sink (for a thread of its own).
    pub fn sender(&self) -> Sender<FrameResult> {
        self.sender.clone()
    }

    /// Writes what is queued, finalizes the output and returns the counts.
    pub fn close(self) -> (SinkStats, Result<(), SinkError>) {
        let name = self.name.clone();
        self.close_until(None).unwrap_or_else(|| {
            (
                SinkStats::default(),
                Err(SinkError::Other(format!("sink \"{name}\" panicked"))),
            )
        })
    }

    /// Like [`SinkRunner::close`], waiting only until `deadline` (if any): `None` when the sink
    /// was still busy then; its thread is abandoned.
    pub fn close_until(
        self,
        deadline: Option<Instant>,
    ) -> Option<(SinkStats, Result<(), SinkError>)> {
        let Self {
            name,
            sender,
            close,
            closed,
            thread,
        } = self;
        drop(sender);
        drop(close);
        let got = match deadline {
            Some(deadline) => closed.recv_deadline(deadline),
            None => closed.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(done) => {
                let _ = thread.join();
                Some(done)
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                Some((
                    SinkStats::default(),
                    Err(SinkError::Other(format!("sink \"{name}\" panicked"))),
                ))
            }
            Err(RecvTimeoutError::Timeout) => None,
        }
    }
}
