//! SIGHUP to a real `vidflow run` on a live source: a valid change is swapped in while the
//! source keeps running (frame numbers continuous, nothing dropped, the source not restarted);
//! an invalid file keeps the running pipeline and logs each problem at its line:column; a
//! changed source starts again from its predecessor's frame number; a stop that comes in the
//! middle of a reload still drains everything. The daemon never exits on SIGHUP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// Only turns a hang into a failure.
const DEADLINE: Duration = Duration::from_secs(90);

/// A live 30 fps source with room for two seconds of frames (a loaded machine must not make it
/// drop), motion, and every frame to JSONL.
fn pipeline(source_uri: &str, steps: &str, include: &str) -> String {
    format!(
        r#"[sources.cam]
uri = "{source_uri}"
queue = 60

[executor]
workers = 2

[steps.motion]
kind = "motion"
image = "$frame"

[steps.tracks]
kind = "tracker"
detections = "$steps.motion.detections"

# The ball crosses the middle about every 100 frames.
[steps.crossing]
kind = "line_counter"
tracks = "$steps.tracks.tracks"
line = [[160, 0], [160, 240]]
{steps}
[sinks.events]
kind = "jsonl"
path = "out/events.jsonl"
include = [{include}]

[sinks.video]
kind = "video_file"
path = "out/{{source}}.mp4"
image = "$frame"
"#
    )
}

const BALL: &str = "test://ball?width=320&height=240&fps=30";
const GRAY: &str = "\n[steps.gray]\nkind = \"grayscale\"\nimage = \"$frame\"\n";

/// `vidflow run p.toml --stats-json stats.json` in `dir`, `p.toml` holding `text`.
fn start(dir: &Path, text: &str) -> Running {
    let file = write(dir, "p.toml", text);
    spawn_run(&file, &["--stats-json", "stats.json"], dir)
}

fn lines_of(dir: &Path) -> Vec<serde_json::Value> {
    jsonl(&dir.join("out/events.jsonl"))
}

/// Crossings counted so far, both ways, on a line that includes the counts.
fn crossings(line: &serde_json::Value) -> u64 {
    let c = &line["steps.crossing.counts"];
    c["in"].as_u64().unwrap() + c["out"].as_u64().unwrap()
}

/// Waits until a JSONL line satisfies `done`.
fn wait_for_line(dir: &Path, done: impl Fn(&serde_json::Value) -> bool) {
    let path = dir.join("out/events.jsonl");
    common::poll(
        "a line as expected",
        DEADLINE,
        Duration::from_millis(50),
        || {
            std::fs::read_to_string(&path)
                .is_ok_and(|t| {
                    t.lines()
                        .filter_map(|l| serde_json::from_str(l).ok())
                        .any(|l| done(&l))
                })
                .then_some(())
        },
    );
}

