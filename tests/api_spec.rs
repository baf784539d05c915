//! docs/reference/api.json (OpenAPI 3) against the router's table of routes
//! (`vidflow::daemon::http::routes`, the table dispatch uses): every documented method and path
//! is routed and every routed one documented, each with the same query parameters; and on a real
//! `vidflow` each route answers what the file documents: 200 for a request that names what
//! exists (with each of its parameters), 404 for one that names nothing, 400 for a parameter it
//! does not take, each of them a status the file lists for that route.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{BALL_CROSSINGS, free_port, repo_root, spawn_run, write};
use http_client::{get, open, request, wait_until};

/// Guards against a hang only.
const DEADLINE: Duration = Duration::from_secs(120);

/// (method, path) -> its query parameters.
type Routes = BTreeMap<(String, String), BTreeSet<String>>;

fn spec() -> serde_json::Value {
    let text = std::fs::read_to_string(repo_root().join("docs/reference/api.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn documented(spec: &serde_json::Value) -> Routes {
    let mut routes = Routes::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let params = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect();
            routes.insert((method.to_uppercase(), path.clone()), params);
        }
    }
    routes
}

fn routed() -> Routes {
    vidflow::daemon::http::routes()
        .into_iter()
        .map(|r| {
            let params = r.query.iter().map(|p| (*p).to_owned()).collect();
            ((r.method.to_owned(), r.path.to_owned()), params)
        })
        .collect()
}

/// The statuses the file lists for `path`'s GET.
fn statuses(spec: &serde_json::Value, path: &str) -> BTreeSet<u16> {
    spec["paths"][path]["get"]["responses"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.parse().unwrap())
        .collect()
}

#[test]
fn the_openapi_file_and_the_router_have_the_same_routes_and_parameters() {
    let spec = spec();
    assert_eq!(spec["openapi"], "3.0.3");
    let (documented, routed) = (documented(&spec), routed());
    let undocumented: Vec<_> = routed
        .keys()
        .filter(|r| !documented.contains_key(*r))
        .collect();
    let unrouted: Vec<_> = documented
        .keys()
        .filter(|r| !routed.contains_key(*r))
        .collect();
    assert!(
        undocumented.is_empty(),
        "routed, not in api.json: {undocumented:?}"
    );
    assert!(unrouted.is_empty(), "in api.json, not routed: {unrouted:?}");
    for (route, params) in &routed {
        assert_eq!(&documented[route], params, "{route:?}: query parameters");
    }
}

/// A value each query parameter takes on the run below (`{cursor}`: a page's `next`).
fn value(param: &str) -> &'static str {
    match param {
        "source" => "cam",
        "kind" => "crossing",
        "label" | "place" | "zone" | "line" => "",
        "step" => "crossing",
        "bucket" => "minute",
        "after" => "0",
        "before" => "2026-12-03T09:00:00Z",
        "before_id" => "999999999",
        "limit" => "1",
        "cursor" => "{cursor}",
        "stills" => "1",
        "stills_of" => "cam",
        "frames" => "0",
        "format" => "png",
        "_" => "1733212800000",
        other => panic!("no value for {other}: name one here"),
    }
}

#[test]
fn each_route_answers_a_real_run_with_the_statuses_it_documents() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "test://ball?width=320&height=240&fps=15"
live_video = "stills"

{BALL_CROSSINGS}
[http]
listen = "127.0.0.1:{port}"

[events]
path = "events.db"

[sinks.snapshots]
kind = "snapshot"
image = "$frame"
when = ["$steps.crossing.events"]
dir = "snapshots"
cooldown_s = 0.0

[sinks.clips]
kind = "clip"
image = "$frame"
when = ["$steps.crossing.events"]
dir = "clips"
pre_roll_s = 0.5
post_roll_s = 0.5

