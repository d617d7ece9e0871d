//! File datasets: good files load, every bad file fails with its own typed error, and peers'
//! shards are disjoint while the eval set is shared.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use murmur_trainer::data::{
    IdxConfig, LLMC_MAGIC_U16, LLMC_MAGIC_U32, TextConfig, TokenFormat, TokensConfig, read_idx,
    read_token_file,
};
use murmur_trainer::{
    BatchInputs, DataConfig, DataError, DataShape, DataSource, Dataset, PeerSampling, TrainerError,
    open_dataset,
};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn llmc(magic: i32, version: i32, count: i32, tokens: &[u8]) -> Vec<u8> {
    let mut header = [0i32; 256];
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    let mut bytes: Vec<u8> = header.iter().flat_map(|v| v.to_le_bytes()).collect();
    bytes.extend_from_slice(tokens);
    bytes
}

fn u16_tokens(tokens: impl IntoIterator<Item = u16>) -> Vec<u8> {
    tokens.into_iter().flat_map(u16::to_le_bytes).collect()
}

fn u32_tokens(tokens: impl IntoIterator<Item = u32>) -> Vec<u8> {
    tokens.into_iter().flat_map(u32::to_le_bytes).collect()
}

fn peer(peer_seed: u64, shard: u32, shards: u32) -> PeerSampling {
    PeerSampling {
        swarm_seed: 5,
        peer_seed,
        shard,
        shards,
    }
}

fn data_error(result: Result<impl std::fmt::Debug, DataError>) -> DataError {
    result.unwrap_err()
}

fn open_error(config: &DataConfig, context: usize) -> DataError {
    match open_dataset(config, Some(context), peer(1, 0, 1)).unwrap_err() {
        TrainerError::Data(e) => e,
        other => panic!("expected a data error, got {other}"),
    }
}

#[test]
fn token_formats_read_back_their_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let nano = write(dir.path(), "train.bin", &u16_tokens([1, 2, 65535]));
    let store = read_token_file(&nano, TokenFormat::NanoGptU16).unwrap();
    assert_eq!(
        (0..store.len()).map(|i| store.get(i)).collect::<Vec<_>>(),
        [1, 2, 65535]
    );

    let raw = write(dir.path(), "raw.bin", &u32_tokens([7, 100_000]));
    let store = read_token_file(&raw, TokenFormat::RawU32).unwrap();
    assert_eq!((store.get(0), store.get(1)), (7, 100_000));

    let gpt2 = write(
        dir.path(),
        "gpt2.bin",
        &llmc(LLMC_MAGIC_U16, 1, 3, &u16_tokens([5, 6, 7])),
    );
    let store = read_token_file(&gpt2, TokenFormat::LlmC).unwrap();
    assert_eq!(store.len(), 3);
    assert_eq!(store.get(2), 7);
    assert_eq!(store.byte_offset(2), 1024 + 4);

    let llama = write(
        dir.path(),
        "llama.bin",
        &llmc(LLMC_MAGIC_U32, 7, 2, &u32_tokens([9, 128_000])),
    );
    let store = read_token_file(&llama, TokenFormat::LlmC).unwrap();
    assert_eq!((store.get(0), store.get(1)), (9, 128_000));
}

