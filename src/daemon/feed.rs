//! The live feed: each delivered frame's boxes and counts, as data, for `/api/live` (Server-Sent
//! Events; the page draws them over the preview's JPEG, nothing is re-encoded).
//!
//! Written by the executor's delivery callback (`vidflow-executor`), only while somebody
//! listens ([`Feed::listening`], raised and lowered by the HTTP live thread): a frame costs
//! `Arc` clones of its values and one `try_send` on a bounded channel of [`FEED_QUEUE`]
//! frames. When the live thread is behind, the frame is dropped and counted
//! ([`Feed::dropped`]), never waited for. Read by one thread, `vidflow-http-live`, which
//! turns a frame into JSON once and hands it to each client (`http/live.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::SystemTime;

use crossbeam_channel::{Receiver, Sender};
use serde_json::json;

use crate::steps::{Place, Shape};
use crate::value::{Counts, Detection, Track};

/// Frames queued for the live thread: a second or so of a few cameras.
pub const FEED_QUEUE: usize = 64;

/// One frame, as the live stream shows it.
#[derive(Debug)]
pub struct LiveFrame {
    pub source: Arc<str>,
    pub seq: u64,
    pub at: SystemTime,
    /// Its presentation time on its source's timeline (continuous across reconnections), which
    /// `/api/video` gives the same picture.
    pub pts: Option<std::time::Duration>,
    pub width: i32,
    pub height: i32,
    /// Each with where the image it was found in lies on the frame (a detector fed by
    /// `resize` or `crop`): the JSON gives every box and point in the frame's pixels.
    pub tracks: Vec<(Arc<[Track]>, Place)>,
    /// Detections, when the pipeline has no tracker.
    pub detections: Vec<(Arc<[Detection]>, Place)>,
    /// Each counts output, by its step's name.
    pub counts: Vec<(Arc<str>, Arc<Counts>)>,
    /// The lines and zones of the steps that ran on the frame, by step name.
    pub shapes: Vec<(Arc<str>, Arc<[Shape]>, Place)>,
}

impl LiveFrame {
    /// The message's JSON: `{"source", "seq", "t", "media_time", "width", "height", "boxes": [{"id",
    /// "label", "score", "box": [x, y, w, h], "predicted", and once known "speed",
    /// "speed_unit"}], "counts": {STEP: {NAME: N}}, "shapes": [{"step",
    /// "name", "kind": "line" | "zone", "points": [[x, y], ...]}]}`.
    pub fn to_json(&self) -> serde_json::Value {
        let boxes: Vec<_> = self
            .tracks
            .iter()
            .flat_map(|(t, place)| t.iter().map(move |t| (t, place)))
            .map(|(t, place)| {
                let mut one = json!({
                    "id": t.track_id,
                    "label": &*t.detection.class,
                    "score": t.detection.confidence,
                    "box": on_frame(place, &t.detection.bbox),
                    "predicted": t.predicted,
                });
                // Only once the tracker knows it (a few bytes less per box until then).
                if let Some(speed) = t.speed {
                    one["speed"] = json!(speed.value());
                    one["speed_unit"] = json!(speed.unit());
                }
                one
            })
            .chain(
                self.detections
                    .iter()
                    .flat_map(|(d, place)| d.iter().map(move |d| (d, place)))
                    .map(|(d, place)| {
                        json!({
                            "label": &*d.class,
                            "score": d.confidence,
                            "box": on_frame(place, &d.bbox),
                        })
                    }),
            )
            .collect();
        let counts: serde_json::Map<_, _> = self
            .counts
            .iter()
            .map(|(step, c)| (step.to_string(), json!(**c)))
            .collect();
        let shapes: Vec<_> = self
            .shapes
            .iter()
            .flat_map(|(step, shapes, place)| {
                shapes.iter().map(move |s| {
                    let points: Vec<[f32; 2]> = s.points.iter().map(|p| place.point(*p)).collect();
                    json!({
                        "step": &**step,
                        "name": &*s.name,
                        "kind": if s.zone { "zone" } else { "line" },
                        "points": points,
                    })
                })
            })
            .collect();
        json!({
            "source": &*self.source,
            "seq": self.seq,
            "t": crate::events::millis(self.at),
            "media_time": self.pts.map(media_time),
            "width": self.width,
            "height": self.height,
            "boxes": boxes,
            "counts": counts,
            "shapes": shapes,
        })
    }
}

