//! What a reload (SIGHUP) changes: the running pipeline compared with the file as it is now.
//!
//! Pure: [`plan`] only compares and decides; `run.rs` carries the plan out. The rules:
//! - A source whose URI and settings are equal keeps running (its frame numbers go on); a
//!   changed one is stopped (what it decoded still goes through the workflow) and started again
//!   from its predecessor's frame number and time; a removed one is stopped; a new one starts.
//! - A step whose table is equal to the running one's, and whose every input comes from a kept
//!   step, is kept: its instance, and so its state (track IDs, counts, a background model),
//!   carries over. Any other step is the new file's, built fresh.
//! - A sink whose table is equal, which reads only kept steps at the same places, is kept open
//!   (its files go on); any other is opened anew and the running one closed at the swap.
//! - What only a restart can change (the pool's size, the HTTP address, the event store's
//!   `[events]`) is reported and kept.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{ExecutorConfig, Pipeline, Written};
use crate::source::SourceConfig;
use crate::spec::{Ref, SinkInput};
use crate::workflow::Graph;

/// The running pipeline's parts that a reload compares against.
#[derive(Debug)]
pub(super) struct Current<'a> {
    pub sources: &'a [SourceConfig],
    pub graph: &'a Graph,
    pub sinks: &'a [(Arc<str>, Vec<SinkInput>)],
    pub written: &'a Written,
    pub executor: ExecutorConfig,
    pub http: Option<std::net::SocketAddr>,
    pub events: Option<&'a crate::events::EventsConfig>,
}

/// What to do with each source, by index.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SourcePlan {
    /// Running sources to keep, by index in the running list.
    pub keep: Vec<usize>,
    /// Running sources to stop for good.
    pub remove: Vec<usize>,
    /// (running, new): a running source to stop, then start again with its new settings.
    pub restart: Vec<(usize, usize)>,
    /// New sources, by index in the new pipeline.
    pub add: Vec<usize>,
}

/// A reload worked out.
#[derive(Debug)]
pub(super) struct Plan {
    pub sources: SourcePlan,
    /// Per step of the new pipeline (in its order): the running node whose instance it keeps.
    pub kept_steps: Vec<Option<usize>>,
    /// Per sink of the new pipeline: the running sink it keeps open.
    pub kept_sinks: Vec<Option<usize>>,
    /// Running sinks that the new pipeline does not keep: closed at the swap.
    pub closed_sinks: Vec<usize>,
    /// Changes that need a restart, kept as they run now (one line each, for the log).
    pub ignored: Vec<String>,
    /// `max_in_flight` or `on_step_error` changed: a new executor is needed.
    pub executor_changed: bool,
    /// Steps of the running graph: more than the new file keeps means some are removed.
    pub running_steps: usize,
}

impl Plan {
    /// True if the reload changes nothing that runs.
    pub(super) fn is_empty(&self) -> bool {
        self.sources.restart.is_empty()
            && self.sources.remove.is_empty()
            && self.sources.add.is_empty()
            && self.kept_steps.iter().all(Option::is_some)
            && self.kept_sinks.iter().all(Option::is_some)
            && self.closed_sinks.is_empty()
            && self.kept_steps.len() == self.running_steps
            && !self.executor_changed
    }
}

pub(super) fn plan(current: &Current<'_>, new: &Pipeline) -> Plan {
    Plan {
        sources: plan_sources(current.sources, &new.sources),
        kept_steps: kept_steps(current, new),
        kept_sinks: Vec::new(),
        closed_sinks: Vec::new(),
        ignored: ignored(current, new),
        executor_changed: new.executor.max_in_flight != current.executor.max_in_flight
            || new.executor.on_step_error != current.executor.on_step_error,
        running_steps: current.graph.len(),
    }
    .with_sinks(current, new)
}

