//! A real RTSP server replaying pre-encoded files, as a camera sends its own encoded streams:
//! `gst-rtsp-server` on 127.0.0.1 with one mount per file (`/main`, `/sub`, ...), each
//! `filesrc ! qtdemux ! h264parse ! rtph264pay` (`h265` for an H.265 file), paced by the
//! server's clock. Media are not
//! shared: every client gets the file from its first frame, and at its end an end of stream.
//! A server may be one camera ([`FileServer::start_camera`]):
//! - its mounts' files play on one timeline, from [`TIMELINE_AHEAD`] after the first client
//!   came: frame k of every mount is captured at one time, whatever its client's connection
//!   time within [`TIMELINE_JOIN`] (a client who comes later starts a timeline of its own,
//!   rather than getting the file's past at once);
//! - a mount may lag: its packets leave the server that long after their capture time (their
//!   timestamps, on which the RTCP sender reports' clock stays), like a camera whose
//!   main-stream encoder is slower than its sub-stream's;
//! - each client has a thread of its own (a lagging mount's client waits that long for its
//!   first packet, and holds its thread meanwhile).
//!
//! A server may also send no RTCP at all ([`FileServer::start_without_rtcp`]), like a camera
//! that gives no sender reports.
//!
//! Threads and stop protocol: as `rtsp.rs` (one `vidflow-test-rtsp` loop thread on a context of
//! its own; `stop` destroys the listener, removes clients and sessions, quits the loop and joins
//! it; `restart` binds the same port again with a new server).
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use gstreamer as gst;
use gstreamer::glib;
use gstreamer_rtsp_server as rtsp_server;
use gstreamer_rtsp_server::gio;
use gstreamer_rtsp_server::prelude::*;

use super::rtsp::{run_loop, shut_down};

#[path = "replay.rs"]
mod replay;

#[derive(Debug)]
pub struct FileServer {
    mounts: Vec<Mount>,
    options: Options,
    port: u16,
    running: Option<Serving>,
}

/// How long after the first client of a camera its files start: time for every client to
/// connect before its first frame is due (one connecting later would get a burst of frames).
const TIMELINE_AHEAD: Duration = Duration::from_secs(1);
/// Longest after a camera's first client another joins its timeline: a reconnection at the
/// end of the file starts a new one.
const TIMELINE_JOIN: Duration = Duration::from_secs(5);
/// Threads for a camera's clients, one each.
const CAMERA_CLIENTS: i32 = 4;

/// How a server serves its mounts (see the module header).
#[derive(Debug, Clone, Copy, Default)]
struct Options {
    /// The mounts are one camera's streams, on one timeline.
    camera: bool,
    /// No RTCP: no sender reports.
    no_rtcp: bool,
}

/// One mount: its path, its file, and how long its packets lag their capture time.
#[derive(Debug, Clone)]
struct Mount {
    path: String,
    file: PathBuf,
    lag: Duration,
}

#[derive(Debug)]
struct Serving {
    server: rtsp_server::RTSPServer,
    main_loop: glib::MainLoop,
    context: glib::MainContext,
    listener: glib::Source,
    thread: JoinHandle<()>,
}

impl FileServer {
    /// Serves each (mount, MP4 file with H.264 or H.265) on a port the kernel picks.
    pub fn start(mounts: &[(&str, PathBuf)]) -> anyhow::Result<Self> {
        Self::serve(&without_lag(mounts), Options::default())
    }

    /// As [`FileServer::start`], sending no RTCP (so no sender report).
    pub fn start_without_rtcp(mounts: &[(&str, PathBuf)]) -> anyhow::Result<Self> {
        let options = Options {
            no_rtcp: true,
            ..Options::default()
        };
        Self::serve(&without_lag(mounts), options)
    }

    /// Serves each (mount, file, lag) as the streams of one camera (see the module header):
    /// one timeline from the first client's connection on, each mount's packets sent its lag
    /// after their capture time.
    pub fn start_camera(mounts: &[(&str, PathBuf, Duration)]) -> anyhow::Result<Self> {
        let options = Options {
            camera: true,
            ..Options::default()
        };
        Self::serve(mounts, options)
    }

