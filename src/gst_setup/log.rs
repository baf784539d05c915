//! GStreamer's debug log, routed into vidflow's: each message GStreamer logs becomes a tracing
//! event of target [`TARGET`] with the fields `gst_category`, `gst_object` (the element or pad,
//! when there is one) and `gst_at` (its C file and line), so that it has vidflow's format and,
//! under the journal, its priority; a password in a URL it quotes is redacted. GStreamer's own
//! printer to stderr is removed.
//!
//! What GStreamer logs: WARNING and ERROR, unless `GST_DEBUG` is set; then what it asks for, as
//! GStreamer reads it in `gst::init` (`cli/logging.rs` lets target `gstreamer` through at every
//! level then, so that `GST_DEBUG=2,rtspsrc:6` shows rtspsrc's debug lines).
//!
//! Levels. The bus is vidflow's error channel: an error that matters reaches it as a bus message,
//! which the source turns into its own error, logged at the level the outcome deserves (a run that
//! fails: error; a camera that is retried: one warning). GStreamer's lines are the detail:
//! - ERROR is logged as a warning: it is GStreamer's view (an element failed), not vidflow's (a
//!   camera that restarts is retried); at priority 3 every camera restart would be in
//!   `journalctl -p err`.
//! - WARNING is a warning, except lines that say nothing vidflow does not say itself, logged at
//!   debug: the line an element logs as it posts an error on the bus (`error: ...`, the text of
//!   that bus error, which vidflow reports), what rtspsrc logs as a failed connection unwinds or
//!   as a stop interrupts its request, and the warning every source start gives
//!   ([`NOTHING_NEW`]). A bus *warning* is logged only here (`warning: ...`: the source does not
//!   read bus warnings), as a warning.
//! - FIXME (GStreamer's unfinished paths) is debug; INFO info; DEBUG debug; LOG, TRACE, MEMDUMP
//!   trace.
//!
//! Repeats. A camera that is down fails the same way at every retry, the same lines after every
//! backoff delay, all night. A line logged as a warning is logged so once per call site and
//! text for [`REPEAT_QUIET`]; the same again in that time is logged at debug, and the first
//! warning of that call site after it carries `repeated=N`, how many were. At most
//! [`TEXTS_PER_SITE`] texts are told apart per call site (a text that counts up is one storm).
//!
//! Threads: none of its own. GStreamer calls [`log`] on the thread that logs (streaming threads,
//! rtspsrc's task, a supervisor in `set_state`); only a line logged as a warning takes the
//! `REPEATS` lock, for one map look-up.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer::glib;
use tracing::Level;
use tracing::level_filters::LevelFilter;

/// The tracing target of GStreamer's messages.
pub const TARGET: &str = "gstreamer";

/// How long a GStreamer warning, once logged, is logged at debug level when it comes again: a
/// camera down for a night (a retry every 30 s at most) says why a few times an hour.
const REPEAT_QUIET: Duration = Duration::from_secs(600);

/// Texts told apart per call site in one quiet period; more are repeats.
const TEXTS_PER_SITE: usize = 4;

/// Call sites remembered; past that the table starts again (GStreamer's warnings come from a
/// few dozen places: only a guard).
const MAX_SITES: usize = 512;

static REPEATS: LazyLock<Mutex<Repeats>> = LazyLock::new(Mutex::default);

/// Adds vidflow's log function and removes GStreamer's default one, which prints to stderr.
/// Before `gst::init`, GStreamer then never installs it; after, it is removed.
pub(super) fn route() {
    // Installed for the life of the process: the handle to remove it is not needed.
    let _ = gst::log::add_log_function(log);
    gst::log::remove_default_log_function();
}

/// WARNING and ERROR, unless the user's `GST_DEBUG` (read by `gst::init`) says otherwise.
pub(super) fn set_threshold() {
    if std::env::var_os("GST_DEBUG").is_none_or(|v| v.is_empty()) {
        gst::log::set_default_threshold(gst::DebugLevel::Warning);
    }
}

