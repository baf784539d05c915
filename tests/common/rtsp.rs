//! A real RTSP server for integration tests: H.264 (or H.265) from a live `videotestsrc`,
//! served by `gst-rtsp-server` on 127.0.0.1, optionally behind basic auth, and able to go away
//! and come back on the same port so reconnect logic can be tested against the real thing.
//!
//! It can also go quiet without going away: `pause_frames` closes a `valve` between the test
//! source and the encoder in every media constructed so far, so no RTP packet is sent while the
//! RTSP session and its TCP connection stay open (RTCP and keep-alives go on); `resume_frames`
//! opens them again. A media constructed later starts with its valve open, whatever was paused
//! before.
//!
//! Threads: while the server is up, one thread (`vidflow-test-rtsp`) runs a `glib::MainLoop` on a
//! `glib::MainContext` of its own; the listening socket and every client connection are dispatched
//! there. Each prepared media adds gst-rtsp-server's media thread and the pipeline's streaming
//! threads; they end when the media is unprepared (last session gone).
//!
//! Stop protocol (`stop`, and `Drop`): a closure is invoked on the loop thread that destroys the
//! listening source (which closes the socket, so new connections are refused), closes every
//! client connection, removes every session from the pool (which unprepares the shared media) and
//! quits the loop; the loop thread then drains what is still pending on its context and the caller
//! joins it. `restart` binds the same port again with a fresh server object and loop thread, so
//! nothing of the previous run survives; `restart_with` does so serving another size or rate.
#![allow(dead_code, unreachable_pub)]

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use anyhow::{Context as _, anyhow, bail};
use gstreamer as gst;
use gstreamer::glib;
use gstreamer_rtsp_server as rtsp_server;
use gstreamer_rtsp_server::gio;
use gstreamer_rtsp_server::prelude::*;

/// Name of the `valve` in the launch line, found again in each media's bin.
const VALVE: &str = "valve";

/// Upper bound on the dispatches the loop thread runs after quitting, to finish closing clients;
/// a bound so that a source that keeps re-arming itself cannot hang `stop`.
const MAX_DRAIN_ITERATIONS: usize = 10_000;

/// What the server serves and who may watch it.
#[derive(Debug, Clone)]
pub struct RtspServerOptions {
    pub width: u32,
    pub height: u32,
    pub fps: u32,
    /// Mount path, starting with `/`, e.g. `/test`.
    pub path: String,
    /// When set, only this user (basic auth) may play; anyone else gets 401.
    pub credentials: Option<(String, String)>,
    /// `videotestsrc`'s pattern: `ball` (a few kB/s of H.264), `snow` (noise: a few hundred).
    pub pattern: &'static str,
    /// H.265 (`x265enc`, `rtph265pay`) instead of H.264, as a camera set to H.265 sends it:
    /// no B-frames, a keyframe a second.
    pub h265: bool,
}

impl Default for RtspServerOptions {
    fn default() -> Self {
        Self {
            width: 320,
            height: 240,
            fps: 15,
            path: "/test".to_owned(),
            credentials: None,
            pattern: "ball",
            h265: false,
        }
    }
}

/// A running (or stopped) RTSP server; see the module docs for its threads and stop protocol.
#[derive(Debug)]
pub struct RtspServer {
    options: RtspServerOptions,
    /// Fixed at the first start; `restart` binds it again.
    port: u16,
    /// `Some` while serving.
    running: Option<Running>,
}

/// Runtime state of one serving period, between `start`/`restart` and `stop`.
#[derive(Debug)]
struct Running {
    server: rtsp_server::RTSPServer,
    context: glib::MainContext,
    main_loop: glib::MainLoop,
    /// The listening socket's watch; destroying it closes the socket.
    listener: glib::Source,
    thread: JoinHandle<()>,
    /// The valve of each media constructed so far (weak: a media that is unprepared takes it
    /// along). Filled by the factory's `media-configure` handler on the loop thread.
    valves: Arc<Mutex<Vec<glib::WeakRef<gst::Element>>>>,
}

