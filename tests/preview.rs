//! The live preview on a real `vidflow` process: `/preview/SOURCE` streams JPEGs that decode
//! and change, none is encoded before somebody watches, a source without a preview sink is a
//! clear 404, the page shows the moving preview and the counters in headless Chromium
//! (Debian's `chromium`, driven by `tests/common/browser.rs`), and a stream ends (its slot
//! freed) when its source stalls or a reload removes its preview sink. The preview is found in
//! the page's screenshot by what it shows (a box the source's size, black with the moving ball
//! of `test://ball`), never at a fixed place, so a change of margins or fonts moves nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::browser;
use crate::common::http as http_client;
use crate::common::rtsp;

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use common::{Running, free_port, spawn_run, write};
use headless_chrome::Tab;
use http_client::{
    assert_healthz_answers_quickly, get, open, read_part, scrape, value, wait_for_frames,
    wait_until,
};
use opencv::core::{Mat, MatTraitConst, Rect, Vector};
use opencv::imgcodecs;
use rtsp::{RtspServer, RtspServerOptions};

/// Guards against a hang only.
const DEADLINE: Duration = Duration::from_secs(120);

/// `cam` (a moving ball) has a preview sink; `still` has none.
fn start(dir: &Path) -> (Running, u16) {
    let port = free_port();
    let p = write(
        dir,
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"test://ball?width=320&height=240&fps=15\"\n\
             [sources.still]\nuri = \"test://smpte?width=160&height=120&fps=5\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [sinks.watch]\nkind = \"preview\"\nimage = \"$frame\"\nsources = [\"cam\"]\nmax_fps = 10\n"
        ),
    );
    (spawn_run(&p, &[], dir), port)
}

fn decode(bytes: &[u8]) -> Mat {
    let mat =
        imgcodecs::imdecode(&Vector::<u8>::from_slice(bytes), imgcodecs::IMREAD_COLOR).unwrap();
    assert!(!mat.empty(), "not a decodable image");
    mat
}

/// Pixels that differ between two images of one size.
fn differing(a: &Mat, b: &Mat) -> i32 {
    let mut diff = Mat::default();
    opencv::core::absdiff(a, b, &mut diff).unwrap();
    let mut grey = Mat::default();
    opencv::imgproc::cvt_color_def(&diff, &mut grey, opencv::imgproc::COLOR_BGR2GRAY).unwrap();
    opencv::core::count_non_zero(&grey).unwrap()
}

#[test]
fn mjpeg_parts_decode_and_change_and_nothing_is_encoded_before_a_client_watches() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    // The sink has seen frames (each skipped: nobody watches) and encoded none.
    let before = wait_until("the preview sink took 20 frames", DEADLINE, || {
        let s = scrape(port)?;
        (value(&s, "vidflow_sink_skipped_total", &[("sink", "watch")])? >= 20.0).then_some(s)
    });
    assert_eq!(
        value(&before, "vidflow_preview_jpegs_total", &[("source", "cam")]),
        Some(0.0)
    );
    assert_eq!(
        value(&before, "vidflow_sink_written_total", &[("sink", "watch")]),
        Some(0.0)
    );

    let (status, headers, mut reader) = open(port, "/preview/cam").unwrap();
    assert_eq!(status, 200);
    assert!(
        headers
            .iter()
            .any(|h| h.starts_with("Content-Type: multipart/x-mixed-replace; boundary=")),
        "{headers:?}"
    );
    let first = decode(&read_part(&mut reader));
    let second = decode(&read_part(&mut reader));
    assert_eq!((first.cols(), first.rows()), (320, 240));
    assert!(
        differing(&first, &second) > 0,
        "two parts of a moving ball are the same image"
    );
    let after = scrape(port).unwrap();
    assert!(value(&after, "vidflow_preview_jpegs_total", &[("source", "cam")]).unwrap() >= 2.0);
    drop(reader);

    let (status, body) = get(port, "/preview/still").unwrap();
    assert_eq!(status, 404);
    assert!(
        body.contains("source \"still\" has no preview sink"),
        "{body}"
    );
    let (status, body) = get(port, "/preview/nope").unwrap();
    assert_eq!(status, 404);
    assert!(body.contains("no source \"nope\""), "{body}");

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

