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
//!
//! `.gate.expected` (the pay-off gate on, ABI version 2): the same protocol run through the
//! runtime's `PolicyHost` with the gate set (`plan_and_take`, so its ages advance as they do in
//! serving). `"EPLBEXG1"`, `u64` calls, `u64` state words W (the policy's, then one per layer:
//! the gate's ages), the 112 bytes of the `eplb_aicpu_gate` block the C side copies into its
//! arguments, then per call what `.expected` has (the state being the policy's words followed by
//! `PolicyHost::gate_ages`) and the gate's summary: changed, moved and held layers (`u64` each),
//! saving per iteration, stall, forgone saving per iteration (`f64` each).
#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::ExitCode;

use eplb_core::metrics::Routing;
use eplb_core::time::gate::Gate;
use eplb_core::time::{Dtype, Hardware, ModelSpec, Role, TimeModel};
use eplb_core::{Placement, Shape};
use eplb_policies::{AnyPolicy, Input, Output, Policy, PolicyKind, Samples};
use eplb_runtime::planner::PolicyHost;

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

/// The gate of the golden cases: DeepSeek-V3 W8A8 decode on A3 (the runtime's defaults), the
/// expert's W8A8 payload, the node split of the case, and a short cycle (`H + A` = 2
/// iterations), so that some changed layers pay and some do not.
fn golden_gate(shape: &Shape) -> Result<(Gate, [u32; 2]), String> {
    use eplb_runtime::config::deployment::QuantType;
    use eplb_runtime::payload::{ExpertPayload, ModelDims};
    let spec = ModelSpec::DEEPSEEK_V3;
    let payload = ExpertPayload::for_quant(
        ModelDims {
            hidden: u64::from(spec.hidden),
            intermediate: u64::from(spec.intermediate),
        },
        QuantType::W8A8,
        false,
    )
    .map_err(|e| e.to_string())?;
    let mut model = TimeModel::new(
        Hardware::A3,
        spec,
        Role::Decode,
        payload.total_bytes() as f64,
    );
    let rpn = shape.ranks_per_node();
    model.ranks_per_node = (rpn > 0 && rpn < shape.ranks()).then_some(rpn as u16);
    let intervals = [1u32, 1];
    let gate = Gate {
        model,
        iterations: u64::from(intervals[0]) + u64::from(intervals[1]),
        routing: Routing::Log2Phy,
        step_other_ms: 0.0,
    };
    Ok((gate, intervals))
}

/// The `eplb_aicpu_gate` block of `gate` (112 bytes, the header's layout).
fn gate_block(gate: &Gate, intervals: [u32; 2]) -> Vec<u8> {
    let (hw, m) = (&gate.model.hardware, &gate.model.model);
    let mut out = Vec::new();
    for v in [
        hw.flops_bf16,
        hw.flops_8bit,
        hw.flops_fp4,
        hw.hbm_bytes_per_s,
        hw.intra_node_bytes_per_s,
        hw.inter_node_bytes_per_s,
        hw.layer_overhead_ms,
        hw.collective_ms,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&m.hidden.to_le_bytes());
    out.extend_from_slice(&m.intermediate.to_le_bytes());
    for v in [m.experts, m.top_k, m.moe_layers, m.shared_experts] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let dtype: u32 = match m.dtype {
        Dtype::Bf16 => 0,
        Dtype::Int8 => 1,
        Dtype::Fp8 => 2,
        Dtype::Fp4 => 3,
    };
    let routing: u32 = match gate.routing {
        Routing::Log2Phy => 0,
        Routing::Even => 1,
    };
    out.extend_from_slice(&dtype.to_le_bytes());
    out.extend_from_slice(&routing.to_le_bytes());
    out.extend_from_slice(&gate.model.tokens_per_rank.to_le_bytes());
    out.extend_from_slice(&gate.model.expert_bytes.to_le_bytes());
    out.extend_from_slice(&intervals[0].to_le_bytes());
    out.extend_from_slice(&intervals[1].to_le_bytes());
    assert_eq!(out.len(), 112, "eplb_aicpu_gate is 112 bytes");
    out
}

/// The gated protocol through the runtime's `PolicyHost` (see the module docs).
fn expected_gated(case: &Case, number: u32) -> Result<(Vec<u8>, [usize; 3]), String> {
    let shape = case.shape;
    let (gate, intervals) = golden_gate(&shape)?;
    let mut host: PolicyHost<AnyPolicy> =
        PolicyHost::new(Box::new(AnyPolicy::new(kind_of(number))), shape);
    host.set_gate(Some(gate));
    let name = host.policy().kind().name();
    let l = shape.layers();
    let state_words = host.state().len() + l;
    let mut out = Vec::new();
    out.extend_from_slice(b"EPLBEXG1");
    out.extend_from_slice(&CALLS.to_le_bytes());
    out.extend_from_slice(&(state_words as u64).to_le_bytes());
    out.extend_from_slice(&gate_block(&gate, intervals));
    let mut current = case.current.clone();
    let mut totals = [0usize; 3];
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
        let plan = host
            .plan_and_take(call + 1, &input)
            .map_err(|e| format!("{name} gated, call {}: {e:?}", call + 1))?;
        plan.placement()
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        pad8(&mut out);
        plan.changed().iter().for_each(|&c| out.push(u8::from(c)));
        pad8(&mut out);
        for v in plan.par_before().iter().chain(plan.par_after()) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        host.state()
            .iter()
            .for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
        host.gate_ages()
            .ok_or("the gate is set")?
            .iter()
            .for_each(|&a| out.extend_from_slice(&u64::from(a).to_le_bytes()));
        let s = &plan.summary();
        for v in [s.changed_layers, s.colocated_rows, s.moves] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        for v in [s.before.mean, s.before.max, s.after.mean, s.after.max] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let g = plan.gate().ok_or("the gate is set")?;
        for v in [g.changed, g.moved, g.changed - g.moved] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        for v in [g.saving_ms_per_iter, g.stall_ms, g.forgone_ms_per_iter] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        totals[0] += g.changed;
        totals[1] += g.moved;
        totals[2] += g.changed - g.moved;
        current = plan.into_placement();
    }
    Ok((out, totals))
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
            let (bytes, [changed, moved, held]) =
                expected_gated(&case, number).map_err(|e| format!("{name}: {e}"))?;
            let path = dir.join(format!("{name}.p{number}.gate.expected"));
            std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
            if std::env::var_os("EPLB_AICPU_REFERENCE_VERBOSE").is_some() {
                eprintln!("{name} p{number} gated: changed {changed}, moved {moved}, held {held}");
            }
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
