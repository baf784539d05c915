//! One watched source's live video: its subscription to the decoded stream's packets
//! (`packets::video`), made into fragmented MP4 once (`packets::fmp4`), and its viewers. Made
//! when its first viewer comes, dropped (unsubscribed) when its last goes; it begins with the
//! group of pictures the source kept, so a viewer starts at once from its keyframe.
//!
//! Time: each fragment's decoding and presentation times are its packet's timestamps, which are
//! its frame's (`source/video.rs`), in ticks of `fmp4::TIMESCALE`; the live feed gives each
//! frame's `media_time` from the same timestamp (`daemon::feed::media_time`), so a page finds a
//! picture's boxes by its time. The origin sent with the stream (the wall-clock time of media
//! time 0) is the newest packet's arrival less its time: for a clock on the page, not for
//! matching boxes.
//!
//! Lives on the video thread (`mod.rs`); no lock but the source's, taken by the subscription.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gstreamer as gst;

use super::viewer::{Framing, Piece, Took, Viewer};
use crate::packets::fmp4::{self, TIMESCALE, ticks};
use crate::packets::track::Track;
use crate::packets::video::{GOP_BYTES, Video, VideoSubscription};
use crate::packets::{Carried, Packet, hub};

/// How long a viewer waits for its source's first keyframe (a camera connecting, a long group
/// of pictures) before it is answered 503.
pub(super) const FIRST_PICTURE: Duration = Duration::from_secs(30);
/// A sample's duration when neither the caps' frame rate nor an earlier sample says it: 25 fps.
const DEFAULT_DURATION: u32 = TIMESCALE / 25;

/// The stream's configuration, and its init segment.
struct Mux {
    config: Track,
    caps: gst::Caps,
    init: Arc<[u8]>,
}

/// A viewer not yet sent its stream: its source's first keyframe has not come.
struct Waiting {
    viewer: Viewer,
    since: Instant,
}

pub(super) struct Broadcast {
    pub source: Arc<str>,
    pub video: Arc<Video>,
    pub sub: VideoSubscription,
    mux: Option<Mux>,
    /// The fragments since the last keyframe (empty past [`GOP_BYTES`] until the next).
    gop: Vec<Piece>,
    gop_bytes: usize,
    /// Fragments made, the last one's number.
    sequence: u32,
    /// The last packet's connection and decoding time (ticks), and the duration it gives.
    last: Option<(u64, u64)>,
    duration: u32,
    /// Wall-clock ms of media time 0, from the newest packet.
    origin_ms: i64,
    pub viewers: Vec<Viewer>,
    waiting: Vec<Waiting>,
}

impl std::fmt::Debug for Broadcast {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broadcast")
            .field("source", &self.source)
            .field("viewers", &self.viewers.len())
            .finish_non_exhaustive()
    }
}

impl Broadcast {
    /// Subscribes to `source`'s packets, with the group of pictures it kept.
    pub(super) fn new(source: Arc<str>) -> Self {
        let video = hub().video(&source);
        let mut sub = video.subscribe();
        let kept = std::mem::take(&mut sub.gop);
        let mut cast = Self {
            source,
            video,
            sub,
            mux: None,
            gop: Vec::new(),
            gop_bytes: 0,
            sequence: 0,
            last: None,
            duration: DEFAULT_DURATION,
            origin_ms: 0,
            viewers: Vec::new(),
            waiting: Vec::new(),
        };
        for packet in &kept {
            cast.fragment(packet);
        }
        cast
    }

    /// Viewers, started or waiting.
    pub(super) fn count(&self) -> usize {
        self.viewers.len() + self.waiting.len()
    }

    /// Bytes its viewers' sockets did not take yet, summed over them.
    pub(super) fn unsent(&self) -> usize {
        self.viewers.iter().map(|v| v.unsent()).sum()
    }

    /// Whether any viewer has bytes its socket did not take yet.
    pub(super) fn backlogged(&self) -> bool {
        self.viewers.iter().any(|v| v.unsent() > 0)
    }

