//! The one error type of `eplb-map`, and the small values it carries.

use core::fmt;

/// A named index of a [`Position`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Axis {
    /// A time window of heat.
    Window,
    /// A MoE layer.
    Layer,
    /// A device (EP rank).
    Device,
    /// A slot on a device.
    Slot,
    /// A logical expert.
    Expert,
}

impl Axis {
    /// The lower-case name used in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Axis::Window => "window",
            Axis::Layer => "layer",
            Axis::Device => "device",
            Axis::Slot => "slot",
            Axis::Expert => "expert",
        }
    }
}

/// Where in a document something is: up to four named indices, outermost first
/// (`window 3, layer 2, expert 17`; `layer 0, device 1, slot 4`).
///
/// An empty position is the top level of the document. Indices saturate at `u32::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    axes: [Option<Axis>; 4],
    index: [u32; 4],
}

impl Position {
    /// The top level of the document.
    pub const fn root() -> Self {
        Self {
            axes: [None; 4],
            index: [0; 4],
        }
    }

    /// This position with one more index inside it. A fifth index replaces the fourth.
    #[must_use]
    pub fn with(mut self, axis: Axis, index: usize) -> Self {
        let len = self.axes.iter().take_while(|a| a.is_some()).count();
        let at = len.min(self.axes.len() - 1);
        if let (Some(a), Some(i)) = (self.axes.get_mut(at), self.index.get_mut(at)) {
            *a = Some(axis);
            *i = u32::try_from(index).unwrap_or(u32::MAX);
        }
        self
    }

    /// The index of the given axis, if the position has it.
    pub fn get(&self, axis: Axis) -> Option<usize> {
        self.axes().find(|(a, _)| *a == axis).map(|(_, i)| i)
    }

    /// The named indices, outermost first.
    pub fn axes(&self) -> impl Iterator<Item = (Axis, usize)> + '_ {
        self.axes
            .iter()
            .zip(self.index)
            .map_while(|(a, i)| a.map(|a| (a, i as usize)))
    }

    /// Whether this is the top level.
    pub fn is_root(&self) -> bool {
        self.axes.first().is_none_or(Option::is_none)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            return f.write_str("top level");
        }
        for (i, (axis, index)) in self.axes().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} {index}", axis.name())?;
        }
        Ok(())
    }
}

/// A short copy of a string from the input (an unknown key, a wrong format tag), kept without
/// allocation: at most 24 bytes, cut at a character boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortText {
    buf: [u8; 24],
    len: u8,
    truncated: bool,
}

impl ShortText {
    /// Copies up to 24 bytes of `s`.
    pub fn new(s: &str) -> Self {
        let mut end = s.len().min(24);
        while end > 0 && !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut buf = [0u8; 24];
        let head = s.as_bytes().get(..end).unwrap_or(&[]);
        for (b, &c) in buf.iter_mut().zip(head) {
            *b = c;
        }
        Self {
            buf,
            len: end as u8,
            truncated: end < s.len(),
        }
    }

    /// The kept text.
    pub fn as_str(&self) -> &str {
        self.buf
            .get(..usize::from(self.len))
            .and_then(|b| core::str::from_utf8(b).ok())
            .unwrap_or("")
    }

    /// Whether the input was longer than what is kept.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }
}

