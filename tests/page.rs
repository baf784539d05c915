//! The page at `/`, in a real browser (Debian's `chromium`, driven over CDP by
//! `headless_chrome`), on a real `vidflow` running the shipped demo's workflow (pipelines/demo.toml:
//! yolov12n_coco, the tracker, the line counter, its preview, snapshot and clip sinks and the
//! event store) on the first seconds of the demo's video, beside a second, live source.
//!
//! It asserts what a person sees, step by step: the grid shows every source, the street (H.264)
//! as video and the lobby (a test pattern) as stills; boxes appear on the street's picture and
//! move, beside the line the counter tests; the events timeline lists the line crossings and filtering
//! it by label changes the list; clicking a crossing plays its clip (the video's `currentTime`
//! advances); the counts chart holds the run's totals (the line counter's own counts, and the
//! run's final counts in its log). Screenshots of each step are kept in
//! `target/tmp/page/` (CARGO_TARGET_TMPDIR).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::browser;
use crate::common::http as http_client;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use browser::{DEADLINE, browser, js, screenshot, wait_js};
use common::{asset, free_port, repo_root, run_to_eos, spawn_run, write};
use headless_chrome::Tab;
use http_client::{get, wait_until};

/// Frames of the demo's video the street source plays: its first three line crossings are at
/// frames 23, 60 and 103.
const STREET_FRAMES: u32 = 140;

/// The first [`STREET_FRAMES`] frames of the demo's video, as H.264 in MPEG-TS.
fn street_video(dir: &Path) -> PathBuf {
    // MPEG-TS: a stream cut short is whole (an MP4's header would still give the video's
    // duration, and the run would report the frames after the cut as missing).
    let path = dir.join("street.ts");
    run_to_eos(&format!(
        "filesrc location={} ! decodebin ! identity eos-after={STREET_FRAMES} ! videoconvert ! \
         video/x-raw,format=I420 ! x264enc speed-preset=ultrafast key-int-max=10 ! h264parse ! \
         mpegtsmux ! filesink location={}",
        asset("vtest.avi").display(),
        path.display()
    ));
    path
}

/// pipelines/demo.toml with the street cut short, a second (live) source `lobby`, its own port,
/// and without the annotated video (which the page does not show).
fn pipeline(dir: &Path, port: u16) -> PathBuf {
    let text = std::fs::read_to_string(repo_root().join("pipelines/demo.toml")).unwrap();
    let mut doc: toml::Table = toml::from_str(&text).unwrap();
    let street = street_video(dir);
    doc["sources"]["street"]["uri"] = street.display().to_string().into();
    let lobby: toml::Table = toml::from_str(
        "uri = \"test://smpte?width=320&height=240&fps=2&live=true\"\nlive_video = \"stills\"",
    )
    .unwrap();
    doc["sources"]
        .as_table_mut()
        .unwrap()
        .insert("lobby".into(), lobby.into());
    doc["http"]["listen"] = format!("127.0.0.1:{port}").into();
    let kind = |t: &toml::Value| t["kind"].as_str().unwrap().to_owned();
    doc["sinks"]
        .as_table_mut()
        .unwrap()
        .retain(|_, s| kind(s) != "video_file");
    doc["steps"]
        .as_table_mut()
        .unwrap()
        .retain(|_, s| kind(s) != "annotate");
    let models = repo_root().join("models");
    std::os::unix::fs::symlink(models, dir.join("models")).unwrap();
    write(dir, "demo.toml", &toml::to_string(&doc).unwrap())
}

/// Sets a filter of the events and waits for the list it gives; the ids listed.
fn filter(tab: &Tab, id: &str, value: &str) -> Vec<(i64, String)> {
    let loaded = js(tab, "window.vidflow.eventsLoaded || 0")
        .as_i64()
        .unwrap();
    js(
        tab,
        &format!(
            "(() => {{ const f = document.getElementById('{id}'); f.value = '{value}'; \
             f.dispatchEvent(new Event('change')); return 1; }})()"
        ),
    );
    wait_js(
        tab,
        "the filtered list",
        &format!("(window.vidflow.eventsLoaded || 0) > {loaded}"),
    );
    let items = js(
        tab,
        "[...document.querySelectorAll('#timeline li[data-id]')].map(li => [Number(li.dataset.id), li.dataset.label])",
    );
    serde_json::from_value(items).unwrap()
}

