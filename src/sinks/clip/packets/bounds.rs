//! The bounds of a packets clip's ring (`mod.rs`): how many bytes and how much time it may
//! hold, sized from the clip's `pre_roll_s` and the stream's measured bitrate, and the words
//! that say which bound was hit.
//!
//! Duration: the pre-roll plus [`RING_AHEAD`] from the ring's oldest packet to its newest.
//! Within it the ring holds the pre-roll (from a keyframe) and what the record stream gives
//! ahead of the decoded stream; past it the record stream is that far ahead.
//!
//! Bytes: the stream's measured bitrate x (pre-roll + [`RING_AHEAD`]) x [`HEADROOM`], within
//! [`FLOOR`] and [`CEILING`]. The rate is that of the busiest [`RATE_WINDOW`] of the stream's
//! own time among the latest ones that reach back as far as the ring (a still scene's
//! bitrate after a busy one does not shrink the ring under what it holds of the busy one);
//! before the first window is whole, the bound is the ceiling. Figures:
//! - [`HEADROOM`] 1.5: a camera's VBR stream swings around its average (a busy scene, a
//!   keyframe); CBR streams stay within a few percent of theirs.
//! - [`FLOOR`] 64 MiB, the ring's former fixed bound: no clip holds less than it did.
//! - [`CEILING`] 256 MiB: what one source's ring may take whatever its pre-roll and bitrate.
//!   Ten cameras each at the ceiling take 2.5 GiB, which an NVR host of 8 GiB holds beside its
//!   decoders and models; the bound is the same after a year as after a minute (the ring is
//!   cut to it as packets come, and the rate keeps a few windows). It holds the longest
//!   pre-roll allowed (600 s, `mod.rs` of `clip`) up to 2.1 Mbit/s (256 MiB / 1.5 / 660 s),
//!   a minute's up to 11 Mbit/s, the default 5 s up to 22 Mbit/s. Past it a clip reaches back
//!   what the ceiling holds at the stream's bitrate, and the log says so once, naming
//!   `pre_roll_s`, the bitrate and the ceiling. Validation refuses nothing for it: no
//!   `pre_roll_s` allowed is too long at every bitrate a camera may send (600 s fits up to
//!   2.1 Mbit/s), and the bitrate is known only once the stream comes.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

use crate::packets::Packet;

/// How much more than the pre-roll a source's ring reaches back from its newest packet: the
/// most the record stream may run ahead of the decoded stream, far more than a camera's two
/// streams drift apart, before its oldest packets are dropped.
pub(super) const RING_AHEAD: Duration = Duration::from_secs(60);
/// What the measured bitrate is raised by to size the ring (see the module header).
const HEADROOM: (u64, u64) = (3, 2);
/// Fewest bytes a ring's bound allows (see the module header).
pub(super) const FLOOR: usize = 64 << 20;
/// Most bytes a ring's bound allows (see the module header).
pub(super) const CEILING: usize = 256 << 20;
/// The stream's time over which one bitrate is measured: several keyframe intervals of a
/// camera, so a keyframe does not make a window busier than its stream.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Which of its bounds the ring went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bound {
    Bytes,
    Duration,
}

impl Bound {
    /// Its name, the `bound` label of `vidflow_record_ring_dropped_packets_total`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Duration => "duration",
        }
    }
}

/// What a source's ring holds at most, the bitrate it is sized by, and what the log said of
/// them.
#[derive(Debug)]
pub(super) struct Bounds {
    pre_roll: Duration,
    ahead: Duration,
    floor: usize,
    ceiling: usize,
    /// The byte bound now.
    bytes: usize,
    rate: Rate,
    /// The bound that last dropped the ring's oldest packets, since its connection began.
    cut_by: Option<Bound>,
    pub(super) said: Said,
}

/// What the log said once already.
#[derive(Debug, Default)]
pub(super) struct Said {
    /// The ring went past its byte bound, its duration bound (by [`Bound`]).
    pub(super) past: [bool; 2],
    /// The pre-roll needs more than the ceiling at the stream's bitrate.
    pub(super) ceiling: bool,
    /// A clip started late for a bound.
    pub(super) late: bool,
}

