//! The appsink callbacks of a record stream (`record.rs`): what its GStreamer streaming thread
//! runs for each sample. They join the pieces of an access unit and publish each whole unit to
//! the source's topic (`crate::packets`: a file waits for room, a live stream never waits).
//! Apart from `record.rs`, which runs the stream, so that a connection (`stream.rs`) sets them
//! without importing what runs it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use gstreamer as gst;
use gstreamer_app as gst_app;

use super::Shared;
use crate::frame::CameraClock;
use crate::packets::Packet;

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
