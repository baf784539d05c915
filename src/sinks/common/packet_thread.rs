//! The thread of a sink that writes a source's record stream as the camera sent it: one per
//! source that `record` (`sinks/record/writer.rs`: segments) or `clip` in packets mode
//! (`sinks/clip/packets.rs`: a ring cut into clips) takes, named `vidflow-rec-SOURCE` or
//! `vidflow-clip-SOURCE`.
//!
//! What both kinds do alike is here: the subscription to the source's packets
//! (`crate::packets`), the keyframes counted, what ends the segment or clip being written (a
//! break in the stream or a new connection, each a gap when something was being written; new
//! caps; packets lost to a full subscription, a gap counted as it happened by the publisher),
//! and the failures (each logged, the first kept for close). The kind
//! ([`PacketWork`]) writes the packets, and takes the moments its sink's thread sends it
//! (`clip`: each frame's time and whether it triggered; `record`: none).
//!
//! Threads and channels: the thread blocks on the source's subscription (capacity
//! `packets::SUBSCRIPTION_PACKETS`), on the kind's moments (a bounded channel of the kind's
//! capacity, or none) and on its stop channel.
//!
//! Handover: a reload opens a changed sink before it closes the one it replaces (same name),
//! so two threads of one sink and source may take the same packets for a while. The new one
//! writes nothing until the old one has finished what it writes (`RecordStats::take_over`,
//! waiting on a condvar, checking its stop channel every `HANDOVER_POLL`), then leaves out
//! what the old one took: no segment or clip overlaps another, and the counts (shared by
//! name) go on from the old one's.
//!
//! Stop protocol: [`PacketThread::close`] drops the stop channel and the moments' sender; the
//! thread takes what is still queued (the sources have stopped by then: their last packets
//! are in), the moments first, then the packets; the kind finishes what it writes
//! ([`PacketWork::end`]) and the thread returns its first error; close joins it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use gstreamer as gst;

use crate::packets::{Carried, KeyframeCounter, Packet, RecordStats, Subscription};
use crate::sinks::SinkError;

/// What a kind writes of one source's packets (see the module header).
pub(in crate::sinks) trait PacketWork: Send + 'static {
    /// What the sink's own thread sends besides the packets.
    type Moment: Send + 'static;
    /// The kind's name, in messages.
    const KIND: &'static str;
    /// The thread's name before `-SOURCE`.
    const THREAD: &'static str;
    /// Logged with each failure.
    const FAILED: &'static str;

    /// Takes one packet; what it writes was cut first if the packet is of another connection
    /// or caps ([`PacketWork::cut`]).
    fn packet(&mut self, on: &mut Common, packet: Packet);

    /// Ends what it writes (a segment, a clip) at a break in the stream (`fresh` false) or
    /// before a packet of another connection or caps (`fresh`: nothing held before can be
    /// joined to what comes). True if something was being written.
    fn cut(&mut self, on: &mut Common, fresh: bool) -> bool;

    /// Takes a moment of the sink's thread.
    fn moment(&mut self, _on: &mut Common, _moment: Self::Moment) {}

    /// The end: every packet and moment is in; finishes what it writes.
    fn end(&mut self, on: &mut Common);
}

/// What the thread keeps for the kind, whatever it writes.
#[derive(Debug)]
pub(in crate::sinks) struct Common {
    pub(in crate::sinks) source: Arc<str>,
    /// The sink's counts for this source (the `vidflow_record_*` metrics).
    pub(in crate::sinks) stats: Arc<RecordStats>,
    keyframes: KeyframeCounter,
    /// The connection and caps of the last packet.
    last: Option<(u64, gst::Caps)>,
    failed: &'static str,
    first_error: Option<SinkError>,
    /// The last packet the writer before this one took (a reload's handover): it and those
    /// before it on its connection are not written again.
    before: Option<(u64, gst::ClockTime)>,
}

