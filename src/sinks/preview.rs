//! `preview`: the latest image of each source as a JPEG, for the HTTP endpoint's live preview.
//!
//! The sink publishes into a process-wide [`Hub`] (here, since a sink kind must not import the
//! daemon): one [`Channel`] per source. It encodes a JPEG only while somebody watches that
//! source (a [`Watch`] is held) and at most `max_fps` times a second; every other frame costs
//! an atomic load. The HTTP side holds a `Watch` per MJPEG client (`daemon/http/preview.rs`),
//! which waits on the channel for the next JPEG, and one per source while the live stream
//! carries stills (`daemon/http/stills.rs`), which takes the newest without waiting.
//!
//! Threads and locks: the sink runs on its own sink thread (`runner`). Each channel has one
//! mutex, taken by the sink only to swap in a new JPEG (after encoding, outside the lock) and
//! by the watchers to take it; a condvar wakes the watchers. The hub's maps are locked when a
//! sink opens or closes, and once per source by a sink (then the channel is kept) or a watcher.
//! The frame path (the executor) never touches the hub.
//!
//! Wake-ups: a watcher waits at most the time it asks ([`Watch::next`]), so it can check for a
//! lost client and a stalled source; [`Hub::wake_all`] (the run stopping, and every preview
//! sink's close: a reload may have removed it) wakes every watcher at once, which then checks
//! its own reasons to end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use opencv::core::{Mat, Vector};
use opencv::imgcodecs;
use serde::Deserialize;
use toml::Spanned;

use super::{Sink, SinkError, SinkFactory, SinkKind};
use crate::outcome::FrameResult;
use crate::spec::{Diagnostic, ParamDoc, Params, Ref, SinkInput};
use crate::value::{Image, Value};

pub(super) static KIND: SinkKind = SinkKind {
    name: "preview",
    summary: "the latest image of each source as JPEG for the HTTP endpoint's /preview/SOURCE \
              (encoded only while someone watches)",
    inputs: &[super::IMAGE_PORT],
    params: &[
        ParamDoc {
            name: "max_fps",
            ty: "float in (0, 120]",
            default: "5.0",
            doc: "most JPEGs encoded per second and source, while someone watches",
        },
        ParamDoc {
            name: "quality",
            ty: "integer in [1, 100]",
            default: "80",
            doc: "JPEG quality, 1..100",
        },
    ],
    build,
};

const DEFAULT_MAX_FPS: f64 = 5.0;
const MAX_MAX_FPS: f64 = 120.0;
const DEFAULT_QUALITY: i32 = 80;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    max_fps: Option<Spanned<f64>>,
    quality: Option<Spanned<i32>>,
}

#[derive(Debug)]
struct Factory {
    interval: Duration,
    quality: i32,
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let max_fps = match c.max_fps {
        None => DEFAULT_MAX_FPS,
        Some(f) if *f.get_ref() > 0.0 && *f.get_ref() <= MAX_MAX_FPS => *f.get_ref(),
        Some(f) => {
            return Err(Diagnostic::at(
                f.span(),
                format!(
                    "max_fps must be more than 0 and at most {MAX_MAX_FPS}, not {}",
                    f.get_ref()
                ),
            ));
        }
    };
    let quality = match c.quality {
        None => DEFAULT_QUALITY,
        Some(q) if (1..=100).contains(q.get_ref()) => *q.get_ref(),
        Some(q) => {
            return Err(Diagnostic::at(
                q.span(),
                format!("quality must be between 1 and 100, not {}", q.get_ref()),
            ));
        }
    };
    Ok(Box::new(Factory {
        interval: Duration::from_secs_f64(1.0 / max_fps),
        quality,
    }))
}

impl SinkFactory for Factory {
    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        _storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        let image = inputs
            .iter()
            .find(|i| i.port == "image")
            .map(|i| i.from)
            .ok_or_else(|| {
                SinkError::Other("preview: no image input (the config layer requires one)".into())
            })?;
        let name: Arc<str> = name.into();
        hub().open_sink(&name);
        Ok(Box::new(Preview {
            name,
            image,
            interval: self.interval,
            params: Vector::from_slice(&[imgcodecs::IMWRITE_JPEG_QUALITY, self.quality]),
            sources: HashMap::new(),
        }))
    }
}

struct Preview {
    name: Arc<str>,
    image: Ref,
    /// Least time between two JPEGs of one source.
    interval: Duration,
    /// imencode's parameters: the JPEG quality.
    params: Vector<i32>,
    /// Per source, its channel and when its last JPEG was encoded.
    sources: HashMap<Arc<str>, (Arc<Channel>, Option<Instant>)>,
}

impl Sink for Preview {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        let source = &result.frame().source;
        let (channel, last) = self.sources.entry(source.clone()).or_insert_with(|| {
            let channel = hub().channel(source);
            channel.set_interval(self.interval);
            (channel, None)
        });
        if channel.watchers.load(Ordering::Relaxed) == 0
            || last.is_some_and(|t| t.elapsed() < self.interval)
        {
            return Ok(false);
        }
        let Some(Value::Image(image)) = result.value(self.image) else {
            return Ok(false);
        };
        let mat: &Mat = Image::mat(&image).map_err(|e| SinkError::Other(e.to_string()))?;
        let mut buf = Vector::new();
        imgcodecs::imencode(".jpg", mat, &mut buf, &self.params)
            .map_err(|e| SinkError::Other(format!("jpeg: {e}")))?;
        *last = Some(Instant::now());
        channel.publish(buf.as_slice().into());
        Ok(true)
    }

    fn close(self: Box<Self>) -> Result<(), SinkError> {
        hub().close_sink(&self.name);
        Ok(())
    }
}

