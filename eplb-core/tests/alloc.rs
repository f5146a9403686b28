//! The core's hot operations allocate nothing (counting global allocator; one test per file,
//! since the allocator is process-wide).

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use eplb_core::metrics::{self, Routing};
use eplb_core::{Cycle, HeatWindow, Layout, Placement, ReplicaChoice, Shape, StageClassifier};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Only the measuring thread counts: the harness's main thread may allocate meanwhile.
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
fn hot_operations_do_not_allocate() {
    let shape = Shape::with_topology(58, 256, 32, 9, 8, 8).unwrap();
    let mut placement = vec![0u16; shape.placement_len()];
    let counts: Vec<u32> = (0..shape.placement_len() as u32).map(|i| i % 97).collect();
    let rank_counts: Vec<u32> = (0..(shape.layers() * 9) as u32).collect();
    let loads: Vec<f64> = (0..shape.loads_len()).map(|i| (i % 31) as f64).collect();
    let (w, per) = eplb_core::heat::layout_for_interval(600).unwrap();
    let mut storage = vec![0u64; eplb_core::heat::storage_len(&shape, w)];
    let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
    let mut ranks = vec![0.0; 32];
    let mut per_layer = vec![0.0; 58];
    let mut copies = vec![0u16; 256];
    let mut map = vec![0i32; 256];
    let mut l2p = vec![0u32; 256];
    let mut sums = vec![0.0; shape.loads_len()];
    let mut mean = vec![0.0; 256];
    let mut var = vec![0.0; 256];
    let changed = vec![true; 58];

    let before = ALLOCS.load(Ordering::SeqCst);
    MEASURING.set(true);
    Layout::Default.fill(&shape, &mut placement).unwrap();
    let p = Placement::new(shape, &placement).unwrap();
    let mut heat = HeatWindow::new(&shape, w, per, &mut storage).unwrap();
    let classifier = StageClassifier::new(64, 1);
    let mut cycle = Cycle::new(600, 50).unwrap();
    for i in 0..700u64 {
        let stage = classifier.classify(i % 200);
        let matched = eplb_core::HeatStage::Decode.matches(stage);
        if matched {
            heat.add_all_slots(&p, &counts).unwrap();
            heat.add_rank_slots(&p, 3, &rank_counts).unwrap();
            heat.end_iteration();
        }
        let step = cycle.on_iteration(matched, &changed);
        if step == eplb_core::Step::PlanDue {
            cycle.on_plan(&changed);
        }
    }
    heat.sum_all(&mut sums).unwrap();
    heat.mean(5, &mut mean).unwrap();
    heat.variance(5, &mean, &mut var).unwrap();
    for layer in p.layers() {
        for rank in 0..32 {
            layer.expert_map(rank, &mut map).unwrap();
            layer
                .log2phy(rank, ReplicaChoice::TpRotation(4), &mut l2p)
                .unwrap();
        }
        metrics::lower_bound_par(&shape, &loads[..256], &mut copies).unwrap();
    }
    for routing in [Routing::Even, Routing::Log2Phy] {
        metrics::hotness(
            &p,
            &loads,
            routing,
            &mut scratch,
            &mut ranks,
            &mut per_layer,
        )
        .unwrap();
    }
    MEASURING.set(false);
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "core hot path allocated");
    // The counter does count this thread's allocations.
    MEASURING.set(true);
    let v = std::hint::black_box(vec![1u8; 16]);
    MEASURING.set(false);
    drop(v);
    assert!(ALLOCS.load(Ordering::SeqCst) > after);
    assert!(sums.iter().sum::<f64>() > 0.0);
}
