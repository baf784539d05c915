//! The JSON API on a real `vidflow` (a moving ball followed by `motion` and the tracker,
//! counted across a line, with snapshots and clips of its crossings, a JSONL sink of its tracks
//! and the event store): bad parameters get 400 with a message naming them, a wrong token 401,
//! a path outside the media folders (or a file there vidflow did not write) 404 and never its
//! bytes, a snapshot is served in the byte range asked for, a thousand live clients at once
//! each get frames whose boxes are the ball's tracks the JSONL sink wrote for the same frame
//! (the live thread below the frame path's priority), boxes and lines found in a `resize`d copy
//! come in the frame's pixels, a browser that opens the page once as
//! `/?token=TOKEN` keeps the token in a cookie (Secure behind a TLS proxy), and an event store
//! deleted under the run is made again while frames go on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::{BALL_CROSSINGS, Running, free_port, spawn, write};
use http_client::{request, wait_until};

/// Guards against a hang only.
const DEADLINE: Duration = Duration::from_secs(120);
const TOKEN: &str = "t0ken-of-the-day";

fn start(dir: &Path) -> (Running, u16) {
    start_with(
        dir,
        "test://ball?width=320&height=240&fps=15",
        BALL_CROSSINGS,
    )
}

/// [`start`] with another source and steps (the sinks read `$steps.tracks.tracks` and
/// `$steps.crossing.events`).
fn start_with(dir: &Path, uri: &str, steps: &str) -> (Running, u16) {
    let port = free_port();
    let p = write(
        dir,
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "{uri}"

{steps}

[http]
listen = "127.0.0.1:{port}"
token_file = "http-token"

[events]
path = "events.db"

[sinks.frames]
kind = "jsonl"
path = "frames.jsonl"
include = ["$steps.tracks.tracks"]

[sinks.snapshots]
kind = "snapshot"
image = "$frame"
when = ["$steps.crossing.events"]
dir = "snapshots"
cooldown_s = 0.0
"#
        ),
    );
    let credentials = dir.join("credentials");
    std::fs::create_dir_all(&credentials).unwrap();
    std::fs::write(credentials.join("http-token"), format!("{TOKEN}\n")).unwrap();
    let run = spawn(
        dir,
        &["run", p.to_str().unwrap()],
        &[("CREDENTIALS_DIRECTORY", credentials.to_str().unwrap())],
    );
    (run, port)
}

/// `GET path` with the token: status and body.
fn get(port: u16, path: &str) -> (u16, String) {
    let (status, _, body) = request(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"),
    )
    .unwrap_or_else(|| panic!("no answer to {path}"));
    (status, body)
}

/// `GET path` with the token and more header lines: status, headers, body bytes.
fn get_bytes(port: u16, path: &str, extra: &str) -> (u16, Vec<String>, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n{extra}\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let split = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let mut lines = head.split("\r\n").map(str::to_owned);
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    (status, lines.collect(), all[split + 4..].to_vec())
}