/// Frame numbers of `source` in the JSONL, checked to be 0, 1, 2, ... with no gap.
fn continuous(lines: &[serde_json::Value], source: &str) -> u64 {
    let frames: Vec<u64> = lines
        .iter()
        .filter(|l| l["source"] == source)
        .map(|l| l["frame"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = (0..frames.len() as u64).collect();
    assert_eq!(frames, expected, "frame numbers of {source}");
    frames.len() as u64
}

/// Waits for the exit, which must be 0.
fn finish_ok(running: Running) -> Finished {
    let out = running.finish(DEADLINE);
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        out.stderr
    );
    out
}

/// Stops the run with SIGTERM and checks the clean end: exit 0, every decoded frame processed
/// and written once, the video playing every frame. Returns the stats and the log.
fn stop_cleanly(running: Running, dir: &Path) -> (serde_json::Value, String) {
    running.signal("TERM");
    let out = finish_ok(running);
    let stats = read_json(&dir.join("stats.json"));
    assert_eq!(stats["frames_dropped"], 0, "{stats}");
    assert_eq!(stats["frames_failed"], 0, "{stats}");
    let processed = stats["frames_processed"].as_u64().unwrap();
    assert_eq!(stats["frames_decoded"], processed, "{stats}");
    assert_eq!(lines_of(dir).len() as u64, processed);
    assert_eq!(stats["sinks"]["events"]["written"], processed, "{stats}");
    assert_eq!(stats["sinks"]["video"]["written"], processed, "{stats}");
    assert_eq!(
        count_segment_frames(&dir.join("out/cam.mp4")),
        processed,
        "frames in the video"
    );
    (stats, out.stderr)
}

#[test]
fn a_valid_change_swaps_steps_and_sinks_while_the_source_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(
        dir.path(),
        &pipeline(BALL, "", r#""$steps.crossing.counts""#),
    );
    // Until the ball has crossed the line once: the counter has state to keep.
    wait_for_line(dir.path(), |l| crossings(l) > 0);

    // A new step, and the JSONL sink told to include it: the sink is replaced, the video sink
    // and the three steps are kept.
    write(
        dir.path(),
        "p.toml",
        &pipeline(
            BALL,
            GRAY,
            r#""$steps.crossing.counts", "$steps.gray.image""#,
        ),
    );
    running.signal("HUP");
    running.wait_for_stderr("reload applied", DEADLINE);
    let at_reload = lines_of(dir.path()).len();
    wait_for_lines(
        &dir.path().join("out/events.jsonl"),
        at_reload + 30,
        DEADLINE,
    );
    assert!(
        running.stderr().contains("steps_kept=3"),
        "{}",
        running.stderr()
    );
    assert!(
        running.stderr().contains("sinks_kept=1"),
        "{}",
        running.stderr()
    );

    let (stats, _) = stop_cleanly(running, dir.path());
    let lines = lines_of(dir.path());
    continuous(&lines, "cam");
    // The source ran through the reload: one connection, no restart.
    assert_eq!(stats["sources"]["cam"]["attempts"], 1, "{stats}");
    // Before the swap no line has the new step; after it, every line does.
    let first_new = lines
        .iter()
        .position(|l| l.get("steps.gray.image").is_some())
        .expect("no line has the new step");
    assert!(first_new >= 30, "the new step showed before the reload");
    assert!(
        lines[first_new..]
            .iter()
            .all(|l| l.get("steps.gray.image").is_some())
    );
    // The counter was kept with its state: what it counted before the reload still counts
    // after it, and the total never goes back.
    let counted: Vec<u64> = lines.iter().map(crossings).collect();
    assert!(counted[first_new - 1] > 0);
    assert!(
        counted.windows(2).all(|w| w[0] <= w[1]),
        "crossings went back at the reload: {counted:?}"
    );
    assert_eq!(
        stats["counts"]["cam"]["crossing"]["in"],
        lines.last().unwrap()["steps.crossing.counts"]["in"]
    );
}

#[test]
fn an_invalid_file_keeps_the_running_pipeline_and_logs_each_problem_at_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let good = pipeline(BALL, "", r#""$steps.tracks.tracks""#);
    assert!(good.contains("kind = \"tracker\""));
    let running = start(dir.path(), &good);
    let file = dir.path().join("p.toml");
    wait_for_lines(&dir.path().join("out/events.jsonl"), 20, DEADLINE);

    // Two problems: an unknown step kind and a reference to a step that does not exist.
    let bad = good
        .replace("kind = \"tracker\"", "kind = \"trackr\"")
        .replace(
            "\"$steps.tracks.tracks\"]",
            "\"$steps.tracks.tracks\", \"$steps.nothing.image\"]",
        );
    write(dir.path(), "p.toml", &bad);
    let kind_line = bad.lines().position(|l| l.contains("trackr")).unwrap() + 1;
    let include_line = bad.lines().position(|l| l.contains("nothing")).unwrap() + 1;
    running.signal("HUP");
    running.wait_for_stderr("reload refused", DEADLINE);
    let log = running.stderr();
    assert!(log.contains(&format!("p.toml:{kind_line}:8: ")), "{log}");
    assert!(log.contains(&format!("p.toml:{include_line}:")), "{log}");
    assert!(log.contains("nothing"), "{log}");

    // It keeps running the old pipeline: frames keep coming, with the old outputs only.
    let at_refusal = lines_of(dir.path()).len();
    wait_for_lines(
        &dir.path().join("out/events.jsonl"),
        at_refusal + 30,
        DEADLINE,
    );
    // A file that cannot be read is refused likewise.
    std::fs::remove_file(&file).unwrap();
    running.signal("HUP");
    running.wait_for_stderr_times("reload refused", 2, DEADLINE);
    assert!(
        running.stderr().contains("cannot read"),
        "{}",
        running.stderr()
    );
    write(dir.path(), "p.toml", &good);

    let (stats, log) = stop_cleanly(running, dir.path());
    assert!(!log.contains("reload applied"), "{log}");
    assert_eq!(stats["sources"]["cam"]["attempts"], 1);
    let lines = lines_of(dir.path());
    continuous(&lines, "cam");
    assert!(lines.iter().all(|l| l.get("steps.nothing.image").is_none()));
}

#[test]
fn a_changed_source_starts_again_from_its_frame_number_and_a_new_one_joins() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path(), &pipeline(BALL, "", r#""$steps.tracks.tracks""#));
    wait_for_lines(&dir.path().join("out/events.jsonl"), 30, DEADLINE);

    let changed = pipeline(
        "test://ball?width=320&height=240&fps=25",
        "",
        r#""$steps.tracks.tracks""#,
    ) + "\n[sources.door]\nuri = \"test://smpte?width=320&height=240&fps=10\"\nqueue = 20\n";
    write(dir.path(), "p.toml", &changed);
    running.signal("HUP");
    running.wait_for_stderr("reload applied", DEADLINE);
    let at_reload = lines_of(dir.path()).len();
    wait_for_lines(
        &dir.path().join("out/events.jsonl"),
        at_reload + 30,
        DEADLINE,
    );

    running.signal("TERM");
    finish_ok(running);
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["frames_dropped"], 0, "{stats}");
    let lines = lines_of(dir.path());
    assert_eq!(stats["frames_processed"], lines.len() as u64, "{stats}");
    // The changed source was stopped and started again (two connections), its numbers going
    // on where they were; the new source numbers from 0.
    assert_eq!(stats["sources"]["cam"]["attempts"], 2, "{stats}");
    let cam = continuous(&lines, "cam");
    assert_eq!(stats["sources"]["cam"]["decoded"], cam, "{stats}");
    assert!(continuous(&lines, "door") > 0);
    // Its video went on in the same file, playing every frame of both.
    assert_eq!(count_segment_frames(&dir.path().join("out/cam.mp4")), cam);
}

