//! The page's health view and `GET /api/sources`, on a real `vidflow` watching a camera (a real
//! gst-rtsp-server on 127.0.0.1, `tests/common/rtsp.rs`, with a password) that a `record` sink
//! also records: when the camera goes away, each source's last error shows, in the API and on
//! the page, without the password; its record stream, lost apart from the decoded stream, shows
//! its own state and error; when the camera is back, the state is `streaming` again and the
//! last error stays, with its time. The page runs in a real browser (`tests/common/browser.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::browser;
use crate::common::http as http_client;
use crate::common::rtsp;

use browser::{DEADLINE, browser, screenshot, wait_js};
use common::{free_port, spawn_run, write};
use http_client::{get, wait_until};
use rtsp::{RtspServer, RtspServerOptions};

const PASSWORD: &str = "pa55-of-the-camera";

/// `/api/sources`' entry for `cam`; `None` while nothing listens.
fn cam(port: u16) -> Option<serde_json::Value> {
    let (status, body) = get(port, "/api/sources")?;
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let found = list.as_array().unwrap().iter().find(|s| s["name"] == "cam");
    Some(
        found
            .cloned()
            .unwrap_or_else(|| panic!("no source cam in {body}")),
    )
}

#[test]
fn a_lost_camera_shows_its_last_error_and_its_record_streams_state_without_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = RtspServer::start(RtspServerOptions {
        credentials: Some(("viewer".to_owned(), PASSWORD.to_owned())),
        ..RtspServerOptions::default()
    })
    .unwrap();
    let port = free_port();
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "{}"
stall_timeout_ms = 2000
transport = "tcp"

[sources.cam.reconnect]
initial_delay_ms = 100
max_delay_ms = 500

[http]
listen = "127.0.0.1:{port}"

[sinks.frames]
kind = "jsonl"
path = "frames.jsonl"

[sinks.rec]
kind = "record"
path = "out/{{source}}.mp4"
"#,
            server.url_with_credentials("viewer", PASSWORD)
        ),
    );
    let browser = browser(1280, 1400);
    let tab = browser.new_tab().unwrap();
    tab.activate().unwrap();
    tab.set_default_timeout(DEADLINE);
    let run = spawn_run(&p, &[], dir.path());
    wait_until(
        "the camera streams, and its record stream",
        DEADLINE,
        || {
            let s = cam(port)?;
            (s["state"] == "streaming" && s["record"]["state"] == "streaming").then_some(())
        },
    );
    let before = cam(port).unwrap();
    assert!(before["last_error"].is_null(), "{before}");
    assert!(before["record"]["last_error"].is_null(), "{before}");

    server.stop();
    let lost = wait_until("the loss, with its error", DEADLINE, || {
        let s = cam(port)?;
        (s["state"] != "streaming"
            && s["last_error"]["message"].is_string()
            && s["record"]["last_error"]["message"].is_string())
        .then_some(s)
    });
    let message = lost["last_error"]["message"].as_str().unwrap().to_owned();
    assert!(!message.is_empty());
    assert!(
        lost["last_error"]["at"].as_i64().unwrap() > 1_700_000_000_000,
        "{lost}"
    );
    let text = lost.to_string();
    assert!(!text.contains(PASSWORD), "the password shows: {text}");
    assert!(
        ["retrying", "stalled"].contains(&lost["record"]["state"].as_str().unwrap()),
        "{lost}"
    );

    // The page's health view shows the same, to a person.
    tab.navigate_to(&format!("http://127.0.0.1:{port}/#health"))
        .unwrap();
    let shown = wait_js(
        &tab,
        "the last error in the health view",
        "(() => { const c = document.querySelector('#h-sources tr[data-source=cam] td.last-error'); \
         return c && c.textContent !== 'none' && c.textContent; })()",
    );
    let shown = shown.as_str().unwrap();
    let record = wait_js(
        &tab,
        "the record stream in the health view",
        "document.querySelector('#h-sources tr[data-source=cam] td.record-stream').textContent",
    );
    screenshot(&tab, "health-lost.png");
    let html = wait_js(&tab, "the page's text", "document.body.innerText");
    assert!(
        !html.as_str().unwrap().contains(PASSWORD),
        "the password shows on the page"
    );
    // The page refreshes every 2 s: the error it shows is this loss's or a later retry's.
    assert!(shown.contains(": "), "{shown}");
    let record = record.as_str().unwrap();
    assert!(
        record.starts_with("retrying") || record.starts_with("stalled"),
        "{record}"
    );

    server.restart().unwrap();
    let back = wait_until("the camera back", DEADLINE, || {
        let s = cam(port)?;
        (s["state"] == "streaming" && s["record"]["state"] == "streaming").then_some(s)
    });
    assert!(back["reconnects"].as_u64().unwrap() >= 1, "{back}");
    assert!(
        back["last_error"]["message"].is_string(),
        "the error is kept: {back}"
    );
    wait_js(
        &tab,
        "the health view streaming again",
        "document.querySelector('#h-sources tr[data-source=cam] td.source-state.state-streaming')",
    );
    screenshot(&tab, "health-back.png");
    drop(tab);
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
    assert!(!finished.stderr.contains(PASSWORD));
}
