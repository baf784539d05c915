//! `zone_count`'s behaviour on hand-made tracks: counts, events, IDs and times.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::state::{Update, ZoneState};
use super::{Limits, PerSource, Step, Zone, ZoneCount, Zones};
use crate::steps::common::geometry::{Anchor, Polygon};
use crate::steps::common::reid::Reid;
use crate::value::{BBox, Counts, Detection, Event, EventKind, Speed, Track};

/// Zone "a": x 0..100, y 0..100; zone "b": x 100..200, y 0..100 (beside it); no limits.
fn zones() -> Zones {
    let square = |x0: f32| {
        Polygon::new(vec![
            [x0, 0.0],
            [x0 + 100.0, 0.0],
            [x0 + 100.0, 100.0],
            [x0, 100.0],
        ])
    };
    let zone = |name: &str, x0| Zone {
        name: name.into(),
        polygon: square(x0),
        limits: Limits::default(),
    };
    Zones {
        zones: vec![zone("a", 0.0), zone("b", 100.0)],
        classes: None,
        anchor: Anchor::BottomCenter,
        reid: Reid::default(),
    }
}

/// A source's state and its frames, 4 a second: frame n (from 1) at n / 4 seconds.
#[derive(Default)]
struct Clip {
    state: ZoneState,
    n: u32,
}

impl Clip {
    /// The next frame, all it gives.
    fn full(&mut self, zones: &Zones, tracks: &[Track]) -> Update {
        self.n += 1;
        self.state.update(zones, tracks, f64::from(self.n) / 4.0)
    }

    /// The next frame's counts and events.
    fn update(&mut self, zones: &Zones, tracks: &[Track]) -> (Counts, Vec<Event>) {
        let u = self.full(zones, tracks);
        (u.counts, u.events)
    }
}

/// A 10x20 `class` box whose bottom centre is at (`x`, `y`).
fn track(id: u64, class: &str, x: f32, y: f32, predicted: bool) -> Track {
    let bbox = BBox {
        x: x - 5.0,
        y: y - 20.0,
        width: 10.0,
        height: 20.0,
    };
    Track {
        track_id: id,
        detection: Detection::new(class.into(), 0.9, bbox),
        predicted,
        ground: None,
        speed: None,
        dwell: None,
    }
}

fn seen(id: u64, x: f32, y: f32) -> Track {
    track(id, "person", x, y, false)
}

fn predicted(id: u64, x: f32, y: f32) -> Track {
    track(id, "person", x, y, true)
}

/// (event, track, zone) of each event.
fn said(events: &[Event]) -> Vec<(EventKind, u64, &str)> {
    events
        .iter()
        .map(|e| (e.event, e.track_id, &*e.place))
        .collect()
}

/// "a=1 b=0": every zone, in name order.
fn counts(c: &Counts) -> String {
    let all: Vec<String> = c.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
    all.join(" ")
}

#[test]
fn a_track_walking_through_two_zones_enters_and_leaves_each_once() {
    let (zones, mut state) = (zones(), Clip::default());
    let path = [(-20.0, 50.0), (50.0, 50.0), (150.0, 50.0), (250.0, 50.0)];
    let mut all = Vec::new();
    let mut inside = Vec::new();
    for (x, y) in path {
        let (c, e) = state.update(&zones, &[seen(7, x, y)]);
        inside.push(counts(&c));
        all.extend(said(&e).into_iter().map(|(k, id, z)| (k, id, z.to_owned())));
    }
    use EventKind::{Enter, Leave};
    assert_eq!(
        all,
        vec![
            (Enter, 7, "a".to_owned()),
            (Leave, 7, "a".to_owned()),
            (Enter, 7, "b".to_owned()),
            (Leave, 7, "b".to_owned()),
        ]
    );
    assert_eq!(inside, vec!["a=0 b=0", "a=1 b=0", "a=0 b=1", "a=0 b=0",]);
}

