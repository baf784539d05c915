//! Second stage: kinds built, references resolved and type-checked, steps ordered.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;
use toml::de::DeValue;

use super::Name;
use super::raw::{RawComponent, RawDaemon, RawExecutor, RawPipeline};
use super::written::Written;
use crate::sinks::{self, Routing, SinkFactory, SinkKind};
use crate::source::SourceConfig;
use crate::spec::{Diagnostic, Params, Ref, SinkInput, did_you_mean};
use crate::steps::{self, Step, StepKind};
use crate::value::ValueType;

/// A checked pipeline, ready to run.
#[derive(Debug)]
pub struct Pipeline {
    pub path: PathBuf,
    pub sources: Vec<SourceConfig>,
    pub executor: ExecutorConfig,
    pub daemon: DaemonConfig,
    /// `[http]`: the metrics, health and preview endpoint; `None`: off.
    pub http: Option<super::HttpConfig>,
    /// `[storage]` and the sources' retention.
    pub storage: crate::storage::StorageConfig,
    /// `[events]`: the event store; `None`: off.
    pub events: Option<crate::events::EventsConfig>,
    /// In an order where every step comes after the steps it reads from.
    pub steps: Vec<StepConfig>,
    pub sinks: Vec<SinkConfig>,
    /// Each step's and sink's table as written, to tell at a reload what changed.
    pub written: Written,
    /// What `validate` says besides problems: a sink that will pad the images it records.
    pub notes: Vec<super::Problem>,
}

impl Pipeline {
    pub(super) fn with_source(
        mut self,
        source: &super::SourceText,
        notes: Vec<Diagnostic>,
    ) -> Self {
        self.notes = notes.into_iter().map(|d| source.problem(d)).collect();
        self.path = source.path.clone();
        self.written = Written::of(&source.text);
        self
    }
}

/// What a frame does when one of its steps fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStepError {
    /// The frame is reported failed; the pipeline goes on with the next frame.
    #[default]
    SkipFrame,
    /// The daemon drains what is in flight, closes its sinks and exits non-zero.
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutorConfig {
    /// Threads in the persistent worker pool.
    pub workers: usize,
    /// Frames inside the workflow at once (default [`IN_FLIGHT_PER_WORKER`] per worker).
    pub max_in_flight: usize,
    pub on_step_error: OnStepError,
    /// Threads OpenCV may use inside one call (its own pool). 1 by default: the worker pool is
    /// the one place where parallelism comes from, so `workers` and `max_in_flight` mean what
    /// they say and OpenCV's threads do not fight the pool's for the cores.
    pub opencv_threads: usize,
}

/// Frames in flight per worker by default. One per worker leaves a worker idle whenever it
/// finishes a frame before an earlier one (its result waits for that frame's delivery, and the
/// place it holds keeps the next frame out): the workers then run in lockstep, each pair of
/// frames taking as long as the slower. A second place per worker gives a worker that finished
/// its next frame at once, so its core never waits for the other's (a detector's frames vary
/// by a few milliseconds; on a loaded machine by much more). It costs one more frame and its
/// step outputs held per worker (docs/performance-and-memory.md, Memory).
pub const IN_FLIGHT_PER_WORKER: usize = 2;

impl ExecutorConfig {
    /// `workers` threads and the default `max_in_flight` for them.
    pub fn for_workers(workers: usize) -> Self {
        Self {
            workers,
            max_in_flight: workers.saturating_mul(IN_FLIGHT_PER_WORKER),
            on_step_error: OnStepError::SkipFrame,
            opencv_threads: 1,
        }
    }
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self::for_workers(std::thread::available_parallelism().map_or(1, usize::from))
    }
}

/// `[daemon]`: how the run as a whole behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonConfig {
    /// The whole shutdown (source stop, drain, pool join, sink close) must end within this
    /// long of the stop request (or of the run ending by itself); what is still going at the
    /// deadline is abandoned, counted and named in the log.
    pub stop_timeout: Duration,
}

/// `stop_timeout_s` when the file does not say: well inside systemd's `TimeoutStopSec=60` of
/// the shipped unit, so vidflow, not SIGKILL, decides what is abandoned.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The largest `stop_timeout_s` accepted: an hour.
const MAX_STOP_TIMEOUT_S: i64 = 3600;

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            stop_timeout: DEFAULT_STOP_TIMEOUT,
        }
    }
}

