//! `line_counter`: counts tracked objects crossing a line, each way.
//!
//! Sides: walking the line from its point 1 to its point 2 as drawn on the image (x right,
//! y down), "in" is crossing from the left-hand side to the right-hand side, "out" the other
//! way. For a line drawn left to right, "in" is moving down the image.
//!
//! A crossing is counted when a track's anchor, at two positions where the track was seen
//! (`predicted: false`), is on opposite sides of the line AND the path between them meets the
//! segment itself (going round its end crosses only the extension: not counted). Jitter: a
//! position closer to the line than `dead_band` pixels has no side; it is ignored, so a track
//! hesitating on the line counts at most once each time it really goes from one side to the
//! other. Predicted positions are ignored too: a track that crossed while unseen is counted
//! when it is seen again on the other side. The reference point of a box is its bottom centre
//! (where a person touches the ground) unless `anchor` says otherwise.
//!
//! A track absent from the input (lost by the tracker) is remembered for `reid_frames` frames:
//! back under its ID, it goes on from the side it was on. A *new* ID whose first position on a
//! side is within `reid_distance` pixels of where a remembered track was last seen takes that
//! track's place (the tracker lost a person and found them again under a new ID): it is counted
//! if it is on the other side of where the old one was and the old one had not been counted
//! getting there (it crossed while unseen); the other side of a track that was counted is a box
//! that jumped back over the line, ignored. One person crossing is one count whatever the
//! tracker did meanwhile. Totals are cumulative per source. Stateful: one
//! state per source ([`PerSource`]), frames in order.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;

use super::common::geometry::{
    ANCHOR_DOC, Anchor, CLASSES_DOC, Point, RawPoints, Segment, stay_in_pixels,
};
use super::common::per_source::PerSource;
use super::common::reid::{REID_DISTANCE_DOC, REID_FRAMES_DOC, Reid};
use super::zone_count::{COUNTS_EVENTS_OUT, TRACKS_IN};
use super::{Shape, Step, StepError, StepInput, StepKind, StepOutput};
use crate::frame::Format;
use crate::spec::{Diagnostic, ParamDoc, Params};
use crate::value::{Counts, Event, EventKind, Track, Value};

/// Default `dead_band`: a few pixels absorb a detector's box jitter at a standstill.
const DEFAULT_DEAD_BAND: f32 = 3.0;

pub(super) static KIND: StepKind = StepKind {
    name: "line_counter",
    summary: "crossings of a line each way, {\"in\": N, \"out\": N} per source, and an event per crossing",
    inputs: TRACKS_IN,
    outputs: COUNTS_EVENTS_OUT,
    params: &[
        ParamDoc {
            name: "line",
            ty: "[[x1, y1], [x2, y2]]",
            default: "required",
            doc: "the segment; \"in\" is crossing to the right of the direction from point 1 to point 2 (y down)",
        },
        ParamDoc {
            name: "name",
            ty: "string",
            default: "\"line\"",
            doc: "the line's name, the events' \"place\"",
        },
        ParamDoc {
            name: "dead_band",
            ty: "float >= 0",
            default: "3.0",
            doc: "positions closer to the line than this (pixels) have no side, against jitter",
        },
        REID_DISTANCE_DOC,
        REID_FRAMES_DOC,
        CLASSES_DOC,
        ANCHOR_DOC,
    ],
    stateful: true,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    line: RawPoints,
    name: Option<String>,
    dead_band: Option<toml::Spanned<f32>>,
    classes: Option<Vec<String>>,
    anchor: Option<Anchor>,
    reid_distance: Option<toml::Spanned<f32>>,
    reid_frames: Option<toml::Spanned<i64>>,
}

#[derive(Debug)]
struct LineCounter {
    line: Line,
    states: PerSource<LineState>,
}

