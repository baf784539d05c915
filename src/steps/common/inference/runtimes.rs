//! Where the inference runtimes' shared libraries are, and loading each once per process.
//!
//! `scripts/fetch-runtimes` unpacks them from their PyPI wheels into `runtimes/onnxruntime/`
//! and `runtimes/openvino/` (`make install`: `/usr/local/lib/vidflow/runtimes`, which the
//! systemd unit names). vidflow looks in `$VIDFLOW_RUNTIMES_DIR` when it is set, else only in
//! places tied to the binary itself ([`installed_dirs`]): `runtimes/` beside it,
//! `../lib/vidflow/runtimes` (an installed layout), and the repository's `runtimes/` when the
//! binary is in a Cargo build tree (`target/{debug,release}/`, and `deps/` under them for test
//! and bench binaries). Never the working directory: a library found there would be `dlopen`ed,
//! its code run, by anyone who runs `vidflow validate` in a folder someone else filled. Nothing
//! is linked at build time: a machine without them runs OpenCV's DNN, and says so.
//!
//! Of several versions of a library in one folder, the newest is loaded, versions compared
//! number by number (`1.32.0` is newer than `1.9.0`).
//!
//! A library is loaded at most once per process (`dlopen` cannot be undone safely): the first
//! answer, found or not, is kept in a `OnceLock` and every later step gets the same one.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Environment variable naming the folder that holds `onnxruntime/` and `openvino/`.
pub(crate) const RUNTIMES_DIR_VAR: &str = "VIDFLOW_RUNTIMES_DIR";

/// The command that puts the runtimes in place, quoted by every error about them.
pub(super) const FETCH_COMMAND: &str = "scripts/fetch-runtimes (or make setup)";

/// The folder holding the runtimes: `$VIDFLOW_RUNTIMES_DIR`, else the first of
/// [`installed_dirs`] that exists (the first of them, to name in a message, if none does).
pub(super) fn runtimes_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(RUNTIMES_DIR_VAR) {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let places = installed_dirs(&exe);
    places
        .iter()
        .find(|dir| dir.is_dir())
        .or(places.first())
        .cloned()
        .unwrap_or_default()
}

/// Where the runtimes are installed for the binary at `exe` (an absolute path, as
/// `current_exe` gives it): beside it, `../lib/vidflow/runtimes`, and in a Cargo build tree
/// (`REPO/target/PROFILE/vidflow`, `REPO/target/PROFILE/deps/TEST`) `REPO/runtimes`. Every one
/// is absolute; none depends on the working directory.
fn installed_dirs(exe: &Path) -> Vec<PathBuf> {
    let Some(bin) = exe.parent().filter(|b| b.is_absolute()) else {
        return Vec::new();
    };
    let mut dirs = vec![bin.join("runtimes")];
    if let Some(prefix) = bin.parent() {
        dirs.push(prefix.join("lib/vidflow/runtimes"));
    }
    let profile = if bin.file_name().is_some_and(|n| n == "deps") {
        bin.parent()
    } else {
        Some(bin)
    };
    let repo = profile
        .and_then(Path::parent)
        .filter(|target| target.file_name().is_some_and(|n| n == "target"))
        .and_then(Path::parent);
    dirs.extend(repo.map(|repo| repo.join("runtimes")));
    dirs
}

/// The file in `dir` whose name starts with `prefix` (`libonnxruntime.so`, versioned or not).
fn library_in(dir: &Path, prefix: &str) -> Result<PathBuf, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "not installed ({}: {e}); install it with {FETCH_COMMAND}",
            dir.display()
        )
    })?;
    let found = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(prefix))
                .is_some_and(is_version_suffix)
        })
        .max_by(|a, b| newer(&version_of(a, prefix), &version_of(b, prefix)).then(a.cmp(b)));
    found.ok_or_else(|| {
        format!(
            "not installed (no {prefix}* in {}); install it with {FETCH_COMMAND}",
            dir.display()
        )
    })
}