pub struct StepConfig {
    pub name: Name,
    pub kind: &'static StepKind,
    pub step: Arc<dyn Step>,
    /// One per input port of the kind, in port order; `None` for an optional input left out.
    pub inputs: Vec<Option<Ref>>,
    /// `every_n_frames`: the step runs on frames whose number is a multiple of this (1: all).
    pub every: u64,
}

impl fmt::Debug for StepConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepConfig")
            .field("name", &self.name)
            .field("kind", &self.kind.name)
            .field("inputs", &self.inputs)
            .finish()
    }
}

#[derive(Debug)]
pub struct SinkConfig {
    pub name: Name,
    pub kind: &'static SinkKind,
    pub factory: Box<dyn SinkFactory>,
    pub inputs: Vec<SinkInput>,
    /// `sources = [...]` (default every source) and `on_full`.
    pub routing: Routing,
}

/// A step as known before its kind is built: enough to resolve references to it.
struct Declared {
    name: String,
    kind: Option<&'static StepKind>,
}

/// Resolves `raw`: its problems go to `diags`; `notes` get what is worth saying but is not a
/// problem (a size a sink will pad).
pub(super) fn resolve(
    raw: RawPipeline<'_>,
    diags: &mut Vec<Diagnostic>,
    notes: &mut Vec<Diagnostic>,
) -> Pipeline {
    let source_names: Vec<String> = raw
        .sources
        .iter()
        .map(|(n, _)| n.get_ref().clone())
        .collect();
    let storage = super::storage::resolve_storage(&raw.storage, &raw.sources, diags);
    let mut sources = super::source::resolve_sources(raw.sources_declared, raw.sources, diags);
    let executor = resolve_executor(&raw.executor, diags);
    let daemon = resolve_daemon(&raw.daemon, diags);
    let http = raw
        .http
        .as_ref()
        .and_then(|h| super::http::resolve_http(h, diags));
    let events = raw
        .events
        .as_ref()
        .and_then(|e| super::events::resolve_events(e, diags));

    let declared: Vec<Declared> = raw
        .steps
        .iter()
        .map(|c| {
            let kind = steps::kind(c.kind.get_ref());
            if kind.is_none() {
                diags.push(unknown_kind("step", c, steps::KINDS.iter().map(|k| k.name)));
            }
            Declared {
                name: c.name.get_ref().clone(),
                kind,
            }
        })
        .collect();
    let index: HashMap<&str, usize> = declared
        .iter()
        .enumerate()
        .map(|(i, d)| (d.name.as_str(), i))
        .collect();
    let resolver = Resolver {
        declared: &declared,
        index: &index,
    };

    let (built, name_spans, deps) = build_steps(raw.steps, &declared, &resolver, diags);

    let order = topological_order(&deps, &declared, &name_spans, diags);
    // The size of each step's `image` output, where its parameters fix it.
    let image_sizes: Vec<Option<(u32, u32)>> = built
        .iter()
        .map(|s| s.as_ref().and_then(|s| s.step.image_size()))
        .collect();
    let sinks = Sinks {
        resolver: &resolver,
        source_names: &source_names,
        image_sizes: &image_sizes,
    };
    let mut recorded = Vec::new();
    let sinks = sinks.resolve(raw.sinks, diags, notes, &mut recorded);
    super::source::settle_records(&mut sources, &recorded, diags);

    let (steps, sinks) = in_order(&order, built, sinks);

    Pipeline {
        path: PathBuf::new(),
        sources,
        executor,
        daemon,
        http,
        storage,
        events,
        steps,
        sinks,
        written: Written::default(),
        notes: Vec::new(),
    }
}

/// Each step's kind built from its keys and its inputs resolved (`None` where either failed,
/// reported), with the span of its name and the steps it reads (as far as they resolved).
type BuiltSteps = (
    Vec<Option<StepConfig>>,
    Vec<std::ops::Range<usize>>,
    Vec<Vec<usize>>,
);

