//! docs/reference/api.json (OpenAPI 3) against the routes: its paths and their query parameters
//! are exactly those the API's module header lists (`src/daemon/http/api.rs`, with the live
//! stream's from `live.rs`), and on a real `vidflow` each path is answered (not "no such page")
//! and takes each documented parameter (never "unknown parameter").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/http.rs"]
mod http_client;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::free_port;
use common::{repo_root, spawn_run, write};
use http_client::{get, wait_until};

/// Guards against a hang only.
const DEADLINE: Duration = Duration::from_secs(90);

/// Path -> its query parameters.
type Routes = BTreeMap<String, BTreeSet<String>>;

fn documented() -> (serde_json::Value, Routes) {
    let text = std::fs::read_to_string(repo_root().join("docs/reference/api.json")).unwrap();
    let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
    let routes = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(path, item)| {
            let params = item["get"]["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "query")
                        .map(|p| p["name"].as_str().unwrap().to_owned())
                        .collect()
                })
                .unwrap_or_default();
            (path.clone(), params)
        })
        .collect();
    (spec, routes)
}

/// The routes as the module headers list them: each `/api/...` in backquotes.
fn in_the_code() -> Routes {
    let mut routes = Routes::new();
    for file in ["api.rs", "live.rs"] {
        let text = std::fs::read_to_string(repo_root().join("src/daemon/http").join(file)).unwrap();
        for line in text.lines().take_while(|l| l.starts_with("//!")) {
            for quoted in line.split('`').skip(1).step_by(2) {
                let Some(at) = quoted.find("/api/").filter(|_| !quoted.contains("...")) else {
                    continue;
                };
                let (path, query) = quoted[at..].split_once('?').unwrap_or((&quoted[at..], ""));
                let path = path.replace("SOURCE", "{source}");
                let params = query
                    .split('&')
                    .filter_map(|p| p.split_once('=').map(|(k, _)| k.to_owned()))
                    .collect();
                routes.insert(path, params);
            }
        }
    }
    routes
}

#[test]
fn the_openapi_file_lists_the_routes_of_the_code_with_their_parameters() {
    let (spec, routes) = documented();
    assert_eq!(spec["openapi"], "3.0.3");
    assert_eq!(routes, in_the_code());
}

#[test]
fn every_documented_route_and_parameter_is_answered_by_a_real_run() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"test://ball?width=160&height=120&fps=10\"\n\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\n[events]\npath = \"events.db\"\n\n\
             [sinks.frames]\nkind = \"jsonl\"\npath = \"frames.jsonl\"\n"
        ),
    );
    let run = spawn_run(&p, &[], dir.path());
    wait_until("the endpoint answers", DEADLINE, || get(port, "/healthz"));
    let (_, routes) = documented();
    for (path, params) in &routes {
        if path.starts_with("/api/live") {
            continue; // A stream: never ends (tests/api.rs reads it).
        }
        let path = path
            .replace("{id}", "1")
            .replace("{sink}", "frames")
            .replace("{file}", "frames.jsonl");
        // One parameter at a time: the first bad value would hide the next parameter.
        let targets =
            std::iter::once(path.clone()).chain(params.iter().map(|p| format!("{path}?{p}=")));
        for target in targets {
            let (status, body) = get(port, &target).unwrap();
            assert!(
                !body.contains("no such page") && !body.contains("unknown parameter"),
                "{target}: {status} {body}"
            );
            assert!(
                [200, 206, 400, 404].contains(&status),
                "{target}: {status} {body}"
            );
        }
    }
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}
