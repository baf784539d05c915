//! `[events]`: where the event store keeps its database, and how long its rows stay.

use std::time::Duration;

use super::raw::RawEvents;
use crate::events::{DEFAULT_RETAIN, EventsConfig};
use crate::spec::Diagnostic;

/// The longest `retain_days`: a hundred years.
const MAX_DAYS: f64 = 36_525.0;

pub(super) fn resolve_events(raw: &RawEvents, diags: &mut Vec<Diagnostic>) -> Option<EventsConfig> {
    let path = raw.path.get_ref();
    if path.as_os_str().is_empty() || path.to_string_lossy().ends_with('/') {
        diags.push(Diagnostic::at(
            raw.path.span(),
            format!(
                "events: path must name a database file, e.g. \"events.db\", not \"{}\"",
                path.display()
            ),
        ));
        return None;
    }
    let retain = match &raw.retain_days {
        None => DEFAULT_RETAIN,
        Some(d) if *d.get_ref() > 0.0 && *d.get_ref() <= MAX_DAYS => {
            Duration::from_secs_f64(d.get_ref() * 86_400.0)
        }
        Some(d) => {
            diags.push(Diagnostic::at(
                d.span(),
                format!(
                    "events: retain_days must be more than 0 and at most {MAX_DAYS}, not {}",
                    d.get_ref()
                ),
            ));
            return None;
        }
    };
    Some(EventsConfig {
        path: path.clone(),
        retain,
    })
}
