//! The encoder of a watched source with no H.264 of its own ([`Status::Encodable`]: a test
//! pattern, a raw camera, a file in another codec): its decoded frames, as they leave the
//! decoder, are encoded to H.264 once, for all its viewers, and published into its
//! `packets::video::Video` as a camera's own packets are, so the rest of live video (the group
//! of pictures kept, the fragmented MP4, the viewers) is the same.
//!
//! Lifecycle: the video thread (`mod.rs`) holds one [`Encoders`] entry per source: started when
//! a source that is [`Status::Encodable`] has a viewer (started or waiting), stopped
//! [`GRACE`] after its last viewer left (a page that reloads keeps it), and at the thread's
//! end. One encoder per source, however many viewers.
//!
//! Threads and channels: each encoder is one thread, `vidflow-encode`. The source's streaming
//! thread copies each frame into the encoder's tap (`Video::offer_picture`: a bounded channel of
//! `ENCODER_PICTURES`, `try_send`; a full one drops the frame for the video only, counted); the
//! thread pushes it through `videoconvert ! x264enc ! h264parse ! appsink` from a pad of its
//! own, so the whole chain runs on this thread (no GStreamer streaming thread of its own), and
//! publishes each packet it pulls. The thread runs below the frame path's priority
//! (`live::yield_to_the_frames`), and so do x264's threads, which it starts and which inherit
//! it. Each packet's presentation time is its frame's (no B-frames: its decoding time too),
//! so `/api/live`'s `media_time` finds the boxes of each picture.
//!
//! A size or format change of the source's frames (a camera that changes resolution) builds
//! the chain again: the stream is a new connection (`Video::new_connection`), with a new init
//! segment for the viewers. An error of the chain is logged and the chain is built again at
//! the next frame of other caps, never stopping anything else.
//!
//! Stop protocol: dropping an [`Encoder`] clears the tap (the source copies nothing more),
//! drops the stop channel's sender, which wakes the thread; it sets the chain to `Null` (it
//! holds the only streaming thread, so nothing waits) and returns, and is joined. A frame being
//! encoded is finished first: milliseconds.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, select};
use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

use super::super::workers::Workers;
use crate::packets::Packet;
use crate::packets::video::{ENCODER_PICTURES, Picture, Status, Video};

/// How long an encoder runs on after its last viewer left: a page reloading, or a tile scrolled
/// back into view, finds it running, with its group of pictures to start from.
pub(super) const GRACE: Duration = Duration::from_secs(5);
/// Seconds between keyframes: where a new viewer starts, and the longest it waits for one once
/// the encoder runs.
const KEYFRAME_SECONDS: u32 = 2;
/// Bits per pixel per frame: 1080p at 25 fps is 3.6 Mbit/s, 720p 1.6 Mbit/s; x264's fastest
/// preset on a moving picture looks right from about there.
const BITS_PER_PIXEL: f64 = 0.07;
/// The bitrate's bounds, kbit/s: a small picture still looks right, a huge one stays sendable.
const KBITS: (u32, u32) = (300, 20_000);

/// One source's encoder thread (see the module header); dropping it stops and joins it.
#[derive(Debug)]
pub(super) struct Encoder {
    video: Arc<Video>,
    /// Declared before nothing else it needs: dropped (stopped and joined) in `Drop`.
    thread: Option<Workers>,
}

