//! The planner thread: a [`PolicyHost`] off the serving thread, behind a channel.
//!
//! Controllers [`submit`](Planner::submit) a request per cycle and poll
//! [`try_result`](Planner::try_result); they never block on it. In a real deployment each rank
//! process has its own planner; ranks that share a process may share one, since every rank
//! submits the same request (the policies are deterministic). A policy error or panic becomes an
//! error outcome: logged, counted, and the placement stays as it was. The controller
//! [`settle`](Planner::settle)s each cycle as the host's docs say.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A message to the planner thread.
#[derive(Debug)]
enum Msg {
    Plan(Box<PlanRequest>),
    Settle {
        cycle: u64,
        taken: bool,
        resync: bool,
    },
}

use eplb_core::Shape;
use eplb_core::time::gate::Gate;
use eplb_policies::Policy;

use super::{Outcome, PlanFailure, PlanRequest, PolicyHost};

#[derive(Debug, Default)]
struct Shared {
    submitted: BTreeMap<u64, u64>,
    results: BTreeMap<u64, Arc<Outcome>>,
    failures: u64,
    first_failure: Option<(u64, PlanFailure)>,
}

/// Statistics of a planner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlannerStats {
    /// Requests computed.
    pub plans: u64,
    /// Requests that ended in a policy error or panic.
    pub failures: u64,
}

/// A planner thread and its mailbox.
#[derive(Debug)]
pub struct Planner {
    tx: Option<Sender<Msg>>,
    shared: Arc<(Mutex<Shared>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Planner {
    /// Starts the planner thread for `policy` on `shape`; scratch and state are allocated here,
    /// once.
    pub fn spawn(policy: Box<dyn Policy + Send>, shape: Shape) -> Self {
        Self::with_gate(policy, shape, None)
    }

    /// [`Planner::spawn`] with the pay-off gate applied to every plan when `gate` is `Some`
    /// ([`PolicyHost::set_gate`]).
    pub fn with_gate(policy: Box<dyn Policy + Send>, shape: Shape, gate: Option<Gate>) -> Self {
        let (tx, rx) = channel::<Msg>();
        let shared = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
        let worker_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("eplb-planner".into())
            .spawn(move || run(policy, shape, gate, rx, worker_shared))
            .ok();
        Self {
            tx: Some(tx),
            shared,
            thread,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Submits a request. A second request for the same cycle is ignored (ranks sharing a
    /// planner all submit), but a different request under the same cycle number is an error
    /// outcome (ranks would have diverged).
    pub fn submit(&self, req: PlanRequest) {
        let fp = fingerprint(&req);
        {
            let mut sh = self.lock();
            if let Some(&prev) = sh.submitted.get(&req.cycle) {
                if prev != fp {
                    sh.results.insert(
                        req.cycle,
                        Arc::new(Err(PlanFailure::Diverged { cycle: req.cycle })),
                    );
                    sh.failures += 1;
                    self.shared.1.notify_all();
                }
                return;
            }
            sh.submitted.insert(req.cycle, fp);
            // Keep a short history only.
            let keep_from = req.cycle.saturating_sub(4);
            sh.submitted.retain(|&c, _| c >= keep_from);
            sh.results.retain(|&c, _| c >= keep_from);
        }
        let cycle = req.cycle;
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send(Msg::Plan(Box::new(req))).is_ok());
        if !sent {
            let mut sh = self.lock();
            sh.results
                .insert(cycle, Arc::new(Err(PlanFailure::PlannerGone)));
            sh.failures += 1;
            self.shared.1.notify_all();
        }
    }

    /// Every rank took `cycle` (`taken`) or abandoned it: the policy state advances to the one
    /// after the cycle, or stays the one before it; with `resync` (the ranks held different
    /// plans) it restarts from the policy's initial state. Repeats (ranks sharing a planner) are
    /// ignored.
    pub fn settle(&self, cycle: u64, taken: bool, resync: bool) {
        if let Some(tx) = self.tx.as_ref() {
            let _ = tx.send(Msg::Settle {
                cycle,
                taken,
                resync,
            });
        }
    }

    /// The outcome of `cycle`, if it is ready.
    pub fn try_result(&self, cycle: u64) -> Option<Arc<Outcome>> {
        self.lock().results.get(&cycle).cloned()
    }

    /// Blocks until the outcome of `cycle` is ready, for tests and tools (a serving thread polls
    /// [`Planner::try_result`]). Gives up after `timeout`.
    pub fn wait_result(&self, cycle: u64, timeout: Duration) -> Option<Arc<Outcome>> {
        // `None`: the deadline is past what `Instant` can hold, so wait without one.
        let deadline = Instant::now().checked_add(timeout);
        let mut sh = self.lock();
        loop {
            if let Some(r) = sh.results.get(&cycle) {
                return Some(Arc::clone(r));
            }
            let now = Instant::now();
            let left = match deadline {
                Some(d) if now >= d => return None,
                Some(d) => d - now,
                None => timeout,
            };
            sh = self
                .shared
                .1
                .wait_timeout(sh, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The first policy failure (error or panic) of this planner, with its cycle.
    pub fn first_failure(&self) -> Option<(u64, PlanFailure)> {
        self.lock().first_failure.clone()
    }

    /// Plans computed and failures so far.
    pub fn stats(&self) -> PlannerStats {
        let sh = self.lock();
        PlannerStats {
            plans: sh.submitted.len() as u64,
            failures: sh.failures,
        }
    }
}

impl Drop for Planner {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            // The thread ends when the channel closes; a panic there was already reported.
            let _ = t.join();
        }
    }
}

fn fingerprint(req: &PlanRequest) -> u64 {
    let mut h = eplb_core::Fnv1a::new();
    h.words(req.current.iter().map(|&v| u64::from(v)));
    h.words(req.loads.iter().map(|v| v.to_bits()));
    if let Some((t, s)) = &req.samples {
        h.word(*t as u64);
        h.words(s.iter().map(|v| v.to_bits()));
    }
    h.word(req.seed);
    // Every rank live hashes as 0, as before membership changes existed.
    h.word(if req.live.is_all() {
        0
    } else {
        req.live.digest()
    });
    h.finish()
}

fn run(
    policy: Box<dyn Policy + Send>,
    shape: Shape,
    gate: Option<Gate>,
    rx: Receiver<Msg>,
    shared: Arc<(Mutex<Shared>, Condvar)>,
) {
    let mut host = PolicyHost::new(policy, shape);
    host.set_gate(gate);
    while let Ok(msg) = rx.recv() {
        let req = match msg {
            Msg::Settle {
                cycle,
                taken,
                resync,
            } => {
                host.settle(cycle, taken, resync);
                continue;
            }
            Msg::Plan(req) => req,
        };
        let cycle = req.cycle;
        let outcome = host.plan_request(&req);
        if let Err(e) = &outcome {
            log::error!("eplb planner: cycle {cycle}: {e}; the placement stays as it is");
        }
        let (lock, cv) = &*shared;
        let mut sh = lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = &outcome {
            sh.failures += 1;
            if sh.first_failure.is_none() {
                sh.first_failure = Some((cycle, e.clone()));
            }
        }
        sh.results.insert(cycle, Arc::new(outcome));
        cv.notify_all();
    }
}

/// Runs `policy` once on a request, outside any thread, and takes the cycle (one-shot callers:
/// `eplb plan`, tests).
pub fn plan_once<P: Policy + ?Sized>(host: &mut PolicyHost<P>, req: &PlanRequest) -> Outcome {
    host.plan_request_and_take(req)
}
