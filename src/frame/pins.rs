//! How many decoder buffers a source's frames may hold at once.
//!
//! A frame holds its decoder buffer until its last reference goes: while it waits in the
//! source's queue, runs in the workflow, waits in the reorder buffer behind a slow frame of its
//! source, and sits in the sinks' queues. A producer whose buffers come from a fixed pool (a
//! camera through `v4l2src`, a hardware decoder) cannot make a new frame while every buffer of
//! it is held downstream: its stream stops, the stall timeout fires, and the source reconnects
//! in a loop. So a source counts the buffers its frames hold ([`Pins`]) and, once they reach the
//! limit, copies the next frames into memory of their own and gives the buffer back at once.
//!
//! The limit comes from the pool the first buffer came from (read from the buffer itself): half
//! of a fixed pool, the other half left to the producer (the frame it fills, its reference
//! frames) and to the appsink's one buffer; no limit for a pool that grows as needed (what
//! software decoders and `videoconvert` use); [`UNKNOWN_POOL_PINS`] for a buffer of no pool.
//!
//! Threads: the count is raised by the source's streaming thread when it wraps a buffer and
//! lowered by whichever thread drops a frame's last reference (a worker, a sink, the
//! coordinator); nothing waits on it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use gstreamer as gst;
use gstreamer::prelude::*;

/// Frames held zero-copy from buffers that came from no pool: a driver's own memory may be a
/// fixed set too, so a few are held and the rest are copied.
pub const UNKNOWN_POOL_PINS: usize = 4;

/// The pool a buffer came from, as far as its size matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSize {
    /// A pool of at most this many buffers.
    Fixed(u32),
    /// A pool that makes new buffers when all are out (its `max-buffers` is 0).
    Growing,
    /// The buffer came from no pool (or its pool does not say).
    Unknown,
}

impl PoolSize {
    /// The pool `buffer` came from.
    pub fn of(buffer: &gst::BufferRef) -> Self {
        // SAFETY: `as_ptr` points to the GstBuffer that `buffer` borrows, alive while it is
        // borrowed; its `pool` field is only read here. GStreamer sets it when a pool hands the
        // buffer out and then holds a reference to that pool until the buffer goes back.
        let pool = unsafe { (*buffer.as_ptr()).pool };
        if pool.is_null() {
            return Self::Unknown;
        }
        // SAFETY: `pool` is a live GstBufferPool (the buffer holds a reference to it, see
        // above); `from_glib_none` takes a reference of its own.
        let pool: gst::BufferPool = unsafe { gst::glib::translate::from_glib_none(pool) };
        match pool.config().params() {
            Some((_, _, _, 0)) => Self::Growing,
            Some((_, _, _, max)) => Self::Fixed(max),
            None => Self::Unknown,
        }
    }

    /// How many frames may hold a buffer of this pool at once; `None`: any number.
    pub fn pin_limit(self) -> Option<usize> {
        match self {
            Self::Fixed(max) => Some(usize::try_from(max / 2).unwrap_or(usize::MAX)),
            Self::Growing => None,
            Self::Unknown => Some(UNKNOWN_POOL_PINS),
        }
    }
}

impl fmt::Display for PoolSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "a pool of {n} buffers"),
            Self::Growing => f.write_str("a pool that grows"),
            Self::Unknown => f.write_str("no known pool"),
        }
    }
}

/// The decoder buffers the frames of one pipeline of a source hold, against a limit. Clones
/// share the count.
#[derive(Debug, Clone)]
pub struct Pins {
    /// Buffers held by live frames. Raised (below `limit` only) by the streaming thread,
    /// lowered by the thread that drops a frame; AcqRel/Acquire so that a buffer given back is
    /// seen as free by the next raise.
    held: Arc<AtomicUsize>,
    limit: Option<usize>,
    pool: PoolSize,
}

impl Pins {
    /// The count for frames whose buffers come from a pool of `pool`'s size.
    pub fn new(pool: PoolSize) -> Self {
        Self {
            held: Arc::new(AtomicUsize::new(0)),
            limit: pool.pin_limit(),
            pool,
        }
    }