impl Encoder {
    /// Starts `source`'s encoder and sets its tap.
    fn start(source: Arc<str>, video: Arc<Video>) -> std::io::Result<Self> {
        let (tx, pictures) = crossbeam_channel::bounded(ENCODER_PICTURES);
        let (v, s) = (video.clone(), source.clone());
        video.encoders.fetch_add(1, Ordering::Relaxed);
        let thread = Workers::start("vidflow-encode", 1, move |stopped| {
            run(&s, &v, &pictures, stopped);
        });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                video.encoders.fetch_sub(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        video.set_tap(Some(tx));
        tracing::info!(source = %source, "live video: its frames are encoded while it is watched");
        Ok(Self {
            video,
            thread: Some(thread),
        })
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        self.video.set_tap(None);
        drop(self.thread.take());
        self.video.encoders.fetch_sub(1, Ordering::Relaxed);
        // What was kept is of a stream that ended: a viewer must not start from it.
        self.video.new_connection();
    }
}

/// A source's encoder, and since when it has had no viewer.
#[derive(Debug)]
struct Entry {
    source: Arc<str>,
    /// Held for its drop, which stops it.
    _encoder: Encoder,
    idle_since: Option<Instant>,
}

/// The encoders of the video thread, one per watched source that needs one.
#[derive(Debug, Default)]
pub(super) struct Encoders {
    running: Vec<Entry>,
}

impl Encoders {
    /// Starts an encoder for each of `watched` (sources with a viewer) that is
    /// [`Status::Encodable`] and has none; marks the others idle, and stops those idle for
    /// [`GRACE`].
    pub(super) fn keep<'a>(
        &mut self,
        watched: impl Iterator<Item = (&'a Arc<str>, &'a Arc<Video>)>,
    ) {
        let watched: Vec<_> = watched.collect();
        let now = Instant::now();
        for entry in &mut self.running {
            entry.idle_since = if watched.iter().any(|(s, _)| **s == entry.source) {
                None
            } else {
                entry.idle_since.or(Some(now))
            };
        }
        self.running
            .retain(|e| e.idle_since.is_none_or(|t| now.duration_since(t) < GRACE));
        for (source, video) in watched {
            if self.running.iter().any(|e| e.source == *source)
                || video.status() != Status::Encodable
            {
                continue;
            }
            match Encoder::start(source.clone(), video.clone()) {
                Ok(encoder) => self.running.push(Entry {
                    source: source.clone(),
                    _encoder: encoder,
                    idle_since: None,
                }),
                Err(e) => {
                    tracing::warn!(source = %source, error = %e, "live video: cannot start the encoder's thread");
                }
            }
        }
    }

    /// Whether an encoder waits out its grace period, and so the thread must wake to stop it.
    pub(super) fn idle(&self) -> bool {
        self.running.iter().any(|e| e.idle_since.is_some())
    }
}

/// The encoder thread: frames in, packets out, until stopped.
fn run(source: &str, video: &Video, pictures: &Receiver<Picture>, stopped: &Receiver<()>) {
    // Refused only by a system call filter: the live thread says so (once) for all.
    let _ = super::super::live::yield_to_the_frames();
    let mut chain: Option<Chain> = None;
    // The caps a chain could not be built or run for: not tried again until they change.
    let mut failed: Option<gst::Caps> = None;
    loop {
        let picture = select! {
            recv(pictures) -> p => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            recv(stopped) -> _ => break,
        };
        if failed.as_ref() == Some(&picture.caps) {
            continue;
        }
        if chain.as_ref().is_none_or(|c| c.caps != picture.caps) {
            if chain.take().is_some() {
                tracing::info!(source, caps = %picture.caps, "live video: the frames changed; the encoder starts again");
            }
            video.new_connection();
            chain = match Chain::new(&picture.caps) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(source, error = %e, "live video: cannot encode the frames");
                    failed = Some(picture.caps.clone());
                    None
                }
            };
        }
        let Some(c) = chain.as_mut() else {
            continue;
        };
        match c.encode(&picture) {
            Ok(packets) => {
                for packet in &packets {
                    video.publish_encoded(packet);
                }
                video.encoded.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(source, error = %e, "live video: the encoder failed");
                failed = Some(picture.caps.clone());
                chain = None;
            }
        }
    }
}

/// The GStreamer chain of one size of frames: `videoconvert ! x264enc ! h264parse ! appsink`,
/// fed from a pad of the thread's own.
struct Chain {
    pipeline: gst::Pipeline,
    pad: gst::Pad,
    sink: gst_app::AppSink,
    caps: gst::Caps,
    connection: u64,
    /// The times of the frames pushed whose packets have not come yet, oldest first: x264enc
    /// moves its output's timestamps (by 1000 hours, room for decoding times before the
    /// first), and with no B-frames its packets come in the frames' order, so each packet
    /// takes the oldest frame's time back.
    times: VecDeque<Option<gst::ClockTime>>,
}

