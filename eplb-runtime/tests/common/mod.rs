//! Helpers shared by the eplb-runtime integration tests (each test crate uses a part of them).
#![allow(dead_code)]

use std::path::PathBuf;

use eplb_core::Shape;

/// A file under `../shared` (relative to the project root), which must exist.
pub fn shared(rel: &str) -> String {
    let p = PathBuf::from(format!("{}/../../shared/{rel}", env!("CARGO_MANIFEST_DIR")));
    assert!(p.is_file(), "missing test input {}", p.display());
    p.display().to_string()
}

/// A fresh temporary directory for one test.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eplb-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The default layout of `shape`.
pub fn default_layout(shape: &Shape) -> Vec<u16> {
    let mut p = vec![0u16; shape.placement_len()];
    eplb_core::Layout::Default.fill(shape, &mut p).unwrap();
    p
}

/// Rank `rank`'s rows of `placement`, one per layer (`[L][S]`).
pub fn rank_rows(shape: &Shape, placement: &[u16], rank: usize) -> Vec<Vec<u16>> {
    let s = shape.slots_per_rank();
    placement
        .chunks_exact(shape.slots_per_layer())
        .map(|l| l[rank * s..(rank + 1) * s].to_vec())
        .collect()
}

/// The small cluster shape of the end-to-end tests: 4 layers, 16 experts, 8 ranks x 3 slots.
pub fn small_shape() -> Shape {
    Shape::new(4, 16, 8, 3).unwrap()
}

/// Skewed, deterministic per-slot counts of `rank` under `placement`: experts with
/// `(e + l + shift) % 5 == 0` are `hot` times hotter.
pub fn slot_counts(
    shape: &Shape,
    placement: &[u16],
    rank: usize,
    iter: usize,
    hot: u32,
    shift: usize,
) -> Vec<u32> {
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    let mut out = Vec::with_capacity(shape.layers() * s);
    for l in 0..shape.layers() {
        for slot in 0..s {
            let e = placement[l * per + rank * s + slot] as usize;
            let h = if (e + l + shift).is_multiple_of(5) {
                hot
            } else {
                1
            };
            out.push(h * (1 + ((e * 7 + iter) % 11) as u32));
        }
    }
    out
}

struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        eprintln!("{} {}", r.level(), r.args());
    }
    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

/// With `EPLB_DEBUG` set, the runtime's log lines (info and up) go to stderr: for reading a
/// failing cluster test (`cargo test ... -- --nocapture`).
pub fn debug_log() {
    if std::env::var("EPLB_DEBUG").is_ok() {
        let _ = log::set_logger(&LOGGER);
        log::set_max_level(log::LevelFilter::Info);
    }
}

/// A policy that answers with a given placement: how a test hands a rank machine a plan of its
/// choosing ([`eplb_runtime::planner::Plan`]s come only from a `PolicyHost`).
struct Given(Vec<u16>);

impl eplb_policies::Policy for Given {
    fn kind(&self) -> eplb_policies::PolicyKind {
        eplb_policies::PolicyKind::Static
    }
    fn scratch_len(&self, _shape: &Shape) -> usize {
        0
    }
    fn colocates(&self) -> bool {
        true
    }
    fn place(
        &mut self,
        _input: &eplb_policies::Input<'_>,
        _scratch: &mut [u64],
        _state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), eplb_policies::Error> {
        if out.len() != self.0.len() {
            return Err(eplb_core::Error::Length {
                what: "given placement",
                expected: out.len(),
                got: self.0.len(),
            }
            .into());
        }
        out.copy_from_slice(&self.0);
        Ok(())
    }
}

/// The plan for `cycle` that moves every rank from `current` to `new` (both `[L][R][S]` of
/// `shape`, every rank live), or `None` when `new` is not a valid placement.
pub fn plan_of(
    shape: Shape,
    cycle: u64,
    current: &[u16],
    new: &[u16],
) -> Option<eplb_runtime::planner::Plan> {
    let mut host = eplb_runtime::planner::PolicyHost::new(
        Box::new(Given(new.to_vec())) as Box<dyn eplb_policies::Policy + Send>,
        shape,
    );
    let loads = vec![1.0; shape.loads_len()];
    let current = eplb_core::Placement::new(shape, current).ok()?;
    let input = eplb_policies::Input::new(current, &loads, None, 0).ok()?;
    host.plan_and_take(cycle, &input).ok()
}
