//! What a pipeline file is made of, below everything that gives it meaning: problems found in
//! it ([`Diagnostic`]), the parameters of a component ([`Params`], [`ParamDoc`]) and the
//! references that wire components together ([`Ref`], [`SinkInput`]), and the URLs and
//! passwords they may hold ([`Address`], [`Secret`]).
//!
//! This is the bottom layer: it knows no step, sink or source kind. Kinds import it to describe
//! themselves and parse their parameters; `config` imports it and the kinds to bind them.

mod address;
mod diagnostic;
mod panic;
mod params;
mod password;
mod reference;
mod secret;
mod suggest;

pub use address::{Address, AddressError, HOW as URL_ADVICE, redact, redact_all};
pub use diagnostic::Diagnostic;
pub(crate) use diagnostic::with_article;
pub use panic::panic_text;
pub use params::{Bounds, ParamDoc, Params};
pub use password::PasswordHash;
pub use reference::{Ref, SinkInput};
pub use secret::{Secret, USERINFO, percent_decode, read_password_file};
pub use suggest::{did_you_mean, nearest};
