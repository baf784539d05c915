//! Reloads: loading the file, preparing the swap, carrying it out or cancelling it (the steps
//! are in the module above).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::*;

/// How long a reload waits for the sinks it replaces to write what they hold and finalize
/// their files; a sink still busy then is abandoned (named in the log) so the workflow can go
/// on. Encoders finalize in well under a second.
const RELOAD_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

impl Supervisor {
    pub(super) fn reload_requested(&mut self) {
        if self.stops > 0 || self.deadline.is_some() {
            tracing::info!("reload requested while stopping: ignored");
            return;
        }
        if self.parts.pool.is_none() {
            tracing::warn!("reload requested: a still image runs once; nothing to reload");
            return;
        }
        if !matches!(self.reload, Reload::Idle) {
            // The one under way runs to its end; the file is read again after it.
            tracing::info!("reload requested while one is under way: loading again after it");
            self.again = true;
            return;
        }
        tracing::info!(path = %self.parts.path.display(), "reload requested: loading the pipeline file");
        self.notifier.reloading();
        self.parts.live.set_phase(Phase::Reloading);
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.reload = Reload::Loading(rx);
        let path = self.parts.path.clone();
        let spawned = std::thread::Builder::new()
            .name("vidflow-reload".to_owned())
            .spawn(move || {
                let _ = tx.send(load(&path));
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "reload: cannot start its thread; keeping the running pipeline");
            self.reload_done();
        }
    }

    /// The loader's answer.
    pub(super) fn loaded(&mut self, loaded: Result<Pipeline, String>) {
        let new = match loaded {
            Ok(new) => new,
            Err(problems) => {
                for line in problems.lines() {
                    tracing::error!("reload: {line}");
                }
                tracing::error!("reload refused: keeping the running pipeline");
                self.reload_done();
                return;
            }
        };
        if new.sources.iter().any(|s| s.uri.is_still_image()) {
            tracing::error!(
                "reload refused: a still image cannot join a running stream (restart to run it)"
            );
            self.reload_done();
            return;
        }
        let sink_inputs: Vec<(Arc<str>, Vec<SinkInput>)> = self
            .parts
            .sinks
            .iter()
            .map(|s| (Arc::<str>::from(s.runner.name()), s.inputs.clone()))
            .collect();
        let sources: Vec<SourceConfig> = self
            .parts
            .sources
            .iter()
            .map(|s| s.config.clone())
            .collect();
        let plan = reload::plan(
            &Current {
                sources: &sources,
                graph: &self.parts.graph,
                sinks: &sink_inputs,
                written: &self.parts.written,
                executor: self.parts.executor_config,
                http: self.parts.http,
                events: self.parts.events.as_ref(),
            },
            &new,
        );
        for line in &plan.ignored {
            tracing::warn!("reload: {line}");
        }
        if plan.is_empty() {
            tracing::info!("reload: nothing changed that runs");
            self.adopt_settings(&new);
            self.reload_done();
            return;
        }
        let Some(opened) = open_sinks(&new.sinks, &plan.kept_sinks, &self.parts.storage) else {
            tracing::error!("reload refused: keeping the running pipeline");
            self.reload_done();
            return;
        };
        let resume = vec![None; new.sources.len()];
        let mut prepared = Box::new(Prepared {
            plan,
            opened,
            resume,
            waiting: 0,
            paused_at: None,
            new,
        });
        // Changed and removed sources stop; what they decoded is still processed.
        let mut stopping: Vec<(usize, Option<usize>)> = prepared
            .plan
            .sources
            .restart
            .iter()
            .map(|&(old, new)| (old, Some(new)))
            .collect();
        stopping.extend(prepared.plan.sources.remove.iter().map(|&old| (old, None)));
        stopping.sort_unstable_by_key(|&(old, _)| std::cmp::Reverse(old));
        // A segment whose queues all close now must pause, not end the run.
        self.channels.handing_over.store(true, Ordering::Release);
        for (old, successor) in stopping {
            let running = self.parts.sources.remove(old);
            tracing::info!(source = %running.config.name, "reload: stopping source");
            running.handle.control().stop();
            if successor.is_some() {
                prepared.waiting += 1;
            }
            self.retired.push(Retired {
                handle: running.handle,
                successor,
            });
        }
        if prepared.waiting == 0 {
            self.pause_for(prepared);
        } else {
            self.reload = Reload::Stopping(prepared);
        }
    }