/// The version in a library's file name: `libonnxruntime.so.1.32.0` -> `1.32.0`.
fn version_of(path: &Path, prefix: &str) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(prefix))
        .map(|v| v.trim_start_matches('.'))
        .filter(|v| !v.is_empty())
        .unwrap_or("unknown")
        .to_owned()
}

/// What may follow a library's name: nothing, or a version (`.1.32.0`, `.2641`): not a
/// copy's `.bak` or `_old`.
fn is_version_suffix(rest: &str) -> bool {
    rest.is_empty()
        || rest.strip_prefix('.').is_some_and(|v| {
            v.split('.')
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// How two versions (`1.32.0`, `2641`, `unknown`) compare: number by number, a missing part as
/// less (`1.32` before `1.32.0`), an unversioned library before any version.
fn newer(a: &str, b: &str) -> Ordering {
    let numbers = |v: &str| -> Vec<u64> { v.split('.').map_while(|n| n.parse().ok()).collect() };
    numbers(a).cmp(&numbers(b))
}

/// Runs `f`, turning a panic inside a runtime's bindings into an error.
pub(super) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Err(format!("{what} panicked: {text}"))
    })
}

/// ONNX Runtime, loaded and its environment made (once): its version, or why it cannot run.
pub(super) fn onnxruntime() -> Result<&'static str, &'static str> {
    ort_loaded().map(|(version, _)| version.as_str())
}

/// ONNX Runtime's environment, which every session is made in.
pub(super) fn ort_environment() -> Result<&'static ort::environment::Environment, &'static str> {
    ort_loaded().map(|(_, environment)| environment)
}

fn ort_loaded() -> Result<&'static (String, ort::environment::Environment), &'static str> {
    static LOADED: OnceLock<Result<(String, ort::environment::Environment), String>> =
        OnceLock::new();
    LOADED
        .get_or_init(|| {
            let dir = runtimes_dir().join("onnxruntime");
            let path = library_in(&dir, "libonnxruntime.so")?;
            let version = version_of(&path, "libonnxruntime.so");
            // The environment lives as long as the process: sessions refer to it.
            guarded("loading ONNX Runtime", || {
                let builder = ort::init_from(&path)
                    .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
                let logger: ort::logging::LoggerFunction = std::sync::Arc::new(log_from_ort);
                let environment = builder
                    .with_name("vidflow")
                    .with_telemetry(false)
                    .with_logger(logger)
                    .build()
                    .map_err(|e| format!("cannot start ONNX Runtime {version}: {e}"))?;
                Ok((version, environment))
            })
        })
        .as_ref()
        .map_err(String::as_str)
}

/// ONNX Runtime's log function, called from C++ (through `ort`'s `extern "system"` trampoline,
/// which does not catch a panic): a panic here is caught, so that it cannot abort the process.
fn log_from_ort(
    level: ort::logging::LogLevel,
    category: &str,
    _id: &str,
    code_location: &str,
    message: &str,
) {
    use ort::logging::LogLevel;
    let _ = std::panic::catch_unwind(|| match level {
        LogLevel::Verbose | LogLevel::Info => tracing::trace!(
            target: "onnxruntime", category, code_location, "{message}"
        ),
        LogLevel::Warning => tracing::warn!(
            target: "onnxruntime", category, code_location, "{message}"
        ),
        LogLevel::Error | LogLevel::Fatal => tracing::error!(
            target: "onnxruntime", category, code_location, "{message}"
        ),
    });
}

