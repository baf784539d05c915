//! Home Assistant MQTT discovery for the `mqtt` sink (`discovery = true`): every count an
//! included value holds (a `zone_count`'s zones, a `line_counter`'s in and out) becomes a
//! sensor, announced by a retained config on `PREFIX/sensor/NODE/OBJECT/config`; every zone or
//! line an included events value speaks of becomes an event entity (`PREFIX/event/...`) whose
//! event types are enter, leave, in, out, loiter and speeding, so that an automation can
//! trigger on someone loitering in a zone or speeding through it. Both read the sink's own
//! messages (their state topic is the frame's topic; a value template picks the count, or the
//! frame's first event of that place with its `event_type`, and renders nothing for a frame
//! without one, which Home Assistant ignores), and are available while the daemon is: the
//! availability topic holds `online` (retained) while connected and `offline`, the
//! connection's last will, after.
//!
//! Ids. Home Assistant's ids and MQTT topic levels take ASCII letters, digits, `_` and `-`, so a
//! count's source, input and name are written with `_` for anything else; `car park` and
//! `car_park` would then be one id, and the second sensor's retained config would replace the
//! first's. So every sensor's `unique_id` and config topic end in 8 hex digits of the SHA-256 of
//! its exact source, input and name ([`Sensor`]): the same count gets the same id at every start
//! and in any order, two counts never share one. The `object_id` (what Home Assistant makes the
//! entity's name from) stays readable; Home Assistant itself tells apart two that are alike.
//!
//! No thread of its own: called by the sink's thread (finding new sensors) and its event loop
//! thread (announcing them again after each connect), under the backlog's lock.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::outcome::FrameResult;
use crate::spec::SinkInput;
use crate::value::{EventKind, Value};

/// What the availability topic holds while the daemon is connected, and after.
pub(super) const ONLINE: &str = "online";
pub(super) const OFFLINE: &str = "offline";

/// The announcements of one sink.
#[derive(Debug)]
pub(super) struct Discovery {
    prefix: String,
    /// The host name, as Home Assistant's ids allow it.
    node: String,
    sink: String,
    pub(super) availability: String,
    /// (source, input label, count name) of every sensor announced.
    known: BTreeSet<(Arc<str>, String, Arc<str>)>,
    /// Every retained config: (topic, payload), in the order found.
    pub(super) configs: Vec<(String, Vec<u8>)>,
}

