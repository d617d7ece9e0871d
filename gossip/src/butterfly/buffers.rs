//! The vector-sized memory of a butterfly round, handed from one round to the next.

use murmur_protocol::codec::{Codec, CodecError, CodecSpec};

use super::norm::squared_norm;
use crate::vector16::Vector16;

/// The memory a [`ButterflyRound`](super::ButterflyRound) works in: the member's
/// contribution, which the round averages in place into its result, and the reducer's
/// running sums and encoded averages.
///
/// A round takes it in [`ButterflyRound::new`](super::ButterflyRound::new) and gives it
/// back with [`ButterflyRound::into_buffers`](super::ButterflyRound::into_buffers), so that
/// a member averaging round after round allocates nothing of the vector's size after the
/// first round, and touches no fresh pages while other members still wait on it. A plain
/// `Vec<f32>` converts into buffers that hold it as the contribution and nothing else.
#[derive(Debug, Default)]
pub struct RoundBuffers {
    /// Handed in: the member's contribution, which the round averages in place (it comes
    /// back as `result`). Given back: the memory that was handed in as `result`, untouched,
    /// for the next contribution.
    pub local: Vec<f32>,
    /// Given back: the averaged vector (the contribution, with every average written over
    /// it and local values wherever the round could not average). Handed in: spare memory
    /// the round does not use and gives back as `local`.
    pub result: Vec<f32>,
    /// The reducer's weighted sums of the part this member reduces.
    pub(crate) sum: Vec<f32>,
    /// The encoded averages of that part.
    pub(crate) averages: Vec<u8>,
    /// Error feedback, carried from round to round; `None` sends every chunk as the codec
    /// encodes it, with no correction.
    pub feedback: Option<Residuals>,
}

/// The quantization error a member carries into its next round's sends (error feedback:
/// Seide et al. 2014; Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
/// Compression Schemes", ICML 2019).
///
/// Both vectors are indexed like the averaged vector, so they stay valid when the next
/// round's group or partition differs. Before a chunk goes out, its residual is added to
/// it; after, the residual holds what the encoding lost. With a lossless codec (`f32`) the
/// residuals stay zero.
///
/// They are kept in 16 bits an element (blocks of 64 sharing a scale): storing loses at
/// most half a step, 2⁻¹⁶ of the block's largest residual, where the residual itself is
/// already the codec's error (with `int8`, up to 2⁻⁸ of the chunk's largest value). In
/// `f32` the two vectors took twice the parameters' bytes, the largest part of a butterfly
/// member's round memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Residuals {
    /// What the member's part chunks (its contribution to the other reducers) lost.
    pub(crate) parts: Vector16,
    /// What the averages of the parts this member reduced lost.
    pub(crate) averages: Vector16,
}

impl Residuals {
    /// Residuals for vectors of `len` elements, all zero. Their pages take memory only as
    /// rounds write them, chunk by chunk: a member stores a part residual for the elements
    /// it sends to other reducers and an average residual for those it reduces, so while its
    /// group's partition stays the same (two peers, or a swarm whose groups do not change)
    /// each element is written in one of the two, and both hold about half the parameters'
    /// bytes, not twice that. As the partition moves, more of both is written, up to the
    /// whole of each.
    pub fn zeros(len: usize) -> Residuals {
        Residuals {
            parts: Vector16::zeros(len),
            averages: Vector16::zeros(len),
        }
    }

    /// Makes both `len` elements long; new elements are zero.
    pub(crate) fn resize(&mut self, len: usize) {
        self.parts.resize(len);
        self.averages.resize(len);
    }
}

/// What error feedback carried in one round's sends: the squared L2 norms of the values
/// encoded (each chunk with the residual before it added) and of what their encoding lost,
/// which the next round's sends of the same elements add back.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FeedbackTally {
    /// `Σ (x + r)²` over the elements encoded with error feedback.
    pub encoded_squared: f64,
    /// `Σ r'²`, the residuals left for the next round.
    pub carried_squared: f64,
}