#[test]
fn a_stop_in_the_middle_of_a_reload_still_drains_every_frame() {
    // SIGTERM right after SIGHUP, at moments from "still loading" (the new file has a detector,
    // whose network takes a moment to load; it runs on one frame in 1000) to "swapped": the
    // stop wins, whatever the reload had done, and nothing decoded is lost.
    let detector = "\n[steps.people]\nkind = \"object_detection\"\nimage = \"$frame\"\n\
                    input_size = 320\nevery_n_frames = 1000\n";
    let models = repo_root().join("models");
    let (mut applied, mut cancelled) = (0, Vec::new());
    for (trial, pause_ms) in [0u64, 2, 5, 10, 25, 60, 120, 250].into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "p.toml",
            &pipeline(BALL, "", r#""$steps.tracks.tracks""#),
        );
        let running = spawn(
            dir.path(),
            &["run", "p.toml", "--stats-json", "stats.json"],
            &[("VIDFLOW_MODELS_DIR", models.to_str().unwrap())],
        );
        wait_for_lines(&dir.path().join("out/events.jsonl"), 10, DEADLINE);
        // Half the trials also change the source, so the reload waits for it to end.
        let uri = if trial % 2 == 0 {
            BALL
        } else {
            "test://ball?width=320&height=240&fps=20"
        };
        write(
            dir.path(),
            "p.toml",
            &pipeline(
                uri,
                &format!("{GRAY}{detector}"),
                r#""$steps.tracks.tracks", "$steps.gray.image""#,
            ),
        );
        running.signal("HUP");
        // The state this trial is about: the reload is under way (the pause counts from here).
        running.wait_for_stderr("reload requested: loading the pipeline file", DEADLINE);
        std::thread::sleep(Duration::from_millis(pause_ms));
        let (stats, log) = stop_cleanly(running, dir.path());
        let lines = lines_of(dir.path());
        continuous(&lines, "cam");
        // The stop wins: a reload is applied only if it was done before the stop came, and
        // one still under way then is cancelled, naming the stage it was in.
        let at = |text: &str| log.lines().position(|l| l.contains(text));
        let stop = at("stop requested").unwrap_or_else(|| panic!("trial {trial}: {log}"));
        match (at("reload applied"), at("reload cancelled")) {
            (Some(done), None) => {
                assert!(done < stop, "trial {trial}: applied after the stop\n{log}");
                applied += 1;
            }
            (None, Some(undone)) => {
                assert!(
                    stop < undone,
                    "trial {trial}: cancelled before the stop\n{log}"
                );
                cancelled.push(log.lines().nth(undone).unwrap().to_owned());
            }
            _ => panic!("trial {trial}: neither applied nor cancelled, or both:\n{log}"),
        }
        assert!(stats["frames_processed"].as_u64().unwrap() >= 10);
    }
    println!("stop mid-reload: {applied} reload(s) applied first, cancelled: {cancelled:#?}");
    // The test is about a stop in the middle of a reload: the first trials, a few
    // milliseconds into loading a detector's network, must have come in the middle of one.
    assert!(
        cancelled.iter().any(|l| l.contains("loading")),
        "no stop came while a reload was loading: {cancelled:#?}"
    );
}

