//! `zone_count`: how many tracked objects are inside each zone, and who entered or left.
//!
//! A track's position is judged only on frames where it was seen (`predicted: false`); while
//! the tracker only predicts it, it stays where it was last seen (inside or not), so a short
//! occlusion never reads as a leave and a re-enter. A track absent from the input (the tracker
//! missed it: with its default `report_lost = 0` a single missed detection does that) is
//! remembered for `reid_frames` frames, still inside the zones it was in and counted there: back
//! under its ID it goes on from there, and a *new* ID first seen within `reid_distance` pixels
//! of where it was last seen takes its place (the tracker found it again under another ID), so
//! neither says leave and enter again. A track absent for longer is gone: it leaves every zone
//! it was in, on that frame, with the box it was last seen with. The hysteresis is
//! `line_counter`'s (`common::reid`). Stateful: one state per source ([`PerSource`]), frames in
//! order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Deserialize;

use super::common::geometry::{
    ANCHOR_DOC, Anchor, CLASSES_DOC, Point, Polygon, RawPoints, stay_in_pixels,
};
use super::common::per_source::PerSource;
use super::common::reid::{REID_DISTANCE_DOC, REID_FRAMES_DOC, Reid};
use super::{Port, Shape, Step, StepError, StepInput, StepKind, StepOutput};
use crate::frame::Format;
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{BBox, Counts, Event, EventKind, Track, Value, ValueType};

pub(super) const TRACKS_IN: &[Port] = &[Port {
    name: "tracks",
    ty: ValueType::Tracks,
    optional: false,
}];

pub(super) const COUNTS_EVENTS_OUT: &[Port] = &[
    Port {
        name: "counts",
        ty: ValueType::Counts,
        optional: false,
    },
    Port {
        name: "events",
        ty: ValueType::Events,
        optional: false,
    },
];

pub(super) static KIND: StepKind = StepKind {
    name: "zone_count",
    summary: "objects inside each zone now, and enter/leave events (state per source)",
    inputs: TRACKS_IN,
    outputs: COUNTS_EVENTS_OUT,
    params: &[
        ParamDoc {
            name: "zones",
            ty: "table of name = [[x, y], ...]",
            default: "required",
            doc: "one or more polygons (at least 3 points each), in pixels of the tracked image",
        },
        CLASSES_DOC,
        ANCHOR_DOC,
        REID_DISTANCE_DOC,
        REID_FRAMES_DOC,
    ],
    stateful: true,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    zones: toml::Spanned<BTreeMap<String, RawPoints>>,
    classes: Option<Vec<String>>,
    anchor: Option<Anchor>,
    reid_distance: Option<toml::Spanned<f32>>,
    reid_frames: Option<toml::Spanned<i64>>,
}

#[derive(Debug)]
struct ZoneCount {
    zones: Zones,
    states: PerSource<ZoneState>,
}

/// The zones, in name order, and what is counted.
#[derive(Debug)]
struct Zones {
    names: Vec<Arc<str>>,
    polygons: Vec<Polygon>,
    classes: Option<Vec<Arc<str>>>,
    anchor: Anchor,
    reid: Reid,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    if c.zones.get_ref().is_empty() {
        return Err(Diagnostic::at(
            c.zones.span(),
            "zones needs at least one zone: name = [[x, y], ...]",
        ));
    }
    let mut names = Vec::new();
    let mut polygons = Vec::new();
    for (name, raw) in c.zones.get_ref() {
        polygons.push(Polygon::parse(raw, &format!("zone \"{name}\""))?);
        names.push(Arc::from(name.as_str()));
    }
    Ok(Box::new(ZoneCount {
        zones: Zones {
            names,
            polygons,
            classes: c.classes.map(|cs| cs.into_iter().map(Arc::from).collect()),
            anchor: c.anchor.unwrap_or_default(),
            reid: Reid::parse(c.reid_distance, c.reid_frames)?,
        },
        states: PerSource::default(),
    }))
}

