//! The page with six cameras, in a real browser (Debian's `chromium`, `tests/common/browser.rs`),
//! on a real `vidflow` (six `test://ball` sources, each with its preview, motion, a tracker and
//! a line counter, and the event store): every camera's picture changes, and the events, the
//! counts and the health view load, while the page holds at most two long-lived connections to
//! vidflow, counted from the kernel's table of TCP sockets (`/proc/net/tcp`); then the same
//! with a second tab. A browser opens at most six connections per host (HTTP/1.1): a page with a
//! connection per camera would have none left for its API requests.
//!
//! The one-file status page (`/simple`) the same way: six pictures that change and every
//! camera's counters, on at most two long-lived connections.
//!
//! Beside it, on the same kind of run: a live client that asked for stills and reads nothing
//! does not hold up another that reads, has its stills dropped and counted, and is closed.
//!
//! And a run whose descriptor limit leaves room for one live client: a page refused (503) while
//! another client holds it says it is reconnecting, and its pictures come once the place is
//! free; `/simple` likewise after the page's tab closes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::browser;
use crate::common::http as http_client;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use browser::{DEADLINE, browser, js, screenshot, wait_js};
use common::{BALL_CROSSINGS, Running, free_port, spawn_command, spawn_run, vidflow, write};
use headless_chrome::Tab;
use http_client::{get, wait_until};

const CAMERAS: usize = 6;
/// Long-lived connections a tab may hold: its live stream, and one spare (a connection the
/// browser opened ahead of a request).
const PER_TAB: usize = 2;
/// How long a connection must stay open to count as long-lived: past the endpoint's deadline
/// for a request head (5 s), so an idle connection opened ahead of a request is not counted.
const LONG_LIVED: Duration = Duration::from_secs(7);

/// Six moving balls, each seen by motion, tracked and counted across the middle line.
fn pipeline(dir: &Path, port: u16) -> PathBuf {
    let mut text = String::new();
    for n in 1..=CAMERAS {
        // Stills (what this page is about), not the video vidflow would encode for them.
        text += &format!(
            "[sources.cam{n}]\nuri = \"test://ball?width=320&height=240&fps=10\"\n\
             live_video = \"stills\"\n\n"
        );
    }
    text += &format!(
        r#"
{BALL_CROSSINGS}

[http]
listen = "127.0.0.1:{port}"

[events]
path = "events.db"

[sinks.preview]
kind = "preview"
image = "$frame"
max_fps = 5
"#
    );
    write(dir, "p.toml", &text)
}

fn start(dir: &Path) -> (Running, u16) {
    let port = free_port();
    let run = spawn_run(&pipeline(dir, port), &[], dir);
    wait_until("the endpoint answers", DEADLINE, || get(port, "/healthz"));
    (run, port)
}

/// The client ports of the connections to `port` established now (the server's side of each,
/// in /proc/net/tcp and tcp6).
fn connections(port: u16) -> BTreeSet<u16> {
    let mut peers = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port_of = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap(), 16).unwrap();
            // State 01: established.
            if f[3] == "01" && port_of(f[1]) == port {
                peers.insert(port_of(f[2]));
            }
        }
    }
    peers
}

/// The connections to `port` that stayed established through [`LONG_LIVED`].
fn long_lived(port: u16) -> BTreeSet<u16> {
    let start = Instant::now();
    let mut kept = connections(port);
    while start.elapsed() < LONG_LIVED {
        std::thread::sleep(Duration::from_millis(250));
        let now = connections(port);
        kept.retain(|p| now.contains(p));
    }
    kept
}

/// Where a page shows its cameras: each camera's element (its `id` names it) and its picture.
struct Layout {
    cards: &'static str,
    img: &'static str,
}

/// The page at `/`.
const PAGE: Layout = Layout {
    cards: "#grid .cam",
    img: ".view img",
};
/// The one-file status page at `/simple`.
const SIMPLE: Layout = Layout {
    cards: "#sources .source",
    img: "img",
};