fn plan_sources(running: &[SourceConfig], new: &[SourceConfig]) -> SourcePlan {
    let mut out = SourcePlan::default();
    for (i, old) in running.iter().enumerate() {
        match new.iter().position(|s| s.name == old.name) {
            Some(j)
                if new[j].uri == old.uri
                    && new[j].options == old.options
                    && new[j].record == old.record =>
            {
                out.keep.push(i)
            }
            Some(j) => out.restart.push((i, j)),
            None => out.remove.push(i),
        }
    }
    out.add = (0..new.len())
        .filter(|&j| !running.iter().any(|s| s.name == new[j].name))
        .collect();
    out
}

/// Steps come in an order where each follows those it reads, so one pass decides.
fn kept_steps(current: &Current<'_>, new: &Pipeline) -> Vec<Option<usize>> {
    let running: HashMap<&str, usize> = current
        .graph
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (&*n.name, i))
        .collect();
    let mut kept: Vec<Option<usize>> = Vec::with_capacity(new.steps.len());
    for step in &new.steps {
        let name = &*step.name;
        let same_table = current.written.steps.contains_key(name)
            && current.written.steps.get(name) == new.written.steps.get(name);
        let inputs_kept = step.inputs.iter().flatten().all(|r| match r {
            Ref::Frame => true,
            Ref::Step { step, .. } => kept[*step].is_some(),
        });
        kept.push(running.get(name).copied().filter(|&i| {
            same_table && inputs_kept && std::ptr::eq(current.graph.nodes[i].kind, step.kind)
        }));
    }
    kept
}

impl Plan {
    fn with_sinks(mut self, current: &Current<'_>, new: &Pipeline) -> Self {
        // A sink's references are fixed when it opens: it can be kept only if each still names
        // the same place, an output of the same (kept) step at the same index.
        let same_place = |r: &Ref, running: &Ref| match (r, running) {
            (Ref::Frame, Ref::Frame) => true,
            (
                Ref::Step { step, output },
                Ref::Step {
                    step: was,
                    output: was_output,
                },
            ) => step == was && self.kept_steps[*step] == Some(*was) && output == was_output,
            _ => false,
        };
        self.kept_sinks = new
            .sinks
            .iter()
            .map(|sink| {
                let name = &*sink.name;
                let i = current.sinks.iter().position(|(n, _)| &**n == name)?;
                let running_inputs = &current.sinks[i].1;
                let same_table = current.written.sinks.contains_key(name)
                    && current.written.sinks.get(name) == new.written.sinks.get(name);
                let same_inputs = sink.inputs.len() == running_inputs.len()
                    && sink
                        .inputs
                        .iter()
                        .zip(running_inputs)
                        .all(|(a, b)| a.port == b.port && same_place(&a.from, &b.from));
                (same_table && same_inputs).then_some(i)
            })
            .collect();
        self.closed_sinks = (0..current.sinks.len())
            .filter(|i| !self.kept_sinks.contains(&Some(*i)))
            .collect();
        self
    }
}