    fn pause_for(&mut self, mut prepared: Box<Prepared>) {
        prepared.paused_at = Some(Instant::now());
        self.channels.handing_over.store(true, Ordering::Release);
        let _ = self.channels.pause.send(());
        self.reload = Reload::Pausing(prepared);
    }

    pub(super) fn retired_ended(&mut self, i: usize) {
        let Retired { handle, successor } = self.retired.remove(i);
        let name = handle.name().to_string();
        let resume = handle.resume_point();
        let stats = handle.counters().snapshot();
        if let Err(e) = handle.join() {
            self.retired_errors.push(e);
        }
        add_source_stats(self.retired_stats.entry(name).or_default(), &stats);
        let Some(successor) = successor else { return };
        let (Reload::Stopping(prepared) | Reload::Drained(prepared, _)) = &mut self.reload else {
            return;
        };
        prepared.resume[successor] = Some(resume);
        prepared.waiting -= 1;
        if prepared.waiting > 0 {
            return;
        }
        match std::mem::replace(&mut self.reload, Reload::Idle) {
            Reload::Stopping(prepared) => self.pause_for(prepared),
            Reload::Drained(prepared, executor) => {
                let executor = self.swap(*prepared, executor);
                self.resume(executor);
                self.reload_done();
            }
            other => self.reload = other,
        }
    }

    /// The executor's thread drained its segment: swap, or (a cancelled reload) go on as before.
    pub(super) fn paused(&mut self, executor: Executor) {
        match std::mem::replace(&mut self.reload, Reload::Idle) {
            Reload::Pausing(prepared) => {
                let executor = self.swap(*prepared, executor);
                self.resume(executor);
                self.reload_done();
            }
            // Every queue closed before the changed sources ended: wait for them.
            Reload::Stopping(prepared) => self.reload = Reload::Drained(prepared, executor),
            // A cancelled reload: go on as before.
            other => {
                self.reload = other;
                self.resume(executor);
            }
        }
    }

    /// Gives the executor's thread its next segment: `executor` over every queue, delivering to
    /// the open sinks.
    fn resume(&mut self, executor: Executor) {
        let (pause, paused) = crossbeam_channel::unbounded();
        if self.stops > 1 {
            // Aborting: the new segment admits nothing.
            let _ = pause.send(());
        }
        self.channels.pause = pause;
        // Queues of sources that ended stay listed: a closed one costs the executor one wake-up
        // per segment, and reloads are rare.
        let segment = Segment {
            executor,
            queues: self.parts.queues.clone(),
            sinks: self.parts.sinks.iter().map(|s| s.runner.sender()).collect(),
            last_counts: self.parts.last_counts.clone(),
            taps: self.parts.taps.clone(),
            pause: paused,
        };
        if self.channels.to_executor.send(segment).is_err() {
            tracing::error!("the executor's thread is gone");
        }
    }

