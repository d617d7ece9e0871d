//! An edge's reference vector, kept in 16 bits an element ([`Vector16`]): about half the
//! bytes of the parameters.
//!
//! Both ends of an edge round the same `f32` values with the same operations, so they hold
//! the same bits. The rounding is never part of the mass a share moves (that is
//! `r + Q⁻¹(Q(z − r))`, computed in `f32` from these bits), only of the next share's
//! deviation `z − r`, which carries it back. It costs at most half a step, 2⁻¹⁶ of the
//! block's largest magnitude, and the share's codec then quantizes that residue with its
//! own error: with `int8` another 2⁻⁸ of it, about `f32`'s resolution of the parameters. A
//! `bf16` reference would have left up to 2⁻⁹ of each element for the next share: 128
//! times as much at a block's largest element.

pub(crate) use crate::vector16::{BLOCK as REFERENCE_BLOCK, Vector16 as Reference};

/// Bytes a reference of `len` elements takes.
pub(crate) fn reference_bytes(len: usize) -> u64 {
    crate::vector16::vector16_bytes(len)
}
