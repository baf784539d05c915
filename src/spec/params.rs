//! The parameters of a step or sink: what its table holds besides `kind` and its inputs, and
//! how `vidflow steps` documents them.

use std::ops::Range;

use toml::de::{DeValue, ValueDeserializer};

use super::Diagnostic;

/// The remaining keys of a component table, for its kind's builder to deserialize.
#[derive(Debug)]
pub struct Params<'i> {
    value: toml::Spanned<DeValue<'i>>,
    /// The input ports the table gave (an optional one may be left out).
    inputs_given: Vec<&'static str>,
    /// The component's name in its `[steps.NAME]` header, when known.
    name_span: Option<Range<usize>>,
}

impl<'i> Params<'i> {
    pub(crate) fn new(value: toml::Spanned<DeValue<'i>>) -> Self {
        Self {
            value,
            inputs_given: Vec::new(),
            name_span: None,
        }
    }

    /// The same parameters, knowing which input ports the table gave and where its name is.
    pub(crate) fn with_inputs(
        mut self,
        inputs_given: Vec<&'static str>,
        name_span: Range<usize>,
    ) -> Self {
        self.inputs_given = inputs_given;
        self.name_span = Some(name_span);
        self
    }

    /// Whether the table gave the input `port` (an optional one may be left out).
    pub fn has_input(&self, port: &str) -> bool {
        self.inputs_given.contains(&port)
    }

    /// A problem unless the table gave at least one of the optional input `ports` (for a kind
    /// that needs one of several inputs); it is reported at the component's name.
    pub fn require_one_input(&self, ports: &[&str]) -> Result<(), Diagnostic> {
        if ports.iter().any(|p| self.has_input(p)) {
            return Ok(());
        }
        let names: Vec<String> = ports.iter().map(|p| format!("\"{p}\"")).collect();
        let message = format!("needs at least one of the inputs {}", names.join(", "));
        Err(match &self.name_span {
            Some(span) => Diagnostic::at(span.clone(), message),
            None => Diagnostic::new(message),
        })
    }

    /// Splits off the keys named in `keys` into parameters of their own, for settings that
    /// several kinds share and parse with one struct; each part keeps its spans and is parsed
    /// (and refuses unknown keys) on its own.
    pub fn split(self, keys: &[&str]) -> (Self, Self) {
        let span = self.value.span();
        let (mut taken, mut kept) = (toml::de::DeTable::new(), toml::de::DeTable::new());
        if let DeValue::Table(table) = self.value.into_inner() {
            for (k, v) in table {
                if keys.contains(&k.get_ref().as_ref()) {
                    taken.insert(k, v);
                } else {
                    kept.insert(k, v);
                }
            }
        }
        let part = |table| Self {
            value: toml::Spanned::new(span.clone(), DeValue::Table(table)),
            inputs_given: self.inputs_given.clone(),
            name_span: self.name_span.clone(),
        };
        (part(taken), part(kept))
    }

    /// The parameters written in `text` (a step's keys, without `kind` and inputs), for tests.
    #[cfg(test)]
    pub(crate) fn from_toml(text: &'i str) -> Self {
        let table = toml::de::DeTable::parse(text).unwrap();
        let span = table.span();
        Self::new(toml::Spanned::new(span, DeValue::Table(table.into_inner())))
    }

    /// Deserializes the parameters; use `#[serde(deny_unknown_fields)]` and `toml::Spanned`
    /// fields to get precise locations.
    pub fn parse<T: serde::de::DeserializeOwned>(self) -> Result<T, Diagnostic> {
        T::deserialize(ValueDeserializer::from(self.value)).map_err(|e| Diagnostic::from_toml(&e))
    }
}

/// Documentation of one parameter, shown by `vidflow steps`.
#[derive(Debug, Clone, Copy)]
pub struct ParamDoc {
    pub name: &'static str,
    pub ty: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

impl ParamDoc {
    /// The type and the range of values it takes, from `ty`: `float in (0, 1]`, `integer >= 100`,
    /// or a choice of strings (`"tcp" | "udp"`); `-` where any value of the type is taken.
    pub fn type_and_range(&self) -> (&'static str, &'static str) {
        let ty = self.ty;
        if let Some((t, range)) = ty.split_once(" in ") {
            return (t, range);
        }
        for op in [" >= ", " > ", " <= "] {
            if let Some(at) = ty.find(op) {
                return (&ty[..at], ty[at..].trim_start());
            }
        }
        if ty.starts_with('"') {
            return ("string", ty);
        }
        if ty.contains(" | ") {
            return ("integer", ty);
        }
        (ty, "-")
    }

