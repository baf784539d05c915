//! The progress of `vidflow run` on a terminal: while file sources play and stderr is a terminal,
//! one line per file source with its frames done (decoded and queued for the workflow, which a
//! file's bounded queue keeps within a few frames of processed) of its total, frames per second
//! and the time left; frames and frames per second alone when the total is unknown (a looping
//! file, one without a duration). Nothing when stderr is not a terminal: a file, a pipe or the
//! journal (tests and systemd) see no progress, and no thread is started.
//!
//! Threads: one, `vidflow-progress`, started by [`Progress::start`]. It blocks on its stop
//! channel for [`REFRESH`] at a time (it never spins), then reads the run's [`Live`] (the
//! sources' counters) and moves the bars; indicatif draws them on that thread, at most 20 times
//! a second. It ends at once if the run has sources and none is a file. Stop protocol: dropping
//! the [`Progress`] sends on the stop channel (capacity 1) and joins the thread, which draws the
//! last counts and leaves them on the screen as plain text, the cursor on the line below.
//!
//! Log lines: the tracing writer ([`LogWriter`]) writes each line inside the bars'
//! `suspend` while they are on the screen: they are cleared, the line is written, and they are
//! drawn again under it, so that a line never lands inside a bar.

use std::io::{self, IsTerminal as _, Write as _};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, Sender};
use indicatif::{
    HumanDuration, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle,
};

use crate::daemon::Live;
use crate::source::{SourceCounters, SourceState};

/// How often the bars read the counters: smooth to the eye, and nothing to a run.
const REFRESH: Duration = Duration::from_millis(100);

/// The terminal the bars are drawn on, if stderr is one (decided once per process).
fn terminal() -> Option<&'static MultiProgress> {
    static TERMINAL: OnceLock<Option<MultiProgress>> = OnceLock::new();
    TERMINAL
        .get_or_init(|| {
            io::stderr()
                .is_terminal()
                .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
        })
        .as_ref()
}

/// The progress of one run; see the module docs. Dropping it stops the bars.
#[derive(Debug)]
pub(super) struct Progress {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Shows the progress of the run that `live` shows, if stderr is a terminal.
    pub(super) fn start(live: &Arc<Live>) -> Option<Self> {
        let screen = terminal()?;
        let (stop, stopped) = crossbeam_channel::bounded(1);
        let live = live.clone();
        let spawned = std::thread::Builder::new()
            .name("vidflow-progress".to_owned())
            .spawn(move || {
                let mut bars = Bars::new(screen);
                loop {
                    let stopping = match stopped.recv_timeout(REFRESH) {
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
                        Err(RecvTimeoutError::Timeout) => false,
                    };
                    let nothing_to_show = !bars.update(&live);
                    if stopping || nothing_to_show {
                        bars.finish();
                        return;
                    }
                }
            });
        match spawned {
            Ok(thread) => Some(Self {
                stop,
                thread: Some(thread),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the progress thread; no progress shown");
                None
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        let _ = self.stop.try_send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One bar per file source, on the terminal.
struct Bars {
    screen: &'static MultiProgress,
    shown: Vec<Bar>,
    /// Whether the run's sources were seen (they are set once they all started, and again at
    /// each reload).
    started: bool,
    with_total: ProgressStyle,
    without_total: ProgressStyle,
}

struct Bar {
    counters: Arc<SourceCounters>,
    bar: ProgressBar,
    /// Whether the bar shows a total (its style says so).
    total: bool,
}

impl Bars {
    fn new(screen: &'static MultiProgress) -> Self {
        let style = |template: &str| {
            ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ")
                .with_key("fps", fps)
                .with_key("left", left)
        };
        Self {
            screen,
            shown: Vec::new(),
            started: false,
            with_total: style("{prefix} [{wide_bar}] {pos}/{len} frames, {fps} frames/s{left}"),
            without_total: style("{prefix} {pos} frames, {fps} frames/s{left}"),
        }
    }

    /// Moves the bars to the counters; false once it is clear there is nothing to show.
    fn update(&mut self, live: &Live) -> bool {
        let parts = live.parts();
        let first = !self.started;
        if !parts.sources.is_empty() {
            self.started = true;
        }
        // Sources a reload started come with their own counters, and get a bar of their own.
        let new: Vec<_> = parts
            .sources
            .iter()
            .filter(|s| s.file)
            .filter(|s| {
                !self
                    .shown
                    .iter()
                    .any(|b| Arc::ptr_eq(&b.counters, &s.counters))
            })
            .collect();
        for source in new {
            // Its clock starts with the run's, not at the first refresh: a short file may
            // be done by then. One a reload started starts now.
            let since = if first {
                live.started.elapsed()
            } else {
                Duration::ZERO
            };
            let bar = ProgressBar::no_length().with_elapsed(since);
            let bar = self.screen.add(bar);
            bar.set_style(self.without_total.clone());
            bar.set_prefix(source.name.to_string());
            self.shown.push(Bar {
                counters: source.counters.clone(),
                bar,
                total: false,
            });
        }
        for shown in &mut self.shown {
            shown.update(&self.with_total);
        }
        !self.started || !self.shown.is_empty()
    }

    /// The last counts, left on the screen as text, the cursor on the line after them (later
    /// lines, the shell's prompt, come there).
    fn finish(&mut self) {
        if self.shown.is_empty() {
            return;
        }
        for shown in &mut self.shown {
            shown.update(&self.with_total);
            shown.bar.abandon();
        }
        self.screen.set_draw_target(ProgressDrawTarget::hidden());
        let _ = io::stderr().write_all(b"\n");
    }
}

impl Bar {
    fn update(&mut self, with_total: &ProgressStyle) {
        if self.bar.is_finished() {
            return;
        }
        let done = self
            .counters
            .decoded
            .load(std::sync::atomic::Ordering::Relaxed);
        if let Some(total) = self.counters.total() {
            if !self.total {
                self.total = true;
                self.bar.set_style(with_total.clone());
            }
            // An estimate: a file may give a frame more than its duration said.
            self.bar.set_length(total.max(done));
        }
        self.bar.set_position(done);
        if self.counters.state() == SourceState::Ended {
            // `finish` would show the total as done, which a stopped run has not.
            self.bar.abandon();
        }
    }
}

/// Frames per second since the run started: steadier than the rate of the last moments, which
/// is wild in the first of them.
fn fps(state: &ProgressState, w: &mut dyn std::fmt::Write) {
    let seconds = state.elapsed().as_secs_f64();
    let fps = if seconds > 0.0 {
        state.pos() as f64 / seconds
    } else {
        0.0
    };
    let _ = write!(w, "{fps:.1}");
}

/// The time left while a bar with a total runs, the time it took once it ended.
fn left(state: &ProgressState, w: &mut dyn std::fmt::Write) {
    let _ = if state.is_finished() {
        write!(w, ", in {}", HumanDuration(state.elapsed()))
    } else if state.len().is_some() {
        write!(w, ", {} left", HumanDuration(state.eta()))
    } else {
        Ok(())
    };
}

/// The tracing writer: stderr, through the bars while they are on the screen.
#[derive(Debug, Clone, Copy)]
pub(super) struct LogWriter;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogLine;

    fn make_writer(&'a self) -> LogLine {
        LogLine
    }
}

/// One log line being written (tracing writes a line at once).
#[derive(Debug)]
pub(super) struct LogLine;

impl io::Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match terminal() {
            Some(screen) => screen
                .suspend(|| io::stderr().write_all(buf))
                .map(|()| buf.len()),
            None => io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
