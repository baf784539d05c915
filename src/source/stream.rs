//! One connection of a source: build the pipeline, watch its bus, tear it down.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;

use super::cut::{Opened, Server};
use super::ended::{Ended, Waiting, classify, too_big};
use super::pipeline::TOO_BIG;
use super::{ABORT, CONTROL_MESSAGE, RUN, STOP, STOP_GRACE, Shared, SourceError, SourceUri};
use crate::frame::{CameraClock, Format, Frame, Pins, PoolSize};

/// How long to look for the error that explains a pipeline refusing to start.
const START_ERROR_WAIT: gst::ClockTime = gst::ClockTime::from_seconds(1);

/// Checks what can be checked before GStreamer runs, for errors that say what is wrong.
pub(super) fn preflight(shared: &Shared) -> Result<(), SourceError> {
    preflight_uri(&shared.name, &shared.uri)
}

/// [`preflight`] before there is a [`Shared`].
pub(super) fn preflight_uri(name: &str, uri: &SourceUri) -> Result<(), SourceError> {
    let unavailable = |reason: String| SourceError::Unavailable {
        name: name.to_owned(),
        uri: uri.to_string(),
        reason,
    };
    match uri {
        SourceUri::File { path } => match std::fs::metadata(path) {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err(unavailable("not a regular file".to_owned())),
            Err(e) => Err(unavailable(format!("cannot open: {e}"))),
        },
        SourceUri::V4l2 { device, .. } => super::device::check_camera(device).map_err(unavailable),
        SourceUri::Rtsp { .. } | SourceUri::Test(_) => Ok(()),
    }
}

/// A running pipeline of a source.
pub(super) struct Connection {
    pub(super) pipeline: gst::Pipeline,
    pub(super) appsink: gst_app::AppSink,
    bus: gst::Bus,
    pub(super) eos_thread: Option<JoinHandle<()>>,
    /// An RTSP connection's server and the sockets from before it, to cut it if its server
    /// holds the teardown (`cut.rs`).
    pub(super) opened: Option<Arc<Opened>>,
}

impl Connection {
    /// Builds and starts the pipeline.
    pub(super) fn open(
        shared: &Arc<Shared>,
        frames: &Sender<Frame>,
        oldest: Option<&Receiver<Frame>>,
    ) -> Result<Self, Ended> {
        preflight(shared).map_err(Ended::Failed)?;
        shared.counters.attempts.fetch_add(1, Ordering::Relaxed);
        let (pipeline, appsink) =
            super::pipeline::build(&shared.uri, &shared.options, shared.packets.is_some())
                .map_err(|message| {
                    Ended::Fatal(SourceError::Gstreamer {
                        name: shared.name.to_string(),
                        message,
                    })
                })?;
        let pts_base = shared.pts_end.load(Ordering::Acquire);
        shared.pts_offset.store(pts_base, Ordering::Release);
        // A clock of this connection's own: a reconnection never keeps the last one's offset.
        let clock = matches!(shared.uri, SourceUri::Rtsp { .. }).then(|| {
            // A record stream's packets keep their PTS as the connection gave them.
            let base = if shared.packets.is_some() {
                0
            } else {
                pts_base
            };
            Arc::new(CameraClock::new(Duration::from_nanos(base)))
        });
        if let Some(clock) = &clock {
            let to = super::rtcp::Follower {
                clock: clock.clone(),
                name: shared.name.clone(),
                counters: shared.counters.clone(),
            };
            super::rtcp::follow(&pipeline, to);
        }
        if shared.packets.is_none() {
            super::video::watch(&pipeline, shared, clock.clone());
        }
        let opened = match &shared.uri {
            SourceUri::Rtsp { address } => Server::of(address).map(|s| Arc::new(Opened::new(s))),
            _ => None,
        };
        // Its sockets are recorded at the first buffer (the connection is up then: `cut.rs`).
        let up = opened.clone();
        let settle = move || {
            if let Some(opened) = &up {
                opened.settle();
            }
        };
        appsink.set_callbacks(match shared.packets {
            Some(_) => super::publish::callbacks(shared.clone(), clock, settle),
            None => callbacks(
                shared.clone(),
                frames.clone(),
                oldest.cloned(),
                clock,
                settle,
            ),
        });
        let bus = pipeline.bus().ok_or_else(|| {
            Ended::Fatal(SourceError::Gstreamer {
                name: shared.name.to_string(),
                message: "pipeline has no bus".to_owned(),
            })
        })?;
        *shared
            .bus
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(bus.clone());
        let connection = Self {
            pipeline,
            appsink,
            bus,
            eos_thread: None,
            opened,
        };
        if connection.pipeline.set_state(gst::State::Playing).is_err() {
            let ended = connection
                .bus
                .timed_pop_filtered(START_ERROR_WAIT, &[gst::MessageType::Error])
                .map_or_else(
                    || Ended::Failed(shared.unavailable("pipeline refused to start")),
                    |msg| classify(shared, &msg, &connection.pipeline),
                );
            let _ = connection.close(shared);
            return Err(ended);
        }
        // A request that came before the bus was known is delivered now.
        if shared.request() != RUN {
            shared.raise(shared.request());
        }
        Ok(connection)
    }