fn build_steps(
    raw_steps: Vec<RawComponent<'_>>,
    declared: &[Declared],
    resolver: &Resolver<'_>,
    diags: &mut Vec<Diagnostic>,
) -> BuiltSteps {
    let mut built: Vec<Option<StepConfig>> = Vec::new();
    let mut name_spans = Vec::new();
    // Steps each step reads from, as far as its references resolved (built or not).
    let mut deps: Vec<Vec<usize>> = Vec::new();
    for (mut c, d) in raw_steps.into_iter().zip(declared) {
        let name_span = c.name.span();
        name_spans.push(name_span.clone());
        let Some(kind) = d.kind else {
            built.push(None);
            deps.push(Vec::new());
            continue;
        };
        let what = format!("step \"{}\"", d.name);
        // Outer `None`: the input is wrong (reported); inner `None`: an optional one left out.
        let inputs: Vec<Option<Option<Ref>>> = kind
            .inputs
            .iter()
            .map(|port| {
                let Some((key, value)) = c.take(port.name) else {
                    if port.optional {
                        return Some(None);
                    }
                    diags.push(Diagnostic::at(
                        c.name.span(),
                        format!("{what}: missing input \"{}\" ({})", port.name, port.ty),
                    ));
                    return None;
                };
                let text = reference_text(&what, &key, &value, diags)?;
                resolver
                    .resolve(&what, port.name, Some(port.ty), &text, diags)
                    .map(Some)
            })
            .collect();
        let every = every_n_frames(&what, c.take("every_n_frames"), diags);
        deps.push(
            inputs
                .iter()
                .flatten()
                .flatten()
                .filter_map(|r| match r {
                    Ref::Step { step, .. } => Some(*step),
                    Ref::Frame => None,
                })
                .collect(),
        );
        let given: Vec<&'static str> = kind
            .inputs
            .iter()
            .zip(&inputs)
            // A key given with a wrong reference counts as given (its problem is reported).
            .filter(|(_, r)| !matches!(r, Some(None)))
            .map(|(port, _)| port.name)
            .collect();
        let params = Params::new(c.into_params()).with_inputs(given, name_span.clone());
        let step = match (kind.build)(params) {
            Ok(step) => Some(step),
            Err(d) => {
                diags.push(prefixed(&what, d, name_span));
                None
            }
        };
        built.push(
            match (step, inputs.into_iter().collect::<Option<Vec<_>>>(), every) {
                (Some(step), Some(inputs), Some(every)) => Some(StepConfig {
                    name: d.name.as_str().into(),
                    kind,
                    step: step.into(),
                    inputs,
                    every,
                }),
                _ => None,
            },
        );
    }

    (built, name_spans, deps)
}

/// The steps in the order they run, and every step reference (of steps and sinks) renumbered
/// into that order.
fn in_order(
    order: &[usize],
    built: Vec<Option<StepConfig>>,
    sinks: Vec<SinkConfig>,
) -> (Vec<StepConfig>, Vec<SinkConfig>) {
    let mut position = vec![0; built.len()];
    for (new, &old) in order.iter().enumerate() {
        position[old] = new;
    }
    let renumber = |r: Ref| match r {
        Ref::Frame => Ref::Frame,
        Ref::Step { step, output } => Ref::Step {
            step: position[step],
            output,
        },
    };
    let mut slots: Vec<Option<StepConfig>> = built;
    let steps = order
        .iter()
        .filter_map(|&i| slots[i].take())
        .map(|mut s| {
            s.inputs = s.inputs.into_iter().map(|r| r.map(renumber)).collect();
            s
        })
        .collect();
    let sinks = sinks
        .into_iter()
        .map(|mut s| {
            for input in &mut s.inputs {
                input.from = renumber(input.from);
            }
            s
        })
        .collect();

    (steps, sinks)
}

fn resolve_daemon(raw: &RawDaemon, diags: &mut Vec<Diagnostic>) -> DaemonConfig {
    let mut config = DaemonConfig::default();
    if let Some(t) = &raw.stop_timeout_s {
        match u64::try_from(*t.get_ref()) {
            Ok(s) if s >= 1 && *t.get_ref() <= MAX_STOP_TIMEOUT_S => {
                config.stop_timeout = Duration::from_secs(s);
            }
            _ => diags.push(Diagnostic::at(
                t.span(),
                format!(
                    "daemon: stop_timeout_s must be between 1 and {MAX_STOP_TIMEOUT_S}, not {}",
                    t.get_ref()
                ),
            )),
        }
    }
    config
}

