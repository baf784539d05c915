//! The layers of the crate, checked over the parsed source (`syn`): every path that leads into
//! another top-level module must point down the table below, never up or sideways, so the
//! imports of the top-level modules form no circle. ARCHITECTURE.md draws the same table.
//!
//! Counted: every `use` tree (nested groups, `self`, renames, globs) and every path in code or
//! a type (`crate::daemon::run()`, `crate::value::Value`, also inside macro calls), written from
//! the crate root (`crate::`) or relative to the file's module (`super::super::x`, resolved
//! from `src/a/b.rs` or `src/a/b/mod.rs`, and inline `mod` blocks). Comments, strings and doc
//! text never count; nor do `pub(in ...)` restrictions, which can only name an ancestor.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// Top-level modules from the bottom up. A module may import any module of a lower layer; in
/// the bottom layer (the shared vocabulary) modules may also import each other, without a circle.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "vocabulary",
        &[
            "spec",
            "gst_setup",
            "frame",
            "value",
            "outcome",
            "packets",
            "storage",
            "events",
            "throttle",
        ],
    ),
    ("kinds", &["steps", "sinks", "source"]),
    ("binding", &["config"]),
    ("workflow", &["workflow"]),
    ("daemon", &["daemon"]),
    ("command line", &["cli"]),
];

/// One path from a file into another top-level module: where it was written and what it names.
#[derive(Debug)]
struct Import {
    file: PathBuf,
    line: usize,
    from: String,
    to: String,
    /// The whole path, from the crate root.
    path: String,
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

/// The module a file under `src/` is (`config/raw.rs` and `config/raw/mod.rs` -> `config::raw`);
/// empty for the crate root and the binary.
fn module_path(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.strip_suffix(".rs").unwrap();
    let root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !root {
        parts.push(stem.to_owned());
    }
    parts
}

/// The path from the crate root that `segments`, written in `module`, names; `None` for one that
/// does not start at the crate (`std::`, an external crate, a local name) or climbs above it.
fn resolve(module: &[String], segments: &[String]) -> Option<Vec<String>> {
    let mut rest = segments;
    let mut base = match rest.first()?.as_str() {
        "crate" => {
            rest = &rest[1..];
            Vec::new()
        }
        "self" => {
            rest = &rest[1..];
            module.to_vec()
        }
        "super" => module.to_vec(),
        _ => return None,
    };
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Collects the crate paths of one file: `(line, path from the crate root)`.
struct Paths {
    /// The module being read: the file's, plus the inline `mod` blocks around this point.
    module: Vec<String>,
    found: Vec<(usize, Vec<String>)>,
}

impl Paths {
    fn record(&mut self, line: usize, segments: &[String]) {
        if let Some(path) = resolve(&self.module, segments)
            && !path.is_empty()
        {
            self.found.push((line, path));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.use_name(prefix, &n.ident),
            syn::UseTree::Rename(r) => self.use_name(prefix, &r.ident),
            syn::UseTree::Glob(g) => {
                let line = g.star_token.spans[0].start().line;
                self.record(line, prefix);
            }
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(prefix, item);
                }
            }
        }
    }

    /// The last name of a `use` path; `self` names the path before it (`config::{self, X}`).
    fn use_name(&mut self, prefix: &[String], ident: &syn::Ident) {
        let mut path = prefix.to_vec();
        if ident != "self" {
            path.push(ident.to_string());
        }
        self.record(ident.span().start().line, &path);
    }

    /// A macro's arguments are tokens, not syntax: paths starting with `crate` or `super` are
    /// read from them (`ident :: ident ...`). String literals are single tokens, so a path
    /// inside one is not read.
    fn tokens(&mut self, stream: TokenStream) {
        let tokens: Vec<TokenTree> = stream.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" || id == "super" => {
                    let line = id.span().start().line;
                    let mut segments = vec![id.to_string()];
                    while let [
                        TokenTree::Punct(a),
                        TokenTree::Punct(b),
                        TokenTree::Ident(next),
                        ..,
                    ] = &tokens[i + 1..]
                    {
                        if !(a.as_char() == ':'
                            && a.spacing() == Spacing::Joint
                            && b.as_char() == ':')
                        {
                            break;
                        }
                        segments.push(next.to_string());
                        i += 3;
                    }
                    if segments.len() > 1 {
                        self.record(line, &segments);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        // `use ::name` names an external crate.
        if item.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = path.segments[0].ident.span().start().line;
            self.record(line, &segments);
        }
        visit::visit_path(self, path);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.module.push(item.ident.to_string());
        visit::visit_item_mod(self, item);
        self.module.pop();
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        visit::visit_macro(self, mac);
    }

    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {}
}

