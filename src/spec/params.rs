//! The parameters of a step or sink: what its table holds besides `kind` and its inputs, and
//! how `vidflow steps` documents them.

use toml::de::{DeValue, ValueDeserializer};

use super::Diagnostic;

/// The remaining keys of a component table, for its kind's builder to deserialize.
#[derive(Debug)]
pub struct Params<'i> {
    value: toml::Spanned<DeValue<'i>>,
    /// The input ports the table gives (optional ones may be left out), in port order.
    inputs: Vec<&'static str>,
}

impl<'i> Params<'i> {
    pub(crate) fn new(value: toml::Spanned<DeValue<'i>>) -> Self {
        Self {
            value,
            inputs: Vec::new(),
        }
    }

    /// The same parameters, knowing which input ports the table gives.
    pub(crate) fn with_inputs(self, inputs: Vec<&'static str>) -> Self {
        Self { inputs, ..self }
    }

    /// Whether the table gives the input `port` (for a kind whose optional inputs are only
    /// optional one at a time: "at least one of ...").
    pub fn has_input(&self, port: &str) -> bool {
        self.inputs.contains(&port)
    }

    /// Where the component's table is, for a problem that is about the table as a whole.
    pub fn span(&self) -> std::ops::Range<usize> {
        self.value.span()
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
