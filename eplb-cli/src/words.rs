//! The command line's vocabulary for what the libraries report in their own terms: a
//! membership event is `--fail-rank R@W`, the intervals are `--heat-interval` and
//! `--algo-interval`. `eplb-sim` knows no flag; this module words its typed errors as the
//! command line names the settings.

use eplb_sim::cost::CostError;
use eplb_sim::{MemberEvent, MemberKind, SimError};

/// The flag that asks for `kind` (`--fail-rank` or `--join-rank`).
pub(crate) fn flag(kind: MemberKind) -> &'static str {
    match kind {
        MemberKind::Fail => "--fail-rank",
        MemberKind::Join => "--join-rank",
    }
}

/// `--fail-rank 5@40`, an event as the command line names it.
pub(crate) fn describe(e: &MemberEvent) -> String {
    format!("{} {}@{}", flag(e.kind), e.rank, e.window)
}

/// Parses `R@W` (rank `R` at window `W`) for `kind`; an error names the flag and the value.
pub(crate) fn parse_event(kind: MemberKind, text: &str) -> Result<MemberEvent, String> {
    let bad = |why: &str| format!("{} {text}: {why}", flag(kind));
    let (r, w) = text
        .split_once('@')
        .ok_or_else(|| bad("expected RANK@WINDOW, such as 5@40"))?;
    let rank = r
        .trim()
        .parse::<u16>()
        .map_err(|_| bad("the rank (before @) is not a whole number below 65536"))?;
    let window = w
        .trim()
        .parse::<usize>()
        .map_err(|_| bad("the window (after @) is not a whole number"))?;
    Ok(MemberEvent { window, rank, kind })
}

/// A cost settings error as the command line words it (`--model`, `--hidden`,
/// `--intermediate`).
pub(crate) fn cost_error(e: &CostError) -> String {
    match e {
        CostError::ModelAndSizes => {
            "give either --model or --hidden with --intermediate, not both".to_owned()
        }
        CostError::SizesApart => "--hidden and --intermediate go together".to_owned(),
        other => other.to_string(),
    }
}

/// `e` as the command line words it: the settings it names by their flags.
pub(crate) fn sim_error(e: &SimError) -> String {
    match e {
        SimError::Intervals { .. } => {
            "--heat-interval and --algo-interval must be at least 1".to_owned()
        }
        SimError::Event { event, why } => format!("{}: {why}", describe(event)),
        SimError::CostSettings(c) => format!("cost: {}", cost_error(c)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_and_bad_ones_name_the_flag_and_value() {
        for bad in ["5@", "x@3", "5", "@3", "-1@3"] {
            let e = parse_event(MemberKind::Fail, bad).unwrap_err();
            assert!(e.starts_with(&format!("--fail-rank {bad}:")), "{e}");
        }
        let ev = parse_event(MemberKind::Join, "5@40").unwrap();
        assert_eq!(
            ev,
            MemberEvent {
                window: 40,
                rank: 5,
                kind: MemberKind::Join
            }
        );
        assert_eq!(describe(&ev), "--join-rank 5@40");
        let e = SimError::Event {
            event: ev,
            why: "rank 5 is live".to_owned(),
        };
        assert_eq!(sim_error(&e), "--join-rank 5@40: rank 5 is live");
        assert_eq!(
            cost_error(&CostError::SizesApart),
            "--hidden and --intermediate go together"
        );
        assert_eq!(
            cost_error(&CostError::ModelAndSizes),
            "give either --model or --hidden with --intermediate, not both"
        );
        assert_eq!(
            sim_error(&SimError::Intervals { heat: 0, algo: 1 }),
            "--heat-interval and --algo-interval must be at least 1"
        );
    }
}
