//! The start of a run, part by part: the sinks, the daemon's pool, the sources ([`Starting`]),
//! then the executor's thread, its supervisor, notify and HTTP ([`Running`]). A part that cannot
//! start ends the run before its first frame, and what started before it is taken down in the
//! shutdown order ([`Starting::give_up`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Receiver;

use super::super::counts::LastCounts;
use super::super::http::{Bound, Server};
use super::super::live::Phase;
use super::super::shutdown::{Delivered, StopDeadline, close_in_order, close_sinks, stop_sources};
use super::super::supervise::{
    Channels, FromExecutor, OpenSink, RunParts, RunningSource, Segment, Supervisor, executor_thread,
};
use super::super::taps::{self, Taps};
use super::super::{DaemonError, Failure, Live, RunOptions, Shutdown, notify};
use crate::config::{ExecutorConfig, SinkConfig, Written};
use crate::events::EventStore;
use crate::frame::Frame;
use crate::sinks::SinkRunner;
use crate::source::{self, SourceConfig};
use crate::storage::Storage;
use crate::workflow::{Executor, Graph, Pool, PoolError, PoolMetrics};

/// The sinks, the daemon's pool and the sources, as far as they started.
pub(super) struct Starting {
    stop_timeout: Duration,
    sinks: Vec<OpenSink>,
    pool: Option<Pool>,
    /// `None` until the sources' turn: before it, giving up only closes the sinks.
    sources: Option<(Vec<RunningSource>, Vec<Receiver<Frame>>)>,
}

/// What the running parts are made of, besides what [`Starting`] started.
pub(super) struct Assembly {
    pub path: PathBuf,
    pub live: Arc<Live>,
    pub graph: Arc<Graph>,
    pub last_counts: Arc<LastCounts>,
    pub written: Written,
    pub executor: ExecutorConfig,
    pub storage: Storage,
    pub events: Option<EventStore>,
    /// `[events]` as the store runs it, for a reload to compare (`reload::ignored`).
    pub events_config: Option<crate::events::EventsConfig>,
    pub http: Option<(Bound, std::net::SocketAddr)>,
}

impl Starting {
    pub(super) fn new(stop_timeout: Duration) -> Self {
        Self {
            stop_timeout,
            sinks: Vec::new(),
            pool: None,
            sources: None,
        }
    }

    /// Opens every sink, each on its thread.
    pub(super) fn open_sinks(
        &mut self,
        configs: Vec<SinkConfig>,
        storage: &Storage,
    ) -> Result<(), Failure> {
        for config in configs {
            let opened = config
                .factory
                .open(&config.name, &config.inputs, storage)
                .and_then(|sink| SinkRunner::spawn(&config.name, sink, config.routing.clone()));
            match opened {
                Ok(runner) => self.sinks.push(OpenSink {
                    runner,
                    inputs: config.inputs,
                }),
                Err(source) => {
                    let name = config.name.to_string();
                    return Err(self.give_up(DaemonError::Sink { name, source }));
                }
            }
        }
        Ok(())
    }

    /// A still image is a one-shot run: its executor builds a pool only if a step is
    /// dispatched. Streams get the daemon's pool, built now, before the first frame.
    pub(super) fn build_pool(
        &mut self,
        sources: &[SourceConfig],
        workers: usize,
    ) -> Result<(), Failure> {
        if sources.iter().all(|s| s.uri.is_still_image()) {
            return Ok(());
        }
        match Pool::new(workers) {
            Ok(pool) => {
                self.pool = Some(pool);
                Ok(())
            }
            Err(e) => Err(self.give_up(e.into())),
        }
    }

    /// Starts every source, each with its own queue, so that one cannot crowd out another.
    pub(super) fn start_sources(
        &mut self,
        configs: Vec<SourceConfig>,
        max_frames: Option<u64>,
    ) -> Result<(), Failure> {
        let (running, queues) = self.sources.get_or_insert_with(Default::default);
        for config in configs {
            let (tx, rx) = crossbeam_channel::bounded(config.options.queue);
            match source::start(&config, tx, &rx, max_frames) {
                Ok(handle) => {
                    running.push(RunningSource {
                        handle,
                        config,
                        ended: false,
                    });
                    queues.push(rx);
                }
                Err(e) => return Err(self.give_up(e.into())),
            }
        }
        Ok(())
    }

