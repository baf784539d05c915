//! Live clients within the file descriptors: a real `vidflow` whose descriptor limit is 1024,
//! soft and hard (set before `exec`, so it cannot raise it), recording segments, with more
//! live clients than that limit can hold. The clients past its cap (from the limit, with a
//! reserve for the rest of the run) get 503 at once; `/healthz`, new segments and a new client
//! after one left keep working while the others are held, and nothing fails for want of a
//! descriptor (EMFILE).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::{free_port, spawn_command, vidflow, write};
use http_client::{get, wait_until};

/// Guards against a hang only.
const DEADLINE: Duration = Duration::from_secs(120);
/// vidflow's descriptor limit: the usual soft limit, here the hard one too.
const NOFILE: u64 = 1024;
/// What the pipeline below opens: a test source and a `video_file` sink.
const PIPELINE: vidflow::daemon::fds::Pipeline = vidflow::daemon::fds::Pipeline {
    sources: 1,
    record_streams: 0,
    sinks: 1,
    event_store: false,
};
/// Live clients tried: more than the limit.
const TRIED: usize = 1100;

/// Opens `/api/live`; its status code and the connection (`None`: no answer).
fn live_client(port: u16) -> (Option<u16>, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET /api/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut reader = BufReader::new(s);
    let mut status = String::new();
    let code = reader
        .read_line(&mut status)
        .ok()
        .and_then(|_| status.split_whitespace().nth(1)?.parse().ok());
    (code, reader)
}

/// Segments of the sink `rec` finished so far.
fn finished_segments(port: u16) -> Option<usize> {
    // One page holds all this short run makes.
    let (status, body) = get(port, "/api/recordings?limit=1000")?;
    (status == 200).then_some(())?;
    let page: serde_json::Value = serde_json::from_str(&body).ok()?;
    let list = page["recordings"].as_array()?;
    Some(list.iter().filter(|r| r["end"].is_number()).count())
}

#[test]
fn live_clients_past_the_descriptor_budget_get_503_and_the_rest_of_the_run_goes_on() {
    // This process holds the clients (and its own descriptors, with room): more than vidflow
    // may have.
    let needed = TRIED as u64 + 200;
    let test = "live_clients_past_the_descriptor_budget_get_503_and_the_rest_of_the_run_goes_on";
    if !common::raise_fd_limit(needed, test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pipeline = write(
        dir.path(),
        "p.toml",
        &format!(
            "[sources.cam]\nuri = \"test://ball?width=160&height=120&fps=15\"\n\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\n\
             [sinks.rec]\nkind = \"video_file\"\nimage = \"$frame\"\n\
             path = \"rec/{{source}}/{{start}}.mp4\"\nsegment_seconds = 1\n"
        ),
    );
    let mut command = vidflow();
    command.arg("run").arg(&pipeline);
    // SAFETY: only setrlimit, which is async-signal-safe, runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: NOFILE,
                rlim_max: NOFILE,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let run = spawn_command(dir.path(), command);
    let health = wait_until("the endpoint", DEADLINE, || {
        let (status, body) = get(port, "/api/health")?;
        let health: serde_json::Value = serde_json::from_str(&body).ok()?;
        (status == 200 && health["live"]["max_clients"].as_u64()? > 0).then_some(health)
    });
    let cap = usize::try_from(health["live"]["max_clients"].as_u64().unwrap()).unwrap();
    assert_eq!(
        cap,
        vidflow::daemon::http::max_live_clients(NOFILE, PIPELINE.descriptors()),
        "{health}"
    );
    assert!(cap < 1024, "{health}");

    // One after the other: each is answered (200 or 503) before the next comes.
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..TRIED {
        match live_client(port) {
            (Some(200), reader) => held.push(reader),
            (Some(503), _) => refused += 1,
            (other, _) => panic!(
                "client {i}: {other:?} ({} held): {}",
                held.len(),
                run.stderr()
            ),
        }
    }
    assert_eq!(held.len(), cap, "{}", run.stderr());
    assert_eq!(refused, TRIED - cap);
    // With every client held: /healthz, new segments, and a new client once one left.
    assert_eq!(get(port, "/healthz").unwrap().0, 200);
    let segments = finished_segments(port).unwrap();
    wait_until("two more segments", DEADLINE, || {
        finished_segments(port).filter(|n| *n >= segments + 2)
    });
    drop(held.pop());
    let again = wait_until("a client in the place of one that left", DEADLINE, || {
        let (code, reader) = live_client(port);
        (code == Some(200)).then_some(reader)
    });
    let (_, body) = get(port, "/api/health").unwrap();
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        health["live"]["refused"].as_u64().unwrap() >= (TRIED - cap) as u64,
        "{health}"
    );
    drop((held, again));
    run.signal("TERM");
    let finished = run.finish(DEADLINE);
    assert!(finished.status.success(), "{}", finished.stderr);
    assert!(
        !finished.stderr.contains("Too many open files"),
        "{}",
        finished.stderr
    );
}
