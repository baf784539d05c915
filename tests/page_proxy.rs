//! The page behind a reverse proxy under a sub-path, on a phone: a tiny real proxy in this test
//! (a thread per connection that passes `/cameras/...` to vidflow as `/...` and answers 404 to
//! anything else, noting it) in front of a real `vidflow`, and the page opened through it in a
//! real browser (`tests/common/browser.rs`) with a phone's narrow window. Every URL the page and
//! its scripts use must stay under the prefix: the live stream draws boxes, the preview shows,
//! a real RTSP camera (`common::rtsp`) plays as video over a WebSocket through the proxy, the
//! events, counts and health views fill, and nothing reaches the proxy outside it. The page
//! must fit the phone's width (no sideways scrolling). The endpoint has a token: the page is
//! opened once as `/cameras/?token=TOKEN` and keeps it in a cookie, as a user's browser would.
//! A screenshot is kept as `phone.png`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::browser;
use crate::common::http as http_client;
use crate::common::rtsp::{RtspServer, RtspServerOptions};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use browser::{DEADLINE, browser, js, screenshot, wait_js};
use common::{BALL_CROSSINGS, free_port, spawn, write};
use headless_chrome::protocol::cdp::Emulation;
use http_client::{get, wait_until};

const PREFIX: &str = "/cameras";
/// The endpoint's token (`[http] token_file`).
const TOKEN: &str = "t0ken-of-the-phone";

/// A phone's window, in CSS pixels.
const PHONE: (u32, u32) = (390, 844);

/// The proxy: its port, and the paths it refused (outside the prefix).
fn proxy(upstream: u16) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let refused = Arc::new(Mutex::new(Vec::new()));
    let seen = refused.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let seen = seen.clone();
            std::thread::spawn(move || pass(client, upstream, &seen));
        }
    });
    (port, refused)
}

/// One connection: the request's head rewritten (path without the prefix, vidflow's Host), then
/// the bytes both ways until either side closes.
fn pass(client: TcpStream, upstream: u16, refused: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut request = String::new();
    if reader.read_line(&mut request).unwrap_or(0) == 0 {
        return;
    }
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if !line.to_ascii_lowercase().starts_with("host:") {
            head.push(line);
        }
    }
    let mut parts = request.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let Some(rest) = target.strip_prefix(PREFIX).filter(|r| r.starts_with('/')) else {
        refused.lock().unwrap().push(target.to_owned());
        let mut client = client;
        let _ = client.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        return;
    };
    let mut server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
    let mut out = format!("{method} {rest} HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\n");
    out.extend(head);
    out.push_str("\r\n");
    server.write_all(out.as_bytes()).unwrap();
    let (mut back, mut to_client) = (server.try_clone().unwrap(), client.try_clone().unwrap());
    let answers = std::thread::spawn(move || {
        let _ = std::io::copy(&mut back, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Both);
    });
    // A body the client sends (none for a GET), then the client's end.
    let mut rest_of_request = Vec::new();
    let _ = reader.read_to_end(&mut rest_of_request);
    let _ = server.write_all(&rest_of_request);
    let _ = server.shutdown(Shutdown::Write);
    let _ = answers.join();
}

#[test]
fn the_page_works_behind_a_proxy_under_a_sub_path_on_a_phone() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let door = RtspServer::start(RtspServerOptions::default()).unwrap();
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "test://ball?width=320&height=240&fps=10"
live_video = "stills"

[sources.door]
uri = "{}"

{BALL_CROSSINGS}

[http]
listen = "127.0.0.1:{port}"
token_file = "http-token"

[events]
path = "events.db"

