//! `LlamaConfig` from a Hugging Face `config.json` (`model_type` llama, mistral, qwen2, qwen3,
//! phi3): the same typed configuration the GGUF metadata fills, so both formats share one
//! lowering. Rope parameters are read in transformers 5's form (`rope_parameters`, holding
//! `rope_theta` and the scaling) and in the older one (`rope_theta`, `rope_scaling`). What the
//! lowering does not implement (output-projection or MLP biases, layered sliding windows, YaRN
//! or LongRoPE scaling, activations other than SiLU) is refused by name.

use std::f64::consts::PI;

use serde_json::{Map, Value};

use super::super::ModelError;
use super::config::{Family, LlamaConfig};

/// `model_type` values read, with the family each lowers as. Mistral is LLaMA with a sliding
/// window (its converter writes `llama` GGUF files too).
const MODEL_TYPES: [(&str, Family); 5] = [
    ("llama", Family::Llama),
    ("mistral", Family::Llama),
    ("qwen2", Family::Qwen2),
    ("qwen3", Family::Qwen3),
    ("phi3", Family::Phi3),
];

fn bad<T>(field: &str, reason: String) -> Result<T, ModelError> {
    Err(ModelError::Config {
        field: field.into(),
        reason,
    })
}

fn unsupported(field: &str, value: &Value, supported: &str) -> ModelError {
    ModelError::Unsupported {
        field: format!("config.json: {field}"),
        value: value.to_string(),
        supported: supported.into(),
    }
}

/// A field that is absent or JSON `null` (transformers writes unset options as null).
fn get<'a>(c: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    c.get(key).filter(|v| !v.is_null())
}

/// `key` as an integer within `1..=max`.
fn size(c: &Map<String, Value>, key: &str, max: usize) -> Result<usize, ModelError> {
    match get(c, key) {
        None => bad(key, "missing".into()),
        Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) if (1..=max).contains(&n) => Ok(n),
            _ => bad(key, format!("{v} is not an integer in 1..={max}")),
        },
    }
}

fn size_or(
    c: &Map<String, Value>,
    key: &str,
    max: usize,
    default: usize,
) -> Result<usize, ModelError> {
    match get(c, key) {
        None => Ok(default),
        Some(_) => size(c, key, max),
    }
}

/// `key` as a finite number, `default` when absent.
fn number(c: &Map<String, Value>, key: &str, default: Option<f64>) -> Result<f64, ModelError> {
    match (get(c, key), default) {
        (None, Some(d)) => Ok(d),
        (None, None) => bad(key, "missing".into()),
        (Some(v), _) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(x),
            _ => bad(key, format!("{v} is not a finite number")),
        },
    }
}

fn flag(c: &Map<String, Value>, key: &str) -> Result<Option<bool>, ModelError> {
    match get(c, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => bad(key, format!("{v} is not true or false")),
    }
}

/// The rope settings: transformers 5's `rope_parameters`, else the top-level `rope_theta` with
/// `rope_scaling` (either may be absent: unscaled rope of base 10000).
fn rope_settings(c: &Map<String, Value>) -> Result<(String, Map<String, Value>), ModelError> {
    for key in ["rope_parameters", "rope_scaling"] {
        match get(c, key) {
            None => {}
            Some(Value::Object(m)) => return Ok((key.into(), m.clone())),
            Some(v) => return bad(key, format!("{v} is not an object")),
        }
    }
    Ok(("rope_scaling".into(), Map::new()))
}

