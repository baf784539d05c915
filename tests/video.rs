//! Live video (`/api/video/SOURCE`) through the real binary, from a real RTSP camera
//! (`common::rtsp`, x264 with a keyframe a second) and a real file: the camera's H.264 comes as
//! fragmented MP4 that GStreamer demuxes and decodes, starting at a keyframe, a fragment per
//! picture at the camera's rate; each frame of the live feed (`/api/live`) carries the time of
//! its picture in that video (`media_time`), on a camera and on a looping file; a viewer that
//! stops reading is skipped to a keyframe and counted while another gets every picture; a
//! stop ends the run cleanly beside viewers that never read and a request never finished; a
//! WebSocket gets the same; a source whose stills were chosen (`live_video = "stills"`) is a
//! 409 that says so, and `/api/sources` says it too (sources encoded: `video_encoded.rs`). An
//! H.265 camera (x265 over RTSP) and an H.265 file (`hvc1` in MP4, B-frames, looping) play the
//! same way, as `hvc1` with its `hvcC`, every picture decoded by GStreamer at its live frames'
//! time. The MP4 is read by `common::mp4`; nothing is mocked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;
use crate::common::rtsp;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use common::mp4::{Fragment, Mp4, TIMESCALE, decode};
use common::{Running, free_port, spawn_run, write};
use http_client::{get, open, scrape, value, wait_until};
use rtsp::{RtspServer, RtspServerOptions};

/// Guards against a hang only.
pub(crate) const DEADLINE: Duration = Duration::from_secs(120);

/// Starts vidflow on `sources` (TOML of `[sources.*]` tables) with a preview of `cam`.
pub(crate) fn start(dir: &Path, sources: &str) -> (Running, u16) {
    let port = free_port();
    let p = write(
        dir,
        "p.toml",
        &format!(
            "{sources}\n[http]\nlisten = \"127.0.0.1:{port}\"\n\
             [sinks.watch]\nkind = \"preview\"\nimage = \"$frame\"\nsources = [\"cam\"]\n"
        ),
    );
    (spawn_run(&p, &[], dir), port)
}

