//! In-memory collectives for `R` rank machines driven on one thread: the simulator's and the
//! tests' driver (quinn's `Pair`, for collectives). A driver polls every machine, executes the
//! local actions itself and hands each collective to [`LocalCollective::enter`]; then
//! [`LocalCollective::answer`] replies to every machine once all entered the same collective.
//! More than [`LocalCollective::MAX_ROUNDS`] rounds in one iteration is a livelock.
//!
//! For fault tests it also injects a fault into one rank's reply ([`LocalFault`]: the collective
//! fails there, or one word arrives corrupted, while its peers read every word), and, made
//! [`LocalCollective::set_lenient`], it behaves as a real transport towards ranks that are out
//! of step: gathers of one length but of different steps are answered together (the machines'
//! tags tell), and ranks that entered a collective some rank did not enter, or one of another
//! length, get a failure (a real transport's timeout), instead of a [`DriveError`].
//!
//! [`LocalWorld`] is the one-thread driver itself (quinn's `Pair`): it polls every driven
//! machine, answers its local actions through a [`LocalHooks`] (the planner and the layer hooks)
//! and its collectives through its [`LocalCollective`], until every machine is idle. The
//! simulator and the runtime's machine tests drive their machines with it.

use std::fmt;

use eplb_core::LiveSet;

use super::{
    Action, Collective, Gather, LayerAction, MachineError, PlanInput, PlannerAction, RankMachine,
    Reply,
};

/// A collective as one rank entered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entered {
    /// An all-gather of `words` words per rank.
    AllGather {
        /// What it gathers.
        of: Gather,
        /// Words per rank.
        words: usize,
    },
    /// The AND of one flag per rank.
    AllAnd,
}

/// Why a local drive stopped.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum DriveError {
    /// The ranks wait in different collectives (or some in none): a livelock.
    Mismatch {
        /// What rank 0 waits in.
        first: Option<Entered>,
        /// The first rank that waits in something else.
        rank: usize,
        /// What it waits in.
        other: Option<Entered>,
    },
    /// A rank entered two collectives in one round, or is not a rank of the world.
    Rank {
        /// The rank.
        rank: usize,
    },
    /// The ranks still exchange after this many collectives in one iteration: a livelock.
    Rounds(usize),
    /// A machine refused its reply.
    Machine {
        /// The rank.
        rank: usize,
        /// Its error.
        error: MachineError,
    },
}

impl fmt::Display for DriveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriveError::Mismatch { first, rank, other } => write!(
                f,
                "livelock: rank 0 waits in {first:?}, rank {rank} in {other:?}"
            ),
            DriveError::Rank { rank } => {
                write!(f, "rank {rank} entered a collective it cannot enter")
            }
            DriveError::Rounds(n) => write!(
                f,
                "livelock: the ranks still exchange after {n} collectives in one iteration"
            ),
            DriveError::Machine { rank, error } => write!(f, "rank {rank}: {error}"),
        }
    }
}

impl std::error::Error for DriveError {}

/// A fault injected into one rank's reply of one collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalFault {
    /// The collective fails on this rank only (the peers read every word, this rank's too).
    Fail,
    /// The transport reports success on this rank, but one word of the reply (a peer's second,
    /// or the flag of an AND) arrives changed.
    Corrupt,
}

/// The collectives of `R` machines on one thread, over one rank-major buffer sized once.
#[derive(Debug, Clone)]
pub struct LocalCollective {
    entered: Vec<Option<Entered>>,
    flags: Vec<bool>,
    /// Rank-major words of the current gather.
    words: Vec<u64>,
    /// A corrupted copy of `words` for one rank's reply.
    bent: Vec<u64>,
    faults: Vec<Option<LocalFault>>,
    failing: bool,
    lenient: bool,
    /// The ranks the collectives run over (`None`: every rank).
    live: Option<LiveSet>,
}

