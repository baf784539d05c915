//! What flows between steps: images, detections, tracks, counts and events.
//!
//! Values are cheap to clone (reference counted) because one output may feed several steps and
//! several sinks of the same frame, possibly on different threads.
//!
//! Everything about a value type is said here and nowhere else: its [`ValueType`] (checked when
//! a pipeline is validated), how messages name it, its JSON form, and how a step reads it from an
//! input port ([`FromValue`]). Adding a type means a variant of [`ValueType`] and of [`Value`],
//! and the arms of the matches in this file.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use opencv::core::Mat;
use serde::Serialize;

use crate::frame::{Frame, FrameError};

/// The type of a step input or output, checked when the pipeline is validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    Image,
    Detections,
    Tracks,
    Counts,
    Events,
}

impl ValueType {
    /// The type's name, as `vidflow steps` lists ports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Image => "image",
            Self::Detections => "detections",
            Self::Tracks => "tracks",
            Self::Counts => "counts",
            Self::Events => "events",
        }
    }

    /// How a message speaks of one value of this type: "\"image\" takes an image".
    pub fn phrase(self) -> &'static str {
        match self {
            Self::Image => "an image",
            Self::Detections => "detections",
            Self::Tracks => "tracks",
            Self::Counts => "counts",
            Self::Events => "events",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A value produced by a step (or the decoded frame itself).
#[derive(Debug, Clone)]
pub enum Value {
    Image(Image),
    Detections(Arc<[Detection]>),
    Tracks(Arc<[Track]>),
    Counts(Arc<Counts>),
    Events(Arc<[Event]>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Self::Image(_) => ValueType::Image,
            Self::Detections(_) => ValueType::Detections,
            Self::Tracks(_) => ValueType::Tracks,
            Self::Counts(_) => ValueType::Counts,
            Self::Events(_) => ValueType::Events,
        }
    }

    /// Whether the value holds nothing to report: no detection, track or event. An image and
    /// counts (even all zero) are never empty.
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Detections(d) => d.is_empty(),
            Self::Tracks(t) => t.is_empty(),
            Self::Events(e) => e.is_empty(),
            Self::Image(_) | Self::Counts(_) => false,
        }
    }

    /// The value as one JSON line shows it: detections in full, an image by its shape.
    pub fn to_json(&self) -> serde_json::Value {
        let json = match self {
            Self::Detections(d) => serde_json::to_value(&**d),
            Self::Tracks(t) => serde_json::to_value(&**t),
            Self::Counts(c) => serde_json::to_value(&**c),
            Self::Events(e) => serde_json::to_value(&**e),
            Self::Image(image) => {
                let (width, height, channels) = image.shape();
                return serde_json::json!({"width": width, "height": height, "channels": channels});
            }
        };
        json.unwrap_or(serde_json::Value::Null)
    }

    /// The value as `T`, if it is of `T`'s type.
    pub fn get<T: FromValue + ?Sized>(&self) -> Option<&T> {
        T::from_value(self)
    }
}

/// A Rust type a value of one [`ValueType`] can be read as.
pub trait FromValue {
    const TYPE: ValueType;
    fn from_value(value: &Value) -> Option<&Self>;
}

