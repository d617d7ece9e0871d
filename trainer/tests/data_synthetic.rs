//! Synthetic datasets: per-peer streams are disjoint, eval sets are shared, floors are right.

use std::collections::HashSet;

use murmur_trainer::data::{MarkovChain, MarkovConfig, TeacherConfig};
use murmur_trainer::{
    Batch, BatchInputs, DataConfig, DataShape, DataSource, Dataset, PeerSampling, open_dataset,
};

fn sampling(swarm_seed: u64, peer_seed: u64) -> PeerSampling {
    PeerSampling {
        swarm_seed,
        peer_seed,
        shard: 0,
        shards: 1,
    }
}

fn markov_config() -> MarkovConfig {
    MarkovConfig {
        states: 16,
        branching: 3,
        skew: 1.0,
    }
}

fn markov(eval_samples: usize, s: PeerSampling) -> Box<dyn Dataset> {
    let config = DataConfig {
        batch_size: 32,
        eval_samples,
        source: DataSource::SyntheticMarkov(markov_config()),
    };
    open_dataset(&config, Some(24), s).unwrap()
}

fn teacher(s: PeerSampling) -> Box<dyn Dataset> {
    let config = DataConfig {
        batch_size: 50,
        eval_samples: 500,
        source: DataSource::SyntheticClassification(TeacherConfig {
            features: 8,
            classes: 5,
            hidden: 16,
            sharpness: 3.0,
        }),
    };
    open_dataset(&config, None, s).unwrap()
}

/// Each row of a batch as bytes, to compare samples across peers.
fn rows(batch: &Batch) -> Vec<Vec<u8>> {
    match &batch.inputs {
        BatchInputs::Features { values, width } => values
            .chunks(*width)
            .map(|r| r.iter().flat_map(|v| v.to_le_bytes()).collect())
            .collect(),
        BatchInputs::Tokens { ids, context } => ids
            .chunks(*context)
            .map(|r| r.iter().flat_map(|v| v.to_le_bytes()).collect())
            .collect(),
    }
}

fn stream(dataset: &mut dyn Dataset, batches: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut batch = dataset.empty_batch(32);
    for _ in 0..batches {
        dataset.fill_train_batch(32, &mut batch);
        assert_eq!(batch.rows, 32);
        out.extend(rows(&batch));
    }
    out
}

#[test]
fn peers_draw_disjoint_streams_and_share_the_eval_set() {
    for make in [markov_peer, teacher_peer] {
        let mut a = make(5, 1);
        let mut b = make(5, 2);
        assert_eq!(
            a.eval_set(),
            b.eval_set(),
            "eval sets must match across peers"
        );
        assert_eq!(a.loss_floor(), b.loss_floor());
        let sa: HashSet<Vec<u8>> = stream(a.as_mut(), 20).into_iter().collect();
        let sb: HashSet<Vec<u8>> = stream(b.as_mut(), 20).into_iter().collect();
        assert!(
            sa.len() > 600,
            "a peer's own samples are (nearly) all distinct"
        );
        assert_eq!(
            sa.intersection(&sb).count(),
            0,
            "peers share training samples"
        );
        // No training sample is an eval sample.
        let eval: HashSet<Vec<u8>> = a.eval_set().iter().flat_map(rows).collect();
        assert_eq!(sa.intersection(&eval).count(), 0);
        // The same peer seed reproduces the same stream.
        let mut again = make(5, 1);
        let first = stream(again.as_mut(), 1);
        let mut a2 = make(5, 1);
        assert_eq!(first, stream(a2.as_mut(), 1));
        // Another swarm seed changes the task's eval set.
        assert_ne!(a.eval_set(), make(6, 1).eval_set());
    }
}

fn markov_peer(swarm: u64, peer: u64) -> Box<dyn Dataset> {
    markov(64, sampling(swarm, peer))
}

fn teacher_peer(swarm: u64, peer: u64) -> Box<dyn Dataset> {
    teacher(sampling(swarm, peer))
}

#[test]
fn eval_set_has_the_requested_size() {
    let d = markov(70, sampling(1, 1));
    let sizes: Vec<usize> = d.eval_set().iter().map(|b| b.rows).collect();
    assert_eq!(sizes, [32, 32, 6]);
    for b in d.eval_set() {
        assert_eq!(b.targets.len(), b.rows * 24);
    }
    assert_eq!(
        d.shape(),
        DataShape::Tokens {
            vocab: 16,
            context: 24
        }
    );
}