impl LocalCollective {
    /// Rounds of collectives in one iteration before a driver declares a livelock: one
    /// iteration needs at most a layer vote, a heat gather, a readiness flag, a digest
    /// agreement and a placement check.
    pub const MAX_ROUNDS: usize = 16;

    /// The collectives of `machines` (one per rank, in rank order).
    pub fn new(machines: &[RankMachine]) -> Self {
        let r = machines.len();
        let per_rank = machines
            .iter()
            .map(RankMachine::max_gather_words)
            .max()
            .unwrap_or(0);
        Self {
            entered: vec![None; r],
            flags: vec![false; r],
            words: vec![0; r * per_rank],
            bent: vec![0; r * per_rank],
            faults: vec![None; r],
            failing: false,
            lenient: false,
            live: None,
        }
    }

    /// From now on the collectives run over the ranks of `live` only (a driver's answer to
    /// [`Action::Members`](super::Action::Members)): their words, rank-major in ascending rank
    /// order; a rank outside it cannot enter one, and [`LocalCollective::answer`] skips its
    /// machine.
    pub fn set_live(&mut self, live: &LiveSet) {
        self.live = (!live.is_all()).then_some(*live);
    }

    /// Where `rank`'s words go in a gather: its position among the members.
    fn position(&self, rank: usize) -> Option<usize> {
        match &self.live {
            None => Some(rank),
            Some(l) => l.position(rank),
        }
    }

    /// Behave as a real transport towards ranks out of step (see the module docs) instead of
    /// failing the drive with [`DriveError::Mismatch`].
    pub fn set_lenient(&mut self, lenient: bool) {
        self.lenient = lenient;
    }

    /// `fault` hits `rank`'s reply of the next collective answered (once).
    pub fn inject(&mut self, rank: usize, fault: LocalFault) {
        if let Some(f) = self.faults.get_mut(rank) {
            *f = Some(fault);
        }
    }

    /// What `rank` entered in the current round, if anything.
    pub fn entered(&self, rank: usize) -> Option<Entered> {
        self.entered.get(rank).copied().flatten()
    }

    /// While set, every collective fails on every rank (the machines get `None`).
    pub fn set_failing(&mut self, failing: bool) {
        self.failing = failing;
    }

    /// `rank` enters `c`: its words are copied in.
    pub fn enter(&mut self, rank: usize, c: Collective<'_>) -> Result<(), DriveError> {
        let Some(pos) = self.position(rank) else {
            return Err(DriveError::Rank { rank });
        };
        let (Some(slot @ None), Some(flag)) =
            (self.entered.get_mut(rank), self.flags.get_mut(rank))
        else {
            return Err(DriveError::Rank { rank });
        };
        match c {
            Collective::AllAnd { flag: f } => {
                *flag = f;
                *slot = Some(Entered::AllAnd);
            }
            Collective::AllGather { of, send } => {
                let n = send.len();
                *slot = Some(Entered::AllGather { of, words: n });
                match self.words.get_mut(pos * n..(pos + 1) * n) {
                    Some(d) => d.copy_from_slice(send),
                    None => return Err(DriveError::Rank { rank }),
                }
            }
        }
        Ok(())
    }

