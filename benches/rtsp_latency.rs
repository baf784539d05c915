//! Latency of an RTSP source, from the server's raw frame to the frame in vidflow's hands.
//!
//! Run:   cargo bench --bench rtsp_latency      (~1 min: 4 runs of 300 frames at 30 fps)
//! Test:  `cargo test --benches` runs each case on a few frames, checking the stamps decode.
//!
//! Method, all in one process so that both ends read the same monotonic clock: an RTSP server
//! (gst-rtsp-server on 127.0.0.1, 320x240 I420 from a live `videotestsrc`, x264 `zerolatency
//! ultrafast`, as `tests/common/rtsp.rs` serves it) has a buffer probe on the raw video before
//! the encoder. The probe writes the frame's number into its luma plane as 16 blocks of 16x16 px
//! across the top (white = 1, most significant first) with their complement in the 16 rows below
//! (so a misread is detected, not counted), and notes the `Instant` it did so. The client decodes
//! the number from the luma plane of each frame it receives (the mean of each block's centre, 8x8
//! px, against mid-grey) and takes latency = now - sent[number]. This includes encoding, RTP over
//! TCP on loopback, rtspsrc's jitter buffer, decoding and the hand-off to the consumer.
//!
//! Measured, for `latency_ms` = 0 and 200 (rtspsrc's jitter buffer; 200 is vidflow's default),
//! transport tcp:
//! - vidflow: `vidflow::source::start` with the source of a pipeline file loaded by
//!   `vidflow::config::load_text`; frames read from its queue (`Frame::luma`, zero-copy). This is
//!   the source stage: its GStreamer pipeline, appsink callback and bounded queue; the executor
//!   adds microseconds on top.
//! - baseline, in the same run on the same server: a bare GStreamer client
//!   `rtspsrc latency=L protocols=tcp ! decodebin ! appsink sync=false`, samples pulled on the
//!   bench thread, the luma plane mapped. The difference is what vidflow's source adds.
//!
//! Printed per case: frames measured, p50, p99 and max latency; its two parts (p50 each): the
//! server's, stamp -> the frame's last RTP packet leaving the payloader (a second probe, on
//! `pay0`; about one frame interval, the same for both clients), and the client's, that packet
//! -> the frame received; and frames whose stamp did not decode. The first second of each connection (connecting, waiting for a key frame) is skipped.
//! Not criterion: this is a distribution of one-way latencies of a live stream, not the repeated
//! timing of a closure.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a benchmark: a broken set-up should stop it"
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer::glib;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_rtsp_server as rtsp_server;
use gstreamer_rtsp_server::gio;
use gstreamer_rtsp_server::prelude::*;
use gstreamer_video as gst_video;
use gstreamer_video::prelude::*;
use opencv::core::{Mat, MatTraitConst};

const WIDTH: u32 = 320;
const HEIGHT: u32 = 240;
const FPS: u32 = 30;
/// Bits of the frame number; one 16x16 block each.
const BITS: usize = 16;
const BLOCK: usize = 16;
/// Frames measured per case (`cargo bench`), and as a smoke test (`cargo test --benches`).
const FRAMES: usize = 300;
const SMOKE_FRAMES: usize = 10;
/// Skipped at the start of each connection.
const WARM_UP: Duration = Duration::from_secs(1);
/// Turns a hang into a failure.
const DEADLINE: Duration = Duration::from_secs(60);

/// When the server stamped each frame number (before encoding), and when the payloader sent
/// the frame's last RTP packet.
#[derive(Debug, Clone, Copy)]
struct Times {
    stamped: Instant,
    payloaded: Option<Instant>,
}

type Sent = Arc<Mutex<HashMap<u64, Times>>>;

// ---- the server ----

