//! `mqtt`: publishes each frame's JSON (the `jsonl` line) to an MQTT broker (rumqttc).
//!
//! Threads: the sink's thread (`vidflow-sink-NAME`) builds the message and pushes it into the
//! bounded [`Backlog`] (never waiting on the network); `vidflow-mqtt-NAME` drives rumqttc's
//! event loop (its sync `Connection`, with its own small tokio runtime): it connects, reconnects
//! with [`Backoff`] while the daemon runs (one warning per outage, not per try) and counts
//! acknowledgements. Either thread hands waiting messages to rumqttc while connected, at most
//! [`INFLIGHT`] unacknowledged at a time ([`pump`]), under the backlog's lock.
//!
//! Delivery: a message leaves the backlog when the broker acknowledges it (QoS 1) or when it is
//! written to the socket (QoS 0). On a lost connection the unacknowledged ones go back to the
//! front of the backlog, in order, and are sent again after the reconnect: a message may then
//! arrive twice (QoS 1's "at least once"), never out of order within one connection. (rumqttc
//! forgets its own unacknowledged messages on a clean session, so the sink keeps them.)
//!
//! Stop protocol: `close` sets `closing` with the flush deadline (`flush_timeout_ms`) and waits
//! until the backlog is empty or the deadline passes; what is left is counted and named as lost.
//! Then it asks rumqttc to disconnect and sets `stop`; the event loop thread ends on the
//! `Disconnect` it sends, on its next error, or on waking from a backoff. It is joined for at
//! most [`JOIN_TIMEOUT`], else detached (a connect attempt to a silent host can take up to
//! [`CONNECT_TIMEOUT_S`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rumqttc::{Client, Connection, Event, LastWill, MqttOptions, Outgoing, Packet, QoS, Transport};

use super::common::net::{self, Backlog, Backoff, Lost, Message, Mode, State};
use super::{Sink, SinkError, SinkFactory, SinkKind};
use crate::outcome::FrameResult;
use crate::spec::{ParamDoc, SinkInput};

mod config;
mod discovery;

use config::{Broker, Factory, build, tls_config};
use discovery::{Discovery, OFFLINE, ONLINE};

pub(super) static KIND: SinkKind = SinkKind {
    name: "mqtt",
    summary: "publishes each frame's JSON (as a jsonl line) to an MQTT broker, with a backlog while it is away",
    inputs: &[super::INCLUDE_PORT],
    params: &[
        ParamDoc {
            name: "url",
            ty: "string",
            default: "required",
            doc: "mqtt://[user:password@]host[:1883] or mqtts://...[:8883] (system CA roots)",
        },
        ParamDoc {
            name: "topic",
            ty: "string",
            default: "\"vidflow/{source}/{sink}\"",
            doc: "topic; {source} and {sink} are replaced",
        },
        net::MODE_DOC,
        ParamDoc {
            name: "qos",
            ty: "0 | 1",
            default: "1",
            doc: "1: at least once (resent after a reconnect); 0: at most once",
        },
        ParamDoc {
            name: "retain",
            ty: "bool",
            default: "false",
            doc: "the broker keeps the last message of each topic",
        },
        ParamDoc {
            name: "client_id",
            ty: "string",
            default: "\"vidflow-{sink}-{pid}\"",
            doc: "MQTT client identifier",
        },
        ParamDoc {
            name: "username",
            ty: "string",
            default: "none",
            doc: "user, with password_file (or both in the url)",
        },
        net::PASSWORD_FILE_DOC,
        ParamDoc {
            name: "backlog",
            ty: "integer",
            default: "1000",
            doc: "messages kept while the broker is away; when full the oldest are dropped",
        },
        ParamDoc {
            name: "flush_timeout_ms",
            ty: "integer",
            default: "4000",
            doc: "at stop, how long to deliver the backlog; what is left is counted as lost",
        },
        net::EVERY_N_FRAMES_DOC,
        ParamDoc {
            name: "discovery",
            ty: "bool",
            default: "false",
            doc: "Home Assistant discovery: each count of an included value is a sensor, \
                  each zone or line of included events an event entity (enter, leave, in, out, \
                  loiter, speeding), available while the daemon is (last will on \
                  vidflow/HOST/SINK/availability)",
        },
        ParamDoc {
            name: "discovery_prefix",
            ty: "string",
            default: "\"homeassistant\"",
            doc: "Home Assistant's discovery prefix",
        },
    ],
    build,
};

