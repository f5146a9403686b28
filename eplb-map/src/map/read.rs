//! The strict expert-map JSON reader.

use std::string::String;
use std::vec::Vec;

use eplb_core::{LayerPlacement, Placement, Shape};

use crate::json::Node;
use crate::{Axis, Error, OwnedPlacement, Position, ShortText, Warning};

/// What the caller knows about the model, and how to treat co-located copies.
///
/// Unknown dimensions are taken from the file: `R` from layer 0, `S` from layer 0's first device,
/// `N` as the largest id + 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadOptions {
    experts: Option<u16>,
    ranks: Option<u16>,
    layers: Option<u16>,
    allow_colocated: bool,
}

impl ReadOptions {
    /// Strict: co-located copies (an expert twice on one device) are errors (`eplb validate`).
    pub const fn strict() -> Self {
        Self {
            experts: None,
            ranks: None,
            layers: None,
            allow_colocated: false,
        }
    }

    /// Lenient: co-located copies are accepted and counted as a warning (`--current`,
    /// `hotness`, static loading). Everything else is as strict as [`strict`](Self::strict).
    pub const fn lenient() -> Self {
        Self {
            allow_colocated: true,
            ..Self::strict()
        }
    }

    /// The model's logical experts `N`: ids must be below it.
    #[must_use]
    pub const fn experts(mut self, n: u16) -> Self {
        self.experts = Some(n);
        self
    }

    /// The EP ranks `R` the map must be for.
    #[must_use]
    pub const fn ranks(mut self, r: u16) -> Self {
        self.ranks = Some(r);
        self
    }

    /// The model's MoE layers `L` (without the MTP layer): the map must have exactly `L`.
    #[must_use]
    pub const fn layers(mut self, l: u16) -> Self {
        self.layers = Some(l);
        self
    }

    /// Whether co-located copies are accepted.
    pub const fn allows_colocated(&self) -> bool {
        self.allow_colocated
    }
}

/// A map read from JSON: a structurally valid placement, and the number of `(layer, device)`
/// rows with co-located copies (0 unless read leniently).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapFile {
    placement: OwnedPlacement,
    colocated_rows: usize,
}

/// Where the placement of one constructed MoE layer comes from (vLLM-Ascend's
/// `expert_file_to_tensor`).
#[derive(Debug, Clone, Copy)]
pub enum LayerSource<'a> {
    /// The map's table for this layer.
    Table(LayerPlacement<'a>),
    /// The MTP / eagle layer (index = the map's layer count): no table; use the default layout
    /// with this many physical experts (layer 0's count, so the same `X`).
    Mtp {
        /// Physical experts per layer, `R * S`.
        physical_experts: usize,
    },
}

impl MapFile {
    /// The placement read.
    pub fn placement(&self) -> &OwnedPlacement {
        &self.placement
    }

    /// The placement, taken out.
    pub fn into_placement(self) -> OwnedPlacement {
        self.placement
    }

    /// The shape (`N` as given or inferred).
    pub fn shape(&self) -> Shape {
        self.placement.shape()
    }

    /// `(layer, device)` rows that hold some expert twice.
    pub fn colocated_rows(&self) -> usize {
        self.colocated_rows
    }

    /// The warnings of a lenient read (co-located copies), in a fixed order.
    pub fn warnings(&self) -> Vec<Warning> {
        if self.colocated_rows > 0 {
            std::vec![Warning::ColocatedCopies {
                rows: self.colocated_rows
            }]
        } else {
            Vec::new()
        }
    }

    /// The MTP rule, as an explicit call: the table of MoE layer `index` for `index < L`; for
    /// `index == L` (the MTP / eagle layer) no table but layer 0's physical count, so that the
    /// default layout is used with the same `X`; past that, [`Error::LayerIndex`].
    pub fn layer_for_index(&self, index: usize) -> Result<LayerSource<'_>, Error> {
        let shape = self.shape();
        let layers = shape.layers();
        if index < layers {
            let n = shape.slots_per_layer();
            let slots = self
                .placement
                .as_slice()
                .get(index * n..(index + 1) * n)
                .unwrap_or(&[]);
            Ok(LayerSource::Table(LayerPlacement::new(
                shape, index, slots,
            )?))
        } else if index == layers {
            Ok(LayerSource::Mtp {
                physical_experts: shape.slots_per_layer(),
            })
        } else {
            Err(Error::LayerIndex { index, layers })
        }
    }
}

