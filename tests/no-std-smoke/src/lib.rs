//! Links eplb-core, eplb-policies and eplb-map (no default features) into a `#![no_std]`
//! staticlib with its own panic handler: if anything pulls in `std`, this fails to build
//! (duplicate `panic_impl` lang item, or `std` not found on a bare-metal target).
#![no_std]

use eplb_core::{HeatRing, Layout, Placement, Shape};

/// Builds the default layout of a small shape and reports its number of co-located rows
/// (0), or `u32::MAX` on error. Exists so the linker keeps code from every crate.
#[unsafe(no_mangle)]
pub extern "C" fn eplb_no_std_smoke() -> u32 {
    let Ok(shape) = Shape::new(2, 8, 2, 5) else {
        return u32::MAX;
    };
    let mut buf = [0u16; 20];
    if Layout::Default.fill(&shape, &mut buf).is_err() {
        return u32::MAX;
    }
    let kind: Result<eplb_policies::PolicyKind, _> = "swift".parse();
    if kind.is_err() {
        return u32::MAX;
    }
    // The heat ring over stack storage (h = 2: two windows of `[L][S]`) and its fold.
    let mut ring_words = [0u64; 20];
    let Ok(mut ring) = HeatRing::new(&shape, 2, &mut ring_words[..]) else {
        return u32::MAX;
    };
    if ring.add(&[1; 10]).is_err() {
        return u32::MAX;
    }
    let (mut samples, mut loads) = ([0.0f64; 16], [0.0f64; 16]);
    let mut gathered = [0u64; 20];
    gathered[..10].copy_from_slice(ring.held());
    let Ok(placed) = eplb_core::Placement::new(shape, &buf) else {
        return u32::MAX;
    };
    if eplb_core::heat::fold_slot_heat(&placed, 1, &gathered, &mut samples, &mut loads).is_err() {
        return u32::MAX;
    }
    // A plan over the live ranks with stack buffers: 1 layer, 4 experts, 3 ranks x 2 slots,
    // rank 1 gone.
    let Ok(small) = Shape::new(1, 4, 3, 2) else {
        return u32::MAX;
    };
    let mut live = match eplb_policies::LiveSet::all(3) {
        Ok(l) => l,
        Err(_) => return u32::MAX,
    };
    let mut elastic = [0u16, 1, 2, 3, 0, 1];
    if live.remove(1).is_err() || eplb_core::live::retire(&small, &live, &mut elastic).is_err() {
        return u32::MAX;
    }
    let Ok(input) = eplb_core::Placement::with_live(small, &elastic, &live).map_err(eplb_policies::Error::from).and_then(|p| eplb_policies::Input::new(p, &loads[..4], None, 1))
    else {
        return u32::MAX;
    };
    let mut policy = eplb_policies::default::DefaultEplb::new();
    let (mut scratch, mut out) = ([0u64; 1024], [0u16; 6]);
    let (mut changed, mut before, mut after) = ([false; 1], [0.0f64; 1], [0.0f64; 1]);
    let planned = eplb_policies::rebalance(
        &mut policy,
        &input,
        &mut scratch,
        &mut [],
        eplb_policies::Output {
            placement: &mut out,
            changed: &mut changed,
            par_before: &mut before,
            par_after: &mut after,
        },
    );
    if planned.is_err() {
        return u32::MAX;
    }
    match Placement::new(shape, &buf) {
        Ok(p) => p.colocated_rows() as u32,
        Err(_) => u32::MAX,
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}