#[test]
fn bad_token_files_fail_with_specific_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let llmc_case = |name: &str, bytes: Vec<u8>| {
        let path = write(d, name, &bytes);
        (
            path.clone(),
            data_error(read_token_file(&path, TokenFormat::LlmC)),
        )
    };

    let (path, e) = llmc_case("magic.bin", llmc(12345, 1, 1, &u16_tokens([1])));
    assert!(
        matches!(&e, DataError::BadHeader { offset: 0, path: p, .. } if *p == path),
        "{e}"
    );
    assert!(e.to_string().contains("magic.bin"));

    let (_, e) = llmc_case("version.bin", llmc(LLMC_MAGIC_U16, 2, 1, &u16_tokens([1])));
    assert!(matches!(e, DataError::BadHeader { offset: 4, .. }), "{e}");

    let (_, e) = llmc_case("negative.bin", llmc(LLMC_MAGIC_U16, 1, -4, &[]));
    assert!(matches!(e, DataError::BadHeader { offset: 8, .. }), "{e}");

    let (_, e) = llmc_case(
        "truncated.bin",
        llmc(LLMC_MAGIC_U16, 1, 10, &u16_tokens([1, 2])),
    );
    assert!(matches!(e, DataError::Length { actual: 1028, .. }), "{e}");

    let (_, e) = llmc_case("short.bin", vec![0u8; 100]);
    assert!(matches!(e, DataError::Length { actual: 100, .. }), "{e}");

    let (_, e) = llmc_case("gz.bin", vec![0x1f, 0x8b, 8, 0, 0, 0]);
    assert!(matches!(e, DataError::Compressed { .. }), "{e}");

    let odd = write(d, "odd.bin", &[1, 0, 2]);
    let e = data_error(read_token_file(&odd, TokenFormat::NanoGptU16));
    assert!(matches!(e, DataError::Length { actual: 3, .. }), "{e}");

    let e = data_error(read_token_file(&d.join("missing.bin"), TokenFormat::RawU32));
    assert!(matches!(e, DataError::Io { .. }), "{e}");
    assert!(e.to_string().contains("missing.bin"));
}

#[test]
fn token_beyond_vocabulary_is_reported_with_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut tokens: Vec<u16> = (0..200).map(|i| i % 50).collect();
    tokens[123] = 50;
    let path = write(dir.path(), "t.bin", &u16_tokens(tokens));
    let config = DataConfig {
        shard: 0,
        shards: 1,
        batch_size: 4,
        eval_samples: 2,
        source: DataSource::Tokens(TokensConfig {
            path,
            format: TokenFormat::NanoGptU16,
            vocab: 50,
        }),
    };
    let e = open_error(&config, 8);
    assert!(
        matches!(
            e,
            DataError::TokenOutOfRange {
                offset: 246,
                token: 50,
                vocab: 50,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn file_too_small_for_eval_and_shards_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "tiny.txt", b"hello world");
    let config = DataConfig {
        shard: 0,
        shards: 1,
        batch_size: 4,
        eval_samples: 2,
        source: DataSource::Text(TextConfig { path }),
    };
    let e = open_error(&config, 8);
    assert!(matches!(e, DataError::TooSmall { .. }), "{e}");
}

/// Token i of the file is i, so every window reveals where it was read from.
fn position_file(dir: &Path, n: u32) -> DataConfig {
    let path = write(dir, "positions.bin", &u32_tokens(0..n));
    DataConfig {
        shard: 0,
        shards: 1,
        batch_size: 8,
        eval_samples: 10,
        source: DataSource::Tokens(TokensConfig {
            path,
            format: TokenFormat::RawU32,
            vocab: n as usize,
        }),
    }
}

fn positions_drawn(dataset: &mut dyn Dataset, batches: usize) -> HashSet<u32> {
    let mut seen = HashSet::new();
    let mut batch = dataset.empty_batch(8);
    for _ in 0..batches {
        dataset.fill_train_batch(8, &mut batch);
        let BatchInputs::Tokens { ids, context } = &batch.inputs else {
            panic!("token data yields tokens")
        };
        for (row, targets) in ids.chunks(*context).zip(batch.targets.chunks(*context)) {
            // Windows are contiguous and targets are the inputs shifted by one.
            for k in 0..*context {
                assert_eq!(row[k], row[0] + k as u32);
                assert_eq!(targets[k], row[k] + 1);
            }
            seen.extend(row.iter().copied());
            seen.insert(*targets.last().unwrap());
        }
    }
    seen
}

#[test]
fn token_shards_are_disjoint_and_eval_is_shared_and_held_out() {
    let dir = tempfile::tempdir().unwrap();
    let config = position_file(dir.path(), 2000);
    let context = 16;
    let mut a = open_dataset(&config, Some(context), peer(1, 0, 3)).unwrap();
    let mut b = open_dataset(&config, Some(context), peer(2, 1, 3)).unwrap();
    let mut c = open_dataset(&config, Some(context), peer(3, 2, 3)).unwrap();
    assert_eq!(a.eval_set(), b.eval_set());
    assert_eq!(a.eval_set(), c.eval_set());
    assert_eq!(
        a.shape(),
        DataShape::Tokens {
            vocab: 2000,
            context
        }
    );

    let eval: HashSet<u32> = a
        .eval_set()
        .iter()
        .flat_map(|batch| match &batch.inputs {
            BatchInputs::Tokens { ids, .. } => ids.clone(),
            BatchInputs::Features { .. } => vec![],
        })
        .collect();
    // Eval windows are the last 10 × 17 tokens.
    assert_eq!(eval.iter().min(), Some(&(2000 - 170)));

    let sa = positions_drawn(a.as_mut(), 40);
    let sb = positions_drawn(b.as_mut(), 40);
    let sc = positions_drawn(c.as_mut(), 40);
    for (x, y) in [(&sa, &sb), (&sa, &sc), (&sb, &sc)] {
        assert_eq!(x.intersection(y).count(), 0, "shards overlap");
    }
    for s in [&sa, &sb, &sc] {
        assert!(
            s.iter().all(|p| *p < 2000 - 170),
            "training read the eval tail"
        );
        assert!(s.len() > 200, "a shard's stream covers its part");
    }
}

#[test]
fn text_is_read_as_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let text: Vec<u8> = "the quick brown fox jumps over the lazy dog. "
        .repeat(20)
        .into_bytes();
    let path = write(dir.path(), "corpus.txt", &text);
    let config = DataConfig {
        shard: 0,
        shards: 1,
        batch_size: 4,
        eval_samples: 3,
        source: DataSource::Text(TextConfig { path }),
    };
    let mut d = open_dataset(&config, Some(10), peer(1, 0, 1)).unwrap();
    assert_eq!(
        d.shape(),
        DataShape::Tokens {
            vocab: 256,
            context: 10
        }
    );
    let batch = d.train_batch(4);
    let BatchInputs::Tokens { ids, .. } = &batch.inputs else {
        panic!("text yields tokens")
    };
    assert!(ids.iter().all(|&t| text.contains(&(t as u8))));
    assert_eq!(d.eval_set()[0].rows, 3);
}

