//! What the demo counts does not depend on the machine: `backend = "auto"` takes a reduced
//! precision only where it keeps full precision's tracks on the model's check clip, so
//! pipelines/demo.toml's workflow counts the same crossings on every engine and precision `auto`
//! can take here, and the engine the demo file names counts as they do. The real binary, the
//! real models and runtimes, the demo's video; the candidates are those `auto` logs as agreeing
//! (the demo run with `backend = "auto"`), each then forced in turn.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::vision::{avx2_only, models_dir, skipped_here};
use common::*;

/// Frames of the demo's video each candidate runs: the first 400 of its 795, with the crossings
/// of the first people to walk by (enough to tell counts apart, short enough for CI: five
/// candidates at 640 on two cores).
const FRAMES: u64 = 400;
/// Only a guard against a hang.
const DEADLINE: Duration = Duration::from_secs(600);

/// The engine a run of the demo uses.
#[derive(Debug, Clone, Copy)]
enum Engine<'a> {
    /// As pipelines/demo.toml says.
    AsShipped,
    /// `backend = "auto"`, no precision asked for.
    Auto,
    /// This backend and precision.
    Forced(&'a str, &'a str),
}

/// pipelines/demo.toml as a table, its source's path made absolute, its video (the annotated
/// copy and the step drawing it: they count nothing) and its page's parts left out, and its
/// detector set to `engine`.
fn demo(engine: Engine<'_>) -> String {
    let text = std::fs::read_to_string(repo_root().join("pipelines/demo.toml")).unwrap();
    let mut doc: toml::Table = toml::from_str(&text).unwrap();
    for (_, source) in doc["sources"].as_table_mut().unwrap().iter_mut() {
        let uri = source["uri"].as_str().unwrap();
        let path = repo_root().join(uri);
        source["uri"] = toml::Value::String(path.display().to_string());
    }
    let kind = |t: &toml::Value| t["kind"].as_str().unwrap().to_owned();
    // The page's parts too (a fixed port, clips encoded): runs of this file go on in parallel.
    doc.remove("http");
    doc.remove("events");
    doc["sinks"].as_table_mut().unwrap().retain(|_, sink| {
        !["video_file", "preview", "snapshot", "clip"].contains(&kind(sink).as_str())
    });
    let steps = doc["steps"].as_table_mut().unwrap();
    steps.retain(|_, step| kind(step) != "annotate");
    let mut detectors = 0;
    for (_, detector) in steps
        .iter_mut()
        .filter(|(_, s)| kind(s) == "object_detection")
    {
        detectors += 1;
        let table = detector.as_table_mut().unwrap();
        match engine {
            Engine::AsShipped => {}
            Engine::Auto => {
                table.insert("backend".into(), "auto".into());
                table.remove("precision");
            }
            Engine::Forced(backend, precision) => {
                table.insert("backend".into(), backend.into());
                table.insert("precision".into(), precision.into());
            }
        }
    }
    assert_eq!(detectors, 1, "the demo has one detector");
    toml::to_string(&doc).unwrap()
}