impl Step for ZoneCount {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let tracks = input.get::<[Track]>(0)?;
        let (counts, events) = self.states.with(&input.frame.source, |state| {
            state.update(&self.zones, tracks)
        });
        Ok(StepOutput::Values(vec![
            Value::Counts(Arc::new(counts)),
            Value::Events(events.into()),
        ]))
    }

    fn reset_source(&self, source: &str) -> bool {
        self.states.reset(source);
        true
    }

    fn source_resized(&self, _source: &str, from: Format, to: Format) -> Option<String> {
        Some(stay_in_pixels("its zones are", from, to))
    }

    fn shapes(&self) -> Vec<Shape> {
        let zones = &self.zones;
        zones
            .names
            .iter()
            .zip(&zones.polygons)
            .map(|(name, polygon)| Shape {
                name: name.clone(),
                zone: true,
                points: polygon.points().to_vec(),
            })
            .collect()
    }
}

/// What one source's tracks, live or lately lost, were last seen doing.
#[derive(Debug, Default)]
struct ZoneState {
    /// Frames taken so far.
    frame: u64,
    tracks: HashMap<u64, Inside>,
}

/// One track: which zones it is in (by zone index), how and where it was last seen, and when
/// it was last in the input.
#[derive(Debug)]
struct Inside {
    zones: Vec<bool>,
    class: Arc<str>,
    bbox: BBox,
    at: Point,
    /// The frame (of this state's count) it was last in the input.
    present: u64,
}

impl ZoneState {
    /// Takes one frame's tracks; gives the counts now and this frame's events: enters and
    /// leaves of the tracks in input order (zones in name order), then the leaves of the tracks
    /// that ended (absent for more than `reid_frames`), by track ID.
    fn update(&mut self, zones: &Zones, tracks: &[Track]) -> (Counts, Vec<Event>) {
        self.frame += 1;
        let now = self.frame;
        let mut events = Vec::new();
        let event = |kind, zone: usize, id, class: &Arc<str>, bbox| Event {
            event: kind,
            track_id: id,
            class: class.clone(),
            place: zones.names[zone].clone(),
            bbox,
            dwell_s: None,
            speed: None,
        };
        let counted = tracks.iter().filter(|t| {
            zones
                .classes
                .as_ref()
                .is_none_or(|cs| cs.contains(&t.detection.class))
        });
        let counted: Vec<&Track> = counted.collect();
        for t in &counted {
            if let Some(known) = self.tracks.get_mut(&t.track_id) {
                known.present = now;
            }
        }
        for t in counted {
            if t.predicted {
                continue;
            }
            let d = &t.detection;
            let at = zones.anchor.of(&d.bbox);
            if !self.tracks.contains_key(&t.track_id) {
                let state = self.take_lost_near(zones, at).unwrap_or_else(|| Inside {
                    zones: vec![false; zones.polygons.len()],
                    class: d.class.clone(),
                    bbox: d.bbox,
                    at,
                    present: now,
                });
                self.tracks.insert(t.track_id, state);
            }
            let Some(state) = self.tracks.get_mut(&t.track_id) else {
                continue;
            };
            state.bbox = d.bbox;
            state.at = at;
            state.present = now;
            for (z, polygon) in zones.polygons.iter().enumerate() {
                let now = polygon.contains(at);
                if now != state.zones[z] {
                    state.zones[z] = now;
                    let kind = if now {
                        EventKind::Enter
                    } else {
                        EventKind::Leave
                    };
                    events.push(event(kind, z, t.track_id, &d.class, d.bbox));
                }
            }
        }
        let mut ended: Vec<u64> = self
            .tracks
            .iter()
            .filter(|(_, s)| now - s.present > zones.reid.frames)
            .map(|(id, _)| *id)
            .collect();
        ended.sort_unstable();
        for id in ended {
            if let Some(gone) = self.tracks.remove(&id) {
                for (z, _) in gone.zones.iter().enumerate().filter(|(_, i)| **i) {
                    events.push(event(EventKind::Leave, z, id, &gone.class, gone.bbox));
                }
            }
        }
        let counts = zones
            .names
            .iter()
            .enumerate()
            .map(|(z, name)| {
                let n = self.tracks.values().filter(|s| s.zones[z]).count();
                (name.clone(), n as u64)
            })
            .collect();
        (Counts(counts), events)
    }

