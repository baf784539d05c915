//! No password is ever printed: camera passwords with `#`, `?`, `/`, `@`, `:`, `%` and a space,
//! raw and percent-encoded, each run through the real `vidflow run` (with `[http] listen`, a
//! JSONL sink and `--stats-json`) against an RTSP port that refuses connections and against a
//! real gst-rtsp-server (`tests/common/rtsp.rs`) behind basic auth. Whatever the run shows, on
//! stderr, in the JSONL, on `/metrics` (fetched while it runs) and in the stats file, holds no
//! piece of 4 characters of the password, as written, decoded or encoded. What a URL parser
//! cannot read (a raw `#`, `?`, `/`, a lone `%`) is a configuration error (exit 78) that names
//! the URI with its password hidden; an encoded password reaches the camera decoded (the server
//! lets it play).
//!
//! The tests take turns: each runs an encoder and a decoder in real time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http;
use crate::common::rtsp;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use common::{Running, free_port, spawn, wait_for_lines, write};
use rtsp::{RtspServer, RtspServerOptions};

/// Bound for anything that should take a second or two; it only turns a hang into a failure.
const DEADLINE: Duration = Duration::from_secs(60);

/// The configuration error's exit code (sysexits `EX_CONFIG`).
const EXIT_CONFIG: i32 = 78;

/// What a user writes after `viewer:` in the URI, and the password the camera must get.
/// Every one holds the same rare letters, so that any piece of it is found wherever it shows.
const UNDERSTOOD: &[(&str, &str)] = &[
    ("Kx@q7Lm", "Kx@q7Lm"),
    ("Kx:q7Lm", "Kx:q7Lm"),
    ("Kx q7Lm", "Kx q7Lm"),
    ("Kx%23q7Lm", "Kx#q7Lm"),
    ("Kx%40q7Lm", "Kx@q7Lm"),
    ("Kx%25q7Lm", "Kx%q7Lm"),
    ("Kx%20q7Lm", "Kx q7Lm"),
    ("Kx%2Fq7Lm", "Kx/q7Lm"),
    ("Kx%3Fq7Lm", "Kx?q7Lm"),
];

/// Written raw, these end the authority where no parser can tell: refused.
const REFUSED: &[&str] = &[
    "Kx#q7Lm", "Kx?q7Lm", "Kx/q7Lm", "12#q7Lm", "12/q7Lm", "Kx%q7Lm",
];

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Percent-encodes every byte but letters and digits.
fn encode_all(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every 4-character piece of every form of a password: as written, decoded, encoded.
fn pieces(written: &str, decoded: &str) -> Vec<String> {
    let forms = [
        written.to_owned(),
        decoded.to_owned(),
        encode_all(decoded),
        decoded.replace(' ', "%20"),
    ];
    let mut out = Vec::new();
    for form in forms {
        let chars: Vec<char> = form.chars().collect();
        out.extend(chars.windows(4).map(|w| w.iter().collect::<String>()));
    }
    out.sort();
    out.dedup();
    out
}

/// Fails naming where a piece of the password shows.
fn assert_hidden(what: &str, written: &str, decoded: &str, shown: &[(&str, String)]) {
    for (place, text) in shown {
        for piece in pieces(written, decoded) {
            assert!(
                !text.contains(&piece),
                "{what}: {piece:?} of the password {written:?} shows in {place}:\n{text}"
            );
        }
    }
}

/// A pipeline whose source `cam` is `source` (its keys), retried every 100 to 200 ms, with a
/// JSONL sink and `/metrics` on `http_port`.
fn pipeline(dir: &Path, source: &str, http_port: u16) -> std::path::PathBuf {
    write(
        dir,
        "p.toml",
        &format!(
            "[sources.cam]\n{source}\n\
             [sources.cam.reconnect]\ninitial_delay_ms = 100\nmax_delay_ms = 200\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n\
             [http]\nlisten = \"127.0.0.1:{http_port}\"\n"
        ),
    )
}

/// `vidflow run` with everything it can say switched on.
fn run(dir: &Path, pipeline: &Path) -> Running {
    spawn(
        dir,
        &[
            "run",
            pipeline.to_str().unwrap(),
            "--stats-json",
            "stats.json",
        ],
        &[("VIDFLOW_LOG", "debug"), ("GST_DEBUG", "rtspsrc:5")],
    )
}

/// `/metrics`, fetched while the run goes on.
fn metrics(port: u16) -> String {
    http::wait_until("/metrics answers", DEADLINE, || {
        http::get(port, "/metrics").filter(|(status, _)| *status == 200)
    })
    .1
}

/// Runs source `cam` with keys `source` in `dir` until `ready` returns, fetches `/metrics`,
/// stops the run and gathers what it showed: stderr, stdout, `/metrics`, JSONL, stats.
fn everything_shown(
    dir: &Path,
    source: &str,
    ready: impl FnOnce(&Running),
) -> Vec<(&'static str, String)> {
    let http_port = free_port();
    let running = run(dir, &pipeline(dir, source, http_port));
    ready(&running);
    let metrics = metrics(http_port);
    running.signal("TERM");
    let out = running.finish(DEADLINE);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    vec![
        ("stderr", out.stderr),
        ("stdout", out.stdout),
        ("/metrics", metrics),
        ("the jsonl", read("events.jsonl")),
        ("the stats file", read("stats.json")),
    ]
}

/// A camera that lets user `viewer` play with `password` alone.
fn camera(password: &str) -> RtspServer {
    RtspServer::start(RtspServerOptions {
        credentials: Some(("viewer".to_owned(), password.to_owned())),
        ..RtspServerOptions::default()
    })
    .unwrap()
}

/// Waits for frames: they arrive only if the server took the password.
fn frames_arrive(dir: &Path) -> impl FnOnce(&Running) {
    let events = dir.join("events.jsonl");
    move |_| wait_for_lines(&events, 5, DEADLINE)
}

#[test]
fn a_refusing_camera_never_shows_its_password() {
    let _turn = serial();
    let camera = free_port();
    for &(written, decoded) in UNDERSTOOD {
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("uri = \"rtsp://viewer:{written}@127.0.0.1:{camera}/cam\"");
        let shown = everything_shown(dir.path(), &uri, |running| {
            running.wait_for_stderr_times("retry failed", 2, DEADLINE);
        });
        assert_hidden(written, written, decoded, &shown);
        assert!(
            shown[0]
                .1
                .contains(&format!("viewer:***@127.0.0.1:{camera}/cam")),
            "{written}: the uri is not named: {}",
            shown[0].1
        );
        assert!(
            shown[0].1.contains("cannot connect; retrying"),
            "{}",
            shown[0].1
        );
    }
}

#[test]
fn an_accepting_camera_gets_the_decoded_password_and_never_shows_it() {
    let _turn = serial();
    for &(written, decoded) in UNDERSTOOD {
        let server = camera(decoded);
        let dir = tempfile::tempdir().unwrap();
        let uri = format!(
            "uri = \"rtsp://viewer:{written}@127.0.0.1:{}/test\"",
            server.port()
        );
        let shown = everything_shown(dir.path(), &uri, frames_arrive(dir.path()));
        assert_hidden(written, written, decoded, &shown);
        assert!(
            shown[0].1.contains("viewer:***@127.0.0.1"),
            "{written}: the uri is not named: {}",
            shown[0].1
        );
    }
}

#[test]
fn a_password_given_apart_from_the_uri_is_taken_raw_and_never_shown() {
    let _turn = serial();
    const RAW: &str = "Kx#?/@: %q7Lm";
    let server = camera(RAW);
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "cam.pw", &format!("{RAW}\n"));
    let source = format!(
        "uri = \"{}\"\nuser = \"viewer\"\npassword_file = \"cam.pw\"",
        server.url()
    );
    let shown = everything_shown(dir.path(), &source, frames_arrive(dir.path()));
    assert_hidden("password_file", RAW, RAW, &shown);
}

