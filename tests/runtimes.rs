//! Where the real binary loads the inference runtimes' libraries from: `$VIDFLOW_RUNTIMES_DIR`
//! when set, else only places tied to the binary (beside it, `../lib/vidflow/runtimes`, its
//! build tree's `runtimes/`), never the working directory, where whoever filled the folder
//! could have a library `dlopen`ed, its code run, by a `vidflow validate` there. The library
//! planted here is not ELF: loading it fails loudly, so a test sees whether it was tried.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;

use common::vision::{RUN_DEADLINE, models_dir};
use common::{Finished, spawn_command, vidflow, write};

/// A detector on ONNX Runtime: `validate` loads the library and reads the model with it.
const PIPELINE: &str = r#"
[sources.clip]
uri = "test://ball?width=320&height=240&frames=1"

[steps.detect]
kind = "object_detection"
image = "$frame"
backend = "onnxruntime"
"#;

/// A folder with `runtimes/onnxruntime/` holding a "library" newer than any real one.
fn planted(dir: &Path) -> std::path::PathBuf {
    let folder = dir.join("runtimes/onnxruntime");
    std::fs::create_dir_all(&folder).unwrap();
    let library = folder.join("libonnxruntime.so.99.0.0");
    std::fs::write(&library, "not a library: whoever wrote this could run code").unwrap();
    library
}

/// `vidflow validate` of [`PIPELINE`] in `dir`, the runtimes variable set to `runtimes` or not.
fn validate(dir: &Path, runtimes: Option<&Path>) -> Finished {
    let p = write(dir, "p.toml", PIPELINE);
    let mut command = vidflow();
    command
        .args(["validate", p.to_str().unwrap()])
        .env("VIDFLOW_MODELS_DIR", models_dir())
        .env_remove("VIDFLOW_RUNTIMES_DIR");
    if let Some(runtimes) = runtimes {
        command.env("VIDFLOW_RUNTIMES_DIR", runtimes);
    }
    spawn_command(dir, command).finish(RUN_DEADLINE)
}

#[test]
fn a_runtimes_folder_in_the_working_directory_is_never_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let library = planted(dir.path());
    // Found beside the binary (target/debug/vidflow: the repository's runtimes/).
    let out = validate(dir.path(), None);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(!out.stderr.contains("99.0.0"), "{}", out.stderr);

    // The same folder named by the variable is the user's choice, and is loaded (and fails,
    // naming the file): what the test plants is seen when it is tried.
    let out = validate(dir.path(), Some(&dir.path().join("runtimes")));
    assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("cannot load {}", library.display())),
        "{}",
        out.stderr
    );
}
