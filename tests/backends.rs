//! The engines of the network steps (`backend`, `precision`) through the real binary, on real
//! video and the real models: each engine finds the reference people and faces
//! (tests/fixtures/vision), bf16 finds what f32 finds, `auto` runs and says what it took (and
//! falls back to OpenCV where no runtime is installed), and a bad ONNX file or a missing runtime
//! is a configuration error naming the file or the install step. The runtimes are the real
//! libraries `scripts/fetch-runtimes` unpacks (install-deps runs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;

use common::vision::{
    MATCH_IOU, MIN_RECALL, RUN_DEADLINE, detections, models_dir, recall, references, run_with,
    runs_here, skipped_here,
};
use common::*;
use vidflow::value::BBox;

/// Every engine, and the precisions it runs.
const ENGINES: [(&str, &str); 6] = [
    ("opencv", "f32"),
    ("onnxruntime", "f32"),
    ("openvino", "f32"),
    ("openvino", "bf16"),
    ("onnxruntime", "int8"),
    ("openvino", "int8"),
];

fn pipeline(clip: &str, kind: &str, table: &str) -> String {
    format!(
        r#"[sources.clip]
uri = "{}"

[executor]
workers = 2

[steps.detect]
kind = "{kind}"
image = "$frame"
{table}

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.detect.detections"]
"#,
        asset(clip).display()
    )
}

/// Runs the people detector (yolov3_tiny_coco at 416) with `table` up to the last reference
/// frame: the JSON lines and stderr.
fn people(table: &str) -> (Vec<serde_json::Value>, String) {
    let last = *references("vtest-people.json").keys().max().unwrap();
    let table = format!("classes = [\"person\"]\n{table}");
    run_with(
        &pipeline("vtest.avi", "object_detection", &table),
        last + 1,
        &[],
    )
}

/// Where this CPU does not run `precision` on `backend` (bf16 without AMX or AVX-512 BF16):
/// checks that a pipeline asking for it is refused when it is loaded, naming why (exit 78, never
/// a failure at the first frame), says so, and returns true.
fn refused_here(test: &str, backend: &str, precision: &str) -> bool {
    if runs_here(backend, precision) {
        return false;
    }
    let table =
        format!("classes = [\"person\"]\nbackend = \"{backend}\"\nprecision = \"{precision}\"");
    let out = validate(&pipeline("vtest.avi", "object_detection", &table), &[]);
    assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "backend \"{backend}\": this CPU has no {precision} support"
        )),
        "{}",
        out.stderr
    );
    skipped_here(
        test,
        &format!("{backend} {precision} does not run on this CPU: its refusal checked instead"),
    );
    true
}

/// The reference people of vtest.avi (tests/fixtures/vision) the detector's lines found, and how
/// many there are.
fn reference_people(lines: &[serde_json::Value]) -> (usize, usize) {
    recall(
        lines,
        "steps.detect.detections",
        "person",
        &references("vtest-people.json"),
    )
}

fn boxes(line: &serde_json::Value) -> Vec<BBox> {
    detections(line, "steps.detect.detections")
        .into_iter()
        .map(|(_, b, _)| b)
        .collect()
}

#[test]
fn every_engine_finds_every_reference_person_and_face() {
    let face_refs = references("megamind-faces.json");
    let last_face = *face_refs.keys().max().unwrap();
    for (backend, precision) in ENGINES {
        if refused_here(
            "every_engine_finds_every_reference_person_and_face",
            backend,
            precision,
        ) {
            continue;
        }
        let table = format!("backend = \"{backend}\"\nprecision = \"{precision}\"");
        let (lines, stderr) = people(&table);
        assert!(
            stderr.contains(&format!(
                "network engine as asked for model=model \"yolov3_tiny_coco\" backend=\"{backend}\" precision=\"{precision}\""
            )),
            "{stderr}"
        );
        let (matched, total) = reference_people(&lines);
        assert_eq!(
            matched, total,
            "{backend} {precision}: {matched} of {total} reference people"
        );

        if precision == "int8" {
            // YuNet has no quantized copy: asking for one is a configuration error.
            let out = validate(&pipeline("Megamind.avi", "face_detection", &table), &[]);
            assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
            assert!(
                out.stderr.contains("model \"yunet_face\" has no int8 copy")
                    && out.stderr.contains("scripts/quantize-onnx"),
                "{}",
                out.stderr
            );
            continue;
        }
        let (lines, _) = run_with(
            &pipeline("Megamind.avi", "face_detection", &table),
            last_face + 1,
            &[],
        );
        let (matched, total) = recall(&lines, "steps.detect.detections", "face", &face_refs);
        assert_eq!(
            matched, total,
            "{backend} {precision}: {matched} of {total} reference faces"
        );
    }
}