/// The crate paths in the text of `file` (a path under `src/`), each resolved from the crate
/// root: `(line, path)`.
fn paths_in(file: &Path, text: &str) -> Vec<(usize, Vec<String>)> {
    let syntax = syn::parse_file(text)
        .unwrap_or_else(|e| panic!("src/{}: cannot parse: {e}", file.display()));
    let mut paths = Paths {
        module: module_path(file),
        found: Vec::new(),
    };
    paths.visit_file(&syntax);
    paths.found
}

/// The paths of `file` into other top-level modules; none for the crate root and the binary.
fn imports_in(file: &Path, text: &str) -> Vec<Import> {
    let Some(from) = module_path(file).first().cloned() else {
        return Vec::new();
    };
    paths_in(file, text)
        .into_iter()
        .filter(|(_, path)| path[0] != from)
        .map(|(line, path)| Import {
            file: file.to_owned(),
            line,
            from: from.clone(),
            to: path[0].clone(),
            path: path.join("::"),
        })
        .collect()
}

fn imports() -> (BTreeSet<String>, Vec<Import>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut modules = BTreeSet::new();
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        if let Some(module) = module_path(rel).first() {
            modules.insert(module.clone());
        }
        found.extend(imports_in(rel, &std::fs::read_to_string(&file).unwrap()));
    }
    (modules, found)
}

/// The imports that go up the layers, or sideways above the bottom layer.
fn against_the_layers(found: &[Import]) -> Vec<String> {
    found
        .iter()
        .filter_map(|i| {
            let (from, to) = (layer_of(&i.from)?, layer_of(&i.to)?);
            (to > from || (to == from && from != 0)).then(|| {
                format!(
                    "src/{}:{}: {} ({}) imports crate::{} ({})",
                    i.file.display(),
                    i.line,
                    i.from,
                    LAYERS[from].0,
                    i.path,
                    LAYERS[to].0
                )
            })
        })
        .collect()
}