    /// Takes down what started, in the shutdown order: the sources, the pool, the sinks.
    fn give_up(&mut self, error: DaemonError) -> Failure {
        let runners: Vec<_> = self.sinks.drain(..).map(|s| s.runner).collect();
        match self.sources.take() {
            None => {
                close_sinks(runners, None);
            }
            Some((running, queues)) => {
                let deadline = StopDeadline::starting_now(self.stop_timeout);
                let handles = running.into_iter().map(|s| s.handle).collect();
                stop_sources(handles, queues, deadline.joins());
                let _ = close_in_order(self.pool.take(), runners, &deadline);
            }
        }
        Failure::before_start(error)
    }

    /// Starts the executor on its thread under a supervisor, then notify and HTTP.
    pub(super) fn run(
        mut self,
        parts: Assembly,
        options: &RunOptions,
        shutdown: &Shutdown,
    ) -> Result<Running, Failure> {
        let (sources, queues) = self.sources.take().unwrap_or_default();
        let executor = match &self.pool {
            Some(pool) => Executor::new(parts.graph.clone(), pool.handle(), parts.executor),
            None => Executor::owning(parts.graph.clone(), parts.executor),
        };
        let (pause_tx, pause_rx) = crossbeam_channel::unbounded::<()>();
        let (from_tx, from_rx) = crossbeam_channel::unbounded::<FromExecutor>();
        let (to_tx, to_rx) = crossbeam_channel::bounded::<Segment>(1);
        let handing_over = Arc::new(AtomicBool::new(false));
        let live = parts.live;
        let sinks = taps::triggers(self.sinks.iter().map(|s| (s.runner.name(), &s.inputs[..])));
        let taps = Arc::new(Taps::new(&parts.graph, parts.events, live.clone(), &sinks));
        let first = Segment {
            queues: queues.clone(),
            sinks: self.sinks.iter().map(|s| s.runner.sender()).collect(),
            last_counts: parts.last_counts.clone(),
            taps: taps.clone(),
            pause: pause_rx,
            executor,
        };
        let (bound, listen) = parts.http.unzip();
        let mut sup = Supervisor::new(
            RunParts {
                path: parts.path,
                live: live.clone(),
                stop_timeout: self.stop_timeout,
                max_frames: options.max_frames,
                sources,
                queues,
                sinks: std::mem::take(&mut self.sinks),
                storage: parts.storage,
                graph: parts.graph,
                written: parts.written,
                executor_config: parts.executor,
                http: listen,
                events: parts.events_config,
                last_counts: parts.last_counts,
                taps,
                pool: self.pool.as_ref().map(Pool::handle),
                executor_metrics: first.executor.metrics().clone(),
            },
            Channels {
                requests: shutdown.rx.clone(),
                reloads: shutdown.reload_rx.clone(),
                from_executor: from_rx,
                to_executor: to_tx,
                handing_over: handing_over.clone(),
                pause: pause_tx,
            },
        );
        sup.publish();
        live.set_phase(Phase::Running);
        sup.notifier = notify::Notifier::start(&options.notify, live.clone());
        // Serves until the run's report is made: it still answers while draining.
        let http = bound.map(|b| b.serve(live.clone())).transpose().unwrap_or_else(|e| {
            tracing::error!(error = %e, "http endpoint: cannot start its thread; running without it");
            None
        });
        let delivered = Arc::new(Delivered::default());
        let spawned = {
            let delivered = delivered.clone();
            std::thread::Builder::new()
                .name("vidflow-executor".to_owned())
                .spawn(move || {
                    executor_thread(first, &to_rx, &handing_over, &from_tx, &delivered, &live);
                })
        };
        let thread = match spawned {
            Ok(thread) => thread,
            Err(e) => {
                // Given back, to be taken down in the shutdown order.
                let running = sup.parts.sources.drain(..).collect();
                self.sources = Some((running, std::mem::take(&mut sup.parts.queues)));
                self.sinks = sup.parts.sinks.drain(..).collect();
                return Err(self.give_up(DaemonError::Pool(PoolError::Spawn(e))));
            }
        };
        Ok(Running {
            workers: parts.executor.workers,
            pool_metrics: self.pool.as_ref().map(|p| p.metrics().clone()),
            pool: self.pool,
            sup,
            thread,
            delivered,
            http,
        })
    }
}

/// The running parts: each is stopped by [`Running::stop`] (`end.rs`), in the shutdown order.
pub(super) struct Running {
    pub sup: Supervisor,
    /// The executor's thread.
    pub thread: JoinHandle<()>,
    pub delivered: Arc<Delivered>,
    /// The daemon's pool (none for a one-shot run), and its metrics.
    pub pool: Option<Pool>,
    pub pool_metrics: Option<Arc<PoolMetrics>>,
    /// The workers asked for at the start.
    pub workers: usize,
    pub http: Option<Server>,
}
