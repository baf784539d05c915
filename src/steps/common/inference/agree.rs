//! What `auto` calls agreeing with full precision: an f32 engine gives the reference engine's
//! outputs, value for value; a reduced precision finds the same boxes on the check image, and
//! the tracker follows the same objects with the same IDs on the check clip. No value that is
//! not a number agrees with anything.

use std::collections::{BTreeMap, BTreeSet};

use super::Tensor;
use crate::value::{BBox, Track};

/// Largest difference allowed between two f32 engines' outputs, relative to 1 + |value|.
pub(super) const F32_TOLERANCE: f32 = 1e-3;
/// Share of the full-precision boxes a reduced precision must find (and of its boxes that must
/// be full precision's), at IoU 0.5, on the check image.
pub(super) const MIN_AGREEMENT: f64 = 0.95;
/// Least identity agreement (IDF1 of a reduced precision's tracks against f32's, below) on the
/// check clip. 0.98: a reduced precision whose boxes move by a pixel here and there keeps every
/// ID (IDF1 above 0.99 on the shipped clips); one ID switch, or a track started or ended a few
/// frames off, costs more than 2% on a clip of 40 frames with a dozen people.
pub(super) const MIN_TRACK_AGREEMENT: f64 = 0.98;
/// Boxes of two engines on one frame are the same object's at this overlap.
const SAME_OBJECT_IOU: f32 = 0.5;

/// Outputs in which every value is a number (not NaN, not infinite): what a network gives.
pub(super) fn finite(outputs: &[Tensor]) -> Result<(), String> {
    let bad = outputs
        .iter()
        .flat_map(|t| &t.data)
        .filter(|v| !v.is_finite())
        .count();
    match bad {
        0 => Ok(()),
        n => Err(format!(
            "{n} output values are not numbers (NaN or infinite)"
        )),
    }
}

/// A shape without a leading batch of 1: OpenCV leaves it out (`[300, 85]`) where the runtimes
/// keep it (`[1, 300, 85]`); the values are the same.
pub(super) fn unbatched(shape: &[usize]) -> &[usize] {
    match shape.split_first() {
        Some((1, rest)) if rest.len() >= 2 => rest,
        _ => shape,
    }
}

/// Two f32 engines agree: outputs of the same shapes (but for a leading batch of 1, see
/// [`unbatched`]), each value within [`F32_TOLERANCE`] of 1 + |reference|. A NaN anywhere
/// disagrees.
pub(super) fn outputs_agree(reference: &[Tensor], other: &[Tensor]) -> Result<(), String> {
    if reference.len() != other.len() {
        return Err(format!(
            "{} outputs against {}",
            other.len(),
            reference.len()
        ));
    }
    let mut worst = 0.0_f32;
    for (r, o) in reference.iter().zip(other) {
        if unbatched(&r.shape) != unbatched(&o.shape) || r.data.len() != o.data.len() {
            return Err(format!(
                "an output of shape {:?} against {:?}",
                o.shape, r.shape
            ));
        }
        for (a, b) in r.data.iter().zip(&o.data) {
            let d = (a - b).abs() / (1.0 + a.abs());
            // f32::max would pass over a NaN.
            if d.is_nan() {
                return Err("outputs are not numbers (NaN)".to_owned());
            }
            worst = worst.max(d);
        }
    }
    if worst <= F32_TOLERANCE {
        Ok(())
    } else {
        Err(format!("outputs differ by up to {worst:.2e}"))
    }
}

/// Share of `a`'s boxes that some box of `b` overlaps at IoU 0.5 or more.
pub(super) fn recall(a: &[BBox], b: &[BBox]) -> f64 {
    if a.is_empty() {
        return 1.0;
    }
    let found = a
        .iter()
        .filter(|x| b.iter().any(|y| x.iou(y) >= SAME_OBJECT_IOU))
        .count();
    found as f64 / a.len() as f64
}

/// A reduced precision agrees on the check image: it finds [`MIN_AGREEMENT`] of full
/// precision's boxes and adds few of its own, where full precision finds some.
pub(super) fn boxes_agree(full: &[BBox], reduced: &[BBox]) -> Result<(), String> {
    if full.is_empty() {
        return Err("not judged: f32 finds nothing on the check image".to_owned());
    }
    let (found, precise) = (recall(full, reduced), recall(reduced, full));
    if found >= MIN_AGREEMENT && precise >= MIN_AGREEMENT {
        Ok(())
    } else {
        Err(format!(
            "finds {:.0}% of f32's {} boxes, {:.0}% of its {} are f32's",
            found * 100.0,
            full.len(),
            precise * 100.0,
            reduced.len()
        ))
    }
}