    /// A new viewer: started at once from the kept keyframe, or waiting for one.
    /// `ws_key`: a WebSocket's `Sec-WebSocket-Key`, its handshake answered at once.
    pub(super) fn welcome(&mut self, mut viewer: Viewer, ws_key: Option<&str>) {
        if let Some(key) = ws_key {
            viewer.queue_raw(super::ws::switching(key));
        }
        self.waiting.push(Waiting {
            viewer,
            since: Instant::now(),
        });
        self.start_waiting();
    }

    /// Starts the viewers waiting, once there is a keyframe to start from.
    fn start_waiting(&mut self) {
        let Some(mux) = &self.mux else {
            return;
        };
        if self.gop.first().is_none_or(|p| !p.keyframe) {
            return;
        }
        let codec = mux.config.codec();
        for Waiting { mut viewer, .. } in self.waiting.drain(..) {
            match viewer.framing {
                Framing::Http => viewer.queue_raw(head(&codec, self.origin_ms)),
                Framing::WebSocket => {
                    let hello = serde_json::json!({
                        "codec": codec,
                        "mime": format!("video/mp4; codecs=\"{codec}\""),
                        "origin_ms": self.origin_ms,
                        "timescale": TIMESCALE,
                    });
                    viewer.queue_message(hello.to_string().into_bytes().into(), true);
                }
            }
            viewer.queue_message(mux.init.clone(), false);
            for piece in &self.gop {
                viewer.offer(piece);
            }
            self.viewers.push(viewer);
        }
    }

    /// What the subscription carried.
    pub(super) fn carry(&mut self, item: Carried) {
        match item {
            Carried::Packet(p) | Carried::AfterLoss(p) => {
                if let Some(piece) = self.fragment(&p) {
                    let mut skips = 0;
                    for v in &mut self.viewers {
                        skips += u64::from(v.offer(&piece) == Took::Skipped);
                    }
                    self.video.skips.fetch_add(skips, Ordering::Relaxed);
                }
                self.start_waiting();
            }
            Carried::Break => {
                self.last = None;
                self.gop.clear();
                self.gop_bytes = 0;
            }
        }
    }

    /// The fragment of `packet`, kept in the group of pictures; `None` before the first
    /// keyframe. A keyframe whose parameter sets differ from the stream's so far starts a new
    /// stream: its viewers are closed (a page opens it again, with the new codec).
    fn fragment(&mut self, packet: &Packet) -> Option<Piece> {
        let keyframe = packet.keyframe();
        let map = packet.buffer.map_readable().ok()?;
        if keyframe && self.mux.as_ref().is_none_or(|m| m.caps != packet.caps) {
            self.configure(packet, map.as_slice());
        }
        let mux = self.mux.as_ref()?;
        let dts = packet.timestamp(true)?;
        let pts = packet.timestamp(false).unwrap_or(dts);
        let decode = ticks(dts);
        self.duration = match self.last {
            Some((connection, before)) if connection == packet.connection && decode > before => {
                u32::try_from(decode - before).unwrap_or(DEFAULT_DURATION)
            }
            Some(_) => self.duration,
            None => nominal_duration(&packet.caps).unwrap_or(self.duration),
        };
        self.last = Some((packet.connection, decode));
        let offset = i64::try_from(ticks(pts)).unwrap_or(i64::MAX)
            - i64::try_from(decode).unwrap_or(i64::MAX);
        let sample = mux.config.sample(map.as_slice());
        self.sequence = self.sequence.wrapping_add(1);
        let bytes: Arc<[u8]> = fmp4::fragment(
            self.sequence,
            &fmp4::Sample {
                data: &sample,
                decode,
                offset: i32::try_from(offset).unwrap_or(0),
                duration: self.duration,
                keyframe,
            },
        )
        .into();
        self.origin_ms = crate::events::millis(packet.arrival)
            - i64::try_from(pts.as_millis()).unwrap_or(i64::MAX);
        let piece = Piece {
            bytes,
            keyframe,
            time: decode,
        };
        if keyframe {
            self.gop.clear();
            self.gop_bytes = 0;
        }
        if (keyframe || !self.gop.is_empty()) && self.gop_bytes + piece.bytes.len() <= GOP_BYTES {
            self.gop_bytes += piece.bytes.len();
            self.gop.push(piece.clone());
        } else {
            self.gop.clear();
            self.gop_bytes = 0;
        }
        Some(piece)
    }

