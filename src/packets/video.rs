//! The decoded stream's own packets, for live viewers (`/api/video/SOURCE`): each access unit
//! the source's decoder takes, as it takes it, with what a viewer needs to start at once (the
//! current group of pictures, from its keyframe) and whether the stream can be sent at all.
//!
//! Why the decoded stream's packets, not the record stream's: they are the very pictures the
//! frames (and their boxes) are decoded from, with the same timestamps, so a box's frame is
//! found by its time exactly; and they cost no second connection to a camera, which often
//! allows few. The source publishes them from a probe on its decoder's input (`source/video.rs`):
//! nothing is decoded, copied or parsed for it (a buffer's reference is taken).
//!
//! Threads and channels: the source's GStreamer streaming thread publishes ([`Video::publish`]:
//! under the lock, it keeps the group of pictures and `try_send`s to each subscriber, never
//! waiting); each [`VideoSubscription`] is a bounded channel of [`SUBSCRIPTION_PACKETS`] read by
//! the HTTP endpoint's video thread. A full subscription loses the packet (counted in
//! [`Video::lost`]) and takes nothing more until the next keyframe, which it is given as
//! [`Carried::AfterLoss`]. A new connection of the source sends [`Carried::Break`] (never
//! waiting: a subscriber that misses it sees the next packet's connection number).
//!
//! Memory: the group of pictures kept holds references to the decoder's input buffers, at most
//! [`GOP_BYTES`]; past that it is dropped until the next keyframe (a new viewer then waits for
//! that keyframe).
//!
//! A source with no H.264 of its own ([`Status::Encodable`]) has its frames encoded instead,
//! while someone watches: the encoder (`daemon::http::video::encoder`, one per source) sets a
//! tap ([`Video::set_tap`], a bounded channel of [`ENCODER_PICTURES`]); the source's streaming
//! thread copies each decoded frame into it if there is room ([`Video::offer_picture`], never
//! waiting; a frame with no room is counted and missing from the video only), and the encoder
//! publishes its packets here ([`Video::publish_encoded`]) for every viewer alike.
//!
//! Stop protocol: a subscription removes itself when dropped; the source never holds one. An
//! encoder clears the tap when it stops, and the source copies nothing more.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use gstreamer as gst;

use super::{Carried, Packet};

/// Packets queued for the video thread: about 5 s at 25 fps; it takes them as they come.
pub const SUBSCRIPTION_PACKETS: usize = 128;
/// The largest group of pictures kept for a new viewer: 16 s of a 4 Mbit/s camera, or 4 s of
/// a 16 Mbit/s 4K one.
pub const GOP_BYTES: usize = 8 * 1024 * 1024;

/// A codec a source's decoded stream can be sent in as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    H264,
    H265,
}

impl Codec {
    /// Its name for people: `H.264`, `H.265`.
    pub fn name(self) -> &'static str {
        match self {
            Self::H264 => "H.264",
            Self::H265 => "H.265",
        }
    }
}

/// Whether a source's decoded stream can be sent as live video.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Status {
    /// Not known yet: the source has not reached its decoder.
    #[default]
    Waiting,
    /// It can, in this codec (whether a browser plays it, the browser says).
    Playable(Codec),
    /// No H.264 or H.265 of its own, but its frames are encoded to H.264 while someone
    /// watches (`daemon::http::video::encoder`, which publishes with
    /// [`Video::publish_encoded`]).
    Encodable,
    /// No H.264 or H.265 of its own, and stills were chosen for it (`live_video = "stills"`).
    Stills,
    /// It cannot, and why (a phrase: "its stream is video/x-vp8").
    Not(String),
}

impl Status {
    /// Whether packets are sent to viewers (as the source gives them, or encoded).
    pub fn playable(&self) -> bool {
        matches!(self, Self::Playable(_) | Self::Encodable)
    }
}

/// Decoded frames queued for a source's encoder: it takes them as they come; one more than
/// the picture it encodes lets a frame wait out a short stall (a busy core), and each is a
/// copy (3 MB at 1080p), so no more.
pub const ENCODER_PICTURES: usize = 2;

