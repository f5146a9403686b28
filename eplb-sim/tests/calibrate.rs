//! `eplb_sim::calibrate`: the fit recovers multipliers hidden in generated measurements, and
//! the measured-points reader names what is wrong.

use eplb_core::time::Role;
use eplb_core::time::step::{Calibration, Overlap};
use eplb_sim::calibrate::{Measured, fit, predict, read_measured};
use eplb_sim::cost::CostSpec;
use eplb_sim::time::TimeSpec;

fn points() -> Vec<Measured> {
    let mut v = Vec::new();
    for ranks in [8u16, 32] {
        for t in [16.0, 64.0, 256.0] {
            for ctx in [1024.0, 8192.0] {
                for par in [1.0, 1.6] {
                    v.push(Measured {
                        role: Role::Decode,
                        ranks,
                        tokens_per_rank: t,
                        context_tokens: Some(ctx),
                        prompt_tokens: None,
                        par,
                        step_ms: 0.0,
                    });
                }
            }
        }
        v.push(Measured {
            role: Role::Prefill,
            ranks,
            tokens_per_rank: 8192.0,
            context_tokens: None,
            prompt_tokens: Some(2048.0),
            par: 1.3,
            step_ms: 0.0,
        });
    }
    v
}

/// Fits multipliers hidden in generated points; `identifiable` names the ones the points
/// must pin down within 5 % (with two-batch overlap the all-to-all is hidden behind compute on
/// these shapes, so its constants do not change the step and cannot be recovered; the fit
/// must still reproduce every point).
fn recover(overlap: Overlap, identifiable: &[&str]) {
    let cost = CostSpec::default().resolve().unwrap();
    let spec = TimeSpec {
        hardware: Some("h800".to_owned()),
        overlap: Some(overlap),
        ..TimeSpec::default()
    };
    let hidden = Calibration {
        host: 1.7,
        backbone: 1.2,
        gemm: 1.4,
        link: 0.8,
        latency: 2.0,
    };
    let mut pts = points();
    for p in &mut pts {
        p.step_ms = predict(&spec, &cost, Some(8), p, &hidden).unwrap();
    }
    let f = fit(&spec, &cost, Some(8), &pts).unwrap();
    for ((name, got), want) in Calibration::NAMES
        .iter()
        .zip(f.calibration.as_array())
        .zip(hidden.as_array())
    {
        if !identifiable.contains(name) {
            continue;
        }
        assert!(
            (got / want - 1.0).abs() < 0.05,
            "{overlap:?} {name}: fitted {got}, hidden {want} ({:?})",
            f.calibration
        );
    }
    assert!(f.max_rel < 0.01, "{f:?}");
    assert_eq!(f.residuals.len(), pts.len());
}

#[test]
fn the_fit_recovers_hidden_constants_within_5_percent() {
    recover(Overlap::None, &Calibration::NAMES);
}

#[test]
fn the_fit_recovers_hidden_constants_with_two_batch_overlap() {
    recover(Overlap::TwoBatch, &["host", "backbone", "gemm"]);
}