#[test]
fn events_carry_the_class_and_box_of_the_frame() {
    let (zones, mut state) = (zones(), Clip::default());
    let t = track(3, "car", 50.0, 50.0, false);
    let (_, events) = state.update(&zones, std::slice::from_ref(&t));
    assert_eq!(
        events,
        vec![Event {
            event: EventKind::Enter,
            track_id: 3,
            class: "car".into(),
            place: "a".into(),
            bbox: t.detection.bbox,
            dwell_s: None,
            speed: None,
        }]
    );
}

#[test]
fn a_track_predicted_inside_for_a_few_frames_neither_leaves_nor_reenters() {
    let (zones, mut state) = (zones(), Clip::default());
    let (_, e) = state.update(&zones, &[seen(1, 50.0, 50.0)]);
    assert_eq!(said(&e), vec![(EventKind::Enter, 1, "a")]);
    // Predicted boxes, even one drifting outside the zone, do not move it.
    for x in [60.0, 80.0, 150.0] {
        let (c, e) = state.update(&zones, &[predicted(1, x, 50.0)]);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(counts(&c), "a=1 b=0");
    }
    let (c, e) = state.update(&zones, &[seen(1, 70.0, 50.0)]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(counts(&c), "a=1 b=0");
}

#[test]
fn a_track_that_dies_inside_a_zone_leaves_it_with_its_last_seen_box() {
    let (zones, mut state) = (zones(), Clip::default());
    state.update(&zones, &[seen(1, 50.0, 50.0), seen(2, 150.0, 50.0)]);
    state.update(&zones, &[predicted(1, 55.0, 50.0), seen(2, 150.0, 50.0)]);
    // Absent for reid_frames frames: still inside, counted.
    for _ in 0..zones.reid.frames {
        let (c, e) = state.update(&zones, &[seen(2, 150.0, 50.0)]);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(counts(&c), "a=1 b=1");
    }
    let (c, e) = state.update(&zones, &[seen(2, 150.0, 50.0)]);
    assert_eq!(said(&e), vec![(EventKind::Leave, 1, "a")]);
    assert_eq!(e[0].bbox, seen(1, 50.0, 50.0).detection.bbox);
    assert_eq!(counts(&c), "a=0 b=1");
    // Gone for good: nothing more about it.
    let mut last = Vec::new();
    for _ in 0..=zones.reid.frames {
        let (_, e) = state.update(&zones, &[]);
        last.extend(said(&e).into_iter().map(|(k, id, z)| (k, id, z.to_owned())));
    }
    assert_eq!(last, vec![(EventKind::Leave, 2, "b".to_owned())]);
}

#[test]
fn a_track_the_tracker_misses_for_a_frame_neither_leaves_nor_reenters() {
    // With the tracker's default report_lost = 0, a missed detection is a frame without
    // the track.
    let (zones, mut state) = (zones(), Clip::default());
    let (_, e) = state.update(&zones, &[seen(1, 50.0, 50.0)]);
    assert_eq!(said(&e), vec![(EventKind::Enter, 1, "a")]);
    let (c, e) = state.update(&zones, &[]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(counts(&c), "a=1 b=0");
    let (c, e) = state.update(&zones, &[seen(1, 52.0, 50.0)]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(counts(&c), "a=1 b=0");
    // Without the memory (reid_frames = 0): a leave and an enter, as before.
    let mut off = zones;
    off.reid.frames = 0;
    let mut state = Clip::default();
    state.update(&off, &[seen(1, 50.0, 50.0)]);
    let (_, left) = state.update(&off, &[]);
    let (_, back) = state.update(&off, &[seen(1, 52.0, 50.0)]);
    assert_eq!(said(&left), vec![(EventKind::Leave, 1, "a")]);
    assert_eq!(said(&back), vec![(EventKind::Enter, 1, "a")]);
}

#[test]
fn a_track_found_again_under_a_new_id_nearby_takes_its_place() {
    use EventKind::{Enter, Leave};
    let (zones, mut state) = (zones(), Clip::default());
    let mut all = Vec::new();
    let mut inside = Vec::new();
    // Track 1 enters "a" and is lost; track 2 comes up 10 px away, then walks into "b".
    // Track 3, far from where track 1 was lost, is someone else. The visit of "a" began as
    // track 1: its leave says so (and its time from that enter); the visit of "b" begins as 2.
    let frames: [&[Track]; 5] = [
        &[seen(1, 50.0, 50.0)],
        &[],
        &[seen(2, 58.0, 56.0), seen(3, 10.0, 10.0)],
        &[seen(2, 90.0, 56.0), seen(3, 10.0, 10.0)],
        &[seen(2, 150.0, 56.0), seen(3, 10.0, 10.0)],
    ];
    let mut dwells = Vec::new();
    for tracks in frames {
        let (c, e) = state.update(&zones, tracks);
        inside.push(counts(&c));
        all.extend(said(&e).into_iter().map(|(k, id, z)| (k, id, z.to_owned())));
        dwells.extend(e.iter().map(|e| e.dwell_s));
    }
    assert_eq!(
        all,
        vec![
            (Enter, 1, "a".to_owned()),
            (Enter, 3, "a".to_owned()),
            (Leave, 1, "a".to_owned()),
            (Enter, 2, "b".to_owned()),
        ]
    );
    // In "a" from frame 1 (0.25 s) to frame 4 (1.0 s), the last it was seen there.
    assert_eq!(dwells, vec![None, None, Some(0.75), None]);
    assert_eq!(
        inside,
        vec!["a=1 b=0", "a=1 b=0", "a=2 b=0", "a=2 b=0", "a=1 b=1"]
    );
    // Without the take-over, track 2 enters again and track 1 stays counted meanwhile.
    let mut off = zones;
    off.reid.distance = 0.0;
    let mut state = Clip::default();
    state.update(&off, frames[0]);
    state.update(&off, frames[1]);
    let (c, e) = state.update(&off, frames[2]);
    assert_eq!(said(&e), vec![(Enter, 2, "a"), (Enter, 3, "a")]);
    assert_eq!(counts(&c), "a=3 b=0");
}

#[test]
fn tracks_of_other_classes_are_not_counted() {
    let mut zones = zones();
    zones.classes = Some(vec!["person".into()]);
    let mut state = Clip::default();
    let (c, e) = state.update(
        &zones,
        &[seen(1, 50.0, 50.0), track(2, "car", 50.0, 50.0, false)],
    );
    assert_eq!(said(&e), vec![(EventKind::Enter, 1, "a")]);
    assert_eq!(counts(&c), "a=1 b=0");
}

#[test]
fn the_anchor_decides_which_point_is_tested() {
    let mut zones = zones();
    // Bottom centre at y 105 is below zone "a"; the centre (y 105 - 10) is inside.
    let t = seen(1, 50.0, 105.0);
    let (c, _) = Clip::default().update(&zones, std::slice::from_ref(&t));
    assert_eq!(counts(&c), "a=0 b=0");
    zones.anchor = Anchor::Center;
    let (c, _) = Clip::default().update(&zones, &[t]);
    assert_eq!(counts(&c), "a=1 b=0");
}

#[test]
fn its_zones_are_its_shapes_in_name_order() {
    let step = ZoneCount {
        zones: zones(),
        states: PerSource::default(),
    };
    let shapes = step.shapes();
    let names: Vec<_> = shapes.iter().map(|s| (&*s.name, s.zone)).collect();
    assert_eq!(names, vec![("a", true), ("b", true)]);
    assert_eq!(shapes[1].points[0], [100.0, 0.0]);
    assert_eq!(shapes[1].points.len(), 4);
}

/// `zones()` with `limits` on zone "a".
fn limited(limits: Limits) -> Zones {
    let mut zones = zones();
    zones.zones[0].limits = limits;
    zones
}

/// `seen` going at `speed`.
fn going(id: u64, x: f32, speed: Speed) -> Track {
    Track {
        speed: Some(speed),
        ..seen(id, x, 50.0)
    }
}

/// (frame, event, track, zone, dwell_s) of every event of `frames` (frame from 1).
fn run(zones: &Zones, frames: &[Vec<Track>]) -> Vec<(u32, EventKind, u64, String, Option<f32>)> {
    let mut state = Clip::default();
    let mut all = Vec::new();
    for (f, tracks) in (1..).zip(frames) {
        let (_, e) = state.update(zones, tracks);
        all.extend(
            e.iter()
                .map(|e| (f, e.event, e.track_id, e.place.to_string(), e.dwell_s)),
        );
    }
    all
}

#[test]
fn a_leave_carries_the_time_from_the_enter_to_the_last_frame_seen_inside() {
    use EventKind::{Enter, Leave};
    let zones = zones();
    // Track 1: outside, in "a" on frames 2..=5 (0.5 s to 1.25 s), out on 6. Track 2: in "b"
    // from frame 1, seen on frames 1..=3 only, predicted on 4: it ends reid_frames after 4.
    let mut frames: Vec<Vec<Track>> = vec![
        vec![seen(1, -20.0, 50.0), seen(2, 150.0, 50.0)],
        vec![seen(1, 10.0, 50.0), seen(2, 150.0, 50.0)],
        vec![seen(1, 30.0, 50.0), seen(2, 150.0, 50.0)],
        vec![seen(1, 50.0, 50.0), predicted(2, 150.0, 50.0)],
        vec![seen(1, 70.0, 50.0)],
        vec![seen(1, 70.0, 150.0)],
    ];
    let end = 4 + zones.reid.frames as u32 + 1;
    frames.resize(end as usize, Vec::new());
    assert_eq!(
        run(&zones, &frames),
        vec![
            (1, Enter, 2, "b".to_owned(), None),
            (2, Enter, 1, "a".to_owned(), None),
            (6, Leave, 1, "a".to_owned(), Some(0.75)),
            (end, Leave, 2, "b".to_owned(), Some(0.5)),
        ]
    );
}

#[test]
fn loiter_is_said_once_per_visit_on_the_first_frame_past_loiter_s() {
    use EventKind::{Enter, Leave, Loiter};
    let zones = limited(Limits {
        loiter_s: Some(1.0),
        ..Limits::default()
    });
    // In "a" from frame 1 (0.25 s): 1.0 s inside on frame 5 is not past it, frame 6 is. It
    // stays to frame 12 (predicted on 7 and 8: still inside), leaves on 13, comes back on 14.
    let mut frames: Vec<Vec<Track>> = (1..=12)
        .map(|f| match f {
            7 | 8 => vec![predicted(1, 50.0, 50.0)],
            _ => vec![seen(1, 50.0, 50.0)],
        })
        .collect();
    frames.push(vec![seen(1, 50.0, 150.0)]);
    frames.extend((14..=20).map(|_| vec![seen(1, 50.0, 50.0)]));
    assert_eq!(
        run(&zones, &frames),
        vec![
            (1, Enter, 1, "a".to_owned(), None),
            (6, Loiter, 1, "a".to_owned(), Some(1.25)),
            (13, Leave, 1, "a".to_owned(), Some(2.75)),
            (14, Enter, 1, "a".to_owned(), None),
            (19, Loiter, 1, "a".to_owned(), Some(1.25)),
        ]
    );
    // Zone "b" has no loiter_s: nothing.
    let frames: Vec<Vec<Track>> = (1..=20).map(|_| vec![seen(1, 150.0, 50.0)]).collect();
    assert_eq!(run(&zones, &frames).len(), 1);
}

#[test]
fn speeding_is_said_once_per_visit_the_first_frame_seen_inside_too_fast() {
    use EventKind::{Enter, Leave, Speeding};
    let zones = limited(Limits {
        max_px_s: Some(300.0),
        max_kmh: Some(20.0),
        ..Limits::default()
    });
    let px = Speed::PxPerS;
    let frames = vec![
        vec![going(1, -20.0, px(900.0))], // outside: no limit
        vec![going(1, 10.0, px(100.0))],
        vec![Track {
            predicted: true,
            ..going(1, 20.0, px(900.0)) // only predicted: not judged
        }],
        vec![going(1, 30.0, px(300.0))], // at the limit is not above it
        vec![going(1, 40.0, px(350.0))],
        vec![going(1, 50.0, px(400.0))],  // said already this visit
        vec![going(1, 150.0, px(400.0))], // "b" has no limit
        vec![going(1, 50.0, Speed::Kmh(25.0))], // a new visit, in km/h
    ];
    let mut state = Clip::default();
    let mut all = Vec::new();
    for (f, tracks) in (1..).zip(&frames) {
        let u = state.full(&zones, tracks);
        assert_eq!(u.never_fires, None);
        all.extend(
            u.events
                .iter()
                .map(|e| (f, e.event, e.place.to_string(), e.speed, e.dwell_s)),
        );
    }
    assert_eq!(
        all,
        vec![
            (2, Enter, "a".to_owned(), Some(px(100.0)), None),
            (5, Speeding, "a".to_owned(), Some(px(350.0)), Some(0.75)),
            (7, Leave, "a".to_owned(), Some(px(400.0)), Some(1.0)),
            (7, Enter, "b".to_owned(), Some(px(400.0)), None),
            (8, Enter, "a".to_owned(), Some(Speed::Kmh(25.0)), None),
            (
                8,
                Speeding,
                "a".to_owned(),
                Some(Speed::Kmh(25.0)),
                Some(0.0)
            ),
            (8, Leave, "b".to_owned(), Some(Speed::Kmh(25.0)), Some(0.0)),
        ]
    );
}

#[test]
fn a_kmh_limit_on_speeds_in_px_s_never_fires_and_is_said_once() {
    let zones = limited(Limits {
        max_kmh: Some(20.0),
        ..Limits::default()
    });
    let mut state = Clip::default();
    let mut said_once = Vec::new();
    for x in [10.0, 20.0, 30.0] {
        let u = state.full(&zones, &[going(1, x, Speed::PxPerS(5000.0))]);
        assert!(
            u.events.iter().all(|e| e.event == EventKind::Enter),
            "{:?}",
            u.events
        );
        said_once.extend(u.never_fires);
    }
    assert_eq!(said_once.len(), 1, "{said_once:?}");
    assert!(
        said_once[0].starts_with("zone \"a\" has a speed limit in km/h"),
        "{said_once:?}"
    );
}

#[test]
fn a_visit_keeps_the_id_it_began_under_when_a_new_id_takes_its_place() {
    use EventKind::{Enter, Leave, Loiter, Speeding};
    let zones = limited(Limits {
        loiter_s: Some(1.0),
        max_px_s: Some(300.0),
        ..Limits::default()
    });
    // Track 1 enters "a" and is lost on frame 3; track 2 takes its place on 4, loiters, goes
    // too fast and leaves.
    let mut frames = vec![vec![seen(1, 50.0, 50.0)], vec![seen(1, 50.0, 50.0)], vec![]];
    frames.extend((4..=6).map(|_| vec![seen(2, 55.0, 50.0)]));
    frames.push(vec![going(2, 60.0, Speed::PxPerS(500.0))]);
    frames.push(vec![seen(2, 60.0, 150.0)]);
    assert_eq!(
        run(&zones, &frames),
        vec![
            (1, Enter, 1, "a".to_owned(), None),
            (6, Loiter, 1, "a".to_owned(), Some(1.25)),
            (7, Speeding, 1, "a".to_owned(), Some(1.5)),
            (8, Leave, 1, "a".to_owned(), Some(1.5)),
        ]
    );
}

#[test]
fn a_new_id_never_takes_the_place_of_a_lost_track_of_another_class() {
    use EventKind::{Enter, Leave};
    let zones = zones();
    // Person 1 is lost in "a"; car 2 comes up on the spot: a car entering, and the person
    // still inside until it ends.
    let mut frames = vec![vec![seen(1, 50.0, 50.0)], vec![]];
    frames.extend((3..=4).map(|_| vec![track(2, "car", 52.0, 50.0, false)]));
    let mut state = Clip::default();
    let mut all = Vec::new();
    let mut inside = Vec::new();
    for tracks in &frames {
        let (c, e) = state.update(&zones, tracks);
        all.extend(e.iter().map(|e| (e.event, e.track_id, e.class.to_string())));
        inside.push(counts(&c));
    }
    assert_eq!(
        all,
        vec![
            (Enter, 1, "person".to_owned()),
            (Enter, 2, "car".to_owned())
        ]
    );
    assert_eq!(inside, vec!["a=1 b=0", "a=1 b=0", "a=2 b=0", "a=2 b=0"]);
    // Person 1 ends reid_frames after frame 1, with the car still there.
    for _ in 5..=zones.reid.frames + 1 {
        let (_, e) = state.update(&zones, &[track(2, "car", 52.0, 50.0, false)]);
        assert!(e.is_empty(), "{e:?}");
    }
    let (c, e) = state.update(&zones, &[track(2, "car", 52.0, 50.0, false)]);
    assert_eq!(said(&e), vec![(Leave, 1, "a")]);
    assert_eq!(counts(&c), "a=1 b=0");
}

#[test]
fn the_tracks_output_gives_each_its_time_inside_the_zones_it_is_in_now() {
    let zones = zones();
    let mut state = Clip::default();
    let dwell = |u: &Update| -> Vec<Option<BTreeMap<Arc<str>, f32>>> {
        u.tracks
            .iter()
            .map(|t| t.dwell.as_deref().cloned())
            .collect()
    };
    let of = |pairs: &[(&str, f32)]| {
        Some(
            pairs
                .iter()
                .map(|(z, s)| (Arc::from(*z), *s))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    // Frame 1: 1 enters "a", 2 is outside.
    let u = state.full(&zones, &[seen(1, 50.0, 50.0), seen(2, 50.0, 150.0)]);
    assert_eq!(dwell(&u), vec![of(&[("a", 0.0)]), None]);
    state.full(&zones, &[seen(1, 60.0, 50.0), seen(2, 150.0, 50.0)]);
    // Frame 3: 1 only predicted (still inside), 2 in "b" since frame 2; a new predicted 4.
    let u = state.full(
        &zones,
        &[
            predicted(1, 160.0, 50.0),
            seen(2, 150.0, 50.0),
            predicted(4, 50.0, 50.0),
        ],
    );
    assert_eq!(dwell(&u), vec![of(&[("a", 0.5)]), of(&[("b", 0.25)]), None]);
    // The tracks are the input's, in its order, with only dwell added.
    assert_eq!(
        Track {
            dwell: None,
            ..u.tracks[0].clone()
        },
        predicted(1, 160.0, 50.0)
    );
}

#[test]
fn a_track_lost_at_the_pictures_edge_is_no_longer_counted_inside_but_stays_one_visit() {
    // A 200x100 picture: zone "a" reaches its left edge. Track 1 walks out of the picture
    // there (its box touching the edge when last seen); track 2 is lost in the middle.
    let (zones, mut state) = (zones(), Clip::default());
    state.state.picture = Some((200, 100));
    state.update(&zones, &[seen(1, 5.0, 50.0), seen(2, 150.0, 50.0)]);
    let (c, _) = state.update(&zones, &[]);
    assert_eq!(
        counts(&c),
        "a=0 b=1",
        "lost at the edge: out; in the middle: held"
    );
    // Back under its ID within reid_frames: the same visit, counted again, no enter.
    let (c, e) = state.update(&zones, &[seen(1, 6.0, 50.0), seen(2, 150.0, 50.0)]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(counts(&c), "a=1 b=1");
    // Lost at the edge for good: its leave comes when it is forgotten, with the visit's time
    // to when it was last seen (frames 1 to 3, at 4 a second).
    let mut left = Vec::new();
    for _ in 0..=zones.reid.frames {
        let (c, e) = state.update(&zones, &[seen(2, 150.0, 50.0)]);
        assert_eq!(counts(&c), "a=0 b=1");
        left.extend(e);
    }
    assert_eq!(said(&left), vec![(EventKind::Leave, 1, "a")]);
    assert_eq!(left[0].dwell_s, Some(0.5));
}