    fn serve(mounts: &[(&str, PathBuf, Duration)], options: Options) -> anyhow::Result<Self> {
        gst::init()?;
        let mounts: Vec<Mount> = mounts
            .iter()
            .map(|(m, f, lag)| Mount {
                path: (*m).to_owned(),
                file: f.clone(),
                lag: *lag,
            })
            .collect();
        let running = Serving::start(&mounts, options, 0)?;
        let port = u16::try_from(running.server.bound_port())?;
        Ok(Self {
            mounts,
            options,
            port,
            running: Some(running),
        })
    }

    pub fn url(&self, mount: &str) -> String {
        format!("rtsp://127.0.0.1:{}{mount}", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop();
        }
    }

    /// Serves the same files on the same port again.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.running = Some(Serving::start(&self.mounts, self.options, self.port)?);
        Ok(())
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Serving {
    fn start(mounts: &[Mount], options: Options, port: u16) -> anyhow::Result<Self> {
        let server = rtsp_server::RTSPServer::new();
        server.set_address("127.0.0.1");
        server.set_service(&port.to_string());
        let points = server
            .mount_points()
            .ok_or_else(|| anyhow!("no mount points"))?;
        // One camera: when its timeline started, and its base time.
        let timeline: Arc<Mutex<Option<(gst::ClockTime, gst::ClockTime)>>> = Arc::default();
        if options.camera
            && let Some(pool) = server.thread_pool()
        {
            pool.set_max_threads(CAMERA_CLIENTS);
        }
        for mount in mounts {
            let factory = rtsp_server::RTSPMediaFactory::new();
            // identity holds each unit until its lag past its capture time (its timestamp,
            // which it leaves as it is: the payloader's RTP times and the sender reports
            // stay on the capture time); the sinks then send it at once, late.
            let lag = if mount.lag.is_zero() {
                String::new()
            } else {
                format!("identity sync=true ts-offset={} ! ", mount.lag.as_nanos())
            };
            factory.set_launch(&replay::launch(&mount.file, &lag)?);
            factory.set_shared(false);
            if options.no_rtcp {
                factory.set_property("enable-rtcp", false);
            }
            if options.camera {
                let timeline = timeline.clone();
                factory.connect_media_configure(move |_, media| one_timeline(media, &timeline));
            }
            points.add_factory(&mount.path, factory);
        }
        let listener = server
            .create_source(None::<&gio::Cancellable>)
            .with_context(|| format!("binding rtsp server to 127.0.0.1:{port}"))?;
        let context = glib::MainContext::new();
        listener.attach(Some(&context));
        let main_loop = glib::MainLoop::new(Some(&context), false);
        let thread = {
            let (context, main_loop) = (context.clone(), main_loop.clone());
            std::thread::Builder::new()
                .name("vidflow-test-rtsp".to_owned())
                .spawn(move || run_loop(&context, &main_loop))?
        };
        Ok(Self {
            server,
            main_loop,
            context,
            listener,
            thread,
        })
    }

    fn stop(self) {
        let Self {
            server,
            main_loop,
            context,
            listener,
            thread,
        } = self;
        shut_down(server, &context, &main_loop, listener, thread);
    }
}

/// Puts `media`'s pipeline on the camera's `timeline` (started, base time): a base time
/// [`TIMELINE_AHEAD`] from now for the first, which every pipeline that comes within
/// [`TIMELINE_JOIN`] keeps rather than taking its own when it plays.
fn one_timeline(
    media: &rtsp_server::RTSPMedia,
    timeline: &Mutex<Option<(gst::ClockTime, gst::ClockTime)>>,
) {
    let Some(pipeline) = media
        .element()
        .parent()
        .and_then(|p| p.downcast::<gst::Pipeline>().ok())
    else {
        return;
    };
    let clock = gst::SystemClock::obtain();
    let now = clock.time();
    let mut timeline = timeline.lock().unwrap();
    let join = gst::ClockTime::try_from(TIMELINE_JOIN).unwrap();
    let base = match *timeline {
        Some((started, base)) if now <= started + join => base,
        _ => {
            let base = now + gst::ClockTime::try_from(TIMELINE_AHEAD).unwrap();
            *timeline = Some((now, base));
            base
        }
    };
    pipeline.use_clock(Some(&clock));
    pipeline.set_start_time(gst::ClockTime::NONE);
    pipeline.set_base_time(base);
}

/// (mount, file) pairs as mounts that do not lag.
fn without_lag<'a>(mounts: &[(&'a str, PathBuf)]) -> Vec<(&'a str, PathBuf, Duration)> {
    mounts
        .iter()
        .map(|(m, f)| (*m, f.clone(), Duration::ZERO))
        .collect()
}
