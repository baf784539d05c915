//! The page's live video, in a real browser (Debian's `chromium`, `tests/common/browser.rs`), on
//! a real `vidflow` watching a real RTSP camera (`common::rtsp`: x264, a moving ball, a keyframe
//! a second) through motion, a tracker and a line counter, beside a test pattern:
//!
//! - the camera's tile plays its own H.264 in `<video data-source=cam>` (pictures presented,
//!   `currentTime` advancing), and each picture it presents is drawn with the boxes of the
//!   live frame of that picture's time, as an independent reader of `/api/live/cam` got them;
//! - the test pattern's tile, its stills chosen (`live_video = "stills"`), shows stills and says
//!   so, and the page asks the live stream for that source's stills only: the camera's preview
//!   never encodes a JPEG;
//! - a test pattern's tile plays the H.264 vidflow encodes for it, each picture with its own
//!   boxes;
//! - the player holds the live edge, also after the page was too busy to take the video for a
//!   few seconds, and keeps a bounded stretch of video buffered;
//! - a camera that comes back at another size plays again, at that size;
//! - a tile whose video is refused (vidflow at its cap of live clients) shows stills and says
//!   so, and plays again once there is room;
//! - an H.265 camera's tile, in a browser that cannot play H.265 (Debian's Chromium), shows
//!   stills and says so, once, without trying again, while the H.264 camera beside it plays;
//! - a page of 16 cameras plays them all and its events, counts and health still load: the
//!   videos' WebSockets are not among the six connections a browser opens per host.
//!
//! What the page saw is read from `window.vidflow` (its counters and its log of the pictures it
//! presented and the boxes it drew on each).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::browser;
use crate::common::http as http_client;
use crate::common::rtsp;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use browser::{DEADLINE, browser, js, screenshot, wait_js};
use common::{BALL_CROSSINGS, Running, free_port, spawn_command, spawn_run, vidflow, write};
use headless_chrome::Tab;
use http_client::{get, scrape, value, wait_until};
use rtsp::{RtspServer, RtspServerOptions};

/// Ticks per second of the video's times.
const TIMESCALE: f64 = 90_000.0;
/// How far behind the newest picture received the picture on screen may be once the player
/// caught up: the page aims at its delay (0.15 s here, where boxes come as soon as the
/// pictures) and jumps past 0.5 s more.
const LIVE_EDGE_S: f64 = 1.0;
/// Video the page may keep buffered behind the picture on screen: 10 s, trimmed every 5 s, at
/// a keyframe (one a second).
const BUFFERED_S: f64 = 17.0;

/// The camera `cam` (through motion, a tracker and a line counter) and a test pattern, both
/// with a preview.
fn pipeline(dir: &Path, port: u16, camera: &str) -> PathBuf {
    let text = format!(
        r#"[sources.cam]
uri = "{camera}"

[sources.pattern]
uri = "test://ball?width=320&height=240&fps=10"
live_video = "stills"

{BALL_CROSSINGS}

[http]
listen = "127.0.0.1:{port}"

[sinks.preview]
kind = "preview"
image = "$frame"
max_fps = 5
"#
    );
    write(dir, "p.toml", &text)
}

fn start(dir: &Path, camera: &str) -> (Running, u16) {
    let port = free_port();
    let run = spawn_run(&pipeline(dir, port, camera), &[], dir);
    http_client::wait_for_frames(port, "cam", 15, DEADLINE);
    (run, port)
}

fn open_page(port: u16) -> (headless_chrome::Browser, Arc<Tab>) {
    let browser = browser(800, 600);
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(DEADLINE);
    tab.navigate_to(&format!("http://127.0.0.1:{port}/"))
        .unwrap();
    (browser, tab)
}

/// A box as the page notes it: `[id, x, y, w, h]`, rounded as JavaScript's `Math.round`.
fn noted(b: &serde_json::Value) -> serde_json::Value {
    let mut v = vec![b["id"].clone()];
    v.extend(
        b["box"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| serde_json::json!((x.as_f64().unwrap() + 0.5).floor() as i64)),
    );
    serde_json::Value::Array(v)
}

