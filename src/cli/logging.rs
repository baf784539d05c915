//! Logging to stderr with tracing-subscriber, filtered by `VIDFLOW_LOG` (default `info`).
//!
//! When stderr is the journal, lines carry no colours and no timestamps (journald stamps each
//! entry) and every line starts with the sd-daemon priority of its level (`<3>` error, `<4>`
//! warn, `<6>` info, `<7>` debug and trace), which journald takes as the entry's priority
//! (`SyslogLevelPrefix=yes`, its default): `journalctl -p warning` then shows warnings and
//! errors only. stderr is the journal when `JOURNAL_STREAM` (`DEVICE:INODE`, set by systemd)
//! names the file that fd 2 is; the variable alone says nothing, as children inherit it whatever
//! their stderr is (systemd.exec(5)).
//!
//! GStreamer's own messages come as events of target `gstreamer` (see `gst_setup/log.rs`); when
//! `GST_DEBUG` is set they all pass, at any level.
//!
//! No thread of its own: an event is formatted and written on the thread that logs it, in one
//! write, through the progress bars when they are drawn (see `progress.rs`).

use std::fmt;
use std::io::IsTerminal;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::gst_setup::LOG_TARGET;

/// Installs the global subscriber; call once, first thing.
pub(super) fn init() {
    let filter = quiet_nats_client(with_gst_debug(
        tracing_subscriber::EnvFilter::try_from_env("VIDFLOW_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    ));
    let journal = stderr_is_journal();
    let terminal = !journal && std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(super::progress::LogWriter)
        .with_ansi(terminal);
    let format = tracing_subscriber::fmt::format().with_target(false);
    if journal {
        builder
            .event_format(JournalPriority(format.without_time()))
            .init();
    } else {
        builder.event_format(format).init();
    }
}

/// With `GST_DEBUG` set, GStreamer logs what it asks for, at whatever level: let it all through,
/// unless `VIDFLOW_LOG` says what to do with GStreamer's lines itself.
fn with_gst_debug(filter: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    let asked = std::env::var_os("GST_DEBUG").is_some_and(|v| !v.is_empty());
    let decided = std::env::var("VIDFLOW_LOG").is_ok_and(|v| v.contains(LOG_TARGET));
    match format!("{LOG_TARGET}=trace").parse() {
        Ok(directive) if asked && !decided => filter.add_directive(directive),
        _ => filter,
    }
}

/// The `nats` sink's client (async-nats) logs each connect and close at info: the sink says
/// what matters once per outage itself. Its warnings stay, unless `VIDFLOW_LOG` names it.
fn quiet_nats_client(filter: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    let decided = std::env::var("VIDFLOW_LOG").is_ok_and(|v| v.contains("async_nats"));
    match "async_nats=warn".parse() {
        Ok(directive) if !decided => filter.add_directive(directive),
        _ => filter,
    }
}

/// Whether fd 2 is the stream that `JOURNAL_STREAM` names.
fn stderr_is_journal() -> bool {
    let named = std::env::var("JOURNAL_STREAM")
        .ok()
        .and_then(|v| parse_journal_stream(&v));
    named.is_some_and(|named| stderr_device_inode().is_some_and(|fd2| fd2 == named))
}

/// `DEVICE:INODE`, both decimal, as systemd writes them.
fn parse_journal_stream(value: &str) -> Option<(u64, u64)> {
    let (device, inode) = value.split_once(':')?;
    Some((device.parse().ok()?, inode.parse().ok()?))
}

fn stderr_device_inode() -> Option<(u64, u64)> {
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::MetadataExt as _;
    let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let metadata = std::fs::File::from(fd).metadata().ok()?;
    Some((metadata.dev(), metadata.ino()))
}

/// The sd-daemon priority of a level (sd-daemon(3)): syslog's err, warning, info and debug.
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// Formats an event with `F`, then starts each of its lines with the priority of the event's
/// level: journald makes an entry of every line, and a continuation line without the prefix
/// (a GStreamer debug string holds newlines) would be logged at the default priority, info.
#[derive(Debug)]
struct JournalPriority<F>(F);

impl<S, N, F> FormatEvent<S, N> for JournalPriority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut text = String::new();
        self.0.format_event(ctx, Writer::new(&mut text), event)?;
        let priority = priority(*event.metadata().level());
        // The level is right-aligned (" INFO"): no space between the prefix and the message.
        for line in text.trim_start().lines() {
            writeln!(writer, "<{priority}>{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_is_device_colon_inode() {
        assert_eq!(parse_journal_stream("8:1234"), Some((8, 1234)));
        assert_eq!(parse_journal_stream("8"), None);
        assert_eq!(parse_journal_stream("8:x"), None);
        assert_eq!(parse_journal_stream(""), None);
    }

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(
            [
                Level::ERROR,
                Level::WARN,
                Level::INFO,
                Level::DEBUG,
                Level::TRACE
            ]
            .map(priority),
            [3, 4, 6, 7, 7]
        );
    }
}