/// Says that `$value` of `Value::$variant` reads as `$t`.
macro_rules! from_value {
    ($t:ty, $variant:ident) => {
        impl FromValue for $t {
            const TYPE: ValueType = ValueType::$variant;
            fn from_value(value: &Value) -> Option<&Self> {
                match value {
                    Value::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

from_value!(Image, Image);
from_value!([Detection], Detections);
from_value!([Track], Tracks);
from_value!(Counts, Counts);
from_value!([Event], Events);

/// An image: the decoded frame itself (zero-copy; BGR made on first use), its luma plane, or
/// pixels a step produced.
#[derive(Clone)]
pub enum Image {
    Frame(Arc<Frame>),
    /// The frame's luma plane as a grey image (only for frames that have one).
    Luma(Arc<Frame>),
    Owned(Arc<Mat>),
}

impl Image {
    pub fn mat(&self) -> Result<&Mat, FrameError> {
        match self {
            Self::Frame(frame) => frame.bgr(),
            Self::Luma(frame) => frame
                .luma()
                .ok_or_else(|| FrameError::Map("frame has no luma plane".to_owned())),
            Self::Owned(mat) => Ok(mat),
        }
    }

    /// Width, height and channels, without converting anything.
    pub fn shape(&self) -> (i32, i32, i32) {
        use opencv::core::MatTraitConst;
        match self {
            Self::Frame(f) => (f.width(), f.height(), 3),
            Self::Luma(f) => (f.width(), f.height(), 1),
            Self::Owned(m) => (m.cols(), m.rows(), m.channels()),
        }
    }
}

impl From<Mat> for Image {
    fn from(mat: Mat) -> Self {
        Self::Owned(Arc::new(mat))
    }
}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (w, h, c) = self.shape();
        write!(f, "Image({w}x{h}x{c})")
    }
}

/// An axis-aligned box in pixel coordinates of the image it was found in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BBox {
    /// Left edge.
    pub x: f32,
    /// Top edge.
    pub y: f32,
    pub width: f32,
    pub height: f32,
}

impl From<opencv::core::Rect> for BBox {
    fn from(r: opencv::core::Rect) -> Self {
        Self {
            x: r.x as f32,
            y: r.y as f32,
            width: r.width as f32,
            height: r.height as f32,
        }
    }
}

/// One detected object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    pub class: Arc<str>,
    pub confidence: f32,
    #[serde(rename = "box")]
    pub bbox: BBox,
    /// Points found with the object, in pixels of the same image, when its detector gives them
    /// (a face: the person's right eye, left eye, nose tip, right and left mouth corners; for a
    /// face turned to the camera the right eye is on the image's left). Absent from JSON when
    /// there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub landmarks: Option<Vec<[f32; 2]>>,
}

impl Detection {
    /// A detection without landmarks.
    pub fn new(class: Arc<str>, confidence: f32, bbox: BBox) -> Self {
        Self {
            class,
            confidence,
            bbox,
            landmarks: None,
        }
    }
}

/// One object followed across frames: the detection it matched (or the box predicted for it
/// when it was not seen on this frame) and its ID, stable for as long as the track lives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Track {
    /// Unique per tracker step and source for the whole run, never reused.
    pub track_id: u64,
    #[serde(flatten)]
    pub detection: Detection,
    /// True when the object was not detected on this frame and `box` is where it is predicted
    /// to be. Absent from JSON when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub predicted: bool,
    /// Where it stands on the ground (its box's bottom centre), metres, when its source has a
    /// ground calibration. Absent from JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ground: Option<[f32; 2]>,
    /// How fast it moves, smoothed over the tracker's `speed_window_s`: `speed_kmh` on the
    /// ground of a calibrated source, else `speed_px_s` in the picture. Absent until the track
    /// has been seen long enough to tell.
    #[serde(flatten)]
    pub speed: Option<Speed>,
    /// Seconds (of frame time) it has been inside each zone it is in now, as `zone_count`
    /// gives it on its `tracks` output. Absent from JSON when it is in none.
    #[serde(rename = "dwell_s", skip_serializing_if = "Option::is_none")]
    pub dwell: Option<Arc<BTreeMap<Arc<str>, f32>>>,
}

impl Track {
    /// A track of `detection`, with nothing measured of it yet.
    pub fn new(track_id: u64, detection: Detection, predicted: bool) -> Self {
        Self {
            track_id,
            detection,
            predicted,
            ground: None,
            speed: None,
            dwell: None,
        }
    }
}

/// A speed, in the units its source allows: on the ground of a calibrated camera, km/h; in the
/// picture of one without a calibration, pixels a second (never named km/h). In JSON, one key:
/// `"speed_kmh": 5.2` or `"speed_px_s": 41.0`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Speed {
    #[serde(rename = "speed_kmh")]
    Kmh(f32),
    #[serde(rename = "speed_px_s")]
    PxPerS(f32),
}