/// A decoded frame of a source without H.264, copied for its encoder: its buffer (timestamps
/// those of the frame, so an encoded packet's time is its frame's) and caps.
#[derive(Debug)]
pub struct Picture {
    pub buffer: gst::Buffer,
    pub caps: gst::Caps,
    /// When the frame left the decoder (wall clock), and its camera's clock, for the packet.
    pub arrival: std::time::SystemTime,
    pub clock: Option<Arc<crate::frame::CameraClock>>,
    pub live: bool,
}

#[derive(Debug)]
struct Subscriber {
    id: u64,
    tx: Sender<Carried>,
    /// Lost a packet and waits for a keyframe.
    skipping: bool,
}

#[derive(Debug, Default)]
struct Inner {
    status: Status,
    /// The packets since the last keyframe (empty when none came, or past [`GOP_BYTES`]).
    gop: Vec<Packet>,
    gop_bytes: usize,
    subscribers: Vec<Subscriber>,
    next_id: u64,
}

/// One source's decoded stream's packets (see the module header).
#[derive(Debug, Default)]
pub struct Video {
    inner: Mutex<Inner>,
    /// Viewers now, bytes sent to them, and times one was skipped forward to a keyframe:
    /// written by the HTTP endpoint's video thread (relaxed: statistics).
    pub viewers: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub skips: AtomicU64,
    /// Bytes waiting for its viewers now, summed over them (a fragment waiting for two counts
    /// twice, though its bytes are shared): each viewer's are bounded, past them it is skipped.
    pub queued_bytes: AtomicU64,
    /// Times a full subscription lost packets (the video thread behind), each a skip to the
    /// next keyframe. Relaxed: a statistic.
    pub lost: AtomicU64,
    /// Where the source copies its decoded frames while an encoder runs (`None` otherwise):
    /// set and cleared by the encoder, read by the source's streaming thread at each frame.
    tap: Mutex<Option<Sender<Picture>>>,
    /// Encoders running (0 or 1), frames they encoded, and frames the source did not hand
    /// them (their queue full): written by the encoder's thread and the source's streaming
    /// thread (relaxed: statistics).
    pub encoders: AtomicU64,
    pub encoded: AtomicU64,
    pub encode_dropped: AtomicU64,
}

/// What a viewer's thread takes of one source: the group of pictures so far, then every
/// packet; dropping it unsubscribes.
#[derive(Debug)]
pub struct VideoSubscription {
    /// The packets from the last keyframe, when one came (empty otherwise).
    pub gop: Vec<Packet>,
    pub packets: Receiver<Carried>,
    video: Arc<Video>,
    id: u64,
}

impl Drop for VideoSubscription {
    fn drop(&mut self) {
        self.video.lock().subscribers.retain(|s| s.id != self.id);
    }
}

impl Video {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the stream can be sent, as far as it is known.
    pub fn status(&self) -> Status {
        self.lock().status.clone()
    }

    /// Sets what is known of the stream; anything but a playable codec, or another one,
    /// forgets the packets kept.
    pub fn set_status(&self, status: Status) {
        let mut inner = self.lock();
        if !status.playable() || status != inner.status {
            inner.gop.clear();
            inner.gop_bytes = 0;
        }
        inner.status = status;
    }

    /// Sets (or with `None` clears) where the source copies its frames for an encoder.
    pub fn set_tap(&self, tap: Option<Sender<Picture>>) {
        *self.tap.lock().unwrap_or_else(PoisonError::into_inner) = tap;
    }

