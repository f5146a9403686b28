//! Times the incremental policy alone, on one thread, over the inputs it gets inside the loop
//! (a profiling aid; not part of the gate).
//!
//! `cargo run --release -p eplb-runtime --example replay_incremental -- TRACE R X [REPEATS]
//! [key=value ...]` (keys as in `tune_incremental`)
//! runs `eplb simulate`'s loop once (H=10, A=1, log2phy, default layout) recording every policy
//! input, then replays the recorded calls in order `REPEATS` times (default 5) with a fresh
//! state each time, and prints the fastest time of each call, their mean, and an FNV-1a
//! fingerprint of every output (a change meant to keep the placements must keep it). Replaying
//! gives the loop's own outputs back because the policy is deterministic: the tool checks that
//! too.

use std::sync::{Arc, Mutex};
use std::time::Instant;

mod common;

use eplb_core::{Placement, Shape};
use eplb_policies::incremental::{Incremental, Params};
use eplb_policies::{Error, Input, Policy, PolicyKind, Samples};
use eplb_sim::simulate::simulate_with;

/// One recorded call: current placement, loads, samples (windows, data), seed, output.
struct Call {
    current: Vec<u16>,
    loads: Vec<f64>,
    samples: Option<(usize, Vec<f64>)>,
    seed: u64,
    out: Vec<u16>,
}

struct Recorder {
    inner: Incremental,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Policy for Recorder {
    fn kind(&self) -> PolicyKind {
        self.inner.kind()
    }
    fn scratch_len(&self, shape: &Shape) -> usize {
        self.inner.scratch_len(shape)
    }
    fn state_len(&self, shape: &Shape) -> usize {
        self.inner.state_len(shape)
    }
    fn place(
        &mut self,
        input: &Input<'_>,
        scratch: &mut [u64],
        state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), Error> {
        let res = self.inner.place(input, scratch, state, out);
        self.calls.lock().expect("lock").push(Call {
            current: input.current().as_slice().to_vec(),
            loads: input.loads().to_vec(),
            samples: input
                .samples()
                .map(|s| (s.windows(), s.as_slice().to_vec())),
            seed: input.seed(),
            out: out.to_vec(),
        });
        res
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: replay_incremental TRACE R X [REPEATS]");
        std::process::exit(2);
    }
    let trace = common::load_trace(&args[0]);
    let repeats: usize = args.get(3).map_or(5, |r| r.parse().expect("REPEATS"));
    let mut p = Params::default();
    for kv in args.iter().skip(4) {
        common::set_param(&mut p, kv);
    }
    let cfg = common::anchor_cfg(&args[1], &args[2]);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let rec = Recorder {
        inner: Incremental::with_params(p),
        calls: Arc::clone(&calls),
    };
    let r = simulate_with(&trace, &cfg, Box::new(rec), &mut |_, _| {}).expect("simulate");
    let calls = calls.lock().expect("lock");
    let shape = r.shape;
    let mut best = vec![f64::MAX; calls.len()];
    for _ in 0..repeats {
        let mut pol = Incremental::with_params(p);
        let mut scratch = vec![0u64; pol.scratch_len(&shape)];
        let mut state = vec![0u64; pol.state_len(&shape)];
        let mut out = vec![0u16; shape.placement_len()];
        for (k, c) in calls.iter().enumerate() {
            let current = Placement::new(shape, &c.current).expect("placement");
            let samples = c
                .samples
                .as_ref()
                .map(|(t, d)| Samples::new(&shape, *t, d).expect("samples"));
            let input = Input::new(current, &c.loads, samples, c.seed).expect("input");
            let t0 = Instant::now();
            pol.place(&input, &mut scratch, &mut state, &mut out)
                .expect("place");
            let dt = t0.elapsed().as_secs_f64() * 1e3;
            best[k] = best[k].min(dt);
            assert_eq!(out, c.out, "call {k}: the replay differs from the loop");
        }
    }
    // A fingerprint of every output, to check that a change leaves the placements alone.
    let fnv = eplb_core::fnv1a(
        calls
            .iter()
            .flat_map(|c| c.out.iter().map(|&v| u64::from(v))),
    );
    println!("outputs fnv {fnv:016x}");
    let mean = best.iter().sum::<f64>() / best.len().max(1) as f64;
    let per: Vec<String> = best.iter().map(|t| format!("{t:.1}")).collect();
    println!(
        "{} calls, fastest of {repeats}: ms {per:?}\nmean {mean:.2} ms/cycle, loop mean PAR w>=11 {:.4}, fetches {}",
        best.len(),
        r.mean_par_from_first_activation,
        r.moves_total
    );
}
