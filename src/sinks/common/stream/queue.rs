//! The outbox of a stream sink: one queue, oldest first, made of the disk spool (older) and the
//! memory backlog (newer), with the messages handed to the transport (in flight) as a prefix of
//! it. A message leaves only when acknowledged; on a failure the prefix is handed out again.
//!
//! No thread of its own: held under [`super::deliver::Shared`]'s lock, pushed to by the sink's
//! thread, taken from and acknowledged by the delivery thread.
//!
//! Bounds: the memory backlog holds `capacity` messages; past that its oldest goes to the spool
//! (in order: everything spooled is older than everything in memory); a spool past its size
//! drops its oldest segment. Without a spool the memory backlog drops its oldest. Whatever is
//! dropped is counted and named.

use std::collections::VecDeque;

use super::Outgoing;
use super::spool::Spool;
use crate::sinks::common::net::Lost;

#[derive(Debug)]
pub(super) struct Queue {
    /// The newest messages, oldest first; the first `mem_sent` are in flight.
    memory: VecDeque<Outgoing>,
    capacity: usize,
    spool: Option<Spool>,
    mem_sent: usize,
    /// In-flight messages dropped since they were handed out (always the oldest of them): the
    /// acknowledgements of that many are skipped.
    gone_in_flight: usize,
    /// Dropped because memory and spool were full.
    pub(super) overflow: Lost,
    /// Could not be written to the spool (a disk error).
    pub(super) spool_failed: Lost,
    spool_error_told: bool,
}

impl Queue {
    pub(super) fn new(capacity: usize, spool: Option<Spool>) -> Self {
        Self {
            memory: VecDeque::new(),
            capacity,
            spool,
            mem_sent: 0,
            gone_in_flight: 0,
            overflow: Lost::default(),
            spool_failed: Lost::default(),
            spool_error_told: false,
        }
    }

    /// Messages not acknowledged yet (in flight or waiting).
    pub(super) fn len(&self) -> u64 {
        self.spool.as_ref().map_or(0, Spool::len) + self.memory.len() as u64
    }

    /// Messages spooled on disk (not acknowledged).
    #[cfg(test)]
    pub(super) fn spooled(&self) -> u64 {
        self.spool.as_ref().map_or(0, Spool::len)
    }

    /// Whether some message waits to be handed out.
    pub(super) fn has_unsent(&self) -> bool {
        self.spool.as_ref().is_some_and(|s| s.unread() > 0) || self.mem_sent < self.memory.len()
    }

    fn spool_error(&mut self, e: &super::spool::SpoolError) {
        if !self.spool_error_told {
            self.spool_error_told = true;
            tracing::error!(error = %e, "stream sink spool failed; messages are lost");
        }
    }

    /// Queues a message; a full memory backlog sends its oldest to the spool (or drops it).
    pub(super) fn push(&mut self, m: Outgoing) {
        self.memory.push_back(m);
        while self.memory.len() > self.capacity {
            let Some(old) = self.memory.pop_front() else {
                break;
            };
            let in_flight = self.mem_sent > 0;
            if in_flight {
                self.mem_sent -= 1;
            }
            let Some(spool) = self.spool.as_mut() else {
                if self.overflow.count == 0 {
                    tracing::warn!(
                        capacity = self.capacity,
                        "stream sink backlog full and no spool; dropping the oldest messages"
                    );
                }
                self.overflow.add(&old.message);
                self.gone_in_flight += usize::from(in_flight);
                continue;
            };
            match spool.append(&old, in_flight) {
                Ok((lost, gone)) => {
                    if lost.count > 0 && self.overflow.count == 0 {
                        tracing::warn!("stream sink spool full; dropping its oldest messages");
                    }
                    self.overflow.merge(lost);
                    self.gone_in_flight += gone;
                }
                Err(e) => {
                    self.spool_error(&e);
                    self.spool_failed.add(&old.message);
                    self.gone_in_flight += usize::from(in_flight);
                }
            }
        }
    }

    /// Hands out up to `max` messages, oldest first, after those already in flight.
    pub(super) fn take(&mut self, max: usize) -> Vec<Outgoing> {
        let mut out = Vec::new();
        while out.len() < max {
            if let Some(spool) = self.spool.as_mut()
                && spool.unread() > 0
            {
                match spool.read_next() {
                    Ok(Some(m)) => {
                        out.push(m);
                        continue;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.spool_error(&e);
                        break;
                    }
                }
            }
            match self.memory.get(self.mem_sent) {
                Some(m) => {
                    out.push(m.clone());
                    self.mem_sent += 1;
                }
                None => break,
            }
        }
        out
    }