fn resolve_executor(raw: &RawExecutor, diags: &mut Vec<Diagnostic>) -> ExecutorConfig {
    let mut config = ExecutorConfig::default();
    let mut positive = |v: &Option<Spanned<i64>>, key: &str, max: i64| -> Option<usize> {
        let v = v.as_ref()?;
        match usize::try_from(*v.get_ref()) {
            Ok(n) if n >= 1 && *v.get_ref() <= max => Some(n),
            _ => {
                diags.push(Diagnostic::at(
                    v.span(),
                    format!(
                        "executor: {key} must be between 1 and {max}, not {}",
                        v.get_ref()
                    ),
                ));
                None
            }
        }
    };
    if let Some(n) = positive(&raw.workers, "workers", 256) {
        config.workers = n;
        config.max_in_flight = ExecutorConfig::for_workers(n).max_in_flight;
    }
    if let Some(n) = positive(&raw.max_in_flight, "max_in_flight", 1024) {
        config.max_in_flight = n;
    }
    if let Some(n) = positive(&raw.opencv_threads, "opencv_threads", 256) {
        config.opencv_threads = n;
    }
    if let Some(policy) = &raw.on_step_error {
        match policy.get_ref().as_str() {
            "skip_frame" => config.on_step_error = OnStepError::SkipFrame,
            "stop" => config.on_step_error = OnStepError::Stop,
            other => diags.push(Diagnostic::at(
                policy.span(),
                format!(
                    "executor: on_step_error must be \"skip_frame\" or \"stop\", not \"{other}\""
                ),
            )),
        }
    }
    config
}

/// What sinks are resolved against: the steps, the sources, and the sizes steps fix.
struct Sinks<'a> {
    resolver: &'a Resolver<'a>,
    source_names: &'a [String],
    image_sizes: &'a [Option<(u32, u32)>],
}

impl Sinks<'_> {
    fn resolve(
        &self,
        raw: Vec<RawComponent<'_>>,
        diags: &mut Vec<Diagnostic>,
        notes: &mut Vec<Diagnostic>,
        recorded: &mut Vec<String>,
    ) -> Vec<SinkConfig> {
        let (resolver, source_names) = (self.resolver, self.source_names);
        let mut out = Vec::new();
        for mut c in raw {
            let Some(kind) = sinks::kind(c.kind.get_ref()) else {
                diags.push(unknown_kind(
                    "sink",
                    &c,
                    sinks::KINDS.iter().map(|k| k.name),
                ));
                continue;
            };
            let what = format!("sink \"{}\"", c.name.get_ref());
            let mut inputs = Vec::new();
            let mut ok = true;
            for port in kind.inputs {
                let Some(texts) = port_texts(&what, port, &mut c, diags) else {
                    ok = false;
                    continue;
                };
                for text in texts {
                    match resolver.resolve(&what, port.name, port.ty, &text, diags) {
                        Some(from) => inputs.push((
                            SinkInput {
                                port: port.name,
                                label: text.get_ref().trim_start_matches('$').to_owned(),
                                from,
                            },
                            text.span(),
                        )),
                        None => ok = false,
                    }
                }
            }
            let sources = super::routing::sources(&what, c.take("sources"), source_names, diags);
            let on_full = super::routing::on_full(&what, c.take("on_full"), diags);
            let name = c.name.get_ref().as_str().into();
            let name_span = c.name.span();
            match (kind.build)(Params::new(c.into_params())) {
                Ok(mut factory) if ok => {
                    let (Some(sources), Some(on_full)) = (sources, on_full) else {
                        continue;
                    };
                    let taken: Vec<Arc<str>> = sources
                        .as_deref()
                        .unwrap_or(source_names)
                        .iter()
                        .map(|s| s.as_str().into())
                        .collect();
                    if factory.takes_packets(&taken) {
                        recorded.extend(taken.iter().map(|s| s.to_string()));
                    }
                    let takes = sources.as_ref().map_or(source_names.len(), Vec::len);
                    if takes > 1
                        && let Some(d) = factory.single_source()
                    {
                        diags.push(prefixed(&what, d, name_span));
                        continue;
                    }
                    let sizes = self.image_sizes;
                    super::sizes::check_sink(&what, factory.as_ref(), &inputs, sizes, diags, notes);
                    out.push(SinkConfig {
                        name,
                        kind,
                        routing: Routing {
                            sources: sources.map(|s| s.iter().map(|s| s.as_str().into()).collect()),
                            on_full: on_full.unwrap_or_else(|| factory.default_on_full()),
                        },
                        factory,
                        inputs: inputs.into_iter().map(|(input, _)| input).collect(),
                    });
                }
                Ok(_) => {}
                Err(d) => diags.push(prefixed(&what, d, name_span)),
            }
        }
        out
    }
}