/// The boxes of each frame of `/api/live/SOURCE`, by its picture's time in ticks, read on a
/// thread of their own until vidflow ends.
fn live_boxes(port: u16, source: &str) -> Arc<Mutex<BTreeMap<i64, serde_json::Value>>> {
    let frames = Arc::new(Mutex::new(BTreeMap::new()));
    let (status, _, mut reader) = http_client::open(port, &format!("/api/live/{source}")).unwrap();
    assert_eq!(status, 200);
    let kept = frames.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(data) = line.strip_prefix("data: ") {
                // A line cut short: vidflow ended.
                let Ok(f) = serde_json::from_str::<serde_json::Value>(data) else {
                    break;
                };
                let key = (f["media_time"].as_f64().unwrap() * TIMESCALE).round() as i64;
                let boxes: Vec<_> = f["boxes"].as_array().unwrap().iter().map(noted).collect();
                kept.lock().unwrap().insert(key, serde_json::json!(boxes));
            }
            line.clear();
        }
    });
    frames
}

/// The camera's player as the page has it: presented pictures, `currentTime`, how far it is
/// behind the newest picture received, how much it keeps buffered behind, its size, and its
/// jumps, trims and reconnections.
fn player(tab: &Tab, source: &str) -> serde_json::Value {
    js(
        tab,
        &format!(
            "(() => {{ const v = document.querySelector('video[data-source={source}]'), b = v.buffered; \
               return {{ frames: vidflow.videoFrames.{source} || 0, time: v.currentTime, \
                 behind: b.length ? b.end(b.length - 1) - v.currentTime : null, \
                 kept: b.length ? v.currentTime - b.start(0) : null, width: v.videoWidth, \
                 boxes: vidflow.boxesOnVideo.{source} || 0, ...vidflow.video.{source} }}; }})()"
        ),
    )
}

