//! A multi-layer perceptron classifier over dense feature rows.

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::autograd::{GradWrite, ParamTensors, cross_entropy};
use super::grad_sink::OpenSink;
use super::linear::linear;
use crate::batch::{Batch, BatchInputs};
use crate::error::{ConfigError, TrainerError};
use crate::layout::{Init, ParamLayout};
use crate::transfer;

/// Largest width of any layer the config accepts.
const MAX_WIDTH: usize = 1 << 16;

/// Hidden-layer non-linearity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    /// max(0, x); weights start with He initialisation.
    #[default]
    Relu,
    /// tanh(x); weights start with LeCun initialisation.
    Tanh,
    /// GELU (tanh approximation); weights start with LeCun initialisation.
    Gelu,
}

/// The `[model]` section for `kind = "mlp"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MlpConfig {
    /// Width of each hidden layer, input side first (may be empty: logistic regression).
    pub hidden: Vec<usize>,
    /// Hidden-layer non-linearity.
    #[serde(default)]
    pub activation: Activation,
}

impl MlpConfig {
    /// Checks every width.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.hidden.len() > 16 {
            return Err(ConfigError::out_of_range(
                "model.hidden",
                format!("{} layers", self.hidden.len()),
                "at most 16 hidden layers",
            ));
        }
        for (i, &w) in self.hidden.iter().enumerate() {
            if !(1..=MAX_WIDTH).contains(&w) {
                return Err(ConfigError::out_of_range(
                    format!("model.hidden[{i}]"),
                    w,
                    format!("1..={MAX_WIDTH}"),
                ));
            }
        }
        Ok(())
    }
}

/// The MLP: `features → hidden… → classes`, weights stored `[in, out]`.
#[derive(Debug)]
pub struct Mlp {
    layout: ParamLayout,
    activation: Activation,
    features: usize,
    classes: usize,
    device: Device,
}

impl Mlp {
    /// Builds the layout for `features` inputs and `classes` outputs.
    pub(crate) fn new(
        config: &MlpConfig,
        features: usize,
        classes: usize,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut layout = ParamLayout::default();
        let mut fan_in = features;
        let widths = config
            .hidden
            .iter()
            .copied()
            .chain(std::iter::once(classes));
        for (i, fan_out) in widths.enumerate() {
            let gain = match config.activation {
                Activation::Relu if i < config.hidden.len() => 2.0,
                _ => 1.0,
            };
            let std = (gain / fan_in as f32).sqrt();
            layout.push(
                format!("layers.{i}.weight"),
                &[fan_in, fan_out],
                true,
                Init::Normal { std },
            );
            layout.push(format!("layers.{i}.bias"), &[fan_out], false, Init::Zeros);
            fan_in = fan_out;
        }
        Ok(Self {
            layout,
            activation: config.activation,
            features,
            classes,
            device: Device::Cpu,
        })
    }

    /// The flat-vector layout.
    pub(crate) fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The device the passes run on.
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Runs the passes on `device` from now on.
    pub(crate) fn set_device(&mut self, device: Device) -> Result<(), TrainerError> {
        self.device = device;
        Ok(())
    }

    /// Mean loss; gradient into `grad_out` when given, as `write` says.
    pub(crate) fn run(
        &self,
        weights: &ParamTensors,
        batch: &Batch,
        mut grad_out: Option<&mut [f32]>,
        write: GradWrite,
    ) -> Result<f32, TrainerError> {
        let BatchInputs::Features { values, width } = &batch.inputs else {
            return Err(TrainerError::BatchMismatch {
                reason: "the MLP reads feature rows, not tokens".into(),
            });
        };
        if *width != self.features || values.len() != batch.rows * width {
            return Err(TrainerError::BatchMismatch {
                reason: format!(
                    "expected {} rows of {} features, got {} values of width {width}",
                    batch.rows,
                    self.features,
                    values.len()
                ),
            });
        }
        if batch.rows == 0 || batch.targets.len() != batch.rows {
            return Err(TrainerError::BatchMismatch {
                reason: format!(
                    "expected one target per row for {} rows, got {}",
                    batch.rows,
                    batch.targets.len()
                ),
            });
        }
        super::check_ids("label", &batch.targets, self.classes)?;
        // The weights' gradients go into the flat gradient as the linear op computes them
        // (on the CPU; on a GPU the sink stays empty and the graph carries them).
        let open = grad_out
            .as_deref_mut()
            .map(|grad_out| OpenSink::open(grad_out, &self.layout, write));
        let mut x = Tensor::from_slice(values, (batch.rows, *width), &self.device)?;
        transfer::uploaded(&self.device, std::mem::size_of_val(values));
        let layers = self.layout.tensors().len() / 2;
        for layer in 0..layers {
            let w = weights.get(2 * layer);
            let b = weights.get(2 * layer + 1);
            let sink = open.as_ref().map(|open| (open.sink(), 2 * layer));
            x = linear(&x, w, sink)?.broadcast_add(b)?;
            if layer + 1 < layers {
                x = match self.activation {
                    Activation::Relu => x.relu()?,
                    Activation::Tanh => x.tanh()?,
                    Activation::Gelu => super::gelu::apply(&x)?,
                };
            }
        }
        let targets = Tensor::from_slice(&batch.targets, batch.rows, &self.device)?;
        transfer::uploaded(
            &self.device,
            std::mem::size_of_val(batch.targets.as_slice()),
        );
        let loss = cross_entropy(&x, &targets)?;
        transfer::downloaded(&self.device, std::mem::size_of::<f32>());
        let value = loss.to_scalar::<f32>()?;
        let backward = |open: OpenSink<'_>| -> candle_core::Result<_> {
            let grads = loss.backward()?;
            drop((loss, x));
            Ok((grads, open.close()))
        };
        let Some((grads, written)) = open.map(backward).transpose()? else {
            return Ok(value);
        };
        let Some(grad_out) = grad_out else {
            unreachable!("the sink was open over the gradient buffer")
        };
        weights.write_grads(grads, &self.layout, grad_out, write, &written)?;
        Ok(value)
    }
}