    /// Answers the round: if every rank entered the same collective, replies to each machine
    /// (`None` while failing, or where a fault is injected) and returns `true`; if none entered
    /// one, returns `false`. Lenient, ranks out of step are answered as a real transport would.
    /// `machines` are the machines to answer (a frozen rank's may be left out).
    pub fn answer<'m>(
        &mut self,
        machines: impl IntoIterator<Item = &'m mut RankMachine>,
    ) -> Result<bool, DriveError> {
        let first = self.entered.iter().copied().flatten().next();
        let Some(first) = first else {
            return Ok(false);
        };
        let live = self.live;
        let member = |r: usize| live.is_none_or(|l| l.contains(r));
        let words_of = |e: &Entered| match e {
            Entered::AllGather { words, .. } => Some(*words),
            Entered::AllAnd => None,
        };
        let same = |e: &Option<Entered>| match (e, self.lenient) {
            (Some(e), true) => words_of(e) == words_of(&first),
            (e, _) => *e == Some(first),
        };
        let timeout = match self
            .entered
            .iter()
            .enumerate()
            .position(|(r, e)| member(r) && !same(e))
        {
            Some(rank) if !self.lenient => {
                return Err(DriveError::Mismatch {
                    first: self.entered.first().copied().flatten(),
                    rank,
                    other: self.entered.get(rank).copied().flatten(),
                });
            }
            Some(_) => true,
            None => false,
        };
        let all = self.flags.iter().enumerate().all(|(r, &f)| f || !member(r));
        let count = live.map_or(self.entered.len(), |l| l.count());
        let len = words_of(&first).unwrap_or(0) * count;
        for m in machines {
            let r = m.rank();
            if !member(r) {
                continue;
            }
            let (Some(entered), Some(fault)) = (self.entered.get_mut(r), self.faults.get_mut(r))
            else {
                return Err(DriveError::Rank { rank: r });
            };
            if entered.take().is_none() {
                continue;
            }
            let fault = if timeout || self.failing {
                None
            } else {
                Some(fault.take())
            };
            let reply = match (first, fault) {
                (_, None | Some(Some(LocalFault::Fail))) => None,
                (Entered::AllAnd, Some(None)) => Some(Reply::Flag(all)),
                (Entered::AllAnd, Some(Some(LocalFault::Corrupt))) => Some(Reply::Flag(!all)),
                (Entered::AllGather { .. }, Some(None)) => {
                    Some(Reply::Words(self.words.get(..len).unwrap_or(&[])))
                }
                (Entered::AllGather { words, .. }, Some(Some(LocalFault::Corrupt))) => {
                    let (Some(src), Some(dst)) = (self.words.get(..len), self.bent.get_mut(..len))
                    else {
                        return Err(DriveError::Rank { rank: r });
                    };
                    dst.copy_from_slice(src);
                    // A peer's second word (or the last word of a one-word gather).
                    let peer = (r + 1) % machines_len(len, words);
                    if let Some(w) = dst.get_mut(peer * words + 1.min(words.saturating_sub(1))) {
                        *w ^= 0x0101_0000_0000_0001;
                    }
                    Some(Reply::Words(self.bent.get(..len).unwrap_or(&[])))
                }
            };
            m.handle_collective(reply)
                .map_err(|error| DriveError::Machine { rank: r, error })?;
        }
        Ok(true)
    }
}

/// Ranks in a gather of `len` words, `words` each.
fn machines_len(len: usize, words: usize) -> usize {
    len.checked_div(words).unwrap_or(0).max(1)
}

/// What a one-thread driver's planner answers a rank that submitted a plan request.
#[derive(Debug, Clone, Copy)]
pub enum PlanAnswer<'a> {
    /// The plan, handed to the rank at once.
    Plan(&'a crate::planner::Plan),
    /// The policy failed: the rank is told at once.
    Failed,
    /// Later: [`LocalHooks::planned`] has it at the end of a round (one planner shared by
    /// several ranks, fed by one of them).
    Later,
}

/// The driver's side of [`LocalWorld`]: the planner and the layer hooks. Every hook but
/// [`LocalHooks::submit`] has a default (transfers that always arrive, a planner nobody
/// settles); a driver overrides what it watches or injects.
pub trait LocalHooks {
    /// The driver's error; a drive error (a livelock, a refused reply) converts into it.
    type Error: From<DriveError>;

