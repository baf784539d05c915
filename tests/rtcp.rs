//! The camera's clock from its RTCP sender reports (`src/source/rtcp.rs`), measured on a real
//! gst-rtsp-server camera: `/sub` and `/main` play one file on one timeline, `/main` sent 1 s
//! late (a slow main-stream encoder). Frame k of the decoded `/sub` and packet k of the
//! recorded `/main` are the same capture: the camera's clock puts them together, where their
//! arrival times are 10 frames apart; and again on the connections after the camera restarted,
//! each on its own reports; and the camera's skew is measured at them. Prints the spread
//! docs/guides/recording.md quotes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::rtsp_files;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rtsp_files::FileServer;
use vidflow::frame::CameraClock;
use vidflow::packets::Carried;
use vidflow::source::{SourceConfig, SourceOptions, SourceUri};

const FPS: u64 = 10;
/// Frames compared per connection: 6 s, past the first sender report of both streams.
const FRAMES: usize = 60;
/// How late `/main` leaves the server.
const LAG: Duration = Duration::from_secs(1);
/// Farthest apart the same frame of the two streams may be on the camera's clock: as
/// tests/clip.rs's `LIVE_SLACK_FRAMES`, 0.3 s at 10 fps (20 to 26 ms when measured).
const SLACK: Duration = Duration::from_millis(300);
/// Only a guard against a hang.
const DEADLINE: Duration = Duration::from_secs(60);

/// One frame or packet: its PTS, its connection's clock, and when it came.
struct Seen {
    pts: Duration,
    clock: Arc<CameraClock>,
    came: SystemTime,
}

impl Seen {
    fn camera(&self) -> Duration {
        self.clock
            .time(self.pts)
            .expect("no sender report on this stream")
    }
}

fn ms(a: Duration, b: Duration) -> i128 {
    (a.as_nanos() as i128 - b.as_nanos() as i128) / 1_000_000
}

#[test]
fn the_cameras_clock_places_the_same_frame_of_two_streams_together() {
    common::gst_init();
    let dir = tempfile::tempdir().unwrap();
    let video = dir.path().join("cam.mp4");
    common::run_to_eos(&format!(
        "videotestsrc num-buffers=150 ! video/x-raw,width=320,height=240,framerate={FPS}/1 ! \
         x264enc speed-preset=ultrafast key-int-max=15 bframes=0 ! h264parse ! mp4mux ! \
         filesink location={}",
        video.display()
    ));
    let mut server = FileServer::start_camera(&[
        ("/sub", video.clone(), Duration::ZERO),
        ("/main", video, LAG),
    ])
    .unwrap();
    let config = SourceConfig {
        name: "rtcp-cam".into(),
        uri: SourceUri::parse(&server.url("/sub")).unwrap(),
        options: SourceOptions {
            // Every frame kept: frame k is the file's frame k.
            queue: FRAMES * 2,
            ..SourceOptions::default()
        },
        uri_span: 0..0,
        record: Some(SourceUri::parse(&server.url("/main")).unwrap()),
    };
    let subscription = vidflow::packets::hub().subscribe("rtcp-cam", Default::default());
    let (tx, rx) = crossbeam_channel::bounded(FRAMES * 2);
    let source = vidflow::source::start(&config, tx, &rx, None).unwrap();
    let mut streams = Streams::default();
    streams.take(&rx, &subscription, |s| s.on_connection(1).is_some());

    // The camera restarts: each stream's new connection is placed by its own reports, never by
    // the last connection's offset (which would put its frames back at the camera's start).
    server.restart().unwrap();
    streams.take(&rx, &subscription, |s| {
        s.on_connection(2)
            .is_some_and(|(f, p)| f[0].clock.known() && p[0].clock.known())
    });
    source.control().abort();
    drop(rx);
    source.join().unwrap();
    let first = streams.on_connection(1).unwrap();
    let (frames, packets) = streams.on_connection(2).expect("no second connection");
    assert!(!Arc::ptr_eq(&frames[0].clock, &first.0[0].clock));
    assert!(!Arc::ptr_eq(&packets[0].clock, &first.1[0].clock));
    let last_before = first.0[FRAMES - 1].camera();
    assert!(
        frames[0].camera() > last_before,
        "the new connection placed before the old one's end"
    );
    assert_same_frames_together(first, 1);
    assert_same_frames_together((frames, packets), 2);
    // The server stamps its reports with this computer's clock: the skew measured at them
    // (camera minus this computer) is the report's way over loopback, well under the
    // event store's trust bound (2 s).
    for (connection, seen) in [(1, &first.0[FRAMES - 1]), (2, &frames[FRAMES - 1])] {
        let skew = seen
            .clock
            .skew()
            .expect("no skew measured at a sender report");
        println!("connection {connection}: the camera's clock skew {skew} ns");
        assert!(skew.abs() < 500_000_000, "skew {skew} ns");
    }
}