/// An RTSP server on its own main loop thread, stamping every raw frame before encoding.
struct Server {
    url: String,
    main_loop: glib::MainLoop,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(sent: Sent) -> Self {
        let server = rtsp_server::RTSPServer::new();
        server.set_address("127.0.0.1");
        server.set_service("0");
        let factory = rtsp_server::RTSPMediaFactory::new();
        // 8-bit 4:2:0 like a camera (see tests/common/rtsp.rs); the probe goes on `stamp`.
        factory.set_launch(&format!(
            "( videotestsrc is-live=true pattern=ball ! \
             capsfilter name=stamp caps=video/x-raw,format=I420,width={WIDTH},height={HEIGHT},\
             framerate={FPS}/1 ! \
             x264enc tune=zerolatency speed-preset=ultrafast key-int-max={FPS} ! \
             rtph264pay name=pay0 pt=96 config-interval=-1 )"
        ));
        factory.set_shared(true);
        // Numbers go on across media (a media is made again when a client comes after the last
        // one left).
        let counter = Arc::new(AtomicU64::new(0));
        factory.connect_media_configure(move |_, media| {
            let bin = media
                .element()
                .downcast::<gst::Bin>()
                .expect("media element is a bin");
            let pad = |name: &str| {
                bin.by_name(name)
                    .and_then(|e| e.static_pad("src"))
                    .expect("stamp and pay0 elements")
            };
            // This media's frames are numbered from here on, in order, by both probes: the
            // encoder makes one access unit per frame, whose last packet has the marker bit.
            let next_paid = AtomicU64::new(counter.load(Ordering::Relaxed));
            let paid = sent.clone();
            pad("pay0").add_probe(gst::PadProbeType::BUFFER, move |_, probe| {
                let marker = probe
                    .buffer()
                    .is_some_and(|b| b.flags().contains(gst::BufferFlags::MARKER));
                if marker {
                    let mut sent = paid.lock().unwrap_or_else(PoisonError::into_inner);
                    let n = next_paid.fetch_add(1, Ordering::Relaxed);
                    if let Some(times) = sent.get_mut(&n) {
                        times.payloaded = Some(Instant::now());
                    }
                }
                gst::PadProbeReturn::Ok
            });
            let (sent, counter) = (sent.clone(), counter.clone());
            let info = gst_video::VideoInfo::builder(gst_video::VideoFormat::I420, WIDTH, HEIGHT)
                .build()
                .expect("video info");
            pad("stamp").add_probe(gst::PadProbeType::BUFFER, move |_, probe| {
                if let Some(buffer) = probe.buffer_mut() {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    stamp(buffer.make_mut(), &info, n);
                    let times = Times {
                        stamped: Instant::now(),
                        payloaded: None,
                    };
                    sent.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(n, times);
                }
                gst::PadProbeReturn::Ok
            });
        });
        server
            .mount_points()
            .expect("mount points")
            .add_factory("/stamped", factory);
        let listener = server
            .create_source(None::<&gio::Cancellable>)
            .expect("binding the rtsp server");
        let port = server.bound_port();
        let context = glib::MainContext::new();
        listener.attach(Some(&context));
        let main_loop = glib::MainLoop::new(Some(&context), false);
        let thread = {
            let main_loop = main_loop.clone();
            std::thread::Builder::new()
                .name("bench-rtsp".to_owned())
                .spawn(move || {
                    // Keeps the server (and its listener) alive while the loop runs.
                    let _server = server;
                    context
                        .with_thread_default(|| main_loop.run())
                        .expect("own the main context");
                    listener.destroy();
                })
                .expect("spawn server thread")
        };
        Self {
            url: format!("rtsp://127.0.0.1:{port}/stamped"),
            main_loop,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.main_loop.quit();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes `n` into the luma plane: bit i (most significant first) as block i of the top row
/// (white 1, black 0), its complement as block i of the row below.
fn stamp(buffer: &mut gst::BufferRef, info: &gst_video::VideoInfo, n: u64) {
    let Ok(mut frame) = gst_video::VideoFrameRef::from_buffer_ref_writable(buffer, info) else {
        return;
    };
    let stride = usize::try_from(frame.plane_stride()[0]).expect("stride");
    let Ok(luma) = frame.plane_data_mut(0) else {
        return;
    };
    for bit in 0..BITS {
        let one = (n >> (BITS - 1 - bit)) & 1 == 1;
        for (row_of_blocks, white) in [(0, one), (1, !one)] {
            let value = if white { 235 } else { 16 };
            for y in row_of_blocks * BLOCK..(row_of_blocks + 1) * BLOCK {
                let start = y * stride + bit * BLOCK;
                luma[start..start + BLOCK].fill(value);
            }
        }
    }
}

/// Reads the number back from the luma at `pixel(x, y)`; `None` if a block and its complement
/// disagree.
fn read_stamp(pixel: impl Fn(usize, usize) -> u8) -> Option<u64> {
    let centre = |bx: usize, by: usize| {
        let mut sum = 0u32;
        for y in by * BLOCK + 4..by * BLOCK + 12 {
            for x in bx * BLOCK + 4..bx * BLOCK + 12 {
                sum += u32::from(pixel(x, y));
            }
        }
        sum / 64 > 128
    };
    let mut n = 0;
    for bit in 0..BITS {
        let one = centre(bit, 0);
        if one == centre(bit, 1) {
            return None;
        }
        n = n << 1 | u64::from(one);
    }
    Some(n)
}

/// The number stamped in a received frame, mapped to the full counter: the stamp holds its low
/// 16 bits, and a received frame is never more than 2^15 frames from the newest one sent.
fn widen(low: u64, sent: &HashMap<u64, Times>) -> Option<u64> {
    let newest = sent.keys().copied().max()?;
    let modulus = 1u64 << BITS;
    let candidate = (newest & !(modulus - 1)) | low;
    let n = if candidate > newest {
        candidate.checked_sub(modulus)?
    } else {
        candidate
    };
    sent.contains_key(&n).then_some(n)
}

// ---- measuring ----

/// Latencies of one case (stamp -> received), the server's share of each (stamp -> last
/// packet sent), and frames whose stamp did not decode.
#[derive(Default)]
struct Sample {
    latencies: Vec<Duration>,
    server: Vec<Duration>,
    /// Last packet sent -> received: loopback TCP, depayloading, decoding, hand-off.
    client: Vec<Duration>,
    unreadable: usize,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `q` quantile (nearest rank) of sorted durations.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let rank = (sorted.len() as f64 * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Sample {
    fn record(&mut self, sent: &Sent, stamp: Option<u64>, received: Instant) {
        let sent = sent.lock().unwrap_or_else(PoisonError::into_inner);
        match stamp.and_then(|low| widen(low, &sent)) {
            Some(n) => {
                let times = sent[&n];
                self.latencies
                    .push(received.saturating_duration_since(times.stamped));
                if let Some(paid) = times.payloaded {
                    self.server
                        .push(paid.saturating_duration_since(times.stamped));
                    self.client.push(received.saturating_duration_since(paid));
                }
            }
            None => self.unreadable += 1,
        }
    }

    fn report(&self, case: &str) {
        let mut v = self.latencies.clone();
        v.sort();
        let p50 = |d: &[Duration]| {
            let mut d = d.to_vec();
            d.sort();
            if d.is_empty() {
                "?".to_owned()
            } else {
                format!("{:.1}", ms(quantile(&d, 0.5)))
            }
        };
        println!(
            "{case:<24} {:>4} frames  p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms  \
             (p50 server {} + client {} ms)  unreadable {}",
            v.len(),
            ms(quantile(&v, 0.5)),
            ms(quantile(&v, 0.99)),
            ms(*v.last().expect("frames measured")),
            p50(&self.server),
            p50(&self.client),
            self.unreadable
        );
    }
}

/// vidflow's source stage: the source of a pipeline file, started alone, frames read from its
/// queue.
fn vidflow_source(url: &str, latency_ms: u32, sent: &Sent, frames: usize) -> Sample {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = format!(
        "[sources.cam]\nuri = \"{url}\"\ntransport = \"tcp\"\nlatency_ms = {latency_ms}\n\n\
         [sinks.events]\nkind = \"jsonl\"\npath = \"{}\"\n",
        dir.path().join("unused.jsonl").display()
    );
    let pipeline =
        vidflow::config::load_text(&vidflow::config::SourceText::new("rtsp_latency.toml", text))
            .expect("pipeline loads");
    let config = &pipeline.sources[0];
    let (tx, rx) = crossbeam_channel::bounded(config.options.queue);
    let source = vidflow::source::start(config, tx, &rx, None).expect("source starts");

    let mut sample = Sample::default();
    let start = Instant::now();
    while sample.latencies.len() < frames {
        assert!(start.elapsed() < DEADLINE, "vidflow: no frames");
        let Ok(frame) = rx.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let received = Instant::now();
        if start.elapsed() < WARM_UP {
            continue;
        }
        let luma: &Mat = frame.luma().expect("a YUV frame");
        let stamp = read_stamp(|x, y| {
            *luma
                .at_2d::<u8>(y as i32, x as i32)
                .expect("pixel inside the frame")
        });
        sample.record(sent, stamp, received);
    }
    source.control().stop();
    // Drain until the source is down and its sender gone.
    while rx.recv_timeout(DEADLINE).is_ok() {}
    source.join().expect("source ends cleanly");
    sample
}

/// The baseline: a bare GStreamer client, samples pulled on this thread.
fn bare_gstreamer(url: &str, latency_ms: u32, sent: &Sent, frames: usize) -> Sample {
    let pipeline = gst::parse::launch(&format!(
        "rtspsrc name=src latency={latency_ms} protocols=tcp ! decodebin ! \
         appsink name=out sync=false max-buffers=2 drop=true"
    ))
    .expect("client pipeline")
    .downcast::<gst::Pipeline>()
    .expect("a pipeline");
    pipeline
        .by_name("src")
        .expect("rtspsrc")
        .set_property("location", url);
    let sink = pipeline
        .by_name("out")
        .and_then(|e| e.downcast::<gst_app::AppSink>().ok())
        .expect("appsink");
    pipeline
        .set_state(gst::State::Playing)
        .expect("client plays");

    let mut sample = Sample::default();
    let start = Instant::now();
    while sample.latencies.len() < frames {
        assert!(start.elapsed() < DEADLINE, "bare gstreamer: no frames");
        let Some(s) = sink.try_pull_sample(gst::ClockTime::from_mseconds(100)) else {
            continue;
        };
        let received = Instant::now();
        if start.elapsed() < WARM_UP {
            continue;
        }
        let info = gst_video::VideoInfo::from_caps(s.caps().expect("caps")).expect("video caps");
        let buffer = s.buffer().expect("buffer");
        let frame =
            gst_video::VideoFrameRef::from_buffer_ref_readable(buffer, &info).expect("map frame");
        let stride = usize::try_from(frame.plane_stride()[0]).expect("stride");
        let luma = frame.plane_data(0).expect("luma plane");
        sample.record(sent, read_stamp(|x, y| luma[y * stride + x]), received);
    }
    let _ = pipeline.set_state(gst::State::Null);
    sample
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` does not: then a short smoke run.
    let frames = if std::env::args().any(|a| a == "--bench") {
        FRAMES
    } else {
        SMOKE_FRAMES
    };
    gst::init().expect("gstreamer");
    vidflow::gst_setup::init().expect("gstreamer");
    let sent: Sent = Arc::default();
    let server = Server::start(sent.clone());
    println!(
        "RTSP {WIDTH}x{HEIGHT} @ {FPS} fps, H.264 over TCP on loopback: raw frame before \
         encoding -> decoded frame in the consumer's hands"
    );
    for latency_ms in [0, 200] {
        let ours = vidflow_source(&server.url, latency_ms, &sent, frames);
        ours.report(&format!("vidflow latency_ms={latency_ms}"));
        let bare = bare_gstreamer(&server.url, latency_ms, &sent, frames);
        bare.report(&format!("bare gst latency={latency_ms}"));
        for (what, s) in [("vidflow", &ours), ("bare gstreamer", &bare)] {
            assert!(
                s.unreadable <= s.latencies.len() / 10,
                "{what}: {} of {} stamps did not decode",
                s.unreadable,
                s.latencies.len() + s.unreadable
            );
        }
    }
    drop(server);
}
