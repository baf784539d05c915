//! Subcommands: `run`, `validate`, `graph`, `steps`, `sinks`, `sources`, `hash-password`.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::config::{self, ConfigError};
use crate::daemon::{self, RunOptions, Shutdown};

mod logging;
mod panic;
mod password;
mod progress;
mod reference;

/// sysexits codes used by the command line.
pub mod exit {
    pub const OK: u8 = 0;
    /// EX_USAGE: bad command line.
    pub const USAGE: u8 = 64;
    /// EX_DATAERR: a file source ended short of the frames it holds (damaged or truncated).
    pub const DATAERR: u8 = 65;
    /// EX_UNAVAILABLE: the source cannot be opened.
    pub const UNAVAILABLE: u8 = 69;
    /// EX_SOFTWARE: internal error.
    pub const SOFTWARE: u8 = 70;
    /// EX_CANTCREAT: an output file cannot be created.
    pub const CANTCREAT: u8 = 73;
    /// EX_IOERR.
    pub const IOERR: u8 = 74;
    /// EX_CONFIG: invalid pipeline file.
    pub const CONFIG: u8 = 78;
}

/// Live video analytics: GStreamer sources, a workflow of OpenCV steps on every frame, results
/// to files.
///
/// A pipeline file (TOML) names a source, the steps to run on each frame and the sinks that
/// receive the results. Start with `vidflow steps` to see what is available, check a file with
/// `vidflow validate`, then `vidflow run` it. Logging is controlled by VIDFLOW_LOG (for example
/// VIDFLOW_LOG=debug).
#[derive(Debug, Parser)]
#[command(name = "vidflow", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pipeline until its source ends or SIGINT/SIGTERM (a second signal stops at once).
    ///
    /// SIGHUP reads the pipeline file again: if it is valid, changed steps and sinks are swapped
    /// in while unchanged sources keep running; if not, every problem is logged and the running
    /// pipeline goes on.
    ///
    /// Exit codes: 0 clean end, 78 invalid pipeline, 69 source unavailable, 65 a file that
    /// could not be decoded whole (every frame it gave was processed), 73 output cannot be
    /// created, 70 internal error or a step error with on_step_error = "stop".
    Run {
        /// Pipeline file (TOML).
        pipeline: PathBuf,
        /// Stop cleanly after this many frames.
        #[arg(long, value_name = "N")]
        max_frames: Option<u64>,
        /// Write frame and sink counts as JSON to this file on exit.
        #[arg(long, value_name = "PATH")]
        stats_json: Option<PathBuf>,
    },
    /// Check pipeline files; every problem is reported as file:line:column. Exit 0 or 78.
    Validate {
        #[arg(required = true)]
        pipelines: Vec<PathBuf>,
    },
    /// Print the workflow of a pipeline as Graphviz DOT (pipe it into `dot -Tsvg`).
    Graph { pipeline: PathBuf },
    /// List every step and sink kind with its inputs, outputs and parameters.
    ///
    /// With --markdown: the step kinds only, as the tables of docs/reference/steps.md.
    Steps {
        /// Print Markdown tables (docs/reference/steps.md) instead of text.
        #[arg(long)]
        markdown: bool,
    },
    /// List every sink kind with its inputs and parameters.
    Sinks {
        /// Print Markdown tables (docs/reference/sinks.md) instead of text.
        #[arg(long)]
        markdown: bool,
    },
    /// List the keys of a source and of the other tables of a pipeline file ([executor],
    /// [daemon], [storage], [http]).
    Sources {
        /// Print Markdown tables (docs/reference/sources.md) instead of text.
        #[arg(long)]
        markdown: bool,
    },
    /// Print this CPU's vector extensions and each inference engine (opencv, onnxruntime,
    /// openvino) with its version and the precisions it computes in on this machine, or why it
    /// cannot run (not installed). A pipeline's `precision` list takes the first one listed here.
    Engines,
    /// Print the Argon2 hash of a password read from standard input, for [http]
    /// basic_password_hash (e.g. `vidflow hash-password < file`; on a terminal it asks, twice,
    /// without echo). A fresh random salt each time: two hashes of one password differ.
    HashPassword,
}

/// Logging to stderr, filtered by VIDFLOW_LOG (default `info`); plain, with journald priorities,
/// when stderr is the journal (see `cli/logging.rs`). A panic's message is printed with its URLs
/// redacted (`cli/panic.rs`).
pub fn init_logging() {
    panic::install();
    logging::init();
}

/// Runs a parsed command line; returns the exit code.
pub fn main(cli: Cli) -> u8 {
    match cli.command {
        Command::Run {
            pipeline,
            max_frames,
            stats_json,
        } => run(&pipeline, max_frames, stats_json.as_deref()),
        Command::Validate { pipelines } => validate(&pipelines),
        Command::Graph { pipeline } => match config::load(&pipeline) {
            Ok(p) => {
                print!("{}", crate::workflow::graph::dot(&p));
                exit::OK
            }
            Err(e) => config_error(&e),
        },
        Command::Steps { markdown } => {
            print_keys(markdown, reference::steps_markdown, describe_kinds)
        }
        Command::Sinks { markdown } => {
            print_keys(markdown, reference::sinks_markdown, reference::sinks_text)
        }
        Command::Sources { markdown } => print_keys(
            markdown,
            reference::sources_markdown,
            reference::sources_text,
        ),
        Command::Engines => {
            print!("{}", crate::steps::engines_here());
            exit::OK
        }
        Command::HashPassword => password::hash_password(),
    }
}

