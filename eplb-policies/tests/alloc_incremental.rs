//! `Incremental::place` inside `rebalance` allocates nothing (counting global allocator; one policy
//! per file, since the allocator is process-wide). Only allocations of the measuring thread
//! count: the test harness's main thread may allocate while it waits for the test thread.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use eplb_core::{Layout, Placement, Shape};
use eplb_policies::incremental::Incremental;
use eplb_policies::{Input, Output, Policy, rebalance, scratch_len};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if MEASURING.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn rebalance_does_not_allocate() {
    for (shape, spread) in [
        (Shape::with_topology(58, 256, 32, 9, 8, 8).unwrap(), 31),
        (
            Shape::with_topology(58, 256, 64, 5, 8, 8).unwrap(),
            1_000_003,
        ),
        (Shape::new(4, 64, 8, 9).unwrap(), 7),
    ] {
        let mut policy = Incremental::new();
        let mut current = vec![0u16; shape.placement_len()];
        Layout::Default.fill(&shape, &mut current).unwrap();
        let loads: Vec<f64> = (0..shape.loads_len())
            .map(|i| ((i * 7919) % spread) as f64 + 0.5)
            .collect();
        // Ten windows of samples exercise the shift test and the per-window spread.
        let samples: Vec<f64> = (0..10 * shape.loads_len())
            .map(|i| ((i * 7919) % spread) as f64 + (i % 13) as f64)
            .collect();
        let s = eplb_policies::Samples::new(&shape, 10, &samples).unwrap();
        let input = Input::new(
            Placement::new(shape, &current).unwrap(),
            &loads,
            Some(s),
            42,
        )
        .unwrap();
        let mut scratch = vec![0u64; scratch_len(&policy, &shape)];
        let mut state = vec![0u64; policy.state_len(&shape)];
        let l = shape.layers();
        let mut out = vec![0u16; shape.placement_len()];
        let (mut ch, mut pb, mut pa) = (vec![false; l], vec![0.0; l], vec![0.0; l]);

        let before = ALLOCS.load(Ordering::SeqCst);
        MEASURING.set(true);
        let summary = rebalance(
            &mut policy,
            &input,
            &mut scratch,
            &mut state,
            Output {
                placement: &mut out,
                changed: &mut ch,
                par_before: &mut pb,
                par_after: &mut pa,
            },
        );
        MEASURING.set(false);
        let after = ALLOCS.load(Ordering::SeqCst);
        assert!(summary.is_ok(), "{summary:?}");
        assert_eq!(after - before, 0, "rebalance allocated");
    }
    // The counter does count this thread's allocations.
    let before = ALLOCS.load(Ordering::SeqCst);
    MEASURING.set(true);
    let v = std::hint::black_box(vec![1u8; 16]);
    MEASURING.set(false);
    drop(v);
    assert!(ALLOCS.load(Ordering::SeqCst) > before);
}
