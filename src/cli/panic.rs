//! What a panic prints: the default hook's line, with every URL in it redacted.
//!
//! A panic's message can quote a source or broker address (a formatted `expect`, a library's
//! assertion on a URL it was given), and the default hook writes it to stderr, the journal,
//! verbatim. [`install`] replaces that hook with one that passes the message through
//! [`redact_all`] first; the backtrace, when `RUST_BACKTRACE` asks for one, is printed as the
//! default hook would (frames hold no user text). No thread of its own: the hook runs on the
//! panicking thread.

use std::backtrace::{Backtrace, BacktraceStatus};
use std::io::Write;
use std::panic::PanicHookInfo;

use crate::spec::redact_all;

/// Installs the redacting hook; call once, first thing.
pub(super) fn install() {
    std::panic::set_hook(Box::new(|info| {
        let line = describe(info);
        let backtrace = Backtrace::capture();
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "{line}");
        if backtrace.status() == BacktraceStatus::Captured {
            let _ = writeln!(stderr, "stack backtrace:\n{backtrace}");
        }
    }));
}

/// `thread 'NAME' panicked at FILE:LINE:COLUMN:\nMESSAGE`, as the default hook words it, with
/// the message's URLs redacted.
fn describe(info: &PanicHookInfo<'_>) -> String {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("<unnamed>");
    let message =
        crate::spec::panic_text(info.payload()).unwrap_or_else(|| "Box<dyn Any>".to_owned());
    let at = info
        .location()
        .map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column()))
        .unwrap_or_default();
    format!("thread '{name}' panicked{at}:\n{}", redact_all(&message))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::describe;

    #[test]
    fn a_panic_message_never_shows_a_password() {
        // A temporary hook that keeps what `describe` makes of this thread's panic; panics of
        // tests running beside this one on other threads are left to the previous hook.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let previous = std::panic::take_hook();
        let keep = Arc::clone(&seen);
        let me = std::thread::current().id();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().id() == me {
                keep.lock().map(|mut s| s.push(describe(info))).ok();
            }
        }));
        let uri = "rtsp://admin:s3cr%C3%A9t@cam.local/stream";
        let _ = std::panic::catch_unwind(|| panic!("cannot open {uri}: refused"));
        let _ = std::panic::catch_unwind(|| std::panic::panic_any("mqtt://u:pw2@broker:1883"));
        std::panic::set_hook(previous);
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(
            seen[0].contains("rtsp://admin:***@cam.local/stream: refused"),
            "{seen:?}"
        );
        assert!(seen[0].contains("src/cli/panic.rs:"), "{seen:?}");
        assert!(seen[1].ends_with("mqtt://u:***@broker:1883"), "{seen:?}");
        assert!(
            seen.iter()
                .all(|s| !s.contains("s3cr") && !s.contains("pw2")),
            "{seen:?}"
        );
    }
}
