//! In-memory collectives for `R` rank machines driven on one thread: the simulator's and the
//! tests' driver (quinn's `Pair`, for collectives). A driver polls every machine, executes the
//! local actions itself and hands each collective to [`LocalCollective::enter`]; then
//! [`LocalCollective::answer`] replies to every machine once all entered the same collective.
//! More than [`LocalCollective::MAX_ROUNDS`] rounds in one iteration is a livelock.

use std::fmt;

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

/// The collectives of `R` machines on one thread, over one rank-major buffer sized once.
#[derive(Debug, Clone)]
pub struct LocalCollective {
    entered: Vec<Option<Entered>>,
    flags: Vec<bool>,
    /// Rank-major words of the current gather.
    words: Vec<u64>,
    failing: bool,
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
            failing: false,
        }
    }

    /// While set, every collective fails on every rank (the machines get `None`).
    pub fn set_failing(&mut self, failing: bool) {
        self.failing = failing;
    }

    /// `rank` enters `c`: its words are copied in.
    pub fn enter(&mut self, rank: usize, c: Collective<'_>) -> Result<(), DriveError> {
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
                match self.words.get_mut(rank * n..(rank + 1) * n) {
                    Some(d) => d.copy_from_slice(send),
                    None => return Err(DriveError::Rank { rank }),
                }
            }
        }
        Ok(())
    }

    /// Answers the round: if every rank entered the same collective, replies to each machine
    /// (`None` while failing) and returns `true`; if none entered one, returns `false`.
    pub fn answer(&mut self, machines: &mut [RankMachine]) -> Result<bool, DriveError> {
        let first = self.entered.first().copied().flatten();
        if let Some(rank) = self.entered.iter().position(|e| *e != first) {
            return Err(DriveError::Mismatch {
                first,
                rank,
                other: self.entered.get(rank).copied().flatten(),
            });
        }
        let Some(first) = first else {
            return Ok(false);
        };
        self.entered.fill(None);
        let all = self.flags.iter().all(|&f| f);
        let reply = match first {
            _ if self.failing => None,
            Entered::AllAnd => Some(Reply::Flag(all)),
            Entered::AllGather { words, .. } => {
                let len = words * machines.len();
                Some(Reply::Words(self.words.get(..len).unwrap_or(&[])))
            }
        };
        for m in machines.iter_mut() {
            m.handle_collective(reply)
                .map_err(|error| DriveError::Machine {
                    rank: m.rank(),
                    error,
                })?;
        }
        Ok(true)
    }
}
