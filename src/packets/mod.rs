//! Encoded packets of a source's record stream, on their way from the source to the sinks that
//! write them as the camera sent them (`record`, `clip` in packet mode), never decoded.
//!
//! The process has one [`Hub`] ([`hub`]): a sink kind must not import the source, nor the
//! source a sink, so they meet here, in the vocabulary layer (as the preview sinks and the
//! HTTP endpoint meet in `sinks::preview::hub`). A source that records publishes into its
//! [`Topic`] (one per source name); each recording sink holds a [`Subscription`] per source it
//! takes, made when it opens (before the sources start: nothing is missed at the start).
//!
//! Threads and channels: the record stream's GStreamer streaming thread publishes; each
//! subscription is a bounded channel of [`SUBSCRIPTION_PACKETS`] items, read by the sink's own
//! thread for that source. A file's stream waits for room (nothing is lost); a live stream
//! never waits on a sink: a full subscription loses the packet, is counted a gap in its sink's
//! [`RecordStats`] at once and takes nothing more until the next keyframe (a packet after a lost
//! one would not decode), which it is given as [`Carried::AfterLoss`]. The
//! topic's lock is taken to clone its senders, never while sending. After every loss or end of
//! the stream the topic sends [`Carried::Break`] (waiting for room, at most [`BREAK_WAIT`]) so
//! a sink finishes its segment at once, not at the next connection.
//!
//! Stop protocol: a subscription removes itself from its topic when dropped; its sender goes
//! with it, so nothing is ever sent to a sink that closed.
//!
//! Also here: the decoded stream's own packets, for live viewers of the HTTP endpoint
//! (`video.rs`, [`Hub::video`]), and what puts packets in a browser's video: H.264's and
//! H.265's MP4 forms (`avc.rs`, `hevc.rs`, either as a `track.rs`) and fragmented MP4
//! (`fmp4.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use gstreamer as gst;

use crate::frame::CameraClock;

pub mod avc;
mod caps;
pub mod fmp4;
pub mod hevc;
pub mod track;
pub mod video;

/// Packets queued for one subscriber: about 8 s of a 30 fps stream, far more than a segment
/// change takes on a busy disk.
pub const SUBSCRIPTION_PACKETS: usize = 256;
/// Longest a break waits for room in a full subscription: it is only a hint (the next
/// packet's connection number says the same).
const BREAK_WAIT: Duration = Duration::from_millis(200);
/// How often a writer waiting for the one before it (see [`RecordStats::take_over`]) checks
/// whether it was closed meanwhile.
const HANDOVER_POLL: Duration = Duration::from_millis(50);

/// One encoded access unit (a frame's packets) of a record stream, parsed and timestamped.
#[derive(Debug, Clone)]
pub struct Packet {
    pub buffer: gst::Buffer,
    pub caps: gst::Caps,
    /// Which connection of a record stream it came on ([`new_connection`]): changes after
    /// every loss and every restart of the source, so the packets of one connection share one
    /// timeline.
    pub connection: u64,
    /// When it reached vidflow (wall clock): what maps a decoded frame's time onto a live
    /// record stream whose camera sent no RTCP sender report (see docs/guides/recording.md).
    pub arrival: SystemTime,
    /// The camera's clock on its connection (a live RTSP stream): what maps a decoded frame's
    /// time onto the record stream once both have one ([`Packet::camera_time`]).
    pub clock: Option<Arc<CameraClock>>,
    /// Whether the record stream is live (a camera): its packets are placed against the
    /// decoded stream by the camera's clock or arrival time; a file's by their timestamps,
    /// which the decoded stream's frames share (see docs/guides/recording.md).
    pub live: bool,
}

impl Packet {
    /// Its place in decoding order on its connection (its decoding time, else its
    /// presentation time).
    pub fn decoding_time(&self) -> Option<gst::ClockTime> {
        self.buffer.dts().or(self.buffer.pts())
    }

    /// Whether a decoder can start here.
    pub fn keyframe(&self) -> bool {
        !self.buffer.flags().contains(gst::BufferFlags::DELTA_UNIT)
    }

