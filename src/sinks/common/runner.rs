//! A sink on its own thread.
//!
//! Threads: one per sink, named `vidflow-sink-NAME`. Channel: bounded to [`SINK_QUEUE`] frame
//! results, fed through a [`SinkSender`] (the executor's thread delivers through it). Each sink
//! takes only the frames of the sources it is routed to (`sources = [...]`, default all). When
//! its queue is full, `on_full` decides: [`OnFull::Block`] (files) makes delivery wait, which in
//! turn slows admission of new frames, so nothing is lost; [`OnFull::DropOldest`] (network
//! sinks) takes the oldest queued result out and counts it as dropped, so a stalled sink never
//! holds the workflow or the other sinks. A sink whose writes fail keeps taking its queue
//! (counting each frame as dropped, logging once per run of failures), so delivery never waits
//! on it. The thread flushes whenever its queue runs empty, and wakes again when the sink asks
//! ([`Sink::wake_at`], e.g. a periodic fsync); otherwise it blocks on its channels.
//! Memory: a result holds its frame (decoder buffer, BGR if made) and every image its steps made;
//! since every sink takes every result in order, all sinks together hold at most
//! `SINK_QUEUE + 2` distinct results (queued, being written, being delivered): README "Memory".
//!
//! Stop protocol: [`SinkRunner::close`] drops the sender and a `close` signal; the thread writes
//! what is queued, closes the sink (finalizing its file) and returns its counts. The signal lets
//! the sink close even while a clone of the sender is still held elsewhere (an executor thread
//! abandoned at the stop deadline): results queued by then are written, later ones are refused.
//! [`SinkRunner::begin_close`] signals without waiting, so that every sink finalizes at the
//! same time; [`Closing::wait_until`] then waits only until a deadline; a sink still busy then
//! is abandoned (its thread detached, never joined).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError};
use serde::Serialize;

use crate::outcome::FrameResult;
use crate::sinks::{Sink, SinkError};
use crate::throttle::{self, Say, Throttle};

/// Frame results queued per sink: enough to ride out a slow write without stalling workers.
pub(crate) const SINK_QUEUE: usize = 16;

/// What delivery does when a sink's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFull {
    /// Wait for room: nothing is lost, a slow sink slows the workflow.
    Block,
    /// Take the oldest queued result out (counted as dropped) and queue the new one.
    DropOldest,
}

impl OnFull {
    /// The name used in pipeline files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Block => "block",
            Self::DropOldest => "drop_oldest",
        }
    }
}

/// Which frames a sink takes, and what delivery does when its queue is full.
#[derive(Debug, Clone)]
pub struct Routing {
    /// The sources whose frames the sink takes; `None`: every source.
    pub sources: Option<Arc<[Arc<str>]>>,
    pub on_full: OnFull,
}

impl Default for Routing {
    fn default() -> Self {
        Self {
            sources: None,
            on_full: OnFull::Block,
        }
    }
}

/// Counts of one sink.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SinkStats {
    /// Frames written (for a sink that writes behind its thread, an encoder: frames it took,
    /// less those it lost afterwards; at the end, frames in finished files).
    pub written: u64,
    /// Frames with nothing for this sink (its input was skipped or the frame failed).
    pub skipped: u64,
    /// Frames lost: the sink failed to write them (or took them and lost them afterwards), or
    /// they were dropped from its full queue (`on_full = "drop_oldest"`).
    pub dropped: u64,
}

/// A sink's counts as it runs. Written by the sink's thread only, read by observers (relaxed:
/// statistics). The final [`SinkStats`] are these, plus the overflow of the queue.
#[derive(Debug, Default)]
struct SinkCounters {
    written: AtomicU64,
    skipped: AtomicU64,
    /// Failed writes (the queue's overflow is counted apart, by the delivering threads).
    failed: AtomicU64,
    /// Whether the last write failed.
    failing: AtomicBool,
    /// Frames the sink took and lost afterwards ([`Sink::lost_after_write`]): written by the
    /// sink's thread (relaxed, like the rest).
    lost_after_write: Option<Arc<AtomicU64>>,
}

impl SinkCounters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, with `overflow` results dropped from the full queue: a frame the
    /// sink took and lost afterwards is dropped, not written.
    fn stats(&self, overflow: &AtomicU64) -> SinkStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let lost = self.lost_after_write.as_deref().map_or(0, get);
        SinkStats {
            written: get(&self.written).saturating_sub(lost),
            skipped: get(&self.skipped),
            dropped: get(&self.failed) + get(overflow) + lost,
        }
    }
}

