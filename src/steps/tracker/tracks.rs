//! The tracks of one source: prediction, association and the track life cycle, frame by frame.
//!
//! Life of a track: a detection that matches no track starts a *tentative* track. A tentative
//! track that misses a frame with detections is dropped; one matched on `min_hits` frames with
//! detections (the first included) is *confirmed* and gets the next ID (IDs start at 1 and are
//! never reused, so tracks that never got confirmed leave no gaps). A confirmed track unmatched
//! on a frame with detections is *lost*: it is reported (`predicted: true`, its box the
//! filter's) on up to `report_lost` such frames after its last match (and on every frame
//! without detections in between: the detector did not look), and kept for re-finding until it has gone unmatched for more than
//! `max_age` frames (counted by frame number, so frames dropped upstream count too), or until
//! its predicted box is mostly outside the frame (it left), then dropped for good.
//!
//! Association on a frame with detections (both methods predict every track first):
//! 1. confirmed tracks against the confident detections (`confidence >= high_confidence`);
//! 2. ByteTrack only: the confirmed tracks still unmatched against the less confident
//!    detections (SORT ignores those altogether);
//! 3. tentative tracks against the confident detections still unmatched;
//! 4. confident detections still unmatched start tentative tracks (a less confident one never
//!    starts a track).
//!
//! Every stage keeps pairs whose IoU (of the detection and the track's predicted box) is at
//! least `iou`, and of the same class when `per_class`; see `assign` for the matching itself.
//! With appearance (the colours of each box, `appearance`), a pair whose colours are less alike
//! than `appearance_veto` never matches, a pair's score is its IoU blended with its colours'
//! likeness (`appearance_weight`), and a lost track may match a detection it no longer overlaps
//! when the two look alike (`refind_similarity`) and are close (`refind_distance` box heights,
//! of about its size): an object found again after walking behind another. A track's colours
//! are learnt only from detections that overlap no other (those show parts of two objects).
//! A confirmed track unmatched on a frame with detections keeps its size from then on until it
//! is seen again (`Kalman::hold_size`): only its position is extrapolated. A matched track's
//! reported box is the filter's estimate after the match (`smooth`, as ByteTrack reports it),
//! or else the detection's own. Reported boxes are clipped to the frame when its size is known.

use super::appearance::Colours;
use super::assign::match_by_iou;
use super::kalman::Kalman;
use super::{Method, Settings};
use crate::value::{BBox, Detection, Track};

/// A lost track whose predicted box has less than this share of its area inside the frame has
/// left it: it is dropped instead of being predicted on outside.
const EXIT_SHARE: f32 = 0.5;
/// How much of a track's colours is kept when it is seen again (the rest is the new look).
const KEEP_COLOURS: f32 = 0.9;
/// A detection overlapping another by this IoU or more teaches its track no colours.
const OVERLAP_NO_COLOURS: f32 = 0.3;
/// Sizes (height ratio) within which a lost track may be found again away from its box.
const REFIND_SIZE: std::ops::Range<f32> = 0.7..1.43;

/// One followed object.
#[derive(Debug)]
struct Tracked {
    /// `None` while tentative.
    id: Option<u64>,
    kalman: Kalman,
    /// Frames on which it was matched.
    hits: u32,
    /// Frames with detections on which it went unmatched since its last match.
    misses: u32,
    /// Frame number of its last match.
    last_seen: u64,
    /// Its last matched detection: the class and confidence a predicted track reports.
    last: Detection,
    /// The detection it matched on the current frame.
    now: Option<Detection>,
    /// What it looks like, blended over the frames it was matched on.
    colours: Option<Colours>,
}

/// Every track of one source, and what it needs to hand out IDs and count frames.
#[derive(Debug)]
pub(super) struct Tracks {
    tracks: Vec<Tracked>,
    next_id: u64,
    last_frame: Option<u64>,
}

impl Default for Tracks {
    /// No track yet; the first confirmed one gets ID 1.
    fn default() -> Self {
        Self {
            tracks: Vec::new(),
            next_id: 1,
            last_frame: None,
        }
    }
}

