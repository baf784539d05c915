//! The RTSP test server (`tests/common/rtsp.rs`) against a real GStreamer client: it plays, it
//! enforces basic auth, `stop` really disconnects and refuses, `restart` serves again on the same
//! port, and stop/restart cycles leak neither threads nor file descriptors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::rtsp;

use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

use rtsp::{RtspServer, RtspServerOptions};

/// Generous bound for a client to get its frames or its error on a shared, noisy machine; it only
/// turns a hang into a failure.
const CLIENT_DEADLINE: Duration = Duration::from_secs(60);
/// How long thread and fd counts may take to come back after the last cycle (GLib thread pools
/// retire idle threads lazily).
const SETTLE_DEADLINE: Duration = Duration::from_secs(40);
const CYCLES: usize = 25;

fn gst_init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| gst::init().unwrap());
}

/// The leak test counts the whole process's threads, so the tests in this file run one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How a client's wait ended when it did not get its frames.
#[derive(Debug)]
enum Ended {
    Error(String),
    Eos,
    Timeout {
        #[expect(dead_code, reason = "read through Debug in failure messages")]
        frames: usize,
    },
}

/// `rtspsrc protocols=tcp latency=0 ! decodebin ! videoconvert ! appsink`, playing.
struct Client {
    pipeline: gst::Pipeline,
    sink: gst_app::AppSink,
}

impl Client {
    fn play(url: &str, credentials: Option<(&str, &str)>) -> Self {
        gst_init();
        let pipeline = gst::parse::launch(
            "rtspsrc name=src protocols=tcp latency=0 ! decodebin ! videoconvert ! \
             appsink name=out sync=false max-buffers=4 drop=true",
        )
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
        let src = pipeline.by_name("src").unwrap();
        src.set_property("location", url);
        if let Some((user, pass)) = credentials {
            src.set_property("user-id", user);
            src.set_property("user-pw", pass);
        }
        let sink = pipeline
            .by_name("out")
            .unwrap()
            .downcast::<gst_app::AppSink>()
            .unwrap();
        pipeline.set_state(gst::State::Playing).unwrap();
        Self { pipeline, sink }
    }

    /// The first bus error or EOS, if one is waiting.
    fn ended(&self) -> Option<Ended> {
        let bus = self.pipeline.bus().unwrap();
        let msg = bus.pop_filtered(&[gst::MessageType::Error, gst::MessageType::Eos])?;
        Some(match msg.view() {
            gst::MessageView::Error(e) => Ended::Error(format!(
                "{}: {} ({})",
                e.src().map(|s| s.path_string()).unwrap_or_default(),
                e.error(),
                e.debug().unwrap_or_default()
            )),
            _ => Ended::Eos,
        })
    }

    /// Waits for `n` decoded frames.
    fn frames(&self, n: usize) -> Result<usize, Ended> {
        let start = Instant::now();
        let mut frames = 0;
        while start.elapsed() < CLIENT_DEADLINE {
            if let Some(ended) = self.ended() {
                return Err(ended);
            }
            if self
                .sink
                .try_pull_sample(gst::ClockTime::from_mseconds(100))
                .is_some()
            {
                frames += 1;
                if frames >= n {
                    return Ok(frames);
                }
            }
        }
        Err(Ended::Timeout { frames })
    }

    /// Waits for the stream to end with an error or EOS, discarding frames meanwhile.
    fn end(&self) -> Ended {
        let start = Instant::now();
        while start.elapsed() < CLIENT_DEADLINE {
            if let Some(ended) = self.ended() {
                return ended;
            }
            let _ = self
                .sink
                .try_pull_sample(gst::ClockTime::from_mseconds(100));
        }
        Ended::Timeout { frames: 0 }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

fn assert_refused(port: u16) {
    match TcpStream::connect(("127.0.0.1", port)) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}"),
        Ok(_) => panic!("port {port} still accepts connections after stop"),
    }
}

fn count_entries(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// Names of this process's threads.
fn thread_names() -> Vec<String> {
    let mut names = common::other_threads();
    names.sort();
    names
}

/// Threads that end a while after their client or media is gone: GStreamer's streaming
/// threads (named `element:pad`) and GLib's pool threads idle after their work (`pool-N`,
/// retired lazily; `pool-spawner` stays).
fn transient(name: &str) -> bool {
    name.contains(':') || (name.starts_with("pool-") && name != "pool-spawner")
}

/// (threads, open fds) once the process has settled: no transient thread left, and the same
/// thread names on two looks in a row. A leak baseline taken earlier counts threads that are
/// about to end, and a leak as large as them would go unseen.
fn settled() -> (usize, usize) {
    let start = Instant::now();
    let mut last = thread_names();
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let names = thread_names();
        if names == last && !names.iter().any(|n| transient(n)) {
            println!("settled after {:?}: {names:?}", start.elapsed());
            return resources();
        }
        assert!(
            start.elapsed() < SETTLE_DEADLINE,
            "threads never settled: {names:?}"
        );
        last = names;
    }
}