    /// The oldest `n` messages in flight were acknowledged (or refused for good).
    pub(super) fn ack(&mut self, n: usize) {
        let skip = n.min(self.gone_in_flight);
        self.gone_in_flight -= skip;
        for _ in skip..n {
            if let Some(spool) = self.spool.as_mut()
                && spool.pending() > 0
            {
                if let Err(e) = spool.commit_one() {
                    self.spool_error(&e);
                }
                continue;
            }
            if self.mem_sent > 0 {
                self.memory.pop_front();
                self.mem_sent -= 1;
            }
        }
    }

    /// Nothing is in flight any more: the next `take` starts again at the oldest message.
    pub(super) fn rewind(&mut self) {
        if let Some(s) = self.spool.as_mut() {
            s.rewind();
        }
        self.mem_sent = 0;
        self.gone_in_flight = 0;
    }

    /// Ends the queue at a stop: what is left goes to the spool (kept for the next run), or
    /// without one is lost.
    pub(super) fn close(mut self) -> Closed {
        self.rewind();
        let mut at_stop = Lost::default();
        let mut kept = 0;
        match self.spool.take() {
            None => {
                for m in &self.memory {
                    at_stop.add(&m.message);
                }
            }
            Some(mut spool) => {
                for m in std::mem::take(&mut self.memory) {
                    match spool.append(&m, false) {
                        Ok((dropped, _)) => self.overflow.merge(dropped),
                        Err(e) => {
                            self.spool_error(&e);
                            self.spool_failed.add(&m.message);
                        }
                    }
                }
                kept = spool.len();
                if let Err(e) = spool.close() {
                    self.spool_error(&e);
                }
            }
        }
        Closed {
            kept,
            at_stop,
            overflow: self.overflow,
            spool_failed: self.spool_failed,
        }
    }
}

/// What a queue left at a stop.
#[derive(Debug)]
pub(super) struct Closed {
    /// Messages in the spool, for the next run.
    pub(super) kept: u64,
    /// Left in memory without a spool.
    pub(super) at_stop: Lost,
    pub(super) overflow: Lost,
    pub(super) spool_failed: Lost,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sinks::common::net::Message;

    fn msg(frame: u64) -> Outgoing {
        let id = format!("h:cam:r:{frame}");
        let body = format!(r#"{{"id":"{id}","source":"cam","frame":{frame}}}"#);
        Outgoing {
            id: id.into(),
            message: Message {
                source: Arc::from("cam"),
                frame,
                body: body.into_bytes(),
            },
        }
    }

    fn frames(batch: &[Outgoing]) -> Vec<u64> {
        batch.iter().map(|m| m.message.frame).collect()
    }

    fn spooled_queue(capacity: usize) -> (tempfile::TempDir, Queue) {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        (dir, Queue::new(capacity, Some(spool)))
    }

    #[test]
    fn spooled_messages_go_first_then_memory_in_order() {
        let (_dir, mut q) = spooled_queue(3);
        for f in 0..10 {
            q.push(msg(f));
        }
        assert_eq!(q.spooled(), 7);
        assert_eq!(frames(&q.take(4)), [0, 1, 2, 3]);
        q.ack(2);
        // A failure: the two still in flight are handed out again.
        q.rewind();
        assert_eq!(frames(&q.take(100)), (2..10).collect::<Vec<_>>());
        q.ack(8);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_message_in_flight_that_moves_to_the_spool_is_acknowledged_there() {
        let (_dir, mut q) = spooled_queue(2);
        q.push(msg(0));
        q.push(msg(1));
        assert_eq!(frames(&q.take(2)), [0, 1]);
        // Frame 0, in flight, goes to the spool; nothing is handed out twice.
        q.push(msg(2));
        assert_eq!(frames(&q.take(10)), [2]);
        q.ack(3);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn without_a_spool_the_oldest_is_dropped_even_in_flight() {
        let mut q = Queue::new(2, None);
        q.push(msg(0));
        q.push(msg(1));
        assert_eq!(frames(&q.take(2)), [0, 1]);
        q.push(msg(2));
        assert_eq!(q.overflow.count, 1);
        // The acknowledgement of frame 0 (dropped) pops nothing it should not.
        q.ack(1);
        assert_eq!(frames(&q.take(10)), [2]);
        q.ack(2);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn what_is_left_at_a_stop_is_kept_in_the_spool_for_the_next_run() {
        let (dir, mut q) = spooled_queue(4);
        for f in 0..6 {
            q.push(msg(f));
        }
        q.take(3);
        q.ack(1);
        let closed = q.close();
        assert_eq!((closed.kept, closed.at_stop.count), (5, 0));
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let mut q = Queue::new(4, Some(spool));
        assert_eq!(frames(&q.take(10)), [1, 2, 3, 4, 5]);
    }
}