/// A circle in the imports between `modules`, if there is one: `[a, b, ..., a]`.
fn circle(modules: &BTreeSet<String>, found: &[Import]) -> Option<Vec<String>> {
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for i in found {
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
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| *p == m) {
            let mut circle: Vec<String> = path[at..].iter().map(|s| (*s).to_owned()).collect();
            circle.push(m.to_owned());
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
    modules
        .iter()
        .find_map(|m| visit(m, &edges, &mut Vec::new(), &mut done))
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
        "the parser found only {} imports: is it reading src/?",
        found.len()
    );
    let wrong = against_the_layers(&found);
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn top_level_modules_import_each_other_without_a_circle() {
    let (modules, found) = imports();
    let circle = circle(&modules, &found);
    assert!(circle.is_none(), "circle of imports: {circle:?}");
}

/// The verdict of the layer rule on one file's text: the lines that break it.
fn verdict(file: &str, text: &str) -> Vec<usize> {
    against_the_layers(&imports_in(Path::new(file), text))
        .iter()
        .map(|w| w.split(':').nth(1).unwrap().parse().unwrap())
        .collect()
}

#[test]
fn a_group_opened_at_the_end_of_a_line_is_read() {
    // What rustfmt writes past 100 columns.
    let text = "use crate::{\n    daemon::Daemon,\n    value::Value,\n};\n";
    assert_eq!(verdict("steps/count.rs", text), [2]);
    // Nested groups, `self`, renames and globs.
    let text = "use crate::{\n    config::{self as c, raw::Raw},\n    value::Value as V,\n    \
                workflow::*,\n    spec::{self},\n};\n";
    assert_eq!(verdict("sinks/x.rs", text), [2, 2, 4]);
}

#[test]
fn super_is_resolved_from_the_module_of_the_file() {
    let text = "use super::super::daemon::Daemon;\n";
    // steps::x -> the crate root -> daemon: up the layers.
    assert_eq!(verdict("steps/x.rs", text), [1]);
    assert_eq!(verdict("steps/x/mod.rs", text), [1]);
    // steps::x::y -> steps -> steps::daemon: a module of steps itself.
    assert_eq!(verdict("steps/x/y.rs", text), Vec::<usize>::new());
    assert_eq!(
        paths_in(Path::new("steps/x/y.rs"), text),
        [(1, vec!["steps".into(), "daemon".into(), "Daemon".into()])]
    );
    assert_eq!(
        verdict("steps/x/y.rs", "use super::super::super::daemon;\n"),
        [1]
    );
    // An inline module is one level more; `super::` in a path in code counts too.
    let text = "mod tests {\n    use super::super::daemon;\n    fn f() {\n        \
                super::super::super::workflow::run();\n    }\n}\n";
    assert_eq!(verdict("steps/x.rs", text), [4]);
    // Climbing within the module is no import.
    let text = "use super::super::pool::Pool;\nuse super::Graph;\n";
    assert_eq!(
        verdict("workflow/executor/gate.rs", text),
        Vec::<usize>::new()
    );
}

#[test]
fn comments_and_strings_are_not_code_and_code_after_them_is() {
    let text = "// use crate::daemon::Daemon;\n\
                /// See [`crate::daemon`].\n\
                const HELP: &str = \"// use crate::daemon::Daemon\";\n\
                const URI: &str = \"rtsp://cam\"; use crate::daemon::Daemon;\n\
                /* crate::workflow::run() */\n\
                fn f() { log(\"crate::daemon::run()\"); }\n";
    assert_eq!(verdict("steps/x.rs", text), [4]);
}

#[test]
fn paths_in_code_and_types_are_read() {
    let text = "fn f(g: &crate::workflow::Graph) {\n    crate::daemon::stop();\n    \
                let _ = crate::value::Value::Empty;\n    \
                println!(\"{}\", crate::config::NAME);\n}\n\
                pub(in crate::steps) fn g() {}\n";
    assert_eq!(verdict("steps/x.rs", text), [1, 2, 4]);
    // The same from the command line, at the top: no problem.
    assert!(verdict("cli.rs", text).is_empty());
}

#[test]
fn a_circle_is_found_even_where_the_layers_allow_both_imports() {
    let modules: BTreeSet<String> = ["frame", "value", "outcome"].map(String::from).into();
    let mut found = imports_in(Path::new("frame.rs"), "use crate::value::Value;\n");
    found.extend(imports_in(
        Path::new("outcome.rs"),
        "use crate::frame::Frame;\n",
    ));
    assert!(against_the_layers(&found).is_empty());
    assert_eq!(circle(&modules, &found), None);
    found.extend(imports_in(
        Path::new("value/mod.rs"),
        "fn f() -> super::outcome::Outcome {}\n",
    ));
    assert_eq!(
        circle(&modules, &found).unwrap(),
        ["frame", "value", "outcome", "frame"]
    );
}

/// The longest function a reader can hold: its signature to its closing brace (STYLE.md aims at
/// about 100 lines).
const MAX_FUNCTION_LINES: usize = 120;

/// Every function and method with a body in one file: `(name, first line, lines)`; a method is
/// named `Type::name`, a function in an inline module `module::name`.
struct Functions {
    scope: Vec<String>,
    found: Vec<(String, usize, usize)>,
}

impl Functions {
    fn record(&mut self, sig: &syn::Signature, body: &syn::Block) {
        let first = sig.fn_token.span.start().line;
        let last = body.brace_token.span.close().end().line;
        let mut name = self.scope.clone();
        name.push(sig.ident.to_string());
        self.found.push((name.join("::"), first, last + 1 - first));
    }
}

impl<'ast> Visit<'ast> for Functions {
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        self.record(&item.sig, &item.block);
        visit::visit_item_fn(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        self.record(&item.sig, &item.block);
        visit::visit_impl_item_fn(self, item);
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(body) = &item.default {
            self.record(&item.sig, body);
        }
        visit::visit_trait_item_fn(self, item);
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        let ty = &item.self_ty;
        self.scope.push(quote_type(ty));
        visit::visit_item_impl(self, item);
        self.scope.pop();
    }

    fn visit_item_trait(&mut self, item: &'ast syn::ItemTrait) {
        self.scope.push(item.ident.to_string());
        visit::visit_item_trait(self, item);
        self.scope.pop();
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.scope.push(item.ident.to_string());
        visit::visit_item_mod(self, item);
        self.scope.pop();
    }
}

/// The last name of an impl's type (`impl Drop for Foo<T>` -> `Foo`).
fn quote_type(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map_or_else(String::new, |s| s.ident.to_string()),
        _ => "impl".to_owned(),
    }
}

