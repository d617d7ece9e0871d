//! Error feedback: each send carries the quantization error of the sends before it.
//!
//! The sender keeps a residual `e`. To send `x` it encodes `t = x + e` and sets
//! `e = t − decode(encode(t))`. Whatever a send loses is added to the next, so over many
//! sends the decoded sum tracks the true sum to within one residual instead of drifting
//! by the bias of the quantizer (Seide et al. 2014; Karimireddy et al. 2019).

use super::{Codec, CodecError};

/// A residual buffer for one stream of same-sized sends.
#[derive(Debug, Clone)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
    corrected: Vec<f32>,
}

impl ErrorFeedback {
    /// Feedback for sends of `elements` elements, starting with a zero residual.
    pub fn new(elements: usize) -> ErrorFeedback {
        ErrorFeedback {
            residual: vec![0.0; elements],
            corrected: vec![0.0; elements],
        }
    }

    /// The error carried into the next send.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Forgets the carried error, e.g. after the parameters were replaced by a state sync.
    pub fn reset(&mut self) {
        self.residual.fill(0.0);
    }

    /// Encodes `src` plus the carried error into `dst` and returns the bytes written. The
    /// new residual is what this send lost. On error the residual is unchanged.
    pub fn encode(
        &mut self,
        codec: &mut Codec,
        src: &[f32],
        dst: &mut [u8],
    ) -> Result<usize, CodecError> {
        if src.len() != self.residual.len() {
            return Err(CodecError::InvalidSpec {
                reason: format!(
                    "error feedback holds {} elements but the send has {}",
                    self.residual.len(),
                    src.len()
                ),
            });
        }
        for ((t, x), e) in self.corrected.iter_mut().zip(src).zip(&self.residual) {
            *t = x + e;
        }
        let written = codec.encode(&self.corrected, dst)?;
        // corrected − decoded, in place: the decoder adds −1 × decoded.
        codec.decode_accumulate(&dst[..written], -1.0, &mut self.corrected)?;
        std::mem::swap(&mut self.residual, &mut self.corrected);
        Ok(written)
    }
}
