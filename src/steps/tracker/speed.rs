//! Where each track stands on the ground and how fast it moves, from the places it was seen at.
//!
//! A track's place is where it touches the ground: its reported box's bottom centre, on a
//! source with a ground calibration that point on the ground in metres (`Track::ground`), else
//! the pixel. A box whose bottom is hidden (a person behind a bench, a sign, another person)
//! is shorter than the track's boxes were and has kept its top: its bottom is then the top plus
//! the track's usual height (the median of its last [`HEIGHTS_KEPT_S`] seconds of whole boxes),
//! not the edge of what hides it, which the perspective would put metres away. Each frame on
//! which a track is seen (not predicted) adds its place, at the frame's stream time, to its
//! history; its speed is the magnitude of the velocity of the places of the last
//! `speed_window_s` seconds, in km/h on the ground or pixels a second in the picture, never
//! mixed. The velocity is Theil and Sen's: on each axis the median of the slopes between pairs
//! of places at least a quarter of the window apart, so a few places off the path (a box that
//! jumped for a frame) move it little where a least-squares line would follow them. A fit over
//! a few frames makes a speed of one jittery box, so none is given until the places span at
//! least half the window. A predicted track keeps the speed of the places it was seen at
//! within the window, and none once they are older. Histories of tracks the tracker dropped
//! are forgotten on the next frame.
//!
//! Measured on PETS09-S2L1 with the demo's detector (scripts/bench-analytics): with the bottom
//! edge and least squares, 8 walkers were reported faster than 9 km/h for a moment (the one
//! runner of the ground truth among them), each at a frame where their feet were hidden.

use std::collections::{HashMap, VecDeque};

use crate::frame::{Frame, Ground};
use crate::value::{Speed, Track};

/// Metres a second to kilometres an hour.
const MS_TO_KMH: f64 = 3.6;

/// One place of a track: stream time (seconds) and position (metres or pixels).
type Sample = (f64, [f64; 2]);

/// Seconds of a track's whole boxes whose median height is its usual height.
const HEIGHTS_KEPT_S: f64 = 3.0;
/// A box shorter than this share of the track's usual height has part of it hidden.
const HIDDEN_SHARE: f32 = 0.8;
/// A box taller than this many times the track's usual height, its feet not hidden before, is
/// no longer the same object's alone (the tracker's box went over to someone nearer the
/// camera, or took in two people): its places start again. A person's box grows by a few
/// percent a frame walking towards the camera; on TUD-Stadtmitte an identity switch doubled it
/// in three frames and made a speed of 25 km/h out of a walk.
const SWITCH_SHARE: f32 = 1.35;
/// A speed is given only when the places lie near enough to a line: the standard error of its
/// slope, from the places' robust spread about it ([`spread`]), at most this share of the
/// speed or the floor below, whichever is larger. Far from the camera, at a grazing angle, a
/// pixel of a box's bottom is tens of centimetres of ground: a track at the picture's edge on
/// TUD-Stadtmitte, its boxes cut by it, jumped between places 2 m apart and made 34 km/h of a
/// walk. Such a track has no speed until its places settle.
const UNSURE_SHARE: f64 = 0.25;
/// The floor of the slope's standard error on the ground (m/s) and in the picture (px/s): a
/// still object's speed is near 0, its error need not be a share of it.
const UNSURE_FLOOR_M_S: f64 = 0.3;
const UNSURE_FLOOR_PX_S: f64 = 10.0;

/// The most places a velocity is fitted to (evenly picked): the pairs grow as their square.
const MOST_PLACES: usize = 32;

/// What one track's boxes tell of where its feet are.
#[derive(Debug, Default)]
struct Feet {
    /// Heights of its whole boxes, with their times, oldest first.
    heights: VecDeque<(f64, f32)>,
    /// The last seen box's top and bottom.
    last: Option<(f32, f32)>,
    /// Its bottom is hidden now (kept while the box stays short).
    hidden: bool,
}