/// The functions of `text` over [`MAX_FUNCTION_LINES`]: `file:line: name (N lines)`.
fn too_long(file: &str, text: &str) -> Vec<String> {
    let syntax = syn::parse_file(text).unwrap_or_else(|e| panic!("src/{file}: cannot parse: {e}"));
    let mut functions = Functions {
        scope: Vec::new(),
        found: Vec::new(),
    };
    functions.visit_file(&syntax);
    functions
        .found
        .into_iter()
        .filter(|(_, _, lines)| *lines > MAX_FUNCTION_LINES)
        .map(|(name, line, lines)| format!("src/{file}:{line}: {name} ({lines} lines)"))
        .collect()
}

#[test]
fn no_function_in_src_is_over_120_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut long = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        long.extend(too_long(&rel, &std::fs::read_to_string(file).unwrap()));
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them):\n{}",
        long.join("\n")
    );
}

#[test]
fn a_long_function_is_named_with_its_type_and_length() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    // 121 lines from `fn` to its closing brace: one too many.
    let text = format!(
        "struct S;\nimpl S {{\n    fn short() {{}}\n    fn run(&self) {{\n{}    }}\n}}\n",
        body(MAX_FUNCTION_LINES - 1)
    );
    assert_eq!(
        too_long("daemon/x.rs", &text),
        ["src/daemon/x.rs:4: S::run (121 lines)".to_owned()]
    );
    // 120 lines is the most, in an inline module or a trait's default body alike.
    let text = format!(
        "mod m {{\nfn f() {{\n{}}}\n}}\ntrait T {{ fn g() {{\n{}}} }}\n",
        body(MAX_FUNCTION_LINES - 2),
        body(MAX_FUNCTION_LINES - 1)
    );
    assert_eq!(
        too_long("x.rs", &text),
        ["src/x.rs:123: T::g (121 lines)".to_owned()]
    );
}

/// What each kind may import of the vocabulary (ARCHITECTURE.md, "What must never happen"): a
/// step kind what a step reads and makes; a sink kind also a finished frame, the retention of
/// what it writes, the record stream's packets, GStreamer and the once-per-interval warnings;
/// the source what it decodes and the packets it records. None reads the event store.
const KIND_IMPORTS: &[(&str, &[&str])] = &[
    ("steps", &["spec", "value", "frame"]),
    (
        "sinks",
        &[
            "spec",
            "value",
            "frame",
            "outcome",
            "storage",
            "packets",
            "gst_setup",
            "throttle",
        ],
    ),
    ("source", &["spec", "frame", "packets", "gst_setup"]),
];

/// The imports of the kinds that are not theirs to make: `src/...:line: kind imports path`.
fn kinds_reaching_too_far(found: &[Import]) -> Vec<String> {
    found
        .iter()
        .filter_map(|i| {
            let (_, allowed) = KIND_IMPORTS.iter().find(|(kind, _)| *kind == i.from)?;
            (!allowed.contains(&i.to.as_str())).then(|| {
                format!(
                    "src/{}:{}: {} imports crate::{}",
                    i.file.display(),
                    i.line,
                    i.from,
                    i.path
                )
            })
        })
        .collect()
}

#[test]
fn each_kind_imports_only_its_part_of_the_vocabulary() {
    let (_, found) = imports();
    let wrong = kinds_reaching_too_far(&found);
    assert!(
        wrong.is_empty(),
        "kinds importing what ARCHITECTURE.md does not give them:\n{}",
        wrong.join("\n")
    );
    // The rule itself: a step that reads the storage is caught, a sink that does is not.
    let text = "use crate::storage::Storage;\n";
    assert_eq!(
        kinds_reaching_too_far(&imports_in(Path::new("steps/x.rs"), text)).len(),
        1
    );
    assert!(kinds_reaching_too_far(&imports_in(Path::new("sinks/x.rs"), text)).is_empty());
}

/// The modules a registry (`static KINDS` in `src/DIR/mod.rs`) names: `&name::KIND` -> `name`.
fn registry(dir: &str) -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(dir)
        .join("mod.rs");
    let syntax = syn::parse_file(&std::fs::read_to_string(path).unwrap()).unwrap();
    let kinds = syntax
        .items
        .iter()
        .find_map(|item| match item {
            syn::Item::Static(s) if s.ident == "KINDS" => Some(s),
            _ => None,
        })
        .unwrap_or_else(|| panic!("src/{dir}/mod.rs has no KINDS"));
    let syn::Expr::Reference(array) = &*kinds.expr else {
        panic!("src/{dir}/mod.rs: KINDS is not &[...]");
    };
    let syn::Expr::Array(array) = &*array.expr else {
        panic!("src/{dir}/mod.rs: KINDS is not &[...]");
    };
    array
        .elems
        .iter()
        .map(|e| {
            let syn::Expr::Reference(r) = e else {
                panic!("src/{dir}/mod.rs: a KINDS entry is not &kind::KIND");
            };
            let syn::Expr::Path(p) = &*r.expr else {
                panic!("src/{dir}/mod.rs: a KINDS entry is not &kind::KIND");
            };
            p.path.segments[0].ident.to_string()
        })
        .collect()
}

