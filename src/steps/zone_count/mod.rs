//! `zone_count`: how many tracked objects are inside each zone, who entered or left, how long
//! each has been inside, and who stayed too long (`loiter`) or went too fast (`speeding`).
//!
//! A track's position is judged only on frames where it was seen (`predicted: false`); while
//! the tracker only predicts it, it stays where it was last seen (inside or not), so a short
//! occlusion never reads as a leave and a re-enter. A track absent from the input (the tracker
//! missed it: with its default `report_lost = 0` a single missed detection does that) is
//! remembered for `reid_frames` frames, still inside the zones it was in and counted there: back
//! under its ID it goes on from there, and a *new* ID of the same class first seen within
//! `reid_distance` pixels of where it was last seen takes its place (the tracker found it again
//! under another ID), so neither says leave and enter again. A track absent for longer is gone:
//! it leaves every zone it was in, on that frame, with the box it was last seen with. The
//! hysteresis is `line_counter`'s (`common::reid`).
//!
//! A visit (from an enter to its leave) is one object in one zone, whatever IDs the tracker gave
//! it meanwhile: its `enter`, `loiter`, `speeding` and `leave` all carry the track ID it entered
//! under. Times are frame time (`Frame::stream_time_s`), never the time of processing: the
//! `leave` carries `dwell_s`, from the enter to the last frame it was seen inside (for a track
//! that ended, to when it was last seen); the `tracks` output is the input tracks, each with
//! `dwell_s` {zone: seconds since its enter} for the zones it is inside now. A zone with a
//! `loiter_s` says `loiter` once per visit, on the first frame its time inside is more than
//! that; one with a speed limit says `speeding` once per visit, on the first frame the track
//! is seen inside going faster (`max_speed_kmh` against speeds in km/h, given by the tracker on
//! a calibrated source; `max_speed_px_s` against speeds in pixels a second). A limit in a unit
//! the source's speeds never come in can never fire: that is said once per source.
//!
//! Stateful: one state per source ([`PerSource`]), frames in order.

use std::sync::Arc;

use super::common::geometry::{ANCHOR_DOC, Anchor, CLASSES_DOC, Polygon, stay_in_pixels};
use super::common::per_source::PerSource;
use super::common::reid::{REID_DISTANCE_DOC, REID_FRAMES_DOC, Reid};
use super::{Port, Shape, Step, StepError, StepInput, StepKind, StepOutput};
use crate::frame::Format;
use crate::spec::{Diagnostic, Params};
use crate::value::{Track, Value, ValueType};

mod config;
mod state;
#[cfg(test)]
mod tests;

use config::{Config, LOITER_S_DOC, MAX_SPEED_KMH_DOC, MAX_SPEED_PX_S_DOC, ZONES_DOC};
use state::ZoneState;

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

const OUTPUTS: &[Port] = &[
    COUNTS_EVENTS_OUT[0],
    COUNTS_EVENTS_OUT[1],
    Port {
        name: "tracks",
        ty: ValueType::Tracks,
        optional: false,
    },
];

pub(super) static KIND: StepKind = StepKind {
    name: "zone_count",
    summary: "objects inside each zone now, enter/leave events with the time inside, loitering and speeding (state per source)",
    inputs: TRACKS_IN,
    outputs: OUTPUTS,
    params: &[
        ZONES_DOC,
        LOITER_S_DOC,
        MAX_SPEED_KMH_DOC,
        MAX_SPEED_PX_S_DOC,
        CLASSES_DOC,
        ANCHOR_DOC,
        REID_DISTANCE_DOC,
        REID_FRAMES_DOC,
    ],
    stateful: true,
    build,
};

#[derive(Debug)]
struct ZoneCount {
    zones: Zones,
    states: PerSource<ZoneState>,
}

/// The zones, in name order, and what is counted.
#[derive(Debug)]
struct Zones {
    zones: Vec<Zone>,
    classes: Option<Vec<Arc<str>>>,
    anchor: Anchor,
    reid: Reid,
}

#[derive(Debug)]
struct Zone {
    name: Arc<str>,
    polygon: Polygon,
    limits: Limits,
}

/// What a visit of a zone is held to (none: no `loiter` or `speeding` events).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Limits {
    /// Seconds inside after which a visit says `loiter`.
    loiter_s: Option<f64>,
    /// Speed limits, each for speeds in its unit.
    max_kmh: Option<f32>,
    max_px_s: Option<f32>,
}

fn build(params: Params<'_>) -> Result<Box<dyn Step>, Diagnostic> {
    let c: Config = params.parse()?;
    Ok(Box::new(ZoneCount {
        zones: c.resolve()?,
        states: PerSource::default(),
    }))
}

impl Step for ZoneCount {
    fn run(&self, input: &StepInput<'_>) -> Result<StepOutput, StepError> {
        let tracks = input.get::<[Track]>(0)?;
        let now = input.frame.stream_time_s();
        let picture = (input.frame.width(), input.frame.height());
        let out = self.states.with(&input.frame.source, |state| {
            state.picture = Some(picture);
            state.update(&self.zones, tracks, now)
        });
        if let Some(why) = out.never_fires {
            tracing::warn!(source = %input.frame.source, "zone_count: {why}");
        }
        Ok(StepOutput::Values(vec![
            Value::Counts(Arc::new(out.counts)),
            Value::Events(out.events.into()),
            Value::Tracks(out.tracks.into()),
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
        self.zones
            .zones
            .iter()
            .map(|zone| Shape {
                name: zone.name.clone(),
                zone: true,
                points: zone.polygon.points().to_vec(),
            })
            .collect()
    }
}
