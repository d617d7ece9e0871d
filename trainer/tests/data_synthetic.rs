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
        communities: 1,
        states: 16,
        branching: 3,
        skew: 1.0,
    }
}

fn markov(eval_samples: usize, s: PeerSampling) -> Box<dyn Dataset> {
    let config = DataConfig {
        shard: 0,
        shards: 1,
        batch_size: 32,
        eval_samples,
        source: DataSource::SyntheticMarkov(markov_config()),
    };
    open_dataset(&config, Some(24), s).unwrap()
}

fn teacher(s: PeerSampling) -> Box<dyn Dataset> {
    let config = DataConfig {
        shard: 0,
        shards: 1,
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
            // 16 states in 3 ranges do not divide; in 4 ranges, 4 states leave too few for
            // 3 distinct successors besides the cycle's.
            DataSource::SyntheticMarkov(MarkovConfig {
                communities: 3,
                ..markov_config()
            }),
            "data.source.communities",
        ),
        (
            DataSource::SyntheticMarkov(MarkovConfig {
                communities: 8,
                ..markov_config()
            }),
            "data.source.communities",
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
            shard: 0,
            shards: 1,
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
        shard: 0,
        shards: 1,
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
        shard: 0,
        shards: 1,
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

/// A Markov dataset of 64 states in `communities` ranges, for peer `shard` of `shards`.
fn community_peer(communities: usize, shard: u32, shards: u32) -> Box<dyn Dataset> {
    let config = DataConfig {
        shard,
        shards,
        batch_size: 32,
        eval_samples: 64,
        source: DataSource::SyntheticMarkov(MarkovConfig {
            states: 64,
            branching: 4,
            skew: 1.0,
            communities,
        }),
    };
    open_dataset(
        &config,
        Some(24),
        PeerSampling {
            swarm_seed: 5,
            peer_seed: u64::from(shard) + 100,
            shard,
            shards,
        },
    )
    .unwrap()
}

/// The share of a peer's training tokens (inputs) that lie in states `range`, and whether
/// every sequence started there.
fn tokens_in(dataset: &mut dyn Dataset, range: std::ops::Range<u32>) -> (f64, bool) {
    let mut batch = dataset.empty_batch(32);
    let (mut inside, mut total, mut starts_inside) = (0usize, 0usize, true);
    for _ in 0..20 {
        dataset.fill_train_batch(32, &mut batch);
        let BatchInputs::Tokens { ids, context } = &batch.inputs else {
            panic!("markov yields tokens");
        };
        for row in ids.chunks(*context) {
            starts_inside &= range.contains(&row[0]);
            inside += row.iter().filter(|t| range.contains(t)).count();
            total += row.len();
        }
    }
    (inside as f64 / total as f64, starts_inside)
}

#[test]
fn communities_keep_successors_in_their_range_but_for_the_cycle() {
    let config = MarkovConfig {
        states: 64,
        branching: 4,
        skew: 1.0,
        communities: 4,
    };
    let chain = MarkovChain::new(&config, 5).unwrap();
    for from in 0..64u32 {
        for to in 0..64u32 {
            let same = from / 16 == to / 16;
            let cycle = to == (from + 1) % 64;
            if chain.transition(from, to) > 0.0 {
                assert!(same || cycle, "{from} -> {to} leaves its community");
            }
        }
    }
    // Still one chain: every state is visited.
    assert!(chain.stationary().iter().all(|&p| p > 0.0));
}

/// The quality task's chain is the one its numbers in BENCHMARKS.md were measured on: a
/// single community draws exactly the successors of a chain without communities.
#[test]
fn one_community_is_the_chain_without_communities() {
    let data = murmur_trainer::TaskPreset::Quality.config().data;
    let DataSource::SyntheticMarkov(config) = data.source else {
        panic!("the quality task is a Markov chain");
    };
    assert_eq!(config.communities, 1);
    // `murmur local`'s swarm id; its loss floor as `murmur local --task quality` reported it
    // before chains had communities.
    let chain = MarkovChain::new(&config, PeerSampling::seed_from_id(b"murmur-local")).unwrap();
    assert_eq!(chain.entropy_rate() as f32, 2.365_789_2_f32);
}

#[test]
fn a_data_shard_starts_every_sequence_in_its_range_of_states() {
    // One shard: sequences start anywhere.
    let (_, all_inside) = tokens_in(&mut *community_peer(1, 0, 1), 0..16);
    assert!(!all_inside, "one shard starts sequences in every range");
    // Shard 2 of 4, no communities: starts in 32..48, then the chain mixes.
    let (share, starts) = tokens_in(&mut *community_peer(1, 2, 4), 32..48);
    assert!(starts, "shard 2 of 4 starts its sequences in states 32..48");
    assert!(
        share < 0.6,
        "without communities sequences leave the range: {share}"
    );
    // With four communities, shard 2 of 4 sees almost only community 2: non-IID data.
    let (share, starts) = tokens_in(&mut *community_peer(4, 2, 4), 32..48);
    assert!(starts);
    assert!(
        share > 0.9,
        "community 2's share of shard 2's tokens: {share}"
    );
    // The eval set is every peer's: the same whatever the shard.
    let a = community_peer(4, 0, 4);
    let b = community_peer(4, 3, 4);
    assert_eq!(
        a.eval_set().iter().flat_map(rows).collect::<Vec<_>>(),
        b.eval_set().iter().flat_map(rows).collect::<Vec<_>>()
    );
}

#[test]
fn a_shard_outside_the_shards_names_its_key() {
    let config = DataConfig {
        shard: 4,
        shards: 4,
        batch_size: 8,
        eval_samples: 8,
        source: DataSource::SyntheticMarkov(markov_config()),
    };
    let error = open_dataset(&config, Some(8), sampling(1, 1))
        .unwrap_err()
        .to_string();
    assert!(error.contains("data.shard"), "{error}");
    let config = DataConfig {
        shard: 0,
        shards: 0,
        ..config
    };
    let error = open_dataset(&config, Some(8), sampling(1, 1))
        .unwrap_err()
        .to_string();
    assert!(error.contains("data.shards"), "{error}");
}