    /// Its time on the camera's clock once the camera sent a sender report on its connection:
    /// its decoding time if `decoding` (else its presentation time), when it has one.
    pub fn camera_time(&self, decoding: bool) -> Option<Duration> {
        self.clock.as_ref()?.time(self.timestamp(decoding)?)
    }

    /// Its decoding time if `decoding` (else its presentation time), or the other when it has
    /// only that one.
    pub fn timestamp(&self, decoding: bool) -> Option<Duration> {
        let b = &self.buffer;
        let t = if decoding {
            b.dts().or(b.pts())
        } else {
            b.pts().or(b.dts())
        };
        t.map(Duration::from)
    }

    /// The parser that takes this stream into a muxer (H.264 or H.265); `Err`: the media type
    /// it is instead.
    pub fn parser(&self) -> Result<&'static str, String> {
        let name = self
            .caps
            .structure(0)
            .map(|s| s.name().to_string())
            .unwrap_or_default();
        match name.as_str() {
            "video/x-h264" => Ok("h264parse"),
            "video/x-h265" => Ok("h265parse"),
            _ => Err(name),
        }
    }
}

/// Packets of one connection put on a file's timeline: from zero at the first packet's
/// decoding time.
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    /// Subtracted from every timestamp.
    base: gst::ClockTime,
    /// The last presentation time given: given to a packet without one (a depayloader's last
    /// packet at the end of a stream may have none, and a muxer refuses it).
    last_pts: gst::ClockTime,
}

impl Timeline {
    /// The timeline that `first` starts.
    pub fn starting_at(first: &Packet) -> Self {
        let b = &first.buffer;
        Self {
            base: b.dts().or(b.pts()).unwrap_or(gst::ClockTime::ZERO),
            last_pts: gst::ClockTime::ZERO,
        }
    }

    /// `packet`'s buffer with its timestamps on this timeline.
    pub fn place(&mut self, packet: &Packet) -> gst::Buffer {
        let mut buffer = packet.buffer.clone();
        let b = buffer.make_mut();
        let shift = |t: Option<gst::ClockTime>| t.map(|t| t.saturating_sub(self.base));
        let dts = shift(packet.buffer.dts());
        let pts = shift(packet.buffer.pts()).or(dts).unwrap_or(self.last_pts);
        self.last_pts = pts;
        b.set_pts(pts);
        b.set_dts(dts);
        buffer
    }
}

/// What a subscription carries.
#[derive(Debug, Clone)]
pub enum Carried {
    Packet(Packet),
    /// The keyframe after packets lost to this full subscription (each loss counted a gap as
    /// it happened): what was written before cannot go on across the hole.
    AfterLoss(Packet),
    /// The stream was lost or ended: what comes next (if anything) is a new connection.
    Break,
}

#[derive(Debug)]
struct Subscriber {
    id: u64,
    tx: Sender<Carried>,
    /// Lost a packet and waits for a keyframe. Written by the publishing thread only.
    skipping: Arc<AtomicBool>,
    /// Its sink's counts for this source: a loss is a gap there as it happens.
    stats: Arc<RecordStats>,
}

/// Where one source's record stream publishes.
#[derive(Debug, Default)]
pub struct Topic {
    subscribers: Mutex<Vec<Subscriber>>,
}

