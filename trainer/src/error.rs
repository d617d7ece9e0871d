//! The trainer's typed errors: one enum per concern, gathered under [`TrainerError`].

use std::path::PathBuf;

use thiserror::Error;

/// A configuration value is outside what the trainer accepts.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// A key holds a value outside its allowed range.
    #[error("`{key}` = {value} is out of range: allowed {allowed}")]
    OutOfRange {
        /// Dotted path of the key, e.g. `model.gpt.heads`.
        key: String,
        /// The value found, as text.
        value: String,
        /// The allowed range or set, as text.
        allowed: String,
    },
    /// Two sections do not fit together (e.g. a GPT on feature data).
    #[error("`{key}` does not fit the rest of the task: {reason}")]
    Incompatible {
        /// Dotted path of the key that has to change.
        key: String,
        /// What does not fit and what would.
        reason: String,
    },
}

impl ConfigError {
    /// Shorthand for [`ConfigError::OutOfRange`].
    pub(crate) fn out_of_range(
        key: impl Into<String>,
        value: impl ToString,
        allowed: impl Into<String>,
    ) -> Self {
        Self::OutOfRange {
            key: key.into(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}

/// A data file could not be read or is not in the format its config names.
#[derive(Debug, Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is gzip-compressed; the trainer reads raw files.
    #[error("{} is gzip-compressed; decompress it first (e.g. `gunzip -k`)", path.display())]
    Compressed {
        /// The file.
        path: PathBuf,
    },
    /// A header field holds a value the format does not allow.
    #[error("{}: bad header at byte {offset}: {what}", path.display())]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// Byte offset of the offending field.
        offset: u64,
        /// What was found and what was expected.
        what: String,
    },
    /// The file's length disagrees with what its header or format implies.
    #[error("{}: file is {actual} bytes but {expected_what}", path.display())]
    Length {
        /// The file.
        path: PathBuf,
        /// The file's real length in bytes.
        actual: u64,
        /// What the header or format implies, in words.
        expected_what: String,
    },
    /// A token id is not below the configured vocabulary size.
    #[error(
        "{}: token {token} at byte {offset} is not below the vocabulary size {vocab}; raise `data.source.vocab` or re-tokenize",
        path.display()
    )]
    TokenOutOfRange {
        /// The file.
        path: PathBuf,
        /// Byte offset of the token.
        offset: u64,
        /// The token id found.
        token: u32,
        /// The configured vocabulary size.
        vocab: usize,
    },
    /// A class label is not below the number of classes.
    #[error("{}: label {label} at byte {offset} is not below {classes} classes", path.display())]
    LabelOutOfRange {
        /// The file.
        path: PathBuf,
        /// Byte offset of the label.
        offset: u64,
        /// The label found.
        label: u32,
        /// The number of classes the model has.
        classes: usize,
    },
    /// An image file and its label file hold different numbers of samples.
    #[error(
        "{} holds {images} images but {} holds {labels} labels; pair the files of the same split",
        images_path.display(),
        labels_path.display()
    )]
    CountMismatch {
        /// The image file.
        images_path: PathBuf,
        /// The label file.
        labels_path: PathBuf,
        /// Images in the image file.
        images: usize,
        /// Labels in the label file.
        labels: usize,
    },
    /// The file is too small for the eval set and one training sample per shard.
    #[error("{}: {what}", path.display())]
    TooSmall {
        /// The file.
        path: PathBuf,
        /// What was needed and what the file holds.
        what: String,
    },
}

/// Writing the model to a safetensors file failed.
#[derive(Debug, Error)]
pub enum ExportError {
    /// The safetensors writer refused the tensors or could not write the file.
    #[error("cannot write safetensors file {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The writer's error.
        source: safetensors::SafeTensorError,
    },
    /// The file could not be written or moved into place.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// The device a model should run on cannot be named or opened.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// The device's name is not `cpu`, `cuda` or `cuda:N`.
    #[error("unknown device `{text}`: use `cpu`, `cuda` (GPU 0) or `cuda:N`")]
    Unknown {
        /// The name given.
        text: String,
    },
    /// A GPU was asked of a build without the `cuda` feature.
    #[error(
        "CUDA GPU {ordinal} requested, but this build has no CUDA backend; rebuild with \
         `--features cuda` (see docs/gpu.md) or train on the CPU"
    )]
    NotBuilt {
        /// The GPU asked for.
        ordinal: usize,
    },
    /// The CUDA driver or the GPU refused: no GPU, no such ordinal, a driver older than the
    /// toolkit the kernels were built with, or no memory left.
    #[error(
        "cannot open CUDA GPU {ordinal}: {message}; check `nvidia-smi` (GPUs, driver's CUDA \
         version) or train on the CPU"
    )]
    Open {
        /// The GPU asked for.
        ordinal: usize,
        /// What candle or the driver reported.
        message: String,
    },
}

/// Anything the trainer can fail at.
#[derive(Debug, Error)]
pub enum TrainerError {
    /// candle failed inside a forward or backward pass.
    #[error("model computation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// A flat buffer's length differs from the model's parameter count.
    #[error("{buffer} holds {actual} values but the layout has {expected}")]
    BufferLength {
        /// Which buffer (`params`, `grad`, an optimizer slot).
        buffer: &'static str,
        /// The layout's parameter count.
        expected: usize,
        /// The buffer's length.
        actual: usize,
    },
    /// The optimizer's state slots are not in the form its config keeps them in (`f32`
    /// or 8-bit codes).
    #[error("the optimizer's state is in the wrong form: {0}")]
    StateForm(&'static str),
    /// A batch's shape or contents do not fit the model.
    #[error("batch does not fit the model: {reason}")]
    BatchMismatch {
        /// What does not fit.
        reason: String,
    },
    /// A configuration error.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A data error.
    #[error(transparent)]
    Data(#[from] DataError),
    /// An export error.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// A device error.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl TrainerError {
    /// Checks that `buffer` has `expected` elements.
    pub(crate) fn check_len(
        buffer: &'static str,
        expected: usize,
        actual: usize,
    ) -> Result<(), TrainerError> {
        if expected == actual {
            Ok(())
        } else {
            Err(TrainerError::BufferLength {
                buffer,
                expected,
                actual,
            })
        }
    }
}