/// Frames and packets seen, in order, each stream's split by connection (as the source says:
/// a frame's `reconnected`, a packet's `connection`).
#[derive(Default)]
struct Streams {
    frames: Vec<Vec<Seen>>,
    packets: Vec<Vec<Seen>>,
    /// The connection of the last packet.
    connection: Option<u64>,
}

impl Streams {
    /// Takes frames and packets until `done` says (or [`DEADLINE`]).
    fn take(
        &mut self,
        frames: &crossbeam_channel::Receiver<vidflow::frame::Frame>,
        subscription: &vidflow::packets::Subscription,
        done: impl Fn(&Self) -> bool,
    ) {
        let until = Instant::now() + DEADLINE;
        while !done(self) && Instant::now() < until {
            crossbeam_channel::select! {
                recv(frames) -> frame => {
                    let frame = frame.unwrap();
                    let clock = frame.clock.clone().expect("an rtsp frame without a clock");
                    let seen = Seen { pts: frame.pts.unwrap(), clock, came: frame.captured };
                    add(&mut self.frames, seen, frame.reconnected.is_some());
                }
                recv(subscription.packets) -> item => {
                    if let Ok(Carried::Packet(p) | Carried::AfterLoss(p)) = item {
                        let clock = p.clock.clone().expect("an rtsp packet without a clock");
                        let pts = p.buffer.pts().unwrap().into();
                        let before = self.connection.replace(p.connection);
                        let new = before.is_some_and(|c| c != p.connection);
                        add(&mut self.packets, Seen { pts, clock, came: p.arrival }, new);
                    }
                }
                default(Duration::from_millis(100)) => {}
            }
        }
    }

    /// The first [`FRAMES`] frames and packets of both streams' `n`th connections (from 1),
    /// once there are as many.
    fn on_connection(&self, n: usize) -> Option<(&[Seen], &[Seen])> {
        let frames = self.frames.get(n - 1).filter(|f| f.len() >= FRAMES)?;
        let packets = self.packets.get(n - 1).filter(|p| p.len() >= FRAMES)?;
        Some((&frames[..FRAMES], &packets[..FRAMES]))
    }
}

/// Appends `seen` to the last connection's list, or to a `new` one.
fn add(connections: &mut Vec<Vec<Seen>>, seen: Seen, new: bool) {
    match connections.last_mut() {
        Some(c) if !new => c.push(seen),
        _ => connections.push(vec![seen]),
    }
}

/// Frame k of `/sub` and packet k of `/main` (one connection each) are within [`SLACK`] on
/// the camera's clock, while their arrival times are about [`LAG`] apart.
fn assert_same_frames_together((frames, packets): (&[Seen], &[Seen]), connection: usize) {
    let camera: Vec<i128> = (0..FRAMES)
        .map(|k| ms(packets[k].camera(), frames[k].camera()))
        .collect();
    let arrival: Vec<i128> = (0..FRAMES)
        .map(|k| {
            let (p, f) = (packets[k].came, frames[k].came);
            ms(
                p.duration_since(SystemTime::UNIX_EPOCH).unwrap(),
                f.duration_since(SystemTime::UNIX_EPOCH).unwrap(),
            )
        })
        .collect();
    let range = |v: &[i128]| (*v.iter().min().unwrap(), *v.iter().max().unwrap());
    println!(
        "connection {connection}: /main against /sub, same frame, ms (min, max): on the \
         camera's clock {:?}, by arrival {:?}",
        range(&camera),
        range(&arrival)
    );
    // The set-up: /main's packets came about the lag after /sub's frames.
    let mut sorted = arrival.clone();
    sorted.sort_unstable();
    assert!(
        sorted[FRAMES / 2] >= LAG.as_millis() as i128 * 8 / 10,
        "{arrival:?}"
    );
    let slack = SLACK.as_millis() as i128;
    assert!(
        camera.iter().all(|d| d.abs() <= slack),
        "same frames apart on the camera's clock: {camera:?}"
    );
}