impl Common {
    /// A failure: logged, and the first kept for close.
    pub(in crate::sinks) fn failed(&mut self, e: SinkError) {
        self.stats.set_failing(true);
        tracing::warn!(source = %self.source, error = %e, "{}", self.failed);
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }

    /// A packet written: the sink is active, and no longer failing (`/healthz`).
    pub(in crate::sinks) fn wrote(&self) {
        self.stats.active();
        self.stats.set_failing(false);
    }

    /// A packet taken to be written later (a packets clip's ring): the sink is active.
    pub(in crate::sinks) fn took(&self) {
        self.stats.active();
    }

    /// A gap in what the sink wrote.
    pub(in crate::sinks) fn gap(&self) {
        self.stats.gaps.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes `item`, unless the writer before this one took it.
    fn take_new<W: PacketWork>(&mut self, work: &mut W, item: Carried) {
        if let Carried::Packet(p) | Carried::AfterLoss(p) = &item {
            if let Some((connection, at)) = self.before {
                if p.connection == connection && p.decoding_time().is_some_and(|t| t <= at) {
                    return;
                }
                self.before = None;
            }
            self.stats.taken(p);
        }
        self.take(work, item);
    }

    fn take<W: PacketWork>(&mut self, work: &mut W, item: Carried) {
        match item {
            Carried::Break => {
                if work.cut(self, false) {
                    self.gap();
                }
            }
            Carried::AfterLoss(packet) => {
                // What was written cannot go on across the hole (a gap counted when it
                // happened); the keyframe starts anew.
                work.cut(self, true);
                self.last = None;
                self.take(work, Carried::Packet(packet));
            }
            Carried::Packet(packet) => {
                if let Some((connection, caps)) = &self.last
                    && (*connection != packet.connection || *caps != packet.caps)
                {
                    let new_connection = *connection != packet.connection;
                    if work.cut(self, true) && new_connection {
                        self.gap();
                    }
                }
                self.last = Some((packet.connection, packet.caps.clone()));
                if packet.keyframe() {
                    self.keyframes.count(&self.stats, &packet);
                }
                work.packet(self, packet);
            }
        }
    }
}

#[cfg(test)]
impl Common {
    /// What a kind's thread would keep for `source`, for a test that drives the kind itself.
    pub(in crate::sinks) fn for_test(source: &str) -> Self {
        Self {
            source: source.into(),
            stats: Arc::default(),
            keyframes: KeyframeCounter::default(),
            last: None,
            failed: "test: failed",
            first_error: None,
            before: None,
        }
    }
}

/// The thread writing one source of a sink.
#[derive(Debug)]
pub(in crate::sinks) struct PacketThread<M> {
    /// The kind's moments (`None`: it takes none).
    moments: Option<Sender<M>>,
    stop: Sender<()>,
    thread: JoinHandle<Result<(), SinkError>>,
    kind: &'static str,
}

impl<M: Send + 'static> PacketThread<M> {
    /// Starts `work` on `source`'s packets for the sink `sink`, with room for `moments` moments
    /// queued (`None`: it takes none).
    pub(in crate::sinks) fn spawn<W: PacketWork<Moment = M>>(
        sink: &str,
        source: &Arc<str>,
        work: W,
        moments: Option<usize>,
    ) -> Result<Self, SinkError> {
        let hub = crate::packets::hub();
        let stats = hub.record_stats(sink, source);
        // Judged from its own start (a sink opened again at a reload shares its row).
        stats.active();
        let subscription = hub.subscribe(source, stats.clone());
        let (moments, moments_rx) = match moments {
            Some(capacity) => {
                let (tx, rx) = crossbeam_channel::bounded(capacity);
                (Some(tx), rx)
            }
            None => (None, crossbeam_channel::never()),
        };
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let common = Common {
            source: source.clone(),
            stats,
            keyframes: KeyframeCounter::default(),
            last: None,
            failed: W::FAILED,
            first_error: None,
            before: None,
        };
        let thread = std::thread::Builder::new()
            .name(format!("vidflow-{}-{source}", W::THREAD))
            .spawn(move || run(work, common, &subscription, &moments_rx, &stopped))
            .map_err(|e| SinkError::Other(format!("{}: cannot spawn a thread: {e}", W::KIND)))?;
        Ok(Self {
            moments,
            stop,
            thread,
            kind: W::KIND,
        })
    }

