//! The counting global allocator and the harness of the per-policy allocation tests. Each
//! `alloc_*.rs` is its own test crate (the allocator is process-wide) and includes this module.
//! Only the measuring thread's allocations count: the harness's main thread may allocate while
//! the test thread runs.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use eplb_core::{Layout, Placement, Shape};
use eplb_policies::{Input, Output, Policy, Samples, rebalance, scratch_len};

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

/// Allocations made by `f` on this thread.
pub fn allocations<R>(f: impl FnOnce() -> R) -> (usize, R) {
    let before = ALLOCS.load(Ordering::SeqCst);
    MEASURING.set(true);
    let r = f();
    MEASURING.set(false);
    (ALLOCS.load(Ordering::SeqCst) - before, r)
}

/// Runs `rebalance` twice (fresh and warm state) with `make()`'s policy on the DeepSeek-V3
/// EP32 and EP64 shapes and an ESFT-like one, with `windows` per-window samples (0: none), and
/// asserts that no call allocates. `changes`: each call must change some layer.
pub fn assert_rebalance_allocation_free<P: Policy>(
    make: impl Fn() -> P,
    windows: usize,
    changes: bool,
) {
    for (shape, spread, colocated) in [
        (
            Shape::with_topology(58, 256, 32, 9, 8, 8).unwrap(),
            1009,
            false,
        ),
        (
            Shape::with_topology(58, 256, 64, 5, 8, 8).unwrap(),
            1_000_003,
            false,
        ),
        (Shape::new(4, 64, 8, 9).unwrap(), 7, false),
        // A current placement with co-located copies (as DeepSeek writes them): the checked
        // call's servable copy of it is carved from the scratch too.
        (Shape::new(4, 64, 8, 9).unwrap(), 7, true),
    ] {
        let mut policy = make();
        let mut current = vec![0u16; shape.placement_len()];
        Layout::Default.fill(&shape, &mut current).unwrap();
        if colocated {
            colocate(&shape, &mut current);
            assert!(Placement::new(shape, &current).unwrap().colocated_rows() > 0);
        }
        let loads: Vec<f64> = (0..shape.loads_len())
            .map(|i| ((i * 7919) % spread) as f64 + 0.5)
            .collect();
        let w: Vec<f64> = (0..windows * shape.loads_len())
            .map(|i| ((i * 104_729) % 211) as f64)
            .collect();
        let samples = (windows > 0).then(|| Samples::new(&shape, windows, &w).unwrap());
        let input = Input::new(
            Placement::new(shape, &current).unwrap(),
            &loads,
            samples,
            42,
        )
        .unwrap();
        let mut scratch = vec![0u64; scratch_len(&policy, &shape)];
        let mut state = vec![0u64; policy.state_len(&shape)];
        let l = shape.layers();
        let mut out = vec![0u16; shape.placement_len()];
        let (mut ch, mut pb, mut pa) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
        for _ in 0..2 {
            let (n, summary) = allocations(|| {
                rebalance(
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
                )
            });
            let summary = summary.unwrap_or_else(|e| panic!("{shape:?}: {e}"));
            if changes {
                assert!(summary.changed_layers > 0, "{shape:?}: nothing changed");
            }
            assert_eq!(n, 0, "{shape:?}: rebalance allocated");
        }
    }
    // The counter does count this thread's allocations.
    let (n, v) = allocations(|| std::hint::black_box(vec![1u8; 16]));
    drop(v);
    assert!(n > 0);
}

/// Puts a second copy of a row's first expert on that row, in every layer, over a slot whose
/// expert has another copy (so the placement stays structurally valid).
fn colocate(shape: &Shape, current: &mut [u16]) {
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    for layer in current.chunks_exact_mut(per) {
        let mut copies = vec![0usize; shape.experts()];
        layer.iter().for_each(|&e| copies[usize::from(e)] += 1);
        if let Some(j) = (0..per).find(|&j| j % s != 0 && copies[usize::from(layer[j])] > 1) {
            layer[j] = layer[j - j % s];
        }
    }
}
