//! `topk`: the `k` largest-magnitude elements as (index, value) pairs, compressed with zstd.
//!
//! `k = max(1, ⌈n · keep_ppm / 10⁶⌉)`. Ties in magnitude go to the lower index, so the choice
//! is deterministic. Before compression the part is `k` (`u32` LE), the sorted indices
//! delta-coded (`u32` LE; the first is absolute, every later delta is at least 1), then the
//! values (`f32` LE). Unsent elements decode as zero; with error feedback they are sent once
//! their accumulated residual ranks among the largest (Stich et al. 2018, "Sparsified SGD
//! with Memory").

use std::fmt;

use super::CodecError;
use super::finite::check_input;

const ZSTD_LEVEL: i32 = 1;

/// Elements kept out of `elements` at `keep_ppm` parts per million.
pub(super) fn kept(elements: usize, keep_ppm: u32) -> usize {
    if elements == 0 {
        return 0;
    }
    let k = (elements as u128 * u128::from(keep_ppm)).div_ceil(1_000_000);
    (k as usize).clamp(1, elements)
}

fn raw_len(k: usize) -> usize {
    4 + 8 * k
}

pub(super) fn max_encoded_len(elements: usize, keep_ppm: u32) -> usize {
    zstd::zstd_safe::compress_bound(raw_len(kept(elements, keep_ppm)))
}

/// The largest magnitude that top-k may drop: the `(k+1)`-th largest `|x|`.
pub(super) fn error_bound(src: &[f32], keep_ppm: u32) -> f32 {
    let k = kept(src.len(), keep_ppm);
    let mut magnitudes: Vec<f32> = src.iter().map(|x| x.abs()).collect();
    magnitudes.sort_unstable_by(|a, b| b.total_cmp(a));
    magnitudes.get(k).copied().unwrap_or(0.0)
}

/// Top-k state: the index scratch, the uncompressed part and zstd's contexts, all reused.
pub(super) struct TopKCodec {
    keep_ppm: u32,
    order: Vec<u32>,
    raw: Vec<u8>,
    compressor: zstd::bulk::Compressor<'static>,
    decompressor: zstd::bulk::Decompressor<'static>,
}

impl fmt::Debug for TopKCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopKCodec")
            .field("keep_ppm", &self.keep_ppm)
            .finish_non_exhaustive()
    }
}

impl TopKCodec {
    pub(super) fn new(keep_ppm: u32) -> TopKCodec {
        TopKCodec {
            keep_ppm,
            order: Vec::new(),
            raw: Vec::new(),
            // zstd allocates its contexts here, once; only a failing allocator makes it fail.
            compressor: zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("zstd compression context"),
            decompressor: zstd::bulk::Decompressor::new().expect("zstd decompression context"),
        }
    }

    pub(super) fn encode(&mut self, src: &[f32], dst: &mut [u8]) -> Result<usize, CodecError> {
        check_input(src)?;
        let Ok(n) = u32::try_from(src.len()) else {
            return Err(CodecError::InvalidSpec {
                reason: "topk parts hold at most 2^32-1 elements".into(),
            });
        };
        let k = kept(src.len(), self.keep_ppm);
        self.order.clear();
        self.order.extend(0..n);
        if k > 0 && k < src.len() {
            let magnitude = |i: &u32| src[*i as usize].to_bits() & 0x7fff_ffff;
            self.order.select_nth_unstable_by(k - 1, |a, b| {
                magnitude(b).cmp(&magnitude(a)).then(a.cmp(b))
            });
        }
        let chosen = &mut self.order[..k];
        chosen.sort_unstable();

        self.raw.clear();
        self.raw.extend_from_slice(&(k as u32).to_le_bytes());
        let mut previous = 0;
        for (j, &i) in chosen.iter().enumerate() {
            let delta = if j == 0 { i } else { i - previous };
            self.raw.extend_from_slice(&delta.to_le_bytes());
            previous = i;
        }
        for &i in chosen.iter() {
            self.raw.extend_from_slice(&src[i as usize].to_le_bytes());
        }
        self.compressor
            .compress_to_buffer(&self.raw[..], dst)
            .map_err(|_| CodecError::BufferTooSmall {
                needed: dst.len() + 1,
                available: dst.len(),
            })
    }

    pub(super) fn decode(
        &mut self,
        src: &[u8],
        out: &mut [f32],
        weight: Option<f32>,
    ) -> Result<(), CodecError> {
        let corrupt = |reason| CodecError::Corrupt {
            codec: "topk",
            reason,
        };
        let k = kept(out.len(), self.keep_ppm);
        self.raw.resize(raw_len(k), 0);
        let len = self
            .decompressor
            .decompress_to_buffer(src, &mut self.raw[..])
            .map_err(|_| corrupt("not a zstd frame of at most the expected size"))?;
        let raw = &self.raw[..len];
        if len != raw_len(k) {
            return Err(corrupt(
                "decompressed length does not match the element count",
            ));
        }
        let (count, rest) = raw.split_at(4);
        if u32::from_le_bytes([count[0], count[1], count[2], count[3]]) as usize != k {
            return Err(corrupt(
                "kept-element count does not match the codec's keep fraction",
            ));
        }
        let (deltas, values) = rest.split_at(4 * k);

        // Validate everything before touching `out`.
        let mut index = 0usize;
        for (j, d) in deltas.chunks_exact(4).enumerate() {
            let delta = u32::from_le_bytes([d[0], d[1], d[2], d[3]]) as usize;
            if j > 0 && delta == 0 {
                return Err(corrupt("indices are not strictly increasing"));
            }
            index = if j == 0 {
                delta
            } else {
                index.saturating_add(delta)
            };
            if index >= out.len() {
                return Err(corrupt("index past the end of the part"));
            }
        }
        for (j, v) in values.chunks_exact(4).enumerate() {
            if !f32::from_le_bytes([v[0], v[1], v[2], v[3]]).is_finite() {
                return Err(CodecError::NonFiniteDecoded { index: j });
            }
        }

        if weight.is_none() {
            out.fill(0.0);
        }
        let w = weight.unwrap_or(1.0);
        let mut index = 0usize;
        for (j, (d, v)) in deltas
            .chunks_exact(4)
            .zip(values.chunks_exact(4))
            .enumerate()
        {
            let delta = u32::from_le_bytes([d[0], d[1], d[2], d[3]]) as usize;
            index = if j == 0 { delta } else { index + delta };
            let value = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
            if weight.is_some() {
                out[index] += w * value;
            } else {
                out[index] = value;
            }
        }
        Ok(())
    }
}