/// Every problem [`check_map_json`] found, and the map when there was none.
#[derive(Debug, Clone, PartialEq)]
pub struct MapReport {
    /// The problems, in document order, then per check (at most 1000).
    pub errors: Vec<Error>,
    /// Whether more problems were found than are listed.
    pub truncated: bool,
    /// The map, when `errors` is empty.
    pub map: Option<MapFile>,
}

/// Reads an expert-map JSON; the first problem is the error.
pub fn read_map_json(bytes: &[u8], opts: &ReadOptions) -> Result<MapFile, Error> {
    let mut sink = Sink::new(1);
    let map = run(bytes, opts, &mut sink);
    match (map, sink.errors.into_iter().next()) {
        (_, Some(e)) => Err(e),
        (Some(m), None) => Ok(m),
        // The walk reports why it returns no map; keep a fallback all the same.
        (None, None) => Err(Error::Empty {
            at: Position::root(),
            what: "layer_list",
        }),
    }
}

/// Checks an expert-map JSON and lists every problem found (`eplb validate`).
///
/// The walk goes on after a problem wherever it can; structure problems (a missing list, ragged
/// rows) stop the checks of the contents.
pub fn check_map_json(bytes: &[u8], opts: &ReadOptions) -> MapReport {
    let mut sink = Sink::new(MAX_ERRORS);
    let map = run(bytes, opts, &mut sink);
    let map = if sink.errors.is_empty() { map } else { None };
    MapReport {
        errors: sink.errors,
        truncated: sink.full,
        map,
    }
}

const MAX_ERRORS: usize = 1000;

struct Sink {
    errors: Vec<Error>,
    limit: usize,
    full: bool,
}

/// The sink is full: stop walking.
struct Stop;

impl Sink {
    fn new(limit: usize) -> Self {
        Self {
            errors: Vec::new(),
            limit,
            full: false,
        }
    }

    fn push(&mut self, e: Error) -> Result<(), Stop> {
        if self.errors.len() >= self.limit {
            self.full = true;
            return Err(Stop);
        }
        self.errors.push(e);
        if self.errors.len() >= self.limit {
            // One more problem may exist; `full` says only that listing stopped.
            self.full = self.limit > 1;
            return Err(Stop);
        }
        Ok(())
    }
}

fn run(bytes: &[u8], opts: &ReadOptions, sink: &mut Sink) -> Option<MapFile> {
    let bytes = crate::json::skip_bom(bytes);
    if let Err(e) = crate::json::check_array_lengths(bytes, crate::json::MAX_ARRAY_LEN) {
        let _ = sink.push(e);
        return None;
    }
    // The compact document: an expert map's rows are arrays of integers, 8 bytes an id.
    let value: Node = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            let _ = sink.push(crate::json::syntax(&e));
            return None;
        }
    };
    if let Some(e) = crate::json::duplicate_key(bytes) {
        let _ = sink.push(e);
        return None;
    }
    walk(&value, opts, sink).ok().flatten()
}

/// `Some(u64)` for a non-negative integer, after reporting missing keys and wrong types.
fn get_u64(
    obj: &Node,
    at: Position,
    key: &'static str,
    sink: &mut Sink,
) -> Result<Option<u64>, Stop> {
    match obj.get(key) {
        None => {
            sink.push(Error::MissingKey { at, key })?;
            Ok(None)
        }
        Some(v) => match v.as_u64() {
            Some(n) => Ok(Some(n)),
            None => {
                sink.push(Error::WrongType {
                    at,
                    key,
                    expected: "a non-negative integer",
                })?;
                Ok(None)
            }
        },
    }
}

/// A non-empty array (`Node::Arr`, `Ints` or `Nums`), after reporting missing keys and wrong
/// types.
fn get_array<'v>(
    obj: &'v Node,
    at: Position,
    key: &'static str,
    sink: &mut Sink,
) -> Result<Option<&'v Node>, Stop> {
    match obj.get(key) {
        None => {
            sink.push(Error::MissingKey { at, key })?;
            Ok(None)
        }
        Some(a) => match a.array_len() {
            Some(0) => {
                sink.push(Error::Empty { at, what: key })?;
                Ok(None)
            }
            Some(_) => Ok(Some(a)),
            None => {
                sink.push(Error::WrongType {
                    at,
                    key,
                    expected: "an array",
                })?;
                Ok(None)
            }
        },
    }
}

/// Element `i` of an array: `None` for a number (an array of numbers holds no nodes).
fn element(a: &Node, i: usize) -> Option<&Node> {
    match a {
        Node::Arr(v) => v.get(i),
        _ => None,
    }
}

