//! The page (`/` and `/assets/...`: files built into the binary from `web/`, no build step and
//! nothing fetched from elsewhere) and the JSON of `/api/sources` and `/api/health`.
//!
//! Every URL the page uses is relative (`api/events`, `assets/app.js`), so it works as well
//! behind a reverse proxy under a sub-path (`https://host/cameras/`) as at `/`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use super::Live;
use crate::daemon::live::Parts;

/// The page's files: name, content type, bytes. uPlot (MIT, see `uPlot.LICENSE`) is vendored
/// at the version in `web/VENDORED`.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("web/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("web/app.css"),
    ),
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("web/uPlot.iife.min.js"),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("web/uPlot.min.css"),
    ),
    (
        "uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_bytes!("web/uPlot.LICENSE"),
    ),
];

/// The page itself.
pub(super) const INDEX: &[u8] = include_bytes!("web/index.html");

/// `/assets/NAME`: its content type and bytes.
pub(super) fn asset(name: &str) -> Option<(&'static str, &'static [u8])> {
    ASSETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, kind, bytes)| (*kind, *bytes))
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}
/// `/api/sources`: each source, its state and counters, and whether it has a preview (what
/// `/stats.json` says of it).
pub(super) fn sources(live: &Live) -> serde_json::Value {
    run(live)["sources"].take()
}

/// What `/stats.json` says.
fn run(live: &Live) -> serde_json::Value {
    serde_json::from_slice(&super::metrics::json(live)).unwrap_or_default()
}

/// `/api/health`: the run (what `/stats.json` says), the storage's last report and the event
/// store's and the live feed's counters.
pub(super) fn health(live: &Live, parts: &Parts) -> serde_json::Value {
    let run = run(live);
    let events = parts.events.as_ref().map(|e| {
        json!({
            "path": e.path,
            "events": get(&e.counters.events),
            "dropped": get(&e.counters.dropped),
            "errors": get(&e.counters.errors),
            "reopened": get(&e.counters.reopened),
        })
    });
    json!({
        "run": run,
        "storage": parts.storage.as_ref().map(|s| json!(*s.snapshot())),
        "events": events,
        "live_dropped": get(&live.feed.dropped),
    })
}