/// GStreamer's log function (see the module docs), called from C: a panic in it is caught
/// ([`super::from_c`]) and the line lost, rather than the process aborted.
fn log(
    category: gst::DebugCategory,
    level: gst::DebugLevel,
    file: &glib::GStr,
    function: &glib::GStr,
    line: u32,
    object: Option<&gst::log::LoggedObject>,
    message: &gst::DebugMessage,
) {
    super::from_c("log", (), || {
        log_line(category, level, file, function, line, object, message);
    });
}

/// One line of GStreamer's log, as [`log`] takes it.
fn log_line(
    category: gst::DebugCategory,
    level: gst::DebugLevel,
    file: &glib::GStr,
    _function: &glib::GStr,
    line: u32,
    object: Option<&gst::log::LoggedObject>,
    message: &gst::DebugMessage,
) {
    let Some(text) = message.get() else {
        return;
    };
    let category = category.name();
    let Some(mut level) = level_of(level, category, &text) else {
        return;
    };
    if level > LevelFilter::current() {
        return;
    }
    let file = file.rsplit('/').next().unwrap_or_default();
    let mut repeated = None;
    if level == Level::WARN {
        let site = key(&(category, file, line));
        let admitted = REPEATS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(site, key(&*text), Instant::now());
        match admitted {
            Admit::Loud { repeated: 0 } => {}
            Admit::Loud { repeated: n } => repeated = Some(n),
            Admit::Quiet if Level::DEBUG > LevelFilter::current() => return,
            Admit::Quiet => level = Level::DEBUG,
        }
    }
    // A URL GStreamer quotes may carry a password.
    let text = crate::spec::redact_all(text.strip_prefix("warning: ").unwrap_or(&text));
    let object = object.map(ToString::to_string);
    let at = format!("{file}:{line}");
    macro_rules! at_level {
        ($($level:ident)+) => {
            match level {
                $(Level::$level => tracing::event!(
                    target: TARGET,
                    Level::$level,
                    gst_category = category,
                    gst_object = object,
                    gst_at = at,
                    repeated,
                    "{text}"
                ),)+
            }
        };
    }
    at_level!(ERROR WARN INFO DEBUG TRACE);
}

/// The level a GStreamer message is logged at; `None` for none.
fn level_of(level: gst::DebugLevel, category: &str, text: &str) -> Option<Level> {
    use gst::DebugLevel as L;
    Some(match level {
        L::Error | L::Warning if text.starts_with("error: ") || restates(category, text) => {
            Level::DEBUG
        }
        L::Error | L::Warning => Level::WARN,
        L::Fixme | L::Debug => Level::DEBUG,
        L::Info => Level::INFO,
        L::Log | L::Trace | L::Memdump => Level::TRACE,
        _ => return None,
    })
}

/// GStreamer's warnings that say nothing vidflow does not, seen in its runs: (category, start
/// of the text).
const NOTHING_NEW: &[(&str, &str)] = &[
    // Every source: basesrc started before decodebin activated its pad; nothing goes wrong.
    ("basesrc", "pad not activated yet"),
    // rtspsrc unwinding a refused connection: the cause is the line before it, `failed to
    // connect: ...: Connection refused` (category `default`, kept); the bus error and vidflow's
    // "cannot connect; retrying" say the rest.
    ("rtspsrc", "Could not connect to server"),
    ("rtspsrc", "can't get sdp"),
    ("rtspsrc", "failed to open stream"),
    ("rtspsrc", "we are not connected"),
];

/// Whether a GStreamer warning or error says nothing new (see [`NOTHING_NEW`]); rtspsrc's
/// `receive interrupted`, `PAUSE interrupted` and the like are what every stop of an RTSP source
/// does to its pending request.
fn restates(category: &str, text: &str) -> bool {
    NOTHING_NEW
        .iter()
        .any(|&(c, start)| c == category && text.starts_with(start))
        || (category == "rtspsrc" && text.ends_with(" interrupted"))
}

fn key(value: &(impl Hash + ?Sized)) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The warnings logged lately, per call site (see the module docs).
#[derive(Debug, Default)]
struct Repeats {
    sites: HashMap<u64, Site>,
}

