//! idx: MNIST-format image and label files (LeCun et al.'s IDX format).
//!
//! An IDX file starts with two zero bytes, a type byte (0x08: unsigned bytes, the only type
//! MNIST and its variants use) and the number of dimensions, then each dimension as a
//! big-endian `u32`, then the data row-major. Labels are 1-D (magic 0x00000801), images 3-D
//! (magic 0x00000803). Pixels are scaled to `[0, 1]`.
//!
//! Without separate eval files, the last `eval_samples` examples of the training files are held
//! out. Training examples are dealt to shards by index (`i mod shards`); each peer walks its
//! shard in a fresh random order every epoch.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{GZIP_MAGIC, PeerSampling, build_eval_set, read_whole_file};
use crate::batch::Batch;
use crate::data::Dataset;
use crate::error::{ConfigError, DataError};
use crate::model::DataShape;
use crate::rng::{Rng, tag};

/// IDX type byte for unsigned bytes.
pub const IDX_TYPE_U8: u8 = 0x08;

fn default_classes() -> usize {
    10
}

/// The `[data.source]` section for `kind = "idx"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IdxConfig {
    /// Training images (3-D IDX, e.g. `train-images-idx3-ubyte`).
    pub images: PathBuf,
    /// Training labels (1-D IDX, e.g. `train-labels-idx1-ubyte`).
    pub labels: PathBuf,
    /// Eval images; without them the training files' tail is held out.
    #[serde(default)]
    pub eval_images: Option<PathBuf>,
    /// Eval labels; set together with `eval_images`.
    #[serde(default)]
    pub eval_labels: Option<PathBuf>,
    /// Number of classes; every label must be below it.
    #[serde(default = "default_classes")]
    pub classes: usize,
}

impl IdxConfig {
    /// Checks the class count and that eval files come in pairs.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(2..=256).contains(&self.classes) {
            return Err(ConfigError::out_of_range(
                "data.source.classes",
                self.classes,
                "2..=256",
            ));
        }
        if self.eval_images.is_some() != self.eval_labels.is_some() {
            return Err(ConfigError::Incompatible {
                key: "data.source.eval_images".into(),
                reason: "set both eval_images and eval_labels, or neither".into(),
            });
        }
        Ok(())
    }
}

/// An IDX array of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// The values, row-major.
    pub data: Vec<u8>,
    /// Header length in bytes (where `data` starts in the file).
    pub header_len: usize,
}

/// Reads an IDX file of unsigned bytes with `ndim` dimensions, checking its header and length.
pub fn read_idx(path: &Path, ndim: u8) -> Result<IdxArray, DataError> {
    let mut bytes = read_whole_file(path)?;
    let bad = |offset: u64, what: String| DataError::BadHeader {
        path: path.to_path_buf(),
        offset,
        what,
    };
    if bytes.starts_with(&GZIP_MAGIC) {
        return Err(DataError::Compressed {
            path: path.to_path_buf(),
        });
    }
    if bytes.len() < 4 {
        return Err(DataError::Length {
            path: path.to_path_buf(),
            actual: bytes.len() as u64,
            expected_what: "an IDX file starts with a 4-byte magic number".into(),
        });
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(
            0,
            format!(
                "magic starts {:#04x} {:#04x}, not two zero bytes: not an IDX file",
                bytes[0], bytes[1]
            ),
        ));
    }
    if bytes[2] != IDX_TYPE_U8 {
        return Err(bad(
            2,
            format!(
                "data type {:#04x}; only {IDX_TYPE_U8:#04x} (unsigned bytes) is supported",
                bytes[2]
            ),
        ));
    }
    if bytes[3] != ndim {
        return Err(bad(
            3,
            format!(
                "{} dimensions; expected {ndim} (magic {:#010x})",
                bytes[3],
                0x0800 | u32::from(ndim)
            ),
        ));
    }
    let header_len = 4 + 4 * usize::from(ndim);
    if bytes.len() < header_len {
        return Err(DataError::Length {
            path: path.to_path_buf(),
            actual: bytes.len() as u64,
            expected_what: format!("the header with {ndim} dimensions needs {header_len} bytes"),
        });
    }
    let mut dims = Vec::with_capacity(usize::from(ndim));
    let mut total: u64 = 1;
    for d in 0..usize::from(ndim) {
        let at = 4 + 4 * d;
        let dim = u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        if dim == 0 {
            return Err(bad(at as u64, format!("dimension {d} is zero")));
        }
        total = total.saturating_mul(u64::from(dim));
        dims.push(dim as usize);
    }
    let expected = (header_len as u64).saturating_add(total);
    if bytes.len() as u64 != expected {
        return Err(DataError::Length {
            path: path.to_path_buf(),
            actual: bytes.len() as u64,
            expected_what: format!(
                "the header's dimensions {dims:?} need {expected} bytes ({header_len} header + \
                 {total} values)"
            ),
        });
    }
    bytes.drain(..header_len);
    Ok(IdxArray {
        dims,
        data: bytes,
        header_len,
    })
}