    /// Hands a frame to the encoder, when one runs and has room (`copy` makes it then, and only
    /// then); never waits. A frame with no room is counted in [`Video::encode_dropped`]: it is
    /// missing from the viewers' stream only.
    pub fn offer_picture(&self, copy: impl FnOnce() -> Option<Picture>) {
        let tap = self.tap.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(tx) = tap.as_ref() else {
            return;
        };
        if tx.is_full() {
            self.encode_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(picture) = copy() else {
            return;
        };
        if let Err(TrySendError::Full(_)) = tx.try_send(picture) {
            self.encode_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The bytes of the group of pictures kept now.
    pub fn gop_bytes(&self) -> usize {
        self.lock().gop_bytes
    }

    /// A new connection of the source: what was kept is of the old one.
    pub fn new_connection(&self) {
        let mut inner = self.lock();
        inner.gop.clear();
        inner.gop_bytes = 0;
        for s in &inner.subscribers {
            let _ = s.tx.try_send(Carried::Break);
        }
    }

    /// Keeps `packet` in the group of pictures and hands it to every subscriber, never
    /// waiting (a full one loses it and skips to the next keyframe); nothing while the stream
    /// is not known to be playable.
    pub fn publish(&self, packet: &Packet) {
        self.publish_as(packet, |s| matches!(s, Status::Playable(_)));
    }

    /// [`Video::publish`] for a packet its encoder made: nothing unless the stream is
    /// [`Status::Encodable`] (so the source's own packets of another codec never mix in).
    pub fn publish_encoded(&self, packet: &Packet) {
        self.publish_as(packet, |s| *s == Status::Encodable);
    }

    fn publish_as(&self, packet: &Packet, wanted: impl Fn(&Status) -> bool) {
        let keyframe = packet.keyframe();
        let size = packet.buffer.size();
        let mut inner = self.lock();
        if !wanted(&inner.status) {
            return;
        }
        if keyframe {
            inner.gop.clear();
            inner.gop_bytes = 0;
        }
        // Only a group begun by its keyframe, and within its bound.
        if (keyframe || !inner.gop.is_empty()) && inner.gop_bytes + size <= GOP_BYTES {
            inner.gop.push(packet.clone());
            inner.gop_bytes += size;
        } else {
            inner.gop.clear();
            inner.gop_bytes = 0;
        }
        let mut lost = 0;
        for s in &mut inner.subscribers {
            if s.skipping && !keyframe {
                continue;
            }
            let item = if s.skipping {
                Carried::AfterLoss(packet.clone())
            } else {
                Carried::Packet(packet.clone())
            };
            match s.tx.try_send(item) {
                Ok(()) => s.skipping = false,
                Err(TrySendError::Full(_)) => {
                    s.skipping = true;
                    lost += 1;
                }
                Err(TrySendError::Disconnected(_)) => {}
            }
        }
        drop(inner);
        self.lost.fetch_add(lost, Ordering::Relaxed);
    }

    /// Takes this stream's packets from now on, with the group of pictures so far: nothing is
    /// missed or given twice between the two.
    pub fn subscribe(self: &Arc<Self>) -> VideoSubscription {
        let (tx, packets) = crossbeam_channel::bounded(SUBSCRIPTION_PACKETS);
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.subscribers.push(Subscriber {
            id,
            tx,
            skipping: false,
        });
        VideoSubscription {
            gop: inner.gop.clone(),
            packets,
            video: self.clone(),
            id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packets::tests::packet;

    #[test]
    fn a_subscriber_gets_the_group_of_pictures_so_far_then_each_packet_once() {
        let video = Arc::new(Video::default());
        video.publish(&packet(true)); // not known to be playable yet: not kept
        assert!(video.subscribe().gop.is_empty());
        video.set_status(Status::Playable(Codec::H264));
        video.publish(&packet(false)); // before any keyframe: not kept
        video.publish(&packet(true));
        video.publish(&packet(false));
        let sub = video.subscribe();
        assert_eq!(sub.gop.len(), 2);
        assert!(sub.gop[0].keyframe());
        video.publish(&packet(false));
        assert!(matches!(sub.packets.try_recv(), Ok(Carried::Packet(_))));
        assert!(sub.packets.try_recv().is_err());
        // A keyframe starts a new group.
        video.publish(&packet(true));
        assert_eq!(video.subscribe().gop.len(), 1);
        video.new_connection();
        assert!(video.subscribe().gop.is_empty());
    }

    #[test]
    fn a_full_subscription_loses_packets_up_to_the_next_keyframe_and_the_source_never_waits() {
        let video = Arc::new(Video::default());
        video.set_status(Status::Playable(Codec::H264));
        let sub = video.subscribe();
        video.publish(&packet(true));
        for _ in 0..SUBSCRIPTION_PACKETS + 10 {
            video.publish(&packet(false));
        }
        assert_eq!(video.lost.load(Ordering::Relaxed), 1);
        let taken: Vec<_> = sub.packets.try_iter().collect();
        assert_eq!(taken.len(), SUBSCRIPTION_PACKETS);
        video.publish(&packet(false)); // not a keyframe: still skipped
        video.publish(&packet(true));
        let after: Vec<_> = sub.packets.try_iter().collect();
        assert_eq!(after.len(), 1);
        assert!(matches!(&after[0], Carried::AfterLoss(p) if p.keyframe()));
        drop(sub);
        assert!(video.lock().subscribers.is_empty());
    }
}
