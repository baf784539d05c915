//! The endpoint in-process, on a real socket, with parts a test holds: what no binary run can
//! set up on demand (a storage whose lock a slow purge holds).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use super::*;
use crate::daemon::live::Parts;
use crate::storage::{Class, FilePolicy, Retention, Storage, StorageConfig, SystemClock};

/// Bound for anything that should take well under a second; it only turns a hang into a
/// failure.
const DEADLINE: Duration = Duration::from_secs(30);

/// The whole answer to `GET path`, with `headers` (each ending in CRLF).
pub(super) fn get(addr: SocketAddr, path: &str, headers: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// An endpoint on a free loopback port serving `parts`.
pub(super) fn serve(config: HttpConfig, parts: Parts) -> (Server, Arc<Live>) {
    let live = Arc::new(Live::new());
    live.set_parts(parts);
    let server = bind(&config).unwrap().serve(live.clone()).unwrap();
    (server, live)
}

pub(super) fn loopback() -> HttpConfig {
    HttpConfig::open("127.0.0.1:0".parse().unwrap())
}

#[test]
fn metrics_and_healthz_answer_while_a_purge_holds_the_storage() {
    let storage = Storage::start(StorageConfig::default(), Arc::new(SystemClock)).unwrap();
    let _stop = storage.stop_on_drop();
    let _files = storage.sink(
        "rec",
        FilePolicy {
            class: Class::Continuous,
            retention: Retention {
                max_age: Some(Duration::from_secs(86_400)),
                max_bytes: None,
            },
            expected_file: 1,
        },
    );
    // The storage thread's pass for the new sink publishes a report that names it.
    let start = Instant::now();
    while !storage.snapshot().sinks.contains_key("rec") {
        assert!(start.elapsed() < DEADLINE, "no report names the sink");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (server, _live) = serve(
        loopback(),
        Parts {
            storage: Some(storage.clone()),
            ..Parts::default()
        },
    );
    let addr = server.addr;

    // What a purge pass does for as long as it deletes (a slow disk, a hung mount).
    let held = storage.hold_lock_for_test();
    let (answers, answered) = channel();
    let (asked, metrics_asked) = channel();
    std::thread::spawn(move || {
        let _ = asked.send(());
        let _ = answers.send(("/metrics", get(addr, "/metrics", "")));
    });
    metrics_asked.recv().unwrap();
    let healthz = get(addr, "/healthz", "");
    let (_, metrics) = answered.recv_timeout(DEADLINE).unwrap();
    drop(held);
    assert!(healthz.starts_with("HTTP/1.1 200 OK"), "{healthz}");
    assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
    assert!(
        metrics.contains("vidflow_storage_kept_files{sink=\"rec\"} 0"),
        "{metrics}"
    );
}
