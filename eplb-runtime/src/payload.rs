//! What moves for one expert.
//!
//! An expert is not one tensor: per quant type it is a fixed, ordered set of named tensors
//! (weights, per-channel scales, scale biases, MX block scales, the fused-MC2 scales), and they
//! must move together: a layer commit never installs weights without their scales. An
//! [`ExpertPayload`] lists them with their byte sizes and their offsets into one contiguous
//! expert blob of [`ExpertPayload::total_bytes`]; a transport moves the blob as one unit (the
//! host transport: [`crate::transport::host::HostTransport::with_payload`]). The type knows
//! nothing about any transport: a total size and a tensor table.
//!
//! # Tensors per quant type (`research/vllm-ascend-eplb.md` §6)
//!
//! With `H` the hidden size and `I` the expert intermediate size, `w13` (gate and up) is
//! `2*I x H` and `w2` (down) is `H x I`. Per-channel scales are one fp32 per output channel
//! (`2*I` for `w13`, `H` for `w2`); MX block scales are one 8-bit scale per 32 elements along
//! the reduction dimension.
//!
//! | quant type | tensors (in blob order) |
//! | --- | --- |
//! | `none` | `w13_weight`, `w2_weight` (bf16); with fused MC2 the `*_list` names |
//! | `W8A8`, `W8A8-Dynamic` | `w13_weight_list`, `w2_weight_list` (int8), `w13_weight_scale_fp32_list`, `w2_weight_scale_list` (fp32); with fused MC2 also `fused_w1_scale_list`, `fused_w2_scale_list` (fp32) |
//! | `W4A8` + fused MC2 | `w13_weight_list`, `w2_weight_list` (int4, two per byte), `w13_weight_scale_list`, `w2_weight_scale_list`, `w13_scale_bias_list`, `w2_scale_bias_list` (fp32) |
//! | `MXFP4` / `MXFP8` | `w13_weight`, `w2_weight` (fp4 / fp8), `w13_weight_scale`, `w2_weight_scale` (e8m0 per 32) |
//!
//! `W4A8` without fused MC2, `W4A8MXFP4`, `W4A16` and `W4A16MXFP4` have no payload: EPLB does
//! not support them ([`crate::config::deployment`]).

use core::fmt;
use core::ops::Range;

use serde_json::{Value, json};

use crate::config::deployment::QuantType;

/// How one element of a tensor is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Element {
    /// bf16 (2 bytes).
    Bf16,
    /// int8 (1 byte).
    Int8,
    /// int4, two per byte.
    Int4,
    /// fp8 (1 byte).
    Fp8,
    /// fp4, two per byte.
    Fp4,
    /// fp32 (4 bytes).
    Fp32,
    /// e8m0 MX block scale (1 byte).
    E8m0,
    /// An opaque byte.
    Byte,
}

impl Element {
    /// Bits per element.
    pub fn bits(self) -> u64 {
        match self {
            Element::Int4 | Element::Fp4 => 4,
            Element::Int8 | Element::Fp8 | Element::E8m0 | Element::Byte => 8,
            Element::Bf16 => 16,
            Element::Fp32 => 32,
        }
    }

    /// Lower-case name (`bf16`, `int8`, `int4`, `fp8`, `fp4`, `fp32`, `e8m0`, `byte`).
    pub fn name(self) -> &'static str {
        match self {
            Element::Bf16 => "bf16",
            Element::Int8 => "int8",
            Element::Int4 => "int4",
            Element::Fp8 => "fp8",
            Element::Fp4 => "fp4",
            Element::Fp32 => "fp32",
            Element::E8m0 => "e8m0",
            Element::Byte => "byte",
        }
    }
}

/// Why a payload cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PayloadError {
    /// No tensors.
    Empty,
    /// Two tensors with one name.
    DuplicateName {
        /// The name.
        name: String,
    },
    /// A tensor of zero bytes.
    EmptyTensor {
        /// The name.
        name: String,
    },
    /// A size does not fit in `usize`.
    Overflow {
        /// The tensor whose size or offset overflowed.
        name: String,
    },
    /// A model dimension of zero.
    ZeroDim {
        /// `hidden` or `intermediate`.
        what: &'static str,
    },
    /// EPLB moves no payload for this quant type (it does not support it).
    Unsupported {
        /// The quant type.
        quant: QuantType,
        /// Whether fused MC2 is on.
        fused_mc2: bool,
    },
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayloadError::Empty => write!(f, "an expert payload needs at least one tensor"),
            PayloadError::DuplicateName { name } => {
                write!(f, "expert payload: tensor {name:?} listed twice")
            }
            PayloadError::EmptyTensor { name } => {
                write!(f, "expert payload: tensor {name:?} has no bytes")
            }
            PayloadError::Overflow { name } => {
                write!(f, "expert payload: tensor {name:?} is too large")
            }
            PayloadError::ZeroDim { what } => {
                write!(f, "model dimension {what} must be at least 1")
            }
            PayloadError::Unsupported { quant, fused_mc2 } => write!(
                f,
                "EPLB moves no expert payload for quant type {quant} {} (not supported by EPLB)",
                if *fused_mc2 {
                    "with fused MC2"
                } else {
                    "without fused MC2"
                }
            ),
        }
    }
}