#[test]
fn bad_parameters_get_400_a_wrong_token_401_and_files_outside_the_media_folders_404() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    // A crossing, with its snapshot named.
    let event = wait_until("a crossing with its snapshot", DEADLINE, || {
        let (status, _, body) = request(
            port,
            &format!(
                "GET /api/events?kind=crossing HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
            ),
        )?;
        (status == 200).then_some(())?;
        let list: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
        list.into_iter().find(|e| e["snapshot_url"].is_string())
    });
    assert_eq!(event["label"], "ball", "{event}");
    assert_eq!(event["place"], "middle", "{event}");

    // 401: a wrong token, on every API route.
    for path in [
        "/api/events",
        "/api/sources",
        "/api/live",
        "/api/counts",
        "/",
    ] {
        let (status, _, _) = request(
            port,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer nope\r\n\r\n"
            ),
        )
        .unwrap();
        assert_eq!(status, 401, "{path}");
    }

    // 400, with a message that names the parameter.
    for (path, says) in [
        ("/api/events?limit=0", "limit must be 1 to 1000, not 0"),
        (
            "/api/events?after=yesterday",
            "after \"yesterday\" is not a time",
        ),
        ("/api/events?kind=walk", "kind \"walk\" is not one of"),
        ("/api/events?lable=ball", "unknown parameter \"lable\""),
        ("/api/events?label=%zz", "bad percent-encoding"),
        (
            "/api/counts?bucket=week",
            "bucket \"week\" is not one of minute, hour, day",
        ),
        (
            "/api/recordings?before=noon",
            "before \"noon\" is not a time",
        ),
        // Pages: their size is bounded, their cursor is one the API gave.
        ("/api/counts?limit=0", "limit must be 1 to 10000, not 0"),
        (
            "/api/counts?limit=10001",
            "limit must be 1 to 10000, not 10001",
        ),
        (
            "/api/counts?limit=all",
            "limit \"all\" is not a whole number",
        ),
        (
            "/api/counts?cursor=abc",
            "cursor \"abc\" is not one this API gave",
        ),
        ("/api/recordings?limit=0", "limit must be 1 to 1000, not 0"),
        (
            "/api/recordings?limit=1001",
            "limit must be 1 to 1000, not 1001",
        ),
        (
            "/api/recordings?limit=-5",
            "limit must be 1 to 1000, not -5",
        ),
        (
            "/api/recordings?cursor=abc",
            "cursor \"abc\" is not one this API gave",
        ),
        ("/api/events/abc", "event id \"abc\" is not a whole number"),
    ] {
        let (status, body) = get(port, path);
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }

    // 404, and never the bytes: paths out of the folders, a file vidflow did not write.
    std::fs::write(dir.path().join("snapshots/planted.jpg"), b"not vidflow's").unwrap();
    for path in [
        "/api/media/snapshots/..%2Fp.toml",
        "/api/media/snapshots/../p.toml",
        "/api/media/snapshots/..%2Fcredentials%2Fhttp-token",
        "/api/media/snapshots/planted.jpg",
        "/api/media/nosink/p.toml",
        "/api/media/snapshots/0123456789abcdef/..%2Fp.toml",
        "/api/media/snapshots/..%2F..%2F/p.toml",
        "/api/media/snapshots/0123456789abcdef/planted.jpg",
        "/api/events/999999999/snapshot.jpg",
        "/api/events/1/clip.mp4x",
    ] {
        let (status, body) = get(port, path);
        assert_eq!(status, 404, "{path}: {body}");
        assert!(
            !body.contains(TOKEN) && !body.contains("not vidflow's") && !body.contains("[sources"),
            "{path}: {body}"
        );
    }

    // A snapshot, whole and in the range asked for.
    let url = format!("/{}", event["snapshot_url"].as_str().unwrap());
    let (status, _, whole) = get_bytes(port, &url, "");
    assert_eq!(status, 200);
    assert_eq!(&whole[..3], b"\xff\xd8\xff", "a JPEG");
    let file = std::fs::read(dir.path().join(event["snapshot"].as_str().unwrap())).unwrap();
    assert_eq!(whole, file);
    let (status, headers, part) = get_bytes(port, &url, "Range: bytes=10-109\r\n");
    assert_eq!(status, 206, "{headers:?}");
    assert!(
        headers.contains(&format!("Content-Range: bytes 10-109/{}", file.len())),
        "{headers:?}"
    );
    assert_eq!(part, file[10..110]);
    let (status, _, _) = get_bytes(port, &url, &format!("Range: bytes={}-\r\n", file.len()));
    assert_eq!(status, 416);

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

/// Opens `/api/live/cam`; the connection, past the response head.
fn live_client(port: u16) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        s,
        "GET /api/live/cam HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    )
    .unwrap();
    BufReader::new(s)
}

/// The next `frame` event's data.
fn next_frame(reader: &mut BufReader<TcpStream>) -> serde_json::Value {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended");
        if let Some(data) = line.strip_prefix("data: ") {
            return serde_json::from_str(data).unwrap();
        }
    }
}

/// Live clients the test holds at once.
const LIVE_CLIENTS: usize = 1000;

/// Descriptors the thousand-client test needs: this process holds the clients (and its own,
/// with room: 200), and vidflow, which inherits its limit and raises its soft one to the hard
/// one, needs a cap of a thousand live clients beside what the pipeline of [`start`] holds.
fn thousand_clients_descriptors() -> u64 {
    let pipeline = vidflow::daemon::fds::Pipeline {
        sources: 1,
        record_streams: 0,
        sinks: 2,
        event_store: true,
    }
    .descriptors();
    let vidflow = (1..)
        .find(|&n| vidflow::daemon::http::max_live_clients(n, pipeline) >= LIVE_CLIENTS)
        .unwrap();
    vidflow.max(LIVE_CLIENTS as u64 + 200)
}

