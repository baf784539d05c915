//! Where the inference runtimes' shared libraries are, and loading each once per process.
//!
//! `scripts/fetch-runtimes` unpacks them from their PyPI wheels into `runtimes/onnxruntime/`
//! and `runtimes/openvino/` (`make install`: `/usr/local/lib/vidflow/runtimes`, which the
//! systemd unit names). vidflow looks in `$VIDFLOW_RUNTIMES_DIR`, else `runtimes` (relative to
//! the working directory, like `models`). Nothing is linked at build time: a machine without
//! them runs OpenCV's DNN, and says so.
//!
//! A library is loaded at most once per process (`dlopen` cannot be undone safely): the first
//! answer, found or not, is kept in a `OnceLock` and every later step gets the same one.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Environment variable naming the folder that holds `onnxruntime/` and `openvino/`.
pub(crate) const RUNTIMES_DIR_VAR: &str = "VIDFLOW_RUNTIMES_DIR";

/// The command that puts the runtimes in place, quoted by every error about them.
pub(super) const FETCH_COMMAND: &str = "scripts/fetch-runtimes (or make setup)";

/// The folder holding the runtimes.
pub(super) fn runtimes_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(RUNTIMES_DIR_VAR) {
        return PathBuf::from(dir);
    }
    let beside_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .map(|bin| {
            [
                bin.join("../lib/vidflow/runtimes"),
                bin.join("../../runtimes"),
            ]
        });
    std::iter::once(PathBuf::from("runtimes"))
        .chain(beside_exe.into_iter().flatten())
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| PathBuf::from("runtimes"))
}

/// The file in `dir` whose name starts with `prefix` (`libonnxruntime.so`, versioned or not).
fn library_in(dir: &Path, prefix: &str) -> Result<PathBuf, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "not installed ({}: {e}); install it with {FETCH_COMMAND}",
            dir.display()
        )
    })?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    found.sort();
    found.pop().ok_or_else(|| {
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
                let logger: ort::logging::LoggerFunction =
                    std::sync::Arc::new(|level, category, _id, code_location, message| {
                        use ort::logging::LogLevel;
                        match level {
                            LogLevel::Verbose | LogLevel::Info => tracing::trace!(
                                target: "onnxruntime", category, code_location, "{message}"
                            ),
                            LogLevel::Warning => tracing::warn!(
                                target: "onnxruntime", category, code_location, "{message}"
                            ),
                            LogLevel::Error | LogLevel::Fatal => tracing::error!(
                                target: "onnxruntime", category, code_location, "{message}"
                            ),
                        }
                    });
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
    fn a_panic_in_a_binding_is_an_error() {
        let r: Result<(), String> = guarded("x", || panic!("boom"));
        assert_eq!(r.unwrap_err(), "x panicked: boom");
    }
}
