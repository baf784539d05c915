//! What a running pipeline shows while it runs, for its observers: systemd notify, the HTTP
//! endpoint, the progress bar. The frame path only bumps atomics here; observers read them on
//! their own threads and take the `parts` lock, which the frame path never takes (it is written
//! when the run starts and at a reload).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::sinks::SinkSender;
use crate::source::{SourceCounters, SourceHandle, SourceUri};
use crate::workflow::{ExecutorMetrics, PoolMetrics};

/// Where the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Sinks, pool and sources are being started.
    Starting,
    /// Every source started (each may still be connecting or retrying).
    Running,
    /// Swapping steps and sinks after SIGHUP.
    Reloading,
    /// A stop was requested or every source ended: the workflow drains.
    Draining,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Starting,
            1 => Self::Running,
            2 => Self::Reloading,
            _ => Self::Draining,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Reloading => "reloading",
            Self::Draining => "draining",
        }
    }
}

/// One running source, as its observers see it.
#[derive(Debug, Clone)]
pub struct LiveSource {
    pub name: Arc<str>,
    /// A camera or stream (retries forever), not a file or a test pattern.
    pub live: bool,
    /// A video file (the progress bar shows those).
    pub file: bool,
    pub counters: Arc<SourceCounters>,
    /// Its record stream's (`record_uri`, else `uri`'s), when a sink records it.
    pub record: Option<Arc<SourceCounters>>,
    /// Its `stall_timeout_ms` (the HTTP health check's limit derives from it).
    pub stall_timeout: Duration,
}

/// One open sink, as its observers see it.
#[derive(Debug, Clone)]
pub struct LiveSink {
    pub name: Arc<str>,
    pub sender: SinkSender,
}

/// The parts of a run; replaced as a whole when a reload swaps steps or sinks.
#[derive(Debug, Clone, Default)]
pub struct Parts {
    pub sources: Vec<LiveSource>,
    pub sinks: Vec<LiveSink>,
    pub executor: Option<Arc<ExecutorMetrics>>,
    pub pool: Option<Arc<PoolMetrics>>,
    pub storage: Option<crate::storage::Storage>,
    /// `[events]`'s store, when the pipeline has one.
    pub events: Option<crate::events::EventStore>,
}

/// Shared between the run and its observers (`Arc<Live>`).
#[derive(Debug)]
pub struct Live {
    pub started: Instant,
    parts: RwLock<Arc<Parts>>,
    phase: AtomicU8,
    /// Frames delivered to the sinks (processed or failed), over the whole run. Bumped by the
    /// executor's thread for every result: a workflow that is stuck stops it.
    delivered: AtomicU64,
    failed: AtomicU64,
    /// Each frame's boxes and counts, for `/api/live` (`feed.rs`).
    pub feed: super::feed::Feed,
}

impl Default for Live {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            parts: RwLock::default(),
            phase: AtomicU8::new(0),
            delivered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            feed: super::feed::Feed::default(),
        }
    }
}

impl Live {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn parts(&self) -> Arc<Parts> {
        self.parts
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_parts(&self, parts: Parts) {
        *self.parts.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(parts);
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    pub(super) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// Frames delivered to the sinks so far, and how many of them failed.
    pub fn delivered(&self) -> (u64, u64) {
        (
            self.delivered.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    pub(super) fn count_delivered(&self, failed: bool) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl LiveSource {
    pub(super) fn of(handle: &SourceHandle, live: bool) -> Self {
        Self {
            name: handle.name().clone(),
            live,
            file: matches!(handle.uri(), SourceUri::File { .. }),
            counters: handle.counters().clone(),
            record: handle.record_counters().cloned(),
            stall_timeout: handle.options().stall_timeout,
        }
    }
}
