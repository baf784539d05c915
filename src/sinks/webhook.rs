//! `webhook`: POSTs each frame's JSON (the `jsonl` line) to an HTTP(S) endpoint (ureq).
//!
//! Threads: the sink's thread (`vidflow-sink-NAME`) builds the message and pushes it into the
//! bounded [`Backlog`] (never waiting on the network); `vidflow-webhook-NAME` takes messages from
//! there one at a time, in order, and POSTs each until it is accepted (2xx) or its `retries` are
//! spent ([`Backoff`] between attempts; a 4xx other than 408/429 is not retried). A message
//! given up is counted as lost; one warning per outage, not per try.
//!
//! Stop protocol: `close` sets `closing` with the flush deadline (`flush_timeout_ms`). The
//! delivery thread goes on until the backlog is empty or the deadline passes (a backoff wait is
//! cut short then; a request in progress ends within `timeout_ms`), then ends. `close` waits
//! for it until the deadline plus `timeout_ms`, else detaches it; what is left is counted and
//! named as lost.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;
use toml::Spanned;
use ureq::http::{HeaderName, HeaderValue};

use super::common::net::{self, Backlog, Backoff, Lost, Message, Mode};
use super::{Sink, SinkError, SinkFactory, SinkKind};
use crate::outcome::FrameResult;
use crate::spec::{Address, Diagnostic, ParamDoc, Params, SinkInput, redact, redact_all};

pub(super) static KIND: SinkKind = SinkKind {
    name: "webhook",
    summary: "POSTs each frame's JSON (as a jsonl line) to an HTTP endpoint, retrying with backoff",
    inputs: &[super::INCLUDE_PORT],
    params: &[
        ParamDoc {
            name: "url",
            ty: "string",
            default: "required",
            doc: "http:// or https:// endpoint",
        },
        ParamDoc {
            name: "headers",
            ty: "table",
            default: "{}",
            doc: "extra request headers, e.g. { Authorization = \"Bearer ...\" } (never logged)",
        },
        net::MODE_DOC,
        ParamDoc {
            name: "timeout_ms",
            ty: "integer >= 1",
            default: "5000",
            doc: "limit of one request, connect to response",
        },
        ParamDoc {
            name: "retries",
            ty: "integer",
            default: "3",
            doc: "attempts after the first for an error, a 5xx, 408 or 429; then the message is lost",
        },
        ParamDoc {
            name: "backlog",
            ty: "integer",
            default: "1000",
            doc: "messages waiting to be sent; when full the oldest are dropped",
        },
        ParamDoc {
            name: "flush_timeout_ms",
            ty: "integer",
            default: "4000",
            doc: "at stop, how long to deliver the backlog; what is left is counted as lost",
        },
    ],
    build,
};

/// `timeout_ms` when the file does not say.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// `retries` when the file does not say.
const DEFAULT_RETRIES: u32 = 3;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    url: Spanned<String>,
    headers: Option<Spanned<toml::Table>>,
    #[serde(default)]
    mode: Mode,
    timeout_ms: Option<Spanned<u64>>,
    retries: Option<u32>,
    backlog: Option<Spanned<usize>>,
    flush_timeout_ms: Option<u64>,
}

/// A request header; its value may be a secret and never prints.
#[derive(Clone)]
struct Header(HeaderName, HeaderValue);

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ***", self.0)
    }
}

#[derive(Debug, Clone)]
struct Endpoint {
    url: String,
    /// The URL as it may be shown: without a password.
    shown: String,
    headers: Vec<Header>,
    timeout: Duration,
    retries: u32,
}

#[derive(Debug)]
struct Factory {
    endpoint: Endpoint,
    mode: Mode,
    backlog: usize,
    flush_timeout: Duration,
}