impl Speed {
    /// The number, in its unit.
    pub fn value(self) -> f32 {
        match self {
            Self::Kmh(v) | Self::PxPerS(v) => v,
        }
    }

    /// Its unit as a short label: `km/h` or `px/s`.
    pub fn unit(self) -> &'static str {
        match self {
            Self::Kmh(_) => "km/h",
            Self::PxPerS(_) => "px/s",
        }
    }
}

/// Named counts: objects inside each zone now, or crossings of a line each way
/// (`{"in": N, "out": N}`). In JSON, an object of names to numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Counts(pub BTreeMap<Arc<str>, u64>);

/// Something that happened to a track on this frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub event: EventKind,
    pub track_id: u64,
    pub class: Arc<str>,
    /// The zone entered or left, the line crossed, or for a track that ended, why
    /// (`"resize"`: its source's frames changed size).
    pub place: Arc<str>,
    /// The track's box on this frame (for a track that ended, where it was last seen).
    #[serde(rename = "box")]
    pub bbox: BBox,
    /// Seconds of frame time in the zone: the whole visit on a `leave`, so far on a `loiter`
    /// or `speeding`. Absent from JSON for other events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dwell_s: Option<f32>,
    /// The track's speed on a `speeding` event (and on others when it is known).
    #[serde(flatten)]
    pub speed: Option<Speed>,
}

impl Event {
    /// An event with nothing measured: `kind` of track `track_id` at `place`.
    pub fn new(
        event: EventKind,
        track_id: u64,
        class: Arc<str>,
        place: Arc<str>,
        bbox: BBox,
    ) -> Self {
        Self {
            event,
            track_id,
            class,
            place,
            bbox,
            dwell_s: None,
            speed: None,
        }
    }
}

/// What an [`Event`] says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// Entered a zone.
    Enter,
    /// Left a zone (or its track ended inside it).
    Leave,
    /// Crossed a line to its "in" side.
    In,
    /// Crossed a line to its "out" side.
    Out,
    /// The tracker ended the track (its source's frames changed size).
    Ended,
    /// Has been in a zone longer than its `loiter_s` (once per visit).
    Loiter,
    /// Went faster than its zone's speed limit (once per visit).
    Speeding,
}

impl EventKind {
    /// Every kind, in the order above.
    pub const ALL: [Self; 7] = [
        Self::Enter,
        Self::Leave,
        Self::In,
        Self::Out,
        Self::Ended,
        Self::Loiter,
        Self::Speeding,
    ];

    /// Its name, as JSON and the event store write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Enter => "enter",
            Self::Leave => "leave",
            Self::In => "in",
            Self::Out => "out",
            Self::Ended => "ended",
            Self::Loiter => "loiter",
            Self::Speeding => "speeding",
        }
    }
}

impl BBox {
    /// The bottom centre: where a person or vehicle touches the ground, the point zones and
    /// lines test by default.
    pub fn anchor(&self) -> [f32; 2] {
        [self.x + self.width / 2.0, self.y + self.height]
    }