#[test]
fn sighup_never_stops_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let mut running = start(dir.path(), &pipeline(BALL, "", r#""$steps.tracks.tracks""#));
    wait_for_lines(&dir.path().join("out/events.jsonl"), 5, DEADLINE);
    // A burst of reloads of an unchanged file, one on top of another.
    for _ in 0..5 {
        running.signal("HUP");
    }
    running.wait_for_stderr("reload: nothing changed", DEADLINE);
    let now = lines_of(dir.path()).len();
    wait_for_lines(&dir.path().join("out/events.jsonl"), now + 30, DEADLINE);
    assert!(running.is_running());
    let (stats, _) = stop_cleanly(running, dir.path());
    assert_eq!(stats["sources"]["cam"]["attempts"], 1);
    continuous(&lines_of(dir.path()), "cam");
}

#[test]
fn a_stop_while_a_changed_source_winds_down_cancels_the_reload_and_loses_nothing() {
    // A file through a detector: the changed source takes a while to deliver what it decoded
    // before it ends, and the stop comes then (the log names the stage the reload was in).
    let models = repo_root().join("models");
    let street = asset("vtest.avi");
    let text = |queue: u32| {
        format!(
            "[sources.street]\nuri = \"{}\"\nqueue = {queue}\n\n[executor]\nworkers = 2\n\n\
             [steps.people]\nkind = \"object_detection\"\nimage = \"$frame\"\ninput_size = 416\n\n\
             [sinks.events]\nkind = \"jsonl\"\npath = \"out/events.jsonl\"\n\
             include = [\"$steps.people.detections\"]\n",
            street.display()
        )
    };
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "p.toml", &text(2));
    let running = spawn(
        dir.path(),
        &["run", "p.toml", "--stats-json", "stats.json"],
        &[("VIDFLOW_MODELS_DIR", models.to_str().unwrap())],
    );
    wait_for_lines(&dir.path().join("out/events.jsonl"), 5, DEADLINE);
    write(dir.path(), "p.toml", &text(3));
    running.signal("HUP");
    running.wait_for_stderr("reload: stopping source", DEADLINE);
    running.signal("TERM");
    let out = finish_ok(running);
    let stats = read_json(&dir.path().join("stats.json"));
    assert_eq!(stats["frames_dropped"], 0, "{stats}");
    let lines = lines_of(dir.path());
    assert_eq!(stats["frames_processed"], lines.len() as u64, "{stats}");
    assert_eq!(stats["frames_decoded"], lines.len() as u64, "{stats}");
    continuous(&lines, "street");
    // The stop came while the reload waited for the source to end: it cancels the reload at
    // that stage; the new file's queue is never taken up.
    let stage = out
        .stderr
        .lines()
        .find(|l| l.contains("reload cancelled") || l.contains("reload applied"))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    println!("stop while a changed source winds down: {stage}");
    assert!(
        stage.contains("reload cancelled") && stage.contains("stopping sources"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_changed_event_store_is_kept_until_a_restart_and_the_log_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let with_store =
        |path: &str| format!("{}\n[events]\npath = \"{path}\"\n", pipeline(BALL, "", ""));
    let running = start(dir.path(), &with_store("events.db"));
    wait_for_lines(&dir.path().join("out/events.jsonl"), 20, DEADLINE);
    // Another store, and a new step beside it: the step is swapped in, the store is not.
    write(
        dir.path(),
        "p.toml",
        &format!("{}{GRAY}", with_store("other.db")),
    );
    running.signal("HUP");
    running.wait_for_stderr("reload applied", DEADLINE);
    let log = running.stderr();
    assert!(
        log.contains(r#"reload: [events] (the event store stays "events.db" until a restart)"#),
        "{log}"
    );
    let at_reload = lines_of(dir.path()).len();
    wait_for_lines(
        &dir.path().join("out/events.jsonl"),
        at_reload + 30,
        DEADLINE,
    );
    let (_, log) = stop_cleanly(running, dir.path());
    assert!(dir.path().join("events.db").exists(), "{log}");
    assert!(!dir.path().join("other.db").exists(), "{log}");
}