#[derive(Debug)]
struct Site {
    /// When this quiet period started: the first warning logged from the site in it.
    since: Instant,
    /// The texts logged as warnings in this period.
    texts: Vec<u64>,
    /// Lines logged at debug instead since the last warning from this site.
    quieted: u64,
}

#[derive(Debug, PartialEq, Eq)]
enum Admit {
    /// Log it as a warning; `repeated` lines from this site were quieted since the last.
    Loud { repeated: u64 },
    /// A repeat: log it at debug.
    Quiet,
}

impl Repeats {
    fn admit(&mut self, site: u64, text: u64, now: Instant) -> Admit {
        if self.sites.len() >= MAX_SITES && !self.sites.contains_key(&site) {
            self.sites.clear();
        }
        let site = self.sites.entry(site).or_insert_with(|| Site {
            since: now,
            texts: Vec::new(),
            quieted: 0,
        });
        if now.saturating_duration_since(site.since) >= REPEAT_QUIET {
            site.since = now;
            site.texts.clear();
        }
        if site.texts.contains(&text) || site.texts.len() >= TEXTS_PER_SITE {
            site.quieted += 1;
            return Admit::Quiet;
        }
        site.texts.push(text);
        Admit::Loud {
            repeated: std::mem::take(&mut site.quieted),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_again_within_the_quiet_period_is_quiet_and_counted_after_it() {
        let mut repeats = Repeats::default();
        let t0 = Instant::now();
        assert_eq!(repeats.admit(1, 10, t0), Admit::Loud { repeated: 0 });
        assert_eq!(repeats.admit(1, 10, t0), Admit::Quiet);
        // Another text from the same place, and the same text from another place, are news.
        assert_eq!(repeats.admit(1, 11, t0), Admit::Loud { repeated: 1 });
        assert_eq!(repeats.admit(2, 10, t0), Admit::Loud { repeated: 0 });
        assert_eq!(repeats.admit(1, 10, t0 + REPEAT_QUIET / 2), Admit::Quiet);
        assert_eq!(repeats.admit(1, 11, t0 + REPEAT_QUIET / 2), Admit::Quiet);
        assert_eq!(
            repeats.admit(1, 10, t0 + REPEAT_QUIET),
            Admit::Loud { repeated: 2 }
        );
    }

    #[test]
    fn a_site_with_ever_new_texts_is_quiet_past_a_few() {
        let mut repeats = Repeats::default();
        let t0 = Instant::now();
        let loud = (0..10)
            .filter(|&n| repeats.admit(1, n, t0) != Admit::Quiet)
            .count();
        assert_eq!(loud, TEXTS_PER_SITE);
    }

    #[test]
    fn gstreamer_errors_are_warnings_and_restated_errors_are_debug() {
        use gst::DebugLevel as L;
        let refused = "failed to connect: Could not connect to 127.0.0.1: Connection refused";
        assert_eq!(level_of(L::Error, "default", refused), Some(Level::WARN));
        assert_eq!(
            level_of(
                L::Warning,
                "rtspsrc",
                "warning: The server closed the connection."
            ),
            Some(Level::WARN)
        );
        for (level, text) in [
            (L::Error, "Could not connect to server. (Generic error)"),
            (L::Warning, "error: Failed to connect. (Generic error)"),
            (L::Warning, "can't get sdp"),
            (L::Warning, "we are not connected"),
            (L::Warning, "PAUSE interrupted"),
        ] {
            assert_eq!(
                level_of(level, "rtspsrc", text),
                Some(Level::DEBUG),
                "{text}"
            );
        }
        // Only rtspsrc's: another element saying so is news.
        assert_eq!(
            level_of(L::Warning, "souphttpsrc", "receive interrupted"),
            Some(Level::WARN)
        );
        assert_eq!(level_of(L::Info, "GST_STATES", "x"), Some(Level::INFO));
        assert_eq!(level_of(L::Memdump, "x", "x"), Some(Level::TRACE));
        assert_eq!(level_of(L::None, "x", "x"), None);
    }
}