#[test]
fn a_precision_list_runs_the_first_this_cpu_runs() {
    // What pipelines/demo.toml asks for: bf16 where the CPU has it, f32 elsewhere. Both branches
    // run in scripts/test: on this machine, and under scripts/cpu-as avx2 (no bf16).
    let (lines, stderr) = people("backend = \"openvino\"\nprecision = [\"bf16\", \"f32\"]");
    let line = stderr
        .lines()
        .find(|l| l.contains("network engine as asked for"))
        .unwrap_or_else(|| panic!("{stderr}"));
    if runs_here("openvino", "bf16") {
        assert!(
            line.contains("precision=\"bf16\"") && !line.contains("not taken"),
            "{line}"
        );
    } else {
        assert!(
            line.contains("precision=\"f32\"")
                && line.contains("bf16 not taken: this CPU has no bf16 support"),
            "{line}"
        );
    }
    let (matched, total) = reference_people(&lines);
    assert_eq!(
        matched, total,
        "{line}: {matched} of {total} reference people"
    );
}

/// Share of `a`'s boxes, over all frames, that a box of `b` on the same frame overlaps.
fn frame_recall(a: &[serde_json::Value], b: &[serde_json::Value]) -> (usize, usize) {
    let (mut found, mut total) = (0, 0);
    for (x, y) in a.iter().zip(b) {
        let theirs = boxes(y);
        for bbox in boxes(x) {
            total += 1;
            found += usize::from(theirs.iter().any(|t| t.iou(&bbox) >= MATCH_IOU));
        }
    }
    (found, total)
}

#[test]
fn bf16_and_int8_find_what_f32_finds() {
    let (f32_lines, _) = people("backend = \"onnxruntime\"");
    for (backend, precision) in ENGINES.into_iter().filter(|e| e.1 != "f32") {
        if refused_here("bf16_and_int8_find_what_f32_finds", backend, precision) {
            continue;
        }
        let (lines, _) = people(&format!(
            "backend = \"{backend}\"\nprecision = \"{precision}\""
        ));
        let (found, total) = frame_recall(&f32_lines, &lines);
        assert!(total > 100, "only {total} f32 boxes");
        assert!(
            found as f64 >= 0.95 * total as f64,
            "{backend} {precision} found {found} of f32's {total} boxes"
        );
        let (precise, reduced) = frame_recall(&lines, &f32_lines);
        assert!(
            precise as f64 >= 0.95 * reduced as f64,
            "{precise} of {backend} {precision}'s {reduced} boxes are f32's"
        );
    }
}

/// The `auto` line of stderr: which engine it took, and its figures.
fn auto_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("network engine chosen by auto"))
        .unwrap_or_else(|| panic!("no auto decision logged:\n{stderr}"))
}

/// What `auto` logged for each engine and precision it tried, by name ("openvino bf16"): "12.3
/// ms", "12.3 ms with 8 tracks against ...", "12.3 ms, disagreed: ..." or "failed: ...".
fn figures(line: &str) -> BTreeMap<String, String> {
    let notes = line
        .split_once("within 15% of it (")
        .and_then(|(_, rest)| rest.rsplit_once(") model="))
        .unwrap_or_else(|| panic!("{line}"))
        .0;
    let mut figures = BTreeMap::new();
    for note in notes.split("; ") {
        for (backend, precision) in ENGINES {
            let name = format!("{backend} {precision} ");
            if let Some(figure) = note.strip_prefix(&name) {
                figures.insert(name.trim_end().to_owned(), figure.to_owned());
            }
        }
    }
    figures
}