/// `vidflow steps|sinks|sources [--markdown]`.
fn print_keys(markdown: bool, as_markdown: fn() -> String, as_text: fn() -> String) -> u8 {
    print!("{}", if markdown { as_markdown() } else { as_text() });
    exit::OK
}

fn config_error(e: &ConfigError) -> u8 {
    eprintln!("{e}");
    match e {
        ConfigError::Read { .. } => exit::CONFIG,
        ConfigError::Invalid { problems } => {
            eprintln!("{} problem(s) found", problems.len());
            exit::CONFIG
        }
    }
}

fn run(path: &Path, max_frames: Option<u64>, stats_json: Option<&Path>) -> u8 {
    // Before anything else: a SIGHUP while the file loads must not end the process.
    let shutdown = Shutdown::new();
    let signals = Signals::start(&shutdown);
    let pipeline = match config::load(path) {
        Ok(p) => p,
        Err(e) => {
            if let Some(signals) = signals {
                signals.stop();
            }
            return config_error(&e);
        }
    };
    let options = RunOptions {
        max_frames,
        notify: daemon::NotifyConfig::from_env(),
        ..RunOptions::default()
    };
    let progress = progress::Progress::start(&options.live);
    let outcome = daemon::run(pipeline, &options, &shutdown);
    if let Some(signals) = signals {
        signals.stop();
    }
    let (report, code) = match outcome {
        Ok(report) => (Some(report), exit::OK),
        Err(failure) => {
            for e in &failure.errors {
                tracing::error!("{e:#}");
            }
            {
                let code = failure.exit_code();
                (failure.report.map(|r| *r), code)
            }
        }
    };
    drop(progress);
    if let (Some(path), Some(report)) = (stats_json, report) {
        let written = serde_json::to_vec_pretty(&report)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(path, bytes));
        if let Err(e) = written {
            tracing::error!(path = %path.display(), error = %e, "cannot write stats");
            return if code == exit::OK { exit::IOERR } else { code };
        }
    }
    code
}

/// The signal-handling thread (`vidflow-signals`): SIGINT and SIGTERM ask for a stop (a
/// second one aborts), SIGHUP for a reload. It blocks in signal-hook's iterator until
/// [`Signals::stop`] closes it.
struct Signals {
    handle: signal_hook::iterator::Handle,
    thread: std::thread::JoinHandle<()>,
}

impl Signals {
    fn start(shutdown: &Shutdown) -> Option<Self> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot install signal handlers");
                return None;
            }
        };
        let handle = signals.handle();
        let shutdown = shutdown.clone();
        let thread = std::thread::Builder::new()
            .name("vidflow-signals".to_owned())
            .spawn(move || {
                for signal in signals.forever() {
                    if signal == SIGHUP {
                        shutdown.reload();
                    } else {
                        shutdown.request();
                    }
                }
            });
        match thread {
            Ok(thread) => Some(Self { handle, thread }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the signal thread");
                None
            }
        }
    }

    fn stop(self) {
        self.handle.close();
        let _ = self.thread.join();
    }
}

fn validate(paths: &[PathBuf]) -> u8 {
    let mut problems = 0usize;
    for path in paths {
        // Steps a run would leave out (`config::prune`), said after "ok".
        let mut unread = Vec::new();
        let found = match config::load(path) {
            Ok(p) => {
                for n in &p.notes {
                    let at = format!("{}:{}:{}", n.path.display(), n.line, n.column);
                    eprintln!("{at}: note: {}", n.message);
                }
                unread = p
                    .steps
                    .iter()
                    .zip(p.needed_steps())
                    .filter(|(_, needed)| !needed)
                    .map(|(s, _)| s.name.clone())
                    .collect();
                let missing = p
                    .sources
                    .iter()
                    .filter_map(|s| match &s.uri {
                        crate::source::SourceUri::File { path: file } if !file.is_file() => {
                            Some(format!(
                                "source \"{}\": file \"{}\" not found",
                                s.name,
                                file.display()
                            ))
                        }
                        _ => None,
                    })
                    .collect::<Vec<_>>();
                if !missing.is_empty()
                    && let Ok(text) = config::SourceText::read(path)
                {
                    for (s, message) in p.sources.iter().zip(&missing) {
                        let (line, column) = text.line_column(s.uri_span.start);
                        eprintln!("{}:{line}:{column}: {message}", path.display());
                    }
                }
                missing.len()
            }
            Err(ConfigError::Invalid { problems }) => {
                for p in &problems {
                    eprintln!("{p}");
                }
                problems.len()
            }
            Err(e) => {
                eprintln!("{e}");
                1
            }
        };
        if found == 0 {
            println!("{}: ok", path.display());
            if !unread.is_empty() {
                println!("{}: {}", path.display(), config::pruned_message(&unread));
            }
        }
        problems += found;
    }
    if problems == 0 {
        exit::OK
    } else {
        eprintln!("{problems} problem(s) found");
        exit::CONFIG
    }
}

/// The text of `vidflow steps`: every step kind, then every sink kind.
pub fn describe_kinds() -> String {
    let mut out = reference::steps_text();
    out.push_str(&reference::sinks_text());
    out.push_str(
        "\nREFERENCES\n\n  $frame                 the decoded frame (image)\n  \
         $steps.NAME.OUTPUT     an output of step NAME\n",
    );
    out
}