/// (threads, open fds) of this process.
fn resources() -> (usize, usize) {
    (
        count_entries("/proc/self/task"),
        count_entries("/proc/self/fd"),
    )
}

fn with_auth() -> RtspServerOptions {
    RtspServerOptions {
        credentials: Some(("viewer".to_owned(), "s3cret:pw".to_owned())),
        ..RtspServerOptions::default()
    }
}

#[test]
fn client_receives_decoded_frames() {
    let _serial = serial();
    let server = RtspServer::start(RtspServerOptions::default()).unwrap();
    assert!(server.url().starts_with("rtsp://127.0.0.1:"));
    let client = Client::play(&server.url(), None);
    assert_eq!(client.frames(10).unwrap(), 10);
}

#[test]
fn basic_auth_admits_only_the_configured_user() {
    let _serial = serial();
    let server = RtspServer::start(with_auth()).unwrap();

    let client = Client::play(&server.url(), Some(("viewer", "s3cret:pw")));
    assert_eq!(client.frames(10).unwrap(), 10, "user-id/user-pw");
    drop(client);

    let client = Client::play(&server.url_with_credentials("viewer", "s3cret:pw"), None);
    assert_eq!(client.frames(10).unwrap(), 10, "credentials in the url");
    drop(client);

    for (what, client) in [
        (
            "wrong password",
            Client::play(&server.url(), Some(("viewer", "nope"))),
        ),
        (
            "unknown user",
            Client::play(&server.url_with_credentials("intruder", "s3cret:pw"), None),
        ),
        ("no credentials", Client::play(&server.url(), None)),
    ] {
        match client.frames(1) {
            Err(Ended::Error(text)) => {
                println!("{what}: {text}");
                assert!(
                    text.contains("Unauthorized") || text.contains("401"),
                    "{what}: {text}"
                );
            }
            other => panic!("{what}: expected an authorization error, got {other:?}"),
        }
    }
}

#[test]
fn stop_disconnects_and_refuses_then_restart_serves_on_the_same_port() {
    let _serial = serial();
    let mut server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let url = server.url();
    let port = server.port();
    let client = Client::play(&url, None);
    client.frames(5).unwrap();

    server.stop();
    assert!(!server.is_running());
    let ended = client.end();
    println!("connected client after stop: {ended:?}");
    assert!(!matches!(ended, Ended::Timeout { .. }), "{ended:?}");
    assert_refused(port);
    match Client::play(&url, None).frames(1) {
        Err(Ended::Error(text)) => println!("new client while stopped: {text}"),
        other => panic!("a client got through to a stopped server: {other:?}"),
    }
    drop(client);

    server.restart().unwrap();
    assert_eq!(server.port(), port);
    assert_eq!(server.url(), url);
    let client = Client::play(&url, None);
    assert_eq!(client.frames(10).unwrap(), 10);
}

#[test]
fn stop_restart_cycles_leak_no_threads_or_fds() {
    let _serial = serial();
    gst_init();
    let mut server = RtspServer::start(with_auth()).unwrap();
    let url = server.url_with_credentials("viewer", "s3cret:pw");
    let cycle = |server: &mut RtspServer| {
        let client = Client::play(&url, None);
        client.frames(3).unwrap();
        server.stop();
        let ended = client.end();
        assert!(!matches!(ended, Ended::Timeout { .. }), "{ended:?}");
        drop(client);
        assert_refused(server.port());
        server.restart().unwrap();
    };

    // Warm-up: GStreamer's registry, plugin statics and GLib's pools of idle threads.
    for _ in 0..2 {
        cycle(&mut server);
    }
    let before = settled();

    for _ in 0..CYCLES {
        cycle(&mut server);
    }
    let start = Instant::now();
    let mut after = resources();
    while (after.0 > before.0 || after.1 > before.1) && start.elapsed() < SETTLE_DEADLINE {
        std::thread::sleep(Duration::from_millis(250));
        after = resources();
    }
    println!("(threads, fds) after warm-up {before:?}, after {CYCLES} cycles {after:?}");
    assert!(
        after.0 <= before.0 && after.1 <= before.1,
        "(threads, fds) grew from {before:?} to {after:?} over {CYCLES} stop/restart cycles"
    );

    // Still serving after all that.
    let client = Client::play(&url, None);
    assert_eq!(client.frames(10).unwrap(), 10);
}