/// The header `name`'s value in `headers`.
fn header<'h>(headers: &'h [String], name: &str) -> Option<&'h str> {
    headers.iter().find_map(|h| {
        let (k, v) = h.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Opens `/api/video/SOURCE` of H.264, checks its headers and init segment.
pub(crate) fn watch(port: u16, source: &str) -> Mp4<BufReader<TcpStream>> {
    let (codec, mp4) = watch_codec(port, source);
    assert!(
        codec.starts_with("avc1.") && codec.len() == 11,
        "{codec}: not an RFC 6381 avc1 string"
    );
    mp4
}

/// Opens `/api/video/SOURCE`, checks its headers and its init segment (with the sample entry
/// and record its codec says): the codec, and the stream after the init segment.
fn watch_codec(port: u16, source: &str) -> (String, Mp4<BufReader<TcpStream>>) {
    let (status, headers, reader) = open(port, &format!("/api/video/{source}")).unwrap();
    assert_eq!(status, 200, "{headers:?}");
    assert_eq!(header(&headers, "Content-Type"), Some("video/mp4"));
    assert_eq!(header(&headers, "Cache-Control"), Some("no-store"));
    let codec = header(&headers, "X-Vidflow-Codec").unwrap().to_owned();
    let origin: i64 = header(&headers, "X-Vidflow-Origin-Ms")
        .unwrap()
        .parse()
        .unwrap();
    assert!(origin > 1_600_000_000_000, "{origin}: not epoch ms");
    let mut mp4 = Mp4::new(reader);
    mp4.init(&codec);
    (codec, mp4)
}

/// The `media_time` of the first `n` frames of `/api/live/SOURCE`, in ticks.
pub(crate) fn live_times(port: u16, source: &str, n: usize) -> Vec<u64> {
    let (status, _, mut reader) = open(port, &format!("/api/live/{source}")).unwrap();
    assert_eq!(status, 200);
    let mut times = Vec::new();
    while times.len() < n {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the feed ended");
        if let Some(data) = line.strip_prefix("data: ") {
            let frame: serde_json::Value = serde_json::from_str(data).unwrap();
            let t = frame["media_time"].as_f64().unwrap();
            times.push((t * TIMESCALE as f64).round() as u64);
        }
    }
    times
}

/// Each live frame's time within the video's span is a picture's time in the video, or falls
/// in a gap the video skipped; at least `least` are. A frame time between two consecutive
/// pictures of the video would be a box drawn on no picture.
pub(crate) fn assert_frames_on_pictures(
    frames: &[u64],
    video: &[Fragment],
    frame_ticks: u64,
    least: usize,
) {
    let mut pictures: Vec<u64> = video.iter().map(Fragment::presentation).collect();
    pictures.sort_unstable();
    let set: BTreeSet<u64> = pictures.iter().copied().collect();
    let (first, last) = (pictures[0], *pictures.last().unwrap());
    let mut matched = 0;
    for &t in frames.iter().filter(|&&t| t >= first && t <= last) {
        if set.contains(&t) {
            matched += 1;
            continue;
        }
        let after = pictures.partition_point(|&p| p < t);
        let gap = pictures[after] - pictures[after - 1];
        assert!(
            gap > frame_ticks * 3 / 2,
            "frame at {t} falls between pictures {} and {}",
            pictures[after - 1],
            pictures[after]
        );
    }
    assert!(
        matched >= least,
        "{matched} frames on pictures: {frames:?} against {pictures:?}"
    );
}

#[test]
fn a_camera_plays_as_mp4_from_a_keyframe_at_its_rate_and_each_frame_shares_its_pictures_time() {
    let server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let fps = server.options().fps;
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(
        dir.path(),
        &format!(
            "[sources.cam]\nuri = \"{}\"\n[sources.pattern]\nuri = \"test://ball?fps=5\"\n\
             live_video = \"stills\"\n",
            server.url()
        ),
    );
    http_client::wait_for_frames(port, "cam", 2 * fps, DEADLINE);
    let feed = std::thread::spawn(move || live_times(port, "cam", 3 * fps as usize));
    let mut mp4 = watch(port, "cam");
    let fragments: Vec<Fragment> = (0..4 * fps).map(|_| mp4.fragment()).collect();
    assert!(
        fragments[0].keyframe,
        "the stream does not start at a keyframe"
    );
    // A fragment per picture, in order, none twice: consecutive decoding times at least about a
    // frame apart (the jitter buffer smooths the camera's clock). A picture the camera sent
    // too late for the jitter buffer (a test camera starved of CPU) never reaches the decoder,
    // so it is no picture of the video either: whether every picture that reached the decoder
    // is in the video is `assert_frames_on_pictures` below, against the frames decoded.
    let frame = TIMESCALE / u64::from(fps);
    for w in fragments.windows(2) {
        let step = w[1].decode - w[0].decode;
        assert!(
            step > frame / 2,
            "{step} ticks between pictures, less than a frame ({frame})"
        );
    }
    assert!(fragments.iter().skip(1).any(|f| f.keyframe));
    // GStreamer decodes every picture, at the time written.
    let mut written: Vec<u64> = fragments.iter().map(Fragment::presentation).collect();
    written.sort_unstable();
    assert_eq!(decode(&mp4.bytes, "h264"), written);
    assert_frames_on_pictures(&feed.join().unwrap(), &fragments, frame, fps as usize);

    // Counted while watched, shown per source; the pattern says it shows stills, as chosen.
    let health = wait_until("the viewer counted", DEADLINE, || {
        let (_, body) = get(port, "/api/health")?;
        let h: serde_json::Value = serde_json::from_str(&body).ok()?;
        let cam = h["run"]["sources"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == "cam")?
            .clone();
        (cam["video"]["viewers"] == 1).then_some(cam)
    });
    assert_eq!(health["video"]["available"], true, "{health}");
    assert!(health["video"]["bytes_sent"].as_u64().unwrap() > 0);
    let samples = scrape(port).unwrap();
    assert!(
        value(
            &samples,
            "vidflow_video_bytes_sent_total",
            &[("source", "cam")]
        )
        .unwrap()
            > 0.0
    );
    let (status, body) = get(port, "/api/video/pattern").unwrap();
    assert_eq!(status, 409, "{body}");
    let why: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        why["error"],
        "source \"pattern\" shows stills (live_video = \"stills\")"
    );
    let (_, sources) = get(port, "/api/sources").unwrap();
    let sources: serde_json::Value = serde_json::from_str(&sources).unwrap();
    let pattern = sources
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "pattern");
    assert_eq!(pattern.unwrap()["video"]["available"], false, "{sources}");
    assert_eq!(
        pattern.unwrap()["video"]["why"],
        "stills were chosen (live_video = \"stills\")"
    );
    assert_eq!(pattern.unwrap()["video"]["encoder"]["running"], 0);
    let (status, body) = get(port, "/api/video/nope").unwrap();
    assert_eq!(
        (status, body.as_str()),
        (404, "{\"error\":\"no source \\\"nope\\\"\"}")
    );
    // The MJPEG preview still plays beside it.
    let (status, _, mut preview) = open(port, "/preview/cam").unwrap();
    assert_eq!(status, 200);
    assert!(!http_client::read_part(&mut preview).is_empty());
    drop((mp4, preview));
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn a_looping_files_frames_share_their_pictures_times_across_its_loops() {
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.mp4");
    common::make_h264_mp4(&clip, 30, 320, 240);
    let (run, port) = start(
        dir.path(),
        &format!("[sources.cam]\nuri = \"{}\"\nloop = true\n", clip.display()),
    );
    http_client::wait_for_frames(port, "cam", 30, DEADLINE);
    let feed = std::thread::spawn(move || live_times(port, "cam", 120));
    let mut mp4 = watch(port, "cam");
    // Four loops of the file.
    let fragments: Vec<Fragment> = (0..120).map(|_| mp4.fragment()).collect();
    assert!(fragments[0].keyframe);
    assert!(
        fragments.windows(2).all(|w| w[1].decode > w[0].decode),
        "time goes back across a loop"
    );
    assert_frames_on_pictures(&feed.join().unwrap(), &fragments, TIMESCALE / 30, 10);
    drop(mp4);
    run.terminate_cleanly(DEADLINE);
}

/// Reads `n` fragments of `source`'s H.265 (an `hvc1` codec of the main profile, an `hvcC`),
/// from a keyframe, and has GStreamer decode them: every picture decodes, at the time written;
/// and the first `frames` frames of the live feed are on those pictures.
fn assert_h265_plays(port: u16, source: &'static str, n: usize, frames: usize, frame: u64) {
    let feed = std::thread::spawn(move || live_times(port, source, frames));
    let (codec, mut mp4) = watch_codec(port, source);
    assert!(codec.starts_with("hvc1.1.6.L"), "{codec}: not H.265 main");
    let fragments: Vec<Fragment> = (0..n).map(|_| mp4.fragment()).collect();
    assert!(
        fragments[0].keyframe,
        "the stream does not start at a keyframe"
    );
    let mut written: Vec<u64> = fragments.iter().map(Fragment::presentation).collect();
    written.sort_unstable();
    assert_eq!(decode(&mp4.bytes, "h265"), written);
    assert_frames_on_pictures(&feed.join().unwrap(), &fragments, frame, frames / 4);
}

#[test]
fn an_h265_camera_plays_as_hvc1_mp4_and_each_frame_shares_its_pictures_time() {
    common::require_x265enc();
    let server = RtspServer::start(RtspServerOptions {
        h265: true,
        ..RtspServerOptions::default()
    })
    .unwrap();
    let fps = server.options().fps;
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(
        dir.path(),
        &format!("[sources.cam]\nuri = \"{}\"\n", server.url()),
    );
    http_client::wait_for_frames(port, "cam", 2 * fps, DEADLINE);
    let frame = TIMESCALE / u64::from(fps);
    assert_h265_plays(port, "cam", 4 * fps as usize, 3 * fps as usize, frame);
    let (_, sources) = get(port, "/api/sources").unwrap();
    let sources: serde_json::Value = serde_json::from_str(&sources).unwrap();
    let cam = sources
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "cam");
    assert_eq!(cam.unwrap()["video"]["available"], true, "{sources}");
    run.terminate_cleanly(DEADLINE);
}