#[test]
fn markov_chain_is_stationary_and_its_entropy_rate_is_the_floor() {
    let chain = MarkovChain::new(&markov_config(), 11).unwrap();
    let v = chain.states();
    let pi = chain.stationary();
    assert!((pi.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    for j in 0..v as u32 {
        let flow: f64 = (0..v as u32)
            .map(|i| pi[i as usize] * chain.transition(i, j))
            .sum();
        assert!((flow - pi[j as usize]).abs() < 1e-9, "πP ≠ π at {j}");
    }
    let h = chain.entropy_rate();
    assert!(
        h > 0.1 && h < (3.0f64).ln(),
        "branching 3 bounds H by ln 3; got {h}"
    );

    // Empirical estimates from the dataset's own sequences.
    let mut d = markov(8, sampling(11, 3));
    assert!((f64::from(d.loss_floor().unwrap()) - h).abs() < 1e-6);
    let mut counts = vec![0u64; v * v];
    let mut nll = 0.0;
    let mut n = 0u64;
    let mut batch = d.empty_batch(32);
    for _ in 0..150 {
        d.fill_train_batch(32, &mut batch);
        let BatchInputs::Tokens { ids, .. } = &batch.inputs else {
            panic!("markov data yields tokens")
        };
        for (&from, &to) in ids.iter().zip(&batch.targets) {
            counts[from as usize * v + to as usize] += 1;
            let p = chain.transition(from, to);
            assert!(p > 0.0, "sampled an impossible transition {from}→{to}");
            nll -= p.ln();
            n += 1;
        }
    }
    // The Bayes predictor's mean loss on sampled data: an unbiased estimate of H.
    let mean_nll = nll / n as f64;
    assert!((mean_nll - h).abs() < 0.03, "mean NLL {mean_nll} vs H {h}");
    // The plug-in entropy of the empirical transition counts.
    let mut plug_in = 0.0;
    for i in 0..v {
        let row = &counts[i * v..(i + 1) * v];
        let total: u64 = row.iter().sum();
        for &c in row.iter().filter(|&&c| c > 0) {
            let p = c as f64 / total as f64;
            plug_in -= c as f64 / n as f64 * p.ln();
        }
    }
    assert!((plug_in - h).abs() < 0.03, "plug-in {plug_in} vs H {h}");
}

#[test]
fn teacher_floor_is_the_teachers_own_eval_loss() {
    let d = teacher(sampling(3, 1));
    let floor = d.loss_floor().unwrap();
    // Sampled labels from a sharp teacher: the floor is positive and below a uniform guess.
    assert!(floor > 0.05 && floor < (5.0f32).ln(), "floor {floor}");
    assert_eq!(
        d.shape(),
        DataShape::Features {
            width: 8,
            classes: 5
        }
    );
    for batch in d.eval_set() {
        assert!(batch.targets.iter().all(|&t| t < 5));
    }
    // Labels are not constant: the task has signal in every class.
    let labels: HashSet<u32> = d
        .eval_set()
        .iter()
        .flat_map(|b| b.targets.clone())
        .collect();
    assert_eq!(labels.len(), 5);
}

#[test]
fn bad_synthetic_settings_name_their_key() {
    let cases = [
        (
            DataSource::SyntheticMarkov(MarkovConfig {
                branching: 17,
                ..markov_config()
            }),
            "data.source.branching",
        ),
        (
            DataSource::SyntheticMarkov(MarkovConfig {
                states: 1,
                ..markov_config()
            }),
            "data.source.states",
        ),
        (
            DataSource::SyntheticClassification(TeacherConfig {
                features: 8,
                classes: 1,
                hidden: 4,
                sharpness: 1.0,
            }),
            "data.source.classes",
        ),
    ];
    for (source, key) in cases {
        let config = DataConfig {
            batch_size: 4,
            eval_samples: 4,
            source,
        };
        let err = open_dataset(&config, Some(8), sampling(1, 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{err} should name {key}");
    }
    let config = DataConfig {
        batch_size: 0,
        eval_samples: 4,
        source: DataSource::SyntheticMarkov(markov_config()),
    };
    let err = open_dataset(&config, Some(8), sampling(1, 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("data.batch_size"), "{err}");
    let bad_shard = PeerSampling {
        shard: 2,
        shards: 2,
        ..sampling(1, 1)
    };
    let config = DataConfig {
        batch_size: 4,
        eval_samples: 4,
        source: DataSource::SyntheticMarkov(markov_config()),
    };
    assert!(open_dataset(&config, Some(8), bad_shard).is_err());
}

#[test]
fn peer_seeds_from_ids_are_stable_and_distinct() {
    let a = PeerSampling::seed_from_id(b"12D3KooWA");
    assert_eq!(a, PeerSampling::seed_from_id(b"12D3KooWA"));
    assert_ne!(a, PeerSampling::seed_from_id(b"12D3KooWB"));
    // Zero padding of the last word cannot make two ids collide.
    assert_ne!(
        PeerSampling::seed_from_id(&[1]),
        PeerSampling::seed_from_id(&[1, 0])
    );
}