fn build(params: Params<'_>) -> Result<Box<dyn SinkFactory>, Diagnostic> {
    let c: Config = params.parse()?;
    let written = c.url.get_ref().trim();
    let scheme = written
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase());
    if !matches!(scheme.as_deref(), Some("http" | "https")) || written.ends_with("://") {
        return Err(Diagnostic::at(
            c.url.span(),
            format!(
                "url \"{}\": expected http://host/... or https://host/...",
                redact(written)
            ),
        ));
    }
    // ureq is given the URL as this one parse writes it, and messages show it redacted.
    let address =
        Address::parse(written).map_err(|e| Diagnostic::at(c.url.span(), e.to_string()))?;
    let (url, shown) = (address.expose(), address.to_string());
    let mut headers = Vec::new();
    for (k, v) in c.headers.iter().flat_map(|h| h.get_ref()) {
        let span = c.headers.as_ref().map_or(0..0, Spanned::span);
        let bad = |why: &str| Diagnostic::at(span.clone(), format!("header \"{k}\": {why}"));
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| bad("not a header name"))?;
        let value = v
            .as_str()
            .ok_or_else(|| bad("the value must be a string"))
            .and_then(|s| HeaderValue::from_str(s).map_err(|_| bad("not a header value")))?;
        headers.push(Header(name, value));
    }
    let timeout = match c.timeout_ms {
        Some(t) if *t.get_ref() == 0 => {
            return Err(Diagnostic::at(t.span(), "timeout_ms must be at least 1"));
        }
        Some(t) => Duration::from_millis(t.into_inner()),
        None => DEFAULT_TIMEOUT,
    };
    let backlog = net::backlog(c.backlog)?;
    Ok(Box::new(Factory {
        endpoint: Endpoint {
            url,
            shown,
            headers,
            timeout,
            retries: c.retries.unwrap_or(DEFAULT_RETRIES),
        },
        mode: c.mode,
        backlog,
        flush_timeout: c
            .flush_timeout_ms
            .map_or(net::DEFAULT_FLUSH_TIMEOUT, Duration::from_millis),
    }))
}

/// The delivery thread's side of the shared state.
#[derive(Debug, Default)]
struct Hook {
    /// The message being sent (taken from `waiting`), for closing to count if it is left.
    sending: Option<Message>,
    /// Set by the delivery thread as it ends.
    finished: bool,
}

impl SinkFactory for Factory {
    /// A broker or server away must not slow the cameras: the oldest result is dropped (and
    /// counted) when the queue in front of the backlog is full.
    fn default_on_full(&self) -> super::OnFull {
        super::OnFull::DropOldest
    }

    fn open(
        &self,
        name: &str,
        inputs: &[SinkInput],
        _storage: &crate::storage::Storage,
    ) -> Result<Box<dyn Sink>, SinkError> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(self.endpoint.timeout))
            .http_status_as_error(false)
            .build()
            .into();
        let backlog = Backlog::new(self.backlog, Hook::default());
        let shared = backlog.clone();
        let endpoint = self.endpoint.clone();
        let label = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("vidflow-webhook-{name}"))
            .spawn(move || deliver(&agent, &shared, &label, &endpoint))
            .map_err(|e| SinkError::Other(format!("cannot spawn webhook thread: {e}")))?;
        tracing::info!(sink = %name, url = %self.endpoint.shown, "webhook sink started");
        Ok(Box::new(Webhook {
            name: name.to_owned(),
            inputs: inputs.to_vec(),
            mode: self.mode,
            backlog,
            flush_timeout: self.flush_timeout,
            request_timeout: self.endpoint.timeout,
            thread: Some(thread),
        }))
    }
}

/// Why one POST did not deliver, and whether another attempt may.
struct Refused {
    why: String,
    retry: bool,
}

fn post(agent: &ureq::Agent, endpoint: &Endpoint, body: &[u8]) -> Result<(), Refused> {
    let mut request = agent
        .post(&endpoint.url)
        .header("content-type", "application/json");
    for Header(k, v) in &endpoint.headers {
        request = request.header(k, v);
    }
    match request.send(body) {
        Ok(response) => {
            let status = response.status().as_u16();
            match status {
                200..=299 => Ok(()),
                _ => Err(Refused {
                    why: format!("http status {status}"),
                    retry: status >= 500 || status == 408 || status == 429,
                }),
            }
        }
        // ureq's errors name the host, never the URL's password; redact anyway.
        Err(e) => Err(Refused {
            why: redact_all(&e.to_string()),
            retry: true,
        }),
    }
}