fn f64_of(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// Waits until `source`'s tile presented `more` pictures after those it had; the player then.
fn presents(tab: &Tab, source: &str, more: u64) -> serde_json::Value {
    let before = f64_of(&player(tab, source), "frames") as u64;
    wait_js(
        tab,
        &format!("{more} more pictures of {source}"),
        &format!("(vidflow.videoFrames.{source} || 0) >= {}", before + more),
    );
    player(tab, source)
}

/// Every picture the page logged with boxes was drawn with the boxes of the live frame of its
/// own time (a picture between two frames the detector ran on: the earlier frame's); how many
/// were drawn with their own.
fn boxes_on_their_pictures(tab: &Tab, frames: &Mutex<BTreeMap<i64, serde_json::Value>>) -> usize {
    let log = js(tab, "vidflow.videoLog.cam");
    let log = log.as_array().unwrap();
    let last = log.iter().map(|e| key(&e["t"])).max().unwrap();
    // The reader has read as far as the page.
    wait_until("the live frames the page drew", DEADLINE, || {
        (frames.lock().unwrap().keys().last() >= Some(&last)).then_some(())
    });
    let frames = frames.lock().unwrap();
    let mut own = 0;
    for e in log
        .iter()
        .filter(|e| !e["boxes"].as_array().unwrap().is_empty())
    {
        let at = if e["held"] == true {
            key(&e["frame"])
        } else {
            key(&e["t"])
        };
        let Some(boxes) = frames.get(&at) else {
            // Before the reader's first frame.
            assert!(
                at < *frames.keys().next().unwrap(),
                "no live frame at {at}: {e}"
            );
            continue;
        };
        assert_eq!(
            &e["boxes"], boxes,
            "the boxes drawn on the picture at {at}: {e}"
        );
        own += usize::from(e["held"] != true);
    }
    own
}

fn key(seconds: &serde_json::Value) -> i64 {
    (seconds.as_f64().unwrap() * TIMESCALE).round() as i64
}

/// `/metrics`' `name` of `source` (0 when not there).
fn metric(port: u16, name: &str, source: &str) -> f64 {
    value(&scrape(port).unwrap(), name, &[("source", source)]).unwrap_or(0.0)
}

#[test]
fn a_camera_tile_plays_its_video_with_each_pictures_own_boxes_and_stays_live() {
    let server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path(), &server.url());
    let frames = live_boxes(port, "cam");
    let (_browser, tab) = open_page(port);

    // The camera plays: pictures presented, its time advancing.
    wait_js(
        &tab,
        "the camera's video",
        "(vidflow.videoFrames.cam || 0) >= 15",
    );
    let element = js(
        &tab,
        "(() => { const v = document.querySelector('#cam-cam video[data-source=cam]'); \
           return [v.muted, v.hasAttribute('playsinline'), v.hasAttribute('autoplay'), v.hidden, \
             document.querySelector('#cam-cam').dataset.mode]; })()",
    );
    assert_eq!(
        element,
        serde_json::json!([true, true, true, false, "video"])
    );
    let first = player(&tab, "cam");
    let then = presents(&tab, "cam", 30);
    assert!(
        f64_of(&then, "time") > f64_of(&first, "time"),
        "{first} then {then}"
    );

    // Boxes on their own pictures, on the canvas over the video.
    wait_js(
        &tab,
        "boxes on the video",
        "(vidflow.boxesOnVideo.cam || 0) >= 20",
    );
    let own = boxes_on_their_pictures(&tab, &frames);
    assert!(own >= 10, "{own} pictures drawn with their own boxes");
    let painted = js(
        &tab,
        "(() => { const c = document.querySelector('canvas[data-source=cam]'); \
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
         let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })()",
    );
    assert!(painted.as_i64().unwrap() > 100, "{painted} pixels drawn");

    // The test pattern shows stills, as chosen, and says so; its stills are the only ones asked
    // for.
    wait_js(
        &tab,
        "the pattern's stills",
        "(vidflow.stills.pattern || 0) >= 2",
    );
    let pattern = js(
        &tab,
        "(() => { const c = document.querySelector('#cam-pattern'), v = c.querySelector('video'), \
             w = c.querySelector('.why'); \
           return [c.dataset.mode, c.dataset.why, w.hidden, w.textContent, v.hidden, v.hasAttribute('src'), \
             c.querySelector('img').hidden]; })()",
    );
    let why = "no live video: stills were chosen (live_video = \"stills\")";
    assert_eq!(
        pattern,
        serde_json::json!(["stills", why, false, why, true, false, false])
    );
    assert_eq!(js(&tab, "vidflow.liveQuery"), "api/live?stills_of=pattern");
    screenshot(&tab, "video-1.png");

    // A busy page takes no video for 3 s: the player catches up with the live edge.
    let before = player(&tab, "cam");
    assert!(f64_of(&before, "behind") < LIVE_EDGE_S, "{before}");
    js(
        &tab,
        "(() => { const t = performance.now(); while (performance.now() - t < 3000) {} return 1; })()",
    );
    let after = presents(&tab, "cam", 60);
    assert!(
        f64_of(&after, "behind") < LIVE_EDGE_S,
        "still behind after a busy page: {after}"
    );
    assert!(f64_of(&after, "jumps") >= 1.0, "{after}");

    // After 20 s of video, what is kept buffered is bounded.
    let start = f64_of(&after, "time");
    wait_js(
        &tab,
        "20 s of video",
        &format!(
            "document.querySelector('video[data-source=cam]').currentTime > {}",
            start + 20.0
        ),
    );
    let later = player(&tab, "cam");
    assert!(f64_of(&later, "kept") <= BUFFERED_S, "{later}");
    assert!(f64_of(&later, "trims") >= 1.0, "{later}");
    assert!(f64_of(&later, "behind") < LIVE_EDGE_S, "{later}");
    assert!(boxes_on_their_pictures(&tab, &frames) >= 10);
    screenshot(&tab, "video-2.png");

    // No JPEG was made for the camera: its tile plays video. The pattern's were.
    assert_eq!(metric(port, "vidflow_preview_jpegs_total", "cam"), 0.0);
    assert!(metric(port, "vidflow_preview_jpegs_total", "pattern") > 0.0);
    drop(tab);
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn a_test_pattern_tile_plays_the_video_vidflow_encodes_for_it_with_each_pictures_own_boxes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let text = format!(
        "[sources.cam]\nuri = \"test://ball?width=320&height=240&fps=25\"\n\n{BALL_CROSSINGS}\n\
         [http]\nlisten = \"127.0.0.1:{port}\"\n\n\
         [sinks.preview]\nkind = \"preview\"\nimage = \"$frame\"\nmax_fps = 5\n"
    );
    let run = spawn_run(&write(dir.path(), "p.toml", &text), &[], dir.path());
    http_client::wait_for_frames(port, "cam", 15, DEADLINE);
    let frames = live_boxes(port, "cam");
    let (_browser, tab) = open_page(port);
    wait_js(
        &tab,
        "the pattern's video",
        "(vidflow.videoFrames.cam || 0) >= 15",
    );
    let shown = js(
        &tab,
        "(() => { const v = document.querySelector('#cam-cam video[data-source=cam]'); \
           return [v.hidden, document.querySelector('#cam-cam').dataset.mode]; })()",
    );
    assert_eq!(shown, serde_json::json!([false, "video"]));
    let first = player(&tab, "cam");
    let then = presents(&tab, "cam", 30);
    assert!(
        f64_of(&then, "time") > f64_of(&first, "time"),
        "{first} then {then}"
    );
    assert_eq!(f64_of(&then, "width"), 320.0);
    // Its pictures carry their frames' times: each is drawn with its own frame's boxes.
    wait_js(
        &tab,
        "boxes on the video",
        "(vidflow.boxesOnVideo.cam || 0) >= 20",
    );
    let own = boxes_on_their_pictures(&tab, &frames);
    assert!(own >= 10, "{own} pictures drawn with their own boxes");
    assert_eq!(metric(port, "vidflow_video_encoders", "cam"), 1.0);
    screenshot(&tab, "video-encoded.png");
    drop(tab);
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn a_camera_that_comes_back_at_another_size_plays_again_at_that_size() {
    let mut server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path(), &server.url());
    let (_browser, tab) = open_page(port);
    wait_js(
        &tab,
        "the camera's video",
        "(vidflow.videoFrames.cam || 0) >= 15",
    );
    assert_eq!(player(&tab, "cam")["width"], 320);
    server
        .restart_with(RtspServerOptions {
            width: 640,
            height: 480,
            ..RtspServerOptions::default()
        })
        .unwrap();
    wait_js(
        &tab,
        "the camera at 640x480",
        "document.querySelector('video[data-source=cam]').videoWidth === 640",
    );
    let boxes = f64_of(&player(&tab, "cam"), "boxes");
    let after = presents(&tab, "cam", 30);
    assert!(f64_of(&after, "reconnects") >= 1.0, "{after}");
    assert!(f64_of(&after, "behind") < LIVE_EDGE_S, "{after}");
    wait_js(
        &tab,
        "boxes on the video at its new size",
        &format!("vidflow.boxesOnVideo.cam > {boxes} + 10"),
    );
    screenshot(&tab, "video-640.png");
    drop(tab);
    run.terminate_cleanly(DEADLINE);
}

