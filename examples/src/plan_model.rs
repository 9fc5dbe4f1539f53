//! The `plan` binary's `--model`: a model given by its configuration, whose parameters'
//! shapes are computed from the sizes without allocating a weight, so that a plan of a
//! strategy whose traffic follows the shapes (DeMo's DCT chunks, PowerSGD's factors) runs
//! at any size ([`gym_core::planner::PlanConfig::shapes`]).

use gym_models::{GptConfig, GptSize};
use std::str::FromStr;

/// A model's parameter shapes, from `--model`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShapes {
    /// The spec as given (`gpt:12,12,768,1024,50257`).
    pub spec: String,
    /// The trainable parameters' shapes, in the model's layout order.
    pub shapes: Vec<Vec<usize>>,
    /// Their elements: the model's parameter count.
    pub params: u64,
}

/// `gpt:LAYERS,HEADS,WIDTH,CONTEXT,VOCAB` (nanoGPT's sizes, e.g. `gpt:12,12,768,1024,50257`
/// for GPT-2 small, 124M) or `gpt:PRESET,CONTEXT,VOCAB` (`gpt:base,1024,50257`; presets:
/// small, sbase, base, medium, large, xl).
impl FromStr for ModelShapes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = "expected gpt:LAYERS,HEADS,WIDTH,CONTEXT,VOCAB or gpt:PRESET,CONTEXT,VOCAB";
        let Some(sizes) = s.trim().strip_prefix("gpt:") else {
            return Err(format!("`{s}`: {usage}"));
        };
        let fields: Vec<&str> = sizes.split(',').map(str::trim).collect();
        let number = |name: &str, v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("`{s}`: {name} `{v}` is not a whole number"))
        };
        let config = match fields.as_slice() {
            [layers, heads, width, context, vocab] => {
                GptConfig::new(number("VOCAB", vocab)?, number("CONTEXT", context)?)
                    .with_n_layer(number("LAYERS", layers)?)
                    .with_n_head(number("HEADS", heads)?)
                    .with_n_embd(number("WIDTH", width)?)
            }
            [preset, context, vocab] if preset.parse::<usize>().is_err() => {
                let size: GptSize = preset.parse().map_err(|e| format!("`{s}`: {e}"))?;
                GptConfig::preset(size, number("VOCAB", vocab)?, number("CONTEXT", context)?)
            }
            _ => return Err(format!("`{s}`: {usage}")),
        };
        config.validate().map_err(|e| format!("`{s}`: {e}"))?;
        let shapes = config.param_shapes();
        let params = shapes
            .iter()
            .map(|shape| shape.iter().map(|&d| d as u64).product::<u64>())
            .sum();
        Ok(ModelShapes {
            spec: s.trim().to_string(),
            shapes,
            params,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_small_has_its_published_parameter_count() {
        let m: ModelShapes = "gpt:12,12,768,1024,50257".parse().unwrap();
        // GPT-2 small with its position embedding: 124,439,808.
        assert_eq!(m.params, 124_439_808);
        assert_eq!(m.shapes.len(), 2 + 12 * 12 + 2);
        assert_eq!(
            "gpt:base,1024,50257".parse::<ModelShapes>().unwrap().shapes,
            m.shapes
        );
    }

    #[test]
    fn bad_specs_are_refused_naming_the_field() {
        for (spec, needle) in [
            ("gpt:12,12,768", "PRESET"),
            ("llama:1,2,3,4,5", "expected gpt:"),
            ("gpt:12,12,x,1024,50257", "WIDTH"),
            ("gpt:12,5,768,1024,50257", "n_head"),
            ("gpt:huge,1024,50257", "unknown model size"),
            ("gpt:0,12,768,1024,50257", "n_layer"),
        ] {
            let err = spec.parse::<ModelShapes>().unwrap_err();
            assert!(err.contains(needle), "{spec}: {err}");
        }
    }
}