/// How a reduced precision's tracks on the check clip compare with f32's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct TrackAgreement {
    /// Track IDs f32 gave, and the reduced precision.
    pub(super) ids: (usize, usize),
    /// IDF1 of the reduced precision's tracks against f32's (below).
    pub(super) idf1: f64,
}

impl std::fmt::Display for TrackAgreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tracks against f32's {} and IDF1 {:.3} on the check clip",
            self.ids.1, self.ids.0, self.idf1
        )
    }
}

/// The identity agreement of `other`'s tracks with `reference`'s, frame by frame (the tracks
/// of each frame of one clip): boxes of the two on a frame are paired one to one, best overlap
/// first, at IoU 0.5; each reference ID is then given the other ID it was paired with on most
/// frames (one to one, most frames first); IDF1 = 2 x frames paired with the given ID / (boxes
/// of both). 1 when the two follow the same objects with the same IDs on every frame; an ID
/// switch, a track lost or started late, or a track of its own lowers it.
pub(super) fn track_agreement(reference: &[Vec<Track>], other: &[Vec<Track>]) -> TrackAgreement {
    let mut together: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    for (r, o) in reference.iter().zip(other) {
        let mut pairs: Vec<(f32, usize, usize)> = Vec::new();
        for (i, a) in r.iter().enumerate() {
            for (j, b) in o.iter().enumerate() {
                let iou = a.detection.bbox.iou(&b.detection.bbox);
                if iou >= SAME_OBJECT_IOU {
                    pairs.push((iou, i, j));
                }
            }
        }
        pairs.sort_by(|x, y| y.0.total_cmp(&x.0).then((x.1, x.2).cmp(&(y.1, y.2))));
        let (mut used_r, mut used_o) = (BTreeSet::new(), BTreeSet::new());
        for (_, i, j) in pairs {
            if !used_r.contains(&i) && !used_o.contains(&j) {
                used_r.insert(i);
                used_o.insert(j);
                *together.entry((r[i].track_id, o[j].track_id)).or_default() += 1;
            }
        }
    }
    let mut by_count: Vec<((u64, u64), usize)> = together.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let (mut given_r, mut given_o, mut paired) = (BTreeSet::new(), BTreeSet::new(), 0);
    for ((r, o), n) in by_count {
        if !given_r.contains(&r) && !given_o.contains(&o) {
            given_r.insert(r);
            given_o.insert(o);
            paired += n;
        }
    }
    let boxes = |tracks: &[Vec<Track>]| tracks.iter().map(Vec::len).sum::<usize>();
    let ids = |tracks: &[Vec<Track>]| {
        tracks
            .iter()
            .flatten()
            .map(|t| t.track_id)
            .collect::<BTreeSet<_>>()
            .len()
    };
    let total = boxes(reference) + boxes(other);
    TrackAgreement {
        ids: (ids(reference), ids(other)),
        idf1: if total == 0 {
            1.0
        } else {
            2.0 * paired as f64 / total as f64
        },
    }
}