impl Bounds {
    /// The bounds of a ring that reaches back `pre_roll`, before any packet: the ceiling.
    pub(super) fn new(pre_roll: Duration) -> Self {
        Self {
            pre_roll,
            ahead: RING_AHEAD,
            floor: FLOOR,
            ceiling: CEILING,
            bytes: CEILING,
            rate: Rate::new(Self::windows_for(pre_roll)),
            cut_by: None,
            said: Said::default(),
        }
    }

    /// The same with the byte bound within `floor` and `ceiling`, for a test.
    #[cfg(test)]
    pub(super) fn limit(&mut self, floor: usize, ceiling: usize) {
        (self.floor, self.ceiling, self.bytes) = (floor, ceiling, ceiling);
    }

    /// The byte bound now.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The duration bound: most time from the ring's oldest packet to its newest.
    pub(super) fn duration(&self) -> Duration {
        self.pre_roll + self.ahead
    }

    /// Which bound a ring of `bytes` reaching back `span` is past, if any (bytes first).
    pub(super) fn past(&self, bytes: usize, span: Duration) -> Option<Bound> {
        if bytes > self.bytes {
            Some(Bound::Bytes)
        } else if span > self.duration() {
            Some(Bound::Duration)
        } else {
            None
        }
    }

    /// Measures `packet`, which came into the ring; the byte bound is sized again when a
    /// window of the rate ends.
    pub(super) fn took(&mut self, packet: &Packet) {
        if self.rate.took(packet) {
            self.bytes = self.sized().clamp(self.floor, self.ceiling.max(self.floor));
        }
    }

    /// Bytes the ring needs at the measured rate, bounds aside (the ceiling before a rate).
    pub(super) fn sized(&self) -> usize {
        let Some(rate) = self.rate.peak() else {
            return self.ceiling;
        };
        let reach_ms = u64::try_from(self.duration().as_millis()).unwrap_or(u64::MAX);
        let bytes = rate.saturating_mul(reach_ms) / 1000 * HEADROOM.0 / HEADROOM.1;
        usize::try_from(bytes).unwrap_or(usize::MAX)
    }

    /// The ring's oldest packets are dropped past `bound`: what the log says the first time.
    pub(super) fn dropping(&mut self, bound: Bound) -> Option<String> {
        self.cut_by = Some(bound);
        let said = std::mem::replace(&mut self.said.past[bound as usize], true);
        (!said).then(|| self.dropped_warning(bound))
    }

    /// The ring was emptied (a new connection): no bound cut it since.
    pub(super) fn cleared(&mut self) {
        self.cut_by = None;
    }

    /// A clip opens `late` after its pre-roll: what the log says the first time a bound
    /// dropped what it needed (else the ring's connection began after its pre-roll).
    pub(super) fn opened_late(&mut self, late: Duration) -> Option<String> {
        let bound = self.cut_by?;
        let said = std::mem::replace(&mut self.said.late, true);
        (!said).then(|| self.late_warning(bound, late))
    }

    /// What the log says the first time the pre-roll at the measured bitrate needs more than
    /// the ceiling.
    pub(super) fn past_ceiling(&mut self) -> Option<String> {
        if !self.pre_roll_too_long() || std::mem::replace(&mut self.said.ceiling, true) {
            return None;
        }
        Some(self.ceiling_warning())
    }

    /// Whether the pre-roll at the measured bitrate needs more than the ceiling.
    pub(super) fn pre_roll_too_long(&self) -> bool {
        self.rate.peak().is_some() && self.sized() > self.ceiling
    }

    /// How many of the latest windows reach back as far as a ring of `pre_roll`.
    fn windows_for(pre_roll: Duration) -> usize {
        let reach = (pre_roll + RING_AHEAD).as_millis();
        usize::try_from(reach.div_ceil(RATE_WINDOW.as_millis())).unwrap_or(usize::MAX) + 1
    }

    /// What the log says when the pre-roll at the measured bitrate needs more than the ceiling.
    fn ceiling_warning(&self) -> String {
        let rate = self.rate.peak().unwrap_or(1).max(1);
        let reach = self.ceiling as u64 / rate;
        format!(
            "clip: pre_roll_s = {} at the stream's measured {} needs a ring of {} (x {} \
             headroom, with {} s for the record stream to run ahead), more than its ceiling \
             of {}: a clip reaches back at most about {reach} s before its trigger; lower \
             pre_roll_s or the camera's bitrate, or record continuously (record)",
            secs(self.pre_roll),
            mbit(rate),
            mib(self.sized()),
            ratio(HEADROOM),
            self.ahead.as_secs(),
            mib(self.ceiling),
        )
    }

