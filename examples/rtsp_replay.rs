//! An RTSP server replaying pre-encoded files as live cameras send them, for benchmarks that
//! need cameras on the box itself (`CAMERAS=1 scripts/bench-record`): gst-rtsp-server with one
//! mount per `MOUNT=FILE` argument, each `filesrc ! qtdemux ! h264parse ! rtph264pay` (`h265`
//! for an H.265 file), paced by the server's clock as a camera is. Nothing is decoded or
//! encoded: a client costs the server a demux and a packet copy. Media are not shared, so each
//! client gets its file from the first frame (a keyframe) and, at its end, an end of stream.
//! The same launch line as the tests' `FileServer` (tests/common/replay.rs, included here).
//!
//! Run:  cargo run --example rtsp_replay -- --port P /main1=MAIN.mp4 /sub1=SUB.mp4 ...
//! `--port 0` (the default) lets the kernel pick; the bound port is printed on stdout as
//! `rtsp_replay: listening on 127.0.0.1:PORT` once the server takes clients. It serves until
//! killed (SIGINT or SIGTERM).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context as _, anyhow, bail};
use gstreamer as gst;
use gstreamer::glib;
use gstreamer_rtsp_server as rtsp_server;
use gstreamer_rtsp_server::prelude::*;

#[path = "../tests/common/replay.rs"]
mod replay;

fn main() -> anyhow::Result<()> {
    let mut port = String::from("0");
    let mut mounts = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--port" {
            port = args.next().ok_or_else(|| anyhow!("--port needs a value"))?;
        } else if let Some((mount, file)) = arg.split_once('=')
            && mount.starts_with('/')
        {
            mounts.push((mount.to_owned(), file.to_owned()));
        } else {
            bail!("unexpected argument {arg:?}: expected --port P or /MOUNT=FILE");
        }
    }
    if mounts.is_empty() {
        bail!("no mount: give at least one /MOUNT=FILE");
    }
    gst::init()?;
    let server = rtsp_server::RTSPServer::new();
    server.set_address("127.0.0.1");
    server.set_service(&port);
    let points = server
        .mount_points()
        .ok_or_else(|| anyhow!("the server has no mount points"))?;
    // K cameras are K mounts of the same two files: each file is read once.
    let mut launches = HashMap::new();
    for (mount, file) in &mounts {
        let launch = match launches.get(file) {
            Some(launch) => launch,
            None => launches
                .entry(file.clone())
                .or_insert(replay::launch(Path::new(file), "")?),
        };
        let factory = rtsp_server::RTSPMediaFactory::new();
        factory.set_launch(launch);
        factory.set_shared(false);
        points.add_factory(mount, factory);
    }
    let main_loop = glib::MainLoop::new(None, false);
    let _listener = server
        .attach(None)
        .with_context(|| format!("binding the rtsp server to 127.0.0.1:{port}"))?;
    // The script waits for this line before it connects anything.
    println!(
        "rtsp_replay: listening on 127.0.0.1:{}",
        server.bound_port()
    );
    main_loop.run();
    Ok(())
}
