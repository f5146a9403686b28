//! Membership events of a replay: a rank fails or joins at a window (`SIMULATION.md`,
//! "Elastic membership").

/// What a membership event does to its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberKind {
    /// The rank stops (its machine is never driven again, its slots empty).
    Fail,
    /// A rank that failed comes back, with empty slots until a layer walk fills them.
    Join,
}

impl MemberKind {
    /// `fail` or `join` (the JSON's `kind`).
    pub fn name(self) -> &'static str {
        match self {
            MemberKind::Fail => "fail",
            MemberKind::Join => "join",
        }
    }
}

/// A membership event of a replay: `rank` fails or joins at `window`, before that window is
/// routed (`SIMULATION.md`, "Elastic membership").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberEvent {
    /// The window at whose start the event happens.
    pub window: usize,
    /// The rank.
    pub rank: u16,
    /// Fail or join.
    pub kind: MemberKind,
}
