//! Pipeline file validation against the fixtures in `tests/fixtures/`.
//!
//! Every `valid-*.toml` must load. Every `invalid-*.toml` must be refused with exactly the
//! problems listed in its `invalid-*.expected`, one per line as `LINE:COLUMN: message-substring`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use vidflow::config::{self, ConfigError, Problem};

/// The fewest invalid fixtures the suite should keep, so that coverage does not silently shrink.
const MIN_INVALID_FIXTURES: usize = 15;

fn fixtures(prefix: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| {
            entry
                .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
                .path()
        })
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.starts_with(prefix) && name.ends_with(".toml")
        })
        .collect();
    found.sort();
    found
}

/// One line of an `.expected` file.
#[derive(Debug)]
struct Expected {
    line: usize,
    column: usize,
    message: String,
}

impl Expected {
    fn matches(&self, p: &Problem) -> bool {
        p.line == self.line && p.column == self.column && p.message.contains(&self.message)
    }
}

fn expected_problems(toml: &Path) -> Vec<Expected> {
    let path = toml.with_extension("expected");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: cannot read: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut parts = l.splitn(3, ':');
            let mut number = || {
                parts
                    .next()
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or_else(|| panic!("{}: bad line {l:?}", path.display()))
            };
            let (line, column) = (number(), number());
            let message = parts.next().unwrap_or_default().trim().to_owned();
            assert!(
                !message.is_empty(),
                "{}: no message in {l:?}",
                path.display()
            );
            Expected {
                line,
                column,
                message,
            }
        })
        .collect()
}

#[test]
fn valid_fixtures_load() {
    let valid = fixtures("valid-");
    assert!(!valid.is_empty(), "no valid-*.toml fixtures found");
    let mut failures = String::new();
    for path in &valid {
        if let Err(e) = config::load(path) {
            let _ = writeln!(failures, "{}:\n{e}\n", path.display());
        }
    }
    assert!(failures.is_empty(), "valid fixtures refused:\n{failures}");
}

#[test]
fn invalid_fixtures_report_exactly_their_expected_problems() {
    let mut failures = String::new();
    for path in fixtures("invalid-") {
        let expected = expected_problems(&path);
        let problems = match config::load(&path) {
            Ok(_) => {
                let _ = writeln!(
                    failures,
                    "{}: loaded, but should be invalid",
                    path.display()
                );
                continue;
            }
            Err(ConfigError::Invalid { problems }) => problems,
            Err(e) => {
                let _ = writeln!(failures, "{}: not a validation error: {e}", path.display());
                continue;
            }
        };
        let reported: String = problems.iter().map(|p| format!("\n    {p}")).collect();
        for want in &expected {
            if !problems.iter().any(|p| want.matches(p)) {
                let _ = writeln!(
                    failures,
                    "{}: no problem at {}:{} containing {:?}; reported:{reported}",
                    path.display(),
                    want.line,
                    want.column,
                    want.message
                );
            }
        }
        if problems.len() != expected.len() {
            let _ = writeln!(
                failures,
                "{}: {} problem(s) reported, {} expected; reported:{reported}",
                path.display(),
                problems.len(),
                expected.len()
            );
        }
    }
    assert!(failures.is_empty(), "{failures}");
}

#[test]
fn every_invalid_fixture_has_an_expected_file_and_there_are_enough() {
    let invalid = fixtures("invalid-");
    assert!(
        invalid.len() >= MIN_INVALID_FIXTURES,
        "only {} invalid fixtures, want at least {MIN_INVALID_FIXTURES}",
        invalid.len()
    );
    let missing: Vec<_> = invalid
        .iter()
        .map(|p| p.with_extension("expected"))
        .filter(|p| !p.is_file())
        .collect();
    assert!(missing.is_empty(), "missing .expected files: {missing:?}");
}

#[test]
fn one_file_reports_all_of_its_problems_at_once() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid-many-problems.toml");
    let Err(ConfigError::Invalid { problems }) = config::load(&path) else {
        panic!("{} should be invalid", path.display());
    };
    assert!(
        problems.len() >= 3,
        "only {} problem(s): {problems:?}",
        problems.len()
    );
    assert!(problems.iter().all(|p| p.path == path), "{problems:?}");
    let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
    assert!(lines.is_sorted(), "problems not in file order: {lines:?}");
}
