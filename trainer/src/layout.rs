//! Where each named tensor lives in the flat parameter vector.
//!
//! The daemon keeps all parameters in one `Vec<f32>` because averaging (push-sum numerators,
//! butterfly parts, checkpoints, state sync) works on flat buffers. The layout names the
//! tensors inside it, in a fixed order that is the same on every peer.

use std::ops::Range;

use crate::rng::{Rng, derive_seed, tag};

/// How a tensor's initial values are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// All zeros (biases, layer-norm shifts).
    Zeros,
    /// All ones (layer-norm gains).
    Ones,
    /// Normal with mean zero and this standard deviation.
    Normal {
        /// Standard deviation.
        std: f32,
    },
}

/// One named tensor inside the flat parameter vector.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    name: String,
    shape: Vec<usize>,
    offset: usize,
    len: usize,
    decay: bool,
    init: Init,
}

impl TensorSpec {
    /// The tensor's name, as written to safetensors (e.g. `h.0.attn.c_attn.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tensor's shape, row-major.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// First element of the tensor in the flat vector.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tensor has no elements (never true for built-in models).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tensor's elements as a range of the flat vector.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len
    }

    /// Whether weight decay applies (matrices and embeddings yes; biases and norms no).
    pub fn decay(&self) -> bool {
        self.decay
    }

    /// How the tensor is initialised.
    pub fn init(&self) -> Init {
        self.init
    }
}

/// The ordered list of named tensors that make up a model's flat parameter vector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamLayout {
    tensors: Vec<TensorSpec>,
    total: usize,
}

impl ParamLayout {
    /// Appends a tensor named `name` of `shape` after the last one.
    ///
    /// `decay` says whether weight decay applies; `init` how [`ParamLayout::init`] fills it.
    pub fn push(&mut self, name: String, shape: &[usize], decay: bool, init: Init) {
        let len = shape.iter().product();
        self.tensors.push(TensorSpec {
            name,
            shape: shape.to_vec(),
            offset: self.total,
            len,
            decay,
            init,
        });
        self.total += len;
    }

    /// Total number of parameters: the flat vector's length.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether the layout holds no parameters.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The tensors in flat-vector order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// The tensor with this name, if any.
    pub fn get(&self, name: &str) -> Option<&TensorSpec> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Fresh parameters drawn from each tensor's [`Init`], deterministically from `seed`.
    ///
    /// Each tensor has its own stream (seeded by `seed` and the tensor's index), so every peer
    /// given the same swarm seed starts from bit-identical parameters.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut params = vec![0.0; self.total];
        for (index, spec) in self.tensors.iter().enumerate() {
            let values = &mut params[spec.range()];
            match spec.init {
                Init::Zeros => values.fill(0.0),
                Init::Ones => values.fill(1.0),
                Init::Normal { std } => {
                    let mut rng = Rng::new(derive_seed(&[seed, tag::INIT, index as u64]));
                    for v in values {
                        *v = (rng.normal() * f64::from(std)) as f32;
                    }
                }
            }
        }
        params
    }
}