/// The engine and precision `auto` took, from its line.
fn taken(line: &str) -> (&'static str, &'static str) {
    ENGINES
        .into_iter()
        .find(|(b, p)| {
            line.contains(&format!("backend=\"{b}\""))
                && line.contains(&format!("precision=\"{p}\""))
        })
        .unwrap_or_else(|| panic!("{line}"))
}

/// A figure of an engine that ran and agreed: a time, and for a reduced precision the tracks.
fn agreed(figure: &str) -> bool {
    let ms = figure.split_once(" ms").map(|(ms, _)| ms);
    ms.is_some_and(|ms| ms.parse::<f64>().is_ok())
        && !figure.contains("disagreed")
        && !figure.contains("not judged")
}

#[test]
fn auto_times_every_installed_engine_and_takes_one_that_agrees() {
    let (lines, stderr) = people("");
    let line = auto_line(&stderr);
    let figures = figures(line);
    // Every engine and precision ran and was timed (none "failed"), and each f32 engine
    // agrees with the reference; each reduced precision was judged on the clip, or disagreed on
    // the image, or is slower than a more precise engine that agrees (never taken).
    for (backend, precision) in ENGINES {
        let name = format!("{backend} {precision}");
        let figure = figures
            .get(&name)
            .unwrap_or_else(|| panic!("{name} not in {line}"));
        if !runs_here(backend, precision) {
            // Tried, and said why it cannot run here.
            let why = format!("failed: this CPU has no {precision} support");
            assert!(figure.starts_with(&why), "{name}: {figure}");
            skipped_here(
                "auto_times_every_installed_engine_and_takes_one_that_agrees",
                &format!("{name} does not run on this CPU: auto's reason checked instead"),
            );
            continue;
        }
        let ms = figure.split_once(" ms").map(|(ms, _)| ms.parse::<f64>());
        assert!(matches!(ms, Some(Ok(ms)) if ms > 0.0), "{name}: {figure}");
        if precision == "f32" {
            assert!(agreed(figure), "{name}: {figure}");
        } else {
            assert!(
                figure.contains("on the check clip")
                    || figure.contains("disagreed: finds")
                    || figure.contains("not judged on the clip: never taken here"),
                "{name}: {figure}"
            );
        }
    }
    assert!(!stderr.contains("not installed"), "{stderr}");
    let (backend, precision) = taken(line);
    assert!(
        agreed(&figures[&format!("{backend} {precision}")]),
        "{line}"
    );
    let (matched, total) = reference_people(&lines);
    assert_eq!(
        matched, total,
        "auto ({backend} {precision}): {matched} of {total}"
    );
}

#[test]
fn auto_asked_for_a_reduced_precision_judges_it_against_f32_and_takes_it() {
    // bf16 on yolov3_tiny_coco, int8 on yolov12n_coco: yolov3-tiny's int8 copy at 416 loses
    // tracks on the check clip (IDF1 0.90 against f32's: auto rightly refuses it, a validate
    // error), YOLOv12n's keeps them (0.99).
    let cases = [
        ("", "bf16", 1.0),
        ("model = \"yolov12n_coco\"", "int8", MIN_RECALL),
    ];
    for (model, precision, least) in cases {
        if !runs_here("openvino", precision) {
            // No engine runs it here: a configuration error that names each engine's reason.
            let table = format!("classes = [\"person\"]\n{model}\nprecision = \"{precision}\"");
            let out = validate(&pipeline("vtest.avi", "object_detection", &table), &[]);
            assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
            assert!(
                out.stderr.contains(&format!(
                    "no engine could run it in {precision} that agrees with f32"
                )) && out.stderr.contains(&format!(
                    "openvino {precision} failed: this CPU has no {precision} support"
                )),
                "{}",
                out.stderr
            );
            skipped_here(
                "auto_asked_for_a_reduced_precision_judges_it_against_f32_and_takes_it",
                &format!("no engine runs {precision} on this CPU: auto's refusal checked instead"),
            );
            continue;
        }
        let (lines, stderr) = people(&format!("{model}\nprecision = \"{precision}\""));
        let line = auto_line(&stderr);
        let figures = figures(line);
        // The f32 engines ran, as references; what was taken is of the precision asked for
        // and agreed with them.
        assert!(agreed(&figures["onnxruntime f32"]), "{line}");
        let (backend, taken_precision) = taken(line);
        assert_eq!(taken_precision, precision, "{line}");
        let figure = &figures[&format!("{backend} {precision}")];
        assert!(
            agreed(figure) && figure.contains("on the check clip"),
            "{line}"
        );
        let (matched, total) = reference_people(&lines);
        assert!(
            matched as f64 >= least * total as f64,
            "auto {precision}: {matched} of {total}"
        );
    }
}

