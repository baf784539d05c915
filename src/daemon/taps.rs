//! What the executor's delivery callback hands, besides the sinks, from each result: its facts
//! to the event store (`events`) and its boxes and counts to the live feed (`feed.rs`). Both
//! are a few `Arc` clones and a `try_send`: nothing here waits. Built per graph (a reload's
//! graph gets its own, with the same store).

use std::sync::Arc;

use super::Live;
use super::feed::LiveFrame;
use crate::events::{EventStore, Output, Tap};
use crate::outcome::FrameResult;
use crate::spec::{Ref, SinkInput};
use crate::steps::{Place, Placement, Shape};
use crate::value::{Value, ValueType};
use crate::workflow::Graph;

#[derive(Debug)]
pub(super) struct Taps {
    store: Option<EventStore>,
    live: Arc<Live>,
    /// What the store reads.
    outputs: Vec<Output>,
    /// What the live feed shows: trackers' tracks, or detections when there is no tracker, and
    /// counts.
    /// Each with how the image its boxes were found in lies on the frame
    /// (`Graph::placements`): the feed gives boxes and shapes in the frame's pixels.
    tracks: Vec<(Ref, Vec<Placement>)>,
    detections: Vec<(Ref, Vec<Placement>)>,
    counts: Vec<(Arc<str>, Ref)>,
    /// The lines and zones of the steps that have some, with the step's first output: shown
    /// with a frame the step ran on.
    shapes: Vec<Shapes>,
}

/// A step's lines and zones, with where the image its boxes were found in lies on the frame.
#[derive(Debug)]
struct Shapes {
    step: Arc<str>,
    /// Its first output: the step ran on a frame that has it.
    at: Ref,
    shapes: Arc<[Shape]>,
    placed: Vec<Placement>,
}

/// A sink's name and its `when` inputs: the events that make it write a file, linked to them.
pub(super) type Triggers = Vec<(Arc<str>, Vec<Ref>)>;

/// The `when` inputs of each sink in `sinks`.
pub(super) fn triggers<'a>(
    sinks: impl IntoIterator<Item = (&'a str, &'a [SinkInput])>,
) -> Triggers {
    sinks
        .into_iter()
        .map(|(name, inputs)| {
            let when = inputs.iter().filter(|i| i.port == "when").map(|i| i.from);
            (name.into(), when.collect())
        })
        .collect()
}

impl Taps {
    /// `sinks`: the run's sinks' triggers ([`triggers`]).
    pub(super) fn new(
        graph: &Graph,
        store: Option<EventStore>,
        live: Arc<Live>,
        sinks: &Triggers,
    ) -> Self {
        let mut taps = Self {
            store,
            live,
            outputs: Vec::new(),
            tracks: Vec::new(),
            detections: Vec::new(),
            counts: Vec::new(),
            shapes: Vec::new(),
        };
        for (step, node) in graph.nodes.iter().enumerate() {
            let shapes = node.step.shapes();
            if !shapes.is_empty() {
                let at = Ref::Step { step, output: 0 };
                taps.shapes.push(Shapes {
                    step: node.name.clone(),
                    at,
                    shapes: shapes.into(),
                    placed: graph.placements(at),
                });
            }
            for (output, port) in node.kind.outputs.iter().enumerate() {
                let at = Ref::Step { step, output };
                let tap = match port.ty {
                    // A tracker's tracks only: `zone_count` passes the same tracks on (with
                    // their time in zone), which would be every track's row and box again.
                    ValueType::Tracks if node.kind.name == "tracker" => {
                        taps.tracks.push((at, graph.placements(at)));
                        Some(Tap::Tracks)
                    }
                    ValueType::Tracks => None,
                    ValueType::Events => Some(Tap::Events),
                    ValueType::Detections if node.kind.name == "motion" => Some(Tap::Motion),
                    ValueType::Detections => {
                        taps.detections.push((at, graph.placements(at)));
                        None
                    }
                    ValueType::Counts => {
                        taps.counts.push((node.name.clone(), at));
                        // A zone_count's counts are objects inside each zone now: occupancy.
                        (node.kind.name == "zone_count").then_some(Tap::Occupancy)
                    }
                    ValueType::Image => None,
                };
                if let Some(tap) = tap {
                    let made_by = sinks.iter().filter(|(_, when)| when.contains(&at));
                    taps.outputs.push(Output {
                        step: node.name.clone(),
                        at,
                        tap,
                        sinks: made_by.map(|(name, _)| name.clone()).collect(),
                        placed: graph.placements(at).into(),
                    });
                }
            }
        }
        if !taps.tracks.is_empty() {
            taps.detections.clear();
        }
        taps
    }

    /// The same store and feed, for a reload's graph and sinks.
    pub(super) fn for_graph(&self, graph: &Graph, sinks: &Triggers) -> Self {
        Self::new(graph, self.store.clone(), self.live.clone(), sinks)
    }

    pub(super) fn store(&self) -> Option<&EventStore> {
        self.store.as_ref()
    }

    /// On the executor's thread, for every delivered result.
    pub(super) fn record(&self, result: &FrameResult) {
        if let Some(store) = &self.store {
            store.record(result, &self.outputs);
        }
        let feed = &self.live.feed;
        if !feed.listening() {
            return;
        }
        let frame = result.frame();
        let (width, height) = (frame.width(), frame.height());
        let values = |refs: &[(Ref, Vec<Placement>)]| {
            refs.iter()
                .filter_map(|(r, chain)| Some((result.value(*r)?, Place::of(chain, width, height))))
                .collect::<Vec<(Value, Place)>>()
        };
        feed.publish(LiveFrame {
            source: frame.source.clone(),
            seq: frame.seq,
            at: frame.captured,
            pts: frame.pts,
            width,
            height,
            tracks: values(&self.tracks)
                .into_iter()
                .filter_map(|(v, place)| match v {
                    Value::Tracks(t) => Some((t, place)),
                    _ => None,
                })
                .collect(),
            detections: values(&self.detections)
                .into_iter()
                .filter_map(|(v, place)| match v {
                    Value::Detections(d) => Some((d, place)),
                    _ => None,
                })
                .collect(),
            counts: self
                .counts
                .iter()
                .filter_map(|(name, r)| match result.value(*r) {
                    Some(Value::Counts(c)) => Some((name.clone(), c)),
                    _ => None,
                })
                .collect(),
            shapes: self
                .shapes
                .iter()
                .filter(|s| result.value(s.at).is_some())
                .map(|s| {
                    let place = Place::of(&s.placed, width, height);
                    (s.step.clone(), s.shapes.clone(), place)
                })
                .collect(),
        });
    }
}