    /// The numeric bounds of the range (`[a, b]`, `(a, b]`, `>= a`, `> a`), if it has any.
    pub fn bounds(&self) -> Option<Bounds> {
        let range = self.type_and_range().1;
        let number = |s: &str| s.trim().parse::<f64>().ok();
        if let Some(low) = range.strip_prefix(">= ").and_then(number) {
            return Some(Bounds {
                low: Some((low, true)),
                high: None,
            });
        }
        if let Some(low) = range.strip_prefix("> ").and_then(number) {
            return Some(Bounds {
                low: Some((low, false)),
                high: None,
            });
        }
        let (low, high) = range.get(1..range.len().checked_sub(1)?)?.split_once(',')?;
        Some(Bounds {
            low: Some((number(low)?, range.starts_with('['))),
            high: Some((number(high)?, range.ends_with(']'))),
        })
    }
}

/// The numeric range of a key: each bound and whether it is included.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub low: Option<(f64, bool)>,
    pub high: Option<(f64, bool)>,
}

impl Bounds {
    /// Values just outside the range and at its edges (`step` apart: 1 for integers), to
    /// check that validation takes exactly the documented range.
    pub fn probes(&self, step: f64) -> (Vec<f64>, Vec<f64>) {
        let (mut outside, mut inside) = (Vec::new(), Vec::new());
        if let Some((low, included)) = self.low {
            outside.push(if included { low - step } else { low });
            inside.push(if included { low } else { low + step });
        }
        if let Some((high, included)) = self.high {
            outside.push(if included { high + step } else { high });
            inside.push(if included { high } else { high - step });
        }
        (outside, inside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(ty: &'static str) -> ParamDoc {
        ParamDoc {
            name: "k",
            ty,
            default: "",
            doc: "",
        }
    }

    #[test]
    fn a_type_gives_its_range_and_bounds() {
        assert_eq!(doc("float in (0, 1]").type_and_range(), ("float", "(0, 1]"));
        assert_eq!(
            doc("integer >= 100").type_and_range(),
            ("integer", ">= 100")
        );
        assert_eq!(
            doc("\"tcp\" | \"udp\"").type_and_range(),
            ("string", "\"tcp\" | \"udp\"")
        );
        assert_eq!(doc("0 | 1").type_and_range(), ("integer", "0 | 1"));
        assert_eq!(doc("path").type_and_range(), ("path", "-"));
        let b = doc("float in (0, 1]").bounds().unwrap();
        assert_eq!(b.probes(0.5), (vec![0.0, 1.5], vec![0.5, 1.0]));
        let b = doc("integer >= 100").bounds().unwrap();
        assert_eq!(b.probes(1.0), (vec![99.0], vec![100.0]));
        assert_eq!(doc("integer >= initial_delay_ms").bounds(), None);
        assert_eq!(doc("0 | 1").bounds(), None);
    }

    #[test]
    fn split_parts_keep_their_keys_and_spans() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct A {
            a: toml::Spanned<u32>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct B {
            b: u32,
        }
        let (a, b) = Params::from_toml("b = 2\na = 1").split(&["a"]);
        let a: A = a.parse().unwrap();
        assert_eq!((*a.a.get_ref(), a.a.span()), (1, 10..11));
        assert_eq!(b.parse::<B>().unwrap().b, 2);
    }

    #[test]
    fn one_of_several_inputs_is_required_and_reported_at_the_name() {
        let given = |names: Vec<&'static str>| Params::from_toml("").with_inputs(names, 4..9);
        let ports = ["detections", "tracks"];
        assert!(
            given(vec!["image", "tracks"])
                .require_one_input(&ports)
                .is_ok()
        );
        let err = given(vec!["image"]).require_one_input(&ports).unwrap_err();
        assert_eq!(err.span, Some(4..9));
        assert_eq!(
            err.message,
            "needs at least one of the inputs \"detections\", \"tracks\""
        );
    }
}
