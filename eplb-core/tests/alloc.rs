//! The core's hot operations allocate nothing (counting global allocator; one test per file,
//! since the allocator is process-wide).

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use eplb_core::metrics::{self, Routing};
use eplb_core::{Cycle, HeatRing, Layout, Placement, ReplicaChoice, Shape, StageClassifier};

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
    let rank_counts: Vec<u32> = (0..(shape.layers() * 9) as u32).map(|i| i % 97).collect();
    let loads: Vec<f64> = (0..shape.loads_len()).map(|i| (i % 31) as f64).collect();
    let (w, _) = eplb_core::heat::layout_for_interval(600).unwrap();
    let ring_len = eplb_core::heat::ring_len(&shape, w);
    let mut storage = vec![0u64; ring_len];
    // What every rank sent: this rank's ring, `R` times (`[R][T][L][S]`, `T = W`).
    let mut gathered = vec![0u64; 32 * ring_len];
    let mut samples = vec![0.0; w * shape.loads_len()];
    let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
    let mut ranks = vec![0.0; 32];
    let mut per_layer = vec![0.0; 58];
    let mut copies = vec![0u16; 256];
    let mut map = vec![0i32; 256];
    let mut l2p = vec![0u32; 256];
    let mut sums = vec![0.0; shape.loads_len()];
    let changed = vec![true; 58];
    let mut folds = 0;

    let before = ALLOCS.load(Ordering::SeqCst);
    MEASURING.set(true);
    Layout::Default.fill(&shape, &mut placement).unwrap();
    let p = Placement::new(shape, &placement).unwrap();
    let mut heat = HeatRing::new(&shape, 600, storage.as_mut_slice()).unwrap();
    let classifier = StageClassifier::new(64, 1);
    let mut cycle = Cycle::new(600, 50).unwrap();
    let placed = eplb_core::Placement::new(shape, &placement).unwrap();
    for i in 0..2000u64 {
        let stage = classifier.classify(i % 200);
        let matched = eplb_core::HeatStage::Decode.matches(stage);
        match cycle.on_iteration(matched, &changed) {
            eplb_core::Step::Collect { counted: true } => heat.add(&rank_counts).unwrap(),
            eplb_core::Step::Snapshot => {
                heat.add(&rank_counts).unwrap();
                let t = heat.windows();
                let held = heat.held();
                for part in gathered.chunks_exact_mut(held.len()).take(32) {
                    part.copy_from_slice(held);
                }
                let all = &gathered[..32 * held.len()];
                let out = &mut samples[..t * shape.loads_len()];
                eplb_core::heat::fold_slot_heat(&placed, t, all, out, &mut sums).unwrap();
                folds += 1;
            }
            eplb_core::Step::PlanDue => {
                cycle.on_plan(&changed);
            }
            eplb_core::Step::CycleDone => heat.reset(),
            _ => {}
        }
    }
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
    assert!(folds >= 1, "no cycle reached its snapshot");
    // Every rank sent the same ring, so the fold counted each token `R` times.
    let want: f64 = 600.0 * 32.0 * rank_counts.iter().map(|&c| f64::from(c)).sum::<f64>();
    assert_eq!(sums.iter().sum::<f64>(), want);
}
