//! The `vidflow-notify` thread's loop and state (see the module above for what it sends and
//! when): it wakes for an event or at the next thing due, looks at [`Live`] once per wake-up,
//! and sends what the rules say. Its clock is passed in (`now`), so that its tests step it
//! without sleeping.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::rules::{self, Rates, SourceView};
use super::socket::Datagrams;
use super::{Event, MIN_CHECK_PERIOD, NotifyConfig, READY_POLL};
use crate::daemon::Live;
use crate::daemon::live::Phase;

/// The notify thread's state. Only that thread touches it.
#[derive(Debug)]
pub(super) struct Reporter {
    datagrams: Datagrams,
    live: Arc<Live>,
    /// Half of the watchdog timeout (at least [`MIN_CHECK_PERIOD`]); `None`: no watchdog.
    check_every: Option<Duration>,
    status_every: Duration,
    ready_sent: bool,
    stopping_sent: bool,
    /// Frames delivered when the last ping was sent.
    delivered_at_ping: u64,
    next_check: Instant,
    next_status: Instant,
    rates: Rates,
}

impl Reporter {
    pub(super) fn new(datagrams: Datagrams, live: Arc<Live>, config: &NotifyConfig) -> Self {
        let now = Instant::now();
        Self {
            datagrams,
            live,
            check_every: config.watchdog.map(|t| (t / 2).max(MIN_CHECK_PERIOD)),
            status_every: config.status_every.max(MIN_CHECK_PERIOD),
            ready_sent: false,
            stopping_sent: false,
            delivered_at_ping: 0,
            next_check: now,
            next_status: now,
            rates: Rates::default(),
        }
    }