/// Unacknowledged messages handed to rumqttc at a time (rumqttc's default in-flight window).
const INFLIGHT: usize = 100;
/// Largest message sent: a larger frame fails alone instead of breaking the connection.
const MAX_PACKET: usize = 1 << 20;
/// rumqttc's connect timeout: a silent host is given up on (and retried) after this.
const CONNECT_TIMEOUT_S: u64 = 5;
/// How long closing waits for the event loop thread to end before detaching it.
const JOIN_TIMEOUT: Duration = Duration::from_secs(1);
/// How often rumqttc pings an idle broker (and notices a dead one).
const KEEP_ALIVE: Duration = Duration::from_secs(30);

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
        let b = &self.broker;
        let id = self
            .client_id
            .clone()
            .unwrap_or_else(|| format!("vidflow-{name}-{}", std::process::id()));
        let mut options = MqttOptions::new(id, b.host.clone(), b.port);
        options
            .set_keep_alive(KEEP_ALIVE)
            .set_clean_session(true)
            .set_inflight(INFLIGHT as u16)
            .set_max_packet_size(MAX_PACKET, MAX_PACKET);
        if let Some((user, password)) = &b.login {
            options.set_credentials(user.clone(), password.expose().to_owned());
        }
        if b.tls {
            options.set_transport(Transport::tls_with_config(tls_config()?));
        }
        let discovery = self
            .discovery
            .as_ref()
            .map(|prefix| Discovery::new(prefix, super::common::stream::host_name(), name));
        if let Some(d) = &discovery {
            options.set_last_will(LastWill::new(&d.availability, OFFLINE, self.qos, true));
        }
        let (client, mut connection) = Client::new(options, INFLIGHT + 8);
        connection
            .eventloop
            .network_options
            .set_connection_timeout(CONNECT_TIMEOUT_S);
        let link = Link {
            client: client.clone(),
            topic: self.topic.replace("{sink}", name),
            qos: self.qos,
            retain: self.retain,
            connected: false,
            unacked: VecDeque::new(),
            stop: false,
            finished: false,
            discovery,
            announce: VecDeque::new(),
        };
        let backlog = Backlog::new(self.backlog, link);
        let shared = backlog.clone();
        let label = name.to_owned();
        let broker = b.clone();
        let thread = std::thread::Builder::new()
            .name(format!("vidflow-mqtt-{name}"))
            .spawn(move || event_loop(&mut connection, &shared, &label, &broker))
            .map_err(|e| SinkError::Other(format!("cannot spawn mqtt thread: {e}")))?;
        tracing::info!(sink = %name, broker = %b.shown, "mqtt sink started");
        Ok(Box::new(Mqtt {
            name: name.to_owned(),
            inputs: inputs.to_vec(),
            mode: self.mode,
            every: self.every,
            backlog,
            client,
            flush_timeout: self.flush_timeout,
            thread: Some(thread),
        }))
    }
}

/// The connection's side of the shared state (see the module header).
struct Link {
    client: Client,
    /// The topic with `{sink}` replaced.
    topic: String,
    qos: QoS,
    retain: bool,
    /// Between a ConnAck and the next connection error.
    connected: bool,
    /// Handed to rumqttc, not yet acknowledged, in order; the packet id once rumqttc sent it.
    /// `None`: a retained announcement (discovery), not a frame: sent again at each connect,
    /// never counted as lost.
    unacked: VecDeque<(Option<u16>, Option<Message>)>,
    /// Set by closing: the event loop thread ends.
    stop: bool,
    /// Set by the event loop thread as it ends.
    finished: bool,
    /// Home Assistant discovery, if on.
    discovery: Option<Discovery>,
    /// Retained announcements (availability, sensor configs) to hand to rumqttc first.
    announce: VecDeque<(String, Vec<u8>)>,
}

