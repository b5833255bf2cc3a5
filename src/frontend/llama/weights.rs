//! The weights a graph reads, from the mapped file(s) when bound: dequantized (or widened from
//! bf16/f16) to the node's dtype or kept in their blocks, a GGUF file's Q and K rows put back in
//! transformers' order.

use std::collections::HashMap;

use super::super::ModelError;
use super::{file_tensor, LlamaModel};
use crate::ir::{DType, Graph, Op, QuantScheme, QuantTensor, Shape, Tensor};

impl LlamaModel {
    /// The weights `graph` reads, dequantized from the mapped file now, converted to each
    /// weight node's dtype, Q and K rows in transformers' order.
    pub fn weights_for(&self, graph: &Graph) -> Result<HashMap<String, Tensor>, ModelError> {
        let mut out = HashMap::new();
        for id in graph.node_ids() {
            if let Op::Weight { quant: None, .. } = graph.op(id) {
                let n = graph.node(id);
                out.insert(n.name.clone(), self.weight(&n.name, n.ty.dtype)?);
            }
        }
        Ok(out)
    }

    /// The blocks of the quantized weights `graph` reads, as the file stores them (Q and K
    /// rows put in transformers' order, whole rows of blocks moved), checked against each
    /// weight's scheme and shape.
    pub fn quantized_for(&self, graph: &Graph) -> Result<HashMap<String, QuantTensor>, ModelError> {
        let mut out = HashMap::new();
        for id in graph.node_ids() {
            if let Op::Weight {
                quant: Some(scheme),
                ..
            } = graph.op(id)
            {
                let n = graph.node(id);
                out.insert(
                    n.name.clone(),
                    self.blocks(&n.name, *scheme, n.ty.shape.dims())?,
                );
            }
        }
        Ok(out)
    }

    /// The blocks of weight node `name` (`[rows, K]` of `scheme`).
    pub(super) fn blocks(
        &self,
        name: &str,
        scheme: QuantScheme,
        shape: &[usize],
    ) -> Result<QuantTensor, ModelError> {
        let file = file_tensor(name);
        let (stored_scheme, stored_shape, bytes) =
            self.source.blocks(file, self.config.fused_gate_up)?;
        if stored_scheme.map(QuantScheme::kept_as) != Some(scheme) || stored_shape != shape {
            return Err(ModelError::TensorShape {
                name: file.into(),
                expected: shape.to_vec(),
                found: stored_shape,
            });
        }
        let stored_scheme = stored_scheme.unwrap_or(scheme);
        let heads = self.permuted_heads(file);
        let bytes: Vec<u8> = match heads {
            Some(heads) => {
                let row_bytes = bytes.len() / shape[0];
                unpermute_rows_of(bytes, shape[0], row_bytes, heads)
            }
            None => bytes.to_vec(),
        };
        let q =
            QuantTensor::new(stored_scheme, Shape::new(shape.to_vec()), bytes).map_err(|e| {
                ModelError::Setting {
                    file: self.path.display().to_string(),
                    field: file.into(),
                    reason: e.to_string(),
                }
            })?;
        if stored_scheme == scheme {
            return Ok(q);
        }
        q.reblocked(scheme).ok_or_else(|| ModelError::Setting {
            file: self.path.display().to_string(),
            field: file.into(),
            reason: format!("{stored_scheme} blocks cannot be kept as {scheme}"),
        })
    }

    /// The head count of a Q or K projection (whose rows llama.cpp permuted).
    pub(super) fn permuted_heads(&self, name: &str) -> Option<usize> {
        // Only llama.cpp's converter permutes; HF checkpoints keep transformers' order.
        if self.source.gguf().is_none() || !self.config.family.permutes_qk() {
            None
        } else if name.ends_with(".attn_q.weight") || name.ends_with(".attn_q.bias") {
            Some(self.config.num_attention_heads)
        } else if name.ends_with(".attn_k.weight") || name.ends_with(".attn_k.bias") {
            Some(self.config.num_key_value_heads)
        } else {
            None
        }
    }

    /// Weight `name` as a PyTorch-shaped tensor of `dtype`.
    pub fn weight(&self, name: &str, dtype: DType) -> Result<Tensor, ModelError> {
        let shape = self.source.shape(name, self.config.fused_gate_up)?;
        let mut values = self.source.values(name, self.config.fused_gate_up)?;
        let heads = self.permuted_heads(name);
        if let Some(heads) = heads {
            // A projection [heads·D, hidden], or its bias [heads·D] (rows of one value): the
            // converter permuted both.
            let rows = heads * self.config.head_dim;
            let expected = if name.ends_with(".bias") {
                vec![rows]
            } else {
                vec![rows, self.config.hidden_size]
            };
            if shape != expected {
                return Err(ModelError::TensorShape {
                    name: name.into(),
                    expected,
                    found: shape,
                });
            }
            let cols = expected.get(1).copied().unwrap_or(1);
            values = unpermute_rows(&values, rows, cols, heads);
        }
        if !dtype.is_float() {
            return Err(ModelError::TensorDType {
                name: name.into(),
                found: dtype,
            });
        }
        Ok(Tensor::from_f32(dtype, shape, values).expect("size checked when opened"))
    }

    /// The graph input for a prompt's token ids.
    pub fn inputs(&self, ids: &[u32]) -> Vec<(String, Tensor)> {
        let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let t = Tensor::from_i64(DType::I64, vec![1, ids.len()], ids).expect("1×s ids");
        vec![("input_ids".into(), t)]
    }
}

/// Undoes llama.cpp's Q/K row permutation: within each head of `rows / heads` rows, the file
/// holds row `2i + j` where transformers holds row `j·(d/2) + i` (`j` ∈ {0, 1}, `i` < d/2).
pub fn unpermute_rows(values: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    unpermute_rows_of(values, rows, cols, heads)
}

/// [`unpermute_rows`] over rows of `cols` elements of any type (values, or a row's blocks).
fn unpermute_rows_of<T: Copy + Default>(
    values: &[T],
    rows: usize,
    cols: usize,
    heads: usize,
) -> Vec<T> {
    let d = rows / heads;
    let half = d / 2;
    let mut out = vec![T::default(); values.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                let to = h * d + j * half + i;
                let from = h * d + 2 * i + j;
                out[to * cols..(to + 1) * cols].copy_from_slice(&values[from * cols..][..cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation llama.cpp's converter applies (`reshape(h, 2, d/2, ..).swapaxes(1, 2)`),
    /// written independently, is undone exactly.
    #[test]
    fn unpermute_undoes_the_converters_permutation() {
        let (heads, d, cols) = (3, 8, 2);
        let rows = heads * d;
        let hf: Vec<f32> = (0..rows * cols).map(|x| x as f32).collect();
        // Converter: new[h][i][j] = old[h][j][i] for the view [heads, 2, d/2] of the rows.
        let mut file = vec![0.0f32; hf.len()];
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..d / 2 {
                    let old = h * d + j * (d / 2) + i;
                    let new = h * d + i * 2 + j;
                    file[new * cols..(new + 1) * cols]
                        .copy_from_slice(&hf[old * cols..(old + 1) * cols]);
                }
            }
        }
        assert_ne!(file, hf);
        assert_eq!(unpermute_rows(&file, rows, cols, heads), hf);
    }
}
