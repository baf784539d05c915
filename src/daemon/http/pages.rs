//! The page (`/` and `/assets/...`: files built into the binary from `web/`, no build step and
//! nothing fetched from elsewhere) and the JSON of `/api/sources` and `/api/health`.
//!
//! Every URL the page uses is relative (`api/events`, `assets/app.js`), so it works as well
//! behind a reverse proxy under a sub-path (`https://host/cameras/`) as at `/`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use super::Live;
use crate::daemon::live::{LiveSource, Parts};
use crate::source::SourceCounters;

/// The page's files: name, content type, bytes. uPlot (MIT, see `uPlot.LICENSE`) is vendored
/// at the version in `web/VENDORED`.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("web/app.js"),
    ),
    (
        "live.js",
        "text/javascript; charset=utf-8",
        include_bytes!("web/live.js"),
    ),
    (
        "video.js",
        "text/javascript; charset=utf-8",
        include_bytes!("web/video.js"),
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
/// `/stats.json` says of it), with its last error and its record stream's state.
pub(super) fn sources(live: &Live) -> serde_json::Value {
    run(live)["sources"].take()
}

/// What `/stats.json` says, and each source's last error, record stream and camera clock skew
/// (`clock_skew_s`: the camera's clock minus this computer's at its latest RTCP sender report,
/// null for a source that sends none; past 2 s its events are placed by their arrival,
/// `events/time.rs`).
fn run(live: &Live) -> serde_json::Value {
    let mut run: serde_json::Value =
        serde_json::from_slice(&super::metrics::json(live)).unwrap_or_default();
    let parts = live.parts();
    if let Some(list) = run["sources"].as_array_mut() {
        for shown in list {
            let found = parts.sources.iter().find(|s| shown["name"] == *s.name);
            if let (Some(source), Some(map)) = (found, shown.as_object_mut()) {
                map.insert("last_error".into(), last_error(&source.counters));
                map.insert("clock_skew_s".into(), json!(source.counters.clock_skew_s()));
                map.insert("record".into(), record_stream(source));
                map.insert("video".into(), video(&source.name));
            }
        }
    }
    run
}

/// `{"message", "at"}` (ms since 1970) of the source's last loss, or null. Redacted where it
/// is kept (`source::LastError`).
fn last_error(counters: &SourceCounters) -> serde_json::Value {
    counters.last_error().map_or(
        serde_json::Value::Null,
        |e| json!({"message": e.message, "at": crate::events::millis(e.at)}),
    )
}

/// The source's record stream (`record_uri`, else `uri`), which is lost and regained apart from
/// the decoded one: its state, reconnections, packets and last error; null when nothing
/// records the source.
fn record_stream(source: &LiveSource) -> serde_json::Value {
    source.record.as_ref().map_or(serde_json::Value::Null, |r| {
        json!({
            "state": r.state().name(),
            "reconnects": get(&r.reconnects),
            "packets": get(&r.decoded),
            "last_error": last_error(r),
        })
    })
}

/// Whether the source plays as live video (`/api/video/SOURCE`): `available` true (its
/// stream is H.264 or H.265, whether a browser plays it the browser says; or it has neither
/// and its frames are encoded to H.264 while watched: `encoded` true), false (with `why` not),
/// or null while not known (the source has not reached its decoder); its `viewers` now,
/// `bytes_sent` to them, `queued_bytes` waiting for them now (summed over them; each viewer's
/// bounded), `skips` (a viewer that fell behind, moved to the next keyframe), the `gop_bytes`
/// kept for a new viewer, and its `encoder`: `running` (0 or 1), frames `encoded`, and frames
/// `dropped` for the video (the encoder behind).
fn video(source: &str) -> serde_json::Value {
    use crate::packets::video::Status;
    let v = crate::packets::hub().video(source);
    let status = v.status();
    let (available, why) = match &status {
        Status::Playable(_) | Status::Encodable => (json!(true), serde_json::Value::Null),
        Status::Stills => (
            json!(false),
            json!("stills were chosen (live_video = \"stills\")"),
        ),
        Status::Not(why) => (json!(false), json!(why)),
        Status::Waiting => (
            serde_json::Value::Null,
            json!("not known yet: the source has not reached its decoder"),
        ),
    };
    json!({
        "available": available,
        "why": why,
        "viewers": get(&v.viewers),
        "bytes_sent": get(&v.bytes_sent),
        "queued_bytes": get(&v.queued_bytes),
        "skips": get(&v.skips),
        "gop_bytes": v.gop_bytes(),
        "encoded": status == Status::Encodable,
        "encoder": {
            "running": get(&v.encoders),
            "encoded": get(&v.encoded),
            "dropped": get(&v.encode_dropped),
        },
    })
}

/// `/api/health`: the run (what `/stats.json` says), the storage's last report and the event
/// store's and the live stream's counters (`live_dropped`: frames it did not carry; under
/// `live`, its `clients`, `slow_clients` closed for reading too slowly, `stills_dropped`
/// replaced before a client took them, and whether its thread runs `below_frames`).
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
        "live": {
            "clients": live.feed.listeners(),
            "max_clients": live.feed.max_clients.load(std::sync::atomic::Ordering::Relaxed),
            "refused": get(&live.feed.refused),
            "slow_clients": get(&live.feed.slow_clients),
            "stills_dropped": get(&live.feed.stills_dropped),
            "below_frames": live.feed.below_frames(),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn source(name: &str, skew_ns: Option<i64>) -> LiveSource {
        let counters = SourceCounters::default();
        if let Some(ns) = skew_ns {
            counters.set_clock_skew(ns);
        }
        LiveSource {
            name: name.into(),
            live: true,
            file: false,
            counters: Arc::new(counters),
            record: None,
            stall_timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn health_gives_each_cameras_clock_skew_and_null_without_sender_reports() {
        let live = Live::new();
        live.set_parts(Parts {
            sources: vec![source("fast", Some(180_250_000_000)), source("file", None)],
            ..Parts::default()
        });
        let health = health(&live, &live.parts());
        let skew = |name: &str| {
            let sources = health["run"]["sources"].as_array().expect("sources");
            let found = sources.iter().find(|s| s["name"] == name);
            found.expect("the source")["clock_skew_s"].clone()
        };
        assert_eq!(skew("fast"), json!(180.25), "{health}");
        assert!(skew("file").is_null(), "{health}");
    }
}