impl FeedbackTally {
    /// `‖carried‖ / ‖encoded‖`: the fraction of what this member sent that its codec lost
    /// and error feedback carries into the next round; `None` when nothing was encoded
    /// with feedback (it is off, the codec is lossless, or nothing was sent).
    pub fn carried_ratio(&self) -> Option<f64> {
        (self.encoded_squared > 0.0).then(|| (self.carried_squared / self.encoded_squared).sqrt())
    }
}

/// Encodes `values + residual` into `buffer` and sets `residual` to what the encoding lost;
/// returns the bytes written (0, with the residual unchanged, if the encoding failed; see
/// `ButterflyRound`'s plain encoding). The residual is elements `start..` of `residuals`;
/// `corrected` is scratch space. `tally` counts what was encoded and what was carried.
pub(crate) fn encode_corrected(
    codec: &mut Codec,
    values: &[f32],
    (residuals, start): (&mut Vector16, usize),
    (corrected, tally): (&mut Vec<f32>, &mut FeedbackTally),
    buffer: &mut [u8],
) -> usize {
    corrected.clear();
    corrected.resize(values.len(), 0.0);
    residuals.read_range(start, corrected);
    for (c, x) in corrected.iter_mut().zip(values) {
        *c += x;
    }
    let Ok(len) = codec.encode(corrected, buffer) else {
        return 0;
    };
    tally.encoded_squared += squared_norm(corrected);
    // residual = corrected − decode(encoded): the decoder adds −1 × decoded in place.
    if codec
        .decode_accumulate(&buffer[..len], -1.0, corrected)
        .is_err()
    {
        corrected.fill(0.0);
    }
    tally.carried_squared += squared_norm(corrected);
    residuals.store_range(start, corrected);
    len
}

impl From<Vec<f32>> for RoundBuffers {
    fn from(local: Vec<f32>) -> RoundBuffers {
        RoundBuffers {
            local,
            ..RoundBuffers::default()
        }
    }
}

impl RoundBuffers {
    /// The buffers holding `local`, with error feedback on.
    pub fn with_feedback(local: Vec<f32>) -> RoundBuffers {
        RoundBuffers {
            feedback: Some(Residuals::zeros(local.len())),
            local,
            ..RoundBuffers::default()
        }
    }

    /// The memory a member's first round of a `len`-element vector works in (everything
    /// but the contribution, which is also where the result is written), allocated and
    /// written now: the running sums and encoded averages of an own part of about
    /// `part_len` elements in chunks of `chunk_elements`, encoded with `codec`, and, with
    /// `error_feedback`, the residuals (zeros whose pages are not made resident: see
    /// [`Residuals::zeros`]).
    ///
    /// A round finding this memory only overwrites it. Otherwise its first round faults in
    /// fresh pages as it writes them, inside the engine's turns: at 500M elements 13.7 s of
    /// page faults in one member's first round, long enough for the other to give it up as
    /// silent. A peer makes these before it meets the swarm, so nobody waits on it.
    /// A part larger than `part_len` grows its buffers in its round, as without them.
    pub fn resident(
        len: usize,
        part_len: usize,
        chunk_elements: usize,
        codec: CodecSpec,
        error_feedback: bool,
    ) -> Result<RoundBuffers, CodecError> {
        let codec = Codec::new(codec)?;
        // Parts are cut in whole chunks (`Partition::from_fractions`).
        let chunk = chunk_elements.max(1);
        let part_len = part_len.next_multiple_of(chunk).min(len);
        let stride = codec.max_encoded_len(chunk.min(part_len));
        // Unclipped `f32` averages are sent from the sums (`ButterflyRound`'s
        // `averages_in_sum`); a clipping round grows this memory in its round.
        let averages = if codec.spec() == CodecSpec::F32 && cfg!(target_endian = "little") {
            0
        } else {
            part_len.div_ceil(chunk) * stride
        };
        Ok(RoundBuffers {
            local: Vec::new(),
            result: Vec::new(),
            sum: resident_zeros(part_len),
            averages: resident_zeros(averages),
            feedback: error_feedback.then(|| Residuals::zeros(len)),
        })
    }
}

