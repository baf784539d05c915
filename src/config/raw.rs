//! First stage: the spanned TOML tree, checked for its shape.
//!
//! Sections and their entries are walked by hand so that one wrong entry does not hide the
//! others; fixed tables (`[executor]`, a source) are deserialized with `deny_unknown_fields`.
//! A component (`[steps.NAME]`, `[sinks.NAME]`) keeps its remaining keys untyped: only its kind
//! knows what they mean.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use crate::spec::Diagnostic;

pub(super) type Entry<'i> = (Spanned<String>, Spanned<DeValue<'i>>);

#[derive(Debug, Default)]
pub(super) struct RawPipeline<'i> {
    /// How many `[sources.NAME]` tables the file has, parsed or not.
    pub sources_declared: usize,
    pub sources: Vec<(Spanned<String>, RawSource)>,
    pub executor: RawExecutor,
    pub daemon: RawDaemon,
    pub http: Option<RawHttp>,
    pub storage: RawStorage,
    pub events: Option<RawEvents>,
    pub steps: Vec<RawComponent<'i>>,
    pub sinks: Vec<RawComponent<'i>>,
}

/// `[sources.NAME]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSource {
    pub uri: Spanned<String>,
    /// The stream recorded as sent (`record` sinks, `clip` in packet mode); default `uri`'s.
    pub record_uri: Option<Spanned<String>>,
    pub user: Option<Spanned<String>>,
    /// A password, or `${VARIABLE}` to read it from the environment.
    pub password: Option<Spanned<String>>,
    /// A file holding the password; relative to `$CREDENTIALS_DIRECTORY` when systemd sets it.
    pub password_file: Option<Spanned<std::path::PathBuf>>,
    pub transport: Option<Spanned<String>>,
    pub latency_ms: Option<Spanned<u32>>,
    pub queue: Option<Spanned<u32>>,
    pub max_fps: Option<Spanned<u32>>,
    pub stall_timeout_ms: Option<Spanned<u32>>,
    pub max_frame_pixels: Option<Spanned<u64>>,
    #[serde(rename = "loop")]
    pub looping: Option<Spanned<bool>>,
    pub reconnect: Option<RawReconnect>,
    pub calibration: Option<Spanned<RawCalibration>>,
    /// `"encode"` or `"stills"`: what plays as live video without H.264 of its own.
    pub live_video: Option<Spanned<String>>,
    /// Retention of every file written of this source, by any sink.
    pub retain_days: Option<Spanned<f64>>,
    pub max_gb: Option<Spanned<f64>>,
}

/// `[sources.NAME.reconnect]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReconnect {
    pub initial_delay_ms: Option<Spanned<u64>>,
    pub max_delay_ms: Option<Spanned<u64>>,
    pub max_attempts: Option<Spanned<u32>>,
    pub reset_after_ms: Option<Spanned<u64>>,
}

/// `[sources.NAME.calibration]`: points of the picture and their places on the ground.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCalibration {
    /// The picture the points were read on, `[width, height]`.
    pub size: Spanned<[u32; 2]>,
    pub image: Spanned<Vec<Spanned<[f64; 2]>>>,
    pub ground: Spanned<Vec<Spanned<[f64; 2]>>>,
}

/// `[executor]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExecutor {
    pub workers: Option<Spanned<i64>>,
    pub max_in_flight: Option<Spanned<i64>>,
    pub on_step_error: Option<Spanned<String>>,
    pub opencv_threads: Option<Spanned<i64>>,
}

/// `[daemon]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDaemon {
    pub stop_timeout_s: Option<Spanned<i64>>,
}

/// `[storage]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStorage {
    pub min_free_gb: Option<Spanned<f64>>,
    pub min_free_percent: Option<Spanned<f64>>,
}

/// `[events]`: the event store.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEvents {
    pub path: Spanned<std::path::PathBuf>,
    pub retain_days: Option<Spanned<f64>>,
}

/// `[http]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub listen: Spanned<String>,
    /// Host names (beside loopback and `listen`) a request's `Host` header may name.
    pub allowed_hosts: Option<Vec<Spanned<String>>>,
    /// A file holding the bearer token; relative to `$CREDENTIALS_DIRECTORY` when set.
    pub token_file: Option<Spanned<std::path::PathBuf>>,
    pub basic_user: Option<Spanned<String>>,
    /// The basic-auth password's Argon2 hash, a PHC string (`vidflow hash-password`).
    pub basic_password_hash: Option<Spanned<String>>,
    /// Deprecated: the password's unsalted SHA-256, in hex (`printf %s PASSWORD | sha256sum`).
    pub basic_password_sha256: Option<Spanned<String>>,
}

/// `[steps.NAME]` or `[sinks.NAME]`: a kind and the keys that kind interprets.
#[derive(Debug)]
pub(super) struct RawComponent<'i> {
    pub name: Spanned<String>,
    pub kind: Spanned<String>,
    pub keys: Vec<Entry<'i>>,
    pub span: Range<usize>,
}

impl<'i> RawComponent<'i> {
    /// Takes a key out of the component, leaving the rest for its kind.
    pub(super) fn take(&mut self, key: &str) -> Option<Entry<'i>> {
        let at = self.keys.iter().position(|(k, _)| k.get_ref() == key)?;
        Some(self.keys.remove(at))
    }

    /// Whether the component says `key = "value"` (a string).
    pub(super) fn has(&self, key: &str, value: &str) -> bool {
        self.keys
            .iter()
            .any(|(k, v)| k.get_ref() == key && v.get_ref().as_str() == Some(value))
    }

    /// What is left, as one table value for the kind to deserialize.
    pub(super) fn into_params(self) -> Spanned<DeValue<'i>> {
        let mut table = DeTable::new();
        for (k, v) in self.keys {
            let span = k.span();
            table.insert(Spanned::new(span, k.into_inner().into()), v);
        }
        Spanned::new(self.span, DeValue::Table(table))
    }
}