    /// `rank` submitted `input` ([`PlannerAction::Submit`]).
    fn submit(&mut self, rank: usize, input: &PlanInput<'_>)
    -> Result<PlanAnswer<'_>, Self::Error>;

    /// The plan of the ranks answered [`PlanAnswer::Later`], once there is one: its cycle and
    /// its placement (`None`: the policy failed). Called at the end of every round in which
    /// some rank waits for one.
    fn planned(&mut self) -> Option<(u64, Option<&crate::planner::Plan>)> {
        None
    }

    /// `rank` settles `cycle` ([`PlannerAction::Settle`]).
    fn settle(&mut self, rank: usize, cycle: u64, taken: bool, resync: bool) {
        let _ = (rank, cycle, taken, resync);
    }

    /// `m` launches `layer`'s exchange from its placement to its plan: whether it succeeds (the
    /// world reports it after the rank's next forward, [`LocalWorld::forward`]).
    fn launch(&mut self, m: &RankMachine, layer: u16) -> bool {
        let _ = (m, layer);
        true
    }

    /// `rank` loads its lost experts of `layer`: whether the load succeeds.
    fn load(&mut self, rank: usize, layer: u16) -> bool {
        let _ = (rank, layer);
        true
    }

    /// `rank` installs `layer`: whether the commit succeeds.
    fn commit(&mut self, rank: usize, layer: u16) -> bool {
        let _ = (rank, layer);
        true
    }

    /// `rank` reroutes (its live set changed).
    fn reroute(&mut self, rank: usize) {
        let _ = rank;
    }

    /// `rank` enters `c` (before the collective gets it).
    fn collective(&mut self, rank: usize, c: &Collective<'_>) {
        let _ = (rank, c);
    }

    /// Every driven rank has run its local actions this round; the collective answers next
    /// (a fault test injects its fault here).
    fn before_answer(&mut self, net: &mut LocalCollective) {
        let _ = net;
    }
}

/// The one-thread driver of `R` rank machines: the driven ranks, each rank's launched exchange
/// and waiting plan request, and the [`LocalCollective`] (see the module docs). The machines
/// stay the caller's; every method takes them in rank order.
#[derive(Debug, Clone)]
pub struct LocalWorld {
    net: LocalCollective,
    driven: Vec<bool>,
    /// Per rank: the layer launched and whether its exchange succeeds.
    launched: Vec<Option<(u16, bool)>>,
    /// Per rank: it waits for a plan answered [`PlanAnswer::Later`].
    waiting: Vec<bool>,
}

impl LocalWorld {
    /// The world of `machines` (one per rank, in rank order), every rank driven.
    pub fn new(machines: &[RankMachine]) -> Self {
        let r = machines.len();
        Self {
            net: LocalCollective::new(machines),
            driven: vec![true; r],
            launched: vec![None; r],
            waiting: vec![false; r],
        }
    }

    /// The collective.
    pub fn net(&self) -> &LocalCollective {
        &self.net
    }

    /// The collective, to inject faults or make it lenient.
    pub fn net_mut(&mut self) -> &mut LocalCollective {
        &mut self.net
    }

    /// Whether `rank` is driven.
    pub fn is_driven(&self, rank: usize) -> bool {
        self.driven.get(rank).copied().unwrap_or(false)
    }

    /// Per rank, whether it is driven.
    pub fn driven(&self) -> &[bool] {
        &self.driven
    }

    /// Drives `rank` from now on, or stops (a rank that failed: its machine is frozen). Either
    /// way its launched exchange and its waiting plan request are forgotten (a machine that
    /// is driven again is a fresh one).
    pub fn set_driven(&mut self, rank: usize, driven: bool) {
        if let (Some(d), Some(l), Some(w)) = (
            self.driven.get_mut(rank),
            self.launched.get_mut(rank),
            self.waiting.get_mut(rank),
        ) {
            *d = driven;
            *l = None;
            *w = false;
        }
    }

    /// One forward of `m`: first the outcome of the exchange it launched before, then
    /// [`RankMachine::handle_forward`] with its per-slot `counts` and `tokens`.
    pub fn forward(
        &mut self,
        m: &mut RankMachine,
        counts: &[u32],
        tokens: u64,
    ) -> Result<(), MachineError> {
        if let Some((layer, ok)) = self.launched.get_mut(m.rank()).and_then(Option::take) {
            m.handle_exchanged(layer, ok);
        }
        m.handle_forward(counts, tokens)
    }

