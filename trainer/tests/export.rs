//! The exported safetensors file holds every layout tensor, bit for bit.

use murmur_trainer::{DataShape, GptConfig, Model, ModelConfig, TrainerError, export_safetensors};
use safetensors::SafeTensors;
use safetensors::tensor::Dtype;

#[test]
fn exported_tensors_read_back_bit_exactly() {
    let config = ModelConfig::Gpt(GptConfig {
        layers: 2,
        heads: 2,
        width: 8,
        context: 6,
        vocab: None,
        mlp_ratio: 4,
    });
    let model = Model::new(
        &config,
        DataShape::Tokens {
            vocab: 11,
            context: 6,
        },
    )
    .unwrap();
    let mut params = model.init(99);
    // Values that a lossy round trip would change: subnormals, negative zero, extremes.
    params[0] = f32::MIN_POSITIVE / 3.0;
    params[1] = -0.0;
    params[2] = f32::MAX;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    export_safetensors(model.layout(), &params, &path).unwrap();

    let bytes = std::fs::read(&path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.len(), model.layout().tensors().len());
    for spec in model.layout().tensors() {
        let view = file.tensor(spec.name()).unwrap();
        assert_eq!(view.dtype(), Dtype::F32);
        assert_eq!(view.shape(), spec.shape());
        let values: Vec<u32> = view
            .data()
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let expected: Vec<u32> = params[spec.range()].iter().map(|v| v.to_bits()).collect();
        assert_eq!(values, expected, "tensor {}", spec.name());
    }
    assert!(file.names().contains(&"h.1.mlp.c_proj.weight"));
    // No partial file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn export_refuses_a_vector_of_the_wrong_length() {
    let config = ModelConfig::Gpt(GptConfig {
        layers: 1,
        heads: 1,
        width: 4,
        context: 2,
        vocab: None,
        mlp_ratio: 1,
    });
    let model = Model::new(
        &config,
        DataShape::Tokens {
            vocab: 3,
            context: 2,
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = export_safetensors(model.layout(), &[0.0; 5], &dir.path().join("m")).unwrap_err();
    assert!(matches!(err, TrainerError::BufferLength { actual: 5, .. }));
}
