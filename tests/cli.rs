//! The `vidflow` command line, run as a real process: exit codes, what goes to stdout and
//! stderr, and that secrets in source URIs never reach the output.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use vidflow::{sinks, steps};

/// sysexits EX_CONFIG: invalid pipeline file.
const EXIT_CONFIG: i32 = 78;
/// sysexits EX_UNAVAILABLE: the source cannot be opened.
const EXIT_UNAVAILABLE: i32 = 69;
/// How long a run against a refused RTSP connection may take before it counts as hanging.
const RTSP_REFUSED_DEADLINE: Duration = Duration::from_secs(20);

fn vidflow() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vidflow"));
    cmd.env_remove("JOURNAL_STREAM").env("VIDFLOW_LOG", "info");
    cmd
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start vidflow: {e}"));
    let code = status
        .code()
        .unwrap_or_else(|| panic!("vidflow killed by a signal: {status}"));
    (
        code,
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A TOML string literal holding `s`.
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// Writes a pipeline with one source and a jsonl sink into `dir`, returning its path.
fn write_pipeline(dir: &Path, uri: &str) -> PathBuf {
    let out = dir.join("out/frames.jsonl");
    let text = format!(
        "[sources.cam]\nuri = {}\n\n[sinks.log]\nkind = \"jsonl\"\npath = {}\n",
        toml_str(uri),
        toml_str(&out.to_string_lossy())
    );
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

#[test]
fn validate_accepts_a_valid_file() {
    let path = fixture("valid-test-chain.toml");
    let (code, stdout, stderr) = run(vidflow().arg("validate").arg(&path));
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(
        stdout.contains(&format!("{}: ok", path.display())),
        "{stdout}"
    );
}

#[test]
fn validate_refuses_an_invalid_file_with_located_problems() {
    let path = fixture("invalid-many-problems.toml");
    let (code, stdout, stderr) = run(vidflow().arg("validate").arg(&path));
    assert_eq!(code, EXIT_CONFIG, "stderr: {stderr}");
    assert!(!stdout.contains("ok"), "{stdout}");
    let prefix = format!("{}:", path.display());
    let located: Vec<&str> = stderr.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert!(located.len() >= 3, "{stderr}");
    for line in &located {
        let mut rest = line[prefix.len()..].splitn(3, ':');
        let line_no = rest.next().and_then(|n| n.parse::<usize>().ok());
        let column = rest.next().and_then(|n| n.parse::<usize>().ok());
        assert!(
            line_no.is_some_and(|n| n >= 1) && column.is_some_and(|n| n >= 1),
            "not path:line:col: {line}"
        );
    }
    assert!(
        stderr.contains(&format!(
            "{prefix}7:11: executor: workers must be between 1 and 256"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{} problem(s) found", located.len())),
        "{stderr}"
    );
}

#[test]
fn validate_refuses_bad_zones_and_lines_at_their_place_with_exit_78() {
    for (name, want) in [
        (
            "invalid-zone-two-points.toml",
            "15:65: step \"zones\": zone \"gate\" needs at least 3 points [x, y], not 2",
        ),
        (
            "invalid-line-three-points.toml",
            "15:8: step \"door\": line needs exactly 2 points [x, y], not 3",
        ),
        (
            "invalid-zone-line-not-numbers.toml",
            "15:20: step \"door\": invalid type: string \"320\", expected a number",
        ),
    ] {
        let path = fixture(name);
        let (code, _, stderr) = run(vidflow().arg("validate").arg(&path));
        assert_eq!(code, EXIT_CONFIG, "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{}:{want}", path.display())),
            "{name}: {stderr}"
        );
    }
}

#[test]
fn validate_refuses_a_live_video_that_is_neither_encode_nor_stills_at_its_place_with_exit_78() {
    let path = fixture("invalid-source-live-video.toml");
    let (code, _, stderr) = run(vidflow().arg("validate").arg(&path));
    assert_eq!(code, EXIT_CONFIG, "{stderr}");
    let want = "4:14: source \"cam\": live_video must be \"encode\" or \"stills\", not \"video\"";
    assert!(
        stderr.contains(&format!("{}:{want}", path.display())),
        "{stderr}"
    );
}

/// A calibration that cannot be fitted is refused at the point it is about, each with what to
/// fix, and exit 78 (the same fixtures `config_validation` checks through the library).
#[test]
fn validate_refuses_a_bad_calibration_at_its_point_with_exit_78() {
    for name in [
        "invalid-calibration-three-points",
        "invalid-calibration-point-outside",
        "invalid-calibration-three-in-a-line",
        "invalid-calibration-off-the-plane",
    ] {
        let path = fixture(&format!("{name}.toml"));
        let want = std::fs::read_to_string(fixture(&format!("{name}.expected"))).unwrap();
        let (code, _, stderr) = run(vidflow().arg("validate").arg(&path));
        assert_eq!(code, EXIT_CONFIG, "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{}:{}", path.display(), want.trim())),
            "{name}: {stderr}"
        );
        assert!(stderr.contains("1 problem(s) found"), "{name}: {stderr}");
    }
}

