//! The layers of the crate, checked over the source text: every `crate::MODULE` path (in `use`
//! lines and in code) must point down the table below, never up or sideways, so the imports of
//! the top-level modules form no circle. ARCHITECTURE.md draws the same table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules from the bottom up. A module may import any module of a lower layer; in
/// the bottom layer (the shared vocabulary) modules may also import each other, without a circle.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "vocabulary",
        &["spec", "gst_setup", "frame", "value", "outcome"],
    ),
    ("kinds", &["steps", "sinks", "source"]),
    ("binding", &["config"]),
    ("workflow", &["workflow"]),
    ("daemon", &["daemon"]),
    ("command line", &["cli"]),
];

/// One `crate::MODULE` path: where it was written and what it names.
#[derive(Debug)]
struct Import {
    file: PathBuf,
    line: usize,
    from: String,
    to: String,
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/config/raw.rs` -> `config`); `None` for the
/// crate root and the binary.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib" && name != "main").then_some(name)
}

fn ident_at(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Top-level modules named after `crate::` on one line, including `crate::{a, b::c}`.
fn crate_paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in line.match_indices("crate::") {
        let rest = &line[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident_at(rest));
            continue;
        };
        let mut depth = 1;
        let mut expect_name = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 1 => break,
                '}' => depth -= 1,
                ',' if depth == 1 => expect_name = true,
                c if c.is_whitespace() => {}
                _ if expect_name && depth == 1 => {
                    out.push(ident_at(&group[i..]));
                    expect_name = false;
                }
                _ => {}
            }
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

fn imports() -> (BTreeSet<String>, Vec<Import>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut modules = BTreeSet::new();
    let mut found = Vec::new();
    for file in files {
        let Some(from) = module_of(&src, &file) else {
            continue;
        };
        modules.insert(from.clone());
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for to in crate_paths(code) {
                if to != from {
                    found.push(Import {
                        file: file.strip_prefix(&src).unwrap().to_owned(),
                        line: n + 1,
                        from: from.clone(),
                        to,
                    });
                }
            }
        }
    }
    (modules, found)
}

#[test]
fn every_module_has_a_layer_and_every_layer_entry_exists() {
    let (modules, _) = imports();
    let unplaced: Vec<_> = modules.iter().filter(|m| layer_of(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer in tests/architecture.rs (and ARCHITECTURE.md): {unplaced:?}"
    );
    let listed: Vec<_> = LAYERS.iter().flat_map(|(_, mods)| mods.iter()).collect();
    let missing: Vec<_> = listed
        .into_iter()
        .filter(|m| !modules.contains(**m))
        .collect();
    assert!(
        missing.is_empty(),
        "layers name missing modules: {missing:?}"
    );
}

#[test]
fn imports_point_down_the_layers() {
    let (_, found) = imports();
    assert!(
        found.len() > 20,
        "the scan found only {} imports: is it reading src/?",
        found.len()
    );
    let wrong: Vec<String> = found
        .iter()
        .filter_map(|i| {
            let (from, to) = (layer_of(&i.from)?, layer_of(&i.to)?);
            (to > from || (to == from && from != 0)).then(|| {
                format!(
                    "src/{}:{}: {} ({}) imports {} ({})",
                    i.file.display(),
                    i.line,
                    i.from,
                    LAYERS[from].0,
                    i.to,
                    LAYERS[to].0
                )
            })
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn top_level_modules_import_each_other_without_a_circle() {
    let (modules, found) = imports();
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for i in &found {
        if modules.contains(&i.to) {
            edges.entry(&i.from).or_default().insert(&i.to);
        }
    }
    // Depth-first search; a module met again while still on the path closes a circle.
    fn visit<'a>(
        m: &'a str,
        edges: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(at) = path.iter().position(|p| *p == m) {
            let mut circle = path[at..].to_vec();
            circle.push(m);
            return Some(circle);
        }
        if !done.insert(m) {
            return None;
        }
        path.push(m);
        for next in edges.get(m).into_iter().flatten() {
            if let Some(circle) = visit(next, edges, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for m in &modules {
        let circle = visit(m, &edges, &mut Vec::new(), &mut done);
        assert!(circle.is_none(), "circle of imports: {circle:?}");
    }
}

#[test]
fn the_scanner_reads_grouped_and_nested_paths() {
    assert_eq!(
        crate_paths("use crate::{config::{self, ConfigError}, sinks, steps::Step};"),
        ["config", "sinks", "steps"]
    );
    assert_eq!(
        crate_paths("let x = crate::gst_setup::init(); crate::value::Value::Image(i)"),
        ["gst_setup", "value"]
    );
}