    /// Intersection over union of two boxes (0 when either is empty).
    pub fn iou(&self, other: &Self) -> f32 {
        let w = (self.x + self.width).min(other.x + other.width) - self.x.max(other.x);
        let h = (self.y + self.height).min(other.y + other.height) - self.y.max(other.y);
        let inter = w.max(0.0) * h.max(0.0);
        let union = self.width * self.height + other.width * other.height - inter;
        if union > 0.0 { inter / union } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detections() -> Value {
        Value::Detections(Arc::from(vec![Detection::new(
            "person".into(),
            0.5,
            BBox {
                x: 1.0,
                y: 2.0,
                width: 3.0,
                height: 4.0,
            },
        )]))
    }

    #[test]
    fn landmarks_are_in_json_only_when_a_detector_gives_them() {
        let mut face = Detection::new(
            "face".into(),
            0.9,
            BBox {
                x: 0.0,
                y: 0.0,
                width: 2.0,
                height: 2.0,
            },
        );
        face.landmarks = Some(vec![[1.0, 1.5]]);
        let json = serde_json::to_value(&face).unwrap();
        assert_eq!(json["landmarks"], serde_json::json!([[1.0, 1.5]]));
        face.landmarks = None;
        let json = serde_json::to_value(&face).unwrap();
        assert!(json.get("landmarks").is_none(), "{json}");
    }

    #[test]
    fn iou_of_boxes() {
        let a = BBox {
            x: 0.0,
            y: 0.0,
            width: 10.0,
            height: 10.0,
        };
        let b = BBox { x: 5.0, ..a };
        assert_eq!(a.iou(&a), 1.0);
        assert!((a.iou(&b) - 50.0 / 150.0).abs() < 1e-6);
        assert_eq!(a.iou(&BBox { x: 20.0, ..a }), 0.0);
    }

    #[test]
    fn a_value_reads_only_as_its_own_type() {
        let image = Value::Image(Mat::default().into());
        assert!(image.get::<Image>().is_some());
        assert!(image.get::<[Detection]>().is_none());
        assert_eq!(detections().get::<[Detection]>().map(<[_]>::len), Some(1));
        assert!(detections().get::<Image>().is_none());
        assert_eq!(<Image as FromValue>::TYPE, image.value_type());
        assert_eq!(<[Detection] as FromValue>::TYPE, detections().value_type());
        let tracks = Value::Tracks(Arc::from(Vec::new()));
        assert!(tracks.get::<[Detection]>().is_none());
        assert!(tracks.get::<[Track]>().is_some());
        assert_eq!(<[Track] as FromValue>::TYPE, tracks.value_type());
    }

    #[test]
    fn tracks_counts_and_events_have_their_json_form() {
        let Value::Detections(d) = detections() else {
            unreachable!()
        };
        let track = Track {
            track_id: 7,
            detection: d[0].clone(),
            predicted: false,
            ground: None,
            speed: None,
            dwell: None,
        };
        let tracks = Value::Tracks(Arc::from(vec![track.clone()]));
        assert_eq!(
            tracks.to_json(),
            serde_json::json!([{"track_id": 7, "class": "person", "confidence": 0.5,
                "box": {"x": 1.0, "y": 2.0, "width": 3.0, "height": 4.0}}])
        );
        let predicted = Value::Tracks(Arc::from(vec![Track {
            predicted: true,
            ..track
        }]));
        assert_eq!(predicted.to_json()[0]["predicted"], serde_json::json!(true));
        let counts = Counts([("in".into(), 2), ("out".into(), 0)].into_iter().collect());
        assert_eq!(
            Value::Counts(Arc::new(counts)).to_json(),
            serde_json::json!({"in": 2, "out": 0})
        );
        let event = Event {
            event: EventKind::Enter,
            track_id: 7,
            class: "person".into(),
            place: "door".into(),
            bbox: d[0].bbox,
            dwell_s: None,
            speed: None,
        };
        assert_eq!(
            Value::Events(Arc::from(vec![event])).to_json()[0]["event"],
            serde_json::json!("enter")
        );
    }

    #[test]
    fn emptiness_is_about_things_to_report() {
        assert!(!detections().is_empty());
        assert!(Value::Tracks(Arc::from(Vec::new())).is_empty());
        assert!(Value::Events(Arc::from(Vec::new())).is_empty());
        assert!(!Value::Counts(Arc::default()).is_empty());
        assert!(!Value::Image(Mat::default().into()).is_empty());
    }

    #[test]
    fn json_shows_detections_in_full_and_images_by_shape() {
        assert_eq!(
            detections().to_json(),
            serde_json::json!([{"class": "person", "confidence": 0.5,
                "box": {"x": 1.0, "y": 2.0, "width": 3.0, "height": 4.0}}])
        );
        let image = Value::Image(Mat::default().into());
        assert_eq!(
            image.to_json(),
            serde_json::json!({"width": 0, "height": 0, "channels": 1})
        );
    }
}