/// Each camera's picture as the page shows it, as a hash of its pixels (null before the first).
fn pictures(tab: &Tab, at: &Layout) -> BTreeMap<String, Option<u64>> {
    let v = js(
        tab,
        &format!(
            "Object.fromEntries([...document.querySelectorAll('{}')].map(c => {{ \
               const i = c.querySelector('{}'); \
               if (!i || !i.complete || !i.naturalWidth) return [c.id, null]; \
               const cv = document.createElement('canvas'); cv.width = 80; cv.height = 60; \
               const g = cv.getContext('2d'); g.drawImage(i, 0, 0, 80, 60); \
               const d = g.getImageData(0, 0, 80, 60).data; let h = 0; \
               for (let k = 0; k < d.length; k++) h = (h * 31 + d[k]) >>> 0; \
               return [c.id, h]; }}))",
            at.cards, at.img
        ),
    );
    serde_json::from_value(v).unwrap()
}

/// Waits until every camera's picture has changed from the first one the page showed.
fn every_picture_changes(tab: &Tab, at: &Layout) {
    wait_js(
        tab,
        "the six cameras on the page",
        &format!(
            "document.querySelectorAll('{}').length === {CAMERAS}",
            at.cards
        ),
    );
    let start = Instant::now();
    let mut first: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        let now = pictures(tab, at);
        assert_eq!(now.len(), CAMERAS, "{now:?}");
        for (cam, hash) in &now {
            if let Some(h) = hash {
                first.entry(cam.clone()).or_insert(*h);
            }
        }
        let changed = now
            .iter()
            .filter(|(cam, h)| h.is_some() && first.get(*cam) != h.as_ref())
            .count();
        if changed == CAMERAS {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "pictures that changed: {changed} of {CAMERAS}; shown first {first:?}, now {now:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Waits until the page's events, counts and health view hold what the run did.
fn events_counts_and_health_load(tab: &Tab) {
    wait_js(
        tab,
        "the events timeline",
        "document.querySelectorAll('#timeline li[data-id]').length > 0",
    );
    // An event without a picture (these have no snapshot sink) is a compact row, never an
    // empty card.
    let cards = js(
        tab,
        "[...document.querySelectorAll('#timeline li[data-id]')] \
           .filter(li => !li.querySelector('img.thumb') && !li.classList.contains('compact')) \
           .map(li => li.dataset.kind)",
    );
    assert_eq!(cards, serde_json::json!([]), "events shown as empty cards");
    wait_js(
        tab,
        "the counts table",
        "window.vidflow.counts && window.vidflow.counts.keys.length > 0 && \
         document.querySelectorAll('#totals tr[data-key]').length",
    );
    wait_js(
        tab,
        "the health view",
        &format!("document.querySelectorAll('#h-sources tr[data-source]').length === {CAMERAS}"),
    );
}

fn open_page(browser: &headless_chrome::Browser, port: u16) -> std::sync::Arc<Tab> {
    open(browser, port, "/")
}

fn open(browser: &headless_chrome::Browser, port: u16, path: &str) -> std::sync::Arc<Tab> {
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(DEADLINE);
    // Not `wait_until_navigated`: a page of streams may never finish loading.
    tab.navigate_to(&format!("http://127.0.0.1:{port}{path}"))
        .unwrap();
    tab
}

#[test]
fn six_cameras_show_on_one_connection_per_tab_and_the_rest_of_the_page_loads() {
    let dir = tempfile::tempdir().unwrap();
    let browser = browser(1280, 1400);
    let (run, port) = start(dir.path());

    let first = open_page(&browser, port);
    every_picture_changes(&first, &PAGE);
    events_counts_and_health_load(&first);
    screenshot(&first, "cameras-1.png");
    let held = long_lived(port);
    println!("long-lived connections of one tab: {}", held.len());
    assert!(
        held.len() <= PER_TAB,
        "one tab holds {} long-lived connections (client ports {held:?})",
        held.len()
    );

    let second = open_page(&browser, port);
    every_picture_changes(&second, &PAGE);
    events_counts_and_health_load(&second);
    every_picture_changes(&first, &PAGE);
    screenshot(&second, "cameras-2.png");
    let held = long_lived(port);
    println!("long-lived connections of two tabs: {}", held.len());
    assert!(
        held.len() <= 2 * PER_TAB,
        "two tabs hold {} long-lived connections (client ports {held:?})",
        held.len()
    );

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

#[test]
fn the_simple_page_shows_six_cameras_and_its_counters_on_one_long_lived_connection() {
    let dir = tempfile::tempdir().unwrap();
    let browser = browser(1280, 1000);
    let (run, port) = start(dir.path());

    let tab = open(&browser, port, "/simple");
    every_picture_changes(&tab, &SIMPLE);
    wait_js(
        &tab,
        "every camera's decoded counter",
        &format!(
            "[...document.querySelectorAll('[data-counter=decoded]')] \
               .filter(v => Number(v.textContent) > 0).length === {CAMERAS}"
        ),
    );
    screenshot(&tab, "simple-cameras.png");
    let held = long_lived(port);
    println!("long-lived connections of /simple: {}", held.len());
    assert!(
        held.len() <= PER_TAB,
        "/simple holds {} long-lived connections (client ports {held:?})",
        held.len()
    );

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

/// Opens `/api/live?stills=1`; the connection, past the response head.
fn live_with_stills(port: u16) -> TcpStream {
    live_at(port, "/api/live?stills=1")
}

fn live_at(port: u16, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    s
}

#[test]
fn a_live_client_that_asks_frames_0_gets_the_stills_and_no_frame() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    let both = live_with_stills(port);
    both.set_read_timeout(Some(DEADLINE)).unwrap();
    let stills_only = live_at(port, "/api/live?stills=1&frames=0");
    stills_only.set_read_timeout(Some(DEADLINE)).unwrap();
    let (mut both, mut stills_only) = (BufReader::new(both), BufReader::new(stills_only));
    assert!(
        stills_of_every_camera(&mut both, 3) > 0,
        "no frame with stills=1"
    );
    assert_eq!(stills_of_every_camera(&mut stills_only, 3), 0);
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

#[test]
fn a_live_client_that_asks_stills_of_some_cameras_gets_theirs_only() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    let some = live_at(port, "/api/live?stills_of=cam2,cam5,gone&frames=0");
    some.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut some = BufReader::new(some);
    let mut line = String::new();
    some.read_line(&mut line).unwrap();
    assert!(line.contains(" 200 "), "{line}");
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    while seen.values().sum::<usize>() < 20 {
        line.clear();
        assert!(some.read_line(&mut line).unwrap() > 0, "the stream ended");
        if let Some(data) = line.strip_prefix("data: ") {
            let still: serde_json::Value = serde_json::from_str(data).unwrap();
            *seen
                .entry(still["source"].as_str().unwrap().into())
                .or_default() += 1;
        }
    }
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        ["cam2", "cam5"],
        "{seen:?}"
    );
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

/// `/api/health`'s counter `key`.
fn health(port: u16, key: &str) -> Option<u64> {
    let (status, body) = get(port, "/api/health")?;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["live"][key].as_u64()
}

/// Reads `reader`'s events until each camera had `n` stills; how many frames came meanwhile.
fn stills_of_every_camera(reader: &mut impl BufRead, n: usize) -> usize {
    let mut frames = 0;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    // A still's parts so far, per camera (every part but the last has "more").
    let mut parts: BTreeMap<String, String> = BTreeMap::new();
    let mut event = String::new();
    let mut line = String::new();
    while seen.len() < CAMERAS || seen.values().any(|&k| k < n) {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended");
        if let Some(name) = line.strip_prefix("event: ") {
            event = name.trim().to_owned();
            frames += usize::from(event == "frame");
        } else if let Some(data) = line.strip_prefix("data: ").filter(|_| event == "still") {
            let still: serde_json::Value = serde_json::from_str(data).unwrap();
            let source = still["source"].as_str().unwrap().to_owned();
            let joined = parts.entry(source.clone()).or_default();
            joined.push_str(still["jpeg"].as_str().unwrap());
            if still["more"] == true {
                continue;
            }
            assert!(joined.starts_with("/9j/"), "not a JPEG");
            joined.clear();
            *seen.entry(source).or_default() += 1;
        }
    }
    frames
}

#[test]
fn a_live_client_that_reads_nothing_loses_stills_and_is_closed_without_holding_up_another() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    let stuck = live_with_stills(port);
    let reader = live_with_stills(port);
    reader.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut reader = BufReader::new(reader);
    stills_of_every_camera(&mut reader, 2);
    // The stuck client's socket fills, then stills wait for it, one per camera, each replaced by
    // the next; then its frames pass the buffer it may hold, and it is closed.
    wait_until("stills dropped for the stuck client", DEADLINE, || {
        stills_of_every_camera(&mut reader, 1);
        (health(port, "stills_dropped")? > 0).then_some(())
    });
    stills_of_every_camera(&mut reader, 2);
    wait_until("the stuck client closed", DEADLINE, || {
        stills_of_every_camera(&mut reader, 1);
        (health(port, "slow_clients")? >= 1).then_some(())
    });
    stills_of_every_camera(&mut reader, 2);
    drop(stuck);

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

/// What [`pipeline`] opens, as the endpoint counts it.
const PIPELINE: vidflow::daemon::fds::Pipeline = vidflow::daemon::fds::Pipeline {
    sources: CAMERAS,
    record_streams: 0,
    sinks: 1,
    event_store: true,
};

/// A run of [`pipeline`] whose descriptor limit (soft and hard, set before `exec`) leaves
/// room for one live client.
fn start_with_one_live_client(dir: &Path) -> (Running, u16) {
    let port = free_port();
    let nofile = (0..100_000)
        .find(|&n| vidflow::daemon::http::max_live_clients(n, PIPELINE.descriptors()) == 1)
        .unwrap();
    let mut command = vidflow();
    command.arg("run").arg(pipeline(dir, port));
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
    let run = spawn_command(dir, command);
    wait_until("the endpoint answers", DEADLINE, || get(port, "/healthz"));
    assert_eq!(health(port, "max_clients"), Some(1), "{}", run.stderr());
    (run, port)
}

#[test]
fn a_page_refused_a_live_stream_reconnects_and_its_pictures_come() {
    let dir = tempfile::tempdir().unwrap();
    let browser = browser(1280, 1000);
    let (run, port) = start_with_one_live_client(dir.path());
    assert!(
        run.stderr().contains("only 1 live clients"),
        "no warning of the small cap: {}",
        run.stderr()
    );
    // This client holds the only place: the page's stream is refused.
    let mut holder = BufReader::new(live_with_stills(port));
    let mut status = String::new();
    holder.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    let tab = open_page(&browser, port);
    wait_js(
        &tab,
        "the page refused, saying it reconnects",
        "window.vidflow && window.vidflow.reconnects > 0 && \
         document.getElementById('live-state').textContent.includes('reconnecting')",
    );
    assert!(health(port, "refused").unwrap() > 0);
    drop(holder);
    every_picture_changes(&tab, &PAGE);
    wait_js(
        &tab,
        "the page live again",
        "document.getElementById('live-state').textContent === 'live'",
    );
    screenshot(&tab, "reconnected.png");

    // /simple is refused while the page holds the place, and comes once its tab closed.
    let simple = open(&browser, port, "/simple");
    wait_js(
        &simple,
        "/simple refused, saying it reconnects",
        "document.getElementById('live').textContent.includes('reconnecting')",
    );
    tab.close(true).unwrap();
    every_picture_changes(&simple, &SIMPLE);

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}