/// What a sink thread hands back when it ends: its counts and how closing went.
type Closed = (SinkStats, Result<(), SinkError>);

#[derive(Debug)]
pub struct SinkRunner {
    name: String,
    sender: SinkSender,
    /// Dropped to tell the thread to write what is queued and close.
    close: Sender<()>,
    /// The thread's last act sends its counts here, so closing can wait with a deadline.
    closed: Receiver<Closed>,
    thread: JoinHandle<()>,
}

/// Delivers results to one sink, following its [`Routing`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SinkSender {
    name: Arc<str>,
    sender: Sender<FrameResult>,
    /// The queue's other end, to take the oldest result out when full (drop_oldest).
    queue: Receiver<FrameResult>,
    routing: Routing,
    /// Results dropped from the full queue. Written by delivering threads, read by the sink's
    /// thread when it ends (relaxed: a plain counter, the channel orders nothing through it).
    overflow: Arc<AtomicU64>,
    counters: Arc<SinkCounters>,
}

impl SinkSender {
    /// The sink's counts so far (what its final [`SinkStats`] will be if nothing else comes).
    pub fn stats(&self) -> SinkStats {
        self.counters.stats(&self.overflow)
    }

    /// Results waiting in the sink's queue.
    pub fn queue_len(&self) -> usize {
        self.sender.len()
    }

    /// Whether the sink's last write failed (it keeps taking frames, counting them as dropped).
    pub fn failing(&self) -> bool {
        self.counters.failing.load(Ordering::Relaxed)
    }

    /// Whether this sink takes frames of `source`.
    pub fn takes(&self, source: &str) -> bool {
        self.routing
            .sources
            .as_ref()
            .is_none_or(|s| s.iter().any(|s| &**s == source))
    }

    /// Queues a result if the sink takes its source, as `on_full` says when the queue is full.
    pub fn send(&self, result: FrameResult) {
        if !self.takes(&result.frame().source) {
            return;
        }
        match self.routing.on_full {
            // Fails only if the sink thread ended; its close reports why.
            OnFull::Block => {
                let _ = self.sender.send(result);
            }
            OnFull::DropOldest => {
                let mut result = result;
                loop {
                    match self.sender.try_send(result) {
                        Ok(()) | Err(TrySendError::Disconnected(_)) => return,
                        Err(TrySendError::Full(back)) => {
                            result = back;
                            if self.queue.try_recv().is_ok()
                                && self.overflow.fetch_add(1, Ordering::Relaxed) == 0
                            {
                                tracing::warn!(sink = %self.name, "sink queue full; dropping its oldest results");
                            }
                        }
                    }
                }
            }
        }
    }
}