#[test]
fn a_thousand_live_clients_each_get_the_frames_boxes() {
    let needed = thousand_clients_descriptors();
    if !common::raise_fd_limit(needed, "a_thousand_live_clients_each_get_the_frames_boxes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    wait_until("the endpoint", DEADLINE, || {
        http_client::get(port, "/healthz").filter(|(s, _)| *s == 200)
    });
    // Once motion has learnt the background and the ball is followed (written by the JSONL
    // sink): from there on every frame has its box.
    let lines = dir.path().join("frames.jsonl");
    wait_until("the ball followed", DEADLINE, || {
        let text = std::fs::read_to_string(&lines).ok()?;
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|l| {
                l["steps.tracks.tracks"]
                    .as_array()
                    .is_some_and(|t| !t.is_empty())
            })
            .then_some(())
    });
    // One after the other: the endpoint holds 64 requests still being read at once (the
    // oldest goes for a new one), and these are taken in as fast as they come.
    let mut clients: Vec<_> = (0..LIVE_CLIENTS)
        .map(|_| {
            let mut reader = live_client(port);
            let mut status = String::new();
            reader.read_line(&mut status).unwrap();
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            reader
        })
        .collect();
    let mut seqs = Vec::new();
    for reader in &mut clients {
        let frame = next_frame(reader);
        assert_eq!(frame["source"], "cam");
        assert_eq!(
            (frame["width"].as_u64(), frame["height"].as_u64()),
            (Some(320), Some(240))
        );
        seqs.push(frame["seq"].as_u64().unwrap());
    }
    // The frames go on for all of them: each gets a later one.
    let mut shown = Vec::new();
    for (reader, seq) in clients.iter_mut().zip(&seqs) {
        let later = loop {
            let f = next_frame(reader);
            if f["seq"].as_u64().unwrap() > *seq {
                break f;
            }
        };
        // The line the counter tests, to draw beside the boxes.
        assert_eq!(
            later["shapes"],
            serde_json::json!([{"step": "crossing", "name": "middle", "kind": "line",
                "points": [[160.0, 240.0], [160.0, 0.0]]}]),
            "{later}"
        );
        shown.push(later);
    }
    drop(clients);
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
    // Each frame's boxes are the ball's tracks of that very frame, as the JSONL sink wrote
    // them: the same ids, labels, scores and boxes, in the picture.
    let written: std::collections::HashMap<u64, serde_json::Value> =
        common::jsonl(&dir.path().join("frames.jsonl"))
            .into_iter()
            .map(|l| {
                (
                    l["frame"].as_u64().unwrap(),
                    l["steps.tracks.tracks"].clone(),
                )
            })
            .collect();
    for frame in &shown {
        let seq = frame["seq"].as_u64().unwrap();
        let tracks = written[&seq].as_array().unwrap();
        let expected: Vec<serde_json::Value> = tracks
            .iter()
            .map(|t| {
                let b = &t["box"];
                let mut one = serde_json::json!({"id": t["track_id"], "label": t["class"],
                    "score": t["confidence"], "box": [b["x"], b["y"], b["width"], b["height"]],
                    "predicted": t["predicted"].as_bool().unwrap_or(false)});
                // Its speed as the tracker gave it: in px/s, this source has no calibration.
                assert!(t.get("speed_kmh").is_none(), "{t}");
                if let Some(speed) = t.get("speed_px_s") {
                    one["speed"] = speed.clone();
                    one["speed_unit"] = "px/s".into();
                }
                one
            })
            .collect();
        let boxes = frame["boxes"].as_array().unwrap();
        assert_eq!(boxes, &expected, "frame {seq}");
        // The ball is always in the picture, and followed.
        assert!(!boxes.is_empty(), "frame {seq}: no box");
        for b in boxes {
            assert_eq!(b["label"], "ball", "{b}");
            let [x, y, w, h] = [0, 1, 2, 3].map(|i| b["box"][i].as_f64().unwrap());
            assert!(
                w > 0.0 && h > 0.0 && x >= 0.0 && y >= 0.0 && x + w <= 320.0 && y + h <= 240.0,
                "frame {seq}: {b}"
            );
        }
    }
}

#[test]
#[cfg(target_os = "linux")]
fn the_live_thread_yields_the_cores_to_the_frame_path() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    wait_until("the endpoint", DEADLINE, || {
        http_client::get(port, "/healthz").filter(|(s, _)| *s == 200)
    });
    let mut reader = live_client(port);
    let frame = next_frame(&mut reader);
    assert_eq!(frame["source"], "cam");
    // The live thread's writes (one per client per frame) run below the executor's priority,
    // so that a thousand clients take their cores from the live stream, not from the frames.
    let threads = common::nice_by_thread(run.pid());
    let nice = |name: &str| {
        threads
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no thread {name:?} in {threads:?}"))
            .1
    };
    // 10 steps below, or the lowest priority there is (19) for a daemon already niced.
    assert_eq!(
        nice("vidflow-http-li"),
        (nice("vidflow-executo") + 10).min(19),
        "{threads:?}"
    );
    drop(reader);
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

