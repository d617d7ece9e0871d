//! The models' autograd gradients match central finite differences.

use murmur_trainer::{
    Activation, Batch, BatchInputs, DataShape, GptConfig, MlpConfig, Model, ModelConfig,
};

/// Deterministic values in [-scale, scale].
fn pseudo_random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Compares the gradient at every parameter with (L(p+h) − L(p−h)) / 2h.
fn check_gradient(model: &mut Model, params: &[f32], batch: &Batch) {
    let mut grad = vec![0.0; params.len()];
    let loss = model.loss_and_grad(params, batch, &mut grad).unwrap();
    assert!(loss.is_finite());
    // The eval path computes the same loss.
    let eval = model.eval_loss(params, batch).unwrap();
    assert!((eval - loss).abs() < 1e-5, "eval {eval} vs train {loss}");

    let h = 1e-2f32;
    let mut probe = params.to_vec();
    let mut worst = 0.0f32;
    for i in 0..params.len() {
        probe[i] = params[i] + h;
        let up = model.eval_loss(&probe, batch).unwrap();
        probe[i] = params[i] - h;
        let down = model.eval_loss(&probe, batch).unwrap();
        probe[i] = params[i];
        let numeric = (up - down) / (2.0 * h);
        let err = (grad[i] - numeric).abs();
        let tol = 5e-4 + 5e-3 * numeric.abs();
        let name = model
            .layout()
            .tensors()
            .iter()
            .find(|t| t.range().contains(&i))
            .map(|t| t.name().to_owned())
            .unwrap_or_default();
        assert!(
            err <= tol,
            "parameter {i} ({name}): autograd {} vs finite difference {numeric}",
            grad[i]
        );
        worst = worst.max(err / (5e-4 + 5e-3 * numeric.abs()));
    }
    eprintln!("worst error: {worst:.3} of the tolerance");
    // The check is not vacuous: the gradient is far from zero somewhere.
    assert!(grad.iter().any(|g| g.abs() > 1e-2));
}

#[test]
fn mlp_gradient_matches_finite_differences() {
    for activation in [Activation::Tanh, Activation::Gelu] {
        let config = ModelConfig::Mlp(MlpConfig {
            hidden: vec![6, 5],
            activation,
        });
        let mut model = Model::new(
            &config,
            DataShape::Features {
                width: 4,
                classes: 3,
            },
        )
        .unwrap();
        let params = pseudo_random(model.param_count(), 1, 0.8);
        let batch = Batch {
            inputs: BatchInputs::Features {
                values: pseudo_random(5 * 4, 2, 1.5),
                width: 4,
            },
            targets: vec![0, 2, 1, 2, 0],
            rows: 5,
        };
        check_gradient(&mut model, &params, &batch);
    }
}

/// A two-layer GPT with parameters where the gradient check is well conditioned, and a
/// batch of three sequences of five tokens.
fn small_gpt() -> (Model, Vec<f32>, Batch) {
    let config = ModelConfig::Gpt(GptConfig {
        layers: 2,
        heads: 2,
        width: 8,
        context: 5,
        vocab: None,
        mlp_ratio: 2,
    });
    let model = Model::new(
        &config,
        DataShape::Tokens {
            vocab: 7,
            context: 5,
        },
    )
    .unwrap();
    let mut params = pseudo_random(model.param_count(), 3, 0.5);
    // Layer-norm gains near one, as in training, keep the check in a well-conditioned region.
    for spec in model.layout().tensors() {
        if spec.name().contains("ln_") && spec.name().ends_with("weight") {
            for v in &mut params[spec.range()] {
                *v += 1.0;
            }
        }
    }
    let ids = [1, 4, 6, 0, 2, 3, 3, 5, 1, 0, 6, 2, 2, 4, 5];
    let targets = [4, 6, 0, 2, 1, 3, 5, 1, 0, 6, 2, 2, 4, 5, 3];
    let batch = Batch {
        inputs: BatchInputs::Tokens {
            ids: ids.to_vec(),
            context: 5,
        },
        targets: targets.to_vec(),
        rows: 3,
    };
    (model, params, batch)
}

#[test]
fn gpt_gradient_matches_finite_differences() {
    let (mut model, params, batch) = small_gpt();
    check_gradient(&mut model, &params, &batch);
}

#[test]
fn gpt_gradient_computed_again_block_by_block_matches_finite_differences() {
    let (mut model, params, batch) = small_gpt();
    model.set_recompute_activations(true);
    check_gradient(&mut model, &params, &batch);
}

/// Computing each block again in the backward pass gives the gradient the whole graph
/// gives, to float rounding, written over or added into the buffer alike.
#[test]
fn recomputed_blocks_give_the_whole_graphs_gradient() {
    use murmur_trainer::GradWrite;
    let (mut model, params, batch) = small_gpt();
    let len = params.len();
    let mut whole = vec![0.0; len];
    let loss = model.loss_and_grad(&params, &batch, &mut whole).unwrap();
    model.set_recompute_activations(true);
    let mut again = vec![f32::NAN; len];
    let loss_again = model.loss_and_grad(&params, &batch, &mut again).unwrap();
    assert_eq!(loss, loss_again);
    let worst = whole
        .iter()
        .zip(&again)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let largest = whole.iter().fold(0.0f32, |m, g| m.max(g.abs()));
    assert!(
        worst <= 1e-5 * largest,
        "off by {worst} (largest {largest})"
    );
    // Added into a buffer with a scale, as a second micro-batch is.
    let mut added = whole.clone();
    model
        .loss_and_grad_into(&params, &batch, &mut added, GradWrite::Add { scale: 0.5 })
        .unwrap();
    for (i, (&a, &w)) in added.iter().zip(&whole).enumerate() {
        assert!(
            (a - 1.5 * w).abs() <= 1e-5 * largest,
            "element {i}: {a} vs {}",
            1.5 * w
        );
    }
}

#[test]
fn gpt_is_causal() {
    // If position 3 cannot influence positions 0..2, a length-4 sequence's mean loss is
    // (3·L3 + l3) / 4, with L3 the mean loss of its length-3 prefix and l3 = −ln p(t | …) the
    // last position's loss. So exp(−(4·L4(t) − 3·L3)) over every last target t must be a
    // probability distribution; any leak from the future breaks that sum.
    let config = ModelConfig::Gpt(GptConfig {
        layers: 2,
        heads: 2,
        width: 8,
        context: 4,
        vocab: None,
        mlp_ratio: 2,
    });
    let vocab = 5;
    let shape = DataShape::Tokens { vocab, context: 4 };
    let mut model = Model::new(&config, shape).unwrap();
    let params = pseudo_random(model.param_count(), 9, 0.5);
    let batch = |ids: &[u32], targets: &[u32]| Batch {
        inputs: BatchInputs::Tokens {
            ids: ids.to_vec(),
            context: ids.len(),
        },
        targets: targets.to_vec(),
        rows: 1,
    };
    let prefix = model
        .eval_loss(&params, &batch(&[1, 2, 3], &[2, 3, 4]))
        .unwrap();
    for last_input in [0, 4] {
        let total: f64 = (0..vocab as u32)
            .map(|t| {
                let l4 = model
                    .eval_loss(&params, &batch(&[1, 2, 3, last_input], &[2, 3, 4, t]))
                    .unwrap();
                (-(4.0 * f64::from(l4) - 3.0 * f64::from(prefix))).exp()
            })
            .sum();
        assert!((total - 1.0).abs() < 1e-3, "probabilities sum to {total}");
    }
}