fn idx_bytes(kind: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, 0x08, kind];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    bytes
}

/// `n` images of 1×2 pixels encoding their own index, labels `index mod 10`.
fn idx_pair(dir: &Path, prefix: &str, n: u32) -> (PathBuf, PathBuf) {
    let pixels: Vec<u8> = (0..n)
        .flat_map(|i| [(i / 256) as u8, (i % 256) as u8])
        .collect();
    let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    (
        write(
            dir,
            &format!("{prefix}-images"),
            &idx_bytes(3, &[n, 1, 2], &pixels),
        ),
        write(
            dir,
            &format!("{prefix}-labels"),
            &idx_bytes(1, &[n], &labels),
        ),
    )
}

fn index_of(pixels: &[f32]) -> u32 {
    (pixels[0] * 255.0).round() as u32 * 256 + (pixels[1] * 255.0).round() as u32
}

#[test]
fn idx_shards_are_disjoint_and_cover_their_part_each_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (images, labels) = idx_pair(dir.path(), "train", 300);
    let config = DataConfig {
        shard: 0,
        shards: 1,
        batch_size: 10,
        eval_samples: 40,
        source: DataSource::Idx(IdxConfig {
            images,
            labels,
            eval_images: None,
            eval_labels: None,
            classes: 10,
        }),
    };
    let mut drawn = Vec::new();
    let mut evals = Vec::new();
    for shard in 0..2 {
        let mut d = open_dataset(&config, None, peer(10 + u64::from(shard), shard, 2)).unwrap();
        assert_eq!(
            d.shape(),
            DataShape::Features {
                width: 2,
                classes: 10
            }
        );
        evals.push(d.eval_set().to_vec());
        let mut seen = Vec::new();
        for _ in 0..13 {
            let batch = d.train_batch(10);
            let BatchInputs::Features { values, .. } = &batch.inputs else {
                panic!("idx yields features")
            };
            for (row, label) in values.chunks(2).zip(&batch.targets) {
                let i = index_of(row);
                assert_eq!(*label, i % 10, "label travels with its image");
                seen.push(i);
            }
        }
        // 260 training examples, 130 per shard: one epoch visits each exactly once.
        let epoch: HashSet<u32> = seen[..130].iter().copied().collect();
        assert_eq!(epoch.len(), 130);
        assert!(epoch.iter().all(|i| i % 2 == shard && *i < 260));
        drawn.push(epoch);
    }
    assert_eq!(drawn[0].intersection(&drawn[1]).count(), 0);
    assert_eq!(evals[0], evals[1]);
    let eval_indices: Vec<u32> = evals[0]
        .iter()
        .flat_map(|b| match &b.inputs {
            BatchInputs::Features { values, .. } => values.chunks(2).map(index_of).collect(),
            BatchInputs::Tokens { .. } => vec![],
        })
        .collect();
    assert_eq!(eval_indices, (260..300).collect::<Vec<_>>());
}

