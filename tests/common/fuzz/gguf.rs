//! GGUF files: `frontend::Gguf::open` (header, metadata and tensor table checked against the
//! file), every tensor dequantized, then `frontend::LlamaModel::load` and a forward pass.
//! Mutation aims interesting integers at the fields the reader trusts: the counts, every
//! string's length, every value's type, array element types and counts, and each tensor's rank,
//! dims, type and offset. What opens must keep its promises: each tensor's bytes lie in the data
//! section, aligned, holding exactly its shape in its type, none overlapping another; each reads
//! back as its bytes say (decoded here independently, in f64); a model that loads tokenizes,
//! lowers, binds its weights and runs in the interpreter.

use std::path::Path;

use rocmforge::frontend::llama::Logits;
use rocmforge::frontend::{GgmlType, Gguf, LlamaModel, ModelError};
use rocmforge::interp::{self, Bindings};

use super::mutate::Field;
use super::tiny_gguf::tiny_llama;
use super::{message_label, read_dir_files, root, Outcome, Structure, Target};

pub struct GgufTarget;

fn le(b: &[u8], at: usize, width: usize) -> Option<u64> {
    let bytes = b.get(at..at.checked_add(width)?)?;
    Some(
        bytes
            .iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)),
    )
}

/// The numeric fields of a GGUF file as far as they can be found (a mutated file may lie):
/// walks the header, the metadata and the tensor table as the format lays them out, stopping
/// where a length runs past the end.
fn gguf_fields(b: &[u8]) -> Vec<Field> {
    let f = |at, width| Field { at, width };
    let mut out = vec![f(4, 4), f(8, 8), f(16, 8)];
    let (Some(n_tensors), Some(n_kv)) = (le(b, 8, 8), le(b, 16, 8)) else {
        return out;
    };
    let mut at = 24usize;
    // A string: its length field, then skip it.
    let string = |at: &mut usize, out: &mut Vec<Field>| -> Option<()> {
        out.push(f(*at, 8));
        let n = usize::try_from(le(b, *at, 8)?).ok()?;
        *at = at.checked_add(8)?.checked_add(n)?;
        (*at <= b.len()).then_some(())
    };
    let scalar = |t: u64| -> Option<usize> {
        Some(match t {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            _ => return None,
        })
    };
    let walk = |at: &mut usize, out: &mut Vec<Field>| -> Option<()> {
        for _ in 0..n_kv.min(64) {
            string(at, out)?;
            out.push(f(*at, 4));
            let t = le(b, *at, 4)?;
            *at += 4;
            match t {
                8 => string(at, out)?,
                9 => {
                    out.extend([f(*at, 4), f(*at + 4, 8)]);
                    let (et, n) = (le(b, *at, 4)?, le(b, *at + 4, 8)?);
                    *at += 12;
                    if et == 8 {
                        for i in 0..n {
                            // Every string is walked; only the first few lengths are aimed at.
                            let mut ignored = Vec::new();
                            string(at, if i < 16 { &mut *out } else { &mut ignored })?;
                        }
                    } else {
                        let w = scalar(et)?;
                        *at = at.checked_add(w.checked_mul(usize::try_from(n).ok()?)?)?;
                    }
                }
                t => *at += scalar(t)?,
            }
        }
        for _ in 0..n_tensors.min(64) {
            string(at, out)?;
            out.push(f(*at, 4));
            let rank = usize::try_from(le(b, *at, 4)?).ok()?.min(8);
            *at += 4;
            for _ in 0..rank {
                out.push(f(*at, 8));
                *at += 8;
            }
            out.extend([f(*at, 4), f(*at + 4, 8)]);
            *at += 12;
        }
        Some(())
    };
    let _ = walk(&mut at, &mut out);
    out.retain(|x| x.at + x.width <= b.len());
    out
}

/// The values of `bytes` in type `ty`, decoded in f64 without `GgmlType::dequantize_into`;
/// `None` for the formats whose f32 values take more than one rounding (the k-quants, Q5,
/// IQ4_NL, MXFP4): `tests/quant_formats.rs` checks those bit for bit against the `gguf`
/// package, here only their length (and that reading them does not panic).
fn decode_f64(ty: GgmlType, bytes: &[u8]) -> Option<Vec<f64>> {
    let f16 = |b: &[u8]| f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32());
    let mut out = Vec::new();
    match ty {
        GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q2K
        | GgmlType::Q3K
        | GgmlType::Q4K
        | GgmlType::Q5K
        | GgmlType::Q6K
        | GgmlType::Q8K
        | GgmlType::Iq4Nl
        | GgmlType::Mxfp4 => return None,
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(f16)),
        GgmlType::BF16 => out.extend(bytes.chunks_exact(2).map(|c| {
            f64::from(f32::from_bits(
                u32::from(u16::from_le_bytes([c[0], c[1]])) << 16,
            ))
        })),
        GgmlType::Q8_0 => bytes.chunks_exact(34).for_each(|b| {
            let d = f16(&b[..2]);
            out.extend(b[2..].iter().map(|&q| f64::from(q as i8) * d));
        }),
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (size, head) = if ty == GgmlType::Q4_0 {
                (18, 2)
            } else {
                (20, 4)
            };
            bytes.chunks_exact(size).for_each(|b| {
                let d = f16(&b[..2]);
                let (m, zero) = if ty == GgmlType::Q4_0 {
                    (0.0, 8.0)
                } else {
                    (f16(&b[2..4]), 0.0)
                };
                let mut block = [0.0; 32];
                for (j, &q) in b[head..].iter().enumerate() {
                    block[j] = (f64::from(q & 15) - zero) * d + m;
                    block[j + 16] = (f64::from(q >> 4) - zero) * d + m;
                }
                out.extend(block);
            });
        }
    }
    Some(out)
}