/// A file's H.265 reaches the decoder as MP4 holds it (`hvc1`, its `codec_data`), with
/// B-frames, looping: it plays across its loops.
#[test]
fn an_h265_file_plays_as_hvc1_mp4_across_its_loops() {
    common::require_x265enc();
    let dir = tempfile::tempdir().unwrap();
    let clip = dir.path().join("clip.mp4");
    common::run_to_eos(&format!(
        "videotestsrc pattern=ball num-buffers=30 ! \
         video/x-raw,format=I420,width=320,height=240,framerate=30/1 ! \
         x265enc speed-preset=ultrafast key-int-max=15 option-string=open-gop=0:bframes=2 ! \
         h265parse ! mp4mux ! filesink location={}",
        clip.display()
    ));
    let (run, port) = start(
        dir.path(),
        &format!("[sources.cam]\nuri = \"{}\"\nloop = true\n", clip.display()),
    );
    http_client::wait_for_frames(port, "cam", 30, DEADLINE);
    assert_h265_plays(port, "cam", 90, 60, TIMESCALE / 30);
    run.terminate_cleanly(DEADLINE);
}

/// Shrinks the socket's receive buffer: a peer that stops reading fills it at once.
fn small_receive_buffer(stream: &TcpStream) {
    let size: libc::c_int = 4096;
    // SAFETY: setsockopt reads the int we pass by pointer, with its size.
    let set = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0);
}