/// `len` zeros whose pages are all resident: `vec![0; len]` of a large length maps fresh
/// zero pages that are faulted in only when first written, so one write per page does it
/// now. The value written passes through `black_box`, so the write is not dropped as one of
/// what the memory already holds.
fn resident_zeros<T: Copy + Default>(len: usize) -> Vec<T> {
    const PAGE_BYTES: usize = 4096;
    let mut values = vec![T::default(); len];
    let stride = (PAGE_BYTES / std::mem::size_of::<T>().max(1)).max(1);
    for value in values.iter_mut().step_by(stride) {
        *value = std::hint::black_box(T::default());
    }
    values
}

#[cfg(test)]
mod tests {
    use murmur_protocol::codec::CodecSpec;

    use super::RoundBuffers;
    use crate::Time;
    use crate::butterfly::{
        ButterflyConfig, ButterflyRound, Group, Partition, RoundInput, RoundOutput,
    };

    const LEN: usize = 1000;
    const CODEC: CodecSpec = CodecSpec::Int8 { block: 64 };

    fn config() -> ButterflyConfig {
        ButterflyConfig {
            chunk_elements: 128,
            chunks_in_flight: 2,
            ..ButterflyConfig::default()
        }
    }

    fn local(member: usize, round: usize) -> Vec<f32> {
        (0..LEN)
            .map(|e| ((member * 7 + round * 3 + e) as f32 * 0.013).sin() * (member + 1) as f32)
            .collect()
    }

    fn start(n: usize, buffers: Vec<RoundBuffers>) -> Vec<ButterflyRound<u32>> {
        start_with(CODEC, n, buffers)
    }

