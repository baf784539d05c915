//! The HTTP endpoint on a real `vidflow` process: `/metrics` parses as Prometheus text and
//! agrees with what the run wrote, `/healthz` follows a real RTSP server going away and coming
//! back, a port in use is a clear error, and a request head is read whether its lines end in
//! CRLF or a bare LF.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;
use crate::common::rtsp;

use std::time::Duration;

use common::{free_port, read_json, spawn_run, write};
use http_client::{get, request, scrape, value, wait_for_frames, wait_until};
use rtsp::{RtspServer, RtspServerOptions};

/// Guards against a hang only: a loaded machine may be slow, never wrong.
const DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn metrics_parse_as_prometheus_text_and_match_the_jsonl_lines_and_the_stats() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // `clip` is the short run measured; the live `cam` keeps the daemon up while it is scraped.
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.clip]\nuri = \"test://smpte?width=160&height=120&live=false&frames=30\"\n\
             [sources.cam]\nuri = \"test://ball?width=160&height=120&fps=15\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [steps.gray]\nkind = \"grayscale\"\nimage = \"$frame\"\n\
             [sinks.lines]\nkind = \"jsonl\"\npath = \"lines.jsonl\"\nsources = [\"clip\"]\n\
             include = [\"$steps.gray.image\"]\n"
        ),
    );
    let stats = dir.path().join("stats.json");
    let run = spawn_run(&p, &["--stats-json", stats.to_str().unwrap()], dir.path());
    let samples = wait_until("clip ended and its 30 lines written", DEADLINE, || {
        let s = scrape(port)?;
        let ended = value(
            &s,
            "vidflow_source_state",
            &[("source", "clip"), ("state", "ended")],
        );
        let written = value(&s, "vidflow_sink_written_total", &[("sink", "lines")]);
        (ended == Some(1.0) && written == Some(30.0)).then_some(s)
    });
    let lines = std::fs::read_to_string(dir.path().join("lines.jsonl")).unwrap();
    assert_eq!(
        value(&samples, "vidflow_sink_written_total", &[("sink", "lines")]),
        Some(lines.lines().count() as f64)
    );
    // Every family the issue asks for is there.
    for name in [
        "vidflow_source_frames_dropped_total",
        "vidflow_source_frames_throttled_total",
        "vidflow_source_frames_copied_total",
        "vidflow_source_reconnects_total",
        "vidflow_source_size_changes_total",
        "vidflow_step_runs_total",
        "vidflow_step_failures_total",
        "vidflow_step_state_resets_total",
        "vidflow_step_duration_seconds_bucket",
        "vidflow_step_duration_seconds_count",
        "vidflow_sink_skipped_total",
        "vidflow_sink_dropped_total",
        "vidflow_sink_queue_depth",
        "vidflow_executor_frames_in_flight",
        "vidflow_pool_dispatches_total",
        "vidflow_pool_wakeups_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(samples.keys().any(|(n, _)| n == name), "no {name}");
    }
    let step_runs = value(&samples, "vidflow_step_runs_total", &[("step", "gray")]).unwrap();
    let step_count = value(
        &samples,
        "vidflow_step_duration_seconds_count",
        &[("step", "gray")],
    )
    .unwrap();
    let inf = value(
        &samples,
        "vidflow_step_duration_seconds_bucket",
        &[("step", "gray"), ("le", "+Inf")],
    );
    assert!(step_runs >= 30.0, "{step_runs}");
    assert_eq!(Some(step_count), inf);
    assert!(value(&samples, "process_resident_memory_bytes", &[]).unwrap() > 1e6);

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
    let stats = read_json(&stats);
    assert_eq!(
        value(
            &samples,
            "vidflow_source_frames_decoded_total",
            &[("source", "clip")]
        ),
        stats["sources"]["clip"]["decoded"].as_f64()
    );
    assert_eq!(
        value(&samples, "vidflow_sink_written_total", &[("sink", "lines")]),
        stats["sinks"]["lines"]["written"].as_f64()
    );
}

#[test]
fn healthz_turns_503_when_the_rtsp_server_is_gone_past_the_stall_limit_and_200_when_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let port = free_port();
    // Limit: 2 x stall_timeout_ms = 2 s without a frame.
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"{}\"\nstall_timeout_ms = 1000\n\
             [sources.cam.reconnect]\ninitial_delay_ms = 100\nmax_delay_ms = 500\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n",
            server.url()
        ),
    );
    let run = spawn_run(&p, &[], dir.path());
    let healthz = || get(port, "/healthz");
    wait_for_frames(port, "cam", 5, DEADLINE);
    assert_eq!(healthz().unwrap(), (200, "ok\n".to_owned()));

    server.stop();
    let (_, reason) = wait_until("unhealthy once the server is gone", DEADLINE, || {
        healthz().filter(|(status, _)| *status == 503)
    });
    assert!(reason.contains("source \"cam\": no frame for"), "{reason}");

    server.restart().unwrap();
    let (_, body) = wait_until("healthy again once the server is back", DEADLINE, || {
        healthz().filter(|(status, _)| *status == 200)
    });
    assert_eq!(body, "ok\n");
    let samples = scrape(port).unwrap();
    assert!(
        value(
            &samples,
            "vidflow_source_reconnects_total",
            &[("source", "cam")]
        )
        .unwrap()
            >= 1.0
    );

    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
}

#[test]
fn a_port_in_use_stops_the_run_at_once_with_exit_69_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"test://ball\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n"
        ),
    );
    let finished = spawn_run(&p, &[], dir.path()).finish(DEADLINE);
    assert_eq!(finished.status.code(), Some(69), "{}", finished.stderr);
    assert!(
        finished
            .stderr
            .contains(&format!("http: cannot listen on 127.0.0.1:{port}")),
        "{}",
        finished.stderr
    );
    assert!(
        !finished.stderr.contains("source started"),
        "{}",
        finished.stderr
    );
}

#[test]
fn unknown_pages_are_404_with_the_pages_that_exist_and_bare_lf_heads_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"test://ball?width=160&height=120\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"events.jsonl\"\n"
        ),
    );
    let run = spawn_run(&p, &[], dir.path());
    let (status, body) = wait_until("the endpoint answers", DEADLINE, || get(port, "/nope"));
    assert_eq!(status, 404);
    assert!(body.contains("no such page \"/nope\""), "{body}");
    let (status, page) = get(port, "/").unwrap();
    assert_eq!(status, 200);
    // The page's own files only, by relative URLs (it works under a proxy's sub-path).
    assert!(
        page.contains("src=\"assets/app.js\"")
            && !page.contains("http://")
            && !page.contains("https://"),
        "{page}"
    );
    let (status, simple) = get(port, "/simple").unwrap();
    assert_eq!(status, 200);
    assert!(simple.contains("/stats.json"), "{simple}");
    // Lines ending in a bare LF (netcat, a hand-written probe): a whole head, answered, not
    // held to the 5 s head deadline and refused 408.
    let (status, _, body) = request(port, "GET /healthz HTTP/1.1\nHost: 127.0.0.1\n\n").unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _, _) = request(port, "GET /nope HTTP/1.1\nHost: 127.0.0.1\r\n\n").unwrap();
    assert_eq!(status, 404);
    run.signal("TERM");
    assert!(run.finish(DEADLINE).status.success());
}