#[test]
fn a_viewer_that_stops_reading_is_skipped_to_a_keyframe_while_another_gets_every_picture() {
    // Noise: some hundred kB/s, so that the bytes the kernel holds for a viewer fill soon.
    let options = RtspServerOptions {
        pattern: "snow",
        ..RtspServerOptions::default()
    };
    let server = RtspServer::start(options).unwrap();
    let frame = TIMESCALE / u64::from(server.options().fps);
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(
        dir.path(),
        &format!("[sources.cam]\nuri = \"{}\"\n", server.url()),
    );
    http_client::wait_for_frames(port, "cam", 15, DEADLINE);
    let mut slow = watch(port, "cam");
    small_receive_buffer(slow.reader.get_ref());
    let fast = std::thread::spawn(move || {
        let mut fast = watch(port, "cam");
        // Reads until the slow one was skipped, and a second more.
        let mut fragments = Vec::new();
        let mut skipped_at = None;
        loop {
            fragments.push(fast.fragment());
            if skipped_at.is_none() && fragments.len() % 5 == 0 {
                let s = scrape(port).unwrap();
                if value(&s, "vidflow_video_skips_total", &[("source", "cam")]).unwrap() > 0.0 {
                    skipped_at = Some(fragments.len());
                }
            }
            if skipped_at.is_some_and(|at| fragments.len() >= at + 15) {
                return fragments;
            }
            assert!(fragments.len() < 3000, "the slow viewer was never skipped");
        }
    });
    let fragments = fast.join().unwrap();
    for w in fragments.windows(2) {
        let step = w[1].decode - w[0].decode;
        assert!(
            step < frame * 3 / 2,
            "the fast viewer missed a picture: {step} ticks"
        );
    }
    // The slow viewer, reading again, finds a jump to a keyframe in a well-formed stream.
    let mut seen: Vec<Fragment> = Vec::new();
    let jump = loop {
        let f = slow.fragment();
        if let Some(before) = seen.last()
            && f.decode - before.decode > TIMESCALE
        {
            break f;
        }
        seen.push(f);
        assert!(seen.len() < 3000, "no skip in the slow viewer's stream");
    };
    assert!(
        jump.keyframe,
        "the slow viewer resumed on a picture that is no keyframe"
    );
    let decoded = decode(&slow.bytes, "h264");
    assert_eq!(decoded.len(), seen.len() + 1);
    drop(slow);
    run.terminate_cleanly(DEADLINE);
}