impl core::error::Error for PayloadError {}

/// One named tensor of an expert: its place in the expert blob.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PayloadTensor {
    name: String,
    element: Element,
    elements: u64,
    bytes: usize,
    offset: usize,
}

impl PayloadTensor {
    /// The tensor's name (vLLM-Ascend's parameter name for the quant type).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How elements are stored.
    pub fn element(&self) -> Element {
        self.element
    }

    /// Number of elements (for [`Element::Byte`] tensors, the bytes).
    pub fn elements(&self) -> u64 {
        self.elements
    }

    /// Bytes of the tensor.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Offset of its first byte in the expert blob.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Its byte range in the expert blob.
    pub fn range(&self) -> Range<usize> {
        // `offset + bytes` was checked when the payload was built.
        self.offset..self.offset.saturating_add(self.bytes)
    }
}

/// The tensors that make up one expert, laid out back to back in one contiguous blob.
///
/// Built once ([`ExpertPayload::new`], [`ExpertPayload::from_bytes`],
/// [`ExpertPayload::for_quant`]); a payload that exists has at least one tensor, unique
/// names, no empty tensor, and a total size that fits in `usize`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExpertPayload {
    tensors: Vec<PayloadTensor>,
    total: usize,
}

fn bytes_of(name: &str, element: Element, elements: u64) -> Result<usize, PayloadError> {
    let bits = elements
        .checked_mul(element.bits())
        .ok_or_else(|| PayloadError::Overflow {
            name: name.to_owned(),
        })?;
    usize::try_from(bits.div_ceil(8)).map_err(|_| PayloadError::Overflow {
        name: name.to_owned(),
    })
}

impl ExpertPayload {
    /// A payload of typed tensors `(name, element, elements)`, in blob order.
    pub fn new<S: Into<String>>(
        tensors: impl IntoIterator<Item = (S, Element, u64)>,
    ) -> Result<Self, PayloadError> {
        let mut out: Vec<PayloadTensor> = Vec::new();
        let mut offset = 0usize;
        for (name, element, elements) in tensors {
            let name = name.into();
            if out.iter().any(|t| t.name == name) {
                return Err(PayloadError::DuplicateName { name });
            }
            let bytes = bytes_of(&name, element, elements)?;
            if bytes == 0 {
                return Err(PayloadError::EmptyTensor { name });
            }
            let end = offset
                .checked_add(bytes)
                .ok_or_else(|| PayloadError::Overflow { name: name.clone() })?;
            out.push(PayloadTensor {
                name,
                element,
                elements,
                bytes,
                offset,
            });
            offset = end;
        }
        if out.is_empty() {
            return Err(PayloadError::Empty);
        }
        Ok(Self {
            tensors: out,
            total: offset,
        })
    }

    /// A payload of opaque tensors `(name, bytes)`, in blob order (for a transport that knows
    /// its tensors only by size).
    pub fn from_bytes<S: Into<String>>(
        tensors: impl IntoIterator<Item = (S, usize)>,
    ) -> Result<Self, PayloadError> {
        Self::new(
            tensors
                .into_iter()
                .map(|(n, b)| (n, Element::Byte, b as u64)),
        )
    }