impl Topic {
    fn senders(&self) -> Vec<Subscriber> {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|s| Subscriber {
                id: s.id,
                tx: s.tx.clone(),
                skipping: s.skipping.clone(),
                stats: s.stats.clone(),
            })
            .collect()
    }

    /// Whether anybody takes this source's packets.
    pub fn wanted(&self) -> bool {
        !self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Hands `packet` to every subscriber: waiting for room when `wait` (a file), else losing
    /// it for a full subscriber (counted a gap at once; that subscriber skips to the next
    /// keyframe).
    pub fn publish(&self, packet: &Packet, wait: bool) {
        let keyframe = packet.keyframe();
        for s in self.senders() {
            let after_loss = s.skipping.load(Ordering::Relaxed);
            if after_loss && !keyframe {
                continue;
            }
            let item = if after_loss {
                Carried::AfterLoss(packet.clone())
            } else {
                Carried::Packet(packet.clone())
            };
            if wait {
                // Fails only when the subscriber is gone.
                let _ = s.tx.send(item);
            } else {
                match s.tx.try_send(item) {
                    Ok(()) => s.skipping.store(false, Ordering::Relaxed),
                    Err(TrySendError::Full(_)) if !after_loss => {
                        s.skipping.store(true, Ordering::Relaxed);
                        s.stats.gaps.fetch_add(1, Ordering::Relaxed);
                    }
                    // Still full, or gone: the same loss goes on.
                    Err(_) => {}
                }
            }
        }
    }

    /// The stream was lost or ended (see [`Carried::Break`]).
    pub fn lost(&self) {
        for s in self.senders() {
            let _ = s.tx.send_timeout(Carried::Break, BREAK_WAIT);
        }
    }
}

/// What a recording sink takes of one source; dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    pub packets: Receiver<Carried>,
    topic: Arc<Topic>,
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.topic
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|s| s.id != self.id);
    }
}

/// What a recording sink wrote of one source, for `/metrics`. Written by the sink's thread for
/// that source, read by observers (relaxed: statistics).
#[derive(Debug, Default)]
pub struct RecordStats {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub segments: AtomicU64,
    pub keyframes: AtomicU64,
    /// Time between the last two keyframes, in ms (0 before the second).
    pub keyframe_interval_ms: AtomicU64,
    /// The longest time between two keyframes of one connection seen so far, in ms: after a
    /// lost packet nothing is written until the next keyframe, which a camera with a long or
    /// "smart" GOP sends only this long after the last (`/healthz` waits that long too).
    pub keyframe_interval_max_ms: AtomicU64,
    /// Breaks in the recording: a lost stream, packets lost to a full queue, a write that
    /// failed. Each starts a new segment at the next keyframe. Written also by the publishing
    /// thread (a loss, as it happens).
    pub gaps: AtomicU64,
    /// Packets a packets clip's ring dropped past its byte bound: video no clip can hold any
    /// more.
    pub ring_dropped_bytes: AtomicU64,
    /// Packets a packets clip's ring dropped past its duration bound (the record stream far
    /// ahead of the decoded stream).
    pub ring_dropped_duration: AtomicU64,
    /// A packets clip's ring's byte bound now (sized from its pre-roll and the stream's
    /// measured bitrate; 0 for a `record` sink).
    pub ring_limit_bytes: AtomicU64,
    /// A packets clip's ring's duration bound, in ms (0 for a `record` sink).
    pub ring_limit_ms: AtomicU64,
    /// When the sink last wrote a packet (a packets clip: took one into its ring) or its
    /// thread started, in ms of [`now_ms`]: what `/healthz` judges a recording by.
    active_ms: AtomicU64,
    /// Its last write failed; a write that succeeds clears it.
    failing: AtomicBool,
    /// Which writer of this sink and source writes: a reload opens a changed sink before it
    /// closes the one it replaces, and both take the source's packets meanwhile.
    handover: Mutex<Handover>,
    /// Signalled when a writer ends.
    handed: Condvar,
}

/// See [`RecordStats::take_over`].
#[derive(Debug, Default)]
struct Handover {
    /// A writer writes now.
    writing: bool,
    /// The last packet a writer took: its connection and decoding time.
    last: Option<(u64, gst::ClockTime)>,
}

/// A [`RecordStats`] read at one moment: the run's report of a recording sink and source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecordCounts {
    pub packets: u64,
    pub bytes: u64,
    pub segments: u64,
    pub gaps: u64,
    pub keyframes: u64,
    /// Packets a packets clip's ring dropped past either bound.
    pub ring_dropped: u64,
    pub ring_dropped_bytes: u64,
    pub ring_dropped_duration: u64,
}

