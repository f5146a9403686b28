use eplb_core::Placement;
use eplb_policies::flashlb::FlashLb;
use eplb_policies::swift::SwiftBalance;
use eplb_policies::{Input, Policy, Samples};
use eplb_tests::golden;
fn windows(loads: &[f64], t: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(t * loads.len());
    for k in 0..t {
        for (i, &w) in loads.iter().enumerate() {
            let ripple = 1.0 + 0.2 * ((k as f64) * 1.7 + (i as f64) * 0.37).sin();
            out.push((w / t as f64 * ripple).round());
        }
    }
    out
}
#[test]
fn count() {
    let which = std::env::var("WHICH").unwrap_or("flashlb".into());
    let t: usize = std::env::var("T").unwrap_or("0".into()).parse().unwrap();
    let reps: usize = std::env::var("REPS").unwrap_or("20".into()).parse().unwrap();
    let name = std::env::var("CASE").unwrap_or("dsv3_decode_ep32".into());
    let case = golden(&name);
    let shape = case.shape;
    let w = windows(&case.loads, t.max(1));
    let samples = (t > 0).then(|| Samples::new(&shape, t, &w).unwrap());
    let input = Input::new(Placement::new(shape, &case.current).unwrap(), &case.loads, samples, 0).unwrap();
    let mut p: Box<dyn Policy> = if which == "swift" { Box::new(SwiftBalance::new()) } else { Box::new(FlashLb::new()) };
    let mut scratch = vec![0u64; p.scratch_len(&shape)];
    let mut state = vec![0u64; p.state_len(&shape)];
    let mut out = vec![0u16; shape.placement_len()];
    let mut best = f64::MAX;
    for _ in 0..reps {
        state.iter_mut().for_each(|x| *x = 0);
        let t0 = std::time::Instant::now();
        p.place(&input, &mut scratch, &mut state, &mut out).unwrap();
        best = best.min(t0.elapsed().as_secs_f64() * 1e3);
    }
    eprintln!("{which} {name} T={t}: best {best:.2} ms");
}