/// The line and what is counted.
#[derive(Debug)]
struct Line {
    segment: Segment,
    name: Arc<str>,
    dead_band: f32,
    classes: Option<Vec<Arc<str>>>,
    anchor: Anchor,
    reid_distance: f32,
    reid_frames: u64,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    let segment = Segment::parse(&c.line, "line")?;
    let dead_band = match c.dead_band {
        Some(d) if !(d.get_ref().is_finite() && *d.get_ref() >= 0.0) => {
            return Err(Diagnostic::at(
                d.span(),
                format!("dead_band must be a number >= 0, not {}", d.get_ref()),
            ));
        }
        Some(d) => d.into_inner(),
        None => DEFAULT_DEAD_BAND,
    };
    let reid = Reid::parse(c.reid_distance, c.reid_frames)?;
    Ok(Box::new(LineCounter {
        line: Line {
            segment,
            name: c.name.unwrap_or_else(|| "line".to_owned()).into(),
            dead_band,
            classes: c.classes.map(|cs| cs.into_iter().map(Arc::from).collect()),
            anchor: c.anchor.unwrap_or_default(),
            reid_distance: reid.distance,
            reid_frames: reid.frames,
        },
        states: PerSource::default(),
    }))
}

impl Step for LineCounter {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let tracks = input.get::<[Track]>(0)?;
        let (counts, events) = self.states.with(&input.frame.source, |state| {
            state.update(&self.line, tracks)
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
        Some(stay_in_pixels("its line is", from, to))
    }

    fn shapes(&self) -> Vec<Shape> {
        let Segment { a, b } = self.line.segment;
        vec![Shape {
            name: self.line.name.clone(),
            zone: false,
            points: vec![a, b],
        }]
    }
}

/// Where a track was last seen on a side of the line, and when it was last in the input.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// True on the "in" side.
    side: bool,
    at: Point,
    /// The frame (of this state's count) it was last in the input.
    present: u64,
    /// Whether it got to this side by a counted crossing.
    counted: bool,
}

/// One source's totals and where each track, live or lately lost, was last seen on a side of
/// the line.
#[derive(Debug, Default)]
struct LineState {
    ins: u64,
    outs: u64,
    /// Frames taken so far.
    frame: u64,
    /// Track ID -> where it was last seen on a side.
    tracks: HashMap<u64, Seen>,
}

impl LineState {
    /// Takes one frame's tracks; gives the totals so far and this frame's crossings, in input
    /// order.
    fn update(&mut self, line: &Line, tracks: &[Track]) -> (Counts, Vec<Event>) {
        self.frame += 1;
        let now = self.frame;
        let counted: Vec<&Track> = tracks
            .iter()
            .filter(|t| {
                line.classes
                    .as_ref()
                    .is_none_or(|cs| cs.contains(&t.detection.class))
            })
            .collect();
        for t in &counted {
            if let Some(seen) = self.tracks.get_mut(&t.track_id) {
                seen.present = now;
            }
        }
        let mut events = Vec::new();
        for t in counted {
            if t.predicted {
                continue;
            }
            let at = line.anchor.of(&t.detection.bbox);
            let distance = line.segment.side(at);
            if distance.abs() < line.dead_band || distance == 0.0 {
                continue;
            }
            let side = distance > 0.0;
            let (before, taken_over) = match self.tracks.get(&t.track_id) {
                Some(seen) => (Some(*seen), false),
                None => (self.take_lost_near(line, at), true),
            };
            if let Some(old) = before.filter(|old| taken_over && old.counted && old.side != side) {
                // A new ID where a counted track was lost, back across the line: the box of
                // the same person jumped, not a crossing. It goes on from the old side.
                self.tracks.insert(
                    t.track_id,
                    Seen {
                        present: now,
                        ..old
                    },
                );
                continue;
            }
            let crossed =
                before.is_some_and(|b| b.side != side && line.segment.crossed_by(b.at, at));
            self.tracks.insert(
                t.track_id,
                Seen {
                    side,
                    at,
                    present: now,
                    counted: crossed || before.is_some_and(|b| b.side == side && b.counted),
                },
            );
            if !crossed {
                continue;
            }
            let kind = if side {
                self.ins += 1;
                EventKind::In
            } else {
                self.outs += 1;
                EventKind::Out
            };
            events.push(Event {
                event: kind,
                track_id: t.track_id,
                class: t.detection.class.clone(),
                place: line.name.clone(),
                bbox: t.detection.bbox,
                dwell_s: None,
                speed: None,
            });
        }
        self.tracks
            .retain(|_, seen| now - seen.present <= line.reid_frames);
        let counts = [("in".into(), self.ins), ("out".into(), self.outs)];
        (Counts(counts.into_iter().collect()), events)
    }