const SECTIONS: &str = "sources, executor, daemon, http, storage, events, steps, sinks";

pub(super) fn parse<'i>(text: &'i str, diags: &mut Vec<Diagnostic>) -> Option<RawPipeline<'i>> {
    let (doc, errors) = DeTable::parse_recoverable(text);
    if !errors.is_empty() {
        diags.extend(errors.iter().map(Diagnostic::from_toml));
        return None;
    }
    let mut raw = RawPipeline::default();
    for (key, value) in entries(doc.into_inner()) {
        match key.get_ref().as_str() {
            "sources" => {
                if let DeValue::Table(t) = value.get_ref() {
                    raw.sources_declared = t.len();
                }
                for (name, v) in named_tables("sources", key, value, diags) {
                    let what = format!("source \"{}\"", name.get_ref());
                    if let Some(source) = deserialize::<RawSource>(&what, v, diags) {
                        raw.sources.push((name, source));
                    }
                }
            }
            "executor" => {
                if let Some(e) = deserialize::<RawExecutor>("executor", value, diags) {
                    raw.executor = e;
                }
            }
            "daemon" => {
                if let Some(d) = deserialize::<RawDaemon>("daemon", value, diags) {
                    raw.daemon = d;
                }
            }
            "http" => raw.http = deserialize::<RawHttp>("http", value, diags),
            "storage" => {
                if let Some(s) = deserialize::<RawStorage>("storage", value, diags) {
                    raw.storage = s;
                }
            }
            "events" => raw.events = deserialize::<RawEvents>("events", value, diags),
            "steps" => raw.steps = components("steps", key, value, diags),
            "sinks" => raw.sinks = components("sinks", key, value, diags),
            other => diags.push(Diagnostic::at(
                key.span(),
                format!(
                    "unknown section \"{other}\"{}, expected one of {SECTIONS}",
                    crate::spec::did_you_mean(other, SECTIONS.split(", "))
                ),
            )),
        }
    }
    Some(raw)
}

fn deserialize<T: serde::de::DeserializeOwned>(
    what: &str,
    value: Spanned<DeValue<'_>>,
    diags: &mut Vec<Diagnostic>,
) -> Option<T> {
    T::deserialize(ValueDeserializer::from(value))
        .map_err(|e| diags.push(Diagnostic::from_toml(&e).of(what)))
        .ok()
}

fn entries(table: DeTable<'_>) -> Vec<Entry<'_>> {
    table
        .into_iter()
        .map(|(k, v)| {
            let span = k.span();
            (Spanned::new(span, k.into_inner().into_owned()), v)
        })
        .collect()
}

/// The entries of a section such as `[steps]`, each a named table.
fn named_tables<'i>(
    section: &str,
    key: Spanned<String>,
    value: Spanned<DeValue<'i>>,
    diags: &mut Vec<Diagnostic>,
) -> Vec<Entry<'i>> {
    let DeValue::Table(table) = value.into_inner() else {
        diags.push(Diagnostic::at(
            key.span(),
            format!("\"{section}\" must be a table of named tables, like [{section}.NAME]"),
        ));
        return Vec::new();
    };
    let singular = section.trim_end_matches('s');
    entries(table)
        .into_iter()
        .filter(|(name, v)| {
            if !super::valid_name(name.get_ref()) {
                diags.push(Diagnostic::at(
                    name.span(),
                    format!(
                        "{singular} name \"{}\" may only use letters, digits, '_' and '-'",
                        name.get_ref()
                    ),
                ));
                return false;
            }
            if !v.get_ref().is_table() {
                diags.push(Diagnostic::at(
                    v.span(),
                    format!(
                        "{singular} \"{}\" must be a table, like [{section}.{}]",
                        name.get_ref(),
                        name.get_ref()
                    ),
                ));
                return false;
            }
            true
        })
        .collect()
}

fn components<'i>(
    section: &str,
    key: Spanned<String>,
    value: Spanned<DeValue<'i>>,
    diags: &mut Vec<Diagnostic>,
) -> Vec<RawComponent<'i>> {
    let singular = section.trim_end_matches('s');
    let mut out = Vec::new();
    for (name, v) in named_tables(section, key, value, diags) {
        let span = v.span();
        let DeValue::Table(table) = v.into_inner() else {
            continue;
        };
        let mut c = RawComponent {
            name,
            kind: Spanned::new(span.clone(), String::new()),
            keys: entries(table),
            span,
        };
        match c.take("kind") {
            Some((_, kind)) => match kind.get_ref().as_str() {
                Some(s) => c.kind = Spanned::new(kind.span(), s.to_owned()),
                None => {
                    diags.push(Diagnostic::at(
                        kind.span(),
                        format!(
                            "{singular} \"{}\": \"kind\" must be a string",
                            c.name.get_ref()
                        ),
                    ));
                    continue;
                }
            },
            None => {
                diags.push(Diagnostic::at(
                    c.name.span(),
                    format!("{singular} \"{}\": missing key \"kind\"", c.name.get_ref()),
                ));
                continue;
            }
        }
        out.push(c);
    }
    out
}
