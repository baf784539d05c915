//! Sharing ready nodes out between the thread that freed them and the pool.
//!
//! A node that frees one successor runs it itself (inline continuation); a second one goes to
//! the pool as its own job. Three or more freed together become a [`Claims`] batch: at most one
//! pool job per worker is queued, and those jobs and this thread take the batch's nodes one by
//! one (an atomic cursor, relaxed: each index is taken by exactly one thread), so a wide fan-out
//! costs a few jobs, not one per node.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::Shared;

/// A frame being run, as claims see it: the executor's state, and how a thread runs one of
/// its nodes (and the successors that node frees). `run.rs`'s `Run`: given as a trait so that
/// sharing out nodes does not import running them (the two would import each other).
pub(super) trait Frames: Send + Sync + 'static {
    fn shared(&self) -> &Arc<Shared>;
    fn run_from(self: &Arc<Self>, node: usize);
}

/// Nodes of one frame that became ready together. Most nodes free one or two successors:
/// those are kept without allocating.
#[derive(Debug, Default)]
pub(super) struct Ready {
    first: Option<usize>,
    second: Option<usize>,
    rest: Vec<usize>,
}

impl Ready {
    pub(super) fn push(&mut self, node: usize) {
        if self.first.is_none() {
            self.first = Some(node);
        } else if self.second.is_none() {
            self.second = Some(node);
        } else {
            self.rest.push(node);
        }
    }

    fn into_vec(self) -> Vec<usize> {
        let mut all: Vec<usize> = self.first.into_iter().chain(self.second).collect();
        all.extend(self.rest);
        all
    }
}

/// Ready nodes shared by several threads, each claiming the next one until none is left.
#[derive(Debug)]
struct Claims<T> {
    run: Arc<T>,
    nodes: Vec<usize>,
    next: AtomicUsize,
}

impl<T: Frames> Claims<T> {
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&node) = self.nodes.get(i) else {
                return;
            };
            self.run.run_from(node);
        }
    }
}

/// Shares ready nodes out between this thread and the pool. Returns the node this thread
/// should run next, if it is not already working through a shared batch.
pub(super) fn spread<T: Frames>(run: &Arc<T>, ready: Ready) -> Option<usize> {
    if !run.shared().inline {
        hand_out(run, ready);
        return None;
    }
    if ready.rest.is_empty() {
        if let Some(second) = ready.second {
            dispatch(run.clone(), second);
        }
        return ready.first;
    }
    let nodes = ready.into_vec();
    let helpers = (nodes.len() - 1).min(run.shared().pool.size());
    let claims = Arc::new(Claims {
        run: run.clone(),
        nodes,
        next: AtomicUsize::new(0),
    });
    for _ in 0..helpers {
        dispatch_claims(claims.clone());
    }
    claims.work();
    None
}

/// Gives every ready node to the pool (this thread keeps none).
pub(super) fn hand_out<T: Frames>(run: &Arc<T>, ready: Ready) {
    if !run.shared().inline || ready.rest.is_empty() {
        for node in ready.into_vec() {
            dispatch(run.clone(), node);
        }
        return;
    }
    let nodes = ready.into_vec();
    let helpers = nodes.len().min(run.shared().pool.size());
    let claims = Arc::new(Claims {
        run: run.clone(),
        nodes,
        next: AtomicUsize::new(0),
    });
    for _ in 0..helpers {
        dispatch_claims(claims.clone());
    }
}

/// Queues `node` of `run` on the pool (runs it here if there is no pool).
pub(super) fn dispatch<T: Frames>(run: Arc<T>, node: usize) {
    let shared = run.shared().clone();
    match shared.pool.get(&shared.metrics) {
        Some(pool) => {
            pool.execute(Box::new(move || run.run_from(node)));
        }
        None => run.run_from(node),
    }
}

fn dispatch_claims<T: Frames>(claims: Arc<Claims<T>>) {
    let shared = claims.run.shared().clone();
    match shared.pool.get(&shared.metrics) {
        Some(pool) => {
            pool.execute(Box::new(move || claims.work()));
        }
        None => claims.work(),
    }
}