/// `clip`'s image may be left out in packets mode (the camera's own stream, copied), and only
/// there: an encoding clip without it is refused where the sink is declared.
#[test]
fn validate_takes_a_packet_clip_without_image_and_refuses_an_encoding_one_with_exit_78() {
    let packets = fixture("valid-clip-packets-no-image.toml");
    let (code, stdout, stderr) = run(vidflow().arg("validate").arg(&packets));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let encode = fixture("invalid-clip-encode-no-image.toml");
    let (code, _, stderr) = run(vidflow().arg("validate").arg(&encode));
    assert_eq!(code, EXIT_CONFIG, "{stderr}");
    let want = "6:8: sink \"clips\": missing input \"image\" (it may be left out only with \
                mode = \"packets\")";
    assert!(
        stderr.contains(&format!("{}:{want}", encode.display())),
        "{stderr}"
    );
}

#[test]
fn validate_reports_the_problems_of_every_file_given() {
    let valid = fixture("valid-minimal.toml");
    let cycle = fixture("invalid-cycle-self.toml");
    let kind = fixture("invalid-unknown-step-kind.toml");
    let (code, stdout, stderr) = run(vidflow().arg("validate").args([&cycle, &valid, &kind]));
    assert_eq!(code, EXIT_CONFIG, "stderr: {stderr}");
    assert!(
        stderr.contains(&format!("{}:4:8: steps form a cycle", cycle.display())),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{}:5:8: step \"edges\": unknown kind \"canny\"",
            kind.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("2 problem(s) found"), "{stderr}");
    assert!(
        stdout.contains(&format!("{}: ok", valid.display())),
        "{stdout}"
    );
}

#[test]
fn graph_prints_the_workflow_as_dot() {
    let (code, stdout, stderr) = run(vidflow().arg("graph").arg(fixture("valid-test-chain.toml")));
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.trim_start().starts_with("digraph"), "{stdout}");
    assert!(stdout.trim_end().ends_with('}'), "{stdout}");
    for step in ["small", "gray", "soft"] {
        assert!(
            stdout.contains(&format!("\"step:{step}\"")),
            "{step}: {stdout}"
        );
    }
    assert!(
        stdout.contains("\"step:small\" -> \"step:gray\""),
        "no edge small -> gray: {stdout}"
    );
    assert!(
        stdout.contains("\"step:soft\" -> \"sink:video\""),
        "no edge soft -> video: {stdout}"
    );
}

#[test]
fn graph_of_an_invalid_file_is_a_config_error() {
    let path = fixture("invalid-cycle-two-steps.toml");
    let (code, stdout, stderr) = run(vidflow().arg("graph").arg(&path));
    assert_eq!(code, EXIT_CONFIG, "stderr: {stderr}");
    assert!(!stdout.contains("digraph"), "{stdout}");
    assert!(
        stderr.contains(&format!("{}:4:8: steps form a cycle", path.display())),
        "{stderr}"
    );
}

#[test]
fn steps_lists_every_kind_with_its_ports_and_params() {
    let (code, stdout, stderr) = run(vidflow().arg("steps"));
    assert_eq!(code, 0, "stderr: {stderr}");
    // Each kind is a block, separated from the next by a blank line, headed `  NAME: summary`
    // or `  NAME (stateful): summary`.
    let block = |name: &str| -> &str {
        stdout
            .split("\n\n")
            .find(|b| {
                let head = b.trim_start();
                head.starts_with(&format!("{name}:")) || head.starts_with(&format!("{name} ("))
            })
            .unwrap_or_else(|| panic!("kind {name:?} not listed:\n{stdout}"))
    };
    for k in steps::KINDS {
        let b = block(k.name);
        assert!(b.contains(k.summary), "{}: {b}", k.name);
        assert_eq!(b.contains("(stateful)"), k.stateful, "{}: {b}", k.name);
        for p in k.inputs {
            assert!(b.contains(&format!("input  {}", p.name)), "{}: {b}", k.name);
        }
        for p in k.outputs {
            assert!(b.contains(&format!("output {}", p.name)), "{}: {b}", k.name);
        }
        for p in k.params {
            assert!(b.contains(&format!("param  {}", p.name)), "{}: {b}", k.name);
            assert!(b.contains(p.doc), "{}.{}: {b}", k.name, p.name);
        }
    }
    for k in sinks::KINDS {
        let b = block(k.name);
        assert!(b.contains(k.summary), "{}: {b}", k.name);
        for p in k.inputs {
            assert!(b.contains(&format!("input  {}", p.name)), "{}: {b}", k.name);
        }
        for p in k.params {
            assert!(b.contains(&format!("param  {}", p.name)), "{}: {b}", k.name);
            assert!(b.contains(p.doc), "{}.{}: {b}", k.name, p.name);
        }
    }
}