impl Chain {
    fn new(caps: &gst::Caps) -> Result<Self, String> {
        let info = gstreamer_video::VideoInfo::from_caps(caps)
            .map_err(|e| format!("frames of caps {caps}: {e}"))?;
        let fps = info.fps();
        let rate = if fps.numer() > 0 && fps.denom() > 0 {
            f64::from(fps.numer()) / f64::from(fps.denom())
        } else {
            25.0
        };
        // Rounded, positive, and within bounds: the casts lose nothing.
        let (keyframes, kbits) = (
            ((rate * f64::from(KEYFRAME_SECONDS)).round() as u32).max(1),
            ((f64::from(info.width()) * f64::from(info.height()) * rate * BITS_PER_PIXEL / 1000.0)
                .round() as u32)
                .clamp(KBITS.0, KBITS.1),
        );
        let description = format!(
            "videoconvert name=convert ! x264enc tune=zerolatency speed-preset=ultrafast \
             key-int-max={keyframes} bframes=0 bitrate={kbits} ! h264parse ! \
             video/x-h264,stream-format=avc,alignment=au ! \
             appsink name=sink sync=false async=false"
        );
        let pipeline = gst::parse::launch(&description)
            .map_err(|e| format!("{description}: {e}"))?
            .downcast::<gst::Pipeline>()
            .map_err(|_| "not a pipeline".to_owned())?;
        let by_name = |name: &str| {
            pipeline
                .by_name(name)
                .ok_or_else(|| format!("no element {name}"))
        };
        let sink = by_name("sink")?
            .downcast::<gst_app::AppSink>()
            .map_err(|_| "not an appsink".to_owned())?;
        let input = by_name("convert")?
            .static_pad("sink")
            .ok_or_else(|| "videoconvert has no sink pad".to_owned())?;
        let pad = gst::Pad::builder(gst::PadDirection::Src)
            .name("frames")
            .build();
        pad.link(&input).map_err(|e| format!("linking: {e:?}"))?;
        pad.set_active(true)
            .map_err(|e| format!("activating: {e}"))?;
        let chain = Self {
            pipeline,
            pad,
            sink,
            caps: caps.clone(),
            connection: crate::packets::new_connection(),
            times: VecDeque::new(),
        };
        chain
            .pipeline
            .set_state(gst::State::Playing)
            .map_err(|e| format!("starting: {e:?}"))?;
        let events = [
            gst::event::StreamStart::new("vidflow-encode"),
            gst::event::Caps::new(caps),
            gst::event::Segment::new(&gst::FormattedSegment::<gst::ClockTime>::new()),
        ];
        for event in events {
            if !chain.pad.push_event(event) {
                return Err(chain.error("the caps were refused"));
            }
        }
        Ok(chain)
    }

    /// Encodes one frame; the packets it gave (one: with `tune=zerolatency` the encoder holds
    /// no frame back), each with its frame's time.
    fn encode(&mut self, picture: &Picture) -> Result<Vec<Packet>, String> {
        self.times.push_back(picture.buffer.pts());
        self.pad
            .push(picture.buffer.clone())
            .map_err(|e| self.error(&format!("{e:?}")))?;
        let mut packets = Vec::new();
        while let Some(sample) = self.sink.try_pull_sample(gst::ClockTime::ZERO) {
            let (Some(mut buffer), Some(caps)) = (sample.buffer_owned(), sample.caps_owned())
            else {
                continue;
            };
            let time = self.times.pop_front().flatten();
            let b = buffer.make_mut();
            b.set_pts(time);
            b.set_dts(time);
            packets.push(Packet {
                buffer,
                caps,
                connection: self.connection,
                arrival: picture.arrival,
                clock: picture.clock.clone(),
                live: picture.live,
            });
        }
        Ok(packets)
    }

