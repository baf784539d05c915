//! What triggers a `snapshot` or `clip` (a sink with `when` inputs): a `when` value that is
//! not empty, and, when the sink says `events = [...]`, a value of events only when it holds
//! an event of one of those kinds, so that a sink can write files for loitering or speeding
//! alone out of a `zone_count`'s events.

use toml::Spanned;

use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, SinkInput};
use crate::value::{BBox, EventKind, Value};

/// The `events` parameter of the sinks a `when` triggers.
pub(in crate::sinks) const WHEN_EVENTS_DOC: ParamDoc = ParamDoc {
    name: "events",
    ty: "list of strings",
    default: "all",
    doc: "event kinds that trigger (\"enter\", \"leave\", \"in\", \"out\", \"ended\", \"loiter\", \"speeding\"): a when value of events triggers only when it holds one of them; other when values (detections, tracks) trigger when not empty",
};

/// What triggers a `snapshot` or `clip`: its `when` inputs, and the kinds of events among
/// them that do (`events`; all when not given).
#[derive(Debug, Clone, Default)]
pub(in crate::sinks) struct When {
    refs: Vec<crate::spec::Ref>,
    events: Option<Vec<EventKind>>,
}

impl When {
    /// The `when` inputs of `inputs`, triggering on `events`.
    pub(in crate::sinks) fn new(inputs: &[SinkInput], events: Option<Vec<EventKind>>) -> Self {
        let refs = inputs.iter().filter(|i| i.port == "when").map(|i| i.from);
        Self {
            refs: refs.collect(),
            events,
        }
    }

    /// Whether there are `when` inputs at all.
    pub(in crate::sinks) fn given(&self) -> bool {
        !self.refs.is_empty()
    }

    /// Whether this frame triggers: a `when` value that is not empty and, if it is events and
    /// `events` was given, that holds one of those kinds.
    pub(in crate::sinks) fn triggered(&self, result: &FrameResult) -> bool {
        self.refs
            .iter()
            .any(|r| match (result.value(*r), &self.events) {
                (Some(Value::Events(list)), Some(kinds)) => {
                    list.iter().any(|e| kinds.contains(&e.event))
                }
                (Some(v), _) => !v.is_empty(),
                (None, _) => false,
            })
    }

    /// The tracks this frame's `when` values name (in their events, or tracks themselves),
    /// each with its box on the frame: the objects a crop of the frame may show. A track that
    /// ended is none (its box is where it was last seen).
    pub(in crate::sinks) fn objects(&self, result: &FrameResult) -> Vec<(u64, BBox)> {
        let mut objects = Vec::new();
        for r in &self.refs {
            match result.value(*r) {
                Some(Value::Events(list)) => objects.extend(
                    list.iter()
                        .filter(|e| e.event != EventKind::Ended)
                        .map(|e| (e.track_id, e.bbox)),
                ),
                Some(Value::Tracks(list)) => {
                    objects.extend(list.iter().map(|t| (t.track_id, t.detection.bbox)));
                }
                _ => {}
            }
        }
        objects
    }

    /// Checks `events` as written: each the name of an event kind.
    pub(in crate::sinks) fn parse_events(
        events: Option<Spanned<Vec<Spanned<String>>>>,
    ) -> Result<Option<Vec<EventKind>>, Diagnostic> {
        let Some(events) = events else {
            return Ok(None);
        };
        if events.get_ref().is_empty() {
            return Err(Diagnostic::at(
                events.span(),
                "events needs at least one event kind (leave it out for all)",
            ));
        }
        let kind = |name: &Spanned<String>| {
            EventKind::ALL
                .into_iter()
                .find(|k| k.name() == name.get_ref())
                .ok_or_else(|| {
                    let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
                    Diagnostic::at(
                        name.span(),
                        format!(
                            "unknown event kind \"{}\"; known: {}",
                            name.get_ref(),
                            known.join(", ")
                        ),
                    )
                })
        };
        events
            .get_ref()
            .iter()
            .map(kind)
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Params;

    #[derive(Debug, serde::Deserialize)]
    struct Events {
        events: Option<Spanned<Vec<Spanned<String>>>>,
    }

    fn parse(text: &str) -> Result<Option<Vec<EventKind>>, String> {
        let e: Events = Params::from_toml(text).parse().unwrap();
        When::parse_events(e.events).map_err(|d| d.message)
    }

    /// A frame whose step 0 gave `events` (output 0) and `detections` (output 1).
    fn result(events: &[EventKind], detections: usize) -> FrameResult {
        use crate::outcome::{FrameRecord, Outcome};
        use crate::value::{BBox, Detection, Event};
        use std::sync::Arc;
        let mat = opencv::core::Mat::default();
        let frame = crate::frame::Frame::from_mat("cam".into(), 0, None, mat);
        let record = FrameRecord::new(Arc::new(frame), 1);
        let bbox = BBox {
            x: 0.0,
            y: 0.0,
            width: 1.0,
            height: 1.0,
        };
        let events: Vec<Event> = events
            .iter()
            .map(|k| Event::new(*k, 1, "person".into(), "door".into(), bbox))
            .collect();
        let found = vec![Detection::new("person".into(), 0.9, bbox); detections];
        let values = vec![
            Value::Events(events.into()),
            Value::Detections(found.into()),
        ];
        record.set_outcome(0, Outcome::Done(values));
        FrameResult::new(Arc::new(record))
    }

    fn when(outputs: &[usize], events: Option<Vec<EventKind>>) -> When {
        let inputs: Vec<SinkInput> = outputs
            .iter()
            .map(|&output| SinkInput {
                port: "when",
                label: String::new(),
                from: crate::spec::Ref::Step { step: 0, output },
            })
            .collect();
        When::new(&inputs, events)
    }

    #[test]
    fn events_of_the_kinds_named_trigger_and_other_values_as_before() {
        use EventKind::{Enter, Loiter, Speeding};
        let loiter = || Some(vec![Loiter]);
        // All kinds trigger without `events`; with it, only those named.
        assert!(when(&[0], None).triggered(&result(&[Enter], 0)));
        assert!(!when(&[0], loiter()).triggered(&result(&[Enter], 0)));
        assert!(when(&[0], loiter()).triggered(&result(&[Enter, Loiter], 0)));
        assert!(!when(&[0], loiter()).triggered(&result(&[Speeding], 0)));
        assert!(!when(&[0], None).triggered(&result(&[], 0)));
        // Detections are no events: not empty, they trigger whatever `events` says.
        assert!(when(&[0, 1], loiter()).triggered(&result(&[Enter], 2)));
        assert!(!when(&[0, 1], loiter()).triggered(&result(&[Enter], 0)));
    }

    #[test]
    fn events_names_kinds_and_refuses_an_unknown_one() {
        assert_eq!(parse(""), Ok(None));
        assert_eq!(
            parse("events = [\"loiter\", \"speeding\"]"),
            Ok(Some(vec![EventKind::Loiter, EventKind::Speeding]))
        );
        let e = parse("events = [\"loiter\", \"loitering\"]").unwrap_err();
        assert!(
            e.starts_with("unknown event kind \"loitering\"; known: enter, leave"),
            "{e}"
        );
        assert!(parse("events = []").is_err());
    }
}