impl RtspServer {
    /// Starts serving on 127.0.0.1 on a port the kernel picks.
    pub fn start(options: RtspServerOptions) -> anyhow::Result<Self> {
        gst::init().context("initialising GStreamer")?;
        if !options.path.starts_with('/') {
            bail!("rtsp mount path {:?} must start with '/'", options.path);
        }
        let running = Running::start(&options, 0)?;
        let port = u16::try_from(running.server.bound_port())
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| anyhow!("rtsp server reports no bound port"))?;
        Ok(Self {
            options,
            port,
            running: Some(running),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    pub fn options(&self) -> &RtspServerOptions {
        &self.options
    }

    /// `rtsp://127.0.0.1:PORT/PATH`, without credentials.
    pub fn url(&self) -> String {
        format!("rtsp://127.0.0.1:{}{}", self.port, self.options.path)
    }

    /// `rtsp://USER:PASS@127.0.0.1:PORT/PATH`, user and password percent-encoded.
    pub fn url_with_credentials(&self, user: &str, pass: &str) -> String {
        format!(
            "rtsp://{}:{}@127.0.0.1:{}{}",
            percent_encode(user),
            percent_encode(pass),
            self.port,
            self.options.path
        )
    }

    /// Closes every client connection and session and the listening socket, and joins the loop
    /// thread. Afterwards connections to the port are refused. Does nothing when stopped.
    pub fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop();
        }
    }

    /// Stops sending frames on every media constructed so far, keeping sessions and
    /// connections open. Returns how many media it reached (0 when stopped or nobody plays).
    pub fn pause_frames(&self) -> usize {
        self.running.as_ref().map_or(0, |r| r.set_drop(true))
    }

    /// Sends frames again on every media constructed so far; returns how many it reached.
    pub fn resume_frames(&self) -> usize {
        self.running.as_ref().map_or(0, |r| r.set_drop(false))
    }

    /// Serves the stream `options` describe (a camera reconfigured: another size or frame rate)
    /// on the same port, stopping first if still running. The port is kept, not `options`'.
    pub fn restart_with(&mut self, options: RtspServerOptions) -> anyhow::Result<()> {
        self.options = options;
        self.restart()
    }

    /// Serves the same stream on the same port again (stopping first if still running).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        let running = Running::start(&self.options, self.port)
            .with_context(|| format!("restarting rtsp server on port {}", self.port))?;
        self.running = Some(running);
        Ok(())
    }
}

impl Drop for RtspServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Running {
    fn start(options: &RtspServerOptions, port: u16) -> anyhow::Result<Self> {
        let server = rtsp_server::RTSPServer::new();
        server.set_address("127.0.0.1");
        server.set_service(&port.to_string());

        let factory = rtsp_server::RTSPMediaFactory::new();
        factory.set_launch(&launch_description(options));
        factory.set_shared(true);
        let valves: Arc<Mutex<Vec<glib::WeakRef<gst::Element>>>> = Arc::default();
        {
            let valves = valves.clone();
            factory.connect_media_configure(move |_, media| {
                let valve = media
                    .element()
                    .downcast::<gst::Bin>()
                    .ok()
                    .and_then(|bin| bin.by_name(VALVE));
                if let Some(valve) = valve {
                    let mut valves = valves.lock().unwrap_or_else(PoisonError::into_inner);
                    valves.retain(|v| v.upgrade().is_some());
                    valves.push(valve.downgrade());
                }
            });
        }
        if let Some((user, pass)) = &options.credentials {
            let auth = rtsp_server::RTSPAuth::new();
            let token = rtsp_server::RTSPToken::builder()
                .field(rtsp_server::RTSP_TOKEN_MEDIA_FACTORY_ROLE, user.as_str())
                .build();
            auth.add_basic(&rtsp_server::RTSPAuth::make_basic(user, pass), &token);
            server.set_auth(Some(&auth));
            factory.add_role_from_structure(
                &gst::Structure::builder(user.as_str())
                    .field(rtsp_server::RTSP_PERM_MEDIA_FACTORY_ACCESS, true)
                    .field(rtsp_server::RTSP_PERM_MEDIA_FACTORY_CONSTRUCT, true)
                    .build(),
            );
        }
        server
            .mount_points()
            .ok_or_else(|| anyhow!("rtsp server has no mount points"))?
            .add_factory(&options.path, factory);

        // Binds the socket here, on the caller's thread, so a taken port fails `start`.
        let listener = server
            .create_source(None::<&gio::Cancellable>)
            .with_context(|| format!("binding rtsp server to 127.0.0.1:{port}"))?;
        let context = glib::MainContext::new();
        listener.attach(Some(&context));
        let main_loop = glib::MainLoop::new(Some(&context), false);

        let thread = {
            let context = context.clone();
            let main_loop = main_loop.clone();
            std::thread::Builder::new()
                .name("vidflow-test-rtsp".to_owned())
                .spawn(move || run_loop(&context, &main_loop))
        };
        let thread = match thread {
            Ok(thread) => thread,
            Err(e) => {
                listener.destroy();
                return Err(e).context("spawning the rtsp server thread");
            }
        };
        Ok(Self {
            server,
            context,
            main_loop,
            listener,
            thread,
            valves,
        })
    }

