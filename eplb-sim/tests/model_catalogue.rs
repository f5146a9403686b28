//! One model catalogue (issue 37, class 4): `docs/time-model.md`'s model table is the
//! catalogue's (`ModelSpec::ALL`), and a named model is resolved as the inferred one.

use eplb_core::time::{Dtype, ModelSpec};
use eplb_runtime::config::deployment::QuantType;
use eplb_sim::cost::{CostSpec, parse_model};

fn doc_rows() -> Vec<Vec<String>> {
    let path = format!("{}/../docs/time-model.md", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let start = text
        .find("## Model presets")
        .expect("docs/time-model.md has a \"Model presets\" section");
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| preset"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

#[test]
fn the_docs_model_table_is_the_catalogue() {
    let rows = doc_rows();
    assert_eq!(rows.len(), ModelSpec::ALL.len(), "{rows:?}");
    for (row, m) in rows.iter().zip(ModelSpec::ALL) {
        let names = if m.aliases.is_empty() {
            format!("`{}`", m.name)
        } else {
            format!(
                "`{}` ({})",
                m.name,
                m.aliases
                    .iter()
                    .map(|a| format!("`{a}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        assert_eq!(row[0], names);
        let numbers = [
            m.hidden,
            m.intermediate,
            u32::from(m.experts),
            u32::from(m.top_k),
            u32::from(m.moe_layers),
            u32::from(m.shared_experts),
        ];
        for (i, n) in numbers.iter().enumerate() {
            assert_eq!(row[i + 1], n.to_string(), "{} column {}", m.name, i + 1);
        }
        let dtype = match m.dtype {
            Dtype::Bf16 => "bf16",
            Dtype::Int8 => "int8 (W8A8)",
            other => panic!("{}: a dtype the table does not name: {other:?}", m.name),
        };
        assert_eq!(row[7], dtype, "{}", m.name);
        // Every name and alias finds the entry.
        for n in core::iter::once(m.name).chain(m.aliases.iter().copied()) {
            assert_eq!(ModelSpec::from_name(&n.to_ascii_uppercase()), Some(m));
            assert_eq!(parse_model(n).unwrap(), m);
        }
    }
}

#[test]
fn a_named_model_resolves_as_the_inferred_one() {
    for m in ModelSpec::ALL {
        let inferred = CostSpec::default().resolve_for_trace(Some(m)).unwrap();
        let named = CostSpec {
            model: Some(m),
            ..CostSpec::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(named.payload, inferred.payload, "{}", m.name);
        assert_eq!(named.quant, inferred.quant, "{}", m.name);
        assert_eq!(named.preset, inferred.preset);
        assert_eq!(named.quant, QuantType::checkpoint(&m));
    }
    let e = parse_model("dsv4").unwrap_err().to_string();
    assert!(e.contains("deepseek-v3, kimi-k2"), "{e}");
}