/// What every stage of one frame's association reads: the detections, their colours and
/// which of them overlap no other.
struct Frame<'a> {
    detections: &'a [Detection],
    looks: Option<&'a [Option<Colours>]>,
    clear: Vec<bool>,
}

impl Frame<'_> {
    fn look(&self, d: usize) -> Option<&Colours> {
        self.looks.and_then(|l| l.get(d)).and_then(Option::as_ref)
    }
}

fn centre(b: &BBox) -> [f32; 2] {
    [b.x + b.width / 2.0, b.y + b.height / 2.0]
}

/// The part of `b` inside a `width` x `height` frame.
pub(super) fn clip(b: &BBox, [width, height]: [f32; 2]) -> BBox {
    let x0 = b.x.clamp(0.0, width);
    let y0 = b.y.clamp(0.0, height);
    let x1 = (b.x + b.width).clamp(0.0, width);
    let y1 = (b.y + b.height).clamp(0.0, height);
    BBox {
        x: x0,
        y: y0,
        width: (x1 - x0).max(0.0),
        height: (y1 - y0).max(0.0),
    }
}

/// The share of `b`'s area inside the frame (1 for an empty box).
fn inside_share(b: &BBox, bounds: [f32; 2]) -> f32 {
    let area = b.width * b.height;
    if area <= 0.0 {
        return 1.0;
    }
    let c = clip(b, bounds);
    c.width * c.height / area
}

/// Whether a lost track predicted at `predicted` may be found again at `d`, which it does not
/// overlap enough: near (`refind_distance` box heights between centres) and of about its size.
fn near_enough(settings: &Settings, predicted: &BBox, d: &BBox) -> bool {
    let (pc, dc) = (centre(predicted), centre(d));
    let h = predicted.height.max(d.height).max(1.0);
    let dist = (pc[0] - dc[0]).hypot(pc[1] - dc[1]) / h;
    dist <= settings.refind_distance
        && REFIND_SIZE.contains(&(d.height / predicted.height.max(1.0)))
}

impl Tracks {
    /// Moves the tracks to frame `seq`, matches `detections` (`None`: the detector gave nothing
    /// on this frame, so every track is only predicted) with their colours `looks` (one per
    /// detection, when appearance is on), and returns the confirmed tracks, in ID order, their
    /// boxes inside `bounds` (the frame's width and height) when given.
    pub(super) fn update(
        &mut self,
        settings: &Settings,
        seq: u64,
        detections: Option<&[Detection]>,
        bounds: Option<[f32; 2]>,
        looks: Option<&[Option<Colours>]>,
    ) -> Vec<Track> {
        let max_age = u64::from(settings.max_age);
        // Predicting further than max_age + 1 frames only concerns tracks about to be dropped.
        let steps = self
            .last_frame
            .map_or(0, |last| seq.saturating_sub(last))
            .min(max_age + 1);
        self.last_frame = Some(seq);
        for t in &mut self.tracks {
            t.now = None;
            for _ in 0..steps {
                t.kalman.predict();
            }
        }
        self.tracks.retain(|t| {
            seq.saturating_sub(t.last_seen) <= max_age
                && (t.misses == 0
                    || bounds.is_none_or(|b| inside_share(&t.kalman.bbox(), b) >= EXIT_SHARE))
        });
        if let Some(detections) = detections {
            self.associate(settings, seq, detections, looks);
        }
        let report = u64::from(settings.report_lost);
        let mut out: Vec<Track> = self
            .tracks
            .iter()
            .filter(|t| t.now.is_some() || u64::from(t.misses) <= report)
            .filter_map(|t| {
                let track_id = t.id?;
                let (mut detection, predicted) = match &t.now {
                    Some(d) if settings.smooth => {
                        let mut d = d.clone();
                        d.bbox = t.kalman.bbox();
                        (d, false)
                    }
                    Some(d) => (d.clone(), false),
                    None => (
                        Detection::new(t.last.class.clone(), t.last.confidence, t.kalman.bbox()),
                        true,
                    ),
                };
                if let Some(b) = bounds {
                    detection.bbox = clip(&detection.bbox, b);
                }
                Some(Track::new(track_id, detection, predicted))
            })
            .collect();
        out.sort_by_key(|t| t.track_id);
        out
    }

