//! What a pipeline file's components say, as written: a reload compares these to keep what did
//! not change.

use std::collections::BTreeMap;

/// The `[steps.NAME]` and `[sinks.NAME]` tables of a pipeline file as written (spans and
/// comments aside): two components with equal tables mean the same thing, so a reload keeps
/// the running one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Written {
    pub steps: BTreeMap<String, toml::Value>,
    pub sinks: BTreeMap<String, toml::Value>,
}

impl Written {
    /// The tables of `text`, a pipeline file that parsed (empty if it does not).
    pub(super) fn of(text: &str) -> Self {
        let Ok(mut doc) = text.parse::<toml::Table>() else {
            return Self::default();
        };
        let mut section = |name: &str| match doc.remove(name) {
            Some(toml::Value::Table(t)) => t.into_iter().collect(),
            _ => BTreeMap::new(),
        };
        Self {
            steps: section("steps"),
            sinks: section("sinks"),
        }
    }
}
