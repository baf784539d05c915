//! "Did you mean": the known name nearest a misspelt one (a kind, a key, a model, a class, a
//! step or output of a reference), by edit distance (`strsim`, as clap and cargo do).

/// The known name nearest `given`, if one is near enough to be a misspelling: the same but for
/// case, `-` and `_`, or within a third of its length in Damerau-Levenshtein distance (a swap of
/// two letters counts as one edit). Ties go to the first in `known`.
pub fn nearest<'a>(given: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let plain = |s: &str| s.to_lowercase().replace(['-', '_'], "");
    let wanted = plain(given);
    let most = (given.chars().count() / 3).max(1);
    known
        .into_iter()
        .filter(|k| *k != given)
        .map(|k| (strsim::damerau_levenshtein(&wanted, &plain(k)), k))
        .filter(|(d, k)| *d <= most && *d < k.chars().count())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// ` (did you mean "NAME"?)` for the known name nearest `given`, or nothing.
pub fn did_you_mean<'a>(given: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    nearest(given, known).map_or_else(String::new, |k| format!(" (did you mean \"{k}\"?)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [&str; 4] = ["tracker", "object_detection", "line_counter", "zone_count"];

    #[test]
    fn a_misspelt_name_gets_the_nearest() {
        assert_eq!(nearest("trackr", KINDS), Some("tracker"));
        assert_eq!(nearest("object_detecton", KINDS), Some("object_detection"));
        assert_eq!(nearest("line-counter", KINDS), Some("line_counter"));
        assert_eq!(nearest("Zone_Count", KINDS), Some("zone_count"));
        // Two letters swapped are one edit.
        assert_eq!(nearest("trakcer", KINDS), Some("tracker"));
    }

    #[test]
    fn a_name_far_from_all_gets_none() {
        assert_eq!(nearest("canny", KINDS), None);
        assert_eq!(nearest("kafka", ["jsonl", "mqtt", "nats"]), None);
        assert_eq!(nearest("x", ["y"]), None);
        assert_eq!(did_you_mean("radius", ["kernel"]), "");
    }

    #[test]
    fn the_suggestion_reads_as_a_question() {
        assert_eq!(
            did_you_mean("jsnl", ["jsonl", "mqtt"]),
            " (did you mean \"jsonl\"?)"
        );
    }
}