/// `text` with everything but ASCII letters, digits, `_` and `-` as `_` (ids and topic levels).
fn id_part(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The ids of one sensor (see the module header).
#[derive(Debug, PartialEq, Eq)]
struct Sensor {
    /// Readable: source, input and name, written as an id.
    object: String,
    /// `object` and the hash of the exact source, input and name: unique.
    unique: String,
}

impl Sensor {
    fn new(source: &str, label: &str, name: &str) -> Self {
        let object = id_part(&format!("{source}_{label}_{name}"));
        let mut hash = Sha256::new();
        for part in [source, label, name] {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        let digest = hash.finalize();
        let tag: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        Self {
            unique: format!("{object}_{tag}"),
            object,
        }
    }
}

impl Discovery {
    pub(super) fn new(prefix: &str, host: &str, sink: &str) -> Self {
        let node = id_part(host);
        Self {
            prefix: prefix.to_owned(),
            availability: format!("vidflow/{node}/{sink}/availability"),
            node,
            sink: sink.to_owned(),
            known: BTreeSet::new(),
            configs: Vec::new(),
        }
    }

    /// Announces the sensors this frame shows for the first time; returns how many (they are
    /// the last of [`Discovery::configs`]). `state_topic` is where the frame's message goes.
    pub(super) fn find(
        &mut self,
        result: &FrameResult,
        inputs: &[SinkInput],
        state_topic: &str,
    ) -> usize {
        let source = &result.frame().source;
        let before = self.configs.len();
        for input in inputs {
            if let Some(Value::Events(events)) = result.value(input.from) {
                for e in events.iter().filter(|e| e.event != EventKind::Ended) {
                    self.announce_events(source, &input.label, &e.place, state_topic);
                }
                continue;
            }
            let Some(Value::Counts(counts)) = result.value(input.from) else {
                continue;
            };
            for name in counts.0.keys() {
                let key = (source.clone(), input.label.clone(), name.clone());
                if self.known.contains(&key) {
                    continue;
                }
                let sensor = Sensor::new(source, &input.label, name);
                let unique = format!("vidflow_{}_{}_{}", self.node, self.sink, sensor.unique);
                // JSON string literals are valid Jinja string literals: any label or name.
                let template = format!(
                    "{{{{ value_json[{}][{}] }}}}",
                    json!(input.label),
                    json!(&**name)
                );
                let mut config = self.entity(source, &sensor, state_topic);
                config["name"] = json!(format!("{} {name}", input.label));
                config["unique_id"] = json!(unique);
                config["value_template"] = json!(template);
                config["state_class"] = json!("measurement");
                let topic = format!(
                    "{}/sensor/vidflow_{}/{}/config",
                    self.prefix, self.node, sensor.unique
                );
                self.configs.push((topic, config.to_string().into_bytes()));
                self.known.insert(key);
            }
        }
        self.configs.len() - before
    }

    /// What every entity's config says: its object id, state topic, availability and device.
    fn entity(&self, source: &str, ids: &Sensor, state_topic: &str) -> serde_json::Value {
        json!({
            "object_id": format!("vidflow_{}", ids.object),
            "state_topic": state_topic,
            "availability_topic": self.availability,
            "payload_available": ONLINE,
            "payload_not_available": OFFLINE,
            "device": {
                "identifiers": [format!("vidflow_{}_{}", self.node, id_part(source))],
                "name": format!("vidflow {source} ({})", self.node),
                "manufacturer": "vidflow",
            },
        })
    }

    /// Announces the event entity of `place` (a zone or line) of the events input `label`, once.
    fn announce_events(
        &mut self,
        source: &Arc<str>,
        label: &str,
        place: &Arc<str>,
        state_topic: &str,
    ) {
        // "events" in the key keeps it apart from a count of the same name.
        let key = (source.clone(), format!("{label}\u{0}events"), place.clone());
        if self.known.contains(&key) {
            return;
        }
        let ids = Sensor::new(source, &format!("{label} events"), place);
        let unique = format!("vidflow_{}_{}_{}", self.node, self.sink, ids.unique);
        // The frame's first event of this place, as the event entity takes it (its kind as
        // `event_type`, the rest as attributes); nothing on a frame without one.
        let template = format!(
            "{{% set es = value_json[{}] | selectattr('place', 'eq', {}) | list %}}\
             {{% if es %}}{{{{ dict(es[0], event_type=es[0].event) | tojson }}}}{{% endif %}}",
            json!(label),
            json!(&**place)
        );
        let types: Vec<&str> = EventKind::ALL
            .iter()
            .filter(|k| **k != EventKind::Ended)
            .map(|k| k.name())
            .collect();
        let mut config = self.entity(source, &ids, state_topic);
        config["name"] = json!(format!("{place} events"));
        config["unique_id"] = json!(unique);
        config["value_template"] = json!(template);
        config["event_types"] = json!(types);
        let topic = format!(
            "{}/event/vidflow_{}/{}/config",
            self.prefix, self.node, ids.unique
        );
        self.configs.push((topic, config.to_string().into_bytes()));
        self.known.insert(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SinkInput;

    #[test]
    fn each_zone_an_events_value_speaks_of_is_one_event_entity_of_every_kind() {
        use crate::outcome::{FrameRecord, Outcome};
        use crate::value::{BBox, Event};
        let frame = crate::frame::Frame::from_mat("cam".into(), 7, None, Default::default());
        let record = FrameRecord::new(Arc::new(frame), 1);
        let bbox = BBox {
            x: 1.0,
            y: 2.0,
            width: 3.0,
            height: 4.0,
        };
        let event = |kind, place: &str| Event::new(kind, 5, "person".into(), place.into(), bbox);
        let events = vec![
            event(EventKind::Loiter, "queue"),
            event(EventKind::Enter, "queue"),
            event(EventKind::Speeding, "road"),
            event(EventKind::Ended, "resize"),
        ];
        record.set_outcome(0, Outcome::Done(vec![Value::Events(events.into())]));
        let result = FrameResult::new(Arc::new(record));
        let inputs = [SinkInput {
            port: "include",
            label: "steps.zones.events".into(),
            from: crate::spec::Ref::Step { step: 0, output: 0 },
        }];
        let mut d = Discovery::new("homeassistant", "box", "ha");
        // One entity per place (an ended track's "resize" is no place), announced once.
        assert_eq!(d.find(&result, &inputs, "vidflow/cam/ha"), 2);
        assert_eq!(d.find(&result, &inputs, "vidflow/cam/ha"), 0);
        let (topic, payload) = &d.configs[0];
        assert!(
            topic.starts_with(
                "homeassistant/event/vidflow_box/cam_steps_zones_events_events_queue_"
            ),
            "{topic}"
        );
        let config: serde_json::Value = serde_json::from_slice(payload).unwrap();
        assert_eq!(
            config["event_types"],
            json!(["enter", "leave", "in", "out", "loiter", "speeding"])
        );
        assert_eq!(config["state_topic"], "vidflow/cam/ha");
        assert_eq!(config["availability_topic"], d.availability.as_str());
        assert_eq!(
            config["value_template"],
            "{% set es = value_json[\"steps.zones.events\"] | selectattr('place', 'eq', \"queue\") | list %}\
             {% if es %}{{ dict(es[0], event_type=es[0].event) | tojson }}{% endif %}"
        );
    }

    #[test]
    fn ids_keep_only_what_home_assistant_takes() {
        assert_eq!(
            id_part("cam-1_steps.zones.counts_car park"),
            "cam-1_steps_zones_counts_car_park"
        );
    }

    #[test]
    fn counts_whose_names_write_as_one_id_are_two_sensors_with_stable_ids() {
        let label = "steps.zones.counts";
        let pairs = [
            (("cam", label, "car park"), ("cam", label, "car_park")),
            (("cam", label, "car.park"), ("cam", label, "car/park")),
            // The separator itself: source "a_b" with "c", source "a" with "b_c".
            (("a_b", "c", "n"), ("a", "b_c", "n")),
            (("cam", label, "café"), ("cam", label, "caf_")),
        ];
        for (a, b) in pairs {
            let (one, two) = (Sensor::new(a.0, a.1, a.2), Sensor::new(b.0, b.1, b.2));
            assert_eq!(one.object, two.object, "{a:?} {b:?}");
            assert_ne!(one.unique, two.unique, "{a:?} {b:?}");
            assert_eq!(id_part(&one.unique), one.unique);
            // The same count, the same id: at every start, whatever came first.
            assert_eq!(Sensor::new(a.0, a.1, a.2), one);
        }
        // Pinned: a change of the hash would give every user's sensors new ids.
        // printf 'cam\0steps.zones.counts\0car park\0' | sha256sum | cut -c1-8
        assert_eq!(
            Sensor::new("cam", label, "car park").unique,
            "cam_steps_zones_counts_car_park_40eee9b2"
        );
    }
}