impl Link {
    /// After a connect: the availability and every sensor config, again (retained).
    fn announce_all(&mut self) {
        self.announce.clear();
        if let Some(d) = &self.discovery {
            self.announce
                .push_back((d.availability.clone(), ONLINE.as_bytes().to_vec()));
            self.announce.extend(d.configs.iter().cloned());
        }
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("topic", &self.topic)
            .field("connected", &self.connected)
            .field("unacked", &self.unacked.len())
            .field("stop", &self.stop)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

/// Hands waiting messages to rumqttc while connected and the in-flight window has room.
fn pump(state: &mut State<Link>) {
    while state.link.connected && state.link.unacked.len() < INFLIGHT {
        let link = &mut state.link;
        let Some((topic, payload)) = link.announce.pop_front() else {
            break;
        };
        match link
            .client
            .try_publish(&topic, link.qos, true, payload.clone())
        {
            Ok(()) => link.unacked.push_back((None, None)),
            Err(_) => {
                link.announce.push_front((topic, payload));
                return;
            }
        }
    }
    while state.link.connected && state.link.unacked.len() < INFLIGHT {
        let Some(m) = state.waiting.pop_front() else {
            return;
        };
        let link = &state.link;
        let topic = link.topic.replace("{source}", &m.source);
        match link
            .client
            .try_publish(topic, link.qos, link.retain, m.body.clone())
        {
            Ok(()) => state.link.unacked.push_back((None, Some(m))),
            Err(_) => {
                // rumqttc's request channel is full (it holds more than the window only while
                // a disconnect is queued): keep the message for later.
                state.waiting.push_front(m);
                return;
            }
        }
    }
}

/// The `vidflow-mqtt-NAME` thread: drives rumqttc until closing says stop.
fn event_loop(connection: &mut Connection, backlog: &Backlog<Link>, name: &str, broker: &Broker) {
    let scrub = |text: String| match &broker.login {
        Some((_, p)) => p.scrub(&text),
        None => text,
    };
    let mut backoff = Backoff::default();
    let mut outage: Option<Instant> = None;
    let mut ever_connected = false;
    loop {
        let Ok(event) = connection.recv() else {
            break;
        };
        let mut state = backlog.lock();
        match event {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                state.link.connected = true;
                state.link.announce_all();
                pump(&mut state);
                backoff.reset();
                match outage.take() {
                    Some(since) if ever_connected => tracing::info!(
                        sink = %name,
                        broker = %broker.shown,
                        outage_s = since.elapsed().as_secs_f64(),
                        backlog = state.waiting.len() + state.link.unacked.len(),
                        "mqtt broker reachable again; sending the backlog"
                    ),
                    _ => tracing::info!(sink = %name, broker = %broker.shown, "mqtt connected"),
                }
                ever_connected = true;
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                if let Some(slot) = state.link.unacked.iter_mut().find(|(p, _)| p.is_none()) {
                    slot.0 = Some(pkid);
                }
                if state.link.qos == QoS::AtMostOnce {
                    state.link.unacked.pop_front();
                    pump(&mut state);
                }
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                let at = state
                    .link
                    .unacked
                    .iter()
                    .position(|(p, _)| *p == Some(ack.pkid));
                if let Some(at) = at {
                    state.link.unacked.remove(at);
                }
                pump(&mut state);
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => break,
            Ok(_) => {}
            Err(e) => {
                state.link.connected = false;
                while let Some((_, m)) = state.link.unacked.pop_back() {
                    if let Some(m) = m {
                        state.waiting.push_front(m);
                    }
                }
                if state.link.stop {
                    break;
                }
                if outage.is_none() {
                    outage = Some(Instant::now());
                    tracing::warn!(
                        sink = %name,
                        broker = %broker.shown,
                        error = %scrub(e.to_string()),
                        "mqtt broker unreachable; keeping a backlog and retrying"
                    );
                }
                let until = Instant::now() + backoff.next_delay();
                while !state.link.stop && Instant::now() < until {
                    state = backlog.wait(state, Some(until));
                }
                if state.link.stop {
                    break;
                }
            }
        }
        drop(state);
        backlog.notify();
    }
    let mut state = backlog.lock();
    state.link.connected = false;
    state.link.finished = true;
    drop(state);
    backlog.notify();
}

struct Mqtt {
    name: String,
    inputs: Vec<SinkInput>,
    mode: Mode,
    every: u64,
    backlog: Arc<Backlog<Link>>,
    client: Client,
    flush_timeout: Duration,
    thread: Option<JoinHandle<()>>,
}

impl Mqtt {
    /// Announces the sensors this frame shows first (discovery on).
    fn discover(&self, result: &FrameResult) {
        let mut state = self.backlog.lock();
        let link = &mut state.link;
        let Some(d) = link.discovery.as_mut() else {
            return;
        };
        let topic = link.topic.replace("{source}", &result.frame().source);
        let new = d.find(result, &self.inputs, &topic);
        let found = d.configs.len() - new..;
        let configs = d.configs[found].to_vec();
        link.announce.extend(configs);
        pump(&mut state);
    }
}

impl Sink for Mqtt {
    fn write(&mut self, result: &FrameResult) -> Result<bool, SinkError> {
        if !result.frame().seq.is_multiple_of(self.every) {
            return Ok(false);
        }
        self.discover(result);
        let Some(m) = net::message(result, &self.inputs, self.mode)? else {
            return Ok(false);
        };
        if m.body.len() + 1024 > MAX_PACKET {
            return Err(SinkError::Other(format!(
                "mqtt \"{}\": frame {} is {} bytes, more than an mqtt message may hold here ({MAX_PACKET})",
                self.name,
                m.frame,
                m.body.len()
            )));
        }
        self.backlog.push(m);
        pump(&mut self.backlog.lock());
        Ok(true)
    }

    fn close(mut self: Box<Self>) -> Result<(), SinkError> {
        let mut state = self.backlog.lock();
        let deadline = Instant::now() + self.flush_timeout;
        state.closing = Some(deadline);
        loop {
            let delivered = state.waiting.is_empty() && state.link.unacked.is_empty();
            if delivered || state.out_of_time() || state.link.finished {
                break;
            }
            state = self.backlog.wait(state, Some(deadline));
        }
        let mut at_stop = Lost::default();
        for (_, m) in &state.link.unacked {
            if let Some(m) = m {
                at_stop.add(m);
            }
        }
        for m in &state.waiting {
            at_stop.add(m);
        }
        state.link.stop = true;
        if let Some(d) = &state.link.discovery {
            // A clean stop says so itself; the last will covers a crash.
            let offline = OFFLINE.as_bytes().to_vec();
            let _ = self
                .client
                .try_publish(&d.availability, state.link.qos, true, offline);
        }
        drop(state);
        let _ = self.client.try_disconnect();
        self.backlog.notify();
        let until = Instant::now() + JOIN_TIMEOUT;
        let mut state = self.backlog.lock();
        while !state.link.finished && Instant::now() < until {
            state = self.backlog.wait(state, Some(until));
        }
        let finished = state.link.finished;
        let result = net::losses("mqtt", &state.overflow, &state.failed, &at_stop);
        drop(state);
        match self.thread.take() {
            Some(t) if finished => {
                let _ = t.join();
            }
            _ => tracing::warn!(sink = %self.name, "mqtt event loop still connecting; detached"),
        }
        result
    }
}