[sinks.rec]
kind = "video_file"
path = "rec/{{source}}.mkv"
image = "$frame"
segment_seconds = 1
preset = "ultrafast"
"#
        ),
    );
    let run = spawn_run(&p, &[], dir.path());
    let json = |target: &str| -> Option<serde_json::Value> {
        let (status, body) = get(port, target)?;
        (status == 200).then(|| serde_json::from_str(&body).unwrap())
    };
    // What the routes name: an event with its snapshot and clip, a finished recording, and
    // pages enough of each paged route that a first page has a next.
    let event = wait_until("an event with a snapshot and a clip", DEADLINE, || {
        let list = json("/api/events?kind=crossing")?;
        list.as_array()?
            .iter()
            .find(|e| e["snapshot_url"].is_string() && e["clip_url"].is_string())
            .cloned()
    });
    let recording = wait_until("two recordings, one finished", DEADLINE, || {
        let page = json("/api/recordings?limit=2")?;
        let list = page["recordings"].as_array()?;
        (list.len() == 2 && page["next"].is_string()).then(|| list[1].clone())
    });
    let cursors: BTreeMap<&str, String> =
        [("/api/recordings", ""), ("/api/counts", "bucket=minute&")]
            .into_iter()
            .map(|(path, keep)| {
                let next = wait_until("a second page", DEADLINE, || {
                    let page = json(&format!("{path}?{keep}limit=1"))?;
                    page["next"].as_str().map(str::to_owned)
                });
                (path, next)
            })
            .collect();

    let spec = spec();
    // A file's URL as /api/recordings gives it (its {id} names its whole path).
    let media = format!("/{}", recording["url"].as_str().unwrap());
    let ok = |template: &str| {
        if template.starts_with("/api/media/") {
            return media.clone();
        }
        template
            .replace("{id}", &event["id"].to_string())
            .replace("{sink}", recording["sink"].as_str().unwrap())
            .replace("{file}", recording["name"].as_str().unwrap())
            .replace("{source}", "cam")
    };
    let missing = |template: &str| {
        template
            .replace("{id}", "999999999")
            .replace("/media/{sink}/999999999", "/media/{sink}/0123456789abcdef")
            .replace("{sink}", "nosink")
            .replace("{file}", "nofile.mkv")
            .replace("{source}", "nosource")
    };
    for ((method, template), params) in documented(&spec) {
        assert_eq!(method, "GET");
        let listed = statuses(&spec, &template);
        // This run's source is a test pattern shown as stills (`live_video = "stills"`): its
        // live video is a 409 (tests/video.rs plays a camera's, video_encoded.rs a pattern's).
        let good = if template.starts_with("/api/video/") {
            409
        } else {
            200
        };
        let mut cases: Vec<(String, u16)> = vec![(ok(&template), good)];
        for p in &params {
            let v = value(p).replace("{cursor}", cursors.get(template.as_str()).map_or("", |c| c));
            let keep = if template == "/api/counts" && *p == "cursor" {
                "bucket=minute&"
            } else {
                ""
            };
            cases.push((format!("{}?{keep}{p}={v}", ok(&template)), good));
        }
        if template.contains('{') {
            cases.push((missing(&template), 404));
        }
        cases.push((format!("{}?nope=1", ok(&template)), 400));
        // The file's times take any whole number of ms: the ends of i64 included.
        if params.contains("after") && params.contains("before") {
            let ends = "after=9223372036854775806&before=-9223372036854775808";
            cases.push((format!("{}?{ends}", ok(&template)), 200));
        }
        for (target, want) in cases {
            assert!(
                listed.contains(&want),
                "{template}: {want} is not documented: {listed:?}"
            );
            let (status, headers, mut body) = open(port, &target).unwrap();
            // A live stream never ends: its status and headers are the answer.
            let text = if template.starts_with("/api/live") && status == 200 {
                String::new()
            } else {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut body, &mut bytes).unwrap();
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned()
            };
            assert_eq!(status, want, "{target}: {headers:?} {text}");
        }
    }
    // A method no route takes: 405, naming the one it does (RFC 9110, 15.5.6).
    for method in ["POST", "DELETE", "TRACE"] {
        let raw = format!("{method} /api/sources HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        let (status, headers, _) = request(port, &raw).unwrap();
        assert_eq!(status, 405, "{method}: {headers:?}");
        assert!(
            headers.iter().any(|h| h == "Allow: GET"),
            "{method}: {headers:?}"
        );
    }
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}