    /// Removes and gives the lost track (absent from this frame's input) last seen nearest to
    /// `at`, within `reid_distance`.
    fn take_lost_near(&mut self, zones: &Zones, at: Point) -> Option<Inside> {
        let gap = |s: &Inside| (s.at[0] - at[0]).hypot(s.at[1] - at[1]);
        let (&id, _) = self
            .tracks
            .iter()
            .filter(|(_, s)| s.present < self.frame && gap(s) <= zones.reid.distance)
            .min_by(|a, b| gap(a.1).total_cmp(&gap(b.1)))?;
        self.tracks.remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Detection;

    /// Zone "a": x 0..100, y 0..100; zone "b": x 100..200, y 0..100 (beside it).
    fn zones() -> Zones {
        let square = |x0: f32| {
            Polygon::new(vec![
                [x0, 0.0],
                [x0 + 100.0, 0.0],
                [x0 + 100.0, 100.0],
                [x0, 100.0],
            ])
        };
        Zones {
            names: vec!["a".into(), "b".into()],
            polygons: vec![square(0.0), square(100.0)],
            classes: None,
            anchor: Anchor::BottomCenter,
            reid: Reid::default(),
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
        let (zones, mut state) = (zones(), ZoneState::default());
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
        let (zones, mut state) = (zones(), ZoneState::default());
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
        let (zones, mut state) = (zones(), ZoneState::default());
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
        let (zones, mut state) = (zones(), ZoneState::default());
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
        let (zones, mut state) = (zones(), ZoneState::default());
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
        let mut state = ZoneState::default();
        state.update(&off, &[seen(1, 50.0, 50.0)]);
        let (_, left) = state.update(&off, &[]);
        let (_, back) = state.update(&off, &[seen(1, 52.0, 50.0)]);
        assert_eq!(said(&left), vec![(EventKind::Leave, 1, "a")]);
        assert_eq!(said(&back), vec![(EventKind::Enter, 1, "a")]);
    }

    #[test]
    fn a_track_found_again_under_a_new_id_nearby_takes_its_place() {
        use EventKind::{Enter, Leave};
        let (zones, mut state) = (zones(), ZoneState::default());
        let mut all = Vec::new();
        let mut inside = Vec::new();
        // Track 1 enters "a" and is lost; track 2 comes up 10 px away, then walks into "b".
        // Track 3, far from where track 1 was lost, is someone else.
        let frames: [&[Track]; 5] = [
            &[seen(1, 50.0, 50.0)],
            &[],
            &[seen(2, 58.0, 56.0), seen(3, 10.0, 10.0)],
            &[seen(2, 90.0, 56.0), seen(3, 10.0, 10.0)],
            &[seen(2, 150.0, 56.0), seen(3, 10.0, 10.0)],
        ];
        for tracks in frames {
            let (c, e) = state.update(&zones, tracks);
            inside.push(counts(&c));
            all.extend(said(&e).into_iter().map(|(k, id, z)| (k, id, z.to_owned())));
        }
        assert_eq!(
            all,
            vec![
                (Enter, 1, "a".to_owned()),
                (Enter, 3, "a".to_owned()),
                (Leave, 2, "a".to_owned()),
                (Enter, 2, "b".to_owned()),
            ]
        );
        assert_eq!(
            inside,
            vec!["a=1 b=0", "a=1 b=0", "a=2 b=0", "a=2 b=0", "a=1 b=1"]
        );
        // Without the take-over, track 2 enters again and track 1 stays counted meanwhile.
        let mut off = zones;
        off.reid.distance = 0.0;
        let mut state = ZoneState::default();
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
        let mut state = ZoneState::default();
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
        let (c, _) = ZoneState::default().update(&zones, std::slice::from_ref(&t));
        assert_eq!(counts(&c), "a=0 b=0");
        zones.anchor = Anchor::Center;
        let (c, _) = ZoneState::default().update(&zones, &[t]);
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
}