#[test]
fn run_with_a_missing_source_file_is_unavailable_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-clip.mp4");
    let pipeline = write_pipeline(dir.path(), &missing.to_string_lossy());
    let (code, _, stderr) = run(vidflow().arg("run").arg(&pipeline));
    assert_eq!(code, EXIT_UNAVAILABLE, "stderr: {stderr}");
    assert!(
        stderr.contains(&*missing.to_string_lossy()),
        "stderr does not name {}: {stderr}",
        missing.display()
    );
}

#[test]
fn run_with_a_missing_pipeline_file_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.toml");
    let (code, _, stderr) = run(vidflow().arg("run").arg(&path));
    assert_eq!(code, EXIT_CONFIG, "stderr: {stderr}");
    assert!(stderr.contains(&*path.to_string_lossy()), "{stderr}");
}

#[test]
fn run_never_prints_the_rtsp_password() {
    let dir = tempfile::tempdir().unwrap();
    // Port 1 on loopback refuses the connection at once; two retries, then it gives up.
    let pipeline = write_pipeline(dir.path(), "rtsp://user:s3cret-pw@127.0.0.1:1/x");
    let text = std::fs::read_to_string(&pipeline).unwrap().replacen(
        "\n\n[sinks.log]",
        "\n[sources.cam.reconnect]\ninitial_delay_ms = 50\nmax_attempts = 2\n\n[sinks.log]",
        1,
    );
    std::fs::write(&pipeline, text).unwrap();
    let stdout_path = dir.path().join("stdout.txt");
    let stderr_path = dir.path().join("stderr.txt");
    let mut child = vidflow()
        .env("VIDFLOW_LOG", "debug")
        .arg("run")
        .arg(&pipeline)
        .stdin(Stdio::null())
        .stdout(File::create(&stdout_path).unwrap())
        .stderr(File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > RTSP_REFUSED_DEADLINE {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&stdout_path).unwrap();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(
        !stdout.contains("s3cret-pw"),
        "password on stdout: {stdout}"
    );
    assert!(
        !stderr.contains("s3cret-pw"),
        "password on stderr: {stderr}"
    );
    let status = status.unwrap_or_else(|| {
        panic!("still running after {RTSP_REFUSED_DEADLINE:?}; stderr: {stderr}")
    });
    assert_eq!(status.code(), Some(EXIT_UNAVAILABLE), "stderr: {stderr}");
    assert!(stderr.contains("user:***@127.0.0.1:1"), "{stderr}");
    assert!(
        stderr.contains("gave up after 2 reconnection attempts"),
        "{stderr}"
    );
}

/// A step that fails every frame (a crop outside the 64x48 frame) and no sink reads is named
/// (validate, graph, the run's log) and still run: its failures are the run's, read or not.
#[test]
fn a_step_no_sink_reads_is_named_and_still_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("frames.jsonl");
    let pipeline = |include: &str| {
        format!(
            "[sources.cam]\nuri = \"test://ball?width=64&height=48&frames=5\"\n\n\
             [steps.small]\nkind = \"grayscale\"\nimage = \"$frame\"\n\n\
             [steps.outside]\nkind = \"crop\"\nimage = \"$frame\"\nx = 60\ny = 0\nwidth = 32\nheight = 32\n\n\
             [sinks.log]\nkind = \"jsonl\"\npath = {}\ninclude = [{include}]\n",
            toml_str(&out.to_string_lossy())
        )
    };
    let path = dir.path().join("pipeline.toml");
    std::fs::write(&path, pipeline("\"$steps.small.image\"")).unwrap();
    let (code, stdout, stderr) = run(vidflow().arg("validate").arg(&path));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("step whose output no sink reads") && stdout.contains("\"outside\""),
        "{stdout}"
    );
    let (_, dot, _) = run(vidflow().arg("graph").arg(&path));
    assert!(
        dot.contains("\"step:outside\" [shape=box, style=dashed")
            && dot.contains("\"step:small\" [shape=box, label"),
        "{dot}"
    );
    let stats = dir.path().join("stats.json");
    let (code, _, stderr) = run(vidflow()
        .arg("run")
        .arg(&path)
        .arg("--stats-json")
        .arg(&stats));
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("\"outside\""), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(
        (
            report["frames_processed"].as_u64(),
            report["frames_failed"].as_u64()
        ),
        (Some(0), Some(5)),
        "{report}"
    );

    std::fs::write(
        &path,
        pipeline("\"$steps.small.image\", \"$steps.outside.image\""),
    )
    .unwrap();
    let (code, stdout, stderr) = run(vidflow().arg("validate").arg(&path));
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("no sink reads"), "{stdout}");
    let (_, _, stderr) = run(vidflow()
        .arg("run")
        .arg(&path)
        .arg("--stats-json")
        .arg(&stats));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(
        report["frames_failed"].as_u64(),
        Some(5),
        "{stderr}\n{report}"
    );
}