/// A reduced precision keeps f32's tracks on the check clip: as many IDs, and an IDF1 of at
/// least [`MIN_TRACK_AGREEMENT`], where f32 follows something.
pub(super) fn tracks_agree(
    reference: &[Vec<Track>],
    other: &[Vec<Track>],
) -> Result<TrackAgreement, String> {
    let agreement = track_agreement(reference, other);
    if agreement.ids.0 == 0 {
        return Err("not judged: f32 follows nothing on the check clip".to_owned());
    }
    if agreement.ids.0 == agreement.ids.1 && agreement.idf1 >= MIN_TRACK_AGREEMENT {
        Ok(agreement)
    } else {
        Err(format!(
            "{agreement} (IDF1 at least {MIN_TRACK_AGREEMENT} with as many tracks)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Detection;

    fn tensor(data: &[f32]) -> Tensor {
        Tensor {
            shape: vec![data.len()],
            data: data.to_vec(),
        }
    }

    #[test]
    fn f32_outputs_agree_within_the_tolerance_only() {
        let r = [tensor(&[0.5, 10.0])];
        assert!(outputs_agree(&r, &[tensor(&[0.5005, 10.005])]).is_ok());
        let e = outputs_agree(&r, &[tensor(&[0.51, 10.0])]).unwrap_err();
        assert!(e.contains("differ by up to"), "{e}");
        assert!(outputs_agree(&r, &[tensor(&[0.5])]).is_err());
        assert!(outputs_agree(&r, &[]).is_err());
        // The same values in another shape: not the same output.
        let reshaped = Tensor {
            shape: vec![2, 1],
            data: vec![0.5, 10.0],
        };
        assert!(outputs_agree(&r, &[reshaped]).is_err());
        // OpenCV's [rows, 85] and a runtime's [1, rows, 85]: the same output (yolov3-tiny's
        // ONNX engines disagreed with OpenCV for it, so auto never took them).
        let rows = |shape: Vec<usize>| Tensor {
            shape,
            data: vec![0.5; 6],
        };
        assert!(outputs_agree(&[rows(vec![2, 3])], &[rows(vec![1, 2, 3])]).is_ok());
        assert!(outputs_agree(&[rows(vec![1, 2, 3])], &[rows(vec![2, 3])]).is_ok());
        assert!(outputs_agree(&[rows(vec![2, 3])], &[rows(vec![1, 3, 2])]).is_err());
        assert!(outputs_agree(&[rows(vec![6])], &[rows(vec![1, 6])]).is_err());
    }

    #[test]
    fn a_nan_agrees_with_nothing() {
        let r = [tensor(&[0.5, 10.0, 3.0])];
        for at in 0..3 {
            let mut values = vec![0.5, 10.0, 3.0];
            values[at] = f32::NAN;
            let e = outputs_agree(&r, &[tensor(&values)]).unwrap_err();
            assert!(e.contains("NaN"), "{at}: {e}");
            // Nor as the reference.
            assert!(outputs_agree(&[tensor(&values)], &r).is_err(), "{at}");
            assert!(finite(&[tensor(&values)]).is_err());
        }
        assert!(finite(&[tensor(&[1.0, f32::INFINITY])]).is_err());
        assert!(finite(&r).is_ok());
    }

    fn bbox(x: f32) -> BBox {
        BBox {
            x,
            y: 0.0,
            width: 10.0,
            height: 10.0,
        }
    }

    #[test]
    fn a_reduced_precision_must_find_the_same_boxes_both_ways() {
        let full: Vec<BBox> = (0..20).map(|i| bbox(i as f32 * 20.0)).collect();
        let shifted: Vec<BBox> = full.iter().map(|b| bbox(b.x + 1.0)).collect();
        assert!(boxes_agree(&full, &shifted).is_ok());
        // One of 20 missed: 95%, still agrees; two: not.
        assert!(boxes_agree(&full, &shifted[1..]).is_ok());
        assert!(boxes_agree(&full, &shifted[2..]).is_err());
        // Two boxes of its own among 20: 90% precise.
        let mut extra = shifted.clone();
        extra.extend([bbox(1000.0), bbox(2000.0)]);
        assert!(boxes_agree(&full, &extra).is_err());
        assert!(boxes_agree(&[], &shifted).is_err());
    }

    fn track(id: u64, x: f32) -> Track {
        Track {
            track_id: id,
            detection: Detection::new("person".into(), 0.9, bbox(x)),
            predicted: false,
            ground: None,
            speed: None,
            dwell: None,
        }
    }

    /// Two objects, at x = 0 and x = 100, for `frames` frames, with IDs `a` and `b`.
    fn two(frames: usize, a: u64, b: u64) -> Vec<Vec<Track>> {
        (0..frames)
            .map(|_| vec![track(a, 0.0), track(b, 100.0)])
            .collect()
    }

    #[test]
    fn tracks_agree_when_they_follow_the_same_objects_whatever_the_ids_are_called() {
        let reference = two(40, 1, 2);
        // Other numbers, and boxes a pixel off: the same tracks.
        let mut other = two(40, 7, 9);
        for frame in &mut other {
            frame[0].detection.bbox.x += 1.0;
        }
        let a = tracks_agree(&reference, &other).unwrap();
        assert_eq!((a.ids, a.idf1), ((2, 2), 1.0));
    }

    #[test]
    fn an_id_switch_a_late_track_or_one_of_its_own_disagrees() {
        let reference = two(40, 1, 2);
        // The two swap IDs half way: 2 IDs each still, but identities agree on half the frames.
        let mut switched = two(20, 1, 2);
        switched.extend(two(20, 2, 1));
        let e = tracks_agree(&reference, &switched).unwrap_err();
        assert!(e.contains("IDF1 0.500"), "{e}");
        // The second object followed from frame 4 on: 76 of 80 boxes, IDF1 0.974.
        let mut late = two(40, 1, 2);
        for frame in &mut late[..4] {
            frame.pop();
        }
        assert!(tracks_agree(&reference, &late).is_err());
        // One frame late: 0.987, agrees.
        let mut one_late = two(40, 1, 2);
        one_late[0].pop();
        assert!(tracks_agree(&reference, &one_late).is_ok());
        // A third track of its own for 1 frame: as many IDs no more.
        let mut extra = two(40, 1, 2);
        extra[10].push(track(3, 300.0));
        let e = tracks_agree(&reference, &extra).unwrap_err();
        assert!(e.contains("3 tracks against f32's 2"), "{e}");
        // Nothing followed by f32: not judged.
        let e = tracks_agree(&[vec![]], &[vec![]]).unwrap_err();
        assert!(e.contains("not judged"), "{e}");
    }
}