    /// Carries a prepared reload out while the workflow is paused; returns the new executor.
    fn swap(&mut self, prepared: Prepared, old: Executor) -> Executor {
        let Prepared {
            mut new,
            plan,
            opened,
            resume,
            paused_at,
            ..
        } = prepared;
        let metrics = old.metrics();
        self.retired_metrics.0 += metrics.coordinator_wakeups.load(Ordering::Relaxed);
        self.retired_metrics.1 += metrics.step_panics.load(Ordering::Relaxed);
        drop(old);

        self.swap_sinks(std::mem::take(&mut new.sinks), &plan, opened);

        // Steps: kept ones carry their instance (and state) over.
        let mut steps = std::mem::take(&mut new.steps);
        for (step, kept) in steps.iter_mut().zip(&plan.kept_steps) {
            if let Some(i) = kept {
                step.step = self.parts.graph.nodes[*i].step.clone();
            }
        }
        let kept = plan.kept_steps.iter().flatten().count();
        self.parts.graph = Arc::new(Graph::new(steps));
        self.parts.last_counts = Arc::new(self.parts.last_counts.carried_to(&self.parts.graph));
        let sinks = (self.parts.sinks.iter()).map(|s| (s.runner.name(), &s.inputs[..]));
        let sinks = super::super::taps::triggers(sinks);
        self.parts.taps = Arc::new(self.parts.taps.for_graph(&self.parts.graph, &sinks));
        self.parts.written = std::mem::take(&mut new.written);

        // Sources: restarted and new ones start now.
        let mut started = 0;
        let mut configs: Vec<Option<SourceConfig>> = std::mem::take(&mut new.sources)
            .into_iter()
            .map(Some)
            .collect();
        let starts = plan
            .sources
            .restart
            .iter()
            .map(|&(_, j)| j)
            .chain(plan.sources.add.iter().copied());
        let starts: Vec<usize> = starts.collect();
        for j in starts {
            let Some(config) = configs[j].take() else {
                continue;
            };
            let from = resume[j].unwrap_or_default();
            let (tx, rx) = crossbeam_channel::bounded(config.options.queue);
            match source::start_from(&config, tx, &rx, self.parts.max_frames, from) {
                Ok(handle) => {
                    started += 1;
                    self.parts.queues.push(rx);
                    self.parts.sources.push(RunningSource {
                        handle,
                        config,
                        ended: false,
                    });
                }
                Err(e) => tracing::error!(error = %e, "reload: source cannot start"),
            }
        }
        self.adopt_settings(&new);
        let mut config = new.executor;
        config.workers = self.parts.executor_config.workers;
        self.parts.executor_config = config;
        let executor = match &self.parts.pool {
            Some(pool) => Executor::new(self.parts.graph.clone(), pool.clone(), config),
            None => Executor::owning(self.parts.graph.clone(), config),
        };
        self.parts.executor_metrics = executor.metrics().clone();
        self.publish();
        tracing::info!(
            steps = self.parts.graph.len(),
            steps_kept = kept,
            sinks = self.parts.sinks.len(),
            sinks_kept = plan.kept_sinks.iter().flatten().count(),
            sources_started = started,
            sources_stopped = plan.sources.remove.len() + plan.sources.restart.len(),
            held_ms = format!(
                "{:.1}",
                paused_at.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3)
            ),
            "reload applied"
        );
        executor
    }

    /// The sinks of a swap: the kept ones, then the new ones, in the new file's order; the rest
    /// closed (counted in `closed_sinks`).
    fn swap_sinks(
        &mut self,
        configs: Vec<SinkConfig>,
        plan: &Plan,
        opened: Vec<Option<SinkRunner>>,
    ) {
        let mut running: Vec<Option<OpenSink>> = self.parts.sinks.drain(..).map(Some).collect();
        let closing: Vec<SinkRunner> = plan
            .closed_sinks
            .iter()
            .filter_map(|&i| running[i].take().map(|s| s.runner))
            .collect();
        let closed = close_sinks(closing, Some(Instant::now() + RELOAD_CLOSE_TIMEOUT));
        for (name, _, result) in &closed {
            match result {
                Some(Ok(())) => tracing::info!(sink = %name, "reload: sink closed"),
                Some(Err(e)) => {
                    tracing::error!(sink = %name, error = %e, "reload: sink closed with an error")
                }
                None => {}
            }
        }
        self.closed_sinks.extend(closed);
        for ((config, kept), opened) in configs.into_iter().zip(&plan.kept_sinks).zip(opened) {
            let sink = match (kept, opened) {
                (Some(i), _) => running[*i].take(),
                (None, Some(runner)) => {
                    tracing::info!(sink = %config.name, "reload: sink opened");
                    Some(OpenSink {
                        runner,
                        inputs: config.inputs,
                    })
                }
                (None, None) => None,
            };
            self.parts.sinks.extend(sink);
        }
    }

    /// Settings a reload changes without a swap.
    pub(super) fn adopt_settings(&mut self, new: &Pipeline) {
        self.parts.stop_timeout = new.daemon.stop_timeout;
        self.parts.storage.configure(new.storage.clone());
        if new.executor.opencv_threads != self.parts.executor_config.opencv_threads {
            let threads = i32::try_from(new.executor.opencv_threads).unwrap_or(1);
            if let Err(e) = opencv::core::set_num_threads(threads) {
                tracing::warn!(error = %e, "cannot limit OpenCV's threads");
            }
            self.parts.executor_config.opencv_threads = new.executor.opencv_threads;
        }
    }

    /// A stop or the end of the workflow during a reload: undo what it opened.
    pub(super) fn cancel_reload(&mut self, why: &str) {
        self.again = false;
        let (stage, prepared) = match std::mem::replace(&mut self.reload, Reload::Idle) {
            Reload::Idle => return,
            Reload::Loading(_) => ("loading", None),
            Reload::Stopping(p) => ("stopping sources", Some(p)),
            Reload::Pausing(p) => ("pausing", Some(p)),
            Reload::Drained(p, executor) => {
                self.resume(executor);
                ("drained", Some(p))
            }
        };
        tracing::info!(stage, "reload cancelled: {why}");
        if let Some(prepared) = prepared {
            let opened: Vec<SinkRunner> = prepared.opened.into_iter().flatten().collect();
            let _ = close_sinks(opened, Some(Instant::now() + RELOAD_CLOSE_TIMEOUT));
        }
    }

    /// The reload under way is over (applied, refused or cancelled).
    pub(super) fn reload_done(&mut self) {
        self.reload = Reload::Idle;
        if self.stops == 0 && self.deadline.is_none() {
            self.parts.live.set_phase(Phase::Running);
            self.notifier.ready();
        }
        self.maybe_drain();
        if std::mem::take(&mut self.again) {
            self.reload_requested();
        }
    }
}