    /// Runs every driven machine's actions until all are idle: local actions at once
    /// (answered by `hooks`), the plans of waiting ranks at the end of a round, collectives
    /// when every rank has entered the same one. More than [`LocalCollective::MAX_ROUNDS`]
    /// rounds is a livelock ([`DriveError::Rounds`]).
    pub fn drive<H: LocalHooks>(
        &mut self,
        machines: &mut [RankMachine],
        hooks: &mut H,
    ) -> Result<(), H::Error> {
        for _ in 0..LocalCollective::MAX_ROUNDS {
            for (m, _) in machines.iter_mut().zip(&self.driven).filter(|(_, d)| **d) {
                Self::run_local(
                    &mut self.net,
                    &mut self.launched,
                    &mut self.waiting,
                    m,
                    hooks,
                )?;
            }
            self.hand_waiting(machines, hooks)?;
            hooks.before_answer(&mut self.net);
            let driven = machines.iter_mut().zip(&self.driven).filter(|(_, d)| **d);
            if !self.net.answer(driven.map(|(m, _)| m))? {
                return Ok(());
            }
        }
        Err(DriveError::Rounds(LocalCollective::MAX_ROUNDS).into())
    }

    /// Executes `m`'s local actions until it enters a collective or has none.
    fn run_local<H: LocalHooks>(
        net: &mut LocalCollective,
        launched: &mut [Option<(u16, bool)>],
        waiting: &mut [bool],
        m: &mut RankMachine,
        hooks: &mut H,
    ) -> Result<(), H::Error> {
        let rank = m.rank();
        loop {
            match m.poll() {
                None => return Ok(()),
                Some(Action::Collective(c)) => {
                    hooks.collective(rank, &c);
                    return Ok(net.enter(rank, c)?);
                }
                Some(Action::Planner(PlannerAction::Submit(input))) => {
                    let cycle = input.cycle;
                    match hooks.submit(rank, &input)? {
                        PlanAnswer::Plan(p) => m.handle_plan(cycle, Some(p)),
                        PlanAnswer::Failed => m.handle_plan(cycle, None),
                        PlanAnswer::Later => {
                            if let Some(w) = waiting.get_mut(rank) {
                                *w = true;
                            }
                        }
                    }
                }
                Some(Action::Planner(PlannerAction::Settle {
                    cycle,
                    taken,
                    resync,
                })) => hooks.settle(rank, cycle, taken, resync),
                Some(Action::Layer(LayerAction::Launch { layer })) => {
                    let ok = hooks.launch(m, layer);
                    if let Some(l) = launched.get_mut(rank) {
                        *l = Some((layer, ok));
                    }
                }
                Some(Action::Layer(LayerAction::Load { layer })) => {
                    let ok = hooks.load(rank, layer);
                    m.handle_loaded(layer, ok);
                }
                Some(Action::Layer(LayerAction::Commit { layer })) => {
                    let ok = hooks.commit(rank, layer);
                    m.handle_committed(layer, ok);
                }
                Some(Action::Members { live }) => net.set_live(live),
                Some(Action::Reroute) => hooks.reroute(rank),
                Some(Action::Record { .. })
                | Some(Action::Layer(LayerAction::SendOnly { .. }))
                | Some(Action::Layer(LayerAction::Abort { .. })) => {}
            }
        }
    }

    /// Hands the plan, once the planner has one, to the ranks waiting for it (a plan is
    /// validated once, when the policy host built it).
    fn hand_waiting<H: LocalHooks>(
        &mut self,
        machines: &mut [RankMachine],
        hooks: &mut H,
    ) -> Result<(), H::Error> {
        if !self.waiting.contains(&true) {
            return Ok(());
        }
        let Some((cycle, plan)) = hooks.planned() else {
            return Ok(());
        };
        for (m, waiting) in machines.iter_mut().zip(self.waiting.iter_mut()) {
            if core::mem::take(waiting) {
                m.handle_plan(cycle, plan);
            }
        }
        Ok(())
    }
}