    /// Queues a moment, waiting for room. False: the thread ended (close says why).
    pub(in crate::sinks) fn send(&self, moment: M) -> bool {
        self.moments
            .as_ref()
            .is_some_and(|m| m.send(moment).is_ok())
    }

    /// Stops the thread once it has written what is queued; its first error, if any.
    pub(in crate::sinks) fn close(self) -> Result<(), SinkError> {
        drop((self.stop, self.moments));
        let kind = self.kind;
        self.thread
            .join()
            .unwrap_or_else(|_| Err(SinkError::Other(format!("{kind}: its thread panicked"))))
    }
}

/// The thread's loop (see the module header).
fn run<W: PacketWork>(
    mut work: W,
    mut common: Common,
    subscription: &Subscription,
    moments: &Receiver<W::Moment>,
    stopped: &Receiver<()>,
) -> Result<(), SinkError> {
    // The writer a reload replaces finishes first (its packets wait in the subscription).
    let closed = || {
        matches!(
            stopped.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    };
    let Some(before) = common.stats.take_over(closed) else {
        // Closed before it could write (a reload cancelled): it wrote nothing.
        return Ok(());
    };
    let _writing = Writing(common.stats.clone());
    common.before = before;
    let packets = &subscription.packets;
    loop {
        crossbeam_channel::select! {
            recv(packets) -> item => match item {
                Ok(item) => common.take_new(&mut work, item),
                Err(_) => break,
            },
            recv(moments) -> m => match m {
                Ok(m) => work.moment(&mut common, m),
                Err(_) => break,
            },
            recv(stopped) -> _ => break,
        }
    }
    // What is still queued: the last frames' moments, then the last packets.
    for m in moments.try_iter() {
        work.moment(&mut common, m);
    }
    for item in packets.try_iter() {
        common.take_new(&mut work, item);
    }
    work.end(&mut common);
    common.first_error.map_or(Ok(()), Err)
}

/// A writer writing: when it ends (its segment or clip finished, or a panic), the next one of
/// its sink and source may write.
struct Writing(Arc<RecordStats>);

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.hand_over();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::packets::SUBSCRIPTION_PACKETS;
    use crate::packets::tests::packet;

    /// Only a guard against a hang.
    const GUARD: Duration = Duration::from_secs(30);

    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Packet { keyframe: bool },
        Cut { fresh: bool },
    }

    /// A kind that takes a packet only when its gate opens (a disk too slow for the stream:
    /// the subscription fills), and says what it was given.
    struct Slow {
        /// Told when a packet is taken from the subscription, before the gate.
        taking: Sender<()>,
        gate: Receiver<()>,
        seen: Sender<Seen>,
    }

    impl PacketWork for Slow {
        type Moment = ();
        const KIND: &'static str = "slow";
        const THREAD: &'static str = "slow";
        const FAILED: &'static str = "slow: failed";

        fn packet(&mut self, _: &mut Common, packet: Packet) {
            let _ = self.taking.send(());
            let _ = self.gate.recv();
            let keyframe = packet.keyframe();
            let _ = self.seen.send(Seen::Packet { keyframe });
        }

        fn cut(&mut self, _: &mut Common, fresh: bool) -> bool {
            let _ = self.seen.send(Seen::Cut { fresh });
            true
        }

        fn end(&mut self, _: &mut Common) {}
    }

    #[test]
    fn packets_lost_to_a_slow_sink_are_a_gap_at_once_and_cut_what_it_writes() {
        let (source, sink): (Arc<str>, &str) = ("gap-at-once".into(), "rec-gap-at-once");
        let (open, gate) = crossbeam_channel::unbounded();
        let (seen_tx, seen) = crossbeam_channel::unbounded();
        let (taking, taken) = crossbeam_channel::unbounded();
        let work = Slow {
            taking,
            gate,
            seen: seen_tx,
        };
        let thread = PacketThread::spawn(sink, &source, work, None).unwrap();
        let topic = crate::packets::hub().topic(&source);
        let stats = crate::packets::hub().record_stats(sink, &source);
        // The thread takes the keyframe and waits at its gate; the queue fills, and the next
        // packet of the live stream is lost.
        topic.publish(&packet(true), false);
        assert_eq!(taken.recv_timeout(GUARD), Ok(()));
        for _ in 0..=SUBSCRIPTION_PACKETS {
            topic.publish(&packet(false), false);
        }
        assert_eq!(
            stats.gaps.load(Ordering::Relaxed),
            1,
            "counted as it happens"
        );
        // The sink catches up; the stream goes on from its next keyframe.
        for _ in 0..=SUBSCRIPTION_PACKETS + 1 {
            open.send(()).unwrap();
        }
        for _ in 0..=SUBSCRIPTION_PACKETS {
            assert!(matches!(seen.recv_timeout(GUARD), Ok(Seen::Packet { .. })));
        }
        topic.publish(&packet(true), false);
        // What was written before the loss is cut: the keyframe after it starts anew.
        assert_eq!(seen.recv_timeout(GUARD), Ok(Seen::Cut { fresh: true }));
        assert_eq!(
            seen.recv_timeout(GUARD),
            Ok(Seen::Packet { keyframe: true })
        );
        thread.close().unwrap();
        assert_eq!(stats.gaps.load(Ordering::Relaxed), 1, "counted once");
    }

    /// A kind that says the decoding time (ms) of each packet it writes.
    struct Times(Sender<u64>);

    impl PacketWork for Times {
        type Moment = ();
        const KIND: &'static str = "times";
        const THREAD: &'static str = "times";
        const FAILED: &'static str = "times: failed";

        fn packet(&mut self, _: &mut Common, packet: Packet) {
            let _ = self.0.send(packet.decoding_time().unwrap().mseconds());
        }

        fn cut(&mut self, _: &mut Common, _: bool) -> bool {
            false
        }

        fn end(&mut self, _: &mut Common) {}
    }

    /// A packet of connection 1 at `ms`.
    fn at(ms: u64) -> Packet {
        let mut p = packet(true);
        p.buffer
            .make_mut()
            .set_dts(gst::ClockTime::from_mseconds(ms));
        p
    }

    #[test]
    fn a_writer_a_reload_opens_writes_after_the_one_it_replaces_and_nothing_it_wrote() {
        let (source, sink): (Arc<str>, &str) = ("handover".into(), "rec-handover");
        let topic = crate::packets::hub().topic(&source);
        let (old_tx, old_wrote) = crossbeam_channel::unbounded();
        let old = PacketThread::spawn(sink, &source, Times(old_tx), None).unwrap();
        for ms in 0..5 {
            topic.publish(&at(ms), true);
        }
        // The new sink opens while the old one still writes: both take the packets.
        let (new_tx, new_wrote) = crossbeam_channel::unbounded();
        let new = PacketThread::spawn(sink, &source, Times(new_tx), None).unwrap();
        for ms in 5..10 {
            topic.publish(&at(ms), true);
        }
        let old_times: Vec<u64> = (0..10)
            .map(|_| old_wrote.recv_timeout(GUARD).unwrap())
            .collect();
        assert_eq!(old_times, (0..10).collect::<Vec<_>>());
        old.close().unwrap();
        for ms in 10..12 {
            topic.publish(&at(ms), true);
        }
        new.close().unwrap();
        let new_times: Vec<u64> = new_wrote.try_iter().collect();
        assert_eq!(
            new_times,
            [10, 11],
            "after the old one's last packet, once it ended"
        );
    }
}
