//! The planner thread: runs the policy off the serving thread, with scratch and state allocated
//! once.
//!
//! Controllers [`submit`](Planner::submit) a request per cycle and poll
//! [`try_result`](Planner::try_result); they never block on it. In a real deployment each rank
//! process has its own planner; ranks that share a process may share one, since every rank
//! submits the same request (the policies are deterministic). A policy error or panic becomes an
//! error outcome: logged, counted, and the placement stays as it was.
//!
//! **Policy state advances only for cycles every rank took.** A stateful policy (FlashLB's ring
//! and thresholds, the incremental policy's history) plans each cycle on a copy of its state.
//! When the ranks have agreed on the cycle's plan digest, the controller
//! [`settle`](Planner::settle)s it: taken, the copy becomes the state; abandoned (a failed plan
//! or a digest mismatch anywhere, a failed collective), the copy is dropped and the next cycle
//! plans from the state before it, on every rank alike. A panic also drops the copy. When the
//! ranks held different plans (a digest mismatch: their states may already differ) every rank
//! restarts the policy from its initial state, so they agree again from the next cycle on.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A message to the planner thread.
#[derive(Debug)]
enum Msg {
    Plan(PlanRequest),
    Settle {
        cycle: u64,
        taken: bool,
        resync: bool,
    },
}

use eplb_core::{Placement, Shape};
use eplb_policies::{Input, Output, Policy, Samples, Summary, buffer_lens, rebalance};

/// What the planner is asked for one cycle.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// The cycle number (every rank counts cycles alike).
    pub cycle: u64,
    /// The live placement the heat was measured on, `[L][R][S]`.
    pub current: Vec<u16>,
    /// Logical loads `[L][N]`, summed over the heat interval.
    pub loads: Vec<f64>,
    /// Per-window logical loads `(T, [T][L][N])`, oldest first.
    pub samples: Option<(usize, Vec<f64>)>,
    /// Seed for randomised policies.
    pub seed: u64,
}

/// A computed plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The cycle it answers.
    pub cycle: u64,
    /// The new placement `[L][R][S]`.
    pub placement: Vec<u16>,
    /// Per layer: changed.
    pub changed: Vec<bool>,
    /// Per layer PAR before (even split).
    pub par_before: Vec<f64>,
    /// Per layer PAR after (even split).
    pub par_after: Vec<f64>,
    /// Totals.
    pub summary: Summary,
    /// Wall time of the policy call alone.
    pub elapsed: Duration,
}

/// The outcome of one request.
pub type Outcome = Result<Plan, String>;

#[derive(Debug, Default)]
struct Shared {
    submitted: BTreeMap<u64, u64>,
    results: BTreeMap<u64, Arc<Outcome>>,
    failures: u64,
    first_failure: Option<String>,
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
        let (tx, rx) = channel::<Msg>();
        let shared = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
        let worker_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("eplb-planner".into())
            .spawn(move || run(policy, shape, rx, worker_shared))
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
                        Arc::new(Err(format!(
                            "cycle {}: ranks submitted different heat or placements",
                            req.cycle
                        ))),
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
            .is_some_and(|tx| tx.send(Msg::Plan(req)).is_ok());
        if !sent {
            let mut sh = self.lock();
            sh.results
                .insert(cycle, Arc::new(Err("the planner thread is gone".into())));
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
    pub fn first_failure(&self) -> Option<String> {
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
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        h ^= x;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    req.current.iter().for_each(|&v| eat(u64::from(v)));
    req.loads.iter().for_each(|v| eat(v.to_bits()));
    if let Some((t, s)) = &req.samples {
        eat(*t as u64);
        s.iter().for_each(|v| eat(v.to_bits()));
    }
    eat(req.seed);
    h
}

fn run(
    mut policy: Box<dyn Policy + Send>,
    shape: Shape,
    rx: Receiver<Msg>,
    shared: Arc<(Mutex<Shared>, Condvar)>,
) {
    // A shape the policy cannot serve (or whose buffers are over the limit) allocates nothing;
    // every request is answered with the reason.
    let lens = buffer_lens(policy.as_ref(), &shape).map_err(|e| e.to_string());
    let (mut scratch, mut state) = match &lens {
        Ok(l) => (vec![0u64; l.scratch], vec![0u64; l.state]),
        Err(_) => (Vec::new(), Vec::new()),
    };
    // `state`: after the last cycle every rank took; `working`: after the cycle planned last,
    // `pending` names that cycle until it is settled.
    let mut working = state.clone();
    let mut pending: Option<u64> = None;
    while let Ok(msg) = rx.recv() {
        let req = match msg {
            Msg::Settle {
                cycle,
                taken,
                resync,
            } => {
                if pending == Some(cycle) {
                    pending = None;
                    if taken {
                        core::mem::swap(&mut state, &mut working);
                    } else if resync {
                        state.fill(0);
                    }
                }
                continue;
            }
            Msg::Plan(req) => req,
        };
        let cycle = req.cycle;
        working.copy_from_slice(&state);
        pending = Some(cycle);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if let Err(e) = &lens {
                return Err(e.clone());
            }
            plan_once(policy.as_mut(), &shape, &req, &mut scratch, &mut working)
        }))
        .unwrap_or_else(|panic| {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // The policy's working state may be half-written: it is dropped (the cycle cannot be
            // taken, since this rank's plan failed).
            Err(format!("policy panicked: {msg}"))
        });
        if let Err(e) = &outcome {
            log::error!("eplb planner: cycle {cycle}: {e}; the placement stays as it is");
        }
        let (lock, cv) = &*shared;
        let mut sh = lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = &outcome {
            sh.failures += 1;
            if sh.first_failure.is_none() {
                sh.first_failure = Some(format!("cycle {cycle}: {e}"));
            }
        }
        sh.results.insert(cycle, Arc::new(outcome));
        cv.notify_all();
    }
}

/// Runs `policy` once on a request (what the planner thread does), outside any thread.
pub fn plan_once(
    policy: &mut dyn Policy,
    shape: &Shape,
    req: &PlanRequest,
    scratch: &mut [u64],
    state: &mut [u64],
) -> Outcome {
    let current = Placement::new(*shape, &req.current).map_err(|e| e.to_string())?;
    let samples = match &req.samples {
        Some((t, data)) => Some(Samples::new(shape, *t, data).map_err(|e| e.to_string())?),
        None => None,
    };
    let input = Input::new(current, &req.loads, samples, req.seed).map_err(|e| e.to_string())?;
    let l = shape.layers();
    let mut placement = vec![0u16; shape.placement_len()];
    let mut changed = vec![false; l];
    let mut par_before = vec![0.0; l];
    let mut par_after = vec![0.0; l];
    let started = Instant::now();
    let summary = rebalance(
        policy,
        &input,
        scratch,
        state,
        Output {
            placement: &mut placement,
            changed: &mut changed,
            par_before: &mut par_before,
            par_after: &mut par_after,
        },
    )
    .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    Ok(Plan {
        cycle: req.cycle,
        placement,
        changed,
        par_before,
        par_after,
        summary,
        elapsed,
    })
}
