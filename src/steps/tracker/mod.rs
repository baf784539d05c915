//! `tracker`: follows detected objects from frame to frame and gives each a stable ID.
//!
//! SORT (a constant-velocity Kalman filter per object, `kalman`, and IoU matching, `assign`) or
//! ByteTrack (the same, plus a second association of the less confident detections to the
//! tracks still unmatched); the life of a track and the association stages are in `tracks`.
//!
//! State: the tracks of each source ([`PerSource`]: a map from source name to that source's
//! tracks behind their own lock, the map's lock never held while tracking); the kind is
//! stateful, so the executor hands this step one source's frames in order and one at a time.
//! After a panic on a frame of a source, the executor drops that source's tracks
//! ([`Step::reset_source`]): its IDs start again at 1. When a source's frames change size (a
//! camera back at another size), its tracks end ([`Step::source_resized`]): each confirmed one
//! is reported once on `events` as `ended` (place `"resize"`), and IDs go on from where they
//! were. No thread or channel of its own.
//!
//! Frames without detections: `detections` is an optional input. When the detector did not run
//! on a frame (`every_n_frames`, or its branch was skipped), the tracker still runs and only
//! predicts. Gaps in frame numbers (frames a live source dropped from its full queue) are
//! predicted across: a frame `n` numbers after the last is `n` steps of the filter.

use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::common::per_source::PerSource;
use super::{Port, Step, StepError, StepInput, StepKind, StepOutput};
use crate::frame::Format;
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{Detection, Event, EventKind, Value, ValueType};

mod appearance;
mod assign;
mod kalman;
#[cfg(test)]
mod scenes;
mod speed;
#[cfg(test)]
mod speed_pets;
mod tracks;

use appearance::Colours;
use speed::Speeds;
use tracks::Tracks;

/// Largest `max_age`: a lost track is predicted at most this many frames (about 5 minutes at
/// 30 fps), which bounds the work of predicting across a long gap.
const MAX_AGE_LIMIT: u32 = 10_000;
/// The default `speed_window_s`, measured on PETS09-S2L1's ground truth (`speed_pets`: its boxes
/// with gaussian jitter of 2% / 4% of their height on each edge, through the tracker's motion
/// model and a 4-point calibration of 3.8 cm rms over all 4650 gt places). Mean error of a
/// frame's speed against the truth, km/h, at windows 0.5 / 1 / 1.5 / 2 / 3 s: 0.72 / 0.55 /
/// 0.62 / 0.71 / 0.90 at 2%, 1.17 / 0.71 / 0.67 / 0.74 / 0.91 at 4%; error of each person's
/// mean speed: 5.5 / 3.4 / 2.6 / 2.2 / 2.0 % at 2%, 10.2 / 4.4 / 3.0 / 2.3 / 1.9 % at 4%.
/// 1.5 s is near the least frame error at either jitter (shorter follows the jitter, longer
/// lags behind a change of pace), its person means within 3%, and a first speed 0.75 s after
/// a track is first seen.
const SPEED_WINDOW_S: f64 = 1.5;
/// What `speed_window_s` may be, seconds: a tenth of a second is two or three frames of most
/// cameras; ten seconds is most of a walk across a picture.
const SPEED_WINDOW_RANGE: std::ops::RangeInclusive<f64> = 0.1..=10.0;