impl Feet {
    /// The y of the feet of `b`, seen at `t`, and remembers the box; and whether the box is
    /// no longer the same object's (see [`SWITCH_SHARE`]): then its history starts again.
    fn of(&mut self, b: &crate::value::BBox, t: f64) -> (f32, bool) {
        let (top, bottom) = (b.y, b.y + b.height);
        let mut usual = median(self.heights.iter().map(|(_, h)| *h));
        let grew = !self.hidden && usual.is_some_and(|u| b.height > SWITCH_SHARE * u);
        if grew {
            *self = Self::default();
            usual = None;
        }
        let short = usual.is_some_and(|u| b.height < HIDDEN_SHARE * u);
        if !short {
            self.hidden = false;
        } else if let Some((last_top, last_bottom)) = self.last
            && !self.hidden
        {
            // It just became short: hidden below if its bottom moved more than its top.
            self.hidden = (bottom - last_bottom).abs() > (top - last_top).abs();
        }
        self.last = Some((top, bottom));
        if !short {
            self.heights.push_back((t, b.height));
            while self
                .heights
                .front()
                .is_some_and(|&(at, _)| at < t - HEIGHTS_KEPT_S)
            {
                self.heights.pop_front();
            }
        }
        let feet = match usual {
            Some(u) if self.hidden => top + u,
            _ => bottom,
        };
        (feet, grew)
    }
}

/// The median of `values` (the upper one of an even count), `None` for none.
fn median(values: impl Iterator<Item = f32>) -> Option<f32> {
    let mut all: Vec<f32> = values.collect();
    all.sort_by(f32::total_cmp);
    all.get(all.len() / 2).copied()
}

/// The places each track of one source was seen at within the window.
#[derive(Debug, Default)]
pub(super) struct Speeds {
    /// Track ID to its places, oldest first.
    seen: HashMap<u64, VecDeque<Sample>>,
    /// Track ID to what its boxes tell of its feet.
    feet: HashMap<u64, Feet>,
    /// Whether the places are metres on the ground (else pixels); a change forgets them all.
    calibrated: bool,
}

impl Speeds {
    /// Sets `ground` and `speed` of the `tracks` the tracker reports on `frame`, after adding
    /// the places of those seen on it to their histories. `live` says which track IDs the
    /// tracker still keeps (the others' histories are forgotten).
    pub(super) fn measure(
        &mut self,
        tracks: &mut [Track],
        frame: &Frame,
        window_s: f64,
        live: impl Fn(u64) -> bool,
    ) {
        let size = (frame.width(), frame.height());
        let at = (frame.ground.as_deref(), size, frame.stream_time_s());
        self.measure_at(tracks, at, window_s, live);
    }

    /// [`Self::measure`] on a frame of `size` with this calibration, at time `now` (seconds).
    pub(super) fn measure_at(
        &mut self,
        tracks: &mut [Track],
        (ground, size, now): (Option<&Ground>, (i32, i32), f64),
        window_s: f64,
        live: impl Fn(u64) -> bool,
    ) {
        let calibrated = ground.is_some();
        if calibrated != self.calibrated {
            self.seen.clear();
            self.calibrated = calibrated;
        }
        self.seen.retain(|id, _| live(*id));
        self.feet.retain(|id, _| live(*id));
        for t in tracks {
            let b = &t.detection.bbox;
            let mut anchor = b.anchor();
            if !t.predicted {
                let (feet, switched) = self.feet.entry(t.track_id).or_default().of(b, now);
                anchor[1] = feet;
                if switched {
                    self.seen.remove(&t.track_id);
                }
            }
            let place = match ground {
                Some(g) => g.to_ground(anchor, size),
                None => Some([f64::from(anchor[0]), f64::from(anchor[1])]),
            };
            if calibrated {
                t.ground = place.map(|[x, y]| [x as f32, y as f32]);
            }
            if let (false, Some(place)) = (t.predicted, place) {
                self.observe(t.track_id, now, place, window_s);
            }
            t.speed = self.speed(t.track_id, now, window_s).map(|v| {
                if calibrated {
                    Speed::Kmh((v * MS_TO_KMH) as f32)
                } else {
                    Speed::PxPerS(v as f32)
                }
            });
        }
    }

