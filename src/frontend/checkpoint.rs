//! The safetensors weights of a Hugging Face model directory: `model.safetensors`, or the shards
//! `model.safetensors.index.json` names (its `weight_map`: tensor → shard file). Every shard is
//! opened and mapped up front (its header checked, no tensor read); a tensor the index places in
//! a shard that does not hold it, a shard the index names that is absent, or a shard outside the
//! directory is a typed error before any weight is read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::bert_config::read_optional;
use super::safetensors::{SafeTensors, TensorInfo};
use super::{ModelError, SETTINGS_FILE};
use crate::ir::Tensor;

/// The single-file checkpoint's name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The part of the index this reads (`metadata` is informational).
#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

/// A directory's safetensors weights, one file or many, all mapped.
pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<SafeTensors>,
    /// Tensor name → index into `shards`.
    owner: BTreeMap<String, usize>,
}

/// A shard name from the index: a plain file name in the directory (no separators, not `..`),
/// so an index cannot point the loader at files elsewhere.
fn shard_name_ok(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\'])
}

impl Checkpoint {
    /// The weights of `dir`: its index's shards when `model.safetensors.index.json` exists, else
    /// `model.safetensors`; neither is [`ModelError::MissingFile`] naming the single file.
    pub fn open(dir: &Path) -> Result<Checkpoint, ModelError> {
        let Some(bytes) = read_optional(dir, INDEX_FILE, SETTINGS_FILE)? else {
            let path = dir.join(SINGLE_FILE);
            if !path.exists() {
                return Err(ModelError::MissingFile {
                    dir: dir.display().to_string(),
                    file: SINGLE_FILE.into(),
                });
            }
            let st = SafeTensors::open(&path)?;
            let owner = st.names().map(|n| (n.to_string(), 0)).collect();
            return Ok(Checkpoint {
                dir: dir.to_path_buf(),
                shards: vec![st],
                owner,
            });
        };
        let index: Index = serde_json::from_slice(&bytes).map_err(|e| ModelError::Json {
            file: INDEX_FILE.into(),
            message: e.to_string(),
        })?;
        // Each shard opened once, in name order, whatever order the index lists tensors in.
        let mut files: BTreeMap<&str, usize> = BTreeMap::new();
        let mut shards = Vec::new();
        for file in index.weight_map.values() {
            if files.contains_key(file.as_str()) {
                continue;
            }
            if !shard_name_ok(file) {
                return Err(ModelError::Json {
                    file: INDEX_FILE.into(),
                    message: format!("shard `{file}` is not a file name in the directory"),
                });
            }
            let path = dir.join(file);
            if !path.exists() {
                return Err(ModelError::MissingFile {
                    dir: dir.display().to_string(),
                    file: format!("{file} (named by {INDEX_FILE})"),
                });
            }
            files.insert(file, shards.len());
            shards.push(SafeTensors::open(&path)?);
        }
        let mut owner = BTreeMap::new();
        for (name, file) in &index.weight_map {
            let i = files[file.as_str()];
            if shards[i].info(name).is_none() {
                return Err(ModelError::MissingTensor {
                    path: shards[i].path().display().to_string(),
                    name: format!("{name} (placed there by {INDEX_FILE})"),
                });
            }
            owner.insert(name.clone(), i);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            shards,
            owner,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The number of files the weights are in.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The header entry of tensor `name`, if the checkpoint has it.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.owner
            .get(name)
            .and_then(|&i| self.shards[i].info(name))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.owner.keys().map(String::as_str)
    }

    /// The header entry and stored bytes of tensor `name` (see [`SafeTensors::raw`]).
    pub fn raw(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        self.owner.get(name).and_then(|&i| self.shards[i].raw(name))
    }

    /// Tensor `name` as f32, checked against `shape` (see [`SafeTensors::tensor`]).
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        match self.owner.get(name) {
            Some(&i) => self.shards[i].tensor(name, shape),
            None => Err(ModelError::MissingTensor {
                path: self.dir.display().to_string(),
                name: name.into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_stay_in_the_directory() {
        assert!(shard_name_ok("model-00001-of-00002.safetensors"));
        for bad in ["", ".", "..", "../x.safetensors", "/etc/passwd", "a\\b"] {
            assert!(!shard_name_ok(bad), "{bad}");
        }
    }
}