/// Boxes moved: some track id drawn in both lists at another place.
fn moved(first: &serde_json::Value, second: &serde_json::Value) -> bool {
    let boxes = |v: &serde_json::Value| -> BTreeMap<i64, Vec<f64>> {
        v["boxes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| {
                let b = b.as_array().unwrap();
                let id = b[0].as_i64()?;
                Some((id, b[1..].iter().map(|x| x.as_f64().unwrap()).collect()))
            })
            .collect()
    };
    let (a, b) = (boxes(first), boxes(second));
    a.iter().any(|(id, at)| {
        b.get(id)
            .is_some_and(|to| at.iter().zip(to).any(|(x, y)| (x - y).abs() >= 2.0))
    })
}

#[test]
fn a_person_sees_the_demo_boxed_live_finds_a_crossing_plays_it_and_reads_the_counts() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = pipeline(dir.path(), port);
    // The browser first: it starts slowly on a machine the detector keeps busy.
    let browser = browser(1280, 1400);
    let tab = browser.new_tab().unwrap();
    tab.activate().unwrap();
    tab.set_default_timeout(DEADLINE);
    let run = spawn_run(&path, &[], dir.path());
    wait_until("the endpoint answers", DEADLINE, || get(port, "/healthz"));
    // Not `wait_until_navigated`: what the page shows is waited for below.
    tab.navigate_to(&format!("http://127.0.0.1:{port}/"))
        .unwrap();

    // 1. Every source has its picture in the grid.
    let names = wait_js(
        &tab,
        "both sources in the grid",
        "document.querySelectorAll('#grid .cam').length === 2 && \
         [...document.querySelectorAll('#grid .cam b')].map(b => b.textContent).sort()",
    );
    assert_eq!(names, serde_json::json!(["lobby", "street"]));
    let modes = wait_js(
        &tab,
        "the street as video, the lobby as stills",
        "document.querySelector('#cam-street').dataset.mode === 'video' && \
         document.querySelector('#cam-lobby').dataset.mode === 'stills' && \
         [vidflow.liveQuery, document.querySelector('#cam-lobby').dataset.why]",
    );
    assert_eq!(
        modes,
        serde_json::json!([
            "api/live?stills_of=lobby",
            "no live video: stills were chosen (live_video = \"stills\")"
        ])
    );

    // 2. Boxes appear on the street's picture, and move.
    let first = wait_js(
        &tab,
        "boxes on the street",
        "(window.vidflow.drawn.street || {boxes: []}).boxes.length > 0 && window.vidflow.drawn.street",
    );
    let painted = js(
        &tab,
        "(() => { const c = document.querySelector('canvas[data-source=street]'); \
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
         let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })()",
    );
    assert!(
        painted.as_i64().unwrap() > 200,
        "boxes drawn: {painted} pixels"
    );
    // The line the counter tests is drawn beside the boxes, where the pipeline puts it: points
    // along it, on the canvas, are painted in the line's colour (most of them: a box may pass).
    let line = wait_js(
        &tab,
        "the walkway line on the street",
        "(window.vidflow.shapes.street || []).find(s => s.name === 'walkway')",
    );
    let demo: toml::Table =
        toml::from_str(&std::fs::read_to_string(repo_root().join("pipelines/demo.toml")).unwrap())
            .unwrap();
    let points: Vec<Vec<f64>> = demo["steps"]["crossing"]["line"]
        .clone()
        .try_into()
        .unwrap();
    assert_eq!(line["kind"], "line", "{line}");
    let drawn: Vec<Vec<f64>> = serde_json::from_value(line["points"].clone()).unwrap();
    assert_eq!(drawn, points, "{line}");
    let on_line = js(
        &tab,
        "(() => { const c = document.querySelector('canvas[data-source=street]'); \
         const f = cams.get('street').frame, g = c.getContext('2d'); \
         const w = c.clientWidth, h = c.clientHeight, dpr = window.devicePixelRatio || 1; \
         const k = Math.min(w / f.width, h / f.height), ox = (w - f.width * k) / 2, oy = (h - f.height * k) / 2; \
         const [[x1, y1], [x2, y2]] = window.vidflow.shapes.street.find(s => s.name === 'walkway').points; \
         return [0.1, 0.3, 0.5, 0.7, 0.9].map(t => { \
           const x = ox + (x1 + (x2 - x1) * t) * k, y = oy + (y1 + (y2 - y1) * t) * k; \
           return [...g.getImageData(Math.round(x * dpr), Math.round(y * dpr), 1, 1).data].join(); }); })()",
    );
    let red = on_line
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| *p == "239,68,68,255")
        .count();
    assert!(red >= 3, "the line's pixels: {on_line}");
    screenshot(&tab, "1-live.png");
    let seq = first["seq"].as_i64().unwrap();
    let second = wait_js(
        &tab,
        "more frames of the street",
        &format!(
            "window.vidflow.drawn.street.seq >= {} && window.vidflow.drawn.street",
            seq + 5
        ),
    );
    assert!(
        moved(&first, &second),
        "no box moved between frames {seq} and {}: {first} {second}",
        second["seq"]
    );

    // 3. The timeline lists line crossings with their clips; the label filter changes the list.
    wait_js(
        &tab,
        "a crossing with its clip in the timeline",
        "window.vidflow.events.some(e => e.kind === 'crossing' && e.clip_url && e.snapshot_url)",
    );
    let people = filter(&tab, "f-label", "person");
    assert!(!people.is_empty(), "no event labelled person");
    assert!(people.iter().all(|(_, l)| l == "person"), "{people:?}");
    let cars = filter(&tab, "f-label", "car");
    assert!(cars.is_empty(), "the street has no car, yet: {cars:?}");
    let crossings = filter(&tab, "f-label", "");
    assert!(crossings.len() >= people.len(), "{crossings:?}");
    filter(&tab, "f-kind", "crossing");
    screenshot(&tab, "2-events.png");

    // 4. A click on a crossing plays its clip.
    tab.find_element("#timeline li[data-kind=crossing][data-clip='1']")
        .unwrap()
        .click()
        .unwrap();
    let t1 = wait_js(
        &tab,
        "the clip playing",
        "document.getElementById('player-video').currentTime > 0.3 && document.getElementById('player-video').currentTime",
    );
    std::thread::sleep(Duration::from_millis(800));
    let t2 = js(&tab, "document.getElementById('player-video').currentTime");
    assert!(
        t2.as_f64().unwrap() > t1.as_f64().unwrap(),
        "the clip stopped at {t1} s"
    );
    screenshot(&tab, "3-clip.png");

    // 5. Once the street's last frame is through, the chart's totals are the line counter's.
    // (Its last picture may never show: its time is half a second after the one before, and a
    // browser's Media Source drops a picture after such a gap until a keyframe.)
    wait_js(
        &tab,
        "the street's last frame",
        &format!("cams.get('street').frame.seq === {}", STREET_FRAMES - 1),
    );
    let live = wait_js(
        &tab,
        "the street's counts",
        "window.vidflow.live.street.crossing",
    );
    // The store keeps a row per crossing, so a direction nobody crossed in has no key (which
    // direction the street's first crossings go depends on the detector's precision on this CPU).
    let expect: serde_json::Map<String, serde_json::Value> = ["in", "out"]
        .into_iter()
        .filter(|d| live[d].as_u64().unwrap_or(0) > 0)
        .map(|d| (format!("street walkway {d}"), live[d].clone()))
        .collect();
    assert!(!expect.is_empty(), "no crossing counted: {live}");
    let expect = serde_json::Value::Object(expect);
    // The store is written behind the frame path (its own thread): the page reads the counts
    // again until they hold the last crossing; one that never arrives fails below, both shown.
    let asked = std::time::Instant::now();
    let totals = loop {
        js(&tab, "(loadCounts(), 1)");
        std::thread::sleep(Duration::from_millis(250));
        let totals = js(
            &tab,
            "window.vidflow.counts && window.vidflow.counts.totals",
        );
        if totals == expect || asked.elapsed() > DEADLINE {
            break totals;
        }
    };
    assert_eq!(
        totals,
        expect,
        "chart totals against the line counter's; the chart said {:?}; GET /api/counts: {:?}",
        js(
            &tab,
            "document.getElementById('chart').textContent.slice(0, 200)"
        ),
        get(port, "/api/counts?bucket=minute"),
    );
    let series = js(&tab, "chart && chart.series.length");
    assert_eq!(
        series,
        expect.as_object().unwrap().len() + 1,
        "the chart draws each counted direction over time (and its time axis)"
    );
    screenshot(&tab, "4-counts.png");

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
    let said = format!(
        "final counts: street: crossing in={} out={}",
        live["in"], live["out"]
    );
    assert!(
        finished.stderr.contains(&said),
        "{said}\n{}",
        finished.stderr
    );
}
