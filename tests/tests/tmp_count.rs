use eplb_core::Placement;
use eplb_policies::flashlb::{FlashLb, LPT_CALLS};
use eplb_policies::{Input, Policy};
use eplb_tests::golden;
#[test]
fn count() {
    for name in ["dsv3_decode_ep32", "dsv3_decode_ep64"] {
        let case = golden(name);
        let mut p = FlashLb::new();
        let shape = case.shape;
        let input = Input::new(Placement::new(shape, &case.current).unwrap(), &case.loads, None, 0).unwrap();
        let mut scratch = vec![0u64; p.scratch_len(&shape)];
        let mut state = vec![0u64; p.state_len(&shape)];
        let mut out = vec![0u16; shape.placement_len()];
        LPT_CALLS.store(0, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::Instant::now();
        p.place(&input, &mut scratch, &mut state, &mut out).unwrap();
        eprintln!("{name}: {:?} lpt calls {}", t.elapsed(), LPT_CALLS.load(std::sync::atomic::Ordering::Relaxed));
    }
}
