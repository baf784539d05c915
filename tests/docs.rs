//! The documentation against the code: every TOML example of README.md and docs/ validates,
//! docs/reference/ is what the binary prints, every message troubleshooting and the log
//! reference name still exists in src/, the metrics table names every metric served, and every
//! relative link leads to a file and heading that exist.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common;

use common::repo_root;

/// The line before a ```toml block that is deliberately not a whole pipeline (it names files
/// that are not in this repository): such a block is not validated. Used sparingly.
const FRAGMENT_MARK: &str = "<!-- fragment:";

/// The most fragments the docs may hold: an example a user cannot check is the exception.
const MOST_FRAGMENTS: usize = 3;

fn vidflow() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vidflow"));
    c.env_remove("JOURNAL_STREAM").env("VIDFLOW_LOG", "warn");
    c
}

/// README.md and every Markdown file under docs/, relative to the repository.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| f.strip_prefix(&root).unwrap().to_path_buf())
        .collect()
}

/// A fenced block: its file, the line of its opening fence, its language and its text.
#[derive(Debug)]
struct Block {
    file: PathBuf,
    line: usize,
    lang: String,
    text: String,
    fragment: bool,
}

fn blocks(file: &Path, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let mut body = String::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push_str(lines[i]);
            body.push('\n');
            i += 1;
        }
        let before = lines[..start].iter().rev().find(|l| !l.trim().is_empty());
        out.push(Block {
            file: file.to_path_buf(),
            line: start + 1,
            lang: lang.trim().to_owned(),
            text: body,
            fragment: before.is_some_and(|l| l.trim_start().starts_with(FRAGMENT_MARK)),
        });
        i += 1;
    }
    out
}

fn all_blocks() -> Vec<Block> {
    markdown_files()
        .iter()
        .flat_map(|f| blocks(f, &std::fs::read_to_string(repo_root().join(f)).unwrap()))
        .collect()
}

/// The values of `KEY = "VALUE"` lines for keys ending in `_file` (credentials), and the
/// `${VARIABLE}`s of a block.
fn needs(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut files, mut vars) = (BTreeSet::new(), BTreeSet::new());
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        if let Some((key, value)) = line.split_once('=')
            && key.trim().ends_with("_file")
        {
            let value = value.trim().trim_matches('"');
            if !value.is_empty() && !value.starts_with('/') {
                files.insert(value.to_owned());
            }
        }
        let mut rest = line;
        while let Some(at) = rest.find("${") {
            let Some(end) = rest[at..].find('}') else {
                break;
            };
            vars.insert(rest[at + 2..at + end].to_owned());
            rest = &rest[at + end..];
        }
    }
    (files, vars)
}

#[test]
fn every_toml_example_in_the_docs_validates() {
    let all = all_blocks();
    let fragments: Vec<String> = all
        .iter()
        .filter(|b| b.lang == "toml" && b.fragment)
        .map(|b| format!("{}:{}", b.file.display(), b.line))
        .collect();
    assert!(
        fragments.len() <= MOST_FRAGMENTS,
        "{} fragments ({fragments:?}): give whole pipelines, which are checked",
        fragments.len()
    );
    let toml: Vec<&Block> = all
        .iter()
        .filter(|b| b.lang == "toml" && !b.fragment)
        .collect();
    assert!(toml.len() >= 20, "only {} TOML examples found", toml.len());

    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    let mut command = vidflow();
    command
        .current_dir(repo_root())
        .env("CREDENTIALS_DIRECTORY", &credentials)
        .arg("validate");
    let mut names = Vec::new();
    for b in &toml {
        let name = format!(
            "{}-line-{}.toml",
            b.file.display().to_string().replace('/', "_"),
            b.line
        );
        let path = dir.path().join(&name);
        std::fs::write(&path, &b.text).unwrap();
        let (files, vars) = needs(&b.text);
        for f in files {
            std::fs::write(credentials.join(f), "not-a-real-secret\n").unwrap();
        }
        for v in vars {
            command.env(v, "not-a-real-secret");
        }
        command.arg(&path);
        names.push(name);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failed: Vec<&str> = stderr
        .lines()
        .filter(|l| names.iter().any(|n| l.contains(n.as_str())))
        .collect();
    assert!(
        out.status.success() && failed.is_empty(),
        "examples that do not validate (FILE-line-N.toml: the block's fence is at line N):\n{}\n\n{stderr}",
        failed.join("\n")
    );
    for n in &names {
        assert!(stdout.contains(&format!("{n}: ok")), "{n}: {stdout}");
    }
}

#[test]
fn a_fragment_mark_keeps_a_block_out_of_validation() {
    let text = "<!-- fragment: names files of yours -->\n```toml\n[steps.a]\n```\n\n```toml\n[sources.b]\n```\n";
    let b = blocks(Path::new("x.md"), text);
    assert_eq!(
        b.iter().map(|b| (b.line, b.fragment)).collect::<Vec<_>>(),
        [(2, true), (6, false)]
    );
}

#[test]
fn the_reference_is_what_the_binary_prints() {
    for (command, file) in [
        ("steps", "steps.md"),
        ("sinks", "sinks.md"),
        ("sources", "sources.md"),
    ] {
        let out = vidflow().args([command, "--markdown"]).output().unwrap();
        assert!(out.status.success(), "{command}: {out:?}");
        let printed = String::from_utf8(out.stdout).unwrap();
        let path = repo_root().join("docs/reference").join(file);
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            printed == written,
            "docs/reference/{file} differs from `vidflow {command} --markdown`: run \
             scripts/gen-reference and commit the result"
        );
    }
}