/// A box found in an image at `place`, in the frame's pixels (`[x, y, width, height]`).
fn on_frame(place: &Place, b: &crate::value::BBox) -> [f32; 4] {
    place.rect([b.x, b.y, b.width, b.height])
}

/// A presentation time as `/api/video`'s fragmented MP4 gives it, in seconds: what a browser's
/// `requestVideoFrameCallback` reports as the picture's `mediaTime` (to the microsecond).
pub fn media_time(pts: std::time::Duration) -> f64 {
    use crate::packets::fmp4::{TIMESCALE, ticks};
    ticks(pts) as f64 / f64::from(TIMESCALE)
}

/// Between the executor and the live thread (see the module above).
#[derive(Debug)]
pub struct Feed {
    /// Live clients connected: raised and lowered by the live thread (Relaxed: a frame more
    /// or less is fine).
    listeners: AtomicUsize,
    tx: Sender<LiveFrame>,
    rx: Receiver<LiveFrame>,
    /// Frames not queued because the live thread was behind.
    pub dropped: AtomicU64,
    /// Live clients let go because they did not read fast enough (`http/live.rs`).
    pub slow_clients: AtomicU64,
    /// Whether the live thread runs below the frame path's priority (`http/live.rs`): one of
    /// the `PRIORITY_*` values, written once by the live thread as it starts (Relaxed: it is
    /// only shown).
    pub priority: AtomicU8,
    /// Cameras' stills a live client did not take before a newer one replaced them
    /// (`http/stills.rs`).
    pub stills_dropped: AtomicU64,
    /// The live clients' cap (`http/live.rs`: from the file-descriptor limit), set as the live
    /// thread starts, and the clients refused for it (Relaxed: only shown).
    pub max_clients: AtomicUsize,
    pub refused: AtomicU64,
}

/// [`Feed::priority`]: the live thread has not started.
pub const PRIORITY_UNKNOWN: u8 = 0;
/// [`Feed::priority`]: the live thread runs below the frame path's priority.
pub const PRIORITY_BELOW_FRAMES: u8 = 1;
/// [`Feed::priority`]: lowering it was refused (a system call filter): it runs at theirs.
pub const PRIORITY_REFUSED: u8 = 2;

impl Default for Feed {
    fn default() -> Self {
        let (tx, rx) = crossbeam_channel::bounded(FEED_QUEUE);
        Self {
            listeners: AtomicUsize::new(0),
            tx,
            rx,
            dropped: AtomicU64::new(0),
            slow_clients: AtomicU64::new(0),
            priority: AtomicU8::new(PRIORITY_UNKNOWN),
            stills_dropped: AtomicU64::new(0),
            max_clients: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

impl Feed {
    /// Whether a client listens (the executor builds no frame otherwise).
    pub fn listening(&self) -> bool {
        self.listeners.load(Ordering::Relaxed) > 0
    }

    /// Live clients connected now.
    pub fn listeners(&self) -> usize {
        self.listeners.load(Ordering::Relaxed)
    }

    /// Whether the live thread runs below the frame path's priority (`None`: not started).
    pub fn below_frames(&self) -> Option<bool> {
        match self.priority.load(Ordering::Relaxed) {
            PRIORITY_BELOW_FRAMES => Some(true),
            PRIORITY_REFUSED => Some(false),
            _ => None,
        }
    }

    pub fn set_listeners(&self, n: usize) {
        self.listeners.store(n, Ordering::Relaxed);
    }

    /// Queues `frame`, or drops and counts it when the live thread is behind.
    pub fn publish(&self, frame: LiveFrame) {
        if self.tx.try_send(frame).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The live thread's end.
    pub fn receiver(&self) -> &Receiver<LiveFrame> {
        &self.rx
    }
}