#[test]
fn a_stop_wins_over_viewers_that_never_read_and_a_request_never_finished() {
    // Noise, for bytes enough to fill what the kernel holds for each viewer.
    let options = RtspServerOptions {
        pattern: "snow",
        ..RtspServerOptions::default()
    };
    let server = RtspServer::start(options).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A stop deadline shorter than any viewer is kept unread: a video thread that waited for
    // one would be abandoned at it, and the run would fail.
    let (run, port) = start(
        dir.path(),
        &format!(
            "[daemon]\nstop_timeout_s = 5\n[sources.cam]\nuri = \"{}\"\n",
            server.url()
        ),
    );
    http_client::wait_for_frames(port, "cam", 15, DEADLINE);
    // Viewers that take their init segment and read nothing more, over HTTP and WebSocket,
    // and a request whose head never ends.
    let stuck: Vec<_> = (0..3)
        .map(|_| {
            let v = watch(port, "cam");
            small_receive_buffer(v.reader.get_ref());
            v
        })
        .collect();
    let sockets: Vec<_> = (0..2)
        .map(|_| {
            let (status, head, reader) =
                handshake(port, "cam", &format!("http://127.0.0.1:{port}"));
            assert_eq!(status, 101, "{head:?}");
            small_receive_buffer(reader.get_ref());
            reader
        })
        .collect();
    let mut unfinished = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        unfinished,
        "GET /api/video/cam HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    )
    .unwrap();
    // The stop comes once the viewers are behind: each was skipped at least once.
    wait_until("the stuck viewers skipped", DEADLINE, || {
        let s = scrape(port)?;
        (value(&s, "vidflow_video_skips_total", &[("source", "cam")])? >= 5.0).then_some(())
    });
    let s = scrape(port).unwrap();
    assert_eq!(
        value(&s, "vidflow_video_viewers", &[("source", "cam")]),
        Some(5.0)
    );
    // What waits for them is counted, and bounded: at most 12 MiB each.
    let queued = value(&s, "vidflow_video_queued_bytes", &[("source", "cam")]).unwrap();
    assert!(
        queued > 0.0 && queued <= 5.0 * 12.0 * 1024.0 * 1024.0,
        "{queued} bytes queued for 5 stuck viewers"
    );
    run.terminate_cleanly(DEADLINE);
    drop((stuck, sockets, unfinished));
}

/// Reads one WebSocket message from the server: its opcode and payload.
fn message(reader: &mut impl Read) -> (u8, Vec<u8>) {
    let mut head = [0u8; 2];
    reader.read_exact(&mut head).unwrap();
    assert_eq!(head[1] & 0x80, 0, "a server's frame is never masked");
    let len = match head[1] & 0x7f {
        126 => {
            let mut b = [0u8; 2];
            reader.read_exact(&mut b).unwrap();
            u64::from(u16::from_be_bytes(b))
        }
        127 => {
            let mut b = [0u8; 8];
            reader.read_exact(&mut b).unwrap();
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    let mut body = vec![0; len as usize];
    reader.read_exact(&mut body).unwrap();
    (head[0] & 0x0f, body)
}

/// A WebSocket handshake for `/api/video/SOURCE` from a page of `origin`: the status, and the
/// connection's reader after the head.
fn handshake(port: u16, source: &str, origin: &str) -> (u16, Vec<String>, BufReader<TcpStream>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET /api/video/{source} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\nOrigin: {origin}\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim_end().is_empty() {
            break;
        }
        lines.push(line.trim_end().to_owned());
    }
    let status = lines[0].split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, lines, reader)
}

#[test]
fn a_websocket_gets_the_codec_then_the_init_segment_and_a_fragment_per_message() {
    let server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(
        dir.path(),
        &format!("[sources.cam]\nuri = \"{}\"\n", server.url()),
    );
    http_client::wait_for_frames(port, "cam", 15, DEADLINE);
    let (status, _, _) = handshake(port, "cam", "http://evil.example");
    assert_eq!(status, 403, "another site's page opened the video");
    let (status, head, mut reader) = handshake(port, "cam", &format!("http://127.0.0.1:{port}"));
    assert_eq!(status, 101, "{head:?}");
    // RFC 6455's example key and its answer.
    assert!(head.contains(&"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=".to_owned()));
    let (opcode, hello) = message(&mut reader);
    assert_eq!(opcode, 1, "the first message is text");
    let hello: serde_json::Value = serde_json::from_slice(&hello).unwrap();
    let codec = hello["codec"].as_str().unwrap();
    assert_eq!(hello["mime"], format!("video/mp4; codecs=\"{codec}\""));
    assert_eq!(hello["timescale"], TIMESCALE);
    let (opcode, init) = message(&mut reader);
    assert_eq!(opcode, 2);
    let mut bytes = init.clone();
    assert_eq!(&Mp4::new(&init[..]).next_box().0, b"ftyp");
    let mut fragments = Vec::new();
    for _ in 0..20 {
        let (opcode, fragment) = message(&mut reader);
        assert_eq!(opcode, 2);
        let mut mp4 = Mp4::new(&fragment[..]);
        fragments.push(mp4.fragment());
        assert_eq!(
            mp4.bytes.len(),
            fragment.len(),
            "one whole fragment per message"
        );
        bytes.extend(fragment);
    }
    assert!(fragments[0].keyframe);
    assert_eq!(decode(&bytes, "h264").len(), 20);
    drop(reader);
    run.terminate_cleanly(DEADLINE);
}