    /// The payload of one expert of a model with dimensions `dims` quantised as `quant`,
    /// with fused MC2 `fused_mc2` (the table in the module docs).
    pub fn for_quant(
        dims: ModelDims,
        quant: QuantType,
        fused_mc2: bool,
    ) -> Result<Self, PayloadError> {
        if dims.hidden == 0 {
            return Err(PayloadError::ZeroDim { what: "hidden" });
        }
        if dims.intermediate == 0 {
            return Err(PayloadError::ZeroDim {
                what: "intermediate",
            });
        }
        let h = dims.hidden;
        let i = dims.intermediate;
        let too_big = || PayloadError::Overflow {
            name: "w13".to_owned(),
        };
        let i2 = i.checked_mul(2).ok_or_else(too_big)?;
        let w13 = i2.checked_mul(h).ok_or_else(too_big)?;
        let w2 = h.checked_mul(i).ok_or_else(too_big)?;
        // MX block scales: one per 32 elements along the reduction dimension (H for w13, I for w2).
        let w13_mx = i2.checked_mul(h.div_ceil(32)).ok_or_else(too_big)?;
        let w2_mx = h.checked_mul(i.div_ceil(32)).ok_or_else(too_big)?;
        let t: Vec<(&str, Element, u64)> = match (quant, fused_mc2) {
            (QuantType::None, false) => vec![
                ("w13_weight", Element::Bf16, w13),
                ("w2_weight", Element::Bf16, w2),
            ],
            (QuantType::None, true) => vec![
                ("w13_weight_list", Element::Bf16, w13),
                ("w2_weight_list", Element::Bf16, w2),
            ],
            (QuantType::W8A8 | QuantType::W8A8Dynamic, fused) => {
                let mut v = vec![
                    ("w13_weight_list", Element::Int8, w13),
                    ("w2_weight_list", Element::Int8, w2),
                    ("w13_weight_scale_fp32_list", Element::Fp32, i2),
                    ("w2_weight_scale_list", Element::Fp32, h),
                ];
                if fused {
                    v.push(("fused_w1_scale_list", Element::Fp32, i2));
                    v.push(("fused_w2_scale_list", Element::Fp32, h));
                }
                v
            }
            (QuantType::W4A8, true) => vec![
                ("w13_weight_list", Element::Int4, w13),
                ("w2_weight_list", Element::Int4, w2),
                ("w13_weight_scale_list", Element::Fp32, i2),
                ("w2_weight_scale_list", Element::Fp32, h),
                ("w13_scale_bias_list", Element::Fp32, i2),
                ("w2_scale_bias_list", Element::Fp32, h),
            ],
            (QuantType::Mxfp4, _) => vec![
                ("w13_weight", Element::Fp4, w13),
                ("w2_weight", Element::Fp4, w2),
                ("w13_weight_scale", Element::E8m0, w13_mx),
                ("w2_weight_scale", Element::E8m0, w2_mx),
            ],
            (QuantType::Mxfp8, _) => vec![
                ("w13_weight", Element::Fp8, w13),
                ("w2_weight", Element::Fp8, w2),
                ("w13_weight_scale", Element::E8m0, w13_mx),
                ("w2_weight_scale", Element::E8m0, w2_mx),
            ],
            (
                QuantType::W4A8 | QuantType::W4A8Mxfp4 | QuantType::W4A16 | QuantType::W4A16Mxfp4,
                _,
            ) => return Err(PayloadError::Unsupported { quant, fused_mc2 }),
        };
        Self::new(t)
    }

    /// The tensors, in blob order.
    pub fn tensors(&self) -> &[PayloadTensor] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&PayloadTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Bytes of one expert blob (the sum of the tensors).
    pub fn total_bytes(&self) -> usize {
        self.total
    }

    /// Each tensor with its bytes in `blob`; `None` when `blob` is not
    /// [`ExpertPayload::total_bytes`] long.
    pub fn split<'b>(&self, blob: &'b [u8]) -> Option<Vec<(&PayloadTensor, &'b [u8])>> {
        if blob.len() != self.total {
            return None;
        }
        self.tensors
            .iter()
            .map(|t| blob.get(t.range()).map(|b| (t, b)))
            .collect()
    }

    /// The payload as JSON: `{"expert_bytes", "tensors": [{"name", "element", "bytes"}]}`.
    pub fn to_json(&self) -> Value {
        json!({
            "expert_bytes": self.total,
            "tensors": self
                .tensors
                .iter()
                .map(|t| json!({"name": t.name, "element": t.element.name(), "bytes": t.bytes}))
                .collect::<Vec<_>>(),
        })
    }
}

/// The MoE dimensions that size an expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelDims {
    /// Hidden size `H`.
    pub hidden: u64,
    /// Expert intermediate size `I`.
    pub intermediate: u64,
}

impl ModelDims {
    /// `H` and `I` of a catalogue model.
    pub fn of(model: &eplb_core::time::ModelSpec) -> ModelDims {
        ModelDims {
            hidden: u64::from(model.hidden),
            intermediate: u64::from(model.intermediate),
        }
    }
}
