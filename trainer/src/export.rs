//! Export of the final model as a safetensors file (f32, one entry per layout tensor).
//!
//! The file is written next to its destination and renamed into place, so a reader never
//! sees a half-written model.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::error::{ExportError, TrainerError};
use crate::layout::ParamLayout;

/// Writes `params` (laid out by `layout`) to `path` as safetensors, little-endian f32, with
/// each tensor under its layout name and shape.
///
/// Pass the de-biased parameters (for push-sum, `x / w`), not the raw numerators.
pub fn export_safetensors(
    layout: &ParamLayout,
    params: &[f32],
    path: &Path,
) -> Result<(), TrainerError> {
    TrainerError::check_len("params", layout.len(), params.len())?;
    let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
    let write_err = |source| ExportError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut views = Vec::with_capacity(layout.tensors().len());
    for spec in layout.tensors() {
        let range = spec.range();
        let data = &bytes[range.start * 4..range.end * 4];
        let view = TensorView::new(Dtype::F32, spec.shape().to_vec(), data).map_err(write_err)?;
        views.push((spec.name().to_owned(), view));
    }
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let file = safetensors::serialize(views, Some(metadata)).map_err(write_err)?;

    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let io_err = |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, &file).map_err(io_err)?;
    std::fs::rename(&tmp, path).map_err(io_err)?;
    Ok(())
}