    /// Adds track `id`'s place at time `t`, and forgets places older than the window.
    fn observe(&mut self, id: u64, t: f64, place: [f64; 2], window_s: f64) {
        let history = self.seen.entry(id).or_default();
        // Time that went back (a file that loops, a stream that started over) starts afresh.
        if history.back().is_some_and(|&(last, _)| t <= last) {
            history.clear();
        }
        history.push_back((t, place));
        while history
            .front()
            .is_some_and(|&(first, _)| first < t - window_s)
        {
            history.pop_front();
        }
    }

    /// Track `id`'s speed at time `now` (units a second), from its places within the window,
    /// once they span at least half of it.
    fn speed(&self, id: u64, now: f64, window_s: f64) -> Option<f64> {
        let history = self.seen.get(&id)?;
        let from = history.partition_point(|&(t, _)| t < now - window_s);
        let samples = history.range(from..);
        let first = samples.clone().next()?.0;
        let last = samples.clone().next_back()?.0;
        if last - first < window_s / 2.0 {
            return None;
        }
        let v = velocity(samples.clone())?;
        let speed = v[0].hypot(v[1]);
        let floor = if self.calibrated {
            UNSURE_FLOOR_M_S
        } else {
            UNSURE_FLOOR_PX_S
        };
        (spread(samples, v)? <= floor.max(UNSURE_SHARE * speed)).then_some(speed)
    }

    /// Forgets every history (the source's tracks ended).
    pub(super) fn clear(&mut self) {
        self.seen.clear();
        self.feet.clear();
    }
}

/// The Theil-Sen velocity of places over time: on each axis, the median of the slopes between
/// pairs of places at least a quarter of their time span apart (at most [`MOST_PLACES`] places,
/// evenly picked). `None` for no such pair.
fn velocity<'a>(samples: impl Iterator<Item = &'a Sample> + Clone) -> Option<[f64; 2]> {
    let all: Vec<&Sample> = samples.collect();
    let step = all.len().div_ceil(MOST_PLACES).max(1);
    let picked: Vec<&Sample> = all.iter().step_by(step).copied().collect();
    let span = picked.last()?.0 - picked.first()?.0;
    let gap = span / 4.0;
    let (mut vx, mut vy) = (Vec::new(), Vec::new());
    for (i, (ti, pi)) in picked.iter().map(|s| (s.0, s.1)).enumerate() {
        for (tj, pj) in picked[i + 1..].iter().map(|s| (s.0, s.1)) {
            let dt = tj - ti;
            if dt > 0.0 && dt >= gap {
                vx.push((pj[0] - pi[0]) / dt);
                vy.push((pj[1] - pi[1]) / dt);
            }
        }
    }
    let mid = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        (n > 0).then(|| {
            if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            }
        })
    };
    Some([mid(&mut vx)?, mid(&mut vy)?])
}