    /// Takes the configuration a keyframe with new caps gives (see [`Broadcast::fragment`]).
    fn configure(&mut self, packet: &Packet, keyframe: &[u8]) {
        let Ok(Some(config)) = Track::of(&packet.caps, keyframe) else {
            return;
        };
        let changed = self
            .mux
            .as_ref()
            .is_some_and(|m| m.config.parameter_sets() != config.parameter_sets());
        if changed {
            tracing::info!(source = %self.source, "live video: the stream's parameters changed; its viewers start again");
            self.viewers.clear();
            self.gop.clear();
            self.gop_bytes = 0;
        }
        self.mux = Some(Mux {
            init: fmp4::init_segment(&config).into(),
            config,
            caps: packet.caps.clone(),
        });
    }

    /// Writes what each viewer's socket takes; drops those gone. Returns the bytes written.
    pub(super) fn flush(&mut self) -> u64 {
        let mut written = 0;
        self.viewers.retain_mut(|v| match v.flush() {
            Ok(n) => {
                written += n as u64;
                true
            }
            Err(()) => false,
        });
        for w in &mut self.waiting {
            if let Ok(n) = w.viewer.flush() {
                written += n as u64;
            }
        }
        self.video.bytes_sent.fetch_add(written, Ordering::Relaxed);
        written
    }

    /// Answers the viewers waiting that will get no stream: the source has no playable codec,
    /// or gave no keyframe within [`FIRST_PICTURE`].
    pub(super) fn expire(&mut self) {
        let status = self.video.status();
        let source = self.source.clone();
        self.waiting.retain_mut(|w| {
            let why = match super::refusal(&source, &status) {
                Some(why) => Some((409, why)),
                None if w.since.elapsed() >= FIRST_PICTURE => Some((
                    503,
                    format!(
                        "source \"{source}\" gave no keyframe within {} s: its camera may be \
                         connecting; try again",
                        FIRST_PICTURE.as_secs()
                    ),
                )),
                None => None,
            };
            let Some((status, message)) = why else {
                return true;
            };
            refuse(&mut w.viewer, status, &message);
            false
        });
    }

    /// Whether a viewer still waits, and so the thread must wake to expire it.
    pub(super) fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }
}

/// Sends `message` as the viewer's last: a JSON error answer (plain HTTP), or a text message
/// and a close (a WebSocket, whose handshake was answered).
pub(super) fn refuse(viewer: &mut Viewer, status: u16, message: &str) {
    let body = serde_json::json!({ "error": message }).to_string();
    let bytes = match viewer.framing {
        Framing::Http => super::super::response(status, "application/json", body.as_bytes(), ""),
        Framing::WebSocket => {
            let mut out = super::ws::frame_header(body.len(), true);
            out.extend_from_slice(body.as_bytes());
            out.extend(super::ws::close_frame());
            out
        }
    };
    // Non-blocking: a short answer fits the socket's buffer.
    let _ = std::io::Write::write(&mut viewer.stream, &bytes);
}

/// The response head of a plain HTTP stream.
fn head(codec: &str, origin_ms: i64) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nCache-Control: no-store\r\n\
         X-Vidflow-Codec: {codec}\r\nX-Vidflow-Origin-Ms: {origin_ms}\r\n\
         X-Vidflow-Timescale: {TIMESCALE}\r\nX-Accel-Buffering: no\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

/// A frame's duration at the caps' frame rate, in ticks.
fn nominal_duration(caps: &gst::Caps) -> Option<u32> {
    let rate = caps.structure(0)?.get::<gst::Fraction>("framerate").ok()?;
    let (n, d) = (
        u64::try_from(rate.numer()).ok()?,
        u64::try_from(rate.denom()).ok()?,
    );
    (n > 0 && d > 0)
        .then(|| u32::try_from(u64::from(TIMESCALE) * d / n).ok())
        .flatten()
}
