//! The heat readers (trace, SGLang dump, plain array, slot loads) and the sniffer: never panic;
//! accepted heat is finite and non-negative.
#![no_main]

use eplb_core::{Layout, Placement, Shape};
use eplb_map::heat::{self, HeatFormat};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let shape = Shape::new(2, 4, 2, 3).expect("shape");
    let mut slots = [0u16; 12];
    Layout::Default.fill(&shape, &mut slots).expect("layout");
    let p = Placement::new(shape, &slots).expect("placement");
    let sniffed = heat::sniff(data);
    for placement in [None, Some(&p)] {
        match heat::load_heat(data, placement) {
            Ok(h) => {
                assert_eq!(sniffed.as_ref().ok(), Some(&h.format()));
                assert_eq!(h.as_slice().len(), h.windows() * h.layers() * h.experts());
                assert!(h.as_slice().iter().all(|v| v.is_finite() && *v >= 0.0));
                assert!(h.summed().iter().all(|v| v.is_finite()));
                assert_eq!(h.layer_ids().len(), h.layers());
                if h.format() == HeatFormat::Trace {
                    assert!(h.is_integral());
                }
                for w in h.warnings() {
                    let _ = w.to_string();
                }
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
});