    /// What the log says the first time the ring went past `bound`.
    fn dropped_warning(&self, bound: Bound) -> String {
        let mut s = match bound {
            Bound::Bytes => format!(
                "clip: the ring went past its byte bound, {} ({})",
                mib(self.bytes),
                self.why_bytes()
            ),
            Bound::Duration => format!(
                "clip: the ring went past its duration bound, {} s (pre_roll_s {} + {} s): \
                 the record stream is that far ahead of the decoded stream, or the decoded \
                 stream gives no frame",
                secs(self.duration()),
                secs(self.pre_roll),
                self.ahead.as_secs()
            ),
        };
        let _ = write!(
            s,
            "; its oldest packets are dropped and counted \
             (vidflow_record_ring_dropped_packets_total{{bound=\"{}\"}}), and a clip may start \
             later than its pre-roll",
            bound.name()
        );
        s
    }

    /// Why the byte bound is what it is, and what passing it means.
    fn why_bytes(&self) -> String {
        let Some(rate) = self.rate.peak() else {
            return "its ceiling: the stream's bitrate is not measured yet".to_owned();
        };
        let sized = format!(
            "the stream's measured {} x (pre_roll_s {} + {} s) x {}",
            mbit(rate),
            secs(self.pre_roll),
            self.ahead.as_secs(),
            ratio(HEADROOM)
        );
        if self.bytes == self.ceiling && self.sized() > self.ceiling {
            format!("its ceiling; {sized} is {}", mib(self.sized()))
        } else if self.bytes == self.floor && self.sized() < self.floor {
            format!(
                "its floor, more than {sized}: the stream's bitrate rose far past its \
                 measure, or the record stream is far ahead of the decoded stream"
            )
        } else {
            format!(
                "{sized}: the stream's bitrate rose past that headroom, or the record stream \
                 is far ahead of the decoded stream"
            )
        }
    }

    /// What the log says the first time a clip started `late` after its pre-roll because
    /// `bound` had dropped what it needed.
    fn late_warning(&self, bound: Bound, late: Duration) -> String {
        let value = match bound {
            Bound::Bytes => mib(self.bytes),
            Bound::Duration => format!("{} s", secs(self.duration())),
        };
        format!(
            "clip: a clip starts {} s after its pre-roll (pre_roll_s {}): the ring had dropped \
             what came before at its {} bound, {value}",
            secs(late),
            secs(self.pre_roll),
            match bound {
                Bound::Bytes => "byte",
                Bound::Duration => "duration",
            },
        )
    }
}

/// The stream's bitrate, measured over windows of its own time (decoding timestamps of one
/// connection), the busiest of the latest `keep` windows.
#[derive(Debug)]
struct Rate {
    keep: usize,
    /// The window being measured: its connection, start and bytes so far.
    window: Option<(u64, Duration, u64)>,
    /// The latest windows' rates, in bytes per second, oldest first.
    rates: VecDeque<u64>,
}

impl Rate {
    fn new(keep: usize) -> Self {
        Self {
            keep,
            window: None,
            rates: VecDeque::new(),
        }
    }

    /// Counts `packet`. True when a window ended.
    fn took(&mut self, packet: &Packet) -> bool {
        let Some(at) = packet.timestamp(true) else {
            return false;
        };
        let size = u64::try_from(packet.buffer.size()).unwrap_or(u64::MAX);
        let mut ended = false;
        match &mut self.window {
            // The same connection, in order: counted, and a window that is long enough ends.
            Some((connection, start, bytes))
                if *connection == packet.connection && at >= *start =>
            {
                let span = at - *start;
                if span >= RATE_WINDOW {
                    let ns = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
                    let rate = u128::from(*bytes) * 1_000_000_000 / u128::from(ns);
                    self.rates
                        .push_back(u64::try_from(rate).unwrap_or(u64::MAX));
                    if self.rates.len() > self.keep {
                        self.rates.pop_front();
                    }
                    (*start, *bytes, ended) = (at, 0, true);
                }
                *bytes = bytes.saturating_add(size);
            }
            // A new connection, or time that went back: a new window.
            _ => self.window = Some((packet.connection, at, size)),
        }
        ended
    }