fn get_object<'v>(
    v: Option<&'v Node>,
    at: Position,
    key: &'static str,
    sink: &mut Sink,
) -> Result<Option<&'v Node>, Stop> {
    match v {
        Some(o @ Node::Obj(_)) => Ok(Some(o)),
        _ => {
            sink.push(Error::WrongType {
                at,
                key,
                expected: "an object",
            })?;
            Ok(None)
        }
    }
}

/// Reports keys outside `allowed` (in sorted order, so deterministically).
fn check_keys(obj: &Node, at: Position, allowed: &[&str], sink: &mut Sink) -> Result<(), Stop> {
    let Node::Obj(kv) = obj else {
        return Ok(());
    };
    let mut keys: Vec<&String> = kv.iter().map(|(k, _)| k).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        if !allowed.contains(&k.as_str()) {
            sink.push(Error::UnknownKey {
                at,
                key: ShortText::new(k),
            })?;
        }
    }
    Ok(())
}

/// The walk over the document. `Ok(None)` when a structure problem (already reported) keeps the
/// placement from being built.
fn walk(root_value: &Node, opts: &ReadOptions, sink: &mut Sink) -> Result<Option<MapFile>, Stop> {
    let root = Position::root();
    let Some(obj) = get_object(Some(root_value), root, "document", sink)? else {
        return Ok(None);
    };
    check_keys(obj, root, &["moe_layer_count", "layer_list"], sink)?;
    let declared = get_u64(obj, root, "moe_layer_count", sink)?;
    let Some(layers) = get_array(obj, root, "layer_list", sink)? else {
        return Ok(None);
    };
    let layer_count = layers.array_len().unwrap_or(0);
    if let Some(d) = declared
        && d != layer_count as u64
    {
        sink.push(Error::LayerCount {
            declared: d,
            listed: layer_count,
        })?;
    }

    let mut flat: Vec<u16> = Vec::new();
    let mut devices0: Option<usize> = None;
    let mut slots0: Option<usize> = None;
    let mut whole = true;
    for l in 0..layer_count {
        let at = root.with(Axis::Layer, l);
        let Some(lo) = get_object(element(layers, l), at, "layer_list element", sink)? else {
            whole = false;
            continue;
        };
        check_keys(lo, at, &["layer_id", "device_count", "device_list"], sink)?;
        if let Some(id) = get_u64(lo, at, "layer_id", sink)?
            && id != l as u64
        {
            sink.push(Error::LayerIdOrder {
                layer: l,
                layer_id: id,
            })?;
        }
        let declared = get_u64(lo, at, "device_count", sink)?;
        let Some(devices) = get_array(lo, at, "device_list", sink)? else {
            whole = false;
            continue;
        };
        let device_count = devices.array_len().unwrap_or(0);
        if let Some(d) = declared
            && d != device_count as u64
        {
            sink.push(Error::DeviceCount {
                layer: l,
                declared: d,
                listed: device_count,
            })?;
        }
        match devices0 {
            None => devices0 = Some(device_count),
            Some(r) if r != device_count => {
                sink.push(Error::RaggedLayer {
                    layer: l,
                    devices: device_count,
                    expected: r,
                })?;
                whole = false;
            }
            Some(_) => {}
        }
        for d in 0..device_count {
            let at = at.with(Axis::Device, d);
            let Some(dob) = get_object(element(devices, d), at, "device_list element", sink)?
            else {
                whole = false;
                continue;
            };
            check_keys(dob, at, &["device_id", "device_expert"], sink)?;
            if let Some(id) = get_u64(dob, at, "device_id", sink)?
                && id != d as u64
            {
                sink.push(Error::DeviceIdOrder {
                    layer: l,
                    device: d,
                    device_id: id,
                })?;
            }
            let Some(row) = get_array(dob, at, "device_expert", sink)? else {
                whole = false;
                continue;
            };
            let row_len = row.array_len().unwrap_or(0);
            match slots0 {
                None => slots0 = Some(row_len),
                Some(s) if s != row_len => {
                    sink.push(Error::RaggedRow {
                        layer: l,
                        device: d,
                        slots: row_len,
                        expected: s,
                    })?;
                    whole = false;
                }
                Some(_) => {}
            }
            for s in 0..row_len {
                match row.u64_at(s).flatten() {
                    Some(e) => match u16::try_from(e) {
                        Ok(e) => flat.push(e),
                        Err(_) => {
                            sink.push(Error::ExpertOutOfRange {
                                layer: l,
                                device: d,
                                slot: s,
                                expert: e,
                                experts: opts.experts.map_or(usize::from(u16::MAX), usize::from),
                            })?;
                            whole = false;
                        }
                    },
                    None => {
                        sink.push(Error::WrongType {
                            at: at.with(Axis::Slot, s),
                            key: "device_expert",
                            expected: "expert ids (non-negative integers)",
                        })?;
                        whole = false;
                    }
                }
            }
        }
    }
    let (Some(r), Some(s), true) = (devices0, slots0, whole) else {
        return Ok(None);
    };
    check_contents(&flat, layer_count, r, s, opts, sink)
}