/// Plays `/api/video/cam` in the page's tab as the page would (a WebSocket, Media Source
/// Extensions, `requestVideoFrameCallback`): `window.vt` gathers each presented picture's
/// `mediaTime`, or an error.
const PLAYER: &str = r#"(() => {
  window.vt = { times: [], error: null };
  const v = document.createElement('video');
  v.muted = true;
  document.body.appendChild(v);
  const ms = new MediaSource();
  v.src = URL.createObjectURL(ms);
  v.onerror = () => { vt.error = 'video: ' + (v.error && v.error.message); };
  const presented = (now, meta) => { vt.times.push(meta.mediaTime); v.requestVideoFrameCallback(presented); };
  v.requestVideoFrameCallback(presented);
  ms.addEventListener('sourceopen', () => {
    const ws = new WebSocket(new URL('api/video/cam', location.href).href.replace(/^http/, 'ws'));
    ws.binaryType = 'arraybuffer';
    let sb = null;
    const queue = [];
    const pump = () => { if (sb && !sb.updating && queue.length) sb.appendBuffer(queue.shift()); };
    ws.onerror = () => { vt.error = 'websocket error'; };
    ws.onmessage = (m) => {
      if (typeof m.data === 'string') {
        const hello = JSON.parse(m.data);
        if (!MediaSource.isTypeSupported(hello.mime)) { vt.error = 'not supported: ' + hello.mime; return; }
        sb = ms.addSourceBuffer(hello.mime);
        sb.addEventListener('updateend', () => {
          if (v.paused && sb.buffered.length) {
            v.currentTime = sb.buffered.end(0) - 0.1;
            v.play().catch((e) => { vt.error = String(e); });
          }
          pump();
        });
        return;
      }
      queue.push(m.data);
      pump();
    };
  }, { once: true });
})()"#;

#[test]
fn chromium_plays_a_camera_and_reports_each_pictures_media_time_as_the_live_feed_gives_it() {
    let server = RtspServer::start(RtspServerOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (run, port) = start(
        dir.path(),
        &format!("[sources.cam]\nuri = \"{}\"\n", server.url()),
    );
    http_client::wait_for_frames(port, "cam", 15, DEADLINE);
    let browser = common::browser::browser(640, 480);
    let tab = browser.new_tab().unwrap();
    tab.navigate_to(&format!("http://127.0.0.1:{port}/"))
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    tab.evaluate(PLAYER, false).unwrap();
    common::browser::wait_js(
        &tab,
        "pictures presented",
        "vt.error || vt.times.length >= 20",
    );
    assert_eq!(
        common::browser::js(&tab, "vt.error"),
        serde_json::Value::Null
    );
    // The live frames of the next seconds, read once the page plays (however long a busy
    // machine took to start the browser), and the pictures the page presents up to the last
    // of them: the same stretch of the camera's video, seen both ways.
    let live: BTreeSet<u64> = live_times(port, "cam", 60).into_iter().collect();
    let last = *live.last().unwrap() as f64 / TIMESCALE as f64;
    common::browser::wait_js(
        &tab,
        "the page to present the live frames' pictures",
        &format!("vt.error || vt.times.some(t => t >= {last})"),
    );
    let presented: Vec<f64> =
        serde_json::from_value(common::browser::js(&tab, "vt.times")).unwrap();
    let on_live = presented
        .iter()
        .filter(|t| live.contains(&((*t * TIMESCALE as f64).round() as u64)))
        .count();
    assert!(
        on_live >= 5,
        "{on_live} presented pictures have a live frame of their time: {presented:?} against {live:?}"
    );
    run.terminate_cleanly(DEADLINE);
}