/// The ball followed twice: on the frame ([`BALL_CROSSINGS`]), and on a copy `resize`d to
/// half its size, whose tracks the line, drawn in that copy's pixels, counts.
fn ball_twice() -> String {
    let counted = BALL_CROSSINGS.replace(
        "tracks = \"$steps.tracks.tracks\"\nline",
        "tracks = \"$steps.little.tracks\"\nline",
    );
    assert_ne!(counted, BALL_CROSSINGS);
    counted
        + r#"
[steps.small]
kind = "resize"
image = "$frame"
width = 320
height = 240

[steps.half]
kind = "motion"
image = "$steps.small.image"
class = "ball"
min_area = 12.0

[steps.little]
kind = "tracker"
detections = "$steps.half.detections"
"#
}

#[test]
fn boxes_and_lines_found_in_a_resized_copy_come_in_the_frames_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start_with(
        dir.path(),
        "test://ball?width=640&height=480&fps=15",
        &ball_twice(),
    );
    wait_until("the endpoint", DEADLINE, || {
        http_client::get(port, "/healthz").filter(|(s, _)| *s == 200)
    });
    let mut reader = live_client(port);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // Frames where both trackers have the ball, with the ball away from the frame's top left
    // corner (where half its place would be near its place).
    let mut compared = 0;
    while compared < 10 {
        let frame = next_frame(&mut reader);
        let boxes: Vec<Vec<f64>> = frame["boxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                b["box"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect()
            })
            .collect();
        if let Some(shape) = frame["shapes"].as_array().and_then(|s| s.first()) {
            // The line [[160, 240], [160, 0]] of the 320x240 copy, on the 640x480 frame.
            assert_eq!(
                shape["points"],
                serde_json::json!([[320.0, 480.0], [320.0, 0.0]])
            );
        }
        let [whole, half] = boxes.as_slice() else {
            continue;
        };
        let centre = |b: &[f64]| (b[0] + b[2] / 2.0, b[1] + b[3] / 2.0);
        let (w, h) = (centre(whole), centre(half));
        if w.0 < 100.0 && w.1 < 100.0 {
            continue;
        }
        // Within 4 pixels of the frame: a pixel of the copy is 2 of the frame's, and each
        // motion mask has its own edge.
        assert!(
            (w.0 - h.0).abs() <= 4.0 && (w.1 - h.1).abs() <= 4.0,
            "the ball on the frame at {w:?}, from the half-size copy at {h:?}: {boxes:?}"
        );
        assert!((whole[2] - half[2]).abs() <= 6.0, "{boxes:?}");
        compared += 1;
    }
    drop(reader);
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

#[test]
fn a_browser_opens_the_page_with_the_token_once_and_keeps_it_in_a_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    wait_until("the endpoint", DEADLINE, || {
        http_client::get(port, "/healthz").filter(|(s, _)| *s == 200)
    });
    let raw = |target: &str, extra: &str| {
        request(
            port,
            &format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n"),
        )
        .unwrap()
    };
    // Without the token, the 401 says how a browser gets in.
    let (status, _, body) = raw("/", "");
    assert_eq!(status, 401);
    assert!(body.contains("/?token=TOKEN"), "{body}");
    assert_eq!(raw("/?token=wrong", "").0, 401);
    // The link with the token: to the page, without it in the address, the token in a cookie.
    let (status, headers, _) = raw(&format!("/?token={TOKEN}"), "");
    assert_eq!(status, 303, "{headers:?}");
    assert!(headers.iter().any(|h| h == "Location: ./"), "{headers:?}");
    let set = headers
        .iter()
        .find_map(|h| h.strip_prefix("Set-Cookie: "))
        .unwrap_or_else(|| panic!("no cookie: {headers:?}"));
    assert!(set.ends_with("; HttpOnly; SameSite=Strict"), "{set}");
    let cookie = set.split(';').next().unwrap();
    // Behind a proxy that took the browser's TLS (as docs/guides/events-and-page.md sets nginx
    // up), the cookie is Secure: the browser never sends it over plain HTTP.
    for says_https in [
        "X-Forwarded-Proto: https\r\n",
        "Forwarded: for=192.0.2.7;proto=https\r\n",
    ] {
        let (status, headers, _) = raw(&format!("/?token={TOKEN}"), says_https);
        assert_eq!(status, 303, "{headers:?}");
        let set = headers
            .iter()
            .find_map(|h| h.strip_prefix("Set-Cookie: "))
            .unwrap_or_else(|| panic!("no cookie: {headers:?}"));
        assert!(
            set.ends_with("; HttpOnly; SameSite=Strict; Secure"),
            "{says_https}: {set}"
        );
    }
    // The cookie counts as the token for the page, its API and its live stream; a wrong one
    // does not, nor does ?token= on anything but the page.
    for target in ["/", "/api/sources", "/assets/app.js"] {
        let (status, _, body) = raw(target, &format!("Cookie: other=1; {cookie}\r\n"));
        assert_eq!(status, 200, "{target}: {body}");
    }
    assert_eq!(
        raw("/api/sources", "Cookie: vidflow_token=wrong\r\n").0,
        401
    );
    assert_eq!(raw(&format!("/api/sources?token={TOKEN}"), "").0, 401);
    let mut live = TcpStream::connect(("127.0.0.1", port)).unwrap();
    live.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        live,
        "GET /api/live/cam HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {cookie}\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(live);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(next_frame(&mut reader)["source"], "cam");
    drop(reader);
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

