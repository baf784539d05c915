//! The keys every sink takes besides its kind's own: `sources = [...]` (which sources' frames it
//! takes) and `on_full` (what delivery does when its queue is full).

use toml::de::DeValue;

use super::raw::Entry;
use crate::sinks::OnFull;
use crate::spec::Diagnostic;

/// `sources = ["door", ...]` of a sink: `Some(None)` when left out (every source), `None`
/// when wrong (reported).
pub(super) fn sources(
    what: &str,
    entry: Option<Entry<'_>>,
    source_names: &[String],
    diags: &mut Vec<Diagnostic>,
) -> Option<Option<Vec<String>>> {
    let Some((_, value)) = entry else {
        return Some(None);
    };
    let DeValue::Array(items) = value.get_ref() else {
        diags.push(Diagnostic::at(
            value.span(),
            format!("{what}: \"sources\" must be a list of source names"),
        ));
        return None;
    };
    let mut names = Vec::new();
    let mut ok = true;
    for item in items {
        match item.get_ref() {
            DeValue::String(s) if source_names.iter().any(|n| n == s.as_ref()) => {
                names.push(s.to_string());
            }
            DeValue::String(s) => {
                diags.push(Diagnostic::at(
                    item.span(),
                    format!(
                        "{what}: unknown source \"{s}\"{}; sources: {}",
                        crate::spec::did_you_mean(s, source_names.iter().map(String::as_str)),
                        source_names.join(", ")
                    ),
                ));
                ok = false;
            }
            _ => {
                diags.push(Diagnostic::at(
                    item.span(),
                    format!("{what}: \"sources\" must be a list of source names"),
                ));
                ok = false;
            }
        }
    }
    if ok && names.is_empty() {
        diags.push(Diagnostic::at(
            value.span(),
            format!("{what}: \"sources\" is empty; leave it out to take every source"),
        ));
        ok = false;
    }
    ok.then_some(Some(names))
}

/// `on_full = "block" | "drop_oldest"`: `Some(None)` when left out (the kind's default).
pub(super) fn on_full(
    what: &str,
    entry: Option<Entry<'_>>,
    diags: &mut Vec<Diagnostic>,
) -> Option<Option<OnFull>> {
    let Some((_, value)) = entry else {
        return Some(None);
    };
    match value.get_ref() {
        DeValue::String(s) if s == "block" => Some(Some(OnFull::Block)),
        DeValue::String(s) if s == "drop_oldest" => Some(Some(OnFull::DropOldest)),
        _ => {
            diags.push(Diagnostic::at(
                value.span(),
                format!("{what}: on_full must be \"block\" or \"drop_oldest\""),
            ));
            None
        }
    }
}
