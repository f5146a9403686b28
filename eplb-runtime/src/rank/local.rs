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

use std::fmt;

use eplb_core::LiveSet;

use super::{Collective, Gather, MachineError, RankMachine, Reply};

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
    pub fn answer(&mut self, machines: &mut [RankMachine]) -> Result<bool, DriveError> {
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
        for m in machines.iter_mut() {
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