    /// Until the channel disconnects (the run's [`super::Notifier`] stopped).
    pub(super) fn run(mut self, events: &Receiver<Event>) {
        loop {
            match events.recv_deadline(self.next_wake(Instant::now())) {
                Ok(event) => self.handle(event),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.stopping();
                    return;
                }
            }
            self.tick(Instant::now());
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Stopping => self.stopping(),
            Event::Reloading { monotonic_usec } => self
                .datagrams
                .send(&format!("RELOADING=1\nMONOTONIC_USEC={monotonic_usec}")),
            // Before the first READY=1, the rule still decides when that one goes.
            Event::Ready if self.ready_sent && !self.stopping_sent => {
                self.datagrams.send("READY=1");
            }
            Event::Ready => {}
        }
    }

    /// When something is due: the readiness poll before `READY=1`, then the next status and
    /// (until `STOPPING=1`) the next watchdog check.
    fn next_wake(&self, now: Instant) -> Instant {
        if !self.ready_sent && !self.stopping_sent {
            return now + READY_POLL;
        }
        match self.check_every {
            Some(_) if !self.stopping_sent => self.next_check.min(self.next_status),
            _ => self.next_status,
        }
    }

    fn stopping(&mut self) {
        if !self.stopping_sent {
            self.stopping_sent = true;
            self.datagrams.send("STOPPING=1");
        }
    }

    /// Looks at the run once: readiness, the watchdog, the status, whichever is due.
    fn tick(&mut self, now: Instant) {
        let phase = self.live.phase();
        if phase == Phase::Draining {
            self.stopping();
        }
        let parts = self.live.parts();
        let sources: Vec<SourceView> = parts.sources.iter().map(SourceView::of).collect();
        if !self.ready_sent {
            if self.stopping_sent || phase != Phase::Running || !rules::ready(&sources) {
                return;
            }
            self.ready_sent = true;
            self.datagrams.send("READY=1");
            self.next_check = now + self.check_every.unwrap_or_default();
            self.next_status = now;
        }
        if let Some(every) = self.check_every
            && !self.stopping_sent
            && now >= self.next_check
        {
            let delivered = self.live.delivered().0;
            if rules::earned_ping(delivered > self.delivered_at_ping, &sources) {
                self.datagrams.send("WATCHDOG=1");
                self.delivered_at_ping = delivered;
            }
            self.next_check = now + every;
        }
        if now >= self.next_status {
            let fps = self.rates.sample(now, &sources);
            let phase = if self.stopping_sent {
                Phase::Draining
            } else {
                phase
            };
            let text = rules::status(phase, &sources, &fps);
            self.datagrams.send(&format!("STATUS={text}"));
            self.next_status = now + self.status_every;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;
    use crate::daemon::live::{LiveSource, Parts};
    use crate::daemon::notify::NotifySocket;
    use crate::source::SourceCounters;

    const SECOND: Duration = Duration::from_secs(1);

    /// A reporter on a run with `sources` (each a file that has not given a frame, or none),
    /// a watchdog of 1 s (a check every 0.5 s) and a status every 10 s, and systemd's end.
    fn reporter(sources: usize) -> (Reporter, Arc<Live>, UnixDatagram, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let systemd = UnixDatagram::bind(&path).unwrap();
        systemd.set_nonblocking(true).unwrap();
        let live = Arc::new(Live::new());
        live.set_parts(Parts {
            sources: (0..sources)
                .map(|i| LiveSource {
                    name: format!("clip{i}").into(),
                    live: false,
                    file: true,
                    counters: Arc::new(SourceCounters::default()),
                    record: None,
                    stall_timeout: SECOND,
                })
                .collect(),
            ..Parts::default()
        });
        live.set_phase(Phase::Running);
        let config = NotifyConfig {
            socket: None,
            watchdog: Some(SECOND),
            status_every: 10 * SECOND,
        };
        let datagrams = Datagrams::open(NotifySocket::Path(path)).unwrap();
        let reporter = Reporter::new(datagrams, live.clone(), &config);
        (reporter, live, systemd, dir)
    }

    /// What systemd received since the last call.
    fn received(systemd: &UnixDatagram) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 512];
        while let Ok(n) = systemd.recv(&mut buf) {
            out.push(String::from_utf8(buf[..n].to_vec()).unwrap());
        }
        out
    }

    /// Brings a reporter on a run with no source past `READY=1` at the time it returns.
    fn past_ready(reporter: &mut Reporter, systemd: &UnixDatagram) -> Instant {
        let t0 = Instant::now();
        reporter.tick(t0);
        assert_eq!(received(systemd), ["READY=1", "STATUS="]);
        t0
    }

    #[test]
    fn nothing_is_said_before_every_source_settled() {
        let (mut reporter, _live, systemd, _dir) = reporter(1);
        let t0 = Instant::now();
        for i in 0..5 {
            reporter.tick(t0 + i * SECOND);
        }
        assert_eq!(received(&systemd), Vec::<String>::new());
    }

    #[test]
    fn pings_follow_frames_delivered_not_the_clock() {
        let (mut reporter, live, systemd, _dir) = reporter(0);
        let t0 = past_ready(&mut reporter, &systemd);
        // Half a second later, nothing delivered: no ping.
        reporter.tick(t0 + SECOND / 2);
        assert_eq!(received(&systemd), Vec::<String>::new());
        live.count_delivered(false);
        reporter.tick(t0 + SECOND);
        assert_eq!(received(&systemd), ["WATCHDOG=1"]);
        // The same count again, however late: no ping.
        reporter.tick(t0 + 2 * SECOND);
        reporter.tick(t0 + 3 * SECOND);
        assert_eq!(received(&systemd), Vec::<String>::new());
        // A failed frame is still a frame through the workflow.
        live.count_delivered(true);
        reporter.tick(t0 + 4 * SECOND);
        assert_eq!(received(&systemd), ["WATCHDOG=1"]);
    }

    #[test]
    fn a_check_comes_every_half_watchdog_and_no_sooner() {
        let (mut reporter, live, systemd, _dir) = reporter(0);
        let t0 = past_ready(&mut reporter, &systemd);
        live.count_delivered(false);
        // Not due yet: the frame is kept for the check.
        reporter.tick(t0 + SECOND / 4);
        assert_eq!(received(&systemd), Vec::<String>::new());
        reporter.tick(t0 + SECOND / 2);
        assert_eq!(received(&systemd), ["WATCHDOG=1"]);
    }

    #[test]
    fn a_drain_says_stopping_once_and_pings_no_more() {
        let (mut reporter, live, systemd, _dir) = reporter(0);
        let t0 = past_ready(&mut reporter, &systemd);
        // Every source ended: the run drains by itself, and frames still complete.
        live.set_phase(Phase::Draining);
        live.count_delivered(false);
        reporter.tick(t0 + SECOND);
        reporter.handle(Event::Stopping);
        live.count_delivered(false);
        reporter.tick(t0 + 2 * SECOND);
        reporter.tick(t0 + 10 * SECOND);
        assert_eq!(
            received(&systemd),
            ["STOPPING=1", "STATUS=draining: "],
            "no ping while draining, one STOPPING=1"
        );
        // Not ready again after a stop either.
        reporter.handle(Event::Ready);
        assert_eq!(received(&systemd), Vec::<String>::new());
    }

    #[test]
    fn a_stop_request_before_readiness_never_says_ready() {
        let (mut reporter, live, systemd, _dir) = reporter(1);
        let t0 = Instant::now();
        reporter.tick(t0);
        reporter.handle(Event::Stopping);
        live.set_phase(Phase::Draining);
        reporter.tick(t0 + SECOND);
        assert_eq!(received(&systemd), ["STOPPING=1"]);
    }

    #[test]
    fn a_reload_says_reloading_then_ready() {
        let (mut reporter, live, systemd, _dir) = reporter(0);
        // Before the first READY=1, the reload's end does not make the run ready.
        live.set_phase(Phase::Reloading);
        reporter.handle(Event::Reloading { monotonic_usec: 7 });
        reporter.handle(Event::Ready);
        let t0 = Instant::now();
        reporter.tick(t0);
        assert_eq!(received(&systemd), ["RELOADING=1\nMONOTONIC_USEC=7"]);
        live.set_phase(Phase::Running);
        reporter.tick(t0 + SECOND / 10);
        assert_eq!(received(&systemd), ["READY=1", "STATUS="]);

        live.set_phase(Phase::Reloading);
        reporter.handle(Event::Reloading { monotonic_usec: 12 });
        live.set_phase(Phase::Running);
        reporter.handle(Event::Ready);
        assert_eq!(
            received(&systemd),
            ["RELOADING=1\nMONOTONIC_USEC=12", "READY=1"]
        );
    }

    #[test]
    fn the_thread_sleeps_until_something_is_due() {
        let (mut reporter, _live, systemd, _dir) = reporter(0);
        let t0 = Instant::now();
        assert_eq!(reporter.next_wake(t0), t0 + READY_POLL);
        reporter.tick(t0);
        received(&systemd);
        // Ready: the next watchdog check (the status is 10 s away).
        assert_eq!(reporter.next_wake(t0), t0 + SECOND / 2);
        reporter.handle(Event::Stopping);
        // Stopping: only the status is left to send.
        assert_eq!(reporter.next_wake(t0), t0 + 10 * SECOND);
    }
}