    /// Sets `drop` on the valve of every media still alive; returns how many there were.
    fn set_drop(&self, drop: bool) -> usize {
        let valves = self.valves.lock().unwrap_or_else(PoisonError::into_inner);
        let mut reached = 0;
        for valve in valves.iter().filter_map(glib::WeakRef::upgrade) {
            valve.set_property("drop", drop);
            reached += 1;
        }
        reached
    }

    fn stop(self) {
        let Self {
            server,
            context,
            main_loop,
            listener,
            thread,
            valves: _,
        } = self;
        shut_down(server, &context, &main_loop, listener, thread);
    }
}

/// Stops a server run on `main_loop` in `thread`: on its own loop, closes `listener`, removes
/// every client and session, quits the loop, then joins the thread.
pub fn shut_down(
    server: rtsp_server::RTSPServer,
    context: &glib::MainContext,
    main_loop: &glib::MainLoop,
    listener: glib::Source,
    thread: JoinHandle<()>,
) {
    let (loop_server, loop_main_loop) = (server.clone(), main_loop.clone());
    context.invoke(move || {
        listener.destroy();
        loop_server.client_filter(Some(&mut |_, _| rtsp_server::RTSPFilterResult::Remove));
        if let Some(pool) = loop_server.session_pool() {
            pool.filter(Some(&mut |_, _| rtsp_server::RTSPFilterResult::Remove));
        }
        loop_main_loop.quit();
    });
    // A panic on the loop thread has already been printed; there is nothing left to undo.
    let _ = thread.join();
    drop(server);
}

pub fn run_loop(context: &glib::MainContext, main_loop: &glib::MainLoop) {
    let ran = context.with_thread_default(|| {
        main_loop.run();
        // Let closing clients and sessions finish what they queued on this context.
        for _ in 0..MAX_DRAIN_ITERATIONS {
            if !context.iteration(false) {
                break;
            }
        }
    });
    if let Err(e) = ran {
        eprintln!("rtsp test server: cannot own its main context: {e}");
    }
}

/// 8-bit 4:2:0 H.264 like a camera's: without `format=I420`, videotestsrc ! x264enc negotiates
/// Y444_10LE and the stream becomes High 4:4:4 10-bit. The valve (open) lets `pause_frames`
/// starve the encoder, so nothing is sent while the session stays up.
fn launch_description(options: &RtspServerOptions) -> String {
    let RtspServerOptions {
        width,
        height,
        fps,
        pattern,
        h265,
        ..
    } = options;
    let encoder = if *h265 {
        format!(
            "x265enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} \
             option-string=bframes=0 ! rtph265pay name=pay0 pt=96 config-interval=-1"
        )
    } else {
        format!(
            "x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} ! \
             rtph264pay name=pay0 pt=96 config-interval=-1"
        )
    };
    format!(
        "( videotestsrc is-live=true pattern={pattern} ! \
         video/x-raw,format=I420,width={width},height={height},framerate={fps}/1 ! \
         valve name={VALVE} drop=false ! {encoder} )"
    )
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}
