//! Config sections parse strictly and validate with errors that name the key.

use murmur_trainer::data::TokenFormat;
use murmur_trainer::{
    ConfigError, DataSource, ModelConfig, OptimizerConfig, PeerSampling, TaskConfig, TaskPreset,
};

const FULL: &str = r#"{
    "model": { "kind": "gpt", "layers": 2, "heads": 4, "width": 32, "context": 16 },
    "data": {
        "batch_size": 8,
        "eval_samples": 32,
        "source": { "kind": "synthetic-markov", "states": 12, "branching": 3 }
    },
    "optimizer": { "kind": "lamb", "weight_decay": 0.02 },
    "schedule": { "peak_lr": 0.001, "warmup_steps": 10, "total_steps": 100 }
}"#;

#[test]
fn a_full_config_parses_with_defaults() {
    let config: TaskConfig = serde_json::from_str(FULL).unwrap();
    config.validate().unwrap();
    let ModelConfig::Gpt(gpt) = &config.model else {
        panic!("kind = gpt")
    };
    assert_eq!(
        (gpt.layers, gpt.heads, gpt.width, gpt.context, gpt.mlp_ratio),
        (2, 4, 32, 16, 4)
    );
    assert_eq!(
        config.optimizer,
        OptimizerConfig::Lamb {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-6,
            weight_decay: 0.02
        }
    );
    assert_eq!(config.schedule.min_lr_ratio, 0.1);
    let task = config
        .build(PeerSampling {
            swarm_seed: 1,
            peer_seed: 2,
            shard: 0,
            shards: 1,
        })
        .unwrap();
    assert!(task.model.param_count() > 0);
}

#[test]
fn unknown_keys_are_refused_in_every_section() {
    let cases = [
        (r#""layers": 2,"#, r#""layers": 2, "depth": 3,"#),
        (r#""states": 12,"#, r#""states": 12, "temperature": 1,"#),
        (
            r#""batch_size": 8,"#,
            r#""batch_size": 8, "shuffle": true,"#,
        ),
        (
            r#""weight_decay": 0.02"#,
            r#""weight_decay": 0.02, "nesterov": true"#,
        ),
        (
            r#""total_steps": 100"#,
            r#""total_steps": 100, "gamma": 0.5"#,
        ),
        (r#""kind": "lamb""#, r#""kind": "adam""#),
    ];
    for (from, to) in cases {
        let text = FULL.replacen(from, to, 1);
        assert_ne!(text, FULL, "case {to} did not apply");
        let err = serde_json::from_str::<TaskConfig>(&text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown"), "{to}: {err}");
    }
}

#[test]
fn token_sources_parse() {
    let text = r#"{ "kind": "tokens", "path": "shard_000.bin", "format": "llmc", "vocab": 50257 }"#;
    let DataSource::Tokens(tokens) = serde_json::from_str::<DataSource>(text).unwrap() else {
        panic!("kind = tokens")
    };
    assert_eq!(tokens.format, TokenFormat::LlmC);
    let text = r#"{ "kind": "idx", "images": "a", "labels": "b", "eval_images": "c" }"#;
    let DataSource::Idx(idx) = serde_json::from_str::<DataSource>(text).unwrap() else {
        panic!("kind = idx")
    };
    assert_eq!(idx.classes, 10);
    assert!(
        idx.validate()
            .unwrap_err()
            .to_string()
            .contains("eval_labels")
    );
}

#[test]
fn validation_names_the_key_and_the_range() {
    let mut config: TaskConfig = serde_json::from_str(FULL).unwrap();
    let ModelConfig::Gpt(gpt) = &mut config.model else {
        panic!("kind = gpt")
    };
    gpt.heads = 5;
    let err = config.validate().unwrap_err();
    assert!(
        matches!(&err, ConfigError::Incompatible { key, .. } if key == "model.heads"),
        "{err}"
    );

    let mut config: TaskConfig = serde_json::from_str(FULL).unwrap();
    let ModelConfig::Gpt(gpt) = &mut config.model else {
        panic!("kind = gpt")
    };
    gpt.layers = 0;
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("model.layers") && err.contains("1..=64"),
        "{err}"
    );

    // A model that cannot read the data.
    let mut config: TaskConfig = serde_json::from_str(FULL).unwrap();
    config.model = serde_json::from_str(r#"{ "kind": "mlp", "hidden": [8] }"#).unwrap();
    let err = config.validate().unwrap_err();
    assert!(
        matches!(&err, ConfigError::Incompatible { key, .. } if key == "model.kind"),
        "{err}"
    );
}

#[test]
fn presets_are_valid() {
    for preset in [TaskPreset::MarkovGpt, TaskPreset::TeacherMlp] {
        preset.config().validate().unwrap();
    }
    assert_eq!(TaskPreset::default_local(), TaskPreset::MarkovGpt.config());
}