pub(super) static KIND: StepKind = StepKind {
    name: "tracker",
    summary: "follows detections across frames with stable IDs: SORT or ByteTrack (state per source)",
    inputs: &[Port {
        name: "detections",
        ty: ValueType::Detections,
        optional: true,
    }],
    outputs: &[
        Port {
            name: "tracks",
            ty: ValueType::Tracks,
            optional: false,
        },
        Port {
            name: "events",
            ty: ValueType::Events,
            optional: false,
        },
    ],
    params: &[
        ParamDoc {
            name: "method",
            ty: "string",
            default: "\"bytetrack\"",
            doc: "\"bytetrack\" (less confident detections keep tracks alive) or \"sort\" (they are ignored)",
        },
        ParamDoc {
            name: "max_age",
            ty: "integer in [0, 10000]",
            default: "60",
            doc: "frames a lost track is kept for re-finding before it is dropped (its ID is then gone): more bridges longer occlusions, and risks handing the ID to someone else",
        },
        ParamDoc {
            name: "min_hits",
            ty: "integer in [1, 10000]",
            default: "2",
            doc: "frames with detections a new object must be seen on in a row before it is reported",
        },
        ParamDoc {
            name: "iou",
            ty: "float in (0, 1]",
            default: "0.3",
            doc: "least overlap (IoU) of a detection with a track's predicted box to match it",
        },
        ParamDoc {
            name: "high_confidence",
            ty: "float in [0, 1]",
            default: "0.5",
            doc: "detections at least this confident are matched first and may start tracks",
        },
        ParamDoc {
            name: "per_class",
            ty: "bool",
            default: "true",
            doc: "match a track only with detections of its class",
        },
        ParamDoc {
            name: "report_lost",
            ty: "integer in [0, 10000]",
            default: "0",
            doc: "frames with detections on which a lost track is still reported (predicted): more keeps boxes on hidden objects, at the cost of boxes where nothing is seen",
        },
        ParamDoc {
            name: "smooth",
            ty: "bool",
            default: "true",
            doc: "report a matched object's box as the motion model's estimate (the detection blended with the track's path, as ByteTrack does): steadier boxes and line counts; false reports the detection's own box",
        },
        ParamDoc {
            name: "appearance",
            ty: "bool",
            default: "true",
            doc: "compare the colours of boxes (upper and lower half): keeps IDs apart where people cross, costs a few microseconds per detection",
        },
        ParamDoc {
            name: "appearance_weight",
            ty: "float in [0, 1]",
            default: "0.3",
            doc: "share of colour likeness (against IoU) in a match's score",
        },
        ParamDoc {
            name: "appearance_veto",
            ty: "float in [0, 1]",
            default: "0.4",
            doc: "colours less alike than this (0 to 1) never match, whatever the overlap: higher keeps crossing people apart, and may split one person whose look changes",
        },
        ParamDoc {
            name: "refind_distance",
            ty: "float in [0, 10]",
            default: "1.5",
            doc: "a lost track may match a detection it does not overlap this close (box heights between centres) if their colours are alike: bridges a crossing where the motion model guessed wrong",
        },
        ParamDoc {
            name: "refind_similarity",
            ty: "float in [0, 1]",
            default: "0.75",
            doc: "how alike (0 to 1) colours must be to re-find a lost track away from its predicted box: lower re-finds more, and swaps more IDs",
        },
        ParamDoc {
            name: "speed_window_s",
            ty: "float in [0.1, 10]",
            default: "1.5",
            doc: "seconds of frame time a track's speed is fitted over (a straight line through the places it was seen at): longer is steadier and slower to follow a change; no speed is given until a track was seen over half of it",
        },
    ],
    stateful: true,
    build,
};

/// Which association.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Sort,
    ByteTrack,
}

