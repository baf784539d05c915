//! Basic credentials checked against an Argon2 password off the event loop: one thread,
//! `vidflow-http-auth`, started only when `basic_password_hash` is set.
//!
//! The loop hands it a request whose credentials it cannot judge at once (`access.rs`): the
//! connection leaves the loop's table with its parsed head, through a channel of [`QUEUE`]
//! requests. Past that the loop answers 503 at once: a client trying passwords fills the queue,
//! costs this thread, and never the loop, so `/healthz` and every client whose credentials
//! passed before are answered meanwhile. The thread checks (tens of milliseconds, see
//! `spec::PasswordHash`), then answers on the connection itself: 401, or what the loop would
//! have answered (a page, `/metrics`, or a preview handed to its own thread), written in
//! blocking mode within [`WRITE_TIMEOUT`].
//!
//! Stop protocol (`workers.rs`): its [`Workers`] is dropped after the loop is joined: it drops
//! the stop channel's sender, which wakes the thread; a check in progress finishes first (one check:
//! tens of milliseconds), requests still queued are closed unanswered, and it is joined.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, select};

use super::access::Credentials;
use super::head::Head;
use super::workers::Workers;
use super::{Reply, Shared};

/// Requests waiting for a check: a few browsers logging in at once. A client that sends more
/// (guessing passwords) gets 503 for the rest, at once.
pub(super) const QUEUE: usize = 8;
/// How long writing an answer may take: most fit the socket's buffer at once; a client that
/// does not read a big one holds this thread no longer than this.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// A request waiting for its credentials' check.
#[derive(Debug)]
pub(super) struct Job {
    pub stream: TcpStream,
    pub head: Head,
    pub credentials: Credentials,
}

/// The queue the loop hands requests to, and the thread's end of it.
pub(super) fn queue() -> (Sender<Job>, Receiver<Job>) {
    bounded(QUEUE)
}

/// Starts the thread on `jobs`; dropping the result stops and joins it.
pub(super) fn start(jobs: Receiver<Job>, shared: Arc<Shared>) -> std::io::Result<Workers> {
    Workers::start("vidflow-http-auth", 1, move |stopped| {
        run(&jobs, stopped, &shared);
    })
}

/// Hands `job` to the thread; gives it back when the queue is full (or the thread gone).
pub(super) fn submit(shared: &Shared, job: Job) -> Result<(), Box<Job>> {
    let Some(jobs) = &shared.verify else {
        return Err(Box::new(job));
    };
    jobs.try_send(job).map_err(|e| match e {
        TrySendError::Full(job) | TrySendError::Disconnected(job) => Box::new(job),
    })
}

fn run(jobs: &Receiver<Job>, stopped: &Receiver<()>, shared: &Arc<Shared>) {
    loop {
        select! {
            recv(jobs) -> job => match job {
                Ok(job) if !shared.stop.load(Ordering::Acquire) => serve(job, shared),
                Ok(_) => {}
                Err(_) => return,
            },
            // Only ever disconnected, by the Verifier's drop.
            recv(stopped) -> _ => return,
        }
    }
}

/// Checks a request's credentials and answers it.
fn serve(job: Job, shared: &Arc<Shared>) {
    let Job {
        stream,
        head,
        credentials,
    } = job;
    let reply = if shared.access.verify(&credentials) {
        super::authorized(&head, shared)
    } else {
        Reply::Now(super::unauthorized(&shared.access))
    };
    match reply {
        handed @ (Reply::Preview(_) | Reply::Api(_) | Reply::Live(..) | Reply::Video(..)) => {
            super::hand_off(handed, stream, shared);
        }
        Reply::Now(bytes) => {
            if let Err(e) = write_all(stream, &bytes) {
                tracing::debug!(error = %e, "http: answer after the credentials check not sent");
            }
        }
        // `authorized` judges no credentials.
        Reply::Verify(_) => {}
    }
}

fn write_all(mut stream: TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    stream.write_all(bytes)?;
    stream.shutdown(Shutdown::Write)
}