/// Images and labels of one split, checked against each other.
#[derive(Debug)]
struct Split {
    pixels: Vec<u8>,
    labels: Vec<u8>,
    width: usize,
}

fn read_split(images: &Path, labels: &Path, classes: usize) -> Result<Split, DataError> {
    let img = read_idx(images, 3)?;
    let lab = read_idx(labels, 1)?;
    if img.dims[0] != lab.dims[0] {
        return Err(DataError::CountMismatch {
            images_path: images.to_path_buf(),
            labels_path: labels.to_path_buf(),
            images: img.dims[0],
            labels: lab.dims[0],
        });
    }
    if let Some(i) = lab.data.iter().position(|&l| usize::from(l) >= classes) {
        return Err(DataError::LabelOutOfRange {
            path: labels.to_path_buf(),
            offset: (lab.header_len + i) as u64,
            label: u32::from(lab.data[i]),
            classes,
        });
    }
    Ok(Split {
        pixels: img.data,
        labels: lab.data,
        width: img.dims[1] * img.dims[2],
    })
}

impl Split {
    fn push(&self, index: usize, values: &mut Vec<f32>, targets: &mut Vec<u32>) {
        let row = &self.pixels[index * self.width..(index + 1) * self.width];
        values.extend(row.iter().map(|&p| f32::from(p) / 255.0));
        targets.push(u32::from(self.labels[index]));
    }
}

/// The idx dataset for one peer.
#[derive(Debug)]
pub struct IdxDataset {
    train: Split,
    classes: usize,
    /// This peer's training examples, in the current epoch's order.
    order: Vec<u32>,
    cursor: usize,
    rng: Rng,
    eval: Vec<Batch>,
}

impl IdxDataset {
    /// Reads and checks the files, holds out the eval set and deals this peer its shard.
    pub(crate) fn open(
        config: &IdxConfig,
        eval_samples: usize,
        rows: usize,
        sampling: PeerSampling,
    ) -> Result<Self, DataError> {
        let train = read_split(&config.images, &config.labels, config.classes)?;
        let count = train.labels.len();
        let (eval_split, eval_first, train_count) = match (&config.eval_images, &config.eval_labels)
        {
            (Some(images), Some(labels)) => {
                let split = read_split(images, labels, config.classes)?;
                if split.width != train.width {
                    return Err(DataError::BadHeader {
                        path: images.clone(),
                        offset: 8,
                        what: format!(
                            "images of {} pixels; the training images have {}",
                            split.width, train.width
                        ),
                    });
                }
                (Some(split), 0, count)
            }
            _ => (
                None,
                count.saturating_sub(eval_samples),
                count.saturating_sub(eval_samples),
            ),
        };
        let eval_source = eval_split.as_ref().unwrap_or(&train);
        let eval_count = eval_samples.min(eval_source.labels.len() - eval_first);
        let shards = sampling.shards as usize;
        let order: Vec<u32> = (sampling.shard as usize..train_count)
            .step_by(shards)
            .map(|i| i as u32)
            .collect();
        if order.is_empty() || eval_count == 0 {
            return Err(DataError::TooSmall {
                path: config.images.clone(),
                what: format!(
                    "holds {count} examples: not enough for {eval_samples} eval examples and \
                     one training example in each of {shards} shards"
                ),
            });
        }
        let mut next = eval_first;
        let eval = build_eval_set(
            eval_count,
            rows,
            |n| Batch::features_with_capacity(n, train.width),
            |batch, n| {
                let mut values = batch.take_feature_values();
                for _ in 0..n {
                    eval_source.push(next, &mut values, &mut batch.targets);
                    next += 1;
                }
                batch.set_features(values, train.width, n);
            },
        );
        let mut rng = Rng::for_stream(&[
            sampling.swarm_seed,
            tag::TRAIN,
            sampling.peer_seed,
            u64::from(sampling.shard),
        ]);
        let mut order = order;
        rng.shuffle(&mut order);
        Ok(Self {
            train,
            classes: config.classes,
            order,
            cursor: 0,
            rng,
            eval,
        })
    }

    /// Indices (into the training files) of this peer's shard, in the current epoch's order.
    pub fn shard_examples(&self) -> &[u32] {
        &self.order
    }
}

impl Dataset for IdxDataset {
    fn shape(&self) -> DataShape {
        DataShape::Features {
            width: self.train.width,
            classes: self.classes,
        }
    }

    fn fill_train_batch(&mut self, rows: usize, batch: &mut Batch) {
        let mut values = batch.take_feature_values();
        for _ in 0..rows {
            if self.cursor == self.order.len() {
                self.rng.shuffle(&mut self.order);
                self.cursor = 0;
            }
            let index = self.order[self.cursor] as usize;
            self.cursor += 1;
            self.train.push(index, &mut values, &mut batch.targets);
        }
        batch.set_features(values, self.train.width, rows);
    }

    fn eval_set(&self) -> &[Batch] {
        &self.eval
    }

    fn loss_floor(&self) -> Option<f32> {
        None
    }
}
