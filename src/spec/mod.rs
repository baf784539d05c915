//! What a pipeline file is made of, below everything that gives it meaning: problems found in
//! it ([`Diagnostic`]), the parameters of a component ([`Params`], [`ParamDoc`]) and the
//! references that wire components together ([`Ref`], [`SinkInput`]).
//!
//! This is the bottom layer: it knows no step, sink or source kind. Kinds import it to describe
//! themselves and parse their parameters; `config` imports it and the kinds to bind them.

mod diagnostic;
mod params;
mod reference;
mod secret;

pub use diagnostic::Diagnostic;
pub(crate) use diagnostic::with_article;
pub use params::{ParamDoc, Params};
pub use reference::{Ref, SinkInput};
pub use secret::{Secret, percent_decode, read_password_file, redact, redact_all, url_credentials};