#[test]
fn auto_without_the_runtimes_runs_opencv_and_warns_once() {
    let empty = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Two detectors: one warning between them.
    let text = format!(
        "{}\n[steps.faces]\nkind = \"face_detection\"\nimage = \"$frame\"\n",
        pipeline("vtest.avi", "object_detection", "classes = [\"person\"]")
    );
    let path = write(dir.path(), "p.toml", &text);
    let out = spawn(
        dir.path(),
        &["run", path.to_str().unwrap(), "--max-frames", "5"],
        &[
            ("VIDFLOW_MODELS_DIR", models_dir().to_str().unwrap()),
            ("VIDFLOW_RUNTIMES_DIR", empty.path().to_str().unwrap()),
        ],
    )
    .finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let warnings: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("backend auto"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", out.stderr);
    assert!(
        warnings[0].contains("onnxruntime: not installed")
            && warnings[0].contains("openvino: not installed")
            && warnings[0].contains("scripts/fetch-runtimes"),
        "{}",
        warnings[0]
    );
    let decisions: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("network engine chosen by auto"))
        .collect();
    assert_eq!(decisions.len(), 2, "{}", out.stderr);
    for d in decisions {
        assert!(d.contains("backend=\"opencv\""), "{d}");
    }
    assert_eq!(jsonl(&dir.path().join("events.jsonl")).len(), 5);
}

/// `vidflow validate` of `text` in a fresh folder, with `env`.
fn validate(text: &str, env: &[(&str, &str)]) -> Finished {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "p.toml", text);
    let models = models_dir();
    spawn(
        dir.path(),
        &["validate", path.to_str().unwrap()],
        &[&[("VIDFLOW_MODELS_DIR", models.to_str().unwrap())], env].concat(),
    )
    .finish(RUN_DEADLINE)
}

#[test]
fn a_backend_asked_for_and_missing_is_a_validate_error_naming_the_install_step() {
    let empty = tempfile::tempdir().unwrap();
    for backend in ["onnxruntime", "openvino"] {
        let text = pipeline(
            "vtest.avi",
            "object_detection",
            &format!("backend = \"{backend}\""),
        );
        let out = validate(
            &text,
            &[("VIDFLOW_RUNTIMES_DIR", empty.path().to_str().unwrap())],
        );
        assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
        // At the backend's line and column.
        assert!(
            out.stderr.contains(&format!(
                "p.toml:10:11: step \"detect\": backend \"{backend}\": not installed"
            )) && out.stderr.contains("scripts/fetch-runtimes"),
            "{}",
            out.stderr
        );
    }
}