/// Milliseconds on the process's monotonic clock (from its first use).
fn now_ms() -> u64 {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let ms = EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl RecordStats {
    /// The sink wrote (or took) a packet, or its thread started: it is active now.
    pub fn active(&self) {
        self.active_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// How long since it was last active.
    pub fn quiet_for(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.active_ms.load(Ordering::Relaxed)))
    }

    /// Says whether its last write failed.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }

    /// Whether its last write failed.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// Waits until no other writer of this sink and source writes (the one a reload replaces
    /// finishes its segment or clip first), checking `closed` every [`HANDOVER_POLL`], then
    /// writes. Returns the last packet the writer before took (its connection and decoding
    /// time), which this one must not write again; `None` if `closed` said so first.
    pub fn take_over(&self, closed: impl Fn() -> bool) -> Option<Option<(u64, gst::ClockTime)>> {
        let mut h = self.handover.lock().unwrap_or_else(PoisonError::into_inner);
        while h.writing {
            if closed() {
                return None;
            }
            h = self
                .handed
                .wait_timeout(h, HANDOVER_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        h.writing = true;
        Some(h.last)
    }

    /// The writer took `packet`.
    pub fn taken(&self, packet: &Packet) {
        if let Some(at) = packet.decoding_time() {
            let mut h = self.handover.lock().unwrap_or_else(PoisonError::into_inner);
            h.last = Some((packet.connection, at));
        }
    }

    /// The writer ended: the next one may write.
    pub fn hand_over(&self) {
        self.handover
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .writing = false;
        self.handed.notify_all();
    }

    /// The counts now.
    pub fn counts(&self) -> RecordCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RecordCounts {
            packets: get(&self.packets),
            bytes: get(&self.bytes),
            segments: get(&self.segments),
            gaps: get(&self.gaps),
            keyframes: get(&self.keyframes),
            ring_dropped: get(&self.ring_dropped_bytes) + get(&self.ring_dropped_duration),
            ring_dropped_bytes: get(&self.ring_dropped_bytes),
            ring_dropped_duration: get(&self.ring_dropped_duration),
        }
    }
}

/// Counts a subscription's keyframes into its [`RecordStats`]: how many, and the time between
/// the last two of one connection.
#[derive(Debug, Default)]
pub struct KeyframeCounter {
    /// The last keyframe's connection and timestamp.
    last: Option<(u64, gst::ClockTime)>,
}

impl KeyframeCounter {
    /// Counts `packet`, a keyframe.
    pub fn count(&mut self, stats: &RecordStats, packet: &Packet) {
        stats.keyframes.fetch_add(1, Ordering::Relaxed);
        let Some(at) = packet.buffer.pts().or(packet.buffer.dts()) else {
            return;
        };
        if let Some((connection, before)) = self.last
            && connection == packet.connection
            && at > before
        {
            let ms = (at - before).mseconds();
            stats.keyframe_interval_ms.store(ms, Ordering::Relaxed);
            stats
                .keyframe_interval_max_ms
                .fetch_max(ms, Ordering::Relaxed);
        }
        self.last = Some((packet.connection, at));
    }
}

/// One row of [`Hub::record_stats`].
#[derive(Debug, Clone)]
pub struct RecordRow {
    pub sink: Arc<str>,
    pub source: Arc<str>,
    pub stats: Arc<RecordStats>,
}

/// The process's topics and the record sinks' statistics (see the module header).
#[derive(Debug, Default)]
pub struct Hub {
    topics: Mutex<HashMap<Arc<str>, Arc<Topic>>>,
    /// Each source's decoded stream's packets, for live viewers (`video.rs`).
    videos: Mutex<HashMap<Arc<str>, Arc<video::Video>>>,
    stats: Mutex<Vec<RecordRow>>,
    next_id: AtomicU64,
}

/// A number no other connection of any record stream of this process has had.
pub fn new_connection() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The process's hub.
pub fn hub() -> &'static Hub {
    static HUB: OnceLock<Hub> = OnceLock::new();
    HUB.get_or_init(Hub::default)
}

impl Hub {
    /// The topic of `source`, made at its first use.
    pub fn topic(&self, source: &str) -> Arc<Topic> {
        self.topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(source.into())
            .or_default()
            .clone()
    }