/// The tracker's parameters, validated.
#[derive(Debug, Clone)]
struct Settings {
    method: Method,
    max_age: u32,
    min_hits: u32,
    iou: f32,
    high: f32,
    per_class: bool,
    report_lost: u32,
    smooth: bool,
    appearance: bool,
    appearance_weight: f32,
    appearance_veto: f32,
    refind_distance: f32,
    refind_similarity: f32,
    speed_window_s: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            method: Method::ByteTrack,
            max_age: 60,
            min_hits: 2,
            iou: 0.3,
            high: 0.5,
            per_class: true,
            report_lost: 0,
            smooth: true,
            appearance: true,
            appearance_weight: 0.3,
            appearance_veto: 0.4,
            refind_distance: 1.5,
            refind_similarity: 0.75,
            speed_window_s: SPEED_WINDOW_S,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    method: Option<Spanned<String>>,
    max_age: Option<Spanned<i64>>,
    min_hits: Option<Spanned<i64>>,
    iou: Option<Spanned<f64>>,
    high_confidence: Option<Spanned<f64>>,
    per_class: Option<bool>,
    report_lost: Option<Spanned<i64>>,
    smooth: Option<bool>,
    appearance: Option<bool>,
    appearance_weight: Option<Spanned<f64>>,
    appearance_veto: Option<Spanned<f64>>,
    refind_distance: Option<Spanned<f64>>,
    refind_similarity: Option<Spanned<f64>>,
    speed_window_s: Option<Spanned<f64>>,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let d = Settings::default();
    let method = match c.method {
        None => d.method,
        Some(m) => match m.get_ref().as_str() {
            "bytetrack" => Method::ByteTrack,
            "sort" => Method::Sort,
            other => {
                return Err(Diagnostic::at(
                    m.span(),
                    format!("method must be \"bytetrack\" or \"sort\", not \"{other}\""),
                ));
            }
        },
    };
    let whole = |key: &str, v: Option<Spanned<i64>>, low: u32, default: u32| match v {
        None => Ok(default),
        Some(v) => u32::try_from(*v.get_ref())
            .ok()
            .filter(|n| (low..=MAX_AGE_LIMIT).contains(n))
            .ok_or_else(|| {
                Diagnostic::at(
                    v.span(),
                    format!(
                        "{key} must be a whole number from {low} to {MAX_AGE_LIMIT}, not {}",
                        v.get_ref()
                    ),
                )
            }),
    };
    let fraction = |key: &str, v: Option<Spanned<f64>>, zero_ok: bool, default: f32| match v {
        None => Ok(default),
        Some(v) => {
            let x = *v.get_ref();
            let low_ok = if zero_ok { x >= 0.0 } else { x > 0.0 };
            if low_ok && x <= 1.0 {
                Ok(x as f32)
            } else {
                let range = if zero_ok {
                    "from 0 to 1"
                } else {
                    "above 0 and at most 1"
                };
                Err(Diagnostic::at(
                    v.span(),
                    format!("{key} must be {range}, not {x}"),
                ))
            }
        }
    };
    let settings = Settings {
        method,
        max_age: whole("max_age", c.max_age, 0, d.max_age)?,
        min_hits: whole("min_hits", c.min_hits, 1, d.min_hits)?,
        iou: fraction("iou", c.iou, false, d.iou)?,
        high: fraction("high_confidence", c.high_confidence, true, d.high)?,
        per_class: c.per_class.unwrap_or(d.per_class),
        report_lost: whole("report_lost", c.report_lost, 0, d.report_lost)?,
        smooth: c.smooth.unwrap_or(d.smooth),
        appearance: c.appearance.unwrap_or(d.appearance),
        appearance_weight: fraction(
            "appearance_weight",
            c.appearance_weight,
            true,
            d.appearance_weight,
        )?,
        appearance_veto: fraction(
            "appearance_veto",
            c.appearance_veto,
            true,
            d.appearance_veto,
        )?,
        refind_distance: match c.refind_distance {
            None => d.refind_distance,
            Some(v) if (0.0..=10.0).contains(v.get_ref()) => *v.get_ref() as f32,
            Some(v) => {
                return Err(Diagnostic::at(
                    v.span(),
                    format!(
                        "refind_distance must be from 0 to 10 (box heights), not {}",
                        v.get_ref()
                    ),
                ));
            }
        },
        refind_similarity: fraction(
            "refind_similarity",
            c.refind_similarity,
            true,
            d.refind_similarity,
        )?,
        speed_window_s: match c.speed_window_s {
            None => d.speed_window_s,
            Some(v) if SPEED_WINDOW_RANGE.contains(v.get_ref()) => *v.get_ref(),
            Some(v) => {
                return Err(Diagnostic::at(
                    v.span(),
                    format!(
                        "speed_window_s must be from 0.1 to 10 (seconds), not {}",
                        v.get_ref()
                    ),
                ));
            }
        },
    };
    Ok(Box::new(Tracker::new(settings)))
}