/// The sources' size in [`start`], which the page shows at its own size.
const SIZE: (i32, i32) = (320, 240);

/// Bright pixels (the white ball; the page's grey text is #ccc, darker) in `image`.
fn bright(image: &Mat) -> i32 {
    let mut grey = Mat::default();
    opencv::imgproc::cvt_color_def(image, &mut grey, opencv::imgproc::COLOR_BGR2GRAY).unwrap();
    let mut mask = Mat::default();
    opencv::imgproc::threshold(
        &grey,
        &mut mask,
        230.0,
        255.0,
        opencv::imgproc::THRESH_BINARY,
    )
    .unwrap();
    opencv::core::count_non_zero(&mask).unwrap()
}

/// The boxes of the page the size of a source with a black background, wherever the layout put
/// them: a preview (the ball pattern is drawn on black) or the box of a source without one.
fn dark_boxes(page: &Mat) -> Vec<Rect> {
    let mut grey = Mat::default();
    opencv::imgproc::cvt_color_def(page, &mut grey, opencv::imgproc::COLOR_BGR2GRAY).unwrap();
    let mut dark = Mat::default();
    opencv::imgproc::threshold(
        &grey,
        &mut dark,
        30.0,
        255.0,
        opencv::imgproc::THRESH_BINARY_INV,
    )
    .unwrap();
    let (mut labels, mut stats, mut centroids) = (Mat::default(), Mat::default(), Mat::default());
    let n = opencv::imgproc::connected_components_with_stats(
        &dark,
        &mut labels,
        &mut stats,
        &mut centroids,
        8,
        opencv::core::CV_32S,
    )
    .unwrap();
    let stat = |i: i32, what: i32| *stats.at_2d::<i32>(i, what).unwrap();
    (1..n)
        .map(|i| {
            use opencv::imgproc::{CC_STAT_HEIGHT, CC_STAT_LEFT, CC_STAT_TOP, CC_STAT_WIDTH};
            Rect::new(
                stat(i, CC_STAT_LEFT),
                stat(i, CC_STAT_TOP),
                stat(i, CC_STAT_WIDTH),
                stat(i, CC_STAT_HEIGHT),
            )
        })
        .filter(|r| (r.width - SIZE.0).abs() <= 2 && (r.height - SIZE.1).abs() <= 2)
        .collect()
}

fn area(page: &Mat, rect: Rect) -> Mat {
    Mat::roi(page, rect).unwrap().try_clone().unwrap()
}