#[test]
fn measured_points_read_from_json_and_csv_and_bad_ones_are_named() {
    let json = br#"{"points": [{"role": "decode", "tokens_per_rank": 64, "context_tokens": 2048, "step_ms": 30.5},
                   {"role": "prefill", "ranks": 16, "tokens_per_rank": 8192, "prompt_tokens": 4096, "par": 1.2, "step_ms": 900}]}"#;
    let p = read_measured(json, "m.json", 32).unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!((p[0].ranks, p[0].par), (32, 1.0));
    assert_eq!((p[1].ranks, p[1].par, p[1].role), (16, 1.2, Role::Prefill));
    let csv = b"role,ranks,tokens_per_rank,context_tokens,prompt_tokens,par,step_ms\ndecode,8,32,4096,,1.0,20\nprefill,,4096,,2048,,500\n";
    let p = read_measured(csv, "m.csv", 32).unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!((p[1].ranks, p[1].prompt_tokens), (32, Some(2048.0)));
    for (bad, want) in [
        (&b"[]"[..], "no measured point"),
        (
            b"[{\"role\": \"x\", \"tokens_per_rank\": 1, \"step_ms\": 1}]",
            "role",
        ),
        (
            b"[{\"role\": \"decode\", \"step_ms\": 1}]",
            "tokens_per_rank is missing",
        ),
        (
            b"[{\"role\": \"decode\", \"tokens_per_rank\": 8, \"step_ms\": -1}]",
            "must be > 0",
        ),
        (
            b"[{\"role\": \"decode\", \"tokens_per_rank\": 8, \"step_ms\": 1, \"par\": 0.5}]",
            "par",
        ),
        (b"role,step_ms\ndecode", "cells"),
        (b"{\"x\": 1}", "points"),
    ] {
        let e = read_measured(bad, "m", 32).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

/// A heat recording whose windows carry `iteration_ms` is a calibration input: its points are
/// the windows' shapes and times, and the fit on it is the fit on the same points given as
/// measured points.
#[test]
fn a_heat_recording_with_iteration_times_is_a_calibration_input() {
    use eplb_sim::calibrate::{RecordingDefaults, read_recording};
    let cost = CostSpec::default().resolve().unwrap();
    let spec = TimeSpec {
        hardware: Some("h800".to_owned()),
        ..TimeSpec::default()
    };
    let hidden = Calibration {
        host: 1.7,
        backbone: 1.2,
        gemm: 1.4,
        link: 0.8,
        latency: 2.0,
    };
    let (ranks, k, n) = (8u16, 8u64, 256usize);
    let header = r#"{"format":"eplb-trace/v1","layout":"lines","model":{"num_moe_layers":2,"num_experts":256},"topology":{"ranks":8,"slots_per_rank":32},"intervals":{"iterations_per_window":2}}"#;
    let mut text = format!("{header}\n");
    let mut want = Vec::new();
    for (i, t) in [16u64, 64, 256, 1024].into_iter().enumerate() {
        // Two iterations per window, every expert alike (contiguous PAR 1); the last window
        // says its PAR itself.
        let per_expert = 2 * t * k * u64::from(ranks) / n as u64;
        let layer = format!("[{}]", vec![per_expert.to_string(); n].join(","));
        let par = if i == 3 { 1.5 } else { 1.0 };
        let mut m = Measured {
            role: Role::Decode,
            ranks,
            tokens_per_rank: t as f64,
            context_tokens: None,
            prompt_tokens: None,
            par,
            step_ms: 0.0,
        };
        m.step_ms = predict(&spec, &cost, Some(8), &m, &hidden).unwrap();
        let par_field = if i == 3 { r#""par":1.5,"# } else { "" };
        text.push_str(&format!(
            "{{\"cycle\":{i},\"iteration_ms\":{},{par_field}\"counts\":[{layer},{layer}]}}\n",
            m.step_ms
        ));
        // A window without a time is skipped.
        text.push_str(&format!("{{\"cycle\":{i},\"counts\":[{layer},{layer}]}}\n"));
        want.push(m);
    }
    // A recorder cut off mid-line.
    text.push_str(r#"{"cycle":9,"iteration_ms":5,"counts":[[1,"#);
    let defaults = RecordingDefaults {
        role: Some(Role::Decode),
        ranks: 1,
        top_k: 8,
    };
    let got = read_recording(text.as_bytes(), "rec.jsonl", defaults)
        .unwrap()
        .unwrap();
    assert_eq!(got, want);
    let from_recording = fit(&spec, &cost, Some(8), &got).unwrap();
    assert_eq!(from_recording, fit(&spec, &cost, Some(8), &want).unwrap());
    assert!(from_recording.max_rel < 0.01, "{from_recording:?}");

    // Measured points and CSVs are not recordings.
    let json = br#"[{"role": "decode", "tokens_per_rank": 64, "step_ms": 20}]"#;
    assert_eq!(read_recording(json, "m.json", defaults).unwrap(), None);
    assert_eq!(
        read_recording(
            b"role,tokens_per_rank,step_ms\ndecode,64,20\n",
            "m.csv",
            defaults
        )
        .unwrap(),
        None
    );
    // What is wrong is named.
    let err = |bytes: &[u8], d: RecordingDefaults| {
        read_recording(bytes, "rec.jsonl", d)
            .unwrap_err()
            .to_string()
    };
    let no_role = RecordingDefaults {
        role: None,
        ..defaults
    };
    assert!(
        err(text.as_bytes(), no_role).contains("--role"),
        "{}",
        err(text.as_bytes(), no_role)
    );
    let untimed = format!("{header}\n{{\"counts\":[[1,2],[3,4]]}}\n");
    assert!(
        err(untimed.as_bytes(), defaults)
            .contains("no window of the recording carries iteration_ms")
    );
    let one_object = br#"{"format": "eplb-trace/v1", "counts": [[[1, 2]]]}"#;
    assert!(err(one_object, defaults).contains("one-object layout"));
    let bad_time = format!("{header}\n{{\"iteration_ms\":-1,\"counts\":[[1,2]]}}\n");
    assert!(
        err(bad_time.as_bytes(), defaults)
            .contains("line 2: iteration_ms must be a finite number > 0")
    );
}
