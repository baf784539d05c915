//! A source's record stream: the camera's own encoded stream (`record_uri`, else `uri`'s),
//! parsed into whole access units and published as [`Packet`]s for the sinks that write it as
//! sent (`crate::packets`). Nothing here decodes.
//!
//! Threads: the record stream has a supervisor of its own (`vidflow-record-NAME`), the same
//! supervisor as the decoded stream's (`supervisor.rs`: connect, watch the bus, stall timeout,
//! teardown, backoff), on a [`Shared`] of its own, so it is lost and regained independently: a
//! main stream that drops never stops detection on the sub-stream, and the reverse. Its
//! GStreamer streaming thread runs the callbacks of `publish.rs`, which publish each packet (a
//! file waits for room, a live stream never waits: `crate::packets`). Its counters are a [`super::SourceCounters`]
//! of their own (`decoded` counts packets).
//!
//! Stop protocol: the source's controls raise the record stream's request with the decoded
//! stream's. When the decoded stream's supervisor returns, [`RecordStream::finish`] lets a
//! file's record stream read to its end (it is not paced, so it is at most a moment behind),
//! and stops a live one (EOS, then hard after `STOP_GRACE`), then joins its supervisor before
//! the source reports its end: the last segment gets every packet the stream gave.

use std::sync::Arc;
use std::thread::JoinHandle;

use super::{RUN, Resume, STOP, Shared, SourceConfig, SourceError, SourceState, SourceUri};

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
