//! The files the API serves (`/api/media/...`) on a real `vidflow`: two cameras recording into
//! folders of their own with the same file names at every cut each have their own footage
//! served under the URL `/api/recordings` gives (never the other camera's), and a file is
//! answered as private to the one who asked (no shared cache keeps it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use common::{free_port, spawn_run, write};
use http_client::{get, open, wait_until};

/// Guards against a hang only.
const DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn two_cameras_with_the_same_file_names_each_get_their_own_footage_served() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Two sources of different picture sizes, so that their segments cannot be the same
    // bytes; `seg.mp4`, `seg.1.mp4`, ... in each camera's folder: the same names at every cut
    // (as `{start}` gives two cameras started together).
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.left]\nuri = \"test://ball?width=320&height=240&fps=15\"\n\n\
             [sources.right]\nuri = \"test://smpte?width=160&height=120&fps=15\"\n\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\n\
             [sinks.rec]\nkind = \"video_file\"\nimage = \"$frame\"\n\
             path = \"recordings/{{source}}/seg.mp4\"\nsegment_seconds = 1\n"
        ),
    );
    let run = spawn_run(&p, &[], dir.path());
    // Finished segments of both cameras under the same name.
    let listed = wait_until("two closed segments of each camera", DEADLINE, || {
        let (status, body) = get(port, "/api/recordings")?;
        (status == 200).then_some(())?;
        // The first page (100 files) holds all this short run makes.
        let page: serde_json::Value = serde_json::from_str(&body).ok()?;
        let list = page["recordings"].as_array()?.clone();
        let mut by_source: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
        for r in list.into_iter().filter(|r| r["end"].is_number()) {
            by_source
                .entry(r["source"].as_str()?.to_owned())
                .or_default()
                .push(r);
        }
        let enough = ["left", "right"]
            .iter()
            .all(|s| by_source.get(*s).is_some_and(|l| l.len() >= 2));
        enough.then_some(by_source)
    });
    let names = |source: &str| -> Vec<String> {
        let mut n: Vec<String> = listed[source]
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect();
        n.sort();
        n
    };
    let shared: Vec<String> = names("left")
        .into_iter()
        .filter(|n| names("right").contains(n))
        .collect();
    assert!(shared.len() >= 2, "the same names: {listed:?}");

    let mut urls = Vec::new();
    for source in ["left", "right"] {
        for r in &listed[source] {
            let name = r["name"].as_str().unwrap();
            let url = format!("/{}", r["url"].as_str().unwrap());
            let (status, headers, mut reader) = open(port, &url).unwrap();
            assert_eq!(status, 200, "{url}: {headers:?}");
            // For the one who asked: a shared cache (a proxy in front) must not keep it.
            assert!(
                headers.contains(&"Cache-Control: private, max-age=60".to_owned()),
                "{url}: {headers:?}"
            );
            let mut served = Vec::new();
            reader.read_to_end(&mut served).unwrap();
            let on_disk =
                std::fs::read(dir.path().join("recordings").join(source).join(name)).unwrap();
            assert!(
                served == on_disk,
                "{url} ({source}'s {name}) served {} bytes, not its {} bytes",
                served.len(),
                on_disk.len()
            );
            urls.push(url);
        }
    }
    let distinct: std::collections::BTreeSet<_> = urls.iter().collect();
    assert_eq!(distinct.len(), urls.len(), "one URL per file: {urls:?}");

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}
