//! A source's record stream: the camera's own encoded stream (`record_uri`, else `uri`'s),
//! parsed into whole access units and published as [`Packet`]s for the sinks that write it as
//! sent (`crate::packets`). Nothing here decodes.
//!
//! Threads: the record stream has a supervisor of its own (`vidflow-record-NAME`), the same
//! supervisor as the decoded stream's (`supervisor.rs`: connect, watch the bus, stall timeout,
//! teardown, backoff), on a [`Shared`] of its own, so it is lost and regained independently: a
//! main stream that drops never stops detection on the sub-stream, and the reverse. Its
//! GStreamer streaming thread runs [`callbacks`], which publish each packet (a file waits for
//! room, a live stream never waits: `packets.rs`). Its counters are a [`super::SourceCounters`]
//! of their own (`decoded` counts packets).
//!
//! Stop protocol: the source's controls raise the record stream's request with the decoded
//! stream's. When the decoded stream's supervisor returns, [`RecordStream::finish`] lets a
//! file's record stream read to its end (it is not paced, so it is at most a moment behind),
//! and stops a live one (EOS, then hard after `STOP_GRACE`), then joins its supervisor before
//! the source reports its end: the last segment gets every packet the stream gave.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::SystemTime;

use gstreamer as gst;
use gstreamer_app as gst_app;

use super::{RUN, Resume, STOP, Shared, SourceConfig, SourceError, SourceState, SourceUri};
use crate::frame::CameraClock;
use crate::packets::Packet;

/// The record stream of a running source.
#[derive(Debug)]
pub(super) struct RecordStream {
    shared: Arc<Shared>,
    thread: JoinHandle<()>,
}

impl RecordStream {
    pub(super) fn start(config: &SourceConfig, uri: &SourceUri) -> Result<Self, SourceError> {
        let topic = crate::packets::hub().topic(&config.name);
        let shared = Arc::new(Shared::new(
            format!("{}/record", config.name).into(),
            uri.clone(),
            config.options.clone(),
            None,
            Resume::default(),
            Some(topic),
        ));
        super::stream::preflight(&shared)?;
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("vidflow-record-{}", config.name))
                .spawn(move || {
                    // Never used: a record stream's callbacks publish packets, not frames.
                    let (frames, _) = crossbeam_channel::bounded(0);
                    if let Err(e) = super::supervisor::supervise(&shared, &frames, None) {
                        tracing::error!(source = %shared.name, error = %e, "record stream ended; the decoded stream goes on");
                    }
                    shared.counters.set_state(SourceState::Ended);
                })
                .map_err(|e| SourceError::Gstreamer {
                    name: config.name.to_string(),
                    message: format!("cannot spawn record stream thread: {e}"),
                })?
        };
        tracing::info!(source = %config.name, uri = %uri, "record stream started");
        Ok(Self { shared, thread })
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Ends the record stream once the decoded stream (`main`) has ended (see the module
    /// header). `ended_well`: the decoded stream's supervisor returned no error.
    pub(super) fn finish(self, main: &Shared, ended_well: bool) {
        let file_read_to_its_end = matches!(self.shared.uri, SourceUri::File { .. })
            && ended_well
            && main.request() == RUN;
        if !file_read_to_its_end {
            self.shared.raise(STOP.max(main.request()));
        }
        let _ = self.thread.join();
    }
}

/// The appsink callbacks of a record stream: each sample is an access unit, or the rest of
/// the one before it, and each whole access unit is published.
///
/// A camera whose payloader sends the parameter sets in packets of their own (`rtph264pay
/// config-interval=-1`, common) reaches the appsink as two buffers for each keyframe: the
/// parameter sets with the timestamp, then the picture with none. Published apart, a muxer's
/// parser would drop the picture's timestamp (baseparse does not repeat one) and the muxer
/// refuse it ("Buffer has no PTS"), and a clip's ring would count two frames. So a sample
/// without timestamps is joined to the one before it, and a unit is published when the next
/// begins, or at the end of the stream. A connection that breaks loses the unit it held: it
/// is in the gap the break makes anyway.
pub(super) fn callbacks(
    shared: Arc<Shared>,
    clock: Option<Arc<CameraClock>>,
    settle: impl Fn() + Send + 'static,
) -> gst_app::AppSinkCallbacks {
    let wait = !shared.uri.is_live();
    let connection = crate::packets::new_connection();
    let held: Arc<Mutex<Option<Packet>>> = Arc::default();
    let at_eos = (shared.clone(), held.clone());
    gst_app::AppSinkCallbacks::builder()
        .new_sample(move |sink| {
            // Always pull: a sample left in the appsink would make it wait forever at EOS.
            let sample = sink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
            settle();
            let caps = sample.caps_owned().ok_or(gst::FlowError::NotNegotiated)?;
            let buffer = sample.buffer_owned().ok_or(gst::FlowError::Error)?;
            if shared.reconnecting.swap(false, Ordering::AcqRel) {
                let gap = shared.last_frame_at().map(|t| t.elapsed());
                shared.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    source = %shared.name,
                    gap_ms = gap.map_or(0, |g| g.as_millis()),
                    "record stream is back; recording goes on in a new segment"
                );
            }
            shared.last_frame.store(shared.now_ns(), Ordering::Relaxed);
            shared.counters.frame_arrived();
            if shared.packets.is_none() {
                return Ok(gst::FlowSuccess::Ok);
            }
            let packet = Packet {
                buffer,
                caps,
                connection,
                arrival: SystemTime::now(),
                clock: clock.clone(),
                live: !wait,
            };
            let done = {
                let mut held = held.lock().unwrap_or_else(PoisonError::into_inner);
                match held.as_mut() {
                    Some(unit)
                        if packet.buffer.pts().is_none() && packet.buffer.dts().is_none() =>
                    {
                        join(unit, &packet.buffer);
                        None
                    }
                    _ => held.replace(packet),
                }
            };
            if let Some(unit) = done {
                publish(&shared, &unit, wait);
            }
            Ok(gst::FlowSuccess::Ok)
        })
        .eos(move |_| {
            let (shared, held) = &at_eos;
            let unit = held.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(unit) = unit {
                publish(shared, &unit, wait);
            }
        })
        .build()
}

/// Appends `rest` (a sample without timestamps) to the access unit it continues; the unit is
/// a keyframe if either part is.
fn join(unit: &mut Packet, rest: &gst::Buffer) {
    let keyframe = !rest.flags().contains(gst::BufferFlags::DELTA_UNIT);
    let b = unit.buffer.make_mut();
    for memory in rest.iter_memories_owned() {
        b.append_memory(memory);
    }
    if keyframe {
        b.unset_flags(gst::BufferFlags::DELTA_UNIT);
    }
}

/// One whole access unit out: counted (`decoded` counts units) and sent to the topic.
fn publish(shared: &Shared, unit: &Packet, wait: bool) {
    shared.counters.decoded.fetch_add(1, Ordering::Relaxed);
    if let Some(topic) = &shared.packets {
        topic.publish(unit, wait);
    }
}