/// What [`pipeline`] opens, as the endpoint counts it.
const PIPELINE: vidflow::daemon::fds::Pipeline = vidflow::daemon::fds::Pipeline {
    sources: 2,
    record_streams: 0,
    sinks: 1,
    event_store: false,
};

/// Holds a place among the live clients: `/api/live`, past its response head.
fn hold(port: u16) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /api/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut reader = BufReader::new(s);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    reader
}

#[test]
fn a_tile_whose_video_is_refused_shows_stills_and_says_so_then_plays_once_there_is_room() {
    let server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // A descriptor limit (soft and hard, set before `exec`) that leaves room for two live
    // clients: the page's live stream and its one video.
    let nofile = (0..100_000)
        .find(|&n| vidflow::daemon::http::max_live_clients(n, PIPELINE.descriptors()) == 2)
        .unwrap();
    let mut command = vidflow();
    command
        .arg("run")
        .arg(pipeline(dir.path(), port, &server.url()));
    // SAFETY: only setrlimit, which is async-signal-safe, runs between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            let limit = libc::rlimit {
                rlim_cur: nofile,
                rlim_max: nofile,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let run = spawn_command(dir.path(), command);
    wait_until("the endpoint answers", DEADLINE, || get(port, "/healthz"));
    http_client::wait_for_frames(port, "cam", 15, DEADLINE);
    let holders = [hold(port), hold(port)];
    let (_browser, tab) = open_page(port);
    let why = wait_js(
        &tab,
        "the camera's tile showing stills, saying why",
        "document.querySelector('#cam-cam').dataset.mode === 'stills' && \
         document.querySelector('#cam-cam').dataset.why",
    );
    assert!(
        why.as_str().unwrap().starts_with(
            "live video failed (vidflow refused it or is not reachable): stills; trying again in"
        ),
        "{why}"
    );
    assert_eq!(
        js(&tab, "vidflow.video.cam.reconnects"),
        3,
        "tried again more than it gave up after"
    );
    screenshot(&tab, "video-refused.png");
    drop(holders);
    wait_js(
        &tab,
        "the camera's video once there is room",
        "document.querySelector('#cam-cam').dataset.mode === 'video' && \
         (vidflow.videoFrames.cam || 0) >= 15",
    );
    drop(tab);
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn sixteen_cameras_play_and_the_events_counts_and_health_still_load() {
    const CAMERAS: usize = 16;
    let server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut text = String::new();
    for n in 1..=CAMERAS {
        text += &format!("[sources.cam{n}]\nuri = \"{}\"\n\n", server.url());
    }
    text += &format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\n\n[events]\npath = \"events.db\"\n\n\
         [sinks.preview]\nkind = \"preview\"\nimage = \"$frame\"\n"
    );
    let run = spawn_run(&write(dir.path(), "p.toml", &text), &[], dir.path());
    wait_until("the endpoint answers", DEADLINE, || get(port, "/healthz"));
    // Wide enough for every tile to be on screen (a tile off screen closes its video).
    let browser = browser(1600, 1400);
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(DEADLINE);
    tab.navigate_to(&format!("http://127.0.0.1:{port}/"))
        .unwrap();
    wait_js(
        &tab,
        "every camera's video",
        &format!(
            "[...document.querySelectorAll('video[data-source]')] \
               .filter(v => !v.hidden && (vidflow.videoFrames[v.dataset.source] || 0) >= 10).length === {CAMERAS}"
        ),
    );
    // A browser opens at most six HTTP/1.1 connections to a host: the videos' WebSockets are
    // not among them, so the page's requests still get through, now that every video plays.
    let loaded = js(&tab, "vidflow.eventsLoaded").as_u64().unwrap();
    js(
        &tab,
        "(vidflow.counts = null, lastHealth = null, loadEvents(false), loadCounts(), health(), 1)",
    );
    wait_js(
        &tab,
        "the events, counts and health views",
        &format!(
            "vidflow.eventsLoaded > {loaded} && \
             document.querySelector('#timeline li.empty').textContent === 'no events match' && \
             vidflow.counts !== null && lastHealth !== null && \
             document.querySelectorAll('#h-sources tr[data-source]').length === {CAMERAS}"
        ),
    );
    assert_eq!(js(&tab, "vidflow.liveQuery"), "api/live");
    screenshot(&tab, "video-16.png");
    drop(tab);
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn an_h265_tile_shows_stills_saying_the_browser_cannot_play_it_beside_an_h264_tile_that_plays() {
    common::require_x265enc();
    let h264 = RtspServer::start(RtspServerOptions::default()).unwrap();
    let h265 = RtspServer::start(RtspServerOptions {
        h265: true,
        ..RtspServerOptions::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let text = format!(
        "[sources.cam]\nuri = \"{}\"\n\n[sources.hevc]\nuri = \"{}\"\n\n\
         [http]\nlisten = \"127.0.0.1:{port}\"\n\n\
         [sinks.preview]\nkind = \"preview\"\nimage = \"$frame\"\nmax_fps = 5\n",
        h264.url(),
        h265.url()
    );
    let run = spawn_run(&write(dir.path(), "p.toml", &text), &[], dir.path());
    http_client::wait_for_frames(port, "hevc", 15, DEADLINE);
    let (_browser, tab) = open_page(port);
    let why = wait_js(
        &tab,
        "the H.265 tile showing stills, saying why",
        "document.querySelector('#cam-hevc').dataset.mode === 'stills' && \
         document.querySelector('#cam-hevc').dataset.why",
    );
    let why = why.as_str().unwrap().to_owned();
    let codec = why
        .strip_prefix("this browser cannot play H.265 (")
        .and_then(|c| c.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{why}"));
    assert!(codec.starts_with("hvc1.1.6.L"), "{why}");
    // The test proves something only where the browser cannot play H.265 (Debian's cannot).
    assert_eq!(
        js(
            &tab,
            &format!("MediaSource.isTypeSupported('video/mp4; codecs=\"{codec}\"')")
        ),
        false,
        "this Chromium plays H.265: the stills are not tried here"
    );
    // The H.264 camera beside it plays; the H.265 tile shows its stills.
    wait_js(
        &tab,
        "the H.264 camera's video and the H.265 camera's stills",
        "document.querySelector('#cam-cam').dataset.mode === 'video' && \
         (vidflow.videoFrames.cam || 0) >= 15 && (vidflow.stills.hevc || 0) >= 2",
    );
    let tile = js(
        &tab,
        "(() => { const c = document.querySelector('#cam-hevc'), w = c.querySelector('.why'); \
           return [w.hidden, w.textContent, c.querySelector('video').hidden, \
             c.querySelector('video').hasAttribute('src'), c.querySelector('img').hidden]; })()",
    );
    assert_eq!(tile, serde_json::json!([false, why, true, false, false]));
    assert_eq!(js(&tab, "vidflow.liveQuery"), "api/live?stills_of=hevc");
    screenshot(&tab, "video-h265.png");
    // Once: while the H.264 camera plays on for seconds (past a retry's first wait), the H.265
    // tile opens no video again and vidflow sends it nothing more.
    wait_until("the H.265 tile's connection closed", DEADLINE, || {
        (metric(port, "vidflow_video_viewers", "hevc") == 0.0).then_some(())
    });
    let sent = metric(port, "vidflow_video_bytes_sent_total", "hevc");
    assert!(
        sent > 0.0,
        "vidflow sent the H.265 tile nothing: no codec was announced"
    );
    presents(&tab, "cam", 60);
    assert_eq!(js(&tab, "vidflow.video.hevc.reconnects"), 0);
    assert_eq!(metric(port, "vidflow_video_bytes_sent_total", "hevc"), sent);
    assert_eq!(document_mode(&tab, "hevc"), "stills");
    drop(tab);
    run.terminate_cleanly(DEADLINE);
}

/// The mode of `source`'s tile (`video`, `stills`).
fn document_mode(tab: &Tab, source: &str) -> serde_json::Value {
    js(
        tab,
        &format!("document.querySelector('#cam-{source}').dataset.mode"),
    )
}
