//! Owned placements (`std`).

use std::vec::Vec;

use eplb_core::{Placement, Shape};

use crate::Error;

/// A structurally valid placement `[L][R][S]` that owns its ids.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnedPlacement {
    shape: Shape,
    slots: Vec<u16>,
}

impl OwnedPlacement {
    /// Validates `slots` against `shape` (structural level, as [`Placement::new`]) and keeps it.
    pub fn new(shape: Shape, slots: Vec<u16>) -> Result<Self, Error> {
        Placement::new(shape, &slots)?;
        Ok(Self { shape, slots })
    }

    /// A copy of a placement view.
    pub fn from_placement(placement: &Placement<'_>) -> Self {
        Self {
            shape: *placement.shape(),
            slots: placement.as_slice().to_vec(),
        }
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The ids, `[L][R][S]` row-major.
    pub fn as_slice(&self) -> &[u16] {
        &self.slots
    }

    /// The ids, taken out.
    pub fn into_vec(self) -> Vec<u16> {
        self.slots
    }

    /// A [`Placement`] view. It is validated again (`O(L * R * S)`); it never fails for a value
    /// of this type.
    pub fn view(&self) -> Result<Placement<'_>, Error> {
        Ok(Placement::new(self.shape, &self.slots)?)
    }
}