/// The engines and precisions `auto` logged as agreeing with f32, as `(backend, precision)`.
fn candidates(stderr: &str) -> Vec<(String, String)> {
    let line = stderr
        .lines()
        .find(|l| l.contains("network engine chosen by auto"))
        .unwrap_or_else(|| panic!("no auto decision logged:\n{stderr}"));
    let notes = line
        .split_once("within 15% of it (")
        .and_then(|(_, rest)| rest.rsplit_once(") model="))
        .unwrap_or_else(|| panic!("{line}"))
        .0;
    let mut agreed = Vec::new();
    for note in notes.split("; ") {
        let mut words = note.splitn(4, ' ');
        let (Some(backend), Some(precision), Some(ms), Some(unit)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        let timed = ms.parse::<f64>().is_ok() && unit.starts_with("ms");
        if timed && !note.contains("disagreed") && !note.contains("not judged") {
            agreed.push((backend.to_owned(), precision.to_owned()));
        }
    }
    agreed
}

/// The demo's final counts on its first [`FRAMES`] frames with `engine`, and stderr.
fn counts(engine: Engine<'_>) -> (BTreeMap<String, u64>, String) {
    counts_with(engine, FRAMES, &[])
}

/// The demo's final counts on its first `frames` frames with `engine` and `env`, and stderr.
fn counts_with(
    engine: Engine<'_>,
    frames: u64,
    env: &[(&str, String)],
) -> (BTreeMap<String, u64>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "demo.toml", &demo(engine));
    let models = models_dir().display().to_string();
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(("VIDFLOW_MODELS_DIR", &models));
    let out = spawn(
        dir.path(),
        &[
            "run",
            path.to_str().unwrap(),
            "--max-frames",
            &frames.to_string(),
            "--stats-json",
            "stats.json",
        ],
        &env,
    )
    .finish(DEADLINE);
    assert!(out.status.success(), "{engine:?}: {}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    let mut counts = BTreeMap::new();
    for (source, steps) in stats["counts"].as_object().unwrap() {
        for (step, values) in steps.as_object().unwrap() {
            for (name, n) in values.as_object().unwrap() {
                counts.insert(format!("{source} {step} {name}"), n.as_u64().unwrap());
            }
        }
    }
    (counts, out.stderr)
}

#[test]
fn the_demo_counts_the_same_on_every_engine_and_precision_auto_can_take() {
    // What auto takes here, and what else it found agreeing.
    let (auto_counts, stderr) = counts(Engine::Auto);
    let agreed = candidates(&stderr);
    assert!(
        agreed.len() >= 2,
        "auto found {agreed:?} agreeing: nothing to compare\n{stderr}"
    );
    assert!(
        auto_counts.values().sum::<u64>() >= 4,
        "too few crossings in {FRAMES} frames to tell counts apart: {auto_counts:?}"
    );
    // What auto took, to name it beside the counts.
    let took = stderr
        .lines()
        .find(|l| l.contains("network engine chosen by auto"))
        .and_then(|l| l.split_once(" backend=\""))
        .map_or(String::new(), |(_, rest)| {
            let taken = rest.split_once(" threads=").map_or(rest, |t| t.0);
            taken.replace("\" precision=\"", " ").replace('"', "")
        });
    let mut seen = vec![(format!("auto ({took})"), auto_counts.clone())];
    let (shipped, _) = counts(Engine::AsShipped);
    seen.push(("as pipelines/demo.toml says".to_owned(), shipped.clone()));
    assert_eq!(
        shipped, auto_counts,
        "the demo's own engine counts otherwise than auto: {seen:?}"
    );
    for (backend, precision) in &agreed {
        let (forced, _) = counts(Engine::Forced(backend, precision));
        seen.push((format!("{backend} {precision}"), forced.clone()));
        assert_eq!(
            forced, auto_counts,
            "{backend} {precision} counts otherwise than auto: {seen:?}"
        );
    }
    eprintln!("the demo's counts on {FRAMES} frames: {seen:?}");
}

#[test]
fn on_a_cpu_with_avx2_only_the_demo_runs_in_f32_and_counts_the_ground_truth() {
    // The CPU most boxes have (no AVX-512, VNNI, bf16 or AMX), made here by scripts/cpu-as:
    // the shipped demo takes f32, the second precision of its list, and counts what people did
    // in PETS09-S2L1 (13 crossings eastwards, 15 westwards) over the whole video.
    let Some(env) = avx2_only() else {
        skipped_here(
            "on_a_cpu_with_avx2_only_the_demo_runs_in_f32_and_counts_the_ground_truth",
            "this machine cannot hide its AVX-512 (no cpuid faulting)",
        );
        return;
    };
    let (counts, stderr) = counts_with(Engine::AsShipped, 795, &env);
    assert!(
        stderr.contains("precision=\"f32\"")
            && stderr.contains("bf16 not taken: this CPU has no bf16 support"),
        "{stderr}"
    );
    let truth = BTreeMap::from([
        ("street crossing in".to_owned(), 13),
        ("street crossing out".to_owned(), 15),
    ]);
    assert_eq!(counts, truth, "{stderr}");
}
