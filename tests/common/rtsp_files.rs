//! A real RTSP server replaying pre-encoded files, as a camera sends its own encoded streams:
//! `gst-rtsp-server` on 127.0.0.1 with one mount per file (`/main`, `/sub`, ...), each
//! `filesrc ! qtdemux ! h264parse ! rtph264pay` (`h265` for an H.265 file), paced by the
//! server's clock. Media are not
//! shared: every client gets the file from its first frame, and at its end an end of stream.
//!
//! Threads and stop protocol: as `rtsp.rs` (one `vidflow-test-rtsp` loop thread on a context of
//! its own; `stop` destroys the listener, removes clients and sessions, quits the loop and joins
//! it; `restart` binds the same port again with a new server).
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::thread::JoinHandle;

use anyhow::{Context as _, anyhow};
use gstreamer as gst;
use gstreamer::glib;
use gstreamer_rtsp_server as rtsp_server;
use gstreamer_rtsp_server::gio;
use gstreamer_rtsp_server::prelude::*;

use super::rtsp::{run_loop, shut_down};

#[derive(Debug)]
pub struct FileServer {
    mounts: Vec<(String, PathBuf)>,
    port: u16,
    running: Option<Serving>,
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
        gst::init()?;
        let mounts: Vec<(String, PathBuf)> = mounts
            .iter()
            .map(|(m, f)| ((*m).to_owned(), f.clone()))
            .collect();
        let running = Serving::start(&mounts, 0)?;
        let port = u16::try_from(running.server.bound_port())?;
        Ok(Self {
            mounts,
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
        self.running = Some(Serving::start(&self.mounts, self.port)?);
        Ok(())
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Serving {
    fn start(mounts: &[(String, PathBuf)], port: u16) -> anyhow::Result<Self> {
        let server = rtsp_server::RTSPServer::new();
        server.set_address("127.0.0.1");
        server.set_service(&port.to_string());
        let points = server
            .mount_points()
            .ok_or_else(|| anyhow!("no mount points"))?;
        for (mount, file) in mounts {
            let factory = rtsp_server::RTSPMediaFactory::new();
            let codec = codec_of(file)?;
            factory.set_launch(&format!(
                "( filesrc location={} ! qtdemux ! {codec}parse ! \
                 rtp{codec}pay name=pay0 pt=96 config-interval=-1 )",
                file.display()
            ));
            factory.set_shared(false);
            points.add_factory(mount, factory);
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

/// `"h265"` for an MP4 file whose video is H.265 (its sample entry `hvc1` or `hev1`), else
/// `"h264"`.
fn codec_of(file: &std::path::Path) -> anyhow::Result<&'static str> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let h265 = bytes.windows(4).any(|w| w == b"hvc1" || w == b"hev1");
    Ok(if h265 { "h265" } else { "h264" })
}
