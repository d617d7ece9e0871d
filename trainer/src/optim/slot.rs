//! One slot of an optimizer's state, in `f32` or in 8-bit codes.

use murmur_protocol::snapshot_file::{ReadValues, TensorData};

use super::moment_codes::{MomentCodes, MomentKind};

/// A state slot: a vector laid out like the parameters (a momentum, one of Adam's moments).
#[derive(Debug, Clone, PartialEq)]
pub enum Slot {
    /// `f32` values.
    Floats(Vec<f32>),
    /// 8-bit block-wise codes ([`MomentCodes`]).
    Codes(MomentCodes),
}

impl Default for Slot {
    fn default() -> Slot {
        Slot::Floats(Vec::new())
    }
}

impl Slot {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Slot::Floats(values) => values.len(),
            Slot::Codes(codes) => codes.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the slot's values occupy.
    pub fn bytes(&self) -> usize {
        match self {
            Slot::Floats(values) => std::mem::size_of_val(values.as_slice()),
            Slot::Codes(codes) => codes.bytes(),
        }
    }

    /// The values, when they are `f32`s.
    pub fn floats(&self) -> Option<&[f32]> {
        match self {
            Slot::Floats(values) => Some(values),
            Slot::Codes(_) => None,
        }
    }

    /// The values as `f32`s, copied (decoded).
    pub fn to_vec(&self) -> Vec<f32> {
        match self {
            Slot::Floats(values) => values.clone(),
            Slot::Codes(codes) => {
                let mut values = vec![0.0; codes.len()];
                codes.read(0, &mut values);
                values
            }
        }
    }

    /// The values as a snapshot reads them: `f32`s as they are, codes decoded a run at a time.
    pub fn data(&self) -> TensorData<'_> {
        match self {
            Slot::Floats(values) => TensorData::Floats(values),
            Slot::Codes(_) => TensorData::Read(self),
        }
    }

    /// `values` in the form `like` keeps its own: `f32`s, or coded as `like`'s codes are.
    pub(crate) fn shaped_like(like: &Slot, values: Vec<f32>) -> Slot {
        match like {
            Slot::Floats(_) => Slot::Floats(values),
            Slot::Codes(codes) => Slot::Codes(MomentCodes::from_values(codes.kind(), &values)),
        }
    }

    /// `len` zeros, in `f32` or coded as `kind` says.
    pub(crate) fn zeros(kind: Option<MomentKind>, len: usize) -> Slot {
        match kind {
            None => Slot::Floats(vec![0.0; len]),
            Some(kind) => Slot::Codes(MomentCodes::zeros(kind, len)),
        }
    }

    /// Sets the values to `values` (as long as the slot), in the slot's form.
    pub(crate) fn assign(&mut self, values: &[f32]) {
        match self {
            Slot::Floats(own) => own.copy_from_slice(values),
            Slot::Codes(codes) => *codes = MomentCodes::from_values(codes.kind(), values),
        }
    }
}

impl ReadValues for Slot {
    fn len(&self) -> usize {
        Slot::len(self)
    }

    fn read_values(&self, start: usize, out: &mut [f32]) {
        match self {
            Slot::Floats(values) => out.copy_from_slice(&values[start..start + out.len()]),
            Slot::Codes(codes) => codes.read(start, out),
        }
    }
}
