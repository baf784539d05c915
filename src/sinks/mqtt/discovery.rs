//! Home Assistant MQTT discovery for the `mqtt` sink (`discovery = true`): every count an
//! included value holds (a `zone_count`'s zones, a `line_counter`'s in and out) becomes a
//! sensor, announced by a retained config on `PREFIX/sensor/NODE/OBJECT/config`. The sensor
//! reads the sink's own messages (its state topic is the frame's topic, a value template picks
//! the count), and is available while the daemon is: the availability topic holds `online`
//! (retained) while connected and `offline`, the connection's last will, after.
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
use crate::value::Value;

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
                let config = json!({
                    "name": format!("{} {name}", input.label),
                    "unique_id": unique,
                    "object_id": format!("vidflow_{}", sensor.object),
                    "state_topic": state_topic,
                    "value_template": template,
                    "state_class": "measurement",
                    "availability_topic": self.availability,
                    "payload_available": ONLINE,
                    "payload_not_available": OFFLINE,
                    "device": {
                        "identifiers": [format!("vidflow_{}_{}", self.node, id_part(source))],
                        "name": format!("vidflow {source} ({})", self.node),
                        "manufacturer": "vidflow",
                    },
                });
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