#[derive(Debug)]
struct Tracker {
    settings: Settings,
    /// The tracks of each source (see the module header).
    sources: PerSource<Source>,
}

/// What the tracker keeps of one source.
#[derive(Debug, Default)]
struct Source {
    tracks: Tracks,
    /// The `ended` events its next frame reports.
    ended: Vec<Event>,
    /// Where its tracks were seen lately, for their speeds.
    speeds: Speeds,
}

/// `place` of the events of tracks ended by a change of their source's size.
const RESIZE: &str = "resize";

impl Tracker {
    fn new(settings: Settings) -> Self {
        Self {
            settings,
            sources: PerSource::default(),
        }
    }
}

impl Step for Tracker {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let detections = input.optional::<[Detection]>(0)?;
        let (out, ended) = self.sources.with(&input.frame.source, |source| {
            let frame = input.frame;
            let bounds = [frame.width() as f32, frame.height() as f32];
            let looks: Option<Vec<Option<Colours>>> = detections
                .filter(|_| self.settings.appearance && frame.width() > 0)
                .map(|ds| ds.iter().map(|d| Colours::of(frame, &d.bbox)).collect());
            let bounds = (frame.width() > 0).then_some(bounds);
            let mut out = source.tracks.update(
                &self.settings,
                frame.seq,
                detections,
                bounds,
                looks.as_deref(),
            );
            let tracks = &source.tracks;
            source
                .speeds
                .measure(&mut out, frame, self.settings.speed_window_s, |id| {
                    tracks.keeps(id)
                });
            (out, std::mem::take(&mut source.ended))
        });
        Ok(StepOutput::Values(vec![
            Value::Tracks(out.into()),
            Value::Events(ended.into()),
        ]))
    }

    fn reset_source(&self, source: &str) -> bool {
        self.sources.reset(source);
        true
    }

    fn source_resized(&self, source: &str, _from: Format, _to: Format) -> Option<String> {
        let source: Arc<str> = source.into();
        let ids = self.sources.with(
            &source,
            |Source {
                 tracks,
                 ended,
                 speeds,
             }| {
                let place: Arc<str> = RESIZE.into();
                speeds.clear();
                let now = tracks.end_all();
                let ids: Vec<String> = now.iter().map(|t| t.track_id.to_string()).collect();
                ended.extend(now.into_iter().map(|t| Event {
                    event: EventKind::Ended,
                    track_id: t.track_id,
                    class: t.detection.class,
                    place: place.clone(),
                    bbox: t.detection.bbox,
                    dwell_s: None,
                    speed: None,
                }));
                ids
            },
        );
        Some(match ids.len() {
            0 => "it had no track; new objects get new IDs".to_owned(),
            _ => format!(
                "its tracks end (ID {}, each an \"ended\" event); new objects get new IDs",
                ids.join(", ")
            ),
        })
    }
}