#[test]
fn idx_with_separate_eval_files_uses_them() {
    let dir = tempfile::tempdir().unwrap();
    let (images, labels) = idx_pair(dir.path(), "train", 50);
    let (eval_images, eval_labels) = idx_pair(dir.path(), "t10k", 20);
    let config = DataConfig {
        shard: 0,
        shards: 1,
        batch_size: 8,
        eval_samples: 100,
        source: DataSource::Idx(IdxConfig {
            images,
            labels,
            eval_images: Some(eval_images),
            eval_labels: Some(eval_labels),
            classes: 10,
        }),
    };
    let d = open_dataset(&config, None, peer(1, 0, 1)).unwrap();
    // All 20 eval examples (fewer than asked for), none of the 50 training ones held out.
    let rows: usize = d.eval_set().iter().map(|b| b.rows).sum();
    assert_eq!(rows, 20);
}

#[test]
fn bad_idx_files_fail_with_specific_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let case = |name: &str, bytes: Vec<u8>, ndim: u8| {
        let path = write(d, name, &bytes);
        data_error(read_idx(&path, ndim))
    };
    let e = case("gz", vec![0x1f, 0x8b, 0, 0, 0, 0], 1);
    assert!(matches!(e, DataError::Compressed { .. }), "{e}");
    let e = case("short", vec![0, 0], 1);
    assert!(matches!(e, DataError::Length { actual: 2, .. }), "{e}");
    let e = case("magic", vec![1, 0, 8, 1, 0, 0, 0, 1, 5], 1);
    assert!(matches!(e, DataError::BadHeader { offset: 0, .. }), "{e}");
    let e = case("type", vec![0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0], 1);
    assert!(matches!(e, DataError::BadHeader { offset: 2, .. }), "{e}");
    let e = case("ndim", idx_bytes(3, &[1, 1, 1], &[0]), 1);
    assert!(matches!(e, DataError::BadHeader { offset: 3, .. }), "{e}");
    let e = case("zero", idx_bytes(3, &[2, 0, 3], &[]), 3);
    assert!(matches!(e, DataError::BadHeader { offset: 8, .. }), "{e}");
    let e = case("truncated", idx_bytes(1, &[5], &[1, 2, 3]), 1);
    assert!(matches!(e, DataError::Length { actual: 11, .. }), "{e}");
    let e = case("header", vec![0, 0, 8, 3, 0, 0], 3);
    assert!(matches!(e, DataError::Length { actual: 6, .. }), "{e}");

    // Pairs: counts must match and labels must fit the classes.
    let images = write(d, "img", &idx_bytes(3, &[3, 1, 1], &[0, 1, 2]));
    let labels = write(d, "lab", &idx_bytes(1, &[2], &[0, 1]));
    let config = |images: PathBuf, labels: PathBuf, classes| DataConfig {
        shard: 0,
        shards: 1,
        batch_size: 1,
        eval_samples: 1,
        source: DataSource::Idx(IdxConfig {
            images,
            labels,
            eval_images: None,
            eval_labels: None,
            classes,
        }),
    };
    let e = open_error(&config(images.clone(), labels, 10), 1);
    assert!(
        matches!(
            e,
            DataError::CountMismatch {
                images: 3,
                labels: 2,
                ..
            }
        ),
        "{e}"
    );
    let labels = write(d, "lab3", &idx_bytes(1, &[3], &[0, 7, 1]));
    let e = open_error(&config(images, labels, 5), 1);
    assert!(
        matches!(
            e,
            DataError::LabelOutOfRange {
                offset: 9,
                label: 7,
                classes: 5,
                ..
            }
        ),
        "{e}"
    );
}
