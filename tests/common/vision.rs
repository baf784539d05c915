//! Real detectors on real video: reference boxes (tests/fixtures/vision), runs of the real
//! binary that write the detections as JSON lines, and how many reference boxes they found.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use vidflow::value::BBox;

use super::{jsonl, repo_root, spawn, write};

/// A detection matches a reference box when they overlap this much (IoU).
pub const MATCH_IOU: f32 = 0.5;
/// Share of the reference boxes that must be matched.
pub const MIN_RECALL: f64 = 0.85;
/// Only a guard against a hang: a few dozen frames of a small network on a busy machine.
pub const RUN_DEADLINE: Duration = Duration::from_secs(300);

pub fn models_dir() -> PathBuf {
    repo_root().join("models")
}

/// What `vidflow engines` says this machine runs: its lines, once a test binary.
fn engines_here() -> &'static str {
    static HERE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HERE.get_or_init(|| {
        let out = super::vidflow().arg("engines").output().unwrap();
        assert!(out.status.success(), "vidflow engines: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    })
}

/// Whether `backend` computes in `precision` on this CPU, as `vidflow engines` lists it
/// (bf16: AMX or AVX-512 BF16; not on an AVX2-only CPU, or under `scripts/cpu-as avx2`).
pub fn runs_here(backend: &str, precision: &str) -> bool {
    engines_here().lines().any(|line| {
        line.strip_prefix(backend)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|rest| rest.split_once(": "))
            .is_some_and(|(_, list)| list.split(' ').any(|p| p == precision))
    })
}

/// The environment that makes a `vidflow` process (and every library it loads) see a CPU with
/// AVX2 only: no AVX-512, VNNI, bf16 or AMX (scripts/cpu-as, which builds its library into
/// target/cpu-as/). `None` where this machine cannot hide them (its CPU cannot make cpuid
/// fault), said on stderr.
pub fn avx2_only() -> Option<Vec<(&'static str, String)>> {
    static ENV: std::sync::OnceLock<Option<Vec<(&'static str, String)>>> =
        std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let script = repo_root().join("scripts/cpu-as");
        let out = std::process::Command::new(&script)
            .args(["--check", "avx2"])
            .output()
            .unwrap();
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr);
            // Only a machine whose CPU (or hypervisor) cannot make cpuid fault may skip: where
            // it can, a failing check is a broken scripts/cpu-as, and the AVX2 claim would go
            // unchecked with a green run.
            assert!(
                !cpuid_faulting_works(),
                "this machine can make cpuid fault, yet scripts/cpu-as --check avx2 failed: {said}"
            );
            eprintln!("scripts/cpu-as --check avx2: {said}");
            return None;
        }
        let lib = repo_root().join("target/cpu-as/libcpu-as.so");
        Some(vec![
            ("CPU_AS", "avx2".to_owned()),
            ("LD_PRELOAD", lib.display().to_string()),
        ])
    })
    .clone()
}

/// Whether Linux can make `cpuid` fault on this machine (`arch_prctl(ARCH_SET_CPUID, 0)`,
/// which fails with ENODEV on a CPU without CPUID faulting): asked in a child process, which
/// exits at once (any `cpuid` after the call would fault there).
fn cpuid_faulting_works() -> bool {
    const PROBE: &str = "import ctypes, os\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        rc = libc.syscall(158, 0x1012, 0)\n\
        os.write(1, b'yes' if rc == 0 else b'no')\n\
        os._exit(0)\n";
    let out = std::process::Command::new("python3")
        .args(["-c", PROBE])
        .output()
        .unwrap();
    out.stdout == b"yes"
}

/// Says that a test checks less on this CPU than on one with every extension: on stderr, and in
/// a line of target/tmp/skipped-here.txt that scripts/test prints at the end.
pub fn skipped_here(test: &str, why: &str) {
    use std::io::Write;
    let cpu = engines_here().lines().next().unwrap_or("cpu: unknown");
    let line = format!("{test}: {why} ({cpu})");
    eprintln!("skipped here: {line}");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skipped-here.txt");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    writeln!(file, "{line}").unwrap();
}

/// Reference boxes by frame number.
pub fn references(name: &str) -> BTreeMap<u64, Vec<BBox>> {
    let path = repo_root().join("tests/fixtures/vision").join(name);
    let raw: BTreeMap<String, Vec<[f32; 4]>> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    raw.into_iter()
        .map(|(frame, boxes)| {
            let boxes = boxes
                .into_iter()
                .map(|[x, y, width, height]| BBox {
                    x,
                    y,
                    width,
                    height,
                })
                .collect();
            (frame.parse().unwrap(), boxes)
        })
        .collect()
}

/// Class, box and JSON of every detection of `key` in one line.
pub fn detections(line: &serde_json::Value, key: &str) -> Vec<(String, BBox, serde_json::Value)> {
    line[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .iter()
        .map(|d| {
            let b = &d["box"];
            let f = |k: &str| b[k].as_f64().unwrap() as f32;
            (
                d["class"].as_str().unwrap().to_owned(),
                BBox {
                    x: f("x"),
                    y: f("y"),
                    width: f("width"),
                    height: f("height"),
                },
                d.clone(),
            )
        })
        .collect()
}

/// Runs `pipeline` on the first `frames` frames in a fresh directory; the JSON lines.
pub fn run(pipeline: &str, frames: u64) -> Vec<serde_json::Value> {
    run_with(pipeline, frames, &[]).0
}

/// [`run`] with `env` added to the process's environment; the JSON lines and its stderr.
pub fn run_with(
    pipeline: &str,
    frames: u64,
    env: &[(&str, &str)],
) -> (Vec<serde_json::Value>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "p.toml", pipeline);
    let models = models_dir();
    let out = spawn(
        dir.path(),
        &[
            "run",
            path.to_str().unwrap(),
            "--max-frames",
            &frames.to_string(),
        ],
        &[&[("VIDFLOW_MODELS_DIR", models.to_str().unwrap())], env].concat(),
    )
    .finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let lines = jsonl(&dir.path().join("events.jsonl"));
    assert_eq!(lines.len() as u64, frames);
    (lines, out.stderr)
}

/// Share of the reference boxes that a found box of `class` overlaps by [`MATCH_IOU`].
pub fn recall(
    lines: &[serde_json::Value],
    key: &str,
    class: &str,
    refs: &BTreeMap<u64, Vec<BBox>>,
) -> (usize, usize) {
    let mut matched = 0;
    let mut total = 0;
    for (frame, boxes) in refs {
        let found: Vec<BBox> = detections(&lines[*frame as usize], key)
            .into_iter()
            .filter(|(c, _, _)| c == class)
            .map(|(_, b, _)| b)
            .collect();
        for r in boxes {
            total += 1;
            if found.iter().any(|f| f.iou(r) >= MATCH_IOU) {
                matched += 1;
            }
        }
    }
    (matched, total)
}