/// The standard error of the slope `v` of `samples` (units a second), from their robust
/// spread about the line of slope `v` through their medians (1.4826 times the median distance:
/// the standard deviation for normal noise, unmoved by a few places off the line); `None` for
/// fewer than three places.
fn spread<'a>(samples: impl Iterator<Item = &'a Sample> + Clone, v: [f64; 2]) -> Option<f64> {
    let n = samples.clone().count();
    if n < 3 {
        return None;
    }
    let mid = |mut all: Vec<f64>| {
        all.sort_by(f64::total_cmp);
        all[all.len() / 2]
    };
    let b = [0, 1].map(|k| mid(samples.clone().map(|(t, p)| p[k] - v[k] * t).collect()));
    let off: Vec<f64> = samples
        .clone()
        .map(|(t, p)| (p[0] - b[0] - v[0] * t).hypot(p[1] - b[1] - v[1] * t))
        .collect();
    let sigma = 1.4826 * mid(off);
    let mean_t = samples.clone().map(|(t, _)| t).sum::<f64>() / n as f64;
    let stt: f64 = samples.map(|(t, _)| (t - mean_t).powi(2)).sum();
    (stt > 0.0).then(|| sigma / stt.sqrt())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use opencv::core::{CV_8UC1, Mat, Scalar};

    use super::*;
    use crate::value::{BBox, Detection};

    const WINDOW: f64 = 1.0;
    const FPS: f64 = 25.0;

    /// Feeds places `at(frame)` to track 1 on frames `0..frames` at 25 a second; its speed
    /// after each.
    fn follow(frames: u32, at: impl Fn(u32) -> [f64; 2]) -> Vec<Option<f64>> {
        let mut speeds = Speeds::default();
        (0..frames)
            .map(|f| {
                let t = f64::from(f) / FPS;
                speeds.observe(1, t, at(f), WINDOW);
                speeds.speed(1, t, WINDOW)
            })
            .collect()
    }

    #[test]
    fn a_steady_motion_gives_its_speed_exactly() {
        // 3 m/s along a diagonal: 1.8 and 2.4 m/s on the axes.
        let got = follow(100, |f| {
            let t = f64::from(f) / FPS;
            [10.0 + 1.8 * t, -4.0 + 2.4 * t]
        });
        for v in got.iter().flatten() {
            assert!((v - 3.0).abs() < 1e-9, "{v}");
        }
        assert!(got[99].is_some());
    }

    #[test]
    fn no_speed_before_the_places_span_half_a_window() {
        let got = follow(40, |f| [f64::from(f), 0.0]);
        // Half of 1 s at 25 a second is frame 12.5 after the first: frame 13 is the first.
        assert!(got[..13].iter().all(Option::is_none), "{got:?}");
        assert!(got[13..].iter().all(Option::is_some), "{got:?}");
    }

    #[test]
    fn a_still_object_with_jittery_boxes_moves_slowly() {
        // +-3 pixels of jitter (a pseudo-random walk of signs) on a still place.
        let mut state = 0x2545_f491_u32;
        let mut jitter = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            f64::from(state % 7) - 3.0
        };
        let places: Vec<[f64; 2]> = (0..200)
            .map(|_| [300.0 + jitter(), 200.0 + jitter()])
            .collect();
        let got = follow(200, |f| places[f as usize]);
        let worst = got.iter().flatten().fold(0.0f64, |m, v| m.max(*v));
        // Moving 3 pixels in a second would be 3 px/s: the fit stays well below a walk.
        assert!(worst < 8.0, "{worst}");
    }

    #[test]
    fn a_few_places_off_the_path_move_the_speed_little() {
        // 1.5 m/s along x; one frame in six jumps 2 m off the path (a box that jumped).
        let got = follow(100, |f| {
            let t = f64::from(f) / FPS;
            let off = if f % 6 == 3 { 2.0 } else { 0.0 };
            [1.5 * t, off]
        });
        let worst = got[30..]
            .iter()
            .flatten()
            .fold(0.0f64, |m, v| m.max((v - 1.5).abs()));
        assert!(worst < 0.05, "{worst}");
    }

    #[test]
    fn a_box_whose_bottom_is_hidden_keeps_its_feet_where_they_are() {
        // A 100-pixel-tall person walking right at 10 px a frame, their feet hidden for frames
        // 20 to 29 (the box 60 tall, its top where it was): the feet stay on the line y = 300.
        let mut feet = Feet::default();
        for f in 0..40u16 {
            let hidden = (20..30).contains(&f);
            let b = crate::value::BBox {
                x: 10.0 * f32::from(f),
                y: 200.0,
                width: 30.0,
                height: if hidden { 60.0 } else { 100.0 },
            };
            let (y, switched) = feet.of(&b, f64::from(f) / 10.0);
            assert_eq!((y, switched), (300.0, false), "frame {f}");
        }
        // Its head hidden instead (the top moved down, the bottom stayed): the bottom is right.
        let mut feet = Feet::default();
        for f in 0..10u16 {
            let short = f >= 5;
            let b = crate::value::BBox {
                x: 0.0,
                y: if short { 240.0 } else { 200.0 },
                width: 30.0,
                height: if short { 60.0 } else { 100.0 },
            };
            assert_eq!(
                feet.of(&b, f64::from(f) / 10.0),
                (300.0, false),
                "frame {f}"
            );
        }
    }

    #[test]
    fn a_box_that_suddenly_grows_is_another_object_and_its_places_start_again() {
        // A far person (80 px tall) walking at 1 m/s; at frame 20 the tracker's box goes over
        // to someone nearer (180 px tall) 10 m closer: no speed from the jump, and none until
        // half a window of the new places.
        let image = [[0.0, 0.0], [640.0, 0.0], [640.0, 480.0], [0.0, 480.0]];
        let ground = image.map(|[x, y]| [x / 10.0, y / 10.0]);
        let g = Arc::new(Ground::fit((640, 480), &image, &ground).unwrap());
        let mut speeds = Speeds::default();
        let mat = Mat::new_rows_cols_with_default(480, 640, CV_8UC1, Scalar::all(0.0)).unwrap();
        let mut got = Vec::new();
        for f in 0..40u64 {
            let mut frame = Frame::from_mat(
                "cam".into(),
                f,
                Some(Duration::from_millis(f * 100)),
                mat.clone(),
            );
            frame.ground = Some(g.clone());
            let (y, h) = if f < 20 {
                (100.0, 80.0)
            } else {
                (200.0, 180.0)
            };
            let bbox = BBox {
                x: f as f32,
                y,
                width: 20.0,
                height: h,
            };
            let mut tracks = [Track::new(
                1,
                Detection::new("person".into(), 0.9, bbox),
                false,
            )];
            speeds.measure(&mut tracks, &frame, WINDOW, |_| true);
            got.push(tracks[0].speed);
        }
        let kmh = |s: &Option<Speed>| match s {
            Some(Speed::Kmh(v)) => Some(*v),
            _ => None,
        };
        assert!(got[20..25].iter().all(Option::is_none), "{got:?}");
        let worst = got.iter().filter_map(kmh).fold(0.0f32, f32::max);
        assert!(worst < 4.0, "a speed of {worst} km/h out of the switch");
    }

    #[test]
    fn places_scattered_far_off_a_line_give_no_spike_and_settle_to_the_speed() {
        // A walk of 1 m/s whose places scatter up to 1.5 m either way for 3 s (a far box cut by
        // the picture's edge): never a speed of a run, and most frames none. Once the places
        // follow the walk: 1 m/s.
        let mut state = 0x2545_f491_u32;
        let mut jitter = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            f64::from(state % 301) / 100.0 - 1.5
        };
        let mut speeds = Speeds {
            calibrated: true,
            ..Speeds::default()
        };
        let mut got = Vec::new();
        for f in 0..60u32 {
            let t = f64::from(f) / 10.0;
            let off = if f < 30 { jitter() } else { 0.0 };
            speeds.observe(1, t, [t + off, 0.0], 1.5);
            got.push(speeds.speed(1, t, 1.5));
        }
        let noisy = &got[..30];
        let worst = noisy.iter().flatten().fold(0.0f64, |m, v| m.max(*v));
        assert!(worst < 2.0, "{worst} m/s out of the scatter: {noisy:?}");
        assert!(
            noisy.iter().filter(|s| s.is_some()).count() < 5,
            "{noisy:?}"
        );
        let last = got[59].unwrap();
        assert!((last - 1.0).abs() < 1e-9, "{last}");
    }

    #[test]
    fn places_older_than_the_window_are_forgotten() {
        // 1 unit/s for 2 s, then 5 units/s: one window later only the new speed counts.
        let got = follow(100, |f| {
            let t = f64::from(f) / FPS;
            if t <= 2.0 {
                [t, 0.0]
            } else {
                [2.0 + 5.0 * (t - 2.0), 0.0]
            }
        });
        assert!((got[49].unwrap() - 1.0).abs() < 1e-9);
        assert!((got[80].unwrap() - 5.0).abs() < 1e-9);
    }

    /// A track at pixel (`x`, 100) of a 640x480 frame `seq` at 10 frames a second.
    fn measured(speeds: &mut Speeds, seq: u64, x: f32, ground: Option<&Arc<Ground>>) -> Track {
        let mat = Mat::new_rows_cols_with_default(480, 640, CV_8UC1, Scalar::all(0.0)).unwrap();
        let mut frame = Frame::from_mat(
            "cam".into(),
            seq,
            Some(Duration::from_millis(seq * 100)),
            mat,
        );
        frame.ground = ground.cloned();
        let bbox = BBox {
            x: x - 5.0,
            y: 80.0,
            width: 10.0,
            height: 20.0,
        };
        let mut tracks = [Track::new(
            1,
            Detection::new("thing".into(), 0.9, bbox),
            false,
        )];
        speeds.measure(&mut tracks, &frame, WINDOW, |_| true);
        let [track] = tracks;
        track
    }

    #[test]
    fn a_calibrated_source_gives_ground_places_and_km_h_and_another_px_s() {
        // 10 pixels a metre, the picture's x along the ground's X.
        let image = [[0.0, 0.0], [640.0, 0.0], [640.0, 480.0], [0.0, 480.0]];
        let ground = image.map(|[x, y]| [x / 10.0, y / 10.0]);
        let g = Arc::new(Ground::fit((640, 480), &image, &ground).unwrap());
        let mut speeds = Speeds::default();
        // 20 pixels (2 m) a frame at 10 a second: 20 m/s, 72 km/h.
        let tracks: Vec<Track> = (0..12)
            .map(|f| measured(&mut speeds, f, 20.0 * f as f32, Some(&g)))
            .collect();
        let last = &tracks[11];
        let [gx, gy] = last.ground.unwrap();
        assert!(
            (gx - 22.0).abs() < 1e-3 && (gy - 10.0).abs() < 1e-3,
            "{gx} {gy}"
        );
        assert!(tracks[4].speed.is_none());
        match last.speed {
            Some(Speed::Kmh(v)) => assert!((v - 72.0).abs() < 1e-3, "{v}"),
            other => panic!("{other:?}"),
        }
        // The same without a calibration: pixels, and no ground.
        let mut speeds = Speeds::default();
        let last = (0..12)
            .map(|f| measured(&mut speeds, f, 20.0 * f as f32, None))
            .last()
            .unwrap();
        assert_eq!(last.ground, None);
        match last.speed {
            Some(Speed::PxPerS(v)) => assert!((v - 200.0).abs() < 1e-3, "{v}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_ended_track_is_forgotten() {
        let mut speeds = Speeds::default();
        for f in 0..12 {
            measured(&mut speeds, f, 20.0 * f as f32, None);
        }
        assert!(speeds.seen.contains_key(&1));
        let mat = Mat::default();
        let frame = Frame::from_mat("cam".into(), 12, Some(Duration::from_millis(1200)), mat);
        speeds.measure(&mut [], &frame, WINDOW, |_| false);
        assert!(speeds.seen.is_empty());
    }
}
