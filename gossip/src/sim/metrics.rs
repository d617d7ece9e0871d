//! Measuring a swarm: how far apart the peers are, and how far from the answer.

/// Per-peer state the metrics need: numerator and weight.
pub(crate) struct MassView<'a> {
    pub(crate) numerator: &'a [f32],
    pub(crate) weight: f64,
}

/// The measurements of one record, computed in `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Agreement {
    /// Peers measured.
    pub(crate) peers: usize,
    /// `max_i ‖z_i − ȳ‖₂ / scale`, with `ȳ = Σ x_i / Σ w_i`.
    pub(crate) consensus_error: f64,
    /// `max_i ‖z_i − reference‖₂ / scale`.
    pub(crate) reference_error: f64,
    /// Smallest weight among the peers measured.
    pub(crate) min_weight: f64,
    /// Sum of their weights.
    pub(crate) weight: f64,
}

/// The scale errors are relative to, from the founders' initial `spread` (`D₀`). A swarm
/// that starts in agreement has nothing to converge; it is measured in absolute terms.
pub(crate) fn error_scale(spread: f64) -> f64 {
    if spread > 0.0 { spread } else { 1.0 }
}

/// Measures the peers that hold mass. `held_average` is scratch of the vector's length.
pub(crate) fn agreement<'a>(
    peers: impl Iterator<Item = MassView<'a>> + Clone,
    reference: &[f64],
    scale: f64,
    held_average: &mut [f64],
) -> Agreement {
    held_average.fill(0.0);
    let mut weight = 0.0;
    let mut min_weight = f64::INFINITY;
    let mut count = 0;
    for peer in peers.clone() {
        for (sum, &x) in held_average.iter_mut().zip(peer.numerator) {
            *sum += f64::from(x);
        }
        weight += peer.weight;
        min_weight = min_weight.min(peer.weight);
        count += 1;
    }
    if count == 0 || weight <= 0.0 {
        return Agreement {
            peers: 0,
            consensus_error: f64::NAN,
            reference_error: f64::NAN,
            min_weight: 0.0,
            weight,
        };
    }
    for sum in held_average.iter_mut() {
        *sum /= weight;
    }
    let mut consensus: f64 = 0.0;
    let mut against_reference: f64 = 0.0;
    for peer in peers {
        let inverse = 1.0 / peer.weight;
        let (mut to_held, mut to_reference) = (0.0, 0.0);
        for ((&x, &held), &exact) in peer.numerator.iter().zip(&*held_average).zip(reference) {
            let z = f64::from(x) * inverse;
            to_held += (z - held) * (z - held);
            to_reference += (z - exact) * (z - exact);
        }
        consensus = consensus.max(to_held.sqrt());
        against_reference = against_reference.max(to_reference.sqrt());
    }
    Agreement {
        peers: count,
        consensus_error: consensus / scale,
        reference_error: against_reference / scale,
        min_weight,
        weight,
    }
}

/// The average of `vectors` and their root-mean-square distance to it, in `f64`.
pub(crate) fn average_and_spread<'a>(
    vectors: impl Iterator<Item = &'a [f32]> + Clone,
    len: usize,
) -> (Vec<f64>, f64) {
    let mut average = vec![0.0; len];
    let mut count = 0usize;
    for vector in vectors.clone() {
        for (sum, &x) in average.iter_mut().zip(vector) {
            *sum += f64::from(x);
        }
        count += 1;
    }
    if count == 0 {
        return (average, 0.0);
    }
    for sum in &mut average {
        *sum /= count as f64;
    }
    let squares: f64 = vectors
        .map(|vector| {
            vector
                .iter()
                .zip(&average)
                .map(|(&x, &mean)| (f64::from(x) - mean).powi(2))
                .sum::<f64>()
        })
        .sum();
    (average, (squares / count as f64).sqrt())
}