/// Follows `frames` of detections (one list a frame: consecutive frames of one source of
/// `width` x `height` pixels) with the default settings, as a `tracker` step with no parameters
/// would: the tracks of each frame. For `backend = "auto"`, which keeps a reduced precision only
/// where its detections give f32's tracks on a model's check clip.
pub(in crate::steps) fn follow_clip(
    width: u32,
    height: u32,
    frames: &[Vec<Detection>],
) -> Vec<Vec<crate::value::Track>> {
    let bounds = [width as f32, height as f32];
    let settings = Settings::default();
    let mut tracks = Tracks::default();
    frames
        .iter()
        .zip(0u64..)
        .map(|(detections, seq)| {
            tracks.update(&settings, seq, Some(detections), Some(bounds), None)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Frame;
    use crate::value::{BBox, Track};
    use opencv::core::Mat;

    fn run(step: &Tracker, source: &str, seq: u64, x: Option<f32>) -> Vec<Track> {
        run_with_events(step, source, seq, x).0
    }

    /// The tracks and the events of one frame with (or, `None`, without) a detection at `x`.
    fn run_with_events(
        step: &Tracker,
        source: &str,
        seq: u64,
        x: Option<f32>,
    ) -> (Vec<Track>, Vec<Event>) {
        let frame = Frame::from_mat(source.into(), seq, None, Mat::default());
        let values = [x.map(|x| {
            Value::Detections(Arc::from(vec![Detection::new(
                "thing".into(),
                0.9,
                BBox {
                    x,
                    y: 0.0,
                    width: 20.0,
                    height: 20.0,
                },
            )]))
        })];
        let input = StepInput {
            frame: &frame,
            values: &values,
        };
        match step.run(&input).unwrap() {
            StepOutput::Values(v) => (
                v[0].get::<[Track]>().unwrap().to_vec(),
                v[1].get::<[Event]>().unwrap().to_vec(),
            ),
            StepOutput::EndBranch => panic!("a tracker never ends its branch"),
        }
    }

    #[test]
    fn a_new_size_ends_every_track_once_with_an_event_and_ids_go_on() {
        let step = Tracker::new(Settings {
            min_hits: 1,
            ..Settings::default()
        });
        for seq in 0..3 {
            run(&step, "a", seq, Some(0.0));
            run(&step, "b", seq, Some(0.0));
        }
        let format = |width, height| Format {
            width,
            height,
            fps: None,
        };
        let said = step.source_resized("a", format(320, 240), format(640, 480));
        assert!(said.is_some_and(|s| s.contains("ID 1")));
        // The same place at the new size is a new object: the old track ended, reported once.
        let (tracks, events) = run_with_events(&step, "a", 3, Some(0.0));
        let ended: Vec<_> = events
            .iter()
            .map(|e| (e.event, e.track_id, &*e.place))
            .collect();
        assert_eq!(ended, [(EventKind::Ended, 1, "resize")]);
        assert_eq!(tracks.iter().map(|t| t.track_id).collect::<Vec<_>>(), [2]);
        assert!(run_with_events(&step, "a", 4, Some(0.0)).1.is_empty());
        // Another source keeps its tracks.
        let b = run_with_events(&step, "b", 3, Some(0.0));
        assert_eq!(b.0.iter().map(|t| t.track_id).collect::<Vec<_>>(), [1]);
        assert!(b.1.is_empty());
    }

    #[test]
    fn each_source_has_its_own_tracks_and_ids() {
        let step = Tracker::new(Settings {
            min_hits: 1,
            report_lost: 30,
            ..Settings::default()
        });
        // Source a sees an object at x = 0 on frames 0 to 4; source b, interleaved with a, sees
        // one at the same place from its frame 0 and a second one far off from its frame 3.
        for seq in 0..5 {
            let a = run(&step, "a", seq, Some(0.0));
            assert_eq!(a.iter().map(|t| t.track_id).collect::<Vec<_>>(), [1]);
            let b = run(&step, "b", seq, Some(0.0));
            assert_eq!(b.iter().map(|t| t.track_id).collect::<Vec<_>>(), [1]);
        }
        // b's frames carry on; a's track is not in b's output, and b's next ID is its own 2.
        let b = run(&step, "b", 5, Some(200.0));
        assert_eq!(b.len(), 2, "{b:?}");
        assert_eq!((b[0].track_id, b[0].predicted), (1, true));
        assert_eq!((b[1].track_id, b[1].predicted), (2, false));
        // a saw nothing of b's second object, and its frame numbers are its own.
        let a = run(&step, "a", 5, None);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].track_id, 1);
    }

    #[test]
    fn a_missing_detections_input_only_predicts() {
        let step = Tracker::new(Settings {
            min_hits: 1,
            ..Settings::default()
        });
        assert!(run(&step, "a", 0, None).is_empty());
        assert!(!run(&step, "a", 1, Some(0.0))[0].predicted);
        assert!(run(&step, "a", 2, None)[0].predicted);
    }
}
