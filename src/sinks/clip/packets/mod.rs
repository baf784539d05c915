//! `clip` in `mode = "packets"`: clips cut from the camera's own encoded stream (the source's
//! record stream, `crate::packets`), never decoded nor encoded.
//!
//! Per source, a ring of the stream's packets reaches back from the decoded stream's latest
//! frame at least `pre_roll_s`, to the keyframe before. A trigger (a frame whose `when` value is
//! non-empty) at time t opens a clip at the latest keyframe shown at or before t - pre_roll (or
//! the ring's first keyframe when it does not reach back that far), once the record stream has
//! reached t - pre_roll; packets go to the clip up to t + post_roll (a new trigger extends it).
//! The clip is finished once the decoded stream is past t + post_roll with no new trigger and
//! the record stream has given a packet after it, or at `max_clip_s` (the next keyframe then
//! opens the next clip of the same event), a new connection, new caps or a break.
//!
//! Time: a trigger is a decoded frame; a packet is of the record stream, another connection
//! and maybe another stream of the camera. Both are placed on one clock (`timing.rs`): a
//! file's timestamps, a camera's own clock from its RTCP sender reports, or else arrival
//! time. docs/guides/recording.md says what each costs.
//!
//! Counts: the sink's `crate::packets::RecordStats` (the `vidflow_record_*` metrics of this
//! sink) count what finished clips hold: packets, bytes and clips are added when a clip's file
//! is finished, never before; a clip that failed adds a gap.
//!
//! Threads: one per source (`vidflow-clip-SOURCE`, on the loop it shares with `record`:
//! `sinks/common/packet_thread.rs`), blocked on that source's subscription, on the moments the
//! sink's thread sends it (each frame's time, and whether it triggered) and on its stop
//! channel. [`Sink::write`] only sends a moment; it waits only when that thread is [`MOMENTS`]
//! behind (finishing a clip, at most `FINISH_TIMEOUT`).
//!
//! Memory: per source, the ring holds from the latest keyframe before the decoded stream's
//! time minus the pre-roll to the newest packet, whether a clip is being written or not. The
//! record stream may run ahead of the decoded stream (a file's is read ahead of its decoding;
//! a camera's sub-stream may stall while its main stream goes on), so the ring is bounded
//! (`bounds.rs`): in bytes, sized from the pre-roll and the stream's measured bitrate within a
//! floor and a ceiling, and in duration, the pre-roll plus a minute from its oldest packet to
//! its newest. Beyond either, a clip being written (its post-roll is in it by then: what waits
//! is after it) is finished, and the oldest keyframe intervals are dropped, each packet counted
//! under the bound it went past (`RecordStats::ring_dropped_bytes` and `_duration`,
//! `vidflow_record_ring_dropped_packets_total{bound}`, the run's report); the first time past
//! each bound is logged, naming it and its value, and so are a pre-roll longer than the
//! ceiling holds at the stream's bitrate and the first clip that starts late for a bound.
//!
//! Links: a clip is made for (`storage::Writing::made_for`, what links it to its events) the
//! triggers that opened or extended it whose video the ring still held: a trigger's post-roll
//! reaches the ring's first packet. Triggers whose video is gone (dropped past a bound) are
//! not, and a trigger given up (its clip finished by a bound, or no keyframe left for it) is
//! never carried to the next clip.
//!
//! Stop protocol: [`Sink::close`] drops the stop channels and the moments' senders; each thread
//! takes what is still queued (the sources have stopped: their last packets are in), writes
//! what the last trigger still asks for, finishes its clip and returns; close joins them.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use gstreamer as gst;

use super::Settings;
use super::file::{ClipFile, append_index};
use super::timing::{Moment, Timing, packet_time};
use crate::outcome::FrameResult;
use crate::packets::{Packet, Timeline};
use crate::sinks::common::packet_thread::{Common, PacketThread, PacketWork};
use crate::sinks::common::when::When;
use crate::sinks::{Sink, SinkError};
use crate::storage::SinkFiles;
use bounds::{Bound, Bounds};

mod bounds;

/// Moments queued for a source's thread: seconds of frames, far more than finishing a clip
/// takes.
const MOMENTS: usize = 1024;