/// A screenshot of the page, kept as `target/tmp/page/NAME`, once a box of it shows the ball
/// (the first JPEG may come after the page is drawn: a few tries).
fn screenshot(tab: &Tab, name: &str) -> Mat {
    for _ in 0..5 {
        let path = browser::screenshot(tab, name);
        let page = imgcodecs::imread(path.to_str().unwrap(), imgcodecs::IMREAD_COLOR).unwrap();
        assert!(!page.empty(), "{} is not an image", path.display());
        if dark_boxes(&page)
            .iter()
            .any(|b| bright(&area(&page, *b)) > 0)
        {
            return page;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("no box of the page's screenshot {name} shows the ball");
}

#[test]
fn the_page_in_headless_chromium_shows_a_moving_preview_and_counters() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    // The one-file status page (the full page, `/`, has its own tests: tests/page.rs).
    let url = format!("http://127.0.0.1:{port}/simple");
    let browser = browser::browser(800, 600);
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(DEADLINE);
    wait_until("the endpoint answers", DEADLINE, || get(port, "/healthz"));
    // Not `wait_until_navigated`: the preview's MJPEG stream keeps the page loading.
    tab.navigate_to(&url).unwrap();
    browser::wait_js(
        &tab,
        "the preview's first JPEG",
        "(document.getElementById('preview-cam') || {}).naturalWidth",
    );

    let first = screenshot(&tab, "preview-page-1.png");
    std::thread::sleep(Duration::from_secs(1));
    let second = screenshot(&tab, "preview-page-2.png");
    // Two boxes the sources' size, wherever the page put them: `cam`'s preview, which moves,
    // and `still`'s "no preview" box, which does not.
    let boxes = dark_boxes(&second);
    assert_eq!(boxes, dark_boxes(&first), "the layout moved");
    assert_eq!(boxes.len(), 2, "{boxes:?} in preview-page-2.png");
    let (moving, still): (Vec<Rect>, Vec<Rect>) = boxes
        .into_iter()
        .partition(|b| differing(&area(&first, *b), &area(&second, *b)) > 0);
    assert_eq!(
        (moving.len(), still.len()),
        (1, 1),
        "the preview did not move in a second, or the other box did (preview-page-*.png)"
    );
    // What moves is `cam`'s own picture: a ball the size the stream's JPEGs show it.
    let (status, _, mut reader) = open(port, "/preview/cam").unwrap();
    assert_eq!(status, 200);
    let jpeg = bright(&decode(&read_part(&mut reader)));
    drop(reader);
    let shown = bright(&area(&second, moving[0]));
    assert!(
        jpeg > 0 && shown * 2 > jpeg && shown < jpeg * 2,
        "the ball covers {shown} pixels on the page, {jpeg} in a JPEG of the stream"
    );
    assert_eq!(bright(&area(&second, still[0])), 0, "preview-page-2.png");

    browser::wait_js(
        &tab,
        "a decoded counter",
        "Number((document.querySelector('[data-counter=decoded]') || {}).textContent)",
    );
    let dom = browser::js(&tab, "document.documentElement.outerHTML");
    let dom = dom.as_str().unwrap();
    let decoded = dom
        .split("data-counter=\"decoded\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no decoded counter in the page:\n{dom}"));
    assert!(decoded > 0, "{dom}");
    assert!(dom.contains("id=\"preview-cam\""), "{dom}");
    assert!(dom.contains("no preview sink for this source"), "{dom}");

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

/// Reads a stream until the daemon closes it; what came after the parts read so far.
fn read_to_close(reader: &mut impl Read) -> Vec<u8> {
    let mut rest = Vec::new();
    reader
        .read_to_end(&mut rest)
        .expect("the stream ends with a close, not a timeout");
    rest
}

/// The preview streams of `source` the daemon counts now.
fn watchers(port: u16, source: &str) -> Option<f64> {
    value(
        &scrape(port)?,
        "vidflow_preview_watchers",
        &[("source", source)],
    )
}

#[test]
fn a_watcher_whose_source_stalls_is_let_go_and_its_slot_freed() {
    let dir = tempfile::tempdir().unwrap();
    let server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let port = free_port();
    // A long stall_timeout: the source keeps its session while the server sends no frame.
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"{}\"\nstall_timeout_ms = 60000\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [sinks.watch]\nkind = \"preview\"\nimage = \"$frame\"\n",
            server.url()
        ),
    );
    let run = spawn_run(&p, &[], dir.path());
    wait_for_frames(port, "cam", 5, DEADLINE);
    let (status, _, mut reader) = open(port, "/preview/cam").unwrap();
    assert_eq!(status, 200);
    decode(&read_part(&mut reader));
    assert_eq!(watchers(port, "cam"), Some(1.0));

    assert!(server.pause_frames() > 0, "no media to pause");
    read_to_close(&mut reader);
    wait_until("the watcher's slot freed", DEADLINE, || {
        (watchers(port, "cam")? == 0.0).then_some(())
    });
    assert_healthz_answers_quickly(port);

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

#[test]
fn a_watcher_whose_preview_sink_a_reload_removes_is_let_go_and_its_slot_freed() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    wait_until("the endpoint answers", DEADLINE, || get(port, "/healthz"));
    let (status, _, mut reader) = open(port, "/preview/cam").unwrap();
    assert_eq!(status, 200);
    decode(&read_part(&mut reader));
    assert_eq!(watchers(port, "cam"), Some(1.0));

    // The same pipeline with a JSONL sink in the preview sink's place.
    let p = dir.path().join("p.toml");
    let text = std::fs::read_to_string(&p).unwrap();
    let without = text.split("[sinks.watch]").next().unwrap().to_owned()
        + "[sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n";
    write(dir.path(), "p.toml", &without);
    run.signal("HUP");
    run.wait_for_stderr("reload applied", DEADLINE);
    read_to_close(&mut reader);
    wait_until("the watcher's slot freed", DEADLINE, || {
        (watchers(port, "cam")? == 0.0).then_some(())
    });
    let (status, body) = get(port, "/preview/cam").unwrap();
    assert_eq!(status, 404, "{body}");

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}