/// Where preview sinks publish and the HTTP endpoint reads; one per process ([`hub`]).
#[derive(Debug, Default)]
pub struct Hub {
    /// Per source name.
    channels: Mutex<HashMap<Arc<str>, Arc<Channel>>>,
    /// Preview sinks open now, by name, with how many are open under that name (a reload
    /// opens the new one before it closes the old).
    sinks: Mutex<HashMap<Arc<str>, usize>>,
}

/// The process's hub.
pub fn hub() -> &'static Hub {
    static HUB: OnceLock<Hub> = OnceLock::new();
    HUB.get_or_init(Hub::default)
}

impl Hub {
    /// The channel of `source`, made if needed.
    pub fn channel(&self, source: &str) -> Arc<Channel> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels.entry(source.into()).or_default().clone()
    }

    /// Whether a preview sink of this name is open.
    pub fn is_preview_sink(&self, name: &str) -> bool {
        let sinks = self.sinks.lock().unwrap_or_else(PoisonError::into_inner);
        sinks.get(name).is_some_and(|&n| n > 0)
    }

    /// JPEGs encoded for `source` so far, in this process.
    pub fn encodes(&self, source: &str) -> u64 {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels
            .get(source)
            .map_or(0, |c| c.encodes.load(Ordering::Relaxed))
    }

    /// Watchers of `source` now (an HTTP preview stream each).
    pub fn watchers(&self, source: &str) -> usize {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels
            .get(source)
            .map_or(0, |c| c.watchers.load(Ordering::Relaxed))
    }

    /// Wakes every watcher (each then checks whether it should stop).
    pub fn wake_all(&self) {
        let channels: Vec<Arc<Channel>> = self
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for channel in channels {
            // Taken so that a watcher between its check and its wait cannot miss the wake-up.
            let _latest = channel
                .latest
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            channel.changed.notify_all();
        }
    }

    fn open_sink(&self, name: &Arc<str>) {
        let mut sinks = self.sinks.lock().unwrap_or_else(PoisonError::into_inner);
        *sinks.entry(name.clone()).or_default() += 1;
    }

    /// Counts the sink closed and wakes the watchers: theirs may be gone.
    fn close_sink(&self, name: &str) {
        {
            let mut sinks = self.sinks.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = sinks.get_mut(name) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    sinks.remove(name);
                }
            }
        }
        self.wake_all();
    }
}

/// The JPEGs of one source.
#[derive(Debug, Default)]
pub struct Channel {
    /// Watchers now: the sink encodes only while this is above 0.
    watchers: AtomicUsize,
    /// JPEGs published so far.
    encodes: AtomicU64,
    /// The publishing sink's least interval between JPEGs, in microseconds (written by the
    /// sink when it first sees the source, read by watchers; Relaxed: a hint for a stall limit).
    interval_us: AtomicU64,
    latest: Mutex<Latest>,
    /// Notified when a JPEG is published, and by [`Hub::wake_all`].
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Latest {
    /// Number of the JPEG in `jpeg` (1 for the first; 0: none yet).
    seq: u64,
    jpeg: Option<Arc<[u8]>>,
}

impl Channel {
    fn publish(&self, jpeg: Arc<[u8]>) {
        self.encodes.fetch_add(1, Ordering::Relaxed);
        let mut latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        latest.seq += 1;
        latest.jpeg = Some(jpeg);
        self.changed.notify_all();
    }

    fn set_interval(&self, interval: Duration) {
        let us = u64::try_from(interval.as_micros()).unwrap_or(u64::MAX);
        self.interval_us.store(us, Ordering::Relaxed);
    }

    /// The least time between two JPEGs its sink publishes (zero before a sink saw the source).
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.interval_us.load(Ordering::Relaxed))
    }

    /// Starts watching: the sink encodes while a `Watch` is held.
    pub fn watch(self: &Arc<Self>) -> Watch {
        self.watchers.fetch_add(1, Ordering::Relaxed);
        Watch {
            channel: self.clone(),
            seen: 0,
        }
    }
}

/// One watcher of a channel; counted until dropped.
#[derive(Debug)]
pub struct Watch {
    channel: Arc<Channel>,
    /// Number of the last JPEG returned.
    seen: u64,
}

impl Watch {
    /// Waits at most `within` for a JPEG newer than the last one returned; `None` when none
    /// came in that time or [`Hub::wake_all`] woke the watcher first (it then checks why).
    pub fn next(&mut self, within: Duration) -> Option<Arc<[u8]>> {
        let latest = self
            .channel
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let latest = if latest.seq > self.seen {
            latest
        } else {
            self.channel
                .changed
                .wait_timeout(latest, within)
                .unwrap_or_else(PoisonError::into_inner)
                .0
        };
        newer(&latest, &mut self.seen)
    }

    /// The JPEG newer than the last one returned, if one came; never waits (the HTTP live
    /// thread takes each source's newest at its own pace).
    pub fn try_next(&mut self) -> Option<Arc<[u8]>> {
        let latest = self
            .channel
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        newer(&latest, &mut self.seen)
    }
}

/// `latest`'s JPEG if it is newer than the one numbered `seen` (which it then becomes).
fn newer(latest: &Latest, seen: &mut u64) -> Option<Arc<[u8]>> {
    let jpeg = latest.jpeg.as_ref().filter(|_| latest.seq > *seen)?;
    *seen = latest.seq;
    Some(jpeg.clone())
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.channel.watchers.fetch_sub(1, Ordering::Relaxed);
    }
}
