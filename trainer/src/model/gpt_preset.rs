//! Named GPT shapes (`model.preset`), so that a config can ask for a common size by name
//! and override any of its keys.

use serde::{Deserialize, Serialize};

use super::gpt::GptConfig;

/// A named GPT shape. The GPT-2 shapes are those of Radford et al. (2019): tied input and
/// output embeddings, a 1024-token context and GPT-2's BPE vocabulary of 50,257 tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GptPreset {
    /// GPT-2 small: 12 layers, 12 heads, width 768 (124,439,808 parameters).
    #[serde(rename = "gpt2-124m")]
    Gpt2Small,
    /// GPT-2 medium: 24 layers, 16 heads, width 1024 (354,823,168 parameters).
    #[serde(rename = "gpt2-355m")]
    Gpt2Medium,
}

impl GptPreset {
    /// The preset's shape.
    pub fn config(self) -> GptConfig {
        let (layers, heads, width) = match self {
            GptPreset::Gpt2Small => (12, 12, 768),
            GptPreset::Gpt2Medium => (24, 16, 1024),
        };
        GptConfig {
            layers,
            heads,
            width,
            context: 1024,
            vocab: Some(50_257),
            mlp_ratio: 4,
        }
    }
}

/// The `[model]` keys of a GPT as written: a preset, or the shape itself, or a preset with
/// some keys overridden.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GptSection {
    preset: Option<GptPreset>,
    layers: Option<usize>,
    heads: Option<usize>,
    width: Option<usize>,
    context: Option<usize>,
    vocab: Option<usize>,
    mlp_ratio: Option<usize>,
}

impl TryFrom<GptSection> for GptConfig {
    type Error = String;

    fn try_from(section: GptSection) -> Result<GptConfig, String> {
        let base = section.preset.map(GptPreset::config);
        let pick = |key: &str, written: Option<usize>, preset: Option<usize>| {
            written.or(preset).ok_or_else(|| {
                format!("missing field `{key}` (or set `preset`, e.g. preset = \"gpt2-124m\")")
            })
        };
        Ok(GptConfig {
            layers: pick("layers", section.layers, base.as_ref().map(|b| b.layers))?,
            heads: pick("heads", section.heads, base.as_ref().map(|b| b.heads))?,
            width: pick("width", section.width, base.as_ref().map(|b| b.width))?,
            context: pick("context", section.context, base.as_ref().map(|b| b.context))?,
            vocab: section.vocab.or(base.as_ref().and_then(|b| b.vocab)),
            mlp_ratio: section
                .mlp_ratio
                .or(base.as_ref().map(|b| b.mlp_ratio))
                .unwrap_or(4),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Gpt, ModelConfig};

    fn read(text: &str) -> Result<ModelConfig, String> {
        #[derive(Deserialize)]
        struct Doc {
            model: ModelConfig,
        }
        toml::from_str::<Doc>(text)
            .map(|d| d.model)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_preset_gives_gpt2_small_and_written_keys_override_it() {
        let ModelConfig::Gpt(small) =
            read("[model]\nkind = \"gpt\"\npreset = \"gpt2-124m\"\n").unwrap()
        else {
            panic!("not a gpt")
        };
        assert_eq!(small, GptPreset::Gpt2Small.config());
        let gpt = Gpt::new(&small, 256).unwrap();
        assert_eq!(gpt.layout().len(), 124_439_808);
        let medium = Gpt::new(&GptPreset::Gpt2Medium.config(), 256).unwrap();
        assert_eq!(medium.layout().len(), 354_823_168);
        let ModelConfig::Gpt(short) =
            read("[model]\nkind = \"gpt\"\npreset = \"gpt2-124m\"\ncontext = 256\n").unwrap()
        else {
            panic!("not a gpt")
        };
        assert_eq!(short.context, 256);
        assert_eq!(short.width, 768);
    }

    #[test]
    fn without_a_preset_the_shape_is_required_and_unknown_names_are_refused() {
        let error =
            read("[model]\nkind = \"gpt\"\nlayers = 2\nheads = 2\nwidth = 64\n").unwrap_err();
        assert!(error.contains("missing field `context`"), "{error}");
        let error = read("[model]\nkind = \"gpt\"\npreset = \"gpt3\"\n").unwrap_err();
        assert!(error.contains("gpt2-124m"), "{error}");
        let error =
            read("[model]\nkind = \"gpt\"\npreset = \"gpt2-124m\"\ndepth = 3\n").unwrap_err();
        assert!(error.contains("unknown field `depth`"), "{error}");
    }
}