/// An open `clip` sink in packets mode.
pub(super) struct PacketClips {
    when: When,
    sources: HashMap<Arc<str>, PacketThread<Moment>>,
}

impl PacketClips {
    pub(super) fn open(
        sink: &str,
        sources: &[Arc<str>],
        files: SinkFiles,
        settings: Settings,
        when: When,
    ) -> Result<Self, SinkError> {
        let mut opened = Self {
            when,
            sources: HashMap::new(),
        };
        for source in sources {
            match spawn(sink, source, files.clone(), settings.clone()) {
                Ok(t) => {
                    opened.sources.insert(source.clone(), t);
                }
                Err(e) => {
                    let _ = Box::new(opened).close();
                    return Err(e);
                }
            }
        }
        Ok(opened)
    }
}

impl Sink for PacketClips {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        let frame = result.frame();
        let Some(source) = self.sources.get(&frame.source) else {
            return Ok(false);
        };
        let triggered = self.when.triggered(result);
        let moment = Moment::of(frame, triggered);
        // Fails only when the thread ended; close reports why.
        let _ = source.send(moment);
        // The clips come from the packets, on the sources' threads.
        Ok(false)
    }

    fn close(self: Box<Self>) -> Result<(), SinkError> {
        let mut first = Ok(());
        for (_, t) in self.sources {
            if let Err(e) = t.close()
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}

/// Starts the thread of `source` for the sink `sink`.
fn spawn(
    sink: &str,
    source: &Arc<str>,
    files: SinkFiles,
    settings: Settings,
) -> Result<PacketThread<Moment>, SinkError> {
    PacketThread::spawn(sink, source, Work::new(settings, files), Some(MOMENTS))
}

/// A packet waiting in the ring.
struct Held {
    packet: Packet,
}

impl Held {
    /// Its place in decoding order by `timing` (see [`packet_time`]).
    fn at(&self, timing: Timing) -> Duration {
        packet_time(&self.packet, timing, true)
    }

    /// When it is shown by `timing` (see [`packet_time`]).
    fn shown(&self, timing: Timing) -> Duration {
        packet_time(&self.packet, timing, false)
    }
}

/// A clip being written.
struct Clip {
    file: ClipFile,
    /// How its trigger was placed on the record stream, from its opening on.
    timing: Timing,
    /// Ring time of its first packet (a keyframe).
    start: Duration,
    timeline: Timeline,
    /// The end of the latest frame pushed (its time plus its duration), from the clip's start.
    end: gst::ClockTime,
    packets: u64,
    bytes: u64,
    arrival: SystemTime,
}

/// What a source's thread owns.
struct Work {
    settings: Settings,
    files: SinkFiles,
    ring: VecDeque<Held>,
    ring_bytes: usize,
    /// Whether the record stream is live (its packets say).
    live: bool,
    /// The decoded stream's latest frame.
    progress: Option<Moment>,
    /// The last trigger, while it still calls for video.
    trigger: Option<Moment>,
    /// The triggers not yet in a clip, but for those whose video the ring no longer holds:
    /// the next clip written is made for them (see the module header).
    made_for: Vec<Moment>,
    clip: Option<Clip>,
    bounds: Bounds,
}

impl PacketWork for Work {
    type Moment = Moment;
    const KIND: &'static str = "clip";
    const THREAD: &'static str = "clip";
    const FAILED: &'static str = "clip: a clip failed";

    fn moment(&mut self, on: &mut Common, m: Moment) {
        if m.triggered {
            self.trigger = Some(m.clone());
            self.made_for.push(m.clone());
        }
        self.progress = Some(m);
        self.advance(on, false);
    }

    fn cut(&mut self, on: &mut Common, fresh: bool) -> bool {
        let open = self.clip.is_some();
        self.finish_clip(on);
        // A clip never spans two connections or two formats: what is held of the one before
        // cannot start one any more. After a break, what is held stays: a file's record
        // stream may end long before the decoded stream reaches its last packets' time.
        if fresh {
            self.clear_ring();
        }
        open
    }

    fn packet(&mut self, on: &mut Common, packet: Packet) {
        on.took();
        self.live = packet.live;
        self.bounds.took(&packet);
        self.show_bounds(on);
        self.ring_bytes += packet.buffer.size();
        self.ring.push_back(Held { packet });
        self.advance(on, false);
    }

    fn end(&mut self, on: &mut Common) {
        // Every frame the decoded stream will give is in.
        self.progress = None;
        self.advance(on, true);
        self.finish_clip(on);
    }
}

impl Work {
    /// Nothing held yet, within the bounds of its pre-roll (`bounds.rs`).
    fn new(settings: Settings, files: SinkFiles) -> Self {
        Self {
            bounds: Bounds::new(settings.pre_roll),
            settings,
            files,
            ring: VecDeque::new(),
            ring_bytes: 0,
            live: true,
            progress: None,
            trigger: None,
            made_for: Vec::new(),
            clip: None,
        }
    }

    /// Shows the ring's bounds (`vidflow_record_ring_limit_*`), and says once when the
    /// pre-roll needs more than the ceiling at the stream's bitrate.
    fn show_bounds(&mut self, on: &Common) {
        let b = &self.bounds;
        let ms = u64::try_from(b.duration().as_millis()).unwrap_or(u64::MAX);
        let bytes = u64::try_from(b.bytes()).unwrap_or(u64::MAX);
        on.stats.ring_limit_ms.store(ms, Ordering::Relaxed);
        on.stats.ring_limit_bytes.store(bytes, Ordering::Relaxed);
        if let Some(said) = self.bounds.past_ceiling() {
            tracing::warn!(source = %on.source, "{said}");
        }
    }

    /// Gives up the trigger: the triggers not in a clip are made for none.
    fn forget_trigger(&mut self) {
        self.trigger = None;
        self.made_for.clear();
    }

    /// Says the open clip is made for the triggers not yet in a clip (those whose video is
    /// gone were dropped with it: [`Work::prune`]).
    fn link(&mut self) {
        if let Some(clip) = &self.clip {
            for m in self.made_for.drain(..) {
                clip.file.made_for(m.seq);
            }
        }
    }

    /// Writes, opens and finishes clips as far as the packets and the decoded stream allow,
    /// then prunes the ring. `ended`: no frame nor packet comes any more.
    fn advance(&mut self, on: &mut Common, ended: bool) {
        let (pre_roll, post_roll) = (self.settings.pre_roll, self.settings.post_roll);
        let timing = self.timing();
        while let Some(trigger) = self.trigger.as_ref().and_then(|t| t.time(timing)) {
            let end = trigger + post_roll;
            if self.clip.is_none() {
                let from = trigger.saturating_sub(pre_roll);
                let reached = self.ring.back().is_some_and(|h| h.at(timing) >= from);
                if !(reached || ended) || !self.open(on, from, end, timing) {
                    let beyond = self.ring.back().is_some_and(|h| h.at(timing) > end);
                    if ended || self.past(end, timing) && beyond {
                        // No keyframe to start from before the post-roll ran out.
                        self.forget_trigger();
                    }
                    break;
                }
            }
            self.link();
            if !self.write_up_to(on, end) {
                // Cut at max_clip_s: the next clip opens at this keyframe.
                self.finish_clip(on);
                continue;
            }
            let written = ended || self.ring.front().is_some_and(|h| h.at(timing) > end);
            if written && (ended || self.past(end, timing)) {
                self.finish_clip(on);
                self.forget_trigger();
            }
            break;
        }
        if self.clip.is_some() && self.past_bound(timing).is_some() {
            // What waits in the ring comes after the clip's post-roll (written as the packets
            // came): the clip is finished rather than the stream held without bound. A later
            // trigger opens a new one, made for none of the triggers before.
            self.finish_clip(on);
            self.forget_trigger();
        }
        if self.clip.is_none() {
            self.prune(on);
        }
    }

    /// The timing that places a trigger now: the open clip's, a file's timestamps, or for a
    /// live stream the camera's clock once the decoded stream's latest trigger (or frame) and
    /// the record stream's ring are both on it, else arrival time (see `timing.rs`).
    fn timing(&self) -> Timing {
        match &self.clip {
            Some(clip) => clip.timing,
            None => Timing::choose(
                self.live,
                self.trigger.as_ref().or(self.progress.as_ref()),
                self.ring.back().map(|h| &h.packet),
            ),
        }
    }

    /// Whether the decoded stream is past `end`, the trigger's post-roll. A frame of a new
    /// connection not on the camera's clock yet is compared by when it and the trigger left
    /// their decoder.
    fn past(&self, end: Duration, timing: Timing) -> bool {
        let Some(progress) = &self.progress else {
            return false;
        };
        match progress.time(timing) {
            Some(t) => t > end,
            None => self.trigger.as_ref().is_some_and(|trigger| {
                progress.captured > trigger.captured + self.settings.post_roll
            }),
        }
    }

    /// Opens a clip at the latest keyframe shown at or before `from`, or the ring's first
    /// keyframe if it does not reach back that far (dropping what is before it), if it is not
    /// after `end`. False: no clip (no keyframe, a full disk, a failure).
    fn open(&mut self, on: &mut Common, from: Duration, end: Duration, timing: Timing) -> bool {
        let at_pre_roll = self
            .ring
            .iter()
            .rposition(|h| h.packet.keyframe() && h.shown(timing) <= from);
        let start = at_pre_roll.or_else(|| self.ring.iter().position(|h| h.packet.keyframe()));
        let Some(start) = start.filter(|&i| self.ring[i].at(timing) <= end) else {
            return false;
        };
        let late = self.ring[start].shown(timing).saturating_sub(from);
        if at_pre_roll.is_none()
            && let Some(said) = self.bounds.opened_late(late)
        {
            tracing::warn!(source = %on.source, "{said}");
        }
        self.drop_front(start);
        let Some(first) = self.ring.front() else {
            return false;
        };
        let packet = &first.packet;
        let parser = packet.parser().map_err(|other| {
            SinkError::Other(format!(
                "clip: source \"{}\" sends {other}, which cannot be copied into a clip (H.264 \
                 or H.265 only)",
                on.source
            ))
        });
        let opened = match parser {
            Ok(parser) => ClipFile::open(
                &self.settings,
                &self.files,
                &on.source,
                packet.arrival,
                &packet.caps,
                parser,
            ),
            Err(e) => Err(e),
        };
        let file = match opened {
            Ok(Some(file)) => file,
            // A full disk: the clip waits in the ring.
            Ok(None) => return false,
            Err(e) => {
                on.failed(e);
                return false;
            }
        };
        self.clip = Some(Clip {
            file,
            timing,
            start: first.at(timing),
            timeline: Timeline::starting_at(packet),
            end: gst::ClockTime::ZERO,
            packets: 0,
            bytes: 0,
            arrival: packet.arrival,
        });
        true
    }

    /// Writes the ring's packets up to `end` into the clip. False: it stopped at a keyframe
    /// `max_clip_s` after the clip's start.
    fn write_up_to(&mut self, on: &mut Common, end: Duration) -> bool {
        while let Some(held) = self.ring.front() {
            let Some(clip) = &mut self.clip else {
                return true;
            };
            let at = held.at(clip.timing);
            if at > end {
                return true;
            }
            let too_long = at.saturating_sub(clip.start) >= self.settings.max_clip;
            if too_long && held.packet.keyframe() && clip.packets > 0 {
                return false;
            }
            let Some(held) = self.ring.pop_front() else {
                return true;
            };
            self.ring_bytes = self.ring_bytes.saturating_sub(held.packet.buffer.size());
            match push(clip, &held.packet) {
                Ok(()) => on.wrote(),
                Err(e) => self.clip_failed(on, e),
            }
        }
        true
    }

    /// Drops from the ring what no clip can start from any more: what is before the latest
    /// keyframe shown at or before the earliest a trigger can still ask for (the decoded
    /// stream's time, or a pending trigger's, minus the pre-roll), and the oldest keyframe
    /// intervals beyond its bounds (counted).
    fn prune(&mut self, on: &Common) {
        let timing = self.timing();
        let earliest = [&self.progress, &self.trigger]
            .into_iter()
            .flatten()
            .filter_map(|m| m.time(timing))
            .map(|t| t.saturating_sub(self.settings.pre_roll))
            .min();
        // Before the decoded stream's first frame, any packet may still be asked for.
        if let Some(horizon) = earliest {
            let keep = self
                .ring
                .iter()
                .rposition(|h| h.packet.keyframe() && h.shown(timing) <= horizon)
                .unwrap_or(0);
            self.drop_front(keep);
        }
        while let Some(bound) = self.past_bound(timing) {
            if let Some(said) = self.bounds.dropping(bound) {
                tracing::warn!(source = %on.source, "{said}");
            }
            let next = self
                .ring
                .iter()
                .skip(1)
                .position(|h| h.packet.keyframe())
                .map_or(self.ring.len(), |i| i + 1);
            let dropped = u64::try_from(next).unwrap_or(u64::MAX);
            let counter = match bound {
                Bound::Bytes => &on.stats.ring_dropped_bytes,
                Bound::Duration => &on.stats.ring_dropped_duration,
            };
            counter.fetch_add(dropped, Ordering::Relaxed);
            self.drop_front(next);
        }
        // Nothing before a keyframe can start a clip.
        let first_key = self
            .ring
            .iter()
            .position(|h| h.packet.keyframe())
            .unwrap_or(self.ring.len());
        self.drop_front(first_key);
        // Nor can a clip hold the video of a trigger whose post-roll ends before it: no clip
        // is made for that trigger (one that cannot be placed yet is kept).
        if let Some(first) = self.ring.front().map(|h| h.at(timing)) {
            let post_roll = self.settings.post_roll;
            self.made_for
                .retain(|m| m.time(timing).is_none_or(|t| t + post_roll >= first));
        }
    }

    /// Which bound the ring holds more than (by `timing`), if any.
    fn past_bound(&self, timing: Timing) -> Option<Bound> {
        let span = match (self.ring.front(), self.ring.back()) {
            (Some(first), Some(last)) => last.at(timing).saturating_sub(first.at(timing)),
            _ => Duration::ZERO,
        };
        self.bounds.past(self.ring_bytes, span)
    }

    fn drop_front(&mut self, n: usize) {
        for held in self.ring.drain(..n) {
            self.ring_bytes = self.ring_bytes.saturating_sub(held.packet.buffer.size());
        }
    }

    fn clear_ring(&mut self) {
        self.ring.clear();
        self.ring_bytes = 0;
        self.bounds.cleared();
    }

    /// Finishes the clip being written, if any: indexed and counted once its file is whole.
    fn finish_clip(&mut self, on: &mut Common) {
        let Some(clip) = self.clip.take() else {
            return;
        };
        let path = match clip.file.finish() {
            Ok(path) => path,
            Err(e) => return self.clip_failed(on, e),
        };
        let line = serde_json::json!({
            "source": &*on.source,
            "path": path.file_name().map(|n| n.to_string_lossy().into_owned()),
            "mode": "packets",
            "timing": clip.timing.name(),
            "frames": clip.packets,
            "time": humantime::format_rfc3339_millis(clip.arrival).to_string(),
            "duration_s": clip.end.seconds_f64(),
        });
        if let Err(e) = append_index(&self.settings, &line) {
            on.failed(e);
        }
        let s = &on.stats;
        s.packets.fetch_add(clip.packets, Ordering::Relaxed);
        s.bytes.fetch_add(clip.bytes, Ordering::Relaxed);
        s.segments.fetch_add(1, Ordering::Relaxed);
        tracing::info!(source = %on.source, path = %path.display(), frames = clip.packets, "clip written");
    }

    /// A clip whose write failed: what it holds is not counted; the next trigger opens another.
    fn clip_failed(&mut self, on: &mut Common, e: SinkError) {
        if let Some(clip) = self.clip.take() {
            let _ = clip.file.finish();
        }
        on.gap();
        on.failed(e);
    }
}

/// Pushes one packet into `clip`, on the clip's timeline (from its first packet's decoding
/// time).
fn push(clip: &mut Clip, packet: &Packet) -> Result<(), SinkError> {
    let buffer = clip.timeline.place(packet);
    let pts = buffer.pts().unwrap_or_default();
    clip.end = clip.end.max(pts + buffer.duration().unwrap_or_default());
    let size = u64::try_from(buffer.size()).unwrap_or(u64::MAX);
    clip.file.push(buffer)?;
    clip.packets += 1;
    clip.bytes += size;
    Ok(())
}

#[cfg(test)]
mod tests;