fn ignored(current: &Current<'_>, new: &Pipeline) -> Vec<String> {
    let mut out = Vec::new();
    if new.executor.workers != current.executor.workers {
        out.push(format!(
            "[executor] workers = {} (the pool keeps its {} worker(s) until a restart)",
            new.executor.workers, current.executor.workers
        ));
    }
    let listen = new.http.as_ref().map(|h| h.listen);
    if listen != current.http {
        out.push(format!(
            "[http] listen (stays {} until a restart)",
            current
                .http
                .map_or_else(|| "off".to_owned(), |a| a.to_string())
        ));
    }
    if new.events.as_ref() != current.events {
        // The store's writer thread, its file and its retention are the run's: the frames'
        // facts go on to the store that runs, never half to one file and half to another.
        let running = current
            .events
            .map_or_else(|| "off".to_owned(), |e| format!("\"{}\"", e.path.display()));
        out.push(format!(
            "[events] (the event store stays {running} until a restart)"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SourceText, load_text};

    const BASE: &str = r#"
[sources.a]
uri = "test://ball"
[sources.b]
uri = "test://smpte"

[executor]
workers = 2

[steps.motion]
kind = "motion"
image = "$frame"
[steps.tracks]
kind = "tracker"
detections = "$steps.motion.detections"
[steps.gray]
kind = "grayscale"
image = "$frame"

[sinks.events]
kind = "jsonl"
path = "events.jsonl"
include = ["$steps.tracks.tracks"]
[sinks.gray]
kind = "jsonl"
path = "gray.jsonl"
include = ["$steps.gray.image"]
"#;

    fn load(text: &str) -> Pipeline {
        load_text(&SourceText::new("p.toml", text.to_owned())).unwrap()
    }

    /// The plan from `BASE` running to `text`.
    fn plan_to(text: &str) -> (Plan, Pipeline) {
        plan_between(BASE, text)
    }

    /// The plan from `running` to `text`.
    fn plan_between(running: &str, text: &str) -> (Plan, Pipeline) {
        let mut running = load(running);
        let sinks: Vec<(Arc<str>, Vec<SinkInput>)> = running
            .sinks
            .iter()
            .map(|s| (s.name.clone(), s.inputs.clone()))
            .collect();
        let graph = Graph::new(std::mem::take(&mut running.steps));
        let new = load(text);
        let plan = plan(
            &Current {
                sources: &running.sources,
                graph: &graph,
                sinks: &sinks,
                written: &running.written,
                executor: running.executor,
                http: None,
                events: None,
            },
            &new,
        );
        (plan, new)
    }

    #[test]
    fn the_same_file_keeps_everything() {
        let (plan, _) = plan_to(&format!("# a comment changes nothing\n{BASE}"));
        assert!(plan.is_empty(), "{plan:?}");
        assert_eq!(plan.sources.keep, [0, 1]);
        assert!(plan.ignored.is_empty());
    }

    /// Kept steps by name: new step -> the running step it keeps.
    fn kept_by_name(plan: &Plan, new: &Pipeline) -> Vec<(String, Option<String>)> {
        let running = load(BASE);
        let order = Graph::new(running.steps);
        let mut out: Vec<_> = new
            .steps
            .iter()
            .zip(&plan.kept_steps)
            .map(|(s, k)| {
                (
                    s.name.to_string(),
                    k.map(|i| order.nodes[i].name.to_string()),
                )
            })
            .collect();
        out.sort();
        out
    }

    fn kept(name: &str) -> (String, Option<String>) {
        (name.to_owned(), Some(name.to_owned()))
    }

    fn fresh(name: &str) -> (String, Option<String>) {
        (name.to_owned(), None)
    }

    #[test]
    fn a_changed_step_is_rebuilt_with_the_steps_and_sinks_that_read_it() {
        let (plan, new) = plan_to(&BASE.replace(
            "kind = \"motion\"\nimage = \"$frame\"",
            "kind = \"motion\"\nimage = \"$frame\"\nmin_area = 50",
        ));
        // motion changed, tracks reads it; gray stands apart.
        assert_eq!(
            kept_by_name(&plan, &new),
            [kept("gray"), fresh("motion"), fresh("tracks")]
        );
        assert_eq!(plan.kept_sinks, [None, Some(1)]);
        assert_eq!(plan.closed_sinks, [0]);
        assert_eq!(plan.sources.keep, [0, 1]);
    }

    #[test]
    fn a_step_added_before_others_keeps_them_and_reopens_sinks_whose_references_moved() {
        // A new first step: every running step moves one place down the graph.
        let text = BASE.replace(
            "[steps.motion]",
            "[steps.blurred]\nkind = \"blur\"\nimage = \"$frame\"\n[steps.motion]",
        );
        let (plan, new) = plan_to(&text);
        assert_eq!(
            kept_by_name(&plan, &new),
            [
                fresh("blurred"),
                kept("gray"),
                kept("motion"),
                kept("tracks")
            ]
        );
        // Both sinks read kept steps, but at other places now: they are opened anew.
        assert_eq!(plan.kept_sinks, [None, None]);
        assert_eq!(plan.closed_sinks, [0, 1]);
    }

    #[test]
    fn sources_are_kept_restarted_removed_and_added_by_their_settings() {
        let text = BASE
            .replace(
                "[sources.a]\nuri = \"test://ball\"",
                "[sources.a]\nuri = \"test://ball\"\nqueue = 9",
            )
            .replace(
                "[sources.b]\nuri = \"test://smpte\"",
                "[sources.c]\nuri = \"test://smpte\"",
            );
        let (plan, _) = plan_to(&text);
        assert_eq!(
            plan.sources,
            SourcePlan {
                keep: vec![],
                remove: vec![1],
                restart: vec![(0, 0)],
                add: vec![1],
            }
        );
        // Steps and sinks are untouched by source changes.
        assert!(
            plan.kept_steps
                .iter()
                .enumerate()
                .all(|(i, k)| *k == Some(i))
        );
        assert_eq!(plan.kept_sinks, [Some(0), Some(1)]);
    }

    #[test]
    fn a_source_that_starts_or_stops_being_recorded_is_restarted() {
        let source = |record: Option<&str>| crate::source::SourceConfig {
            name: "cam".into(),
            uri: crate::source::SourceUri::parse("rtsp://cam/sub").unwrap(),
            options: crate::source::SourceOptions::default(),
            uri_span: 0..0,
            record: record.map(|r| crate::source::SourceUri::parse(r).unwrap()),
        };
        let recorded = [source(Some("rtsp://cam/main"))];
        assert_eq!(plan_sources(&recorded, &recorded).keep, [0]);
        assert_eq!(plan_sources(&[source(None)], &recorded).restart, [(0, 0)]);
        assert_eq!(plan_sources(&recorded, &[source(None)]).restart, [(0, 0)]);
    }

    #[test]
    fn what_needs_a_restart_is_reported_and_left_as_it_runs() {
        // The in-flight limit kept at what 2 workers get by default (IN_FLIGHT_PER_WORKER each).
        let text = BASE.replace("workers = 2", "workers = 3\nmax_in_flight = 4")
            + "\n[http]\nlisten = \"127.0.0.1:9464\"\n";
        let (plan, _) = plan_to(&text);
        assert_eq!(plan.ignored.len(), 2, "{:?}", plan.ignored);
        assert!(plan.ignored[0].contains("workers"));
        assert!(plan.ignored[1].contains("[http]"));
        assert!(plan.is_empty());
    }

    #[test]
    fn a_new_event_store_waits_for_a_restart_and_says_so() {
        let (plan, _) = plan_to(&format!("{BASE}\n[events]\npath = \"events.db\"\n"));
        assert_eq!(
            plan.ignored,
            ["[events] (the event store stays off until a restart)"]
        );
        assert!(plan.is_empty());
    }

    #[test]
    fn a_removed_step_that_nothing_reads_is_a_change() {
        // Running: BASE with one more step, last in the graph, that no sink reads.
        let running = format!(
            "{BASE}\n[steps.spare]\nkind = \"tracker\"\ndetections = \"$steps.motion.detections\"\n"
        );
        let (plan, new) = plan_between(&running, BASE);
        assert_eq!(new.steps.len(), 3);
        assert!(plan.kept_steps.iter().all(Option::is_some), "{plan:?}");
        assert!(plan.closed_sinks.is_empty(), "{plan:?}");
        assert!(
            !plan.is_empty(),
            "the removed step would go on running: {plan:?}"
        );
    }

    #[test]
    fn a_new_in_flight_limit_needs_a_new_executor() {
        let (plan, _) = plan_to(&BASE.replace("workers = 2", "workers = 2\nmax_in_flight = 1"));
        assert!(plan.executor_changed);
        assert!(!plan.is_empty());
    }
}