    fn start_with(
        codec: CodecSpec,
        n: usize,
        buffers: Vec<RoundBuffers>,
    ) -> Vec<ButterflyRound<u32>> {
        let partition = Partition::equal(LEN, n, 64).expect("valid partition");
        let group = Group::new(1, 7, (0..n as u32).collect(), partition).expect("valid group");
        buffers
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                let round = ButterflyRound::new(
                    i as u32,
                    group.clone(),
                    b,
                    (i + 1) as f32,
                    codec,
                    &config(),
                    Time::ZERO,
                );
                round.expect("valid round")
            })
            .collect()
    }

    /// Delivers outputs until nothing moves, dropping those `deliver(from, to, averaged)`
    /// refuses.
    fn exchange(rounds: &mut [ButterflyRound<u32>], deliver: impl Fn(usize, usize, bool) -> bool) {
        exchange_with(CODEC, rounds, deliver);
    }

    fn exchange_with(
        codec: CodecSpec,
        rounds: &mut [ButterflyRound<u32>],
        deliver: impl Fn(usize, usize, bool) -> bool,
    ) {
        // Every chunk moves once; the bound only stops a runaway loop.
        for _ in 0..10_000 {
            let mut wires = Vec::new();
            for (from, round) in rounds.iter_mut().enumerate() {
                while let Some(output) = round.poll_output() {
                    let (to, address, weight, contributors, payload, averaged) = match output {
                        RoundOutput::SendPartChunk {
                            to,
                            address,
                            weight,
                            payload,
                        } => (to, address, weight, 0, payload, false),
                        RoundOutput::SendAveragedChunk {
                            to,
                            address,
                            contributors,
                            total_weight,
                            payload,
                        } => (to, address, total_weight, contributors, payload, true),
                        RoundOutput::Finished(_) => continue,
                    };
                    let bytes = round.payload(payload).expect("current payload").to_vec();
                    round
                        .handle(Time::ZERO, RoundInput::Sent { to, payload })
                        .expect("ack");
                    if deliver(from, to as usize, averaged) {
                        wires.push((
                            from as u32,
                            to as usize,
                            address,
                            weight,
                            contributors,
                            bytes,
                            averaged,
                        ));
                    }
                }
            }
            if wires.is_empty() {
                return;
            }
            for (from, to, address, weight, contributors, payload, averaged) in wires {
                let contributors = averaged.then_some(contributors);
                let input =
                    RoundInput::arrived(from, address, weight, contributors, codec, &payload);
                rounds[to].handle(Time::ZERO, input).expect("well-formed");
            }
        }
        panic!("the exchange did not settle");
    }

    /// Whether `a` and `b` hold the same bits, element by element.
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// A second round on the buffers the first gave back (its result, now the next
    /// contribution's memory, and its sums) ends with the same bits as a round on fresh
    /// memory.
    #[test]
    fn reused_buffers_give_the_same_bits_as_fresh_ones() {
        let n = 3;
        let mut first = start(n, (0..n).map(|m| local(m, 0).into()).collect());
        exchange(&mut first, |_, _, _| true);
        let reused: Vec<RoundBuffers> = first
            .into_iter()
            .enumerate()
            .map(|(m, round)| {
                assert!(round.is_finished(), "member {m}");
                let mut buffers = round.into_buffers();
                assert!(buffers.local.is_empty(), "no spare was handed in");
                buffers.local = std::mem::take(&mut buffers.result);
                buffers.local.copy_from_slice(&local(m, 1));
                buffers
            })
            .collect();
        let mut again = start(n, reused);
        let mut fresh = start(n, (0..n).map(|m| local(m, 1).into()).collect());
        exchange(&mut again, |_, _, _| true);
        exchange(&mut fresh, |_, _, _| true);
        for (m, (a, f)) in again.iter().zip(&fresh).enumerate() {
            assert!(a.is_finished() && f.is_finished(), "member {m}");
            assert!(
                same_bits(a.result(), f.result()),
                "member {m}: reused buffers changed the result"
            );
        }
    }

    /// Where each vector of `buffers` lives: the contribution (handed in) or the result
    /// (given back) first.
    fn addresses(buffers: &RoundBuffers, vector: &[f32]) -> [usize; 5] {
        let feedback = buffers.feedback.as_ref().expect("error feedback on");
        [
            vector.as_ptr() as usize,
            buffers.sum.as_ptr() as usize,
            buffers.averages.as_ptr() as usize,
            feedback.parts.address(),
            feedback.averages.address(),
        ]
    }

    /// Buffers made ahead for the part a member reduces are the memory its round works
    /// in, and the contribution is where the result is written: the round gives back the
    /// same allocations, and ends with the same bits as a round on fresh memory.
    #[test]
    fn a_round_on_buffers_made_ahead_works_in_them_and_allocates_none_of_its_own() {
        let n = 3;
        let ahead: Vec<RoundBuffers> = (0..n)
            .map(|m| {
                let mut buffers = RoundBuffers::resident(LEN, LEN.div_ceil(n), 128, CODEC, true)
                    .expect("a codec");
                buffers.local = local(m, 0);
                buffers
            })
            .collect();
        let places: Vec<[usize; 5]> = ahead.iter().map(|b| addresses(b, &b.local)).collect();
        let mut rounds = start(n, ahead);
        let fresh_buffers = (0..n).map(|m| RoundBuffers::with_feedback(local(m, 0)));
        let mut fresh = start(n, fresh_buffers.collect());
        exchange(&mut rounds, |_, _, _| true);
        exchange(&mut fresh, |_, _, _| true);
        for (m, (round, fresh)) in rounds.into_iter().zip(fresh).enumerate() {
            assert!(round.is_finished() && fresh.is_finished(), "member {m}");
            assert!(
                same_bits(round.result(), fresh.result()),
                "member {m}: the buffers made ahead changed the result"
            );
            let back = round.into_buffers();
            let back = addresses(&back, &back.result);
            assert_eq!(back, places[m], "member {m}: a buffer was allocated anew");
        }
    }

    /// Error feedback carries what `int8` lost into the next rounds: averaging the same
    /// contributions round after round, the mean of a member's results comes within a
    /// fraction of one round's error of the exact weighted mean, where without it every
    /// round repeats the same error. The residuals live in 16 bits; a residual that were
    /// not kept (or kept wrong) would leave the mean as far off as one round.
    #[test]
    fn error_feedback_carries_what_int8_lost_into_later_rounds() {
        const ROUNDS: usize = 8;
        let n = 3;
        let total: f32 = (1..=n).map(|w| w as f32).sum();
        let exact: Vec<f32> = (0..LEN)
            .map(|e| (0..n).map(|m| local(m, 0)[e] * (m + 1) as f32).sum::<f32>() / total)
            .collect();
        let mean_error = |feedback: bool| {
            let mut buffers: Vec<RoundBuffers> = (0..n)
                .map(|m| match feedback {
                    true => RoundBuffers::with_feedback(local(m, 0)),
                    false => RoundBuffers::from(local(m, 0)),
                })
                .collect();
            let mut sum = vec![0.0f64; LEN];
            for _ in 0..ROUNDS {
                let mut rounds = start(n, buffers);
                exchange(&mut rounds, |_, _, _| true);
                assert!(rounds.iter().all(ButterflyRound::is_finished));
                // What each round's sends lost and carry on: about 2⁻⁸ of what they sent.
                let carried = rounds[0].feedback_tally().carried_ratio();
                assert_eq!(carried.is_some(), feedback, "{carried:?}");
                assert!(carried.is_none_or(|c| c > 1e-4 && c < 0.05), "{carried:?}");
                for (s, &r) in sum.iter_mut().zip(rounds[0].result()) {
                    *s += f64::from(r);
                }
                buffers = rounds
                    .into_iter()
                    .enumerate()
                    .map(|(m, round)| {
                        let mut back = round.into_buffers();
                        back.local = local(m, 0);
                        back.result = Vec::new();
                        back
                    })
                    .collect();
            }
            let error: f64 = sum
                .iter()
                .zip(&exact)
                .map(|(s, &x)| (s / ROUNDS as f64 - f64::from(x)).powi(2))
                .sum();
            error.sqrt()
        };
        let (with, without) = (mean_error(true), mean_error(false));
        assert!(without > 0.0, "int8 loses something");
        assert!(
            with < 0.5 * without,
            "error of the mean over {ROUNDS} rounds: {with:e} with feedback, {without:e} without"
        );
    }

    /// With `f32` a member sends its part's averages from its sums, where they are kept
    /// exactly as they are written into its result: no memory for encoded averages is made
    /// ahead or in the round, the sums' memory is the one made ahead, and every member ends
    /// with the same bits, those of the weighted mean.
    #[test]
    fn f32_averages_go_out_from_the_sums_and_take_no_memory_of_their_own() {
        let n = 3;
        let ahead: Vec<RoundBuffers> = (0..n)
            .map(|m| {
                let mut buffers =
                    RoundBuffers::resident(LEN, LEN.div_ceil(n), 128, CodecSpec::F32, false)
                        .expect("a codec");
                assert_eq!(buffers.averages.capacity(), 0, "made ahead");
                buffers.local = local(m, 0);
                buffers
            })
            .collect();
        let sums: Vec<usize> = ahead.iter().map(|b| b.sum.as_ptr() as usize).collect();
        let mut rounds = start_with(CodecSpec::F32, n, ahead);
        exchange_with(CodecSpec::F32, &mut rounds, |_, _, _| true);
        let weights: f32 = (1..=n).map(|w| w as f32).sum();
        for e in 0..LEN {
            let mean: f64 = (0..n)
                .map(|m| f64::from(local(m, 0)[e]) * (m + 1) as f64)
                .sum::<f64>()
                / f64::from(weights);
            for (m, round) in rounds.iter().enumerate() {
                assert!(
                    (f64::from(round.result()[e]) - mean).abs() < 1e-5,
                    "member {m} element {e}"
                );
                assert_eq!(
                    round.result()[e].to_bits(),
                    rounds[0].result()[e].to_bits(),
                    "member {m} element {e}: the replicas differ"
                );
            }
        }
        for (m, round) in rounds.into_iter().enumerate() {
            let back = round.into_buffers();
            assert_eq!(back.averages.capacity(), 0, "member {m}: made in the round");
            assert_eq!(
                back.sum.as_ptr() as usize,
                sums[m],
                "member {m}: sums moved"
            );
        }
    }

    /// Resident memory of this process, from `/proc/self/status`.
    #[cfg(target_os = "linux")]
    fn resident_bytes() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let line = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .expect("VmRSS");
        let kib: usize = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("a number of KiB");
        kib * 1024
    }

    /// Zeros made resident take their memory at once; plain zeros of the same size do not,
    /// until written. (Each test is its own process under nextest.)
    #[cfg(target_os = "linux")]
    #[test]
    fn resident_zeros_are_in_memory_before_anything_writes_them() {
        const BYTES: usize = 64 << 20;
        let before = resident_bytes();
        let lazy = std::hint::black_box(vec![0f32; BYTES / 4]);
        let after_lazy = resident_bytes();
        let resident = std::hint::black_box(super::resident_zeros::<f32>(BYTES / 4));
        let after = resident_bytes();
        assert!(
            after_lazy.saturating_sub(before) < BYTES / 8,
            "plain zeros took {} bytes",
            after_lazy.saturating_sub(before)
        );
        assert!(
            after.saturating_sub(after_lazy) > BYTES * 7 / 8,
            "resident zeros took only {} bytes of {BYTES}",
            after.saturating_sub(after_lazy)
        );
        assert!(resident.iter().chain(&lazy).all(|x| *x == 0.0));
    }

    /// The memory made ahead of a first round with error feedback takes its sums' and
    /// encoded averages' bytes at once, and its residuals' only as rounds write them: a
    /// member writes about half of them while its partition stays. Before: 64 MiB more.
    #[cfg(target_os = "linux")]
    #[test]
    fn residuals_made_ahead_take_memory_only_as_rounds_write_them() {
        const LEN: usize = 16 << 20;
        let before = resident_bytes();
        let made = std::hint::black_box(
            RoundBuffers::resident(LEN, LEN / 2, 1 << 16, CODEC, true).unwrap(),
        );
        let grown = resident_bytes().saturating_sub(before);
        // The sums: 32 MiB; the encoded averages: a little over 8 MiB.
        let ahead = LEN / 2 * 4 + LEN / 2;
        assert!(
            grown >= ahead * 7 / 8,
            "made ahead: only {grown} bytes of {ahead}"
        );
        assert!(
            grown < ahead + (4 << 20),
            "made ahead: {grown} bytes, the residuals' 64 MiB among them"
        );
        // A member of a group of two reduces the first half and sends the second.
        let mut made = made;
        let residuals = made.feedback.as_mut().expect("error feedback is on");
        let half = vec![0.5f32; LEN / 2];
        let before_rounds = resident_bytes();
        residuals.averages.store_range(0, &half);
        residuals.parts.store_range(LEN / 2, &half);
        let written = resident_bytes().saturating_sub(before_rounds);
        // Half of each: 16 MiB of steps each, and their scales.
        assert!(
            (30 << 20..40 << 20).contains(&written),
            "the rounds' residuals took {written} bytes"
        );
    }

    /// A round given up before it finished gives back local values wherever no average
    /// arrived, whatever its buffers held before, and the averages that did arrive.
    #[test]
    fn a_round_given_up_keeps_local_values_where_nothing_arrived() {
        let stale = || RoundBuffers {
            local: Vec::new(),
            result: vec![1e6; LEN],
            sum: vec![1e6; LEN],
            averages: vec![0xff; LEN],
            feedback: None,
        };
        let buffers = (0..2)
            .map(|m| RoundBuffers {
                local: local(m, 0),
                ..stale()
            })
            .collect();
        let mut rounds = start(2, buffers);
        // Member 1's contributions never reach member 0, its averages do: member 0's own
        // part waits on member 1, the other part is averaged.
        exchange(&mut rounds, |from, to, averaged| {
            !(from == 1 && to == 0 && !averaged)
        });
        let member0 = rounds.swap_remove(0);
        assert!(!member0.is_finished());
        let own = member0.group().partition().range(0);
        let other = member0.group().partition().range(1);
        let result = member0.into_buffers().result;
        assert_eq!(&result[own.clone()], &local(0, 0)[own]);
        for e in other {
            let mean = (f64::from(local(0, 0)[e]) + 2.0 * f64::from(local(1, 0)[e])) / 3.0;
            let bound = 2.0 / 127.0;
            assert!((f64::from(result[e]) - mean).abs() < bound, "element {e}");
        }
    }
}
