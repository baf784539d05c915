//! Names that never overwrite: a sink's new file takes the name its settings give, or that
//! name with the first counter that names no file yet. Two styles, as each kind's users know
//! them: a file that goes on in numbered parts (`video_file`, `record`, `jsonl`: `a.mp4`,
//! `a.1.mp4`, `a.2.mp4`) and another file of the same moment (`clip`, `snapshot`: `a.mp4`,
//! `a-1.mp4`, `a-2.mp4`).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::sinks::SinkError;

/// Where the counter goes in a name (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::sinks) enum Counter {
    /// `a.1.mp4`: the next part of one recording.
    Dot,
    /// `a-1.mp4`: another file of the same name's moment.
    Dash,
}

/// `base` with counter `n` in `style` (`base` itself for 0).
pub(in crate::sinks) fn numbered(base: &Path, n: u32, style: Counter) -> PathBuf {
    if n == 0 {
        return base.to_owned();
    }
    let stem = base.file_stem().map(|s| s.to_string_lossy().into_owned());
    let name = match (stem, base.extension(), style) {
        (Some(stem), Some(ext), Counter::Dot) => format!("{stem}.{n}.{}", ext.to_string_lossy()),
        (Some(stem), Some(ext), Counter::Dash) => format!("{stem}-{n}.{}", ext.to_string_lossy()),
        (Some(stem), None, Counter::Dot) => format!("{stem}.{n}"),
        (Some(stem), None, Counter::Dash) => format!("{stem}-{n}"),
        (None, ..) => format!("{n}"),
    };
    base.with_file_name(name)
}

/// The first name of `base` numbered from `from` on that names nothing yet, and its counter,
/// taken at once: the file is created empty with `O_EXCL` (as [`create_new`] does), so a file
/// made meanwhile by someone else (a user, another vidflow) is never the one this sink writes,
/// and two names asked one after the other are two names. The writer (GStreamer's `filesink`,
/// the JSONL file) then opens the empty file it owns. Where no file can be made there (a folder
/// missing, no permission), the name is given untaken and the writer that opens it says why.
pub(in crate::sinks) fn first_free(base: &Path, from: u32, style: Counter) -> (PathBuf, u32) {
    match take(base, from, style) {
        Ok((_, path, n)) => (path, n),
        Err((path, n, _)) => (path, n),
    }
}

/// Creates a new file at `base`, or at the first numbered name that names nothing: atomically
/// (`O_EXCL`), so that a file made meanwhile by someone else is never taken over.
pub(in crate::sinks) fn create_new(
    base: &Path,
    style: Counter,
) -> Result<(File, PathBuf), SinkError> {
    match take(base, 0, style) {
        Ok((file, path, _)) => Ok((file, path)),
        Err((path, _, Some(source))) => Err(SinkError::Io { path, source }),
        Err((_, _, None)) => Err(SinkError::Other(format!(
            "no free name for \"{}\": every counter is taken",
            base.display()
        ))),
    }
}

/// A name taken: the new empty file, its name and its counter.
type Taken = (File, PathBuf, u32);
/// A name not taken: where it stopped, its counter, and why (`None`: every counter is taken).
type NotTaken = (PathBuf, u32, Option<std::io::Error>);

/// Creates the first numbered name of `base` from `from` on that names nothing (`O_EXCL`).
fn take(base: &Path, from: u32, style: Counter) -> Result<Taken, NotTaken> {
    let mut n = from;
    loop {
        let candidate = numbered(base, n, style);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(file) => return Ok((file, candidate, n)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if n == u32::MAX {
                    return Err((candidate, n, None));
                }
                n += 1;
            }
            Err(e) => return Err((candidate, n, Some(e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_go_before_the_extension_in_either_style() {
        let base = Path::new("out/cam-20261201T061500.123Z.mp4");
        assert_eq!(numbered(base, 0, Counter::Dot), base);
        assert_eq!(
            numbered(base, 2, Counter::Dot),
            Path::new("out/cam-20261201T061500.123Z.2.mp4")
        );
        assert_eq!(
            numbered(base, 2, Counter::Dash),
            Path::new("out/cam-20261201T061500.123Z-2.mp4")
        );
        assert_eq!(
            numbered(Path::new("log"), 1, Counter::Dot),
            Path::new("log.1")
        );
    }

    #[test]
    fn a_taken_name_gets_the_first_free_counter_and_nothing_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("a.mp4");
        std::fs::write(&base, "a user's").unwrap();
        std::fs::write(dir.path().join("a.1.mp4"), "old").unwrap();
        assert_eq!(
            first_free(&base, 0, Counter::Dot),
            (dir.path().join("a.2.mp4"), 2)
        );
        // Taken at once: asked again, the next name, and the first is there, empty.
        assert_eq!(
            first_free(&base, 0, Counter::Dot),
            (dir.path().join("a.3.mp4"), 3)
        );
        assert_eq!(std::fs::read(dir.path().join("a.2.mp4")).unwrap(), b"");
        let (_, made) = create_new(&base, Counter::Dash).unwrap();
        assert_eq!(made, dir.path().join("a-1.mp4"));
        let (_, next) = create_new(&base, Counter::Dash).unwrap();
        assert_eq!(next, dir.path().join("a-2.mp4"));
        assert_eq!(std::fs::read(&base).unwrap(), b"a user's");
    }
}
