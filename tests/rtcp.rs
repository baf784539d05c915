//! The camera's clock from its RTCP sender reports (`src/source/rtcp.rs`), measured on a real
//! gst-rtsp-server camera: `/sub` and `/main` play one file on one timeline, `/main` sent 1 s
//! late (a slow main-stream encoder). Frame k of the decoded `/sub` and packet k of the
//! recorded `/main` are the same capture: the camera's clock puts them together, where their
//! arrival times are 10 frames apart. Prints the spread docs/guides/recording.md quotes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/rtsp.rs"]
mod rtsp;
#[path = "common/rtsp_files.rs"]
mod rtsp_files;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rtsp_files::FileServer;
use vidflow::frame::CameraClock;
use vidflow::packets::Carried;
use vidflow::source::{SourceConfig, SourceOptions, SourceUri};

const FPS: u64 = 10;
/// Frames compared: 8 s, past the first sender report of both streams.
const FRAMES: usize = 80;
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
    let server = FileServer::start_camera(&[
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
    let subscription = vidflow::packets::hub().subscribe("rtcp-cam");
    let (tx, rx) = crossbeam_channel::bounded(FRAMES * 2);
    let source = vidflow::source::start(&config, tx, &rx, None).unwrap();

    let (mut frames, mut packets) = (Vec::new(), Vec::new());
    let until = Instant::now() + DEADLINE;
    while (frames.len() < FRAMES || packets.len() < FRAMES) && Instant::now() < until {
        crossbeam_channel::select! {
            recv(rx) -> frame => {
                let frame = frame.unwrap();
                frames.push(Seen {
                    pts: frame.pts.unwrap(),
                    clock: frame.clock.clone().expect("an rtsp frame without a clock"),
                    came: frame.captured,
                });
            }
            recv(subscription.packets) -> item => {
                if let Ok(Carried::Packet(p)) = item {
                    packets.push(Seen {
                        pts: p.buffer.pts().unwrap().into(),
                        clock: p.clock.clone().expect("an rtsp packet without a clock"),
                        came: p.arrival,
                    });
                }
            }
            default(Duration::from_millis(100)) => {}
        }
    }
    source.control().abort();
    drop(rx);
    source.join().unwrap();
    assert!(frames.len() >= FRAMES && packets.len() >= FRAMES);

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
        "/main against /sub, same frame, ms (min, max): on the camera's clock {:?}, by arrival {:?}",
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