    /// Removes and gives the lost track (absent from this frame's input) last seen nearest to
    /// `at`, within `reid_distance`.
    fn take_lost_near(&mut self, line: &Line, at: Point) -> Option<Seen> {
        let gap = |seen: &Seen| (seen.at[0] - at[0]).hypot(seen.at[1] - at[1]);
        let (&id, _) = self
            .tracks
            .iter()
            .filter(|(_, seen)| seen.present < self.frame && gap(seen) <= line.reid_distance)
            .min_by(|a, b| gap(a.1).total_cmp(&gap(b.1)))?;
        self.tracks.remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::{BBox, Detection};

    /// A line from (0, 100) to (200, 100): "in" is moving down the image (y growing).
    fn line() -> Line {
        Line {
            segment: Segment {
                a: [0.0, 100.0],
                b: [200.0, 100.0],
            },
            name: "door".into(),
            dead_band: DEFAULT_DEAD_BAND,
            classes: None,
            anchor: Anchor::BottomCenter,
            reid_distance: Reid::default().distance,
            reid_frames: Reid::default().frames,
        }
    }

    /// A track whose bottom centre is at (`x`, `y`).
    fn track(id: u64, x: f32, y: f32, predicted: bool) -> Track {
        let bbox = BBox {
            x: x - 5.0,
            y: y - 20.0,
            width: 10.0,
            height: 20.0,
        };
        Track {
            track_id: id,
            detection: Detection::new("person".into(), 0.9, bbox),
            predicted,
            ground: None,
            speed: None,
            dwell: None,
        }
    }

    /// Events as (kind, track, frame index).
    type Said = Vec<(EventKind, u64, usize)>;

    /// Runs a sequence of frames, each a list of (id, x, y, predicted); gives the final totals
    /// (in, out) and every event as (kind, id, frame index).
    fn run(line: &Line, frames: &[&[(u64, f32, f32, bool)]]) -> ((u64, u64), Said) {
        let mut state = LineState::default();
        let mut all = Vec::new();
        let mut last = Counts::default();
        for (i, frame) in frames.iter().enumerate() {
            let tracks: Vec<Track> = frame
                .iter()
                .map(|&(id, x, y, p)| track(id, x, y, p))
                .collect();
            let (counts, events) = state.update(line, &tracks);
            all.extend(events.iter().map(|e| (e.event, e.track_id, i)));
            last = counts;
        }
        (
            (
                last.0.get("in").copied().unwrap_or(99),
                last.0.get("out").copied().unwrap_or(99),
            ),
            all,
        )
    }

    #[test]
    fn crossings_each_way_are_counted_exactly() {
        use EventKind::{In, Out};
        let (totals, events) = run(
            &line(),
            &[
                &[(1, 50.0, 80.0, false), (2, 150.0, 130.0, false)],
                &[(1, 50.0, 120.0, false), (2, 150.0, 70.0, false)],
                &[(1, 50.0, 140.0, false), (2, 150.0, 60.0, false)],
                &[(1, 50.0, 90.0, false)],
            ],
        );
        assert_eq!(totals, (1, 2));
        assert_eq!(events, vec![(In, 1, 1), (Out, 2, 1), (Out, 1, 3)]);
    }

    #[test]
    fn counts_are_listed_from_the_first_frame() {
        let (totals, events) = run(&line(), &[&[]]);
        assert_eq!(totals, (0, 0));
        assert!(events.is_empty());
    }

    #[test]
    fn crossing_the_extension_of_the_line_is_not_counted() {
        // x 250 is beyond point 2 (x 200): the path crosses y 100 off the segment.
        let (totals, events) = run(
            &line(),
            &[
                &[(1, 250.0, 80.0, false)],
                &[(1, 250.0, 120.0, false)],
                &[(1, -30.0, 120.0, false)],
                &[(1, -30.0, 80.0, false)],
            ],
        );
        assert_eq!(totals, (0, 0), "{events:?}");
    }

    #[test]
    fn jitter_on_the_line_counts_once_per_real_crossing() {
        // Above, then hovering within 2 px of the line either side, then below for good.
        let ys = [
            80.0, 99.0, 101.0, 98.5, 101.5, 99.5, 100.0, 102.0, 120.0, 121.0,
        ];
        let frames: Vec<Vec<(u64, f32, f32, bool)>> =
            ys.iter().map(|&y| vec![(1, 50.0, y, false)]).collect();
        let frames: Vec<&[_]> = frames.iter().map(Vec::as_slice).collect();
        let (totals, events) = run(&line(), &frames);
        assert_eq!(totals, (1, 0));
        assert_eq!(events, vec![(EventKind::In, 1, 8)]);
    }

    #[test]
    fn a_crossing_while_predicted_counts_when_seen_again_on_the_other_side() {
        let (totals, events) = run(
            &line(),
            &[
                &[(1, 50.0, 80.0, false)],
                &[(1, 50.0, 95.0, true)],
                &[(1, 50.0, 110.0, true)],
                &[(1, 50.0, 125.0, false)],
            ],
        );
        assert_eq!(totals, (1, 0));
        assert_eq!(events, vec![(EventKind::In, 1, 3)]);
    }

    #[test]
    fn tracks_of_other_classes_are_not_counted() {
        let mut line = line();
        line.classes = Some(vec!["car".into()]);
        let (totals, _) = run(
            &line,
            &[&[(1, 50.0, 80.0, false)], &[(1, 50.0, 120.0, false)]],
        );
        assert_eq!(totals, (0, 0));
    }

    #[test]
    fn a_track_found_again_under_a_new_id_near_the_line_is_not_counted_twice() {
        use EventKind::In;
        // Track 1 crosses (counted), is lost just past the line and found again as track 2,
        // which hovers near the line and then walks on: one crossing. Track 3 is lost before the
        // line and found again past it as track 4: that crossing happened while unseen, counted
        // once.
        let frames: &[&[(u64, f32, f32, bool)]] = &[
            &[(1, 50.0, 80.0, false)],
            &[(1, 50.0, 110.0, false)],
            &[],
            &[(2, 50.0, 95.0, false)],
            &[(2, 50.0, 112.0, false)],
            &[(2, 50.0, 140.0, false)],
            &[(3, 150.0, 80.0, false)],
            &[(3, 150.0, 92.0, false)],
            &[],
            &[(4, 152.0, 110.0, false)],
            &[(4, 152.0, 130.0, false)],
        ];
        let (totals, events) = run(&line(), frames);
        assert_eq!(totals, (2, 0), "{events:?}");
        assert_eq!(events, vec![(In, 1, 1), (In, 4, 9)]);
        // Without the take-over, track 2 is counted again and track 4's crossing is missed.
        let mut off = line();
        off.reid_distance = 0.0;
        assert_eq!(run(&off, frames).1, vec![(In, 1, 1), (In, 2, 4)]);
    }

    #[test]
    fn a_track_back_under_its_id_goes_on_from_its_side() {
        // Lost for two frames (absent from the input) while crossing: counted once, when seen.
        let (totals, events) = run(
            &line(),
            &[
                &[(1, 50.0, 80.0, false)],
                &[],
                &[],
                &[(1, 50.0, 125.0, false)],
                &[(1, 50.0, 135.0, false)],
            ],
        );
        assert_eq!(totals, (1, 0));
        assert_eq!(events, vec![(EventKind::In, 1, 3)]);
    }
}
