//! Retention on a small real filesystem: a tmpfs of a few tens of MB the test mounts (the tests
//! run as root, as CI does), a live 640x480 source encoded at 16 Mbit/s into 1 s segments by a
//! real `vidflow` process, real signals. The folder never passes its cap, foreign files survive,
//! the purge goes on from the index after SIGKILL, and a full disk never stops recording.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::http as http_client;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{count_video_frames, jsonl, read_json, spawn_run, write};
use http_client::{scrape, value};
use vidflow::storage::index::INDEX;

const DEADLINE: Duration = Duration::from_secs(60);

/// A tmpfs of `mb` MB mounted on a fresh folder; unmounted when dropped.
struct Mount {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Mount {
    fn new(mb: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
            .arg(&path)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "cannot mount a tmpfs (the tests run as root)"
        );
        Self { _dir: dir, path }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// The `.mp4` files in `dir` whose names start with `prefix`, by name (their start time).
fn segments(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    found.retain(|p| {
        let name = p.file_name().unwrap().to_string_lossy();
        name.starts_with(prefix) && name.ends_with(".mp4")
    });
    found.sort();
    found
}

fn bytes(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn pipeline(dir: &Path, disk: &Path, max_gb: &str, port: u16) -> PathBuf {
    write(
        dir,
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "test://snow?width=640&height=480&fps=30&live=true"

[http]
listen = "127.0.0.1:{port}"

[sinks.rec]
kind = "video_file"
path = "{disk}/rec/cam-{{start}}.mp4"
image = "$frame"
segment_seconds = 1
bitrate_kbps = 16000
preset = "ultrafast"
{max_gb}

[sinks.log]
kind = "jsonl"
path = "{disk}/log/events.jsonl"
"#,
            disk = disk.display()
        ),
    )
}

#[test]
fn a_capped_recording_never_passes_its_cap_spares_foreign_files_and_resumes_purging_after_sigkill()
{
    let disk = Mount::new(48);
    let dir = tempfile::tempdir().unwrap();
    let rec = disk.path.join("rec");
    std::fs::create_dir(&rec).unwrap();
    // A user's files in the folder: one named like a segment, one like the index's neighbour.
    let foreign = [
        ("cam-20200101T000000Z.mp4", "a user's clip"),
        ("notes.txt", "a user's notes"),
        ("cam-.mp4", "odd"),
    ];
    for (name, text) in foreign {
        std::fs::write(rec.join(name), text).unwrap();
    }
    let cap: u64 = 12_000_000;
    let port = common::free_port();
    let p = pipeline(dir.path(), &disk.path, "max_gb = 0.012", port);
    let mut run = spawn_run(&p, &["--stats-json", "stats.json"], dir.path());

    // 25 s of 1-s segments (VIDFLOW_RETENTION_SECONDS for a longer soak), sampled every
    // 50 ms: never over the cap.
    let seconds: u64 = std::env::var("VIDFLOW_RETENTION_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25);
    let start = Instant::now();
    let mut most = 0;
    let mut seen = std::collections::BTreeSet::new();
    while start.elapsed() < Duration::from_secs(seconds) {
        assert!(run.is_running(), "{}", run.stderr());
        let ours = segments(&rec, "cam-2026");
        seen.extend(ours.iter().cloned());
        most = most.max(bytes(&ours));
        assert!(most <= cap, "{most} bytes over the cap of {cap}: {ours:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "{} segments in {seconds} s, at most {most} of {cap} bytes kept",
        seen.len()
    );
    let samples = scrape(port).unwrap();
    let purged = value(
        &samples,
        "vidflow_storage_purged_files_total",
        &[("sink", "rec")],
    );
    assert!(purged.unwrap() >= 5.0, "{purged:?}");
    assert!(
        value(&samples, "vidflow_storage_kept_bytes", &[("sink", "rec")]).unwrap() <= cap as f64
    );
    assert!(
        samples
            .keys()
            .any(|(name, _)| name == "vidflow_storage_free_bytes")
    );
    run.signal("KILL");
    let _ = run.finish(DEADLINE);

    let kept = segments(&rec, "cam-2026");
    assert!(
        seen.len() as u64 >= seconds * 3 / 5,
        "only {} segments in {seconds} s",
        seen.len()
    );
    assert!(kept.len() < seen.len() && kept.len() >= 3, "{kept:?}");
    // The newest footage is whole: every finished segment left plays (the last was cut by
    // the kill; it plays up to its last fragment).
    for segment in &kept[..kept.len() - 1] {
        assert!(count_video_frames(segment) >= 20, "{}", segment.display());
    }
    for (name, text) in foreign {
        assert_eq!(
            std::fs::read_to_string(rec.join(name)).unwrap(),
            text,
            "{name}"
        );
    }

    // Restarted with a lower cap: the first run's files, known from the index only, go first.
    let port = common::free_port();
    let p = pipeline(dir.path(), &disk.path, "max_gb = 0.006", port);
    let run = spawn_run(&p, &["--stats-json", "stats.json"], dir.path());
    run.wait_for_stderr_times("new video segment", 8, DEADLINE);
    run.signal("TERM");
    let out = run.finish(DEADLINE);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let after = segments(&rec, "cam-2026");
    assert!(
        kept.iter().all(|k| !after.contains(k)),
        "the first run's files outlived the second run's cap: {after:?}"
    );
    assert!(bytes(&after) <= 6_000_000, "{after:?}");
    for (name, text) in foreign {
        assert_eq!(
            std::fs::read_to_string(rec.join(name)).unwrap(),
            text,
            "{name}"
        );
    }
    // The log is whole, a line per frame of the second run.
    let stats = read_json(&dir.path().join("stats.json"));
    let lines = jsonl(&disk.path.join("log/events.jsonl"));
    assert!(lines.len() as u64 >= stats["frames_processed"].as_u64().unwrap());
    assert!(
        stats["storage"]["sinks"]["rec"]["purged_files"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert!(rec.join(INDEX).exists());
}

#[test]
fn a_full_disk_loses_frames_of_that_sink_only_and_recording_resumes_when_space_returns() {
    let disk = Mount::new(24);
    let dir = tempfile::tempdir().unwrap();
    let filler = disk.path.join("filler");
    std::fs::write(&filler, vec![0u8; 16_000_000]).unwrap();
    let rec = disk.path.join("rec");
    let p = write(
        dir.path(),
        "p.toml",
        &format!(
            r#"
[sources.cam]
uri = "test://snow?width=640&height=480&fps=30&live=true"

[sinks.rec]
kind = "video_file"
path = "{}/cam-{{start}}.mp4"
image = "$frame"
segment_seconds = 1
bitrate_kbps = 16000
preset = "ultrafast"

[sinks.log]
kind = "jsonl"
path = "events.jsonl"
"#,
            rec.display()
        ),
    );
    let run = spawn_run(&p, &["--stats-json", "stats.json"], dir.path());
    run.wait_for_stderr("disk full and nothing vidflow may delete", DEADLINE);
    // Full for a while: the run goes on.
    std::thread::sleep(Duration::from_secs(3));
    let before = segments(&rec, "cam-");
    std::fs::remove_file(&filler).unwrap();
    run.wait_for_stderr("room on the disk again", DEADLINE);
    let resumed_at = run.stderr().matches("new video segment").count();
    run.wait_for_stderr_times("new video segment", resumed_at + 2, DEADLINE);
    run.signal("TERM");
    let out = run.finish(DEADLINE);
    // Frames were lost (the disk was full), so not a clean exit; but not a crash either.
    assert_eq!(out.status.code(), Some(70), "{}", out.stderr);
    assert!(out.stderr.contains("stop requested"), "{}", out.stderr);
    let stats = read_json(&dir.path().join("stats.json"));
    let processed = stats["frames_processed"].as_u64().unwrap();
    // The other sink took every frame. (A live source may drop from its queue on a loaded
    // machine: those never reached any sink, and are counted apart.)
    assert_eq!(
        jsonl(&dir.path().join("events.jsonl")).len() as u64,
        processed
    );
    assert_eq!(stats["sinks"]["log"]["dropped"], 0);
    let rec_stats = &stats["sinks"]["rec"];
    assert!(rec_stats["dropped"].as_u64().unwrap() > 0, "{rec_stats}");
    assert!(
        stats["storage"]["sinks"]["rec"]["disk_full"]
            .as_u64()
            .unwrap()
            >= 1
    );
    // Recording resumed in new segments that play.
    let after: Vec<_> = segments(&rec, "cam-")
        .into_iter()
        .filter(|s| !before.contains(s))
        .collect();
    assert!(after.len() >= 2, "{after:?}\n{}", out.stderr);
    assert!(
        count_video_frames(&after[0]) >= 20,
        "{}",
        after[0].display()
    );
    // No empty file was left by the attempts while the disk was full.
    for s in segments(&rec, "cam-") {
        assert!(
            std::fs::metadata(&s).unwrap().len() > 0,
            "{}\n{}",
            s.display(),
            out.stderr
        );
    }
}
