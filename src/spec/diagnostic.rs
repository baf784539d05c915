//! A problem found in a pipeline file, and the wording of TOML's own errors.

use std::ops::Range;

/// A problem found in a pipeline file, at a byte range of its text when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub span: Option<Range<usize>>,
    pub message: String,
}

impl Diagnostic {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            span: None,
            message: message.into(),
        }
    }

    pub fn at(span: Range<usize>, message: impl Into<String>) -> Self {
        Self {
            span: Some(span),
            message: message.into(),
        }
    }

    pub(crate) fn from_toml(err: &toml::de::Error) -> Self {
        Self {
            span: err.span(),
            message: humanize(err.message().trim_end()),
        }
    }

    /// The same problem, said of `what` (`executor`, `step "motion"`).
    pub fn of(self, what: &str) -> Self {
        Self {
            span: self.span,
            message: format!("{what}: {}", self.message),
        }
    }
}

/// Rewrites serde's wording (Rust types, backticks, "field") into the words of a TOML file.
fn humanize(message: &str) -> String {
    let mut out = message
        .replace("unknown field", "unknown key")
        .replace("missing field", "missing key")
        .replace("there are no fields", "this table takes no keys")
        .replace('`', "\"");
    for (rust, toml) in [
        ("i8", "an integer"),
        ("i16", "an integer"),
        ("i32", "an integer"),
        ("i64", "an integer"),
        ("u8", "an integer from 0 to 255"),
        ("u16", "a whole number"),
        ("u32", "a whole number"),
        ("u64", "a whole number"),
        ("usize", "a whole number"),
        ("f32", "a number"),
        ("f64", "a number"),
        ("a sequence", "a list"),
    ] {
        let from = format!("expected {rust}");
        if out.ends_with(&from) {
            out.truncate(out.len() - from.len());
            out.push_str("expected ");
            out.push_str(toml);
        }
    }
    if let Some(at) = out.find("expected struct ") {
        out.truncate(at);
        out.push_str("expected a table");
    }
    if let Some(at) = out.find(", expected") {
        // "unknown key "x", expected one of ..." reads better with a semicolon.
        if out.starts_with("unknown key") {
            out.replace_range(at..at + 1, ";");
            out = with_nearest_key(&out, at);
        }
    }
    out
}

/// `unknown key "confidnce" (did you mean "confidence"?); expected one of ...`: the key the
/// message names and the keys it lists are quoted; `at` is where the list starts.
fn with_nearest_key(message: &str, at: usize) -> String {
    let quoted =
        |s: &str| -> Vec<String> { s.split('"').skip(1).step_by(2).map(str::to_owned).collect() };
    let (head, list) = message.split_at(at);
    let Some(given) = quoted(head).into_iter().next() else {
        return message.to_owned();
    };
    let known = quoted(list);
    let nearest = super::did_you_mean(&given, known.iter().map(String::as_str));
    format!("{head}{nearest}{list}")
}

/// "an integer", "a string", "an array": a TOML type name with its article.
pub(crate) fn with_article(type_name: &str) -> String {
    let vowel = type_name.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {type_name}", if vowel { "an" } else { "a" })
}
