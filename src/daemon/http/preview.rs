//! `/preview/SOURCE`: an MJPEG stream (`multipart/x-mixed-replace`) of what the source's
//! `preview` sink publishes. The client holds a `Watch` while connected, so the sink encodes
//! only then; each JPEG is written and flushed as it comes.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::daemon::Live;
use crate::daemon::live::Parts;
use crate::sinks::preview::hub;

const BOUNDARY: &str = "vidflowframe";

/// Whether a preview sink open now takes the frames of `source`.
pub(super) fn available(parts: &Parts, source: &str) -> bool {
    parts
        .sinks
        .iter()
        .any(|s| hub().is_preview_sink(&s.name) && s.sender.takes(source))
}

/// Streams the source's JPEGs until the client goes or the server stops.
pub(super) fn stream(
    mut stream: TcpStream,
    live: &Live,
    source: &str,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let parts = live.parts();
    if !parts.sources.iter().any(|s| &*s.name == source) {
        let body = format!("no source \"{source}\"\n");
        return super::respond(&mut stream, 404, "text/plain", body.as_bytes());
    }
    if !available(&parts, source) {
        let body = format!(
            "source \"{source}\" has no preview sink: add one, e.g. [sinks.preview] kind = \"preview\", image = \"$frame\"\n"
        );
        return super::respond(&mut stream, 404, "text/plain", body.as_bytes());
    }
    drop(parts);
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: multipart/x-mixed-replace; boundary={BOUNDARY}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes())?;
    stream.flush()?;
    let mut watch = hub().channel(source).watch();
    while let Some(jpeg) = watch.next(|| stop.load(Ordering::Acquire)) {
        let part = format!(
            "--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n",
            jpeg.len()
        );
        stream.write_all(part.as_bytes())?;
        stream.write_all(&jpeg)?;
        stream.write_all(b"\r\n")?;
        stream.flush()?;
    }
    Ok(())
}
