//! How a source behaves beyond its URI: credentials, transport, queue, throttling, stall
//! detection and reconnection. Filled from `[sources.NAME]` by the config layer.

use std::time::Duration;

pub use crate::spec::Secret;

/// RTSP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    #[default]
    Tcp,
    Udp,
    /// UDP first, TCP if UDP does not get through.
    Auto,
}

/// What a source with no H.264 of its own (a test pattern, a raw camera, a file in another
/// codec) plays as live video (`/api/video/SOURCE`); a source with H.264 always sends its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LiveVideo {
    /// Its frames are encoded to H.264, once for all its viewers, while someone watches.
    #[default]
    Encode,
    /// None: its tile shows stills.
    Stills,
}

/// User and password given apart from the URI (`user`, `password`, `password_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: Secret,
}

/// Exponential backoff with jitter between reconnection attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    pub initial_delay: Duration,
    pub max_delay: Duration,
    /// Attempts after a loss before the source gives up; `None`: never gives up.
    pub max_attempts: Option<u32>,
    /// A stream that delivered for this long resets the delay to `initial_delay`.
    pub reset_after: Duration,
}

impl Default for Reconnect {
    fn default() -> Self {
        Self {
            initial_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_attempts: None,
            reset_after: Duration::from_secs(10),
        }
    }
}

/// Everything about a source but its URI.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceOptions {
    pub credentials: Option<Credentials>,
    pub transport: Transport,
    pub latency_ms: u32,
    /// Decoded frames waiting for the workflow. A live source that is full drops its oldest
    /// frame; a file waits.
    pub queue: usize,
    /// Frames per second let through (dropped before the BGR conversion); `None`: all.
    pub max_fps: Option<u32>,
    /// A live source that delivers nothing for this long is torn down and reconnected.
    pub stall_timeout: Duration,
    /// Files only: start again at the end.
    pub looping: bool,
    pub reconnect: Reconnect,
    /// Frames of more pixels than this are refused before they are decoded.
    pub max_frame_pixels: u64,
    /// The camera's ground calibration, handed to steps with every frame.
    pub ground: Option<std::sync::Arc<crate::frame::Ground>>,
    /// What it plays as live video when it has no H.264 of its own.
    pub live_video: LiveVideo,
}

/// The default `max_frame_pixels`: every 8K format (7680 x 4320 is 33.2 megapixels, DCI 8K
/// 8192 x 4320 is 35.4) with room; a 16000 x 16000 JPEG (256) is refused. A frame this size
/// is 60 MB decoded (I420), 120 MB more in BGR.
pub const MAX_FRAME_PIXELS: u64 = 40_000_000;

/// The largest `max_frame_pixels`: what JPEG's 16-bit sizes allow.
pub const FRAME_PIXELS_LIMIT: u64 = 65_535 * 65_535;

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            credentials: None,
            transport: Transport::default(),
            latency_ms: 200,
            queue: 2,
            max_fps: None,
            stall_timeout: Duration::from_secs(5),
            looping: false,
            reconnect: Reconnect::default(),
            max_frame_pixels: MAX_FRAME_PIXELS,
            ground: None,
            live_video: LiveVideo::default(),
        }
    }
}

/// Delay before each reconnection attempt: doubles from `initial_delay` up to `max_delay`,
/// each delay drawn within ±20% so that many cameras lost together do not retry in step.
/// [`Backoff::next_flat_delay`] retries at `initial_delay` without climbing.
#[derive(Debug)]
pub struct Backoff {
    config: Reconnect,
    /// Attempts since the last reset (what `max_attempts` limits).
    attempt: u32,
    /// Doublings so far: the exponent of the next `next_delay`.
    level: u32,
    seed: u64,
}

impl Backoff {
    pub fn new(config: Reconnect, seed: u64) -> Self {
        Self {
            config,
            attempt: 0,
            level: 0,
            seed: seed | 1,
        }
    }

    /// Attempts made since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Whether another attempt is allowed.
    pub fn may_retry(&self) -> bool {
        self.config
            .max_attempts
            .is_none_or(|max| self.attempt < max)
    }

    /// The delay before the next attempt (and counts it); the next one will be twice as long.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self.level.min(20);
        self.level = self.level.saturating_add(1);
        self.jittered(exp)
    }

    /// `initial_delay` (with jitter) before the next attempt, which is counted, without
    /// raising the delays that follow.
    pub fn next_flat_delay(&mut self) -> Duration {
        self.jittered(0)
    }

    fn jittered(&mut self, exp: u32) -> Duration {
        self.attempt = self.attempt.saturating_add(1);
        let base = self
            .config
            .initial_delay
            .saturating_mul(1 << exp)
            .min(self.config.max_delay);
        // xorshift64: cheap, good enough to spread retries.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let jitter = (self.seed % 401) as f64 / 1000.0 - 0.2; // -0.2 ..= +0.2
        base.mul_f64(1.0 + jitter).min(self.config.max_delay)
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
        self.level = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_exponentially_with_bounded_jitter_and_cap() {
        let config = Reconnect {
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            max_attempts: None,
            reset_after: Duration::from_secs(10),
        };
        let mut b = Backoff::new(config, 42);
        let delays: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let base = (100u64 << i).min(2000) as f64;
            let ms = d.as_secs_f64() * 1000.0;
            assert!(
                ms >= base * 0.8 - 1.0 && ms <= (base * 1.2).min(2000.0) + 1.0,
                "{i}: {ms}"
            );
        }
        assert!(delays[7] <= Duration::from_secs(2));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(120));
    }

    #[test]
    fn flat_delays_stay_at_the_initial_delay_and_count_as_attempts() {
        let config = Reconnect {
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            max_attempts: Some(5),
            reset_after: Duration::from_secs(10),
        };
        let mut b = Backoff::new(config, 7);
        for _ in 0..4 {
            let d = b.next_flat_delay();
            assert!(
                d >= Duration::from_millis(79) && d <= Duration::from_millis(121),
                "{d:?}"
            );
        }
        assert_eq!(b.attempts(), 4);
        // Climbing starts from the initial delay after flat ones.
        assert!(b.next_delay() <= Duration::from_millis(121));
        assert!(b.next_delay() >= Duration::from_millis(159));
        assert!(!b.may_retry());
    }

    #[test]
    fn attempts_are_limited_when_asked() {
        let config = Reconnect {
            max_attempts: Some(2),
            ..Reconnect::default()
        };
        let mut b = Backoff::new(config, 1);
        assert!(b.may_retry());
        b.next_delay();
        b.next_delay();
        assert!(!b.may_retry());
        assert!(Backoff::new(Reconnect::default(), 1).may_retry());
    }

    #[test]
    fn secrets_do_not_print() {
        let c = Credentials {
            user: "admin".into(),
            password: Secret::new("hunter2".into()),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
