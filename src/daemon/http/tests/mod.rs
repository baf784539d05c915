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
fn get(addr: SocketAddr, path: &str, headers: &str) -> String {
    let mut stream = ask(addr, path, headers);
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// An endpoint on a free loopback port serving `parts`.
fn serve(config: HttpConfig, parts: Parts) -> (Server, Arc<Live>) {
    let live = Arc::new(Live::new());
    live.set_parts(parts);
    let server = bind(&config).unwrap().serve(live.clone()).unwrap();
    (server, live)
}

fn loopback() -> HttpConfig {
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

/// A hash far slower to check than a real one (64 MiB, 8 passes), so that a test sees what is
/// answered while it is being checked.
fn slow_hash(password: &str) -> crate::spec::PasswordHash {
    use argon2::password_hash::{PasswordHasher, SaltString};
    let argon2 = argon2::Argon2::new(
        argon2::Algorithm::Argon2id,
        argon2::Version::V0x13,
        argon2::Params::new(64 * 1024, 8, 1, None).unwrap(),
    );
    let salt = SaltString::generate(&mut password_hash::rand_core::OsRng);
    let phc = argon2.hash_password(password.as_bytes(), &salt).unwrap();
    crate::spec::PasswordHash::parse(&phc.to_string()).unwrap()
}

/// `Authorization: Basic ...` for `user:password`, as a header line.
fn basic(user_password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Authorization: Basic {}\r\n",
        base64::engine::general_purpose::STANDARD.encode(user_password)
    )
}

/// Sends `GET path` with `headers` and leaves the answer to be read.
fn ask(addr: SocketAddr, path: &str, headers: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n"
    )
    .unwrap();
    stream
}

/// Whether an answer has come on `stream` (without waiting for one).
fn answered(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let some =
        !matches!(stream.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    some
}

/// The status of the answer on `stream`; 0 when it was closed unanswered.
fn status(mut stream: TcpStream) -> u16 {
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_client_trying_passwords_holds_up_neither_healthz_nor_a_client_that_passed() {
    let made = Instant::now();
    let mut config = loopback();
    config.basic = Some(crate::config::BasicAuth {
        user: "ops".to_owned(),
        password: crate::config::PasswordCheck::Argon2(slow_hash("pa:ss")),
    });
    let check = made.elapsed();
    let (server, _live) = serve(config, Parts::default());
    let addr = server.addr;

    // A browser logs in: checked once, off the loop.
    assert!(get(addr, "/metrics", &basic("ops:pa:ss")).starts_with("HTTP/1.1 200 OK"));

    // Someone tries passwords, more at once than the check's queue holds.
    let tries: Vec<TcpStream> = (0..verify::QUEUE + 4)
        .map(|i| ask(addr, "/metrics", &basic(&format!("ops:guess{i}"))))
        .collect();
    // Meanwhile the probe and the browser are answered by the loop.
    let healthz = get(addr, "/healthz", "");
    let again = get(addr, "/metrics", &basic("ops:pa:ss"));
    let pending = tries.iter().filter(|t| !answered(t)).count();
    assert!(healthz.starts_with("HTTP/1.1 200 OK"), "{healthz}");
    assert!(again.starts_with("HTTP/1.1 200 OK"), "{again}");
    // Each wrong password costs a check (about {check:?} each): most are still waiting.
    assert!(
        pending >= verify::QUEUE / 2,
        "{pending} of {} tries still unanswered (one check: {check:?})",
        tries.len()
    );
    // The stop waits for the check in progress only; the queued tries are closed.
    drop(server);
    let statuses: Vec<u16> = tries.into_iter().map(status).collect();
    assert!(
        statuses.iter().all(|s| [0, 401, 503].contains(s)),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&503),
        "no try was refused at once: {statuses:?}"
    );
}

mod paging;