impl SinkRunner {
    pub fn spawn(name: &str, sink: Box<dyn Sink>, routing: Routing) -> Result<Self, SinkError> {
        let (sender, receiver) = crossbeam_channel::bounded::<FrameResult>(SINK_QUEUE);
        let (close, close_rx) = crossbeam_channel::bounded::<()>(0);
        let (closed_tx, closed) = crossbeam_channel::bounded::<Closed>(1);
        let overflow = Arc::new(AtomicU64::new(0));
        let counters = Arc::new(SinkCounters {
            lost_after_write: sink.lost_after_write(),
            ..SinkCounters::default()
        });
        let sender = SinkSender {
            name: name.into(),
            sender,
            queue: receiver.clone(),
            routing,
            overflow: overflow.clone(),
            counters: counters.clone(),
        };
        let label = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("vidflow-sink-{name}"))
            .spawn(move || {
                let mut sink = sink;
                let panicked = write_all(&label, sink.as_mut(), &receiver, &close_rx, &counters);
                // Closing may lose frames the sink took (a segment that is not finalized):
                // counted after it. A sink that panicked is still closed (its file finalized
                // if it can be), and the run told.
                let closed = catch_unwind(AssertUnwindSafe(|| sink.close()))
                    .unwrap_or_else(|p| Err(panicked_error(&label, &*p)));
                let closed = match panicked {
                    Some(error) => closed.and(Err(error)),
                    None => closed,
                };
                let _ = closed_tx.send((counters.stats(&overflow), closed));
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
}

/// The sink thread's loop: writes every result until the channel disconnects or the close
/// signal comes, flushing when the queue runs empty; counts into `counters`. A sink that
/// panics is called no more: its queue is still taken, every frame counted as failed, so that
/// delivery never waits on a thread that is gone (the sender holds a receiver of the queue, so
/// the channel never disconnects). Returns the panic, if one came.
fn write_all(
    label: &str,
    sink: &mut dyn Sink,
    receiver: &Receiver<FrameResult>,
    close: &Receiver<()>,
    counters: &SinkCounters,
) -> Option<SinkError> {
    // Failures as logged: the first of each message, then a count every INTERVAL.
    let said = Throttle::default();
    let mut panicked: Option<SinkError> = None;
    // `f` on the sink, unless it panicked before (then, or if `f` panics, an error).
    let mut guarded = |f: &mut dyn FnMut() -> Result<bool, SinkError>| -> Result<bool, SinkError> {
        if panicked.is_none() {
            match catch_unwind(AssertUnwindSafe(&mut *f)) {
                Ok(done) => return done,
                Err(p) => {
                    let error = panicked_error(label, &*p);
                    let said = SinkError::Other(error.to_string());
                    panicked = Some(error);
                    return Err(said);
                }
            }
        }
        Err(SinkError::Other("the sink panicked before".to_owned()))
    };
    // Set by the close signal: what is queued then is still written, then the loop ends.
    let mut closing = false;
    loop {
        let result = match receiver.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) if closing => break,
            Err(TryRecvError::Empty) => {
                if let Err(e) = guarded(&mut || sink.idle().map(|()| true)) {
                    tracing::error!(sink = %label, error = %e, "flush failed");
                }
                let wake = sink
                    .wake_at()
                    .map_or_else(crossbeam_channel::never, crossbeam_channel::at);
                crossbeam_channel::select! {
                    recv(receiver) -> r => match r {
                        Ok(r) => r,
                        Err(_) => break,
                    },
                    // `select!` picks any ready arm: a result may be queued as well.
                    recv(close) -> _ => {
                        closing = true;
                        continue;
                    }
                    recv(wake) -> _ => continue,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        let failing = match guarded(&mut || sink.write(&result)) {
            Ok(true) => {
                SinkCounters::bump(&counters.written);
                false
            }
            Ok(false) => {
                SinkCounters::bump(&counters.skipped);
                false
            }
            Err(e) => {
                SinkCounters::bump(&counters.failed);
                let message = e.to_string();
                match said.hit(label, &message) {
                    Say::First => tracing::error!(
                        sink = %label,
                        error = %message,
                        "write failed; frames are counted as dropped (the same failure again is \
                         counted, and said every {} s)",
                        throttle::INTERVAL.as_secs()
                    ),
                    Say::Again { more, over } => lost_more(label, more, over, &message),
                    Say::Counted => {}
                }
                true
            }
        };
        counters.failing.store(failing, Ordering::Relaxed);
    }
    for u in said.drain() {
        lost_more(label, u.more, u.over, &u.cause);
    }
    panicked
}

/// `sink "NAME" panicked: MESSAGE`, for a panic's payload `p`.
fn panicked_error(label: &str, p: &(dyn std::any::Any + Send)) -> SinkError {
    let message = crate::spec::panic_text(p).unwrap_or_default();
    SinkError::Other(format!("sink \"{label}\" panicked: {message}"))
}

/// Says that sink `label` lost `more` more frames in the last `over`, with `message`.
fn lost_more(label: &str, more: u64, over: std::time::Duration, message: &str) {
    tracing::error!(
        sink = %label,
        frames = more,
        "sink \"{label}\" failed to write {more} more frame(s) in the last {:.1} s: {message}",
        over.as_secs_f64()
    );
}

impl SinkRunner {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queues a result as the sink's routing says (see [`SinkSender::send`]).
    pub fn send(&self, result: FrameResult) {
        self.sender.send(result);
    }

    /// Another way to queue results for this sink (for a thread of its own).
    pub fn sender(&self) -> SinkSender {
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
        self.begin_close().wait_until(deadline)
    }

    /// Tells the thread to write what is queued and close, without waiting for it.
    pub fn begin_close(self) -> Closing {
        let Self {
            name,
            sender,
            close,
            closed,
            thread,
        } = self;
        drop(sender);
        drop(close);
        Closing {
            name,
            closed,
            thread,
        }
    }
}

/// A sink told to close (see [`SinkRunner::begin_close`]).
#[derive(Debug)]
pub struct Closing {
    name: String,
    closed: Receiver<Closed>,
    thread: JoinHandle<()>,
}

impl Closing {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for the sink to close, until `deadline` if any: `None` when it was still busy
    /// then (its thread is abandoned).
    pub fn wait_until(self, deadline: Option<Instant>) -> Option<Closed> {
        let got = match deadline {
            Some(deadline) => self.closed.recv_deadline(deadline),
            None => self
                .closed
                .recv()
                .map_err(|_| RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(done) => {
                let _ = self.thread.join();
                Some(done)
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = self.thread.join();
                Some((
                    SinkStats::default(),
                    Err(SinkError::Other(format!("sink \"{}\" panicked", self.name))),
                ))
            }
            Err(RecvTimeoutError::Timeout) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use opencv::prelude::*;

    use super::*;
    use crate::frame::Frame;
    use crate::outcome::FrameRecord;

    /// A sink that waits for `gate` before each write, and records what it wrote.
    struct Gated {
        gate: Receiver<()>,
        wrote: Sender<u64>,
    }

    impl Sink for Gated {
        fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
            let _ = self.gate.recv();
            let _ = self.wrote.send(result.frame().seq);
            Ok(true)
        }
        fn close(self: Box<Self>) -> Result<(), SinkError> {
            Ok(())
        }
    }

    fn result(source: &str, seq: u64) -> FrameResult {
        let mat = opencv::core::Mat::zeros(8, 8, opencv::core::CV_8UC3)
            .unwrap()
            .to_mat()
            .unwrap();
        let frame = Frame::from_mat(source.into(), seq, None, mat);
        FrameResult::new(Arc::new(FrameRecord::new(Arc::new(frame), 0)))
    }

    fn gated(routing: Routing) -> (SinkRunner, Sender<()>, Receiver<u64>) {
        let (open, gate) = crossbeam_channel::unbounded();
        let (wrote, written) = crossbeam_channel::unbounded();
        let runner = SinkRunner::spawn("t", Box::new(Gated { gate, wrote }), routing).unwrap();
        (runner, open, written)
    }

    /// A sink that says when the runner finds its queue empty (in `idle`), then waits for
    /// `gate`.
    struct WaitsWhenIdle {
        idle: Sender<()>,
        gate: Receiver<()>,
    }

    impl Sink for WaitsWhenIdle {
        fn write(&mut self, _: &FrameResult) -> Result<bool, SinkError> {
            Ok(true)
        }
        fn idle(&mut self) -> Result<(), SinkError> {
            let _ = self.idle.send(());
            let _ = self.gate.recv();
            Ok(())
        }
        fn close(self: Box<Self>) -> Result<(), SinkError> {
            Ok(())
        }
    }

    #[test]
    fn a_result_queued_when_the_close_signal_comes_is_still_written() {
        // The runner waits with an empty queue; a result and the close signal then come
        // together, so both of its channels are ready at once. 64 times: a runner that let the
        // signal win would lose a result in one of them (each a coin toss).
        for trial in 0..64 {
            let (open, gate) = crossbeam_channel::unbounded();
            let (idle, idled) = crossbeam_channel::unbounded();
            let runner = SinkRunner::spawn(
                "t",
                Box::new(WaitsWhenIdle { idle, gate }),
                Routing {
                    sources: None,
                    on_full: OnFull::Block,
                },
            )
            .unwrap();
            // Its queue is empty: it waits in `idle` until the result and the signal are in.
            idled.recv().unwrap();
            runner.send(result("cam", 0));
            let closing = runner.begin_close();
            let _ = open.send(());
            let (stats, closed) = closing.wait_until(None).unwrap();
            closed.unwrap();
            assert_eq!(stats.written, 1, "trial {trial}: {stats:?}");
        }
    }

    #[test]
    fn drop_oldest_never_waits_and_counts_what_it_drops() {
        let (runner, open, written) = gated(Routing {
            sources: None,
            on_full: OnFull::DropOldest,
        });
        let sender = runner.sender();
        let total = SINK_QUEUE as u64 * 3;
        // The sink takes frame 0 and waits at its gate; everything else queues or overflows.
        // Sending must return although the sink writes nothing.
        let (done_tx, done) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            for seq in 0..total {
                sender.send(result("cam", seq));
            }
            let _ = done_tx.send(());
        });
        done.recv_timeout(Duration::from_secs(30))
            .expect("delivery waited for a stalled drop_oldest sink");
        for _ in 0..total {
            let _ = open.send(());
        }
        let (stats, closed) = runner.close();
        closed.unwrap();
        let seqs: Vec<u64> = written.try_iter().collect();
        assert_eq!(stats.written + stats.dropped, total, "{stats:?}");
        assert!(stats.dropped > 0, "{stats:?}");
        assert_eq!(stats.written, seqs.len() as u64);
        // What is kept is the newest: the last frame sent is written.
        assert_eq!(seqs.last(), Some(&(total - 1)), "{seqs:?}");
    }

    #[test]
    fn a_sink_takes_only_the_sources_it_is_routed_to() {
        let (runner, open, written) = gated(Routing {
            sources: Some(vec![Arc::from("door")].into()),
            on_full: OnFull::Block,
        });
        for _ in 0..4 {
            let _ = open.send(());
        }
        for (i, source) in ["door", "yard", "door", "yard"].iter().enumerate() {
            runner.send(result(source, i as u64));
        }
        let (stats, _) = runner.close();
        assert_eq!(written.try_iter().collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(stats.written, 2, "{stats:?}");
        assert_eq!(stats.skipped + stats.dropped, 0, "{stats:?}");
    }

    /// A sink whose every other write fails, with the same message (a stand-in: no real sink
    /// fails that regularly).
    struct EveryOther(u64);

    impl Sink for EveryOther {
        fn write(&mut self, _: &FrameResult) -> Result<bool, SinkError> {
            self.0 += 1;
            if self.0.is_multiple_of(2) {
                return Err(SinkError::Other("the disk said no".to_owned()));
            }
            Ok(true)
        }
        fn close(self: Box<Self>) -> Result<(), SinkError> {
            Ok(())
        }
    }

    /// A sink that panics on its third write, and counts the times it is closed.
    struct PanicsOnThird(u32, Arc<AtomicU64>);

    impl Sink for PanicsOnThird {
        fn write(&mut self, _: &FrameResult) -> Result<bool, SinkError> {
            self.0 += 1;
            assert!(self.0 != 3, "the third write");
            Ok(true)
        }
        fn close(self: Box<Self>) -> Result<(), SinkError> {
            self.1.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    fn a_sink_that_panics_never_holds_delivery_and_is_still_closed() {
        let closes = Arc::new(AtomicU64::new(0));
        let sink = PanicsOnThird(0, closes.clone());
        let runner = SinkRunner::spawn("rec", Box::new(sink), Routing::default()).unwrap();
        // 40 results into a queue of 16 that blocks when full: with the thread gone, the
        // delivering thread would wait for ever (a guard, not a timing: it fails, not hangs).
        let sender = runner.sender();
        let (done, delivered) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            for seq in 0..40 {
                sender.send(result("cam", seq));
            }
            let _ = done.send(());
        });
        delivered
            .recv_timeout(Duration::from_secs(60))
            .expect("delivery held by a sink that panicked");
        let (stats, closed) = runner.close();
        assert_eq!((stats.written, stats.dropped), (2, 38), "{stats:?}");
        let error = closed.unwrap_err().to_string();
        assert!(
            error.contains("sink \"rec\" panicked: the third write"),
            "{error}"
        );
        assert_eq!(closes.load(Ordering::Relaxed), 1);
    }

    /// A writer into a shared buffer, for a subscriber in a test.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_sink_failing_on_every_other_frame_is_said_once_then_counted() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let (tx, rx) = crossbeam_channel::unbounded();
        for seq in 0..100 {
            tx.send(result("cam", seq)).unwrap();
        }
        drop(tx);
        let (_close, close_rx) = crossbeam_channel::bounded::<()>(0);
        let counters = SinkCounters::default();
        tracing::subscriber::with_default(subscriber, || {
            write_all("rec", &mut EveryOther(0), &rx, &close_rx, &counters);
        });
        assert_eq!(counters.failed.load(Ordering::Relaxed), 50);
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        // One line for the first failure, one with the count of the 49 others (at the end:
        // the run is shorter than an interval); once per run of failures, it was 50 lines.
        assert_eq!(log.matches("write failed").count(), 1, "{log}");
        assert_eq!(log.lines().count(), 2, "{log}");
        assert!(
            log.contains("sink \"rec\" failed to write 49 more frame(s)"),
            "{log}"
        );
    }
}