/// Per-pair frequency divisors for the rope scaling in `r` (the object named `at`), as
/// transformers' `ROPE_INIT_FUNCTIONS` compute the frequencies: `default` none, `linear` the
/// factor, `llama3` the factor at low frequencies, 1 at high ones, and the smooth blend between
/// (llama.cpp's converter writes the same divisors as `rope_freqs.weight`).
fn rope_factors(
    at: &str,
    r: &Map<String, Value>,
    theta: f64,
    rotary_dim: usize,
) -> Result<Vec<f64>, ModelError> {
    let field = |k: &str| format!("{at}.{k}");
    let kind = match get(r, "rope_type").or_else(|| get(r, "type")) {
        None => "default".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => return bad(&field("rope_type"), format!("{v} is not a string")),
    };
    let positive = |k: &str| -> Result<f64, ModelError> {
        let x = number(r, k, None).map_err(|_| ModelError::Config {
            field: field(k),
            reason: format!("missing or not a number (needed by rope_type {kind})"),
        })?;
        if x > 0.0 {
            Ok(x)
        } else {
            bad(&field(k), format!("{x} is not positive"))
        }
    };
    let half = rotary_dim / 2;
    match kind.as_str() {
        "default" => Ok(Vec::new()),
        "linear" => Ok(vec![positive("factor")?; half]),
        "llama3" => {
            let factor = positive("factor")?;
            let low = positive("low_freq_factor")?;
            let high = positive("high_freq_factor")?;
            let old = positive("original_max_position_embeddings")?;
            if high <= low {
                return bad(
                    &field("high_freq_factor"),
                    format!("{high} is not above low_freq_factor {low}"),
                );
            }
            let (low_wavelen, high_wavelen) = (old / low, old / high);
            Ok((0..half)
                .map(|i| {
                    let freq = theta.powf(-((2 * i) as f64) / rotary_dim as f64);
                    let wavelen = 2.0 * PI / freq;
                    if wavelen < high_wavelen {
                        1.0
                    } else if wavelen > low_wavelen {
                        factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        1.0 / ((1.0 - smooth) / factor + smooth)
                    }
                })
                .collect())
        }
        other => Err(unsupported(
            &field("rope_type"),
            &Value::String(other.into()),
            "default, linear, llama3",
        )),
    }
}

