//! The parameters of a step or sink: what its table holds besides `kind` and its inputs, and
//! how `vidflow steps` documents them.

use toml::de::{DeValue, ValueDeserializer};

use super::Diagnostic;

/// The remaining keys of a component table, for its kind's builder to deserialize.
#[derive(Debug)]
pub struct Params<'i> {
    value: toml::Spanned<DeValue<'i>>,
}

impl<'i> Params<'i> {
    pub(crate) fn new(value: toml::Spanned<DeValue<'i>>) -> Self {
        Self { value }
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