/// The files and folders of `src/DIR` but `mod.rs` and `common/` (what kinds share).
fn rooms(dir: &str) -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            if p.is_dir() {
                Some(name)
            } else {
                name.strip_suffix(".rs").map(str::to_owned)
            }
        })
        .filter(|name| name != "mod" && name != "common")
        .collect()
}

#[test]
fn every_kind_is_a_file_or_folder_of_its_own_and_every_one_is_a_kind() {
    for dir in ["steps", "sinks"] {
        let (kinds, rooms) = (registry(dir), rooms(dir));
        assert!(kinds.len() >= 10, "src/{dir}: only {kinds:?} in KINDS");
        let not_kinds: Vec<_> = rooms.difference(&kinds).collect();
        assert!(
            not_kinds.is_empty(),
            "src/{dir}: {not_kinds:?} are not kinds: a helper goes in src/{dir}/common/"
        );
        let nowhere: Vec<_> = kinds.difference(&rooms).collect();
        assert!(
            nowhere.is_empty(),
            "src/{dir}: KINDS names {nowhere:?}, which are not files or folders of src/{dir}/"
        );
    }
}

/// Each room (a folder module)'s imports between its own files: `(room, from, to)`, where
/// `from` and `to` are files or folders directly in it (what `mod.rs` defines itself is the
/// room's, not a file's, and is left out).
fn room_imports() -> BTreeSet<(Vec<String>, String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<Vec<String>> = files
        .iter()
        .map(|f| module_path(f.strip_prefix(&src).unwrap()))
        .collect();
    let mut edges = BTreeSet::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let module = module_path(rel);
        let Some((name, room)) = module.split_last() else {
            continue;
        };
        // A file's own module is a child of its room; mod.rs is the room itself.
        if rel.file_name().is_some_and(|n| n == "mod.rs") {
            continue;
        }
        for (_, path) in paths_in(rel, &std::fs::read_to_string(file).unwrap()) {
            let Some(next) = path.get(room.len()) else {
                continue;
            };
            let mut sibling = room.to_vec();
            sibling.push(next.clone());
            if path.starts_with(room) && next != name && modules.contains(&sibling) {
                edges.insert((room.to_vec(), name.clone(), next.clone()));
            }
        }
    }
    edges
}

#[test]
fn the_files_of_a_room_import_each_other_without_a_circle() {
    // Two files of one folder that import each other share one job: the piece both need
    // belongs in a file of its own that both import (ARCHITECTURE.md, "The layers").
    let edges = room_imports();
    let rooms: BTreeSet<&Vec<String>> = edges.iter().map(|(room, ..)| room).collect();
    let mut circles = Vec::new();
    for room in rooms {
        let found: Vec<Import> = edges
            .iter()
            .filter(|(r, ..)| r == room)
            .map(|(_, from, to)| Import {
                file: PathBuf::new(),
                line: 0,
                from: from.clone(),
                to: to.clone(),
                path: String::new(),
            })
            .collect();
        let modules: BTreeSet<String> = found
            .iter()
            .flat_map(|i| [i.from.clone(), i.to.clone()])
            .collect();
        if let Some(c) = circle(&modules, &found) {
            circles.push(format!("{}: {}", room.join("::"), c.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "circles of imports in a room:\n{}",
        circles.join("\n")
    );
}

/// The integration tests are one binary (`tests/suite.rs`, with `autotests = false`): a file in
/// `tests/` that it does not name as a module would never be compiled, its tests never run.
#[test]
fn every_test_file_is_a_module_of_the_suite() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let suite = std::fs::read_to_string(tests.join("suite.rs")).unwrap();
    let named: BTreeSet<String> = syn::parse_file(&suite)
        .unwrap()
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(m) if m.content.is_none() => Some(m.ident.to_string()),
            _ => None,
        })
        .collect();
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(&tests).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("suite.rs") {
            files.insert(path.file_stem().unwrap().to_string_lossy().into_owned());
        }
        if path.join("mod.rs").is_file() {
            files.insert(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    let missing: Vec<_> = files.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "tests/suite.rs does not name {missing:?}: add `mod NAME;`"
    );
}