    /// Whether confirmed track `id` is still kept (reported, or lost and waiting to be found).
    pub(super) fn keeps(&self, id: u64) -> bool {
        self.tracks.iter().any(|t| t.id == Some(id))
    }

    /// Ends every track (the source's frames changed size: boxes of the old size match nothing
    /// in the new picture). Returns the confirmed ones, in ID order, as they were last seen;
    /// IDs go on from where they were, so none is ever reused.
    pub(super) fn end_all(&mut self) -> Vec<Track> {
        let mut ended: Vec<Track> = self
            .tracks
            .drain(..)
            .filter_map(|t| Some(Track::new(t.id?, t.last, false)))
            .collect();
        ended.sort_by_key(|t| t.track_id);
        self.last_frame = None;
        ended
    }

    /// Stages 1 to 4 of the module header.
    fn associate(
        &mut self,
        settings: &Settings,
        seq: u64,
        detections: &[Detection],
        looks: Option<&[Option<Colours>]>,
    ) {
        let clear = (0..detections.len())
            .map(|d| {
                (0..detections.len()).all(|o| {
                    o == d || detections[d].bbox.iou(&detections[o].bbox) < OVERLAP_NO_COLOURS
                })
            })
            .collect();
        let frame = Frame {
            detections,
            looks,
            clear,
        };
        let (mut high, low): (Vec<usize>, Vec<usize>) =
            (0..detections.len()).partition(|&d| detections[d].confidence >= settings.high);
        let (confirmed, tentative): (Vec<usize>, Vec<usize>) =
            (0..self.tracks.len()).partition(|&t| self.tracks[t].id.is_some());
        let unmatched = self.stage(settings, seq, &confirmed, &mut high, &frame);
        if settings.method == Method::ByteTrack {
            let mut low = low;
            self.stage(settings, seq, &unmatched, &mut low, &frame);
        }
        self.stage(settings, seq, &tentative, &mut high, &frame);
        // A tentative track must be seen on every frame with detections until confirmed.
        self.tracks.retain(|t| t.id.is_some() || t.last_seen == seq);
        for t in &mut self.tracks {
            if t.last_seen != seq {
                t.misses += 1;
                t.kalman.hold_size();
            }
        }
        for d in high {
            let detection = &detections[d];
            self.tracks.push(Tracked {
                id: None,
                kalman: Kalman::new(&detection.bbox),
                hits: 1,
                misses: 0,
                last_seen: seq,
                last: detection.clone(),
                now: Some(detection.clone()),
                colours: frame.look(d).cloned(),
            });
        }
        for t in &mut self.tracks {
            if t.id.is_none() && t.hits >= settings.min_hits {
                t.id = Some(self.next_id);
                self.next_id += 1;
            }
        }
    }

    /// How well track `t` fits detection `d`: 0 when they may not match, else at least `iou`
    /// (see the module header).
    fn fit(&self, settings: &Settings, t: usize, d: usize, frame: &Frame<'_>) -> f32 {
        let track = &self.tracks[t];
        let detection = &frame.detections[d];
        if settings.per_class && detection.class != track.last.class {
            return 0.0;
        }
        let predicted = track.kalman.bbox();
        let iou = predicted.iou(&detection.bbox);
        let (Some(mine), Some(seen)) = (&track.colours, frame.look(d)) else {
            return iou;
        };
        let alike = mine.similarity(seen);
        if alike < settings.appearance_veto {
            return 0.0;
        }
        let refound = track.misses > 0
            && alike >= settings.refind_similarity
            && near_enough(settings, &predicted, &detection.bbox);
        if iou < settings.iou && !refound {
            return 0.0;
        }
        let score = (1.0 - settings.appearance_weight) * iou + settings.appearance_weight * alike;
        score.max(settings.iou + 1e-3)
    }