/// The event store's file deleted under a running daemon (as a user cleaning a disk would),
/// while a track is open in it: frames go on, the loss is logged once, and the store is made
/// again and written to; the open track gets a row of its own in the new file, and no row
/// there takes the old file's updates.
#[test]
fn an_event_store_deleted_under_the_run_is_made_again_and_frames_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(dir.path());
    let health = || -> serde_json::Value {
        let (status, body) = get(port, "/api/health");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    wait_until("the endpoint answers", DEADLINE, || {
        request(port, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    });
    let stored = |h: &serde_json::Value| h["events"]["events"].as_u64().unwrap();
    let decoded = |h: &serde_json::Value| h["run"]["sources"][0]["decoded"].as_u64().unwrap();
    let db = dir.path().join("events.db");
    // A track open in the file (its row written, its end still moving) when it goes.
    wait_until("a track in the store", DEADLINE, || {
        let conn = rusqlite::Connection::open(&db).ok()?;
        let n: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM events WHERE kind = 'track'",
                [],
                |r| r.get(0),
            )
            .ok()?;
        (n > 0).then_some(())
    });
    for name in ["events.db", "events.db-wal", "events.db-shm"] {
        let _ = std::fs::remove_file(dir.path().join(name));
    }
    let before = health();
    let again = wait_until("the store made again", DEADLINE, || {
        let h = health();
        (h["events"]["reopened"].as_u64().unwrap() >= 1 && db.exists()).then_some(h)
    });
    wait_until("events written to the new file", DEADLINE, || {
        (stored(&health()) > stored(&again)).then_some(())
    });
    assert!(decoded(&health()) > decoded(&before), "{}", health());
    // A crossing in the new file, by a track the writer may have opened in the old one.
    let crossing = "SELECT COUNT(*) FROM events WHERE kind = 'crossing'";
    let count = |sql: &str| -> i64 {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(sql, [], |r| r.get(0))
            .unwrap()
    };
    wait_until("a crossing in the new file", DEADLINE, || {
        (count(crossing) > 0).then_some(())
    });
    run.signal("TERM");
    let out = run.finish(DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    // Every track that crossed has its own row in the new file, and no row of the new file
    // took another's updates (a crossing is one instant, without a score).
    // (kind, track_id, start_ms, end_ms, score) of every row.
    type Row = (String, Option<i64>, i64, i64, Option<f64>);
    let rows: Vec<Row> = {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let mut stmt = conn
            .prepare("SELECT kind, track_id, start_ms, end_ms, score FROM events")
            .unwrap();
        stmt.query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    };
    let tracks: Vec<Option<i64>> = rows
        .iter()
        .filter(|r| r.0 == "track")
        .map(|r| r.1)
        .collect();
    for (kind, track, start, end, score) in rows.iter().filter(|r| r.0 == "crossing") {
        assert!(
            tracks.contains(track),
            "{kind} of track {track:?} has no track row: {rows:?}"
        );
        assert!(
            start == end && score.is_none(),
            "an overwritten crossing: {rows:?}"
        );
    }
    assert_eq!(
        out.stderr.matches("the database file is gone").count(),
        1,
        "{}",
        out.stderr
    );
}