    /// The busiest window's rate, in bytes per second.
    fn peak(&self) -> Option<u64> {
        self.rates.iter().copied().max()
    }
}

fn secs(d: Duration) -> String {
    let s = format!("{:.1}", d.as_secs_f64());
    s.strip_suffix(".0").map(str::to_owned).unwrap_or(s)
}

fn mbit(bytes_per_s: u64) -> String {
    format!("{:.1} Mbit/s", bytes_per_s as f64 * 8.0 / 1e6)
}

fn mib(bytes: usize) -> String {
    format!("{:.0} MiB", bytes as f64 / f64::from(1 << 20))
}

fn ratio((a, b): (u64, u64)) -> String {
    format!("{}", a as f64 / b as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounds measured at `bytes_per_s` for a whole window.
    fn measured(pre_roll: Duration, bytes_per_s: u64) -> Bounds {
        gstreamer::init().unwrap();
        let mut b = Bounds::new(pre_roll);
        for tenth in 0..=u64::try_from(RATE_WINDOW.as_millis() / 100).unwrap() {
            let mut buffer = gstreamer::Buffer::with_size(bytes_per_s as usize / 10).unwrap();
            let t = gstreamer::ClockTime::from_mseconds(tenth * 100);
            buffer.get_mut().unwrap().set_dts(t);
            let packet = Packet {
                buffer,
                caps: gstreamer::Caps::new_empty_simple("video/x-h264"),
                connection: 1,
                arrival: std::time::SystemTime::now(),
                clock: None,
                live: false,
            };
            b.took(&packet);
        }
        assert!(b.rate.peak().is_some(), "a window ended");
        b
    }

    #[test]
    fn the_byte_bound_follows_the_pre_roll_and_the_measured_bitrate_within_floor_and_ceiling() {
        let unmeasured = Bounds::new(Duration::from_secs(5));
        assert_eq!(unmeasured.bytes(), CEILING);
        // 4 Mbit/s and the default 5 s: 0.5 MB/s x 65 s x 1.5 = 49 MB, under the floor.
        assert_eq!(measured(Duration::from_secs(5), 500_000).bytes(), FLOOR);
        // 2 Mbit/s and 120 s: 0.25 MB/s x 180 s x 1.5 = 67.5 MB.
        let b = measured(Duration::from_secs(120), 250_000);
        assert_eq!(b.bytes(), 67_500_000);
        assert!(!b.pre_roll_too_long());
        // 8 Mbit/s and 600 s: 990 MB, past the ceiling.
        let b = measured(Duration::from_secs(600), 1_000_000);
        assert_eq!(b.bytes(), CEILING);
        assert!(b.pre_roll_too_long());
        let said = b.ceiling_warning();
        for words in [
            "pre_roll_s = 600",
            "8.0 Mbit/s",
            "944 MiB",
            "ceiling of 256 MiB",
        ] {
            assert!(said.contains(words), "{said}");
        }
        // The longest pre-roll fits the ceiling up to the bitrate the documents give.
        assert!(!measured(Duration::from_secs(600), 2_100_000 / 8).pre_roll_too_long());
    }

    #[test]
    fn each_warning_names_the_bound_that_was_hit_with_its_value() {
        let b = measured(Duration::from_secs(120), 250_000);
        let bytes = b.dropped_warning(Bound::Bytes);
        for words in [
            "byte bound, 64 MiB",
            "2.0 Mbit/s",
            "pre_roll_s 120",
            "bound=\"bytes\"",
        ] {
            assert!(bytes.contains(words), "{bytes}");
        }
        let duration = b.dropped_warning(Bound::Duration);
        for words in [
            "duration bound, 180 s",
            "pre_roll_s 120 + 60 s",
            "bound=\"duration\"",
        ] {
            assert!(duration.contains(words), "{duration}");
        }
        assert!(!duration.contains("byte"), "{duration}");
        let late = b.late_warning(Bound::Bytes, Duration::from_millis(2500));
        assert!(
            late.contains("2.5 s after") && late.contains("byte bound, 64 MiB"),
            "{late}"
        );
    }
}