/// OpenVINO's C library, loaded (once): its version, or why it cannot run.
pub(super) fn openvino() -> Result<&'static str, &'static str> {
    static LOADED: OnceLock<Result<String, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let dir = runtimes_dir().join("openvino");
            let path = library_in(&dir, "libopenvino_c.so")?;
            guarded("loading OpenVINO", || {
                openvino_sys::library::load_from(path.clone())
                    .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
                Ok(openvino::version().build_number)
            })
        })
        .as_ref()
        .map(String::as_str)
        .map_err(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_read_from_the_library_file_name() {
        let p = Path::new("/x/libonnxruntime.so.1.32.0");
        assert_eq!(version_of(p, "libonnxruntime.so"), "1.32.0");
        assert_eq!(
            version_of(Path::new("libonnxruntime.so"), "libonnxruntime.so"),
            "unknown"
        );
    }

    #[test]
    fn a_missing_folder_names_the_install_command() {
        let dir = tempfile::tempdir().unwrap();
        let e = library_in(&dir.path().join("nothing"), "libopenvino_c.so").unwrap_err();
        assert!(
            e.contains("not installed") && e.contains(FETCH_COMMAND),
            "{e}"
        );
        let e = library_in(dir.path(), "libopenvino_c.so").unwrap_err();
        assert!(e.contains("no libopenvino_c.so*"), "{e}");
        std::fs::write(dir.path().join("libopenvino_c.so.2641"), "").unwrap();
        assert!(library_in(dir.path(), "libopenvino_c.so").is_ok());
    }

    #[test]
    fn the_newest_version_is_loaded_compared_number_by_number() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "libonnxruntime.so",
            "libonnxruntime.so.1.9.0",
            "libonnxruntime.so.1.32.0",
            "libonnxruntime.so.1.4.12",
            "libonnxruntime.so.1.33.0.bak",
            "libonnxruntime.so.2.x",
            "libonnxruntime.so_copy",
            "libonnxruntime_providers_shared.so",
        ] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let found = library_in(dir.path(), "libonnxruntime.so").unwrap();
        assert_eq!(found.file_name().unwrap(), "libonnxruntime.so.1.32.0");
        std::fs::remove_file(&found).unwrap();
        let found = library_in(dir.path(), "libonnxruntime.so").unwrap();
        assert_eq!(found.file_name().unwrap(), "libonnxruntime.so.1.9.0");
        assert_eq!(newer("1.9.0", "1.32.0"), Ordering::Less);
        assert_eq!(newer("2641", "999"), Ordering::Greater);
        assert_eq!(newer("1.32", "1.32.0"), Ordering::Less);
        assert_eq!(newer("unknown", "0.1"), Ordering::Less);
    }

    #[test]
    fn runtimes_are_looked_for_only_beside_the_binary_never_in_the_working_directory() {
        let dirs = |exe: &str| -> Vec<String> {
            installed_dirs(Path::new(exe))
                .iter()
                .map(|d| d.to_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            dirs("/usr/local/bin/vidflow"),
            ["/usr/local/bin/runtimes", "/usr/local/lib/vidflow/runtimes"]
        );
        assert_eq!(
            dirs("/src/vidflow/target/release/vidflow"),
            [
                "/src/vidflow/target/release/runtimes",
                "/src/vidflow/target/lib/vidflow/runtimes",
                "/src/vidflow/runtimes"
            ]
        );
        assert_eq!(
            dirs("/src/vidflow/target/debug/deps/backends-0a1b2c"),
            [
                "/src/vidflow/target/debug/deps/runtimes",
                "/src/vidflow/target/debug/lib/vidflow/runtimes",
                "/src/vidflow/runtimes"
            ]
        );
        assert!(dirs("vidflow").is_empty());
        assert!(dirs("bin/vidflow").is_empty());
        // With no variable set, the folder found is one of these: this test binary's own
        // build tree, whatever the working directory holds.
        if std::env::var_os(RUNTIMES_DIR_VAR).is_none() {
            let exe = std::env::current_exe().unwrap();
            assert!(installed_dirs(&exe).contains(&runtimes_dir()));
        }
    }

    #[test]
    fn a_panic_in_a_binding_is_an_error() {
        let r: Result<(), String> = guarded("x", || panic!("boom"));
        assert_eq!(r.unwrap_err(), "x panicked: boom");
    }
}