struct Resolver<'a> {
    declared: &'a [Declared],
    index: &'a HashMap<&'a str, usize>,
}

impl Resolver<'_> {
    /// Resolves `$frame` or `$steps.NAME.OUTPUT`, checking that it carries `expected`.
    fn resolve(
        &self,
        what: &str,
        port: &str,
        expected: Option<ValueType>,
        text: &Spanned<String>,
        diags: &mut Vec<Diagnostic>,
    ) -> Option<Ref> {
        let s = text.get_ref().as_str();
        let mut fail = |message: String| {
            diags.push(Diagnostic::at(text.span(), format!("{what}: {message}")));
            None
        };
        let (r, ty) = if s == "$frame" {
            (Ref::Frame, ValueType::Image)
        } else if let Some(rest) = s.strip_prefix("$steps.") {
            let Some((step, output)) = rest.split_once('.') else {
                return fail(format!(
                    "reference \"{s}\" must name a step and an output: \"$steps.NAME.OUTPUT\""
                ));
            };
            let Some(&i) = self.index.get(step) else {
                let mut steps: Vec<&str> = self.index.keys().copied().collect();
                steps.sort_unstable();
                let nearest = did_you_mean(step, steps);
                return fail(format!("unknown step \"{step}\"{nearest} in \"{s}\""));
            };
            // An unknown kind is reported once, where it is declared.
            let kind = self.declared[i].kind?;
            let Some((o, p)) = kind.output(output) else {
                let outputs: Vec<_> = kind.outputs.iter().map(|p| p.name).collect();
                return fail(format!(
                    "step \"{step}\" ({}) has no output \"{output}\"{}; it has: {}",
                    kind.name,
                    did_you_mean(output, outputs.iter().copied()),
                    outputs.join(", ")
                ));
            };
            (Ref::Step { step: i, output: o }, p.ty)
        } else {
            return fail(format!(
                "\"{s}\" is not a reference{}: use \"$frame\" or \"$steps.NAME.OUTPUT\"",
                did_you_mean(s, ["$frame"])
            ));
        };
        match expected {
            Some(want) if want != ty => fail(format!(
                "\"{port}\" takes {}, but \"{s}\" is {ty}",
                want.phrase()
            )),
            _ => Some(r),
        }
    }
}

/// The `every_n_frames` of a step: 1 when absent, `None` (reported) when not a positive integer.
fn every_n_frames(
    what: &str,
    entry: Option<super::raw::Entry<'_>>,
    diags: &mut Vec<Diagnostic>,
) -> Option<u64> {
    let Some((_, value)) = entry else {
        return Some(1);
    };
    let span = value.span();
    match Params::new(value).parse::<u64>() {
        Ok(n) if n >= 1 => Some(n),
        _ => {
            diags.push(Diagnostic::at(
                span,
                format!("{what}: \"every_n_frames\" must be a whole number of at least 1"),
            ));
            None
        }
    }
}

/// The reference texts a sink's table gives `port`: none for a list it leaves out, one, or a
/// list's; `None` (said in `diags`) for a missing input or a value that is no reference.
fn port_texts(
    what: &str,
    port: &sinks::SinkPort,
    c: &mut RawComponent<'_>,
    diags: &mut Vec<Diagnostic>,
) -> Option<Vec<Spanned<String>>> {
    Some(match c.take(port.name) {
        None if port.list => Vec::new(),
        None => {
            let unless = match port.optional_with {
                Some((key, value)) if c.has(key, value) => return Some(Vec::new()),
                Some((key, value)) => {
                    format!(" (it may be left out only with {key} = \"{value}\")")
                }
                None => String::new(),
            };
            diags.push(Diagnostic::at(
                c.name.span(),
                format!("{what}: missing input \"{}\"{unless}", port.name),
            ));
            return None;
        }
        Some((key, value)) if port.list => match value.get_ref() {
            DeValue::Array(items) => items
                .iter()
                .filter_map(|item| reference_text(what, &key, item, diags))
                .collect(),
            // One reference where a list is taken: a list of one.
            DeValue::String(_) => reference_text(what, &key, &value, diags)
                .into_iter()
                .collect(),
            _ => {
                diags.push(Diagnostic::at(
                    value.span(),
                    format!(
                        "{what}: \"{}\" must be a reference or a list of references",
                        port.name
                    ),
                ));
                return None;
            }
        },
        Some((key, value)) => reference_text(what, &key, &value, diags)
            .into_iter()
            .collect(),
    })
}