#[test]
fn a_corrupt_or_truncated_onnx_file_is_a_configuration_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let names = write(dir.path(), "names.txt", &"x\n".repeat(80));
    let good = std::fs::read(models_dir().join("yolov3-tiny.onnx")).unwrap();
    let cases: BTreeMap<&str, Vec<u8>> = BTreeMap::from([
        ("truncated.onnx", good[..good.len() / 3].to_vec()),
        ("garbage.onnx", b"this is not a network".repeat(100)),
        ("empty.onnx", Vec::new()),
    ]);
    for (name, bytes) in &cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        for backend in ["auto", "opencv", "onnxruntime", "openvino"] {
            let table = format!(
                "model_path = \"{}\"\nlayout = \"darknet\"\nclass_names = \"{}\"\nbackend = \"{backend}\"",
                path.display(),
                names.display()
            );
            let out = validate(&pipeline("vtest.avi", "object_detection", &table), &[]);
            assert_eq!(
                out.status.code(),
                Some(78),
                "{name} {backend}: {}",
                out.stderr
            );
            assert!(
                out.stderr.contains(name),
                "{name} {backend}: {}",
                out.stderr
            );
            assert!(
                !out.stderr.contains("panicked"),
                "{name} {backend}: {}",
                out.stderr
            );
        }
    }
}

#[test]
fn under_the_units_memory_deny_write_execute_auto_skips_openvino_and_runs() {
    // systemd's MemoryDenyWriteExecute=yes (set in systemd/vidflow@.service) is the kernel's
    // PR_SET_MDWE (Linux 6.3) for the process: set here the same way, before exec.
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "p.toml",
        &pipeline("vtest.avi", "object_detection", "classes = [\"person\"]"),
    );
    let mut command = vidflow();
    command
        .args(["run", path.to_str().unwrap(), "--max-frames", "5"])
        .env("VIDFLOW_MODELS_DIR", models_dir());
    // SAFETY: prctl is async-signal-safe and touches only the child's own flags.
    unsafe {
        command.pre_exec(|| {
            const PR_SET_MDWE: libc::c_int = 65;
            if libc::prctl(PR_SET_MDWE, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = spawn_command(dir.path(), command).finish(RUN_DEADLINE);
    assert!(out.status.success(), "{}", out.stderr);
    let line = auto_line(&out.stderr);
    assert!(line.contains("openvino f32 failed"), "{line}");
    assert!(!line.contains("backend=\"openvino\""), "{line}");
    assert_eq!(jsonl(&dir.path().join("events.jsonl")).len(), 5);
}

#[test]
fn a_real_yolov8_export_runs_on_onnx_runtime_and_openvino_and_is_refused_by_opencv() {
    // assets/yolov8-fall.onnx (scripts/fetch-assets): an Ultralytics YOLOv8 export whose two
    // classes are people standing ("normal") and fallen; output [1, 6, 8400], input 640.
    let dir = tempfile::tempdir().unwrap();
    let names = write(dir.path(), "fall.names", "normal\nfall\n");
    let table = |backend: &str| {
        format!(
            "model_path = \"{}\"\nlayout = \"yolov8\"\nclass_names = \"{}\"\ninput_size = 640\nbackend = \"{backend}\"",
            asset("yolov8-fall.onnx").display(),
            names.display()
        )
    };
    let refs: BTreeMap<u64, Vec<BBox>> = references("vtest-people.json")
        .into_iter()
        .filter(|(frame, _)| *frame <= 15)
        .collect();
    for backend in ["onnxruntime", "openvino"] {
        let (lines, _) = run_with(
            &pipeline("vtest.avi", "object_detection", &table(backend)),
            16,
            &[],
        );
        // Standing people: the reference people of frames 0 and 15 boxed as "normal" (a model
        // trained for falls, not COCO: the share the vision tests ask of any detector).
        let (matched, total) = recall(&lines, "steps.detect.detections", "normal", &refs);
        assert!(
            matched as f64 >= MIN_RECALL * total as f64,
            "{backend}: {matched} of {total} reference people"
        );
    }
    let out = validate(
        &pipeline("vtest.avi", "object_detection", &table("opencv")),
        &[],
    );
    assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
    assert!(
        out.stderr.contains("opencv cannot read") && out.stderr.contains("yolov8-fall.onnx"),
        "{}",
        out.stderr
    );
}
