//! BERT `config.json`: `frontend::BertEncoder::load` on a tiny model directory
//! (`tests/data/fuzz/bert_tiny`) whose config.json is the input. A config that loads must give
//! a model that tokenizes, lowers, reads its weights and interprets to finite embeddings, and
//! whose fused graph agrees with the unfused one.

use std::path::Path;

use rocmforge::frontend::{BertEncoder, ModelError};
use rocmforge::interp::{self, Bindings};
use rocmforge::passes::optimize;

use super::graph::{differential, small, variant};
use super::{message_label, read_dir_files, root, Outcome, Structure, Target};

pub struct ConfigTarget;

/// The model files beside the fuzzed config.json.
const MODEL_FILES: [&str; 3] = ["model.safetensors", "tokenizer.json", "modules.json"];

fn tiny() -> std::path::PathBuf {
    root().join("tests/data/fuzz/bert_tiny")
}

impl Target for ConfigTarget {
    fn name(&self) -> &'static str {
        "config"
    }

    fn structure(&self) -> Structure {
        Structure::Json
    }

    fn input_file(&self) -> &'static str {
        "config.json"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        let mut seeds = vec![std::fs::read(tiny().join("config.json")).expect("bert_tiny config")];
        seeds.extend(read_dir_files(&root().join("tests/data/fuzz/config"), &[]));
        seeds
    }

    fn dictionary(&self) -> Vec<String> {
        [
            "gelu",
            "gelu_new",
            "gelu_pytorch_tanh",
            "relu",
            "absolute",
            "relative_key",
            "bert",
            "roberta",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn prepare(&mut self, work: &Path) -> std::io::Result<()> {
        for f in MODEL_FILES {
            std::fs::copy(tiny().join(f), work.join(f))?;
        }
        Ok(())
    }

    fn run(&mut self, _input: &[u8], path: &Path) -> Outcome {
        let dir = path.parent().expect("the input is in the work directory");
        let enc = match BertEncoder::load(dir) {
            Ok(enc) => enc,
            Err(ModelError::Config { reason, .. }) => {
                return Ok(format!("load-err:Config:{}", message_label(&reason)))
            }
            Err(e) => return Ok(format!("load-err:{}", variant(&e))),
        };
        let texts = ["hello fuzzing world", "a small test."];
        let batch = enc
            .tokenize(&texts)
            .map_err(|e| format!("a loaded model does not tokenize: {e}"))?;
        let g = match enc.graph(texts.len(), batch.seq_len) {
            Ok(g) => g,
            Err(e) => return Ok(format!("graph-err:{}", e.kind())),
        };
        if !small(&g) {
            return Err("a config that loads gives a graph too big for the tiny weights".into());
        }
        let weights = enc
            .weights_for(&g)
            .map_err(|e| format!("a loaded model cannot read its weights: {e}"))?;
        let bindings = Bindings {
            inputs: enc.inputs(&batch).into_iter().collect(),
            weights,
            quantized: Default::default(),
            seed: 0,
            undrawn: Vec::new(),
        };
        let out = interp::run(&g, &bindings).map_err(|e| format!("interpreting the model: {e}"))?;
        if out
            .iter()
            .any(|t| t.to_f64_vec().iter().any(|x| !x.is_finite()))
        {
            return Err("a config that loads gives non-finite embeddings".into());
        }
        let (fused, _) = optimize(&g).map_err(|e| format!("the default pipeline: {e}"))?;
        differential(&g, &fused, &bindings)
    }
}