/// What became of one message.
enum Sent {
    Delivered,
    GivenUp,
    /// The flush deadline passed before it was delivered.
    OutOfTime,
}

/// The `vidflow-webhook-NAME` thread (see the module header).
fn deliver(agent: &ureq::Agent, backlog: &Backlog<Hook>, name: &str, endpoint: &Endpoint) {
    let mut failing = false;
    loop {
        let mut state = backlog.lock();
        let message = loop {
            if state.out_of_time() {
                break None;
            }
            if let Some(m) = state.waiting.pop_front() {
                break Some(m);
            }
            if state.closing.is_some() {
                break None;
            }
            state = backlog.wait(state, None);
        };
        let Some(message) = message else {
            state.link.finished = true;
            drop(state);
            backlog.notify();
            return;
        };
        state.link.sending = Some(message.clone());
        drop(state);
        let mut backoff = Backoff::default();
        let mut attempt = 0;
        let sent = loop {
            match post(agent, endpoint, &message.body) {
                Ok(()) => break Sent::Delivered,
                Err(refused) => {
                    if !failing {
                        failing = true;
                        tracing::warn!(
                            sink = %name,
                            url = %endpoint.shown,
                            error = %refused.why,
                            "webhook failing; retrying with backoff"
                        );
                    }
                    if !refused.retry || attempt >= endpoint.retries {
                        break Sent::GivenUp;
                    }
                    attempt += 1;
                    let until = Instant::now() + backoff.next_delay();
                    let mut state = backlog.lock();
                    while Instant::now() < until && !state.out_of_time() {
                        state = backlog.wait(state, Some(until));
                    }
                    if state.out_of_time() {
                        break Sent::OutOfTime;
                    }
                }
            }
        };
        let mut state = backlog.lock();
        state.link.sending = None;
        match sent {
            Sent::Delivered => {
                if failing {
                    failing = false;
                    tracing::info!(sink = %name, url = %endpoint.shown, "webhook delivering again");
                }
            }
            Sent::GivenUp => state.failed.add(&message),
            Sent::OutOfTime => state.waiting.push_front(message),
        }
        drop(state);
        backlog.notify();
    }
}

struct Webhook {
    name: String,
    inputs: Vec<SinkInput>,
    mode: Mode,
    backlog: Arc<Backlog<Hook>>,
    flush_timeout: Duration,
    request_timeout: Duration,
    thread: Option<JoinHandle<()>>,
}

impl Sink for Webhook {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        match net::message(result, &self.inputs, self.mode)? {
            Some(m) => {
                self.backlog.push(m);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn close(mut self: Box<Self>) -> Result<(), SinkError> {
        let mut state = self.backlog.lock();
        let deadline = Instant::now() + self.flush_timeout;
        state.closing = Some(deadline);
        drop(state);
        self.backlog.notify();
        // A request under way when the deadline passes ends within its own timeout.
        let until = deadline + self.request_timeout;
        let mut state = self.backlog.lock();
        while !state.link.finished && Instant::now() < until {
            state = self.backlog.wait(state, Some(until));
        }
        let finished = state.link.finished;
        let mut at_stop = Lost::default();
        for m in state.link.sending.iter().chain(&state.waiting) {
            at_stop.add(m);
        }
        let result = net::losses("webhook", &state.overflow, &state.failed, &at_stop);
        drop(state);
        match self.thread.take() {
            Some(t) if finished => {
                let _ = t.join();
            }
            _ => tracing::warn!(sink = %self.name, "webhook request still under way; detached"),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_never_print() {
        let h = Header(
            HeaderName::from_static("authorization"),
            HeaderValue::from_static("Bearer hunter2"),
        );
        assert_eq!(format!("{h:?}"), "authorization: ***");
    }
}