/// Reads and checks the pipeline file again (on the loader's thread): every problem, one per
/// line, or the pipeline with its steps built.
fn load(path: &std::path::Path) -> Result<Pipeline, String> {
    let pipeline = config::load(path).map_err(|e| match e {
        ConfigError::Invalid { problems } => problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    })?;
    let missing: Vec<String> = pipeline
        .sources
        .iter()
        .filter_map(|s| source::check(s).err())
        .map(|e| e.to_string())
        .collect();
    if missing.is_empty() {
        Ok(super::super::run::without_unread_steps(pipeline))
    } else {
        Err(missing.join("\n"))
    }
}

/// Opens the sinks a reload does not keep; `None` (and every one opened closed again) if one
/// cannot be opened.
fn open_sinks(
    configs: &[SinkConfig],
    kept: &[Option<usize>],
    storage: &crate::storage::Storage,
) -> Option<Vec<Option<SinkRunner>>> {
    let mut opened = Vec::new();
    for (config, kept) in configs.iter().zip(kept) {
        if kept.is_some() {
            opened.push(None);
            continue;
        }
        let runner = config
            .factory
            .open(&config.name, &config.inputs, storage)
            .and_then(|sink| SinkRunner::spawn(&config.name, sink, config.routing.clone()));
        match runner {
            Ok(runner) => opened.push(Some(runner)),
            Err(e) => {
                tracing::error!(sink = %config.name, error = %e, "reload: sink cannot open");
                let _ = close_sinks(opened.into_iter().flatten().collect(), None);
                return None;
            }
        }
    }
    Some(opened)
}