impl fmt::Display for ShortText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())?;
        if self.truncated {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// Everything that can be wrong with an input to `eplb-map` (or with a buffer given to it).
///
/// Every variant says what is wrong and where (byte offset; layer, device, slot, expert; window).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A placement or shape that `eplb-core` rejects.
    Core(eplb_core::Error),
    /// A caller's buffer is too small.
    BufferTooSmall {
        /// What the buffer is for.
        what: &'static str,
        /// Length needed.
        needed: usize,
        /// Length given.
        got: usize,
    },
    /// A blob ends before its end.
    Truncated {
        /// Byte offset where more input was needed.
        offset: usize,
        /// What was being read.
        what: &'static str,
    },
    /// A blob does not start with the magic `EPLB`.
    BadMagic {
        /// The first (up to) four bytes found.
        found: [u8; 4],
    },
    /// A blob's format version is not one this build reads.
    UnsupportedVersion {
        /// Version found.
        found: u8,
        /// Version this build reads.
        supported: u8,
    },
    /// A varint in a blob is malformed or too large for its field.
    BadVarint {
        /// Byte offset of the varint.
        offset: usize,
        /// The field.
        what: &'static str,
    },
    /// A blob's slot count does not match its shape.
    SlotCount {
        /// `L * R * S` from the header.
        expected: u64,
        /// Count found.
        got: u64,
    },
    /// A blob's checksum does not match its content.
    Checksum {
        /// CRC-32 stored in the blob.
        stored: u32,
        /// CRC-32 of the content.
        computed: u32,
    },
    /// Bytes follow the end of a blob.
    TrailingBytes {
        /// Offset of the first extra byte.
        offset: usize,
        /// Number of extra bytes.
        count: usize,
    },
    /// The input is not JSON (or not UTF-8).
    Json {
        /// 1-based line (0 when unknown).
        line: usize,
        /// 1-based column (0 when unknown).
        column: usize,
        /// The kind of failure (`syntax error`, `unexpected end of input`, ...).
        kind: &'static str,
    },
    /// A JSON array is longer than any dimension of the format may be (checked while scanning,
    /// before the document is built).
    ArrayTooLong {
        /// Byte offset of the array's `[`.
        offset: usize,
        /// The most elements an array may hold.
        limit: usize,
    },
    /// An object holds the same key twice (strict readers refuse it: which one counts would be
    /// a guess).
    DuplicateKey {
        /// 1-based line of the second occurrence's value.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The key (shortened).
        key: ShortText,
    },
    /// A required key is missing.
    MissingKey {
        /// The object that lacks it.
        at: Position,
        /// The key.
        key: &'static str,
    },
    /// An object has a key the format does not have.
    UnknownKey {
        /// The object.
        at: Position,
        /// The key (shortened).
        key: ShortText,
    },
    /// A value has the wrong JSON type.
    WrongType {
        /// The object (or array element) holding it.
        at: Position,
        /// The key (or `element`).
        key: &'static str,
        /// What was expected.
        expected: &'static str,
    },
    /// A list that must not be empty is empty.
    Empty {
        /// Where.
        at: Position,
        /// The list.
        what: &'static str,
    },
    /// `moe_layer_count` differs from the number of layers listed.
    LayerCount {
        /// `moe_layer_count`.
        declared: u64,
        /// Entries of `layer_list`.
        listed: usize,
    },
    /// A layer's `device_count` differs from the number of devices listed.
    DeviceCount {
        /// Layer (position in `layer_list`).
        layer: usize,
        /// `device_count`.
        declared: u64,
        /// Entries of `device_list`.
        listed: usize,
    },
    /// `layer_id` is not the layer's position in `layer_list`.
    LayerIdOrder {
        /// Position in `layer_list`.
        layer: usize,
        /// `layer_id` found.
        layer_id: u64,
    },
    /// `device_id` is not the device's position in `device_list`.
    DeviceIdOrder {
        /// Layer.
        layer: usize,
        /// Position in `device_list`.
        device: usize,
        /// `device_id` found.
        device_id: u64,
    },
    /// A layer lists another number of devices than layer 0.
    RaggedLayer {
        /// Layer.
        layer: usize,
        /// Devices in this layer.
        devices: usize,
        /// Devices in layer 0.
        expected: usize,
    },
    /// A device's `device_expert` row has another length than layer 0, device 0's.
    RaggedRow {
        /// Layer.
        layer: usize,
        /// Device.
        device: usize,
        /// Slots in this row.
        slots: usize,
        /// Slots in layer 0, device 0.
        expected: usize,
    },
    /// A layer's slots cannot be split evenly over the expected number of ranks.
    SlotsNotDivisible {
        /// Layer.
        layer: usize,
        /// Slots in the layer.
        slots: usize,
        /// Ranks expected by the caller.
        ranks: usize,
    },
    /// The map lists another number of devices than the caller's rank count.
    RankMismatch {
        /// Ranks expected by the caller.
        expected: usize,
        /// Devices in the map.
        found: usize,
    },
    /// An expert id is not below `N`.
    ExpertOutOfRange {
        /// Layer.
        layer: usize,
        /// Device.
        device: usize,
        /// Slot.
        slot: usize,
        /// The id.
        expert: u64,
        /// `N`.
        experts: usize,
    },
    /// A device holds an expert twice (an error in strict mode only).
    ColocatedCopies {
        /// Layer.
        layer: usize,
        /// Device.
        device: usize,
        /// Slot of the second copy.
        slot: usize,
        /// The expert.
        expert: u16,
    },
    /// An expert is held by no device of a layer.
    MissingExpert {
        /// Layer.
        layer: usize,
        /// The expert.
        expert: usize,
    },
    /// The map has more layers than the model.
    TooManyLayers {
        /// Layers in the map.
        layers: usize,
        /// MoE layers of the model.
        model: usize,
    },
    /// The map has fewer layers than the model.
    TooFewLayers {
        /// Layers in the map.
        layers: usize,
        /// MoE layers of the model.
        model: usize,
    },
    /// A layer index past the MTP layer (vLLM-Ascend's "Invalid EPLB Table").
    LayerIndex {
        /// The index asked for.
        index: usize,
        /// Layers in the map (the MTP layer's index).
        layers: usize,
    },
    /// A dimension is too large for the format.
    TooLarge {
        /// Which dimension.
        what: &'static str,
        /// The value.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A heat input's `format` is not `eplb-trace/v1`.
    FormatTag {
        /// The tag found (shortened).
        found: ShortText,
    },
    /// A heat input is none of the known formats.
    UnknownFormat {
        /// What was found instead.
        found: &'static str,
    },
    /// A numeric array nests deeper or shallower than its format.
    Dimensions {
        /// Where the nesting is wrong.
        at: Position,
        /// Dimensions the format has.
        expected: usize,
    },
    /// A numeric array is ragged: a row has another length than the first of its level.
    RaggedArray {
        /// The short row.
        at: Position,
        /// Length of the first row of that level.
        expected: usize,
        /// Length found.
        got: usize,
    },
    /// A count is negative.
    NegativeCount {
        /// Where.
        at: Position,
    },
    /// A count that must be an integer has a fraction.
    FractionalCount {
        /// Where.
        at: Position,
    },
    /// A count is NaN or infinite.
    NonFiniteCount {
        /// Where.
        at: Position,
    },
    /// A count is `null`.
    MissingCount {
        /// Where.
        at: Position,
    },
    /// A count is not a number.
    NotANumber {
        /// Where.
        at: Position,
    },
    /// A count is an integer above 2^53, which `f64` cannot hold exactly.
    CountTooLarge {
        /// Where.
        at: Position,
    },
    /// Per-slot loads were given without the placement that folds them.
    NeedsPlacement,
    /// Per-slot loads do not have the placement's dimensions.
    ShapeMismatch {
        /// Which dimension.
        what: &'static str,
        /// From the placement.
        expected: usize,
        /// In the loads.
        got: usize,
    },
    /// Every layer of an SGLang dump is all zero.
    AllLayersZero,
}

impl From<eplb_core::Error> for Error {
    fn from(e: eplb_core::Error) -> Self {
        Error::Core(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Core(e) => write!(f, "{e}"),
            Error::BufferTooSmall { what, needed, got } => {
                write!(f, "{what}: buffer holds {got}, needs {needed}")
            }
            Error::Truncated { offset, what } => {
                write!(f, "byte {offset}: input ends inside the {what}")
            }
            Error::BadMagic { found } => write!(
                f,
                "not a placement blob: starts with {found:02x?}, expected \"EPLB\""
            ),
            Error::UnsupportedVersion { found, supported } => write!(
                f,
                "placement blob version {found} is not supported (this build reads version {supported})"
            ),
            Error::BadVarint { offset, what } => {
                write!(
                    f,
                    "byte {offset}: malformed or oversized varint in the {what}"
                )
            }
            Error::SlotCount { expected, got } => write!(
                f,
                "placement blob holds {got} slots, its shape needs {expected}"
            ),
            Error::Checksum { stored, computed } => write!(
                f,
                "placement blob checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ),
            Error::TrailingBytes { offset, count } => {
                write!(f, "byte {offset}: {count} bytes after the end of the blob")
            }
            Error::Json { line, column, kind } => {
                write!(f, "line {line}, column {column}: JSON {kind}")
            }
            Error::ArrayTooLong { offset, limit } => write!(
                f,
                "byte {offset}: an array of more than {limit} elements (more layers, experts, ranks or windows than a u16 index holds)"
            ),
            Error::DuplicateKey { line, column, key } => {
                write!(f, "line {line}, column {column}: duplicate key {key}")
            }
            Error::MissingKey { at, key } => write!(f, "{at}: missing key \"{key}\""),
            Error::UnknownKey { at, key } => write!(f, "{at}: unknown key {key}"),
            Error::WrongType { at, key, expected } => {
                write!(f, "{at}: \"{key}\" must be {expected}")
            }
            Error::Empty { at, what } => write!(f, "{at}: \"{what}\" is empty"),
            Error::LayerCount { declared, listed } => write!(
                f,
                "moe_layer_count is {declared} but layer_list holds {listed} layers"
            ),
            Error::DeviceCount {
                layer,
                declared,
                listed,
            } => write!(
                f,
                "layer {layer}: device_count is {declared} but device_list holds {listed} devices"
            ),
            Error::LayerIdOrder { layer, layer_id } => write!(
                f,
                "layer {layer}: layer_id is {layer_id}, expected {layer} (layers must be listed in order)"
            ),
            Error::DeviceIdOrder {
                layer,
                device,
                device_id,
            } => write!(
                f,
                "layer {layer}, device {device}: device_id is {device_id}, expected {device} (devices must be listed in order)"
            ),
            Error::RaggedLayer {
                layer,
                devices,
                expected,
            } => write!(
                f,
                "layer {layer}: {devices} devices, but layer 0 has {expected}"
            ),
            Error::RaggedRow {
                layer,
                device,
                slots,
                expected,
            } => write!(
                f,
                "layer {layer}, device {device}: {slots} slots, but layer 0, device 0 has {expected}"
            ),
            Error::SlotsNotDivisible {
                layer,
                slots,
                ranks,
            } => write!(
                f,
                "layer {layer}: {slots} slots cannot be split evenly over {ranks} ranks"
            ),
            Error::RankMismatch { expected, found } => {
                write!(
                    f,
                    "the map lists {found} devices, expected {expected} ranks"
                )
            }
            Error::ExpertOutOfRange {
                layer,
                device,
                slot,
                expert,
                experts,
            } => write!(
                f,
                "layer {layer}, device {device}, slot {slot}: expert {expert} out of range (must be below {experts})"
            ),
            Error::ColocatedCopies {
                layer,
                device,
                slot,
                expert,
            } => write!(
                f,
                "layer {layer}, device {device}, slot {slot}: expert {expert} is already held by this device (co-located copy)"
            ),
            Error::MissingExpert { layer, expert } => {
                write!(f, "layer {layer}: expert {expert} is held by no device")
            }
            Error::TooManyLayers { layers, model } => write!(
                f,
                "the map has {layers} layers, more than the model's {model} MoE layers"
            ),
            Error::TooFewLayers { layers, model } => write!(
                f,
                "the map has {layers} layers, fewer than the model's {model} MoE layers"
            ),
            Error::LayerIndex { index, layers } => write!(
                f,
                "layer {index}: past the map's {layers} layers and its MTP layer {layers} (invalid EPLB table)"
            ),
            Error::TooLarge { what, value, max } => {
                write!(f, "{what} is {value}, the format allows at most {max}")
            }
            Error::FormatTag { found } => {
                write!(f, "format is {found}, expected \"eplb-trace/v1\"")
            }
            Error::UnknownFormat { found } => write!(
                f,
                "not a known heat format (eplb-trace/v1, SGLang logical_count, [L][N] array, [L][R][S] slot loads): found {found}"
            ),
            Error::Dimensions { at, expected } => {
                write!(f, "{at}: the array must have exactly {expected} dimensions")
            }
            Error::RaggedArray { at, expected, got } => write!(
                f,
                "{at}: {got} entries, but the first row of this level has {expected}"
            ),
            Error::NegativeCount { at } => write!(f, "{at}: count is negative"),
            Error::FractionalCount { at } => {
                write!(f, "{at}: count has a fraction (counts must be integers)")
            }
            Error::NonFiniteCount { at } => write!(f, "{at}: count is NaN or infinite"),
            Error::MissingCount { at } => write!(f, "{at}: count is missing (null)"),
            Error::NotANumber { at } => write!(f, "{at}: count is not a number"),
            Error::CountTooLarge { at } => {
                write!(f, "{at}: count exceeds 2^53 and cannot be held exactly")
            }
            Error::NeedsPlacement => f.write_str(
                "per-slot loads [L][R][S] need a placement to fold them into expert loads",
            ),
            Error::ShapeMismatch {
                what,
                expected,
                got,
            } => write!(
                f,
                "per-slot loads have {got} {what}, the placement has {expected}"
            ),
            Error::AllLayersZero => f.write_str("every layer of the SGLang dump is all zero"),
        }
    }
}

impl core::error::Error for Error {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Error::Core(e) => Some(e),
            _ => None,
        }
    }
}
