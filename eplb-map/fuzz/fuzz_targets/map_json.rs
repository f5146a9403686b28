//! The expert-map JSON reader: never panics; whatever it accepts, the writer writes back to a
//! map that reads as the same placement.
#![no_main]

use eplb_map::map::{self, LayerSource, ReadOptions, check_map_json, read_map_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for opts in [
        ReadOptions::strict(),
        ReadOptions::lenient(),
        ReadOptions::strict().experts(4).ranks(2).layers(2),
    ] {
        let report = check_map_json(data, &opts);
        let read = read_map_json(data, &opts);
        // The reader and the checker agree.
        assert_eq!(read.is_ok(), report.errors.is_empty());
        if let Err(e) = &read {
            assert_eq!(Some(e), report.errors.first());
            let _ = e.to_string();
        }
    }
    if let Ok(m) = read_map_json(data, &ReadOptions::lenient()) {
        let p = m.placement().view().expect("a read map is valid");
        let text = map::to_json(&p);
        let back = read_map_json(text.as_bytes(), &ReadOptions::lenient()).expect("reads back");
        assert_eq!(back.placement(), m.placement());
        let layers = m.shape().layers();
        assert!(matches!(m.layer_for_index(0), Ok(LayerSource::Table(_))));
        assert!(matches!(
            m.layer_for_index(layers),
            Ok(LayerSource::Mtp { .. })
        ));
        assert!(m.layer_for_index(layers + 1).is_err());
    }
});