#[test]
fn every_key_and_kind_is_in_the_reference() {
    let steps = std::fs::read_to_string(repo_root().join("docs/reference/steps.md")).unwrap();
    for k in vidflow::steps::KINDS {
        assert!(steps.contains(&format!("\n## {}\n", k.name)), "{}", k.name);
        for p in k.params {
            assert!(
                steps.contains(&format!("| `{}` |", p.name)),
                "{}.{}",
                k.name,
                p.name
            );
        }
    }
    let sinks = std::fs::read_to_string(repo_root().join("docs/reference/sinks.md")).unwrap();
    for k in vidflow::sinks::KINDS {
        assert!(sinks.contains(&format!("\n## {}\n", k.name)), "{}", k.name);
    }
}

/// The text of every .rs file under src/, with Rust's string continuations (`\` at the end of
/// a line) joined and `\"` unescaped, as a message reads when printed.
fn source_text() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut raw = String::new();
    walk(&repo_root().join("src"), &mut raw);
    let mut out = String::with_capacity(raw.len());
    let mut lines = raw.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(kept) = line.strip_suffix('\\') {
            out.push_str(kept);
            while let Some(next) = lines.peek() {
                let next = next.trim_start();
                if let Some(more) = next.strip_suffix('\\') {
                    out.push_str(more);
                    lines.next();
                } else {
                    break;
                }
            }
            if let Some(next) = lines.next() {
                out.push_str(next.trim_start());
            }
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out.replace("\\\"", "\"")
}

/// The first code span of the first cell of each table row of `text` (the message a row is
/// keyed by).
fn keyed_messages(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(m, _)| m.to_owned()))
        .collect()
}

#[test]
fn every_message_the_docs_are_keyed_by_exists_in_the_code() {
    let source = source_text();
    let mut checked = 0;
    for file in ["docs/troubleshooting.md", "docs/reference/log-messages.md"] {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        let messages = keyed_messages(&text);
        assert!(messages.len() >= 15, "{file}: {messages:?}");
        for m in messages {
            // `...` stands for what changes (a name, a number): each piece between is literal.
            for piece in m.split("...").filter(|p| !p.trim().is_empty()) {
                assert!(
                    source.contains(piece),
                    "{file}: the message {m:?} is not in src/ any more (no {piece:?}): \
                     update the table"
                );
            }
            checked += 1;
        }
    }
    eprintln!("{checked} messages found in src/");
}