    /// Matches `tracks` (indices) to `free` detections (indices, the matched ones removed) and
    /// updates the matched tracks; returns the tracks left unmatched.
    fn stage(
        &mut self,
        settings: &Settings,
        seq: u64,
        tracks: &[usize],
        free: &mut Vec<usize>,
        frame: &Frame<'_>,
    ) -> Vec<usize> {
        let fit: Vec<Vec<f32>> = tracks
            .iter()
            .map(|&t| {
                free.iter()
                    .map(|&d| self.fit(settings, t, d, frame))
                    .collect()
            })
            .collect();
        let pairs = match_by_iou(&fit, free.len(), settings.iou);
        let mut taken = vec![false; free.len()];
        let mut track_matched = vec![false; tracks.len()];
        for &(r, c) in &pairs {
            let d = free[c];
            let detection = &frame.detections[d];
            let track = &mut self.tracks[tracks[r]];
            track.kalman.update(&detection.bbox);
            track.hits += 1;
            track.misses = 0;
            track.last_seen = seq;
            track.last = detection.clone();
            track.now = Some(detection.clone());
            if let Some(seen) = frame.look(d).filter(|_| frame.clear[d]) {
                match &mut track.colours {
                    Some(mine) => mine.blend(seen, KEEP_COLOURS),
                    None => track.colours = Some(seen.clone()),
                }
            }
            taken[c] = true;
            track_matched[r] = true;
        }
        let mut i = 0;
        free.retain(|_| {
            i += 1;
            !taken[i - 1]
        });
        tracks
            .iter()
            .zip(track_matched)
            .filter(|(_, m)| !m)
            .map(|(&t, _)| t)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::BBox;

    impl Tracks {
        /// One frame without frame size or colours.
        fn step(&mut self, s: &Settings, seq: u64, d: Option<&[Detection]>) -> Vec<Track> {
            self.update(s, seq, d, None, None)
        }
    }

    fn det(x: f32, y: f32, confidence: f32) -> Detection {
        Detection::new(
            "thing".into(),
            confidence,
            BBox {
                x,
                y,
                width: 20.0,
                height: 20.0,
            },
        )
    }

    fn one(d: &Detection) -> Option<&[Detection]> {
        Some(std::slice::from_ref(d))
    }

    /// The settings these tests were written for: confirmed after 3 frames, kept and
    /// reported as predicted for 30, no appearance (no colours are given anyway).
    fn settings() -> Settings {
        Settings {
            min_hits: 3,
            max_age: 30,
            report_lost: 30,
            ..Settings::default()
        }
    }

    /// The ID of the matched (not predicted) track whose box overlaps `d`'s most, at IoU 0.5
    /// or more (a smoothed box is near its detection, not on it), if one does.
    fn id_of(tracks: &[Track], d: &Detection) -> Option<u64> {
        tracks
            .iter()
            .filter(|t| !t.predicted)
            .map(|t| (t.detection.bbox.iou(&d.bbox), t.track_id))
            .filter(|&(iou, _)| iou >= 0.5)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, id)| id)
    }

    #[test]
    fn a_smoothed_box_jitters_less_than_its_detections_and_an_unsmoothed_one_is_theirs() {
        // A still object whose detected box jumps 4 px left and right, frame by frame.
        let jitter = |f: u64| det(if f.is_multiple_of(2) { 96.0 } else { 104.0 }, 100.0, 0.9);
        let spread = |smooth: bool| {
            let s = Settings {
                smooth,
                ..settings()
            };
            let mut tracks = Tracks::default();
            let xs: Vec<f32> = (0..40u64)
                .filter_map(|f| {
                    let d = jitter(f);
                    let out = tracks.step(&s, f, one(&d));
                    if !smooth && f >= 2 {
                        assert_eq!(out[0].detection.bbox, d.bbox, "frame {f}");
                    }
                    out.first().map(|t| t.detection.bbox.x).filter(|_| f >= 20)
                })
                .collect();
            xs.iter().copied().fold(f32::MIN, f32::max)
                - xs.iter().copied().fold(f32::MAX, f32::min)
        };
        assert_eq!(spread(false), 8.0);
        let smoothed = spread(true);
        assert!(smoothed < 4.0, "the smoothed box still moves {smoothed} px");
    }

    #[test]
    fn two_objects_crossing_paths_keep_their_ids() {
        let s = settings();
        let mut tracks = Tracks::default();
        let (mut id_a, mut id_b) = (None, None);
        for f in 0..40u64 {
            // Head on, 6 px a frame each, overlapping from frame 15 to 24.
            let a = det(6.0 * f as f32, 100.0, 0.9);
            let b = det(234.0 - 6.0 * f as f32, 106.0, 0.9);
            let out = tracks.step(&s, f, Some(&[b.clone(), a.clone()]));
            if f < 2 {
                assert!(out.is_empty(), "frame {f}: {out:?}");
                continue;
            }
            assert_eq!(out.len(), 2, "frame {f}: {out:?}");
            let (now_a, now_b) = (id_of(&out, &a), id_of(&out, &b));
            assert!(now_a.is_some() && now_b.is_some(), "frame {f}: {out:?}");
            assert_eq!(*id_a.get_or_insert(now_a), now_a, "frame {f}");
            assert_eq!(*id_b.get_or_insert(now_b), now_b, "frame {f}");
        }
        assert_ne!(id_a, id_b);
    }

    #[test]
    fn an_object_missing_for_less_than_max_age_keeps_its_id_and_is_predicted_meanwhile() {
        let s = settings();
        let mut tracks = Tracks::default();
        let at = |f: u64| det(3.0 * f as f32, 50.0, 0.9);
        for f in 0..20 {
            tracks.step(&s, f, Some(&[at(f)]));
        }
        let id = id_of(&tracks.step(&s, 20, Some(&[at(20)])), &at(20)).unwrap();
        for f in 21..50 {
            let out = tracks.step(&s, f, Some(&[]));
            assert_eq!(out.len(), 1, "frame {f}");
            assert!(out[0].predicted, "frame {f}");
            assert_eq!(out[0].track_id, id);
            // Predicted along its path (3 px a frame), not left where it was last seen.
            let x = out[0].detection.bbox.x;
            assert!((x - 3.0 * f as f32).abs() < 5.0, "frame {f}: x {x}");
        }
        // 29 frames unseen (< max_age 30), then back where its path leads.
        let out = tracks.step(&s, 50, Some(&[at(50)]));
        assert_eq!(id_of(&out, &at(50)), Some(id));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn an_object_missing_for_longer_than_max_age_is_dropped_and_comes_back_with_a_new_id() {
        let s = Settings {
            max_age: 5,
            min_hits: 1,
            ..settings()
        };
        let mut tracks = Tracks::default();
        let still = det(100.0, 100.0, 0.9);
        for f in 0..5 {
            assert_eq!(id_of(&tracks.step(&s, f, one(&still)), &still), Some(1));
        }
        // Last seen on frame 4: predicted on frames 5 to 9 (max_age 5), gone from frame 10.
        for f in 5..=9 {
            let out = tracks.step(&s, f, Some(&[]));
            assert!(out.len() == 1 && out[0].predicted, "frame {f}: {out:?}");
        }
        assert!(tracks.step(&s, 10, Some(&[])).is_empty());
        let out = tracks.step(&s, 11, one(&still));
        assert_eq!(id_of(&out, &still), Some(2));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn a_track_is_reported_after_min_hits_and_a_flicker_takes_no_id() {
        let s = settings();
        let mut tracks = Tracks::default();
        // Seen on two frames, missed on the third: never reported.
        let flicker = det(200.0, 0.0, 0.9);
        assert!(tracks.step(&s, 0, one(&flicker)).is_empty());
        assert!(tracks.step(&s, 1, one(&flicker)).is_empty());
        assert!(tracks.step(&s, 2, Some(&[])).is_empty());
        // Frames without detections neither count nor break the run.
        let thing = det(0.0, 0.0, 0.9);
        assert!(tracks.step(&s, 3, one(&thing)).is_empty());
        assert!(tracks.step(&s, 4, None).is_empty());
        assert!(tracks.step(&s, 5, one(&thing)).is_empty());
        let out = tracks.step(&s, 6, one(&thing));
        assert_eq!(id_of(&out, &thing), Some(1));
        let at_once = Settings {
            min_hits: 1,
            ..settings()
        };
        let mut tracks = Tracks::default();
        assert_eq!(
            id_of(&tracks.step(&at_once, 0, one(&thing)), &thing),
            Some(1)
        );
    }

    /// Reported tracks on a frame where the object is detected with low confidence, after
    /// frames of confident detections.
    fn low_confidence_frames(method: Method) -> Vec<Vec<Track>> {
        let s = Settings {
            method,
            ..settings()
        };
        let mut tracks = Tracks::default();
        let at = |f: u64, c: f32| det(4.0 * f as f32, 10.0, c);
        for f in 0..6 {
            tracks.step(&s, f, Some(&[at(f, 0.9)]));
        }
        (6..9)
            .map(|f| tracks.step(&s, f, Some(&[at(f, 0.2)])))
            .collect()
    }

    #[test]
    fn bytetrack_keeps_a_track_on_low_confidence_detections_that_sort_ignores() {
        for out in low_confidence_frames(Method::ByteTrack) {
            assert_eq!(out.len(), 1);
            assert!(!out[0].predicted, "{out:?}");
            assert_eq!(out[0].detection.confidence, 0.2);
            assert_eq!(out[0].track_id, 1);
        }
        for out in low_confidence_frames(Method::Sort) {
            assert_eq!(out.len(), 1);
            assert!(out[0].predicted, "{out:?}");
            assert_eq!(out[0].track_id, 1);
        }
    }

    #[test]
    fn a_low_confidence_detection_never_starts_a_track() {
        let s = Settings {
            min_hits: 1,
            ..settings()
        };
        let mut tracks = Tracks::default();
        for f in 0..5 {
            assert!(tracks.step(&s, f, Some(&[det(0.0, 0.0, 0.3)])).is_empty());
        }
    }

    #[test]
    fn a_gap_in_frame_numbers_is_predicted_across() {
        let s = settings();
        let mut tracks = Tracks::default();
        // 5 px a frame; a 20 px box seen again 8 frames later is 40 px further: no overlap with
        // where it was, full overlap with where it went.
        let at = |f: u64| det(5.0 * f as f32, 0.0, 0.9);
        for f in 0..10 {
            tracks.step(&s, f, Some(&[at(f)]));
        }
        let out = tracks.step(&s, 17, Some(&[at(17)]));
        assert_eq!(id_of(&out, &at(17)), Some(1), "{out:?}");
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn frames_without_detections_only_predict() {
        let s = settings();
        let mut tracks = Tracks::default();
        let at = |f: u64| det(2.0 * f as f32, 0.0, 0.9);
        // The detector runs on even frames only.
        for f in 0..20 {
            let out = tracks.step(
                &s,
                f,
                (f % 2 == 0).then(|| [at(f)]).as_ref().map(|d| &d[..]),
            );
            if f < 4 {
                assert!(out.is_empty(), "frame {f}: {out:?}");
                continue;
            }
            assert_eq!(out.len(), 1, "frame {f}");
            assert_eq!(out[0].track_id, 1);
            assert_eq!(out[0].predicted, f % 2 == 1, "frame {f}");
        }
    }

    #[test]
    fn per_class_keeps_classes_apart() {
        let mut tracks = Tracks::default();
        let s = Settings {
            min_hits: 1,
            ..settings()
        };
        let mut other = det(0.0, 0.0, 0.9);
        other.class = "other".into();
        tracks.step(&s, 0, Some(&[det(0.0, 0.0, 0.9)]));
        let out = tracks.step(&s, 1, one(&other));
        assert_eq!(id_of(&out, &other), Some(2), "{out:?}");
        let s = Settings {
            per_class: false,
            ..s
        };
        let mut tracks = Tracks::default();
        tracks.step(&s, 0, Some(&[det(0.0, 0.0, 0.9)]));
        let out = tracks.step(&s, 1, one(&other));
        assert_eq!(id_of(&out, &other), Some(1), "{out:?}");
        assert_eq!(out.len(), 1);
    }
}