impl LlamaConfig {
    /// The configuration from `config.json`'s object `c`; `has` says whether the checkpoint
    /// holds a tensor (it decides a tied head when `tie_word_embeddings` is absent).
    /// Required: `model_type` (see [`MODEL_TYPES`]), `vocab_size`, `hidden_size`,
    /// `intermediate_size`, `num_hidden_layers`, `num_attention_heads`,
    /// `max_position_embeddings`, `rms_norm_eps`; defaults as transformers': K/V heads as many
    /// as query heads, `head_dim` hidden / heads, rope base 10000.
    pub fn from_hf(c: &Value, has: &dyn Fn(&str) -> bool) -> Result<LlamaConfig, ModelError> {
        let Value::Object(c) = c else {
            return bad("(top level)", "config.json is not a JSON object".into());
        };
        let model_type = match get(c, "model_type") {
            None => return bad("model_type", "missing".into()),
            Some(v) => v,
        };
        let Some(&(_, family)) = MODEL_TYPES
            .iter()
            .find(|(n, _)| Some(*n) == model_type.as_str())
        else {
            return Err(unsupported(
                "model_type",
                model_type,
                &MODEL_TYPES.map(|(n, _)| n).join(", "),
            ));
        };
        if let Some(act) = get(c, "hidden_act") {
            if act.as_str() != Some("silu") {
                return Err(unsupported("hidden_act", act, "silu"));
            }
        }
        // Flags transformers turns into tensors the lowering has no place for.
        for key in ["mlp_bias", "attention_bias"] {
            if family != Family::Qwen2 && flag(c, key)? == Some(true) {
                return Err(unsupported(key, &Value::Bool(true), "false"));
            }
        }
        // The same bounds as the GGUF path's.
        let hidden = size(c, "hidden_size", 1 << 16)?;
        let layers = size(c, "num_hidden_layers", 1 << 10)?;
        let ffn = size(c, "intermediate_size", 1 << 18)?;
        let heads = size(c, "num_attention_heads", 1 << 10)?;
        let ctx = size(c, "max_position_embeddings", 1 << 24)?;
        let vocab = size(c, "vocab_size", 1 << 24)?;
        let kv = size_or(c, "num_key_value_heads", 1 << 10, heads)?;
        if !heads.is_multiple_of(kv) {
            return bad(
                "num_key_value_heads",
                format!("{kv} K/V heads do not divide {heads} query heads"),
            );
        }
        let head_dim = match get(c, "head_dim") {
            Some(_) => size(c, "head_dim", 1 << 12)?,
            None if hidden.is_multiple_of(heads) => hidden / heads,
            None => {
                return bad(
                    "num_attention_heads",
                    format!("{heads} heads do not divide hidden_size {hidden}"),
                )
            }
        };
        let eps = number(c, "rms_norm_eps", None)?;
        if !(eps > 0.0 && eps < 1.0) {
            return bad("rms_norm_eps", format!("{eps} is not in (0, 1)"));
        }
        let (at, rope) = rope_settings(c)?;
        let theta = match get(&rope, "rope_theta") {
            Some(_) => number(&rope, "rope_theta", None).map_err(|_| ModelError::Config {
                field: format!("{at}.rope_theta"),
                reason: "not a finite number".into(),
            })?,
            None => number(c, "rope_theta", Some(10000.0))?,
        };
        if theta <= 1.0 {
            return bad("rope_theta", format!("{theta} is not above 1"));
        }
        // Phi-3's partial rotary: transformers rotates int(head_dim · factor) dimensions.
        let partial = match get(&rope, "partial_rotary_factor") {
            Some(_) => number(&rope, "partial_rotary_factor", None)?,
            None => number(c, "partial_rotary_factor", Some(1.0))?,
        };
        if !(partial > 0.0 && partial <= 1.0) {
            return bad(
                "partial_rotary_factor",
                format!("{partial} is not in (0, 1]"),
            );
        }
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return bad(
                "partial_rotary_factor",
                format!("rope over {rotary_dim} of {head_dim} head dimensions: it needs an even count above 0"),
            );
        }
        let rope_factors = rope_factors(&at, &rope, theta, rotary_dim)?;
        let sliding_window = match family {
            // Qwen's window applies from layer `max_window_layers` on: not one window for all.
            Family::Qwen2 | Family::Qwen3 => match flag(c, "use_sliding_window")? {
                Some(true) => {
                    return Err(unsupported(
                        "use_sliding_window",
                        &Value::Bool(true),
                        "false",
                    ))
                }
                _ => None,
            },
            Family::Llama | Family::Phi3 => match get(c, "sliding_window") {
                None => None,
                Some(_) => Some(size(c, "sliding_window", usize::MAX)?),
            },
        };
        let tie_word_embeddings = match flag(c, "tie_word_embeddings")? {
            Some(t) => t,
            None => !has("lm_head.weight"),
        };
        Ok(LlamaConfig {
            family,
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: ffn,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            max_position_embeddings: ctx,
            rms_norm_eps: eps,
            rope_theta: theta,
            rotary_dim,
            rope_factors,
            sliding_window,
            tie_word_embeddings,
            // transformers' Qwen2 attention always has Q/K/V biases (and none on O).
            attention_bias: family == Family::Qwen2,
            qk_norm: family == Family::Qwen3,
            fused_qkv: family == Family::Phi3,
            fused_gate_up: family == Family::Phi3,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tiny() -> Value {
        json!({"model_type": "llama", "vocab_size": 32, "hidden_size": 16,
               "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
               "max_position_embeddings": 64, "rms_norm_eps": 1e-5})
    }

    fn refused(edit: impl FnOnce(&mut Value)) -> String {
        let mut c = tiny();
        edit(&mut c);
        LlamaConfig::from_hf(&c, &|_| true).unwrap_err().to_string()
    }

    #[test]
    fn defaults_follow_transformers() {
        let c = LlamaConfig::from_hf(&tiny(), &|_| false).unwrap();
        assert_eq!((c.num_key_value_heads, c.head_dim, c.rotary_dim), (2, 8, 8));
        assert_eq!(c.rope_theta, 10000.0);
        assert!(c.tie_word_embeddings && c.rope_factors.is_empty());
    }

    #[test]
    fn missing_and_bad_fields_are_named() {
        let e = refused(|c| {
            c.as_object_mut().unwrap().remove("hidden_size");
        });
        assert!(e.contains("`hidden_size`: missing"), "{e}");
        let e = refused(|c| c["num_attention_heads"] = json!(0));
        assert!(e.contains("`num_attention_heads`"), "{e}");
        let e = refused(|c| c["model_type"] = json!("gpt_neox"));
        assert!(e.contains("model_type") && e.contains("gpt_neox"), "{e}");
        let e = refused(|c| c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0}));
        assert!(e.contains("yarn"), "{e}");
        let e = refused(|c| c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0}));
        assert!(e.contains("rope_scaling.low_freq_factor"), "{e}");
    }

    /// Llama 3's factors against the formula written out per branch: wavelength 2π·θ^(2i/d).
    #[test]
    fn llama3_factors_take_every_branch() {
        let r = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
        let f = rope_factors("rope_scaling", r.as_object().unwrap(), 10000.0, 16).unwrap();
        assert_eq!(f.len(), 8);
        // i = 0: wavelength 2π < 64/4 (high frequency, unscaled); i = 7: 2π·10000^(14/16) far
        // above 64 (low frequency, the whole factor); i = 2: 2π·10 ≈ 62.8 in between.
        assert_eq!(f[0], 1.0);
        assert_eq!(f[7], 8.0);
        let smooth = (64.0 / (2.0 * PI * 10.0) - 1.0) / 3.0;
        assert!((f[2] - 1.0 / ((1.0 - smooth) / 8.0 + smooth)).abs() < 1e-9);
    }
}