    /// Blocks on the bus until the stream ends, fails, stalls, or a request stops it.
    ///
    /// A stop request wins in every state of the connection: before its first frame there is
    /// nothing to drain and it stops hard at once (an end of stream sent to an `rtspsrc` whose
    /// streams do not exist yet is lost); once frames flow it sends EOS and waits for it at most
    /// [`STOP_GRACE`] after the request, however many frames still come out, then stops hard.
    /// Frames already counted as decoded are in the queue either way.
    pub(super) fn watch(&mut self, shared: &Shared) -> Ended {
        use gst::MessageType as T;
        let live = shared.uri.is_live();
        let stall = shared.options.stall_timeout;
        let connected = Instant::now();
        // When the stop request was taken up (EOS sent).
        let mut stopping: Option<Instant> = None;
        let mut waiting = Waiting::Frames;
        loop {
            let now = Instant::now();
            let deadline = match stopping {
                Some(since) => Some(since + STOP_GRACE),
                None if live => {
                    let last = shared
                        .last_frame_at()
                        .map_or(connected, |t| t.max(connected));
                    Some(last + stall)
                }
                None => None,
            };
            let timeout = deadline.map(|d| {
                gst::ClockTime::try_from(d.saturating_duration_since(now))
                    .unwrap_or(gst::ClockTime::ZERO)
            });
            let Some(msg) = self
                .bus
                .timed_pop_filtered(timeout, &[T::Eos, T::Error, T::Application, T::Progress])
            else {
                if stopping.is_some() {
                    tracing::warn!(
                        source = %shared.name,
                        grace_ms = STOP_GRACE.as_millis() as u64,
                        "no end of stream within the grace after the stop request; stopping hard"
                    );
                    return Ended::Stopped;
                }
                let last = shared
                    .last_frame_at()
                    .map_or(connected, |t| t.max(connected));
                if last.elapsed() >= stall {
                    let streamed = shared.last_frame_at().is_some_and(|t| t >= connected);
                    return Ended::Stalled(if streamed { Waiting::Frames } else { waiting });
                }
                continue;
            };
            match msg.view() {
                gst::MessageView::Progress(progress) => waiting.follow(progress),
                gst::MessageView::Eos(_) if stopping.is_some() => return Ended::Stopped,
                gst::MessageView::Eos(_) => return Ended::Eos,
                gst::MessageView::Error(_) if shared.request() != RUN => return Ended::Stopped,
                gst::MessageView::Error(_) => return classify(shared, &msg, &self.pipeline),
                gst::MessageView::Application(app)
                    if app.structure().is_some_and(|s| s.name() == TOO_BIG) =>
                {
                    return Ended::Fatal(too_big(shared, app.structure()));
                }
                gst::MessageView::Application(app)
                    if app.structure().is_some_and(|s| s.name() == CONTROL_MESSAGE) =>
                {
                    match shared.request() {
                        ABORT => return Ended::Stopped,
                        STOP if stopping.is_none() => {
                            let streaming = shared.last_frame_at().is_some_and(|t| t >= connected);
                            if !streaming {
                                tracing::info!(source = %shared.name, "stopping before the stream started: nothing to drain");
                                return Ended::Stopped;
                            }
                            tracing::info!(source = %shared.name, "stopping: sending end of stream");
                            stopping = Some(Instant::now());
                            self.eos_thread = send_eos(&self.pipeline);
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }
}

/// Sends EOS from a helper thread: sending it can block until the streaming thread gets to it,
/// and the supervisor must stay free to enforce [`STOP_GRACE`].
fn send_eos(pipeline: &gst::Pipeline) -> Option<JoinHandle<()>> {
    let weak = pipeline.downgrade();
    let sent = std::thread::Builder::new()
        .name("vidflow-eos".to_owned())
        .spawn(move || {
            if let Some(pipeline) = weak.upgrade() {
                pipeline.send_event(gst::event::Eos::new());
            }
        });
    match sent {
        Ok(thread) => Some(thread),
        Err(e) => {
            tracing::warn!(error = %e, "cannot spawn EOS thread; stopping hard");
            let _ = pipeline.set_state(gst::State::Null);
            None
        }
    }
}

fn callbacks(
    shared: Arc<Shared>,
    frames: Sender<Frame>,
    oldest: Option<Receiver<Frame>>,
    clock: Option<Arc<CameraClock>>,
    settle: impl Fn() + Send + 'static,
) -> gst_app::AppSinkCallbacks {
    // The stream's caps, their video info, and the count of the buffers this pipeline's frames
    // hold, made again when the caps change (a renegotiation makes a new pool).
    let mut info: Option<(gst::Caps, gst_video::VideoInfo, Pins)> = None;
    let video = crate::packets::hub().video(&shared.name);
    gst_app::AppSinkCallbacks::builder()
        .new_sample(move |sink| {
            // Always pull: a sample left in the appsink would make it wait forever at EOS.
            let sample = sink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
            settle();
            let seq = shared.seq.load(Ordering::Relaxed);
            if shared.max_frames.is_some_and(|max| seq >= max) {
                return Err(gst::FlowError::Eos);
            }
            let caps = sample.caps_owned().ok_or(gst::FlowError::NotNegotiated)?;
            let buffer = sample.buffer_owned().ok_or(gst::FlowError::Error)?;
            if info.as_ref().is_none_or(|(c, ..)| *c != caps) {
                let parsed = gst_video::VideoInfo::from_caps(&caps)
                    .map_err(|_| gst::FlowError::NotNegotiated)?;
                if info.is_none() {
                    count_frames_ahead(&shared, sink, &parsed);
                    super::video::first_frame(&shared);
                }
                count_format(&shared, Format::of(&parsed));
                let pins = Pins::new(PoolSize::of(&buffer));
                tracing::debug!(source = %shared.name, pool = %pins.pool(), limit = ?pins.limit(), "decoder buffers held at most");
                info = Some((caps, parsed, pins));
            }
            let Some((caps, video_info, pins)) = info.as_ref() else {
                return Err(gst::FlowError::NotNegotiated);
            };
            super::video::offer(&video, &shared, &buffer, caps, clock.as_ref());
            let wrapped = Frame::from_decoder(shared.name.clone(), seq, buffer, video_info, pins);
            let mut frame = match wrapped {
                Ok(frame) => frame,
                Err(e) => {
                    tracing::error!(source = %shared.name, error = %e, "cannot wrap decoded buffer");
                    return Err(gst::FlowError::Error);
                }
            };
            if !frame.is_zero_copy() {
                count_copy(&shared, pins);
            }
            frame.clock.clone_from(&clock);
            frame.ground.clone_from(&shared.options.ground);
            if let Some(pts) = frame.pts {
                let pts = pts + Duration::from_nanos(shared.pts_offset.load(Ordering::Acquire));
                frame.pts = Some(pts);
                // One frame at the nominal rate (1 ms without one: only order matters then).
                let length = frame
                    .fps
                    .filter(|&(n, d)| n > 0 && d > 0)
                    .map_or(Duration::from_millis(1), |(n, d)| {
                        Duration::from_secs_f64(f64::from(d) / f64::from(n))
                    });
                let end = u64::try_from((pts + length).as_nanos()).unwrap_or(u64::MAX);
                shared.pts_end.fetch_max(end, Ordering::AcqRel);
            }
            if shared.reconnecting.swap(false, Ordering::AcqRel) {
                let gap = shared.last_frame_at().map(|t| t.elapsed());
                frame.reconnected = Some(gap.unwrap_or(Duration::ZERO));
                shared.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    source = %shared.name,
                    gap_ms = gap.map_or(0, |g| g.as_millis()),
                    "source is back; frame numbers continue"
                );
            }
            shared.seq.store(seq + 1, Ordering::Relaxed);
            shared.last_frame.store(shared.now_ns(), Ordering::Relaxed);
            shared.counters.decoded.fetch_add(1, Ordering::Relaxed);
            shared.counters.frame_arrived();
            if !deliver(&shared, &frames, oldest.as_ref(), frame) {
                return Err(gst::FlowError::Eos);
            }
            if shared.max_frames.is_some_and(|max| seq + 1 >= max) {
                shared.raise(STOP);
            }
            Ok(gst::FlowSuccess::Ok)
        })
        .build()
}

/// Takes the format of the frames from now on (the first ones, or new caps): a change from the
/// frames delivered before, on this connection or an earlier one, is counted and logged.
fn count_format(shared: &Shared, format: Format) {
    let before = shared
        .format
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .replace(format);
    if let Some(before) = before.filter(|b| *b != format) {
        shared.counters.size_changes.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            source = %shared.name,
            from = %before,
            to = %format,
            "source \"{}\" changed from {before} to {format}",
            shared.name
        );
    }
}

/// Counts a frame copied out of the decoder's buffer; the source's first copy is logged.
fn count_copy(shared: &Shared, pins: &Pins) {
    shared.counters.copied.fetch_add(1, Ordering::Relaxed);
    if !shared.copying.swap(true, Ordering::Relaxed) {
        tracing::info!(
            source = %shared.name,
            pool = %pins.pool(),
            held = pins.held(),
            "the decoder's buffers are all held but the ones it needs; frames are copied out of them until some come back"
        );
    }
}

/// On the first frame of a file that does not loop: how many frames it will give, from its
/// duration (asked upstream, where the demuxer knows it) and the frame rate reaching vidflow
/// (after `max_fps`), at most `max_frames`. Unknown (left at 0) without either.
fn count_frames_ahead(shared: &Shared, sink: &gst_app::AppSink, info: &gst_video::VideoInfo) {
    let SourceUri::File { path } = &shared.uri else {
        return;
    };
    if shared.options.looping || duration_is_a_guess(path) {
        return;
    }
    let fps = info.fps();
    let (Ok(numer @ 1..), Ok(denom @ 1..)) =
        (u128::try_from(fps.numer()), u128::try_from(fps.denom()))
    else {
        return;
    };
    let Some(duration) = sink.query_duration::<gst::ClockTime>() else {
        return;
    };
    // Rounded to the nearest frame: duration * numer / denom frames per second.
    let second = u128::from(gst::ClockTime::SECOND.nseconds());
    let frames = (u128::from(duration.nseconds()) * numer + denom * second / 2) / (denom * second);
    let frames = u64::try_from(frames)
        .unwrap_or(u64::MAX)
        .min(shared.max_frames.unwrap_or(u64::MAX));
    shared.counters.total.store(frames, Ordering::Relaxed);
}

/// Whether the file is an MPEG transport or program stream (by its name): these have no
/// duration of their own, and the demuxer's is an estimate from the first and last timestamps,
/// gaps included (a 1 s gap in a 201-frame .ts made 6 frames "missing" that never existed).
fn duration_is_a_guess(path: &std::path::Path) -> bool {
    let extension = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    matches!(
        extension.as_deref(),
        Some("ts" | "m2ts" | "mts" | "tsv" | "trp" | "mpg" | "mpeg" | "ps" | "vob")
    )
}

/// Queues a frame: a file waits for room; a live source makes room by dropping its oldest
/// queued frame. Returns false when the consumer is gone.
fn deliver(
    shared: &Shared,
    frames: &Sender<Frame>,
    oldest: Option<&Receiver<Frame>>,
    frame: Frame,
) -> bool {
    let dropped = |n: u64| shared.counters.dropped.fetch_add(n, Ordering::Relaxed);
    let Some(queue) = oldest else {
        return frames.send(frame).is_ok() || {
            dropped(1);
            false
        };
    };
    match push_dropping_oldest(frames, queue, frame) {
        Ok(n) => {
            dropped(n);
            true
        }
        Err(n) => {
            dropped(n + 1);
            false
        }
    }
}

/// Puts `item` into the bounded channel of `tx` (whose receiving end is `rx`), taking the
/// oldest queued items out while it is full, so the newest always gets in. Returns how many
/// were taken out; `Err` (with that count) when the receiver is gone and `item` was not queued.
fn push_dropping_oldest<T>(tx: &Sender<T>, rx: &Receiver<T>, item: T) -> Result<u64, u64> {
    let mut item = item;
    let mut dropped = 0;
    loop {
        match tx.try_send(item) {
            Ok(()) => return Ok(dropped),
            Err(TrySendError::Full(back)) => {
                if rx.try_recv().is_ok() {
                    dropped += 1;
                }
                item = back;
            }
            Err(TrySendError::Disconnected(_)) => return Err(dropped),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gstreamer as gst;
    use gstreamer::prelude::*;

    use super::push_dropping_oldest;
    use crate::source::{SourceConfig, SourceOptions, SourceUri};

    /// Encodes `frames` frames at `fps` as H.264 in MP4 (a file as a camera would record it).
    fn clip(path: &std::path::Path, frames: u32, fps: u32) {
        crate::gst_setup::init().unwrap();
        let pipeline = gst::parse::launch(&format!(
            "videotestsrc num-buffers={frames} ! video/x-raw,width=64,height=48,framerate={fps}/1 \
             ! x264enc speed-preset=ultrafast ! h264parse ! mp4mux ! filesink location={}",
            path.display()
        ))
        .unwrap();
        pipeline.set_state(gst::State::Playing).unwrap();
        let bus = pipeline.bus().unwrap();
        let msg = bus.timed_pop_filtered(
            gst::ClockTime::from_seconds(60),
            &[gst::MessageType::Eos, gst::MessageType::Error],
        );
        pipeline.set_state(gst::State::Null).unwrap();
        assert!(matches!(msg.unwrap().view(), gst::MessageView::Eos(_)));
    }

    /// The total a file source knows once its first frame is out.
    fn total_after_the_first_frame(
        path: &std::path::Path,
        looping: bool,
        max: Option<u64>,
    ) -> Option<u64> {
        let config = SourceConfig {
            name: "clip".into(),
            uri: SourceUri::parse(&path.to_string_lossy()).unwrap(),
            options: SourceOptions {
                looping,
                ..SourceOptions::default()
            },
            uri_span: 0..0,
            record: None,
        };
        let (tx, rx) = crossbeam_channel::bounded(100);
        let handle = crate::source::start(&config, tx, &rx, max).unwrap();
        rx.recv_timeout(Duration::from_secs(30)).unwrap();
        let total = handle.counters().total();
        handle.control().abort();
        drop(rx);
        handle.join().unwrap();
        total
    }

    #[test]
    fn a_file_knows_how_many_frames_it_will_give_once_its_stream_is_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clip.mp4");
        clip(&path, 45, 15);
        assert_eq!(total_after_the_first_frame(&path, false, None), Some(45));
        assert_eq!(
            total_after_the_first_frame(&path, false, Some(10)),
            Some(10)
        );
        // A looping file never ends: no total.
        assert_eq!(total_after_the_first_frame(&path, true, None), None);
    }

    #[test]
    fn a_full_live_queue_drops_its_oldest_item_and_keeps_the_newest() {
        let (tx, rx) = crossbeam_channel::bounded(2);
        assert_eq!(push_dropping_oldest(&tx, &rx, 1), Ok(0));
        assert_eq!(push_dropping_oldest(&tx, &rx, 2), Ok(0));
        assert_eq!(push_dropping_oldest(&tx, &rx, 3), Ok(1));
        assert_eq!(push_dropping_oldest(&tx, &rx, 4), Ok(1));
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), [3, 4]);
    }

    #[test]
    fn a_queue_whose_consumer_is_gone_takes_nothing() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let keep = rx.clone();
        drop(rx);
        drop(keep);
        assert_eq!(
            push_dropping_oldest(&tx, &crossbeam_channel::never(), 1),
            Err(0)
        );
    }
}
