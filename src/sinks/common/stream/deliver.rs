//! The delivery thread of a stream sink, the same for every server: it takes batches from the
//! [`Queue`], hands them to a [`Transport`] and removes what the server acknowledged.
//!
//! Threads: `vidflow-KIND-NAME` runs [`deliver`]; the sink's thread pushes into the queue.
//! Both share [`Shared`]: one mutex over the queue and the stop flags, and a [`Wake`] the sink's
//! thread raises after each push and at close. While there is nothing to send the delivery
//! thread blocks in [`Transport::idle`] (the NATS transport blocks inside its runtime, so that
//! its client answers the server's pings meanwhile).
//!
//! Delivery: at least once. A batch is sent whole, then its acknowledgements are awaited; what
//! was not acknowledged is handed out again, in order, after a reconnect ([`Backoff`] between
//! attempts, one warning per outage). A message the server refuses for good (too large, say)
//! is counted as lost and skipped, so it cannot block those behind it.
//!
//! Stop protocol: closing sets `closing` to the flush deadline and raises the wake. The thread
//! delivers until the queue is empty or the deadline passes (connects and sends are bounded by
//! it), then ends and says so on `done`. Closing waits for that until the deadline plus
//! [`JOIN_GRACE`], sets `stop` (a thread still in a call then discards its outcome and is
//! detached) and closes the queue: what is left goes to the spool or is counted as lost.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::Outgoing;
use super::queue::Queue;
use crate::sinks::common::net::{Backoff, Lost};

/// How long closing waits past the flush deadline for the delivery thread to end.
pub(super) const JOIN_GRACE: Duration = Duration::from_millis(500);

/// A wake-up with a permit: a raise before the wait is not lost. A transport that waits
/// elsewhere (in its runtime) registers a hook that wakes it there.
#[derive(Default)]
pub(in crate::sinks) struct Wake {
    raised: Mutex<bool>,
    changed: Condvar,
    hook: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Called once by closing, with the flush deadline.
    close_hook: OnceLock<Box<dyn Fn(Instant) + Send + Sync>>,
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wake").finish_non_exhaustive()
    }
}

impl Wake {
    pub(in crate::sinks) fn raise(&self) {
        *self.raised.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.changed.notify_all();
        if let Some(hook) = self.hook.get() {
            hook();
        }
    }

    /// Blocks until raised (taking the permit) or `until` passes.
    pub(in crate::sinks) fn wait(&self, until: Option<Instant>) {
        let mut raised = self.raised.lock().unwrap_or_else(PoisonError::into_inner);
        while !*raised {
            match until {
                None => {
                    raised = self
                        .changed
                        .wait(raised)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return;
                    }
                    raised = self
                        .changed
                        .wait_timeout(raised, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
        *raised = false;
    }

    /// Also calls `hook` on every raise (set once).
    pub(in crate::sinks) fn set_hook(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.hook.set(hook);
    }

    /// Calls `hook` with the flush deadline when closing begins (set once), so that a
    /// transport can bound a call already under way.
    pub(in crate::sinks) fn set_close_hook(&self, hook: Box<dyn Fn(Instant) + Send + Sync>) {
        let _ = self.close_hook.set(hook);
    }

    /// Closing begins: wakes the thread and tells the transport the deadline.
    pub(super) fn close(&self, deadline: Instant) {
        self.raise();
        if let Some(hook) = self.close_hook.get() {
            hook(deadline);
        }
    }
}

/// What the sink's thread and the delivery thread share under one lock.
#[derive(Debug)]
pub(super) struct State {
    pub(super) queue: Queue,
    /// Set by closing: deliver what is left until this deadline.
    pub(super) closing: Option<Instant>,
    /// Set by closing when it stops waiting: the thread ends, discarding any outcome.
    pub(super) stop: bool,
    /// Refused by the server for good.
    pub(super) refused: Lost,
}

impl State {
    fn out_of_time(&self) -> bool {
        self.stop || self.closing.is_some_and(|t| Instant::now() >= t)
    }
}

#[derive(Debug)]
pub(super) struct Shared {
    state: Mutex<State>,
    pub(super) wake: Wake,
}

impl Shared {
    pub(super) fn new(queue: Queue) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                queue,
                closing: None,
                stop: false,
                refused: Lost::default(),
            }),
            wake: Wake::default(),
        })
    }

    /// The shared state; every change under it is whole, so a poisoned lock is taken as is.
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How one send ended short of the whole batch.
#[derive(Debug)]
pub(in crate::sinks) struct Partial {
    /// Messages from the front of the batch that the server acknowledged.
    pub acked: usize,
    pub error: String,
    /// The message after those was refused for good: skip it, keep the connection.
    pub refused: bool,
}

/// One kind of server, driven by the delivery thread.
pub(in crate::sinks) trait Transport: Send + 'static {
    /// Called once, on the delivery thread, before anything else: a transport that waits
    /// elsewhere than on `wake` registers its hooks here.
    fn attach(&mut self, wake: &Wake) {
        let _ = wake;
    }
    /// Opens a connection, giving up at `until`.
    fn connect(&mut self, until: Option<Instant>) -> Result<(), String>;
    /// Sends `batch` in order and waits for its acknowledgements, giving up at `until`.
    fn send(&mut self, batch: &[Outgoing], until: Option<Instant>) -> Result<(), Partial>;
    /// Drops the connection (after a failure: the next send reconnects first).
    fn disconnect(&mut self);
    /// Blocks until `wake` is raised or `until` passes.
    fn idle(&mut self, wake: &Wake, until: Option<Instant>) {
        wake.wait(until);
    }
}