fn narrow(what: &'static str, v: usize) -> Result<u16, Error> {
    u16::try_from(v).map_err(|_| Error::TooLarge {
        what,
        value: v as u64,
        max: u64::from(u16::MAX),
    })
}

/// The checks of a rectangular `[L][R][S]` map: counts against the model, id range, co-located
/// copies, missing experts, then the core's shape and placement checks.
fn check_contents(
    flat: &[u16],
    l: usize,
    r: usize,
    s: usize,
    opts: &ReadOptions,
    sink: &mut Sink,
) -> Result<Option<MapFile>, Stop> {
    let mut ok = true;
    if let Some(model) = opts.layers.map(usize::from) {
        if l > model {
            sink.push(Error::TooManyLayers { layers: l, model })?;
            ok = false;
        } else if l < model {
            sink.push(Error::TooFewLayers { layers: l, model })?;
            ok = false;
        }
    }
    if let Some(want) = opts.ranks.map(usize::from)
        && want != r
    {
        let slots = r * s;
        if want == 0 || !slots.is_multiple_of(want) {
            sink.push(Error::SlotsNotDivisible {
                layer: 0,
                slots,
                ranks: want,
            })?;
        } else {
            sink.push(Error::RankMismatch {
                expected: want,
                found: r,
            })?;
        }
        ok = false;
    }
    let n = match opts.experts {
        Some(n) => usize::from(n),
        None => flat.iter().max().map_or(0, |&m| usize::from(m) + 1),
    };
    for (what, v) in [
        ("layers", l),
        ("devices", r),
        ("slots per device", s),
        ("experts", n),
    ] {
        if let Err(e) = narrow(what, v) {
            sink.push(e)?;
            return Ok(None);
        }
    }
    let per_layer = r * s;
    // stamp[e] = 1 + the row that last saw e (co-located copies); seen[e] = layer + 1.
    let mut stamp = std::vec![0usize; n];
    let mut seen = std::vec![0usize; n];
    let mut colocated_rows = 0usize;
    for (li, layer) in flat.chunks_exact(per_layer).enumerate() {
        for (d, row) in layer.chunks_exact(s).enumerate() {
            let row_id = 1 + li * r + d;
            let mut counted = false;
            for (si, &e) in row.iter().enumerate() {
                let ei = usize::from(e);
                let (Some(st), Some(sn)) = (stamp.get_mut(ei), seen.get_mut(ei)) else {
                    sink.push(Error::ExpertOutOfRange {
                        layer: li,
                        device: d,
                        slot: si,
                        expert: u64::from(e),
                        experts: n,
                    })?;
                    ok = false;
                    continue;
                };
                *sn = li + 1;
                if *st == row_id {
                    if opts.allow_colocated {
                        if !counted {
                            colocated_rows += 1;
                            counted = true;
                        }
                    } else {
                        sink.push(Error::ColocatedCopies {
                            layer: li,
                            device: d,
                            slot: si,
                            expert: e,
                        })?;
                        ok = false;
                    }
                }
                *st = row_id;
            }
        }
        for (e, &sn) in seen.iter().enumerate() {
            if sn != li + 1 {
                sink.push(Error::MissingExpert {
                    layer: li,
                    expert: e,
                })?;
                ok = false;
            }
        }
    }
    if !ok {
        return Ok(None);
    }
    let built = (|| -> Result<OwnedPlacement, Error> {
        let shape = Shape::new(
            narrow("layers", l)?,
            narrow("experts", n)?,
            narrow("devices", r)?,
            narrow("slots per device", s)?,
        )?;
        OwnedPlacement::new(shape, flat.to_vec())
    })();
    match built {
        Ok(placement) => {
            if colocated_rows > 0 {
                log::debug!(
                    "expert map read leniently: {colocated_rows} rows with co-located copies"
                );
            }
            Ok(Some(MapFile {
                placement,
                colocated_rows,
            }))
        }
        Err(e) => {
            sink.push(e)?;
            Ok(None)
        }
    }
}

impl MapFile {
    /// A view of the placement (validated again; never fails for a value of this type).
    pub fn view(&self) -> Result<Placement<'_>, Error> {
        self.placement.view()
    }
}
