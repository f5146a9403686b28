//! `eplb-aicpu-reference`: the Rust-API side of the AICPU check (`cargo xtask aicpu`).
//!
//! `reference DIR CASE...` reads each `DIR/CASE.case` (written by xtask from a golden JSON) and,
//! for every policy number 0..=5, runs the Rust API (`eplb_policies::rebalance`, not the C ABI)
//! through the call protocol below and writes `DIR/CASE.pK.expected`. The C program
//! `../tests/c/test_aicpu.c` runs the same protocol through `eplb_aicpu_rebalance` and compares the
//! bytes.
//!
//! Protocol: call 1 from the case's current placement with a zeroed state buffer and the case's
//! seed; call 2 from call 1's placement, with the state call 1 left and seed + 1; same loads and
//! samples both times.
//!
//! `.case` (little-endian): `"EPLBCAS1"`, eight `u64` (layers, experts, ranks, slots per rank,
//! ranks per node, groups, seed, windows T), the current placement as `u16` zero-padded to 8
//! bytes, loads `f64 [L][N]`, samples `f64 [T][L][N]`.
//!
//! `.expected`: `"EPLBEXP1"`, `u64` calls (2), `u64` state words W, then per call: placement
//! `u16` padded to 8 bytes, changed flags `u8` padded to 8 bytes, PAR before `f64 [L]`, PAR after
//! `f64 [L]`, state `u64 [W]`, and changed layers, co-located rows, moves (`u64` each), mean and
//! max PAR before, mean and max PAR after (`f64` each).
#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::ExitCode;

use eplb_core::{Placement, Shape};
use eplb_policies::{AnyPolicy, Input, Output, Policy, PolicyKind, Samples};

const CALLS: u64 = 2;

struct Case {
    shape: Shape,
    seed: u64,
    windows: usize,
    current: Vec<u16>,
    loads: Vec<f64>,
    samples: Vec<f64>,
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let s = self
            .buf
            .get(self.at..self.at + n)
            .ok_or_else(|| format!("truncated at byte {}", self.at))?;
        self.at += n;
        Ok(s)
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn u16s(&mut self, n: usize) -> Result<Vec<u16>, String> {
        let v = self
            .take(2 * n)?
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        self.pad8();
        Ok(v)
    }
    fn f64s(&mut self, n: usize) -> Result<Vec<f64>, String> {
        Ok(self
            .take(8 * n)?
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect())
    }
    fn pad8(&mut self) {
        self.at = self.at.next_multiple_of(8);
    }
}

fn dim(v: u64, what: &str) -> Result<u16, String> {
    u16::try_from(v).map_err(|_| format!("{what} {v} does not fit u16"))
}

fn read_case(path: &Path) -> Result<Case, String> {
    let buf = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = Reader { buf: &buf, at: 0 };
    if r.take(8)? != b"EPLBCAS1" {
        return Err(format!("{}: not an EPLBCAS1 file", path.display()));
    }
    let mut h = [0u64; 8];
    for x in &mut h {
        *x = r.u64()?;
    }
    let [l, n, ranks, s, rpn, g, seed, windows] = h;
    let shape = Shape::with_topology(
        dim(l, "layers")?,
        dim(n, "experts")?,
        dim(ranks, "ranks")?,
        dim(s, "slots per rank")?,
        dim(rpn, "ranks per node")?,
        dim(g, "groups")?,
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let windows = usize::try_from(windows).map_err(|e| e.to_string())?;
    let current = r.u16s(shape.placement_len())?;
    let loads = r.f64s(shape.loads_len())?;
    let samples = r.f64s(windows * shape.loads_len())?;
    if r.at != buf.len() {
        return Err(format!(
            "{}: {} trailing bytes",
            path.display(),
            buf.len() - r.at
        ));
    }
    Ok(Case {
        shape,
        seed,
        windows,
        current,
        loads,
        samples,
    })
}

fn pad8(out: &mut Vec<u8>) {
    out.resize(out.len().next_multiple_of(8), 0);
}

/// The policy of an AICPU policy number (`EPLB_AICPU_POLICY_*`).
fn kind_of(number: u32) -> PolicyKind {
    if number == 5 {
        PolicyKind::DeepSeek
    } else {
        PolicyKind::from_number(u64::from(number)).expect("policy numbers 0..=4")
    }
}

fn expected(case: &Case, number: u32) -> Result<Vec<u8>, String> {
    let shape = case.shape;
    let mut policy = AnyPolicy::new(kind_of(number));
    let name = policy.kind().name();
    let mut scratch = vec![0u64; eplb_policies::scratch_len(&policy, &shape)];
    let state_words = policy.state_len(&shape);
    let mut state = vec![0u64; state_words];
    let l = shape.layers();
    let mut current = case.current.clone();
    let mut out = Vec::new();
    out.extend_from_slice(b"EPLBEXP1");
    out.extend_from_slice(&CALLS.to_le_bytes());
    out.extend_from_slice(&(state_words as u64).to_le_bytes());
    for call in 0..CALLS {
        let placement = Placement::new(shape, &current).map_err(|e| e.to_string())?;
        let samples = if case.windows == 0 {
            None
        } else {
            Some(Samples::new(&shape, case.windows, &case.samples).map_err(|e| e.to_string())?)
        };
        let input = Input::new(
            placement,
            &case.loads,
            samples,
            case.seed.wrapping_add(call),
        )
        .map_err(|e| e.to_string())?;
        let mut new = vec![0u16; shape.placement_len()];
        let mut changed = vec![false; l];
        let mut before = vec![0.0; l];
        let mut after = vec![0.0; l];
        let summary = eplb_policies::rebalance(
            &mut policy,
            &input,
            &mut scratch,
            &mut state,
            Output {
                placement: &mut new,
                changed: &mut changed,
                par_before: &mut before,
                par_after: &mut after,
            },
        )
        .map_err(|e| format!("{name}, call {}: {e}", call + 1))?;
        new.iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        pad8(&mut out);
        changed.iter().for_each(|&c| out.push(u8::from(c)));
        pad8(&mut out);
        for v in before.iter().chain(&after) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        state
            .iter()
            .for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
        for v in [
            summary.changed_layers,
            summary.colocated_rows,
            summary.moves,
        ] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        for v in [
            summary.before.mean,
            summary.before.max,
            summary.after.mean,
            summary.after.max,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        current = new;
    }
    Ok(out)
}

fn run(args: &[String]) -> Result<(), String> {
    let [dir, cases @ ..] = args else {
        return Err("usage: reference DIR CASE...".into());
    };
    if cases.is_empty() {
        return Err("usage: reference DIR CASE...".into());
    }
    let dir = Path::new(dir);
    for name in cases {
        let case = read_case(&dir.join(format!("{name}.case")))?;
        for number in 0..=5u32 {
            let bytes = expected(&case, number).map_err(|e| format!("{name}: {e}"))?;
            let path = dir.join(format!("{name}.p{number}.expected"));
            std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