    /// What went wrong, from the bus's error when it has one.
    fn error(&self, what: &str) -> String {
        let message = self
            .pipeline
            .bus()
            .and_then(|b| b.pop_filtered(&[gst::MessageType::Error]));
        if let Some(m) = &message
            && let gst::MessageView::Error(e) = m.view()
        {
            return format!(
                "{what}: {} ({})",
                e.error(),
                e.debug().map(|d| d.to_string()).unwrap_or_default()
            );
        }
        what.to_owned()
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        let _ = self.pad.set_active(false);
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packets::Carried;
    use crate::packets::video::VideoSubscription;

    /// `n` frames of a moving ball from GStreamer, `width` x `height` at 25 fps, as a source
    /// would offer them, their times from `from`.
    fn pictures(n: u32, width: u32, height: u32, from: gst::ClockTime) -> Vec<Picture> {
        let (pipeline, sink) = crate::frame::test_video::launch(&format!(
            "videotestsrc pattern=ball num-buffers={n} ! \
             video/x-raw,format=I420,width={width},height={height},framerate=25/1 ! \
             appsink name=sink sync=false"
        ));
        pipeline.set_state(gst::State::Playing).unwrap();
        let mut out = Vec::new();
        while let Ok(sample) = sink.pull_sample() {
            let mut buffer = sample.buffer_owned().unwrap();
            let b = buffer.make_mut();
            b.set_pts(b.pts().map(|t| t + from));
            out.push(Picture {
                buffer,
                caps: sample.caps_owned().unwrap(),
                arrival: std::time::SystemTime::now(),
                clock: None,
                live: true,
            });
        }
        pipeline.set_state(gst::State::Null).unwrap();
        out
    }

    /// What the subscription got: each packet's width (of its caps), keyframe and time, and a
    /// `None` for each break.
    fn taken(sub: &VideoSubscription) -> Vec<Option<(i32, bool, gst::ClockTime)>> {
        sub.packets
            .try_iter()
            .map(|c| match c {
                Carried::Packet(p) | Carried::AfterLoss(p) => Some((
                    p.caps.structure(0).unwrap().get::<i32>("width").unwrap(),
                    p.keyframe(),
                    p.buffer.pts().unwrap(),
                )),
                Carried::Break => None,
            })
            .collect()
    }

    #[test]
    fn each_frame_becomes_a_packet_of_its_time_and_a_new_size_starts_a_new_stream() {
        let video = Arc::new(Video::default());
        video.set_status(Status::Encodable);
        let sub = video.subscribe();
        let small = pictures(10, 64, 48, gst::ClockTime::from_seconds(100));
        let big = pictures(10, 128, 96, gst::ClockTime::from_seconds(200));
        let times: Vec<_> = small
            .iter()
            .chain(&big)
            .map(|p| p.buffer.pts().unwrap())
            .collect();
        let (tx, rx) = crossbeam_channel::unbounded();
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        for p in small.into_iter().chain(big) {
            tx.send(p).unwrap();
        }
        drop(tx);
        run("test", &video, &rx, &stopped);
        drop(stop);
        let got = taken(&sub);
        // A break at the start, and one at the new size, each stream from a keyframe.
        assert_eq!(got.iter().filter(|g| g.is_none()).count(), 2, "{got:?}");
        let packets: Vec<_> = got.iter().flatten().collect();
        assert_eq!(packets.len(), 20, "{got:?}");
        assert!(packets[0].1 && packets[10].1);
        assert!(packets[..10].iter().all(|p| p.0 == 64));
        assert!(packets[10..].iter().all(|p| p.0 == 128));
        let pts: Vec<_> = packets.iter().map(|p| p.2).collect();
        assert_eq!(pts, times);
        assert_eq!(video.encoded.load(Ordering::Relaxed), 20);
    }

    #[test]
    fn an_encoder_sets_the_tap_while_it_runs_and_the_source_copies_nothing_after() {
        let video = Arc::new(Video::default());
        video.set_status(Status::Encodable);
        let offered = || {
            let mut copied = false;
            video.offer_picture(|| {
                copied = true;
                None
            });
            copied
        };
        assert!(!offered());
        let encoder = Encoder::start("test".into(), video.clone()).unwrap();
        assert_eq!(video.encoders.load(Ordering::Relaxed), 1);
        assert!(offered());
        drop(encoder);
        assert_eq!(video.encoders.load(Ordering::Relaxed), 0);
        assert!(!offered());
    }
}