fn reference_text(
    what: &str,
    key: &Spanned<String>,
    value: &Spanned<DeValue<'_>>,
    diags: &mut Vec<Diagnostic>,
) -> Option<Spanned<String>> {
    match value.get_ref().as_str() {
        Some(s) => Some(Spanned::new(value.span(), s.to_owned())),
        None => {
            diags.push(Diagnostic::at(
                value.span(),
                format!(
                    "{what}: \"{}\" must be a reference string like \"$frame\", not {}",
                    key.get_ref(),
                    crate::spec::with_article(value.get_ref().type_str())
                ),
            ));
            None
        }
    }
}

fn unknown_kind<'a>(
    what: &str,
    c: &RawComponent<'_>,
    known: impl Iterator<Item = &'a str>,
) -> Diagnostic {
    let known: Vec<_> = known.collect();
    Diagnostic::at(
        c.kind.span(),
        format!(
            "{what} \"{}\": unknown kind \"{}\"{}; known kinds: {}",
            c.name.get_ref(),
            c.kind.get_ref(),
            did_you_mean(c.kind.get_ref(), known.iter().copied()),
            known.join(", ")
        ),
    )
}

/// A kind's problem said of its component; one without a place of its own (a model file that
/// is missing, say) is put at the component's name.
fn prefixed(what: &str, d: Diagnostic, name: std::ops::Range<usize>) -> Diagnostic {
    Diagnostic {
        span: d.span.or(Some(name)),
        ..d
    }
    .of(what)
}

/// Kahn's algorithm over step-to-step references. Steps that were not built still take part,
/// so a broken step does not hide a cycle; every distinct cycle is reported once, with its path.
fn topological_order(
    deps: &[Vec<usize>],
    declared: &[Declared],
    name_spans: &[std::ops::Range<usize>],
    diags: &mut Vec<Diagnostic>,
) -> Vec<usize> {
    let n = deps.len();
    let deps: Vec<Vec<usize>> = deps
        .iter()
        .map(|d| {
            let mut d = d.clone();
            d.sort_unstable();
            d.dedup();
            d
        })
        .collect();
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut dependents = vec![Vec::new(); n];
    for (i, d) in deps.iter().enumerate() {
        for &j in d {
            dependents[j].push(i);
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut next = 0;
    while next < order.len() {
        let i = order[next];
        next += 1;
        for &j in &dependents[i] {
            waiting[j] -= 1;
            if waiting[j] == 0 {
                order.push(j);
            }
        }
    }
    // Every step still waiting is on a cycle or downstream of one. Walk back along
    // dependencies from each until a step repeats: that closes a cycle.
    let mut on_reported_cycle = vec![false; n];
    for start in (0..n).filter(|&i| waiting[i] > 0) {
        let mut path = vec![start];
        let mut at = start;
        while let Some(&prev) = deps[at].iter().find(|&&d| waiting[d] > 0) {
            if let Some(pos) = path.iter().position(|&p| p == prev) {
                let cycle = &path[pos..];
                if !cycle.iter().any(|&i| on_reported_cycle[i]) {
                    for &i in cycle {
                        on_reported_cycle[i] = true;
                    }
                    let mut names: Vec<&str> = cycle
                        .iter()
                        .rev()
                        .map(|&i| declared[i].name.as_str())
                        .collect();
                    names.push(names[0]);
                    diags.push(Diagnostic::at(
                        name_spans[prev].clone(),
                        format!("steps form a cycle: {}", names.join(" -> ")),
                    ));
                }
                break;
            }
            path.push(prev);
            at = prev;
        }
    }
    order
}