#[test]
fn a_raw_hash_question_mark_slash_or_percent_is_a_config_error_that_hides_the_password() {
    let _turn = serial();
    let camera = free_port();
    for &written in REFUSED {
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("uri = \"rtsp://viewer:{written}@127.0.0.1:{camera}/cam\"");
        let p = pipeline(dir.path(), &uri, free_port());
        let out = run(dir.path(), &p).finish(DEADLINE);
        assert_eq!(
            out.status.code(),
            Some(EXIT_CONFIG),
            "{written}: {}",
            out.stderr
        );
        assert!(
            out.stderr
                .contains(&format!("***@127.0.0.1:{camera}/cam\"")),
            "{written}: the uri is not named: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("%23"),
            "{written}: no word on how to write it: {}",
            out.stderr
        );
        let mut shown = vec![("stderr", out.stderr), ("stdout", out.stdout)];
        for file in ["events.jsonl", "stats.json"] {
            if let Ok(text) = std::fs::read_to_string(dir.path().join(file)) {
                shown.push((file, text));
            }
        }
        assert_hidden(written, written, written, &shown);
    }
}

/// GStreamer's log function is a C callback: a panic in it aborted the process. A file whose
/// path holds a no-break space before `rtsp://a:PASSWORD@c` made filesrc log that path, and the
/// redactor then sliced inside the two-byte space ("byte index 2 is not a char boundary"): the
/// run died with SIGABRT. Now it plays the file to its end, and filesrc's lines show the path
/// with the password hidden.
#[test]
fn a_gstreamer_line_with_a_multi_byte_space_before_a_url_is_logged_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("x\u{a0}rtsp:");
    std::fs::create_dir(&folder).unwrap();
    let made = dir.path().join("clip.mp4");
    common::make_h264_mp4(&made, 5, 64, 48);
    std::fs::rename(&made, folder.join("viewer:Kx7qLm@cam.mp4")).unwrap();
    // The path as filesrc gets it: ".../x\u{a0}rtsp://viewer:Kx7qLm@cam.mp4".
    let uri = format!(
        "file://{}/x%C2%A0rtsp:%2F%2Fviewer:Kx7qLm@cam.mp4",
        dir.path().display()
    );
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"{uri}\"\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n"
        ),
    );
    let out = spawn(
        dir.path(),
        &["run", p.to_str().unwrap()],
        &[("GST_DEBUG", "filesrc:5")],
    )
    .finish(DEADLINE);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{:?}: {}",
        out.status,
        out.stderr
    );
    let logged = out
        .stderr
        .lines()
        .filter(|l| l.contains("gst_category=\"filesrc\"") && l.contains("opening file"))
        .collect::<Vec<_>>();
    assert!(!logged.is_empty(), "filesrc said nothing: {}", out.stderr);
    for line in logged {
        assert!(line.contains("\u{a0}rtsp://viewer:***@cam.mp4"), "{line}");
        assert!(!line.contains("Kx7qLm"), "{line}");
    }
    assert_eq!(common::jsonl(&dir.path().join("events.jsonl")).len(), 5);
}
