//! Shared test vectors: inputs chosen to break a codec implementation that is merely close
//! to the reference (all zeros, negative zeros, subnormals, values at the flush threshold,
//! huge values and ±MAX, rounding ties of every format, one outlier per block, lengths that
//! are not multiples of a block or a byte), plus seeded random data. Built from fixed
//! formulas, so every run and every machine gets the same values, and the GPU suite checks
//! its bytes against the CPU reference on exactly these.

use murmur_protocol::codec::CodecSpec;

/// One named input.
#[derive(Debug, Clone)]
pub(crate) struct Vector {
    pub(crate) name: &'static str,
    pub(crate) values: Vec<f32>,
}

/// Every codec with the block sizes and keep fractions at the edges of their ranges.
pub(crate) fn specs() -> Vec<CodecSpec> {
    let mut specs = vec![CodecSpec::F32, CodecSpec::F16, CodecSpec::Bf16];
    for block in [32, 64, 4096] {
        specs.push(CodecSpec::Int8 { block });
        specs.push(CodecSpec::Int4 { block });
        specs.push(CodecSpec::Sign1 { block });
    }
    for keep_ppm in [1, 10_000, 1_000_000] {
        specs.push(CodecSpec::TopK { keep_ppm });
    }
    specs
}

/// A seeded xorshift stream of `len` values with both signs and magnitudes spread over
/// `decades` decades below 1.
fn seeded(seed: u64, len: usize, decades: i32) -> Vec<f32> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
            let decade = (state % decades.max(1) as u64) as i32;
            (unit * 2.0 - 1.0) * 10f32.powi(-decade)
        })
        .collect()
}

/// `±2^k` exactly, subnormal powers included (`powi` would underflow to zero).
fn pow2(k: i32) -> f32 {
    if k >= -126 {
        f32::from_bits(((k + 127) as u32) << 23)
    } else {
        f32::from_bits(1 << (k + 149))
    }
}

/// The adversarial and random inputs.
pub(crate) fn all() -> Vec<Vector> {
    let v = |name, values| Vector { name, values };
    let subnormal = |i: u32| f32::from_bits(i * 7919 % 0x007f_ffff + 1);
    let f16_ties = [
        1.0 + pow2(-11),       // halfway between two halves: ties to even
        1.0 + 3.0 * pow2(-11), // halfway, rounds up to even
        65504.0,
        65519.996,
        65520.0, // would round to Inf without the clamp
        -70000.0,
        6.103_515_6e-5, // smallest normal half
        5.960_464_5e-8, // smallest subnormal half
        2.980_232_2e-8, // half of it: ties to zero
        8.940_697e-8,   // 1.5 × smallest subnormal: ties to even (2)
        1e-10,
    ];
    let bf16_ties = [
        1.0 + pow2(-8),
        1.0 + 3.0 * pow2(-8),
        f32::from_bits(0x7f7f_8000), // halfway between bf16 max and Inf: clamps
        f32::from_bits(0x7f7f_7fff),
        -f32::from_bits(0x7f7f_ffff),
        f32::from_bits(0x0000_8000), // subnormal tie
        f32::from_bits(0x0001_8000),
    ];
    let mut ties = Vec::new();
    for f in f16_ties.iter().chain(&bf16_ties) {
        ties.extend([*f, -*f]);
    }
    // Half-integer multiples of an int8 step: block max 127 makes the step exactly 1.
    let int8_ties: Vec<f32> = (-254..=254).map(|k| k as f32 * 0.5).collect();
    // Block max 7 makes the int4 step exactly 1.
    let int4_ties: Vec<f32> = (0..64)
        .map(|k| ((k % 15) as f32 - 7.0) * 0.5 + 0.0)
        .collect();
    let mut outliers = seeded(11, 4100, 3);
    for (i, x) in outliers.iter_mut().enumerate() {
        if i % 64 == 17 {
            *x = if i % 128 == 17 { 3e30 } else { -2.5e-30 };
        }
    }
    let mut huge = seeded(12, 1000, 2);
    for (i, x) in huge.iter_mut().enumerate() {
        *x = match i % 5 {
            0 => f32::MAX,
            1 => -f32::MAX,
            2 => f32::MAX / 3.0,
            3 => -3e38,
            _ => *x,
        };
    }
    vec![
        v("zeros", vec![0.0; 1000]),
        v("negative_zeros", vec![-0.0; 77]),
        v(
            "signed_zeros",
            (0..129)
                .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
                .collect(),
        ),
        v(
            "subnormals",
            (0..515)
                .map(|i| {
                    if i % 2 == 0 {
                        subnormal(i)
                    } else {
                        -subnormal(i)
                    }
                })
                .collect(),
        ),
        v(
            "subnormals_and_normals",
            (0..300)
                .map(|i| {
                    if i % 7 == 0 {
                        f32::MIN_POSITIVE * (i as f32)
                    } else {
                        subnormal(i)
                    }
                })
                .collect(),
        ),
        v(
            "flush_threshold",
            (0..256)
                .map(|i| {
                    let t = pow2(-100);
                    match i % 4 {
                        0 => t,
                        1 => f32::from_bits(t.to_bits() - 1),
                        2 => -t * 1.5,
                        _ => t * 0.25,
                    }
                })
                .collect(),
        ),
        v("huge", huge),
        v(
            "plus_minus_max",
            (0..96)
                .map(|i| if i % 2 == 0 { f32::MAX } else { -f32::MAX })
                .collect(),
        ),
        v("max_only", vec![f32::MAX; 40]),
        v("float_ties", ties),
        v("int8_ties", int8_ties),
        v("int4_ties", int4_ties),
        v("one_outlier_per_block", outliers),
        v(
            "powers_of_two",
            (-149..=127)
                .map(|k| if k % 2 == 0 { pow2(k) } else { -pow2(k) })
                .collect(),
        ),
        v("length_1", vec![-0.75]),
        v("length_7", seeded(3, 7, 2)),
        v("length_33", seeded(4, 33, 2)),
        v("length_4097", seeded(5, 4097, 4)),
        v("mixed_signs_random", seeded(6, 10_007, 6)),
        v(
            "equal_magnitudes",
            (0..300)
                .map(|i| if i % 3 == 0 { -0.5 } else { 0.5 })
                .collect(),
        ),
    ]
}