    /// At most this many frames hold a buffer; `None`: any number.
    pub fn limit(&self) -> Option<usize> {
        self.limit
    }

    pub fn pool(&self) -> PoolSize {
        self.pool
    }

    /// Buffers held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// One more held buffer, if the limit allows it.
    pub(super) fn take(&self) -> Option<Pin> {
        let limit = self.limit.unwrap_or(usize::MAX);
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Pin(self.held.clone()))
    }
}

/// One buffer held by a frame; counted back when the frame is dropped.
pub(super) struct Pin(Arc<AtomicUsize>);

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl fmt::Debug for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pin")
    }
}

#[cfg(test)]
mod tests {
    use gstreamer_video as gst_video;
    use opencv::core::MatTraitConst;

    use super::*;
    use crate::frame::Frame;

    fn i420(w: u32, h: u32) -> gst_video::VideoInfo {
        gst::init().unwrap();
        gst_video::VideoInfo::builder(gst_video::VideoFormat::I420, w, h)
            .build()
            .unwrap()
    }

    /// An active pool of `info`'s frames, of `max` buffers at most (0: it grows).
    fn pool_of(info: &gst_video::VideoInfo, max: u32) -> gst_video::VideoBufferPool {
        let pool = gst_video::VideoBufferPool::new();
        let mut config = pool.config();
        config.set_params(Some(&info.to_caps().unwrap()), info.size() as u32, max, max);
        pool.set_config(config).unwrap();
        pool.set_active(true).unwrap();
        pool
    }

    #[test]
    fn frames_past_the_pin_limit_are_copies_and_give_the_buffer_back_to_its_pool() {
        let info = i420(64, 32);
        // A fixed pool of 4, as a camera driver's: acquiring from it fails while all 4 are out.
        let pool = pool_of(&info, 4);
        let dont_wait =
            gst::BufferPoolAcquireParams::with_flags(gst::BufferPoolAcquireFlags::DONTWAIT);
        let decode = |luma: u8| {
            let mut buffer = pool.acquire_buffer(Some(&dont_wait)).unwrap();
            buffer.get_mut().unwrap().map_writable().unwrap().fill(luma);
            buffer
        };
        let first = decode(10);
        let pins = Pins::new(PoolSize::of(&first));
        assert_eq!(pins.pool(), PoolSize::Fixed(4));
        assert_eq!(pins.limit(), Some(2));
        let mut buffers = vec![first];
        let mut frames = Vec::new();
        // Six frames held at once from a pool of four: only the last acquisitions show whether
        // the copies gave their buffers back.
        for seq in 0..6u8 {
            let buffer = buffers.pop().unwrap_or_else(|| decode(10 + seq));
            let frame =
                Frame::from_decoder("cam".into(), u64::from(seq), buffer, &info, &pins).unwrap();
            frames.push(frame);
        }
        let zero_copy: Vec<bool> = frames.iter().map(Frame::is_zero_copy).collect();
        assert_eq!(zero_copy, [true, true, false, false, false, false]);
        assert_eq!(pins.held(), 2);
        for (seq, frame) in frames.iter().enumerate() {
            let luma = *frame.luma().unwrap().at_2d::<u8>(31, 63).unwrap();
            assert_eq!(luma, 10 + seq as u8, "frame {seq}");
        }
        drop(frames);
        assert_eq!(pins.held(), 0);
    }

    #[test]
    fn only_buffers_of_a_fixed_or_unknown_pool_are_limited() {
        let info = i420(16, 16);
        let pool = pool_of(&info, 0);
        let pooled = pool.acquire_buffer(None).unwrap();
        assert_eq!(PoolSize::of(&pooled), PoolSize::Growing);
        assert_eq!(PoolSize::Growing.pin_limit(), None);
        let loose = gst::Buffer::with_size(info.size()).unwrap();
        assert_eq!(PoolSize::of(&loose), PoolSize::Unknown);
        assert_eq!(PoolSize::Unknown.pin_limit(), Some(UNKNOWN_POOL_PINS));
    }
}