[sinks.watch]
kind = "preview"
image = "$frame"
"#,
            door.url()
        ),
    );
    let browser = browser(PHONE.0, PHONE.1);
    let tab = browser.new_tab().unwrap();
    tab.activate().unwrap();
    tab.set_default_timeout(DEADLINE);
    // A phone, as Chromium's device mode makes one: without the page's viewport meta, it would
    // lay the page out 980 px wide and shrink it.
    tab.call_method(Emulation::SetDeviceMetricsOverride {
        width: PHONE.0,
        height: PHONE.1,
        device_scale_factor: 2.0,
        mobile: true,
        scale: None,
        screen_width: None,
        screen_height: None,
        position_x: None,
        position_y: None,
        dont_set_visible_size: None,
        screen_orientation: None,
        viewport: None,
        display_feature: None,
        device_posture: None,
    })
    .unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::create_dir_all(&credentials).unwrap();
    std::fs::write(credentials.join("http-token"), format!("{TOKEN}\n")).unwrap();
    let run = spawn(
        dir.path(),
        &["run", p.to_str().unwrap()],
        &[("CREDENTIALS_DIRECTORY", credentials.to_str().unwrap())],
    );
    wait_until("the endpoint answers", DEADLINE, || get(port, "/healthz"));
    let (via, refused) = proxy(port);
    // Not `wait_until_navigated`: what the page shows is waited for below.
    // The link a user gets: the token once, then kept in a cookie and out of the address bar.
    tab.navigate_to(&format!("http://127.0.0.1:{via}{PREFIX}/?token={TOKEN}"))
        .unwrap();

    wait_js(
        &tab,
        "boxes on the camera, through the proxy",
        "(window.vidflow.drawn.cam || {boxes: []}).boxes.length > 0",
    );
    wait_js(
        &tab,
        "the line beside them",
        "(window.vidflow.shapes.cam || []).length === 1",
    );
    wait_js(
        &tab,
        "the preview's picture",
        "(() => { const i = document.querySelector('#cam-cam img'); return i && i.naturalWidth === 320; })()",
    );
    // The camera's video, over a WebSocket through the proxy, with the token's cookie.
    wait_js(
        &tab,
        "the door's video, through the proxy",
        "document.querySelector('#cam-door').dataset.mode === 'video' && \
         (window.vidflow.videoFrames.door || 0) >= 15",
    );
    wait_js(
        &tab,
        "the health view",
        "document.querySelector('#h-sources tr[data-source=cam] td.source-state.state-streaming')",
    );
    wait_js(
        &tab,
        "the events and counts views",
        "window.vidflow.eventsLoaded > 0 && window.vidflow.counts !== null",
    );
    wait_js(
        &tab,
        "a crossing in the timeline",
        "(loadEvents(false), window.vidflow.events.some(e => e.kind === 'crossing'))",
    );
    let urls = js(
        &tab,
        "performance.getEntriesByType('resource').map(e => new URL(e.name).pathname)",
    );
    let urls: Vec<String> = serde_json::from_value(urls).unwrap();
    // (The live stream is not listed until it ends: the boxes drawn above came through it, and
    // so did the picture, as stills.)
    for want in [
        "assets/app.js",
        "assets/video.js",
        "assets/uPlot.iife.min.js",
        "api/sources",
    ] {
        assert!(
            urls.iter().any(|u| u == &format!("{PREFIX}/{want}")),
            "{want} not fetched under {PREFIX}/: {urls:?}"
        );
    }
    assert_eq!(
        js(&tab, "location.pathname + location.search"),
        format!("{PREFIX}/"),
        "the token stays in the address bar"
    );
    // The phone's width: nothing wider than the window.
    let widths = js(
        &tab,
        "[document.documentElement.scrollWidth, window.innerWidth]",
    );
    assert!(
        widths[0].as_u64().unwrap() <= widths[1].as_u64().unwrap(),
        "the page scrolls sideways on a phone: [content, window] = {widths}"
    );
    assert_eq!(widths[1].as_u64(), Some(u64::from(PHONE.0)));
    screenshot(&tab, "phone.png");
    let refused = refused.lock().unwrap().clone();
    assert!(
        refused.is_empty(),
        "the page asked for URLs outside {PREFIX}/: {refused:?}"
    );
    drop(tab);
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}