/// f32 and the f64 decoding agree: the same value rounded once, NaN for NaN.
fn agrees(got: f32, want: f64) -> bool {
    (got.is_nan() && want.is_nan()) || got == want as f32
}

impl Target for GgufTarget {
    fn name(&self) -> &'static str {
        "gguf"
    }

    fn structure(&self) -> Structure {
        Structure::Binary
    }

    fn input_file(&self) -> &'static str {
        "model.gguf"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        let mut seeds = vec![tiny_llama().to_bytes()];
        let mut v2 = tiny_llama();
        v2.version = 2;
        v2.alignment = 64;
        seeds.push(v2.to_bytes());
        seeds.extend(read_dir_files(&root().join("tests/data/fuzz/gguf"), &[]));
        seeds
    }

    fn dictionary(&self) -> Vec<String> {
        [
            "general.alignment",
            "general.architecture",
            "llama.block_count",
            "llama.rope.scaling.type",
            "tokenizer.ggml.pre",
            "gpt2",
            "smollm",
            "llama",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn fields(&self, input: &[u8]) -> Vec<Field> {
        gguf_fields(input)
    }

    fn run(&mut self, input: &[u8], path: &Path) -> Outcome {
        let g = match Gguf::open(path) {
            Ok(g) => g,
            Err(ModelError::Gguf { error, .. }) => {
                return Ok(format!("open-err:{}", message_label(&error.to_string())))
            }
            Err(e) => return Err(format!("open gave an error of the wrong kind: {e}")),
        };
        // The data section starts aligned, or at the end of a file that holds no data.
        let aligned = g.data_start.is_multiple_of(g.alignment) || g.data_start == input.len();
        if g.data_start > input.len() || !aligned {
            return Err(format!("data section at {}", g.data_start));
        }
        let mut ranges = Vec::new();
        for name in g.tensor_names() {
            let (info, bytes) = g.raw(name).map_err(|e| format!("`{name}` listed: {e}"))?;
            if info.start < g.data_start
                || info.end > input.len()
                || !(info.start - g.data_start).is_multiple_of(g.alignment)
                || info.ggml_type.bytes_for(info.elements()) != Some(bytes.len())
            {
                return Err(format!(
                    "`{name}`: bytes {}..{} for {} {:?}",
                    info.start, info.end, info.ggml_type, info.dims
                ));
            }
            ranges.push((info.start, info.end));
            let got = g
                .dequantize(name)
                .map_err(|e| format!("dequantizing `{name}`: {e}"))?;
            let agree = match decode_f64(info.ggml_type, bytes) {
                Some(want) => {
                    got.len() == want.len() && got.iter().zip(&want).all(|(&a, &b)| agrees(a, b))
                }
                None => got.len() == info.elements(),
            };
            if !agree {
                return Err(format!("`{name}` reads back other values than its bytes"));
            }
        }
        ranges.retain(|(s, e)| e > s);
        ranges.sort();
        if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
            return Err("two tensors share bytes".into());
        }
        let m = match LlamaModel::load(path) {
            Ok(m) => m,
            Err(e) => {
                let label = message_label(&e.to_string().replace(&*path.to_string_lossy(), ""));
                return Ok(format!("load-err:{label}"));
            }
        };
        let ids = m
            .tokenizer
            .encode("hello world 42")
            .map_err(|e| format!("a loaded model does not tokenize: {e}"))?;
        m.tokenizer
            .decode(&ids)
            .map_err(|e| format!("a loaded model does not decode its own ids: {e}"))?;
        let ids: Vec<u32> = ids.into_iter().take(4).collect();
        if ids.is_empty() {
            return Ok("loaded:no tokens".into());
        }
        let graph = m
            .graph(ids.len(), Logits::Last)
            .map_err(|e| format!("a loaded model does not lower: {e}"))?;
        let weights = m
            .weights_for(&graph)
            .map_err(|e| format!("a loaded model cannot bind its weights: {e}"))?;
        let bindings = Bindings {
            inputs: m.inputs(&ids).into_iter().collect(),
            weights,
            ..Bindings::default()
        };
        let out = interp::run(&graph, &bindings).map_err(|e| format!("interpreting: {e}"))?;
        if out[0].len() != m.config.vocab_size {
            return Err(format!("{} logits", out[0].len()));
        }
        Ok("ran".into())
    }
}
