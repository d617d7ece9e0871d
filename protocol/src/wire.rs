//! Little-endian readers and writers over byte slices, shared by messages and identities.
//!
//! The reader never panics and never allocates: every read checks the remaining length
//! first and names the field it was reading when the input ends early.

use thiserror::Error;

/// Input ended before a field could be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("truncated input: field `{field}` needs {needed} bytes, {remaining} remain")]
pub struct Truncated {
    /// The field being read.
    pub field: &'static str,
    /// Bytes the field needs.
    pub needed: usize,
    /// Bytes that were left.
    pub remaining: usize,
}

/// A cursor over borrowed bytes.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Takes the next `len` bytes.
    pub(crate) fn bytes(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], Truncated> {
        if self.rest.len() < len {
            return Err(Truncated {
                field,
                needed: len,
                remaining: self.rest.len(),
            });
        }
        let (head, tail) = self.rest.split_at(len);
        self.rest = tail;
        Ok(head)
    }

    /// Takes the next `N` bytes as an array.
    pub(crate) fn array<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; N], Truncated> {
        let bytes = self.bytes(N, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, Truncated> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, Truncated> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, Truncated> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, Truncated> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn f32(&mut self, field: &'static str) -> Result<f32, Truncated> {
        Ok(f32::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn f64(&mut self, field: &'static str) -> Result<f64, Truncated> {
        Ok(f64::from_le_bytes(self.array(field)?))
    }

    /// Everything not yet read.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }
}

/// A cursor that writes into a caller-provided slice. Callers size the slice from an
/// `encoded_len` computed beforehand, so running out of room is a bug in that computation;
/// it is still reported, never a panic.
#[derive(Debug)]
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }

    /// Bytes written so far.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn bytes(&mut self, bytes: &[u8]) -> Result<(), BufferTooSmall> {
        let end = self.pos + bytes.len();
        let Some(dst) = self.buf.get_mut(self.pos..end) else {
            return Err(BufferTooSmall {
                needed: end,
                available: self.buf.len(),
            });
        };
        dst.copy_from_slice(bytes);
        self.pos = end;
        Ok(())
    }

    pub(crate) fn u8(&mut self, v: u8) -> Result<(), BufferTooSmall> {
        self.bytes(&[v])
    }

    pub(crate) fn u16(&mut self, v: u16) -> Result<(), BufferTooSmall> {
        self.bytes(&v.to_le_bytes())
    }

    pub(crate) fn u32(&mut self, v: u32) -> Result<(), BufferTooSmall> {
        self.bytes(&v.to_le_bytes())
    }

    pub(crate) fn u64(&mut self, v: u64) -> Result<(), BufferTooSmall> {
        self.bytes(&v.to_le_bytes())
    }

    pub(crate) fn f32(&mut self, v: f32) -> Result<(), BufferTooSmall> {
        self.bytes(&v.to_le_bytes())
    }

    pub(crate) fn f64(&mut self, v: f64) -> Result<(), BufferTooSmall> {
        self.bytes(&v.to_le_bytes())
    }
}

/// An output buffer was smaller than the encoding needs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("output buffer too small: need {needed} bytes, have {available}")]
pub struct BufferTooSmall {
    /// Bytes the encoding needs.
    pub needed: usize,
    /// Bytes the buffer has.
    pub available: usize,
}