/// Names for the log lines of one sink.
#[derive(Debug, Clone)]
pub(super) struct Label {
    pub(super) kind: &'static str,
    pub(super) sink: String,
    /// The server as it may be shown (no password).
    pub(super) server: String,
}

/// The delivery thread (see the module header). Sends `()` on `done` as it ends.
pub(super) fn deliver(
    transport: Box<dyn Transport>,
    shared: &Shared,
    label: &Label,
    batch_size: usize,
    done: &crossbeam_channel::Sender<()>,
) {
    let mut link = Link {
        transport,
        shared,
        label,
        batch_size,
        connected: false,
        ever_connected: false,
        backoff: Backoff::default(),
        outage: None,
        refused_told: false,
    };
    link.transport.attach(&shared.wake);
    while let Some(until) = link.wait_for_work() {
        let failed = if link.connected {
            None
        } else {
            link.connect(until).err()
        };
        if let Some(error) = failed.or_else(|| link.send_batch(until)) {
            link.back_off(&error);
        }
    }
    if link.connected {
        link.transport.disconnect();
    }
    let _ = done.send(());
}

/// The delivery thread's connection to its server, and what it remembers between batches.
struct Link<'a> {
    transport: Box<dyn Transport>,
    shared: &'a Shared,
    label: &'a Label,
    batch_size: usize,
    connected: bool,
    ever_connected: bool,
    backoff: Backoff,
    /// Since when the server has been unreachable (until the next delivery).
    outage: Option<Instant>,
    /// Whether the first refused message was logged (the others are only counted).
    refused_told: bool,
}

impl Link<'_> {
    /// Waits for something to send; `None` at the end (out of time, or closing with nothing
    /// left), else the closing deadline, if any.
    fn wait_for_work(&mut self) -> Option<Option<Instant>> {
        let mut state = self.shared.lock();
        while !state.out_of_time() && !state.queue.has_unsent() {
            if state.closing.is_some() && state.queue.len() == 0 {
                break;
            }
            let until = state.closing;
            drop(state);
            self.transport.idle(&self.shared.wake, until);
            state = self.shared.lock();
        }
        if state.out_of_time() || !state.queue.has_unsent() {
            return None;
        }
        Some(state.closing)
    }

    fn connect(&mut self, until: Option<Instant>) -> Result<(), String> {
        self.transport.connect(until)?;
        self.connected = true;
        if !self.ever_connected {
            self.ever_connected = true;
            tracing::info!(
                sink = %self.label.sink,
                server = %self.label.server,
                backlog = self.shared.lock().queue.len(),
                "{} connected",
                self.label.kind
            );
        }
        Ok(())
    }

    /// Sends the next batch and takes what the server acknowledged off the queue; the error,
    /// if the server was not reached.
    fn send_batch(&mut self, until: Option<Instant>) -> Option<String> {
        let label = self.label;
        let batch = self.shared.lock().queue.take(self.batch_size);
        if batch.is_empty() {
            return None;
        }
        let sent = self.transport.send(&batch, until);
        let mut state = self.shared.lock();
        if state.stop {
            return None;
        }
        match sent {
            Ok(()) => {
                state.queue.ack(batch.len());
                self.backoff.reset();
                // The outage ends with the first delivery, not the first connect (a cluster
                // electing a leader accepts connections but not messages).
                if let Some(since) = self.outage.take() {
                    tracing::info!(
                        sink = %label.sink,
                        server = %label.server,
                        outage_s = since.elapsed().as_secs_f64(),
                        backlog = state.queue.len(),
                        "{} server reachable again; sending the backlog",
                        label.kind
                    );
                }
                None
            }
            Err(p) if p.refused => {
                state.queue.ack(p.acked);
                if let Some(m) = batch.get(p.acked) {
                    state.refused.add(&m.message);
                }
                state.queue.ack(1);
                state.queue.rewind();
                if !self.refused_told {
                    self.refused_told = true;
                    tracing::error!(
                        sink = %label.sink,
                        server = %label.server,
                        error = %p.error,
                        "{} server refused a message; it is lost", label.kind
                    );
                }
                None
            }
            Err(p) => {
                state.queue.ack(p.acked);
                state.queue.rewind();
                Some(p.error)
            }
        }
    }

    /// After a failed attempt: drops the connection, says the outage once, and waits out the
    /// backoff (or until the stop runs out of time).
    fn back_off(&mut self, error: &str) {
        let label = self.label;
        if self.connected {
            self.transport.disconnect();
            self.connected = false;
        }
        tracing::debug!(sink = %label.sink, error = %error, "attempt failed");
        if self.outage.is_none() {
            self.outage = Some(Instant::now());
            tracing::warn!(
                sink = %label.sink,
                server = %label.server,
                error = %error,
                "{} server unreachable; keeping a backlog and retrying",
                label.kind
            );
        }
        let retry_at = Instant::now() + self.backoff.next_delay();
        loop {
            let state = self.shared.lock();
            if state.out_of_time() || Instant::now() >= retry_at {
                break;
            }
            let until = state.closing.map_or(retry_at, |c| c.min(retry_at));
            drop(state);
            self.transport.idle(&self.shared.wake, Some(until));
        }
    }
}