    /// The decoded stream of `source`, made at its first use (`video.rs`).
    pub fn video(&self, source: &str) -> Arc<video::Video> {
        self.videos
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(source.into())
            .or_default()
            .clone()
    }

    /// Takes `source`'s packets from now on, for the sink whose counts are `stats`.
    pub fn subscribe(&self, source: &str, stats: Arc<RecordStats>) -> Subscription {
        let topic = self.topic(source);
        let (tx, packets) = crossbeam_channel::bounded(SUBSCRIPTION_PACKETS);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        topic
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Subscriber {
                id,
                tx,
                skipping: Arc::default(),
                stats,
            });
        Subscription { packets, topic, id }
    }

    /// The statistics of `sink` for `source`, shown by `/metrics` until [`Hub::forget_sink`].
    pub fn record_stats(&self, sink: &str, source: &str) -> Arc<RecordStats> {
        let mut rows = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(row) = rows
            .iter()
            .find(|r| &*r.sink == sink && &*r.source == source)
        {
            return row.stats.clone();
        }
        let stats = Arc::new(RecordStats::default());
        rows.push(RecordRow {
            sink: sink.into(),
            source: source.into(),
            stats: stats.clone(),
        });
        stats
    }

    /// Every record sink's statistics per source.
    pub fn record_rows(&self) -> Vec<RecordRow> {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A live camera's empty packet of connection 1 (for the sinks' tests too).
    pub(crate) fn packet(keyframe: bool) -> Packet {
        gst::init().unwrap();
        let mut buffer = gst::Buffer::new();
        if !keyframe {
            buffer
                .get_mut()
                .unwrap()
                .set_flags(gst::BufferFlags::DELTA_UNIT);
        }
        Packet {
            buffer,
            caps: gst::Caps::new_empty_simple("video/x-h264"),
            connection: 1,
            arrival: SystemTime::now(),
            clock: None,
            live: true,
        }
    }

    #[test]
    fn the_longest_keyframe_interval_of_a_connection_is_kept() {
        let stats = RecordStats::default();
        let mut counter = KeyframeCounter::default();
        for (connection, seconds) in [(1, 0), (1, 20), (1, 24), (2, 100), (2, 102)] {
            let mut p = packet(true);
            p.connection = connection;
            p.buffer
                .get_mut()
                .unwrap()
                .set_pts(gst::ClockTime::from_seconds(seconds));
            counter.count(&stats, &p);
        }
        // 20 s within connection 1; the 76 s across the reconnection is no interval.
        assert_eq!(
            stats.keyframe_interval_max_ms.load(Ordering::Relaxed),
            20_000
        );
        assert_eq!(stats.keyframe_interval_ms.load(Ordering::Relaxed), 2_000);
        assert_eq!(stats.keyframes.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_full_live_subscriber_loses_packets_up_to_the_next_keyframe() {
        gst::init().unwrap();
        let topic = Topic::default();
        let hub = Hub::default();
        let (tx, rx) = crossbeam_channel::bounded(1);
        let stats = Arc::new(RecordStats::default());
        topic.subscribers.lock().unwrap().push(Subscriber {
            id: 0,
            tx,
            skipping: Arc::default(),
            stats: stats.clone(),
        });
        topic.publish(&packet(true), false);
        topic.publish(&packet(false), false); // full: lost
        rx.recv().unwrap();
        topic.publish(&packet(false), false); // skipped: not a keyframe
        assert!(rx.try_recv().is_err());
        topic.publish(&packet(true), false);
        let Carried::AfterLoss(p) = rx.recv().unwrap() else {
            panic!("not the keyframe after the loss")
        };
        assert!(p.keyframe());
        assert_eq!(stats.gaps.load(Ordering::Relaxed), 1);
        drop(hub);
    }

    #[test]
    fn a_dropped_subscription_takes_nothing_more() {
        gst::init().unwrap();
        let hub = Hub::default();
        let sub = hub.subscribe("door", Arc::default());
        assert!(hub.topic("door").wanted());
        drop(sub);
        assert!(!hub.topic("door").wanted());
        hub.topic("door").publish(&packet(true), true);
    }
}