#[test]
fn the_metrics_table_names_every_metric_served() {
    let code: String = ["mod.rs", "table.rs"]
        .map(|f| {
            std::fs::read_to_string(repo_root().join("src/daemon/http/metrics").join(f)).unwrap()
        })
        .concat();
    let served: BTreeSet<String> = code
        .split('"')
        .filter(|s| {
            (s.starts_with("vidflow_") || s.starts_with("process_"))
                && s.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .map(str::to_owned)
        .collect();
    let table = std::fs::read_to_string(repo_root().join("docs/reference/metrics.md")).unwrap();
    let documented: BTreeSet<String> = keyed_messages(&table).into_iter().collect();
    assert!(served.len() >= 30, "{served:?}");
    let missing: Vec<_> = served.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/reference/metrics.md lacks {missing:?} and names {stale:?}, which is not served"
    );
}

/// GitHub's anchor of a heading: lowercase, punctuation dropped, spaces as dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_block = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if !in_block && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_relative_link_leads_somewhere() {
    let root = repo_root();
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(root.join(&file)).unwrap();
        for (_, rest) in text.match_indices("](").map(|(i, _)| ((), &text[i + 2..])) {
            let Some(target) = rest.split(')').next() else {
                continue;
            };
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
            let linked = if path.is_empty() {
                file.clone()
            } else {
                normalize(&file.parent().unwrap().join(path))
            };
            let shown = linked.display().to_string();
            if !root.join(&linked).exists() {
                broken.push(format!("{}: {target} (no {shown})", file.display()));
            } else if !fragment.is_empty() {
                let linked_text = std::fs::read_to_string(root.join(&linked)).unwrap();
                if !anchors(&linked_text).contains(fragment) {
                    broken.push(format!(
                        "{}: {target} (no heading #{fragment})",
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `a/b/../c` as `a/c`.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn the_readme_stays_short_and_answers_the_first_questions() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines < 300,
        "README.md is {lines} lines: move detail into docs/"
    );
    for (question, link) in [
        (
            "an RTSP camera with a password",
            "docs/guides/cameras.md#a-camera-with-a-password",
        ),
        (
            "the detector's confidence",
            "docs/reference/steps.md#object_detection",
        ),
        ("exit 69", "docs/reference/exit-codes.md"),
        (
            "30 days of recordings",
            "docs/guides/outputs-and-retention.md#keep-30-days-of-recordings",
        ),
    ] {
        assert!(
            readme.contains(question) && readme.contains(link),
            "README.md does not lead to {question:?} ({link})"
        );
    }
}

/// The lines that put `key = value` in the table `header` of a pipeline with one source.
fn table_with(header: &str, key: &str, value: &str) -> String {
    let source = "[sources.a]\nuri = \"rtsp://127.0.0.1:1/x\"\n";
    match header {
        "[sources.NAME]" => format!("{source}{key} = {value}\n"),
        "[sources.NAME.reconnect]" => format!("{source}[sources.a.reconnect]\n{key} = {value}\n"),
        other => format!("{source}{other}\n{key} = {value}\n"),
    }
}

#[test]
fn every_range_the_sources_reference_gives_is_the_one_validation_takes() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for t in vidflow::config::SOURCE_TABLES
        .iter()
        .chain(vidflow::config::OTHER_TABLES)
    {
        for p in t.keys {
            let Some(bounds) = p.bounds() else { continue };
            let integer = p.type_and_range().0.contains("integer");
            let (outside, inside) = bounds.probes(if integer { 1.0 } else { 0.001 });
            let value = |v: f64| {
                if integer {
                    format!("{v}")
                } else {
                    format!("{v:?}")
                }
            };
            for (v, valid) in outside
                .iter()
                .map(|v| (*v, false))
                .chain(inside.iter().map(|v| (*v, true)))
            {
                let path = dir.path().join(format!("{}-{}.toml", files.len(), p.name));
                std::fs::write(&path, table_with(t.header, p.name, &value(v))).unwrap();
                files.push((
                    path,
                    format!("{} {} = {}", t.header, p.name, value(v)),
                    valid,
                ));
            }
        }
    }
    assert!(files.len() >= 30, "only {} probes", files.len());
    let out = vidflow()
        .arg("validate")
        .args(files.iter().map(|f| &f.0))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for (path, what, valid) in &files {
        let ok = stdout.contains(&format!("{}: ok", path.display()));
        assert_eq!(
            ok,
            *valid,
            "{what}: the reference says it is {} its range, validate says otherwise:\n{stderr}",
            if *valid { "inside" } else { "outside" }
        );
    }
}

/// The keys `validate` names when it refuses the unknown key `zz_unknown` in `text`'s last
/// table (the keys that table takes), or `None` if it named none.
fn keys_taken(stderr: &str, file: &Path) -> Option<BTreeSet<String>> {
    let line = stderr
        .lines()
        .find(|l| l.starts_with(&file.display().to_string()) && l.contains("zz_unknown"))?;
    if line.contains("takes no keys") {
        return Some(BTreeSet::new());
    }
    let (_, list) = line.split_once("expected")?;
    Some(
        list.split('"')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

#[test]
fn every_key_a_table_or_kind_takes_is_in_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let source = "[sources.a]\nuri = \"rtsp://127.0.0.1:1/x\"\n";
    // (what, the file's text, the keys documented, whether they must be all it takes)
    let mut cases: Vec<(String, String, BTreeSet<String>, bool)> = Vec::new();
    for t in vidflow::config::SOURCE_TABLES
        .iter()
        .chain(vidflow::config::OTHER_TABLES)
    {
        let table = match t.header {
            "[sources.NAME]" => String::new(),
            "[sources.NAME.reconnect]" => "[sources.a.reconnect]\n".to_owned(),
            "[sources.NAME.calibration]" => "[sources.a.calibration]\n".to_owned(),
            "[http]" => "[http]\nlisten = \"127.0.0.1:9464\"\n".to_owned(),
            other => format!("{other}\n"),
        };
        let text = format!("{source}{table}zz_unknown = 1\n");
        let mut keys: BTreeSet<String> = t.keys.iter().map(|k| k.name.to_owned()).collect();
        if t.header == "[sources.NAME]" {
            // A table of its own, documented as such.
            keys.insert("reconnect".to_owned());
            keys.insert("calibration".to_owned());
        }
        cases.push((t.header.to_owned(), text, keys, true));
    }
    // Every input given (of the wrong type, maybe: another problem), so the kind parses.
    let component = |section: &str, kind: &str, inputs: Vec<(&str, bool)>| {
        let inputs: String = inputs
            .iter()
            .map(|(name, list)| match list {
                true => format!("{name} = [\"$frame\"]\n"),
                false => format!("{name} = \"$frame\"\n"),
            })
            .collect();
        format!("{source}[{section}.s]\nkind = \"{kind}\"\n{inputs}zz_unknown = 1\n")
    };
    let documented = |params: &[vidflow::spec::ParamDoc]| {
        params
            .iter()
            .map(|p| p.name.to_owned())
            .collect::<BTreeSet<_>>()
    };
    for k in vidflow::steps::KINDS {
        let text = component(
            "steps",
            k.name,
            k.inputs.iter().map(|i| (i.name, false)).collect(),
        );
        cases.push((format!("step {}", k.name), text, documented(k.params), true));
    }
    for k in vidflow::sinks::KINDS {
        let text = component(
            "sinks",
            k.name,
            k.inputs.iter().map(|i| (i.name, i.list)).collect(),
        );
        // A sink parses its shared settings (delivery, retention) apart: it names its own keys.
        cases.push((
            format!("sink {}", k.name),
            text,
            documented(k.params),
            false,
        ));
    }
    let mut command = vidflow();
    command.arg("validate");
    let files: Vec<PathBuf> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let path = dir.path().join(format!("{i}.toml"));
            std::fs::write(&path, &c.1).unwrap();
            path
        })
        .collect();
    let out = command.args(&files).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    for ((what, _, documented, all), file) in cases.iter().zip(&files) {
        let taken = keys_taken(&stderr, file)
            .unwrap_or_else(|| panic!("{what}: zz_unknown was not refused:\n{stderr}"));
        let undocumented: Vec<_> = taken.difference(documented).collect();
        assert!(
            undocumented.is_empty(),
            "{what} takes {undocumented:?}, which the reference does not document"
        );
        if *all {
            let stale: Vec<_> = documented.difference(&taken).collect();
            assert!(
                stale.is_empty(),
                "{what}: the reference documents {stale:?}, not taken"
            );
        }
    }
}
