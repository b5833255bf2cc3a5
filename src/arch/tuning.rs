//! Tuned choices: a kernel family that offers several configurations for a problem marks its
//! kernel with a [`TuneSite`] (family, problem, the candidate list's checksum); the tuner
//! (`compile::tune`) times the candidates and hands back a [`Tuned`] table, which codegen reads
//! through `CodegenOptions::tuned`. Without an entry, or with one made
//! for another candidate list, a family makes its own deterministic choice, so generated
//! kernels (and their snapshots) do not depend on tuning unless it is asked for.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ir::{DType, MaskKind};

/// A kernel family with configurations to choose between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// The matrix-core GEMM (`kernels/gemm/mma.rs`): tile, warps, stages.
    GemmMma,
    /// The matrix-core FlashAttention (`kernels/attention/mma.rs`).
    AttentionMma,
    /// The warpgroup FlashAttention on sm_90a (`kernels/attention/wgmma.rs`).
    AttentionWgmma,
    /// The register-tiled f32 FlashAttention (`kernels/attention/simt.rs`).
    AttentionSimt,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::GemmMma => "gemm_mma",
            Family::AttentionMma => "attention_mma",
            Family::AttentionWgmma => "attention_wgmma",
            Family::AttentionSimt => "attention_simt",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a family's candidates and their speeds depend on. Any candidate computes the same
/// result, so two problems that share a key only share a choice of speed, never of meaning.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TuneProblem {
    Gemm {
        dtype: DType,
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
        /// A and B read in 16-byte pieces; B's tile rows along K (`nk`) or along N.
        a_vec: bool,
        b_vec: bool,
        b_nk: bool,
        epilogue: bool,
    },
    Attention {
        dtype: DType,
        b: usize,
        hq: usize,
        hkv: usize,
        sq: usize,
        sk: usize,
        d: usize,
        dv: usize,
        causal: bool,
        mask: TuneMask,
        /// The sliding window a kernel applies (fewer key tiles); absent from the JSON when
        /// none, so the keys stored before windows existed keep loading.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u32>,
    },
}

/// An attention problem's mask, as far as a tiling's speed depends on it. Serialised as the
/// strings this field held before it was an enum ("", "additive", "boolean"), so tuning
/// results stored in users' caches (keyed by the JSON) keep loading. The variants are in the
/// order of those strings, so the derived `Ord` (the order of a [`Tuned`] table and of stored
/// records) is the one the strings had.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum TuneMask {
    /// No mask operand.
    #[default]
    #[serde(rename = "")]
    None,
    /// A float mask added to the scaled scores.
    #[serde(rename = "additive")]
    Additive,
    /// A bool mask: false positions are excluded.
    #[serde(rename = "boolean")]
    Boolean,
}

impl TuneMask {
    /// The serialised name ("" for none).
    pub fn name(self) -> &'static str {
        match self {
            TuneMask::None => "",
            TuneMask::Additive => "additive",
            TuneMask::Boolean => "boolean",
        }
    }
}

impl From<MaskKind> for TuneMask {
    fn from(m: MaskKind) -> TuneMask {
        match m {
            MaskKind::None => TuneMask::None,
            MaskKind::Additive => TuneMask::Additive,
            MaskKind::Boolean => TuneMask::Boolean,
        }
    }
}

impl fmt::Display for TuneProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TuneProblem::Gemm {
                dtype,
                batch,
                m,
                n,
                k,
                a_vec,
                b_vec,
                b_nk,
                epilogue,
            } => {
                write!(f, "{dtype} {batch}x{m}x{n}x{k}")?;
                let flag = |on: bool, s: &'static str| if on { s } else { "" };
                write!(
                    f,
                    "{}{}{}{}",
                    flag(*a_vec, " a16B"),
                    flag(*b_vec, " b16B"),
                    if *b_nk { " b:nk" } else { " b:kn" },
                    flag(*epilogue, " epilogue")
                )
            }
            TuneProblem::Attention {
                dtype,
                b,
                hq,
                hkv,
                sq,
                sk,
                d,
                dv,
                causal,
                mask,
                window,
            } => {
                write!(f, "{dtype} b{b} h{hq}/{hkv} sq{sq} sk{sk} d{d}/{dv}")?;
                if *causal {
                    f.write_str(" causal")?;
                }
                if let Some(w) = window {
                    write!(f, " window{w}")?;
                }
                if *mask != TuneMask::None {
                    write!(f, " mask:{}", mask.name())?;
                }
                Ok(())
            }
        }
    }
}

/// Family and problem: what a tuned choice is kept under.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TuneKey {
    pub family: Family,
    pub problem: TuneProblem,
}

/// A kernel whose family had more than one candidate for its problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuneSite {
    pub key: TuneKey,
    /// The candidates, in the family's order, each as its configuration reads (`Debug`).
    pub candidates: Vec<String>,
    /// A checksum of the candidate list: a choice made for another list is never applied.
    pub checksum: u64,
    /// The index of the candidate this kernel was generated with.
    pub chosen: usize,
    /// The index of the family's own (untuned) choice.
    pub default: usize,
}

/// One choice: a candidate's index in the list whose checksum it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    pub index: usize,
    pub checksum: u64,
}

/// Choices by family and problem; empty by default (every family chooses for itself).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tuned {
    choices: BTreeMap<TuneKey, Choice>,
}

impl Tuned {
    pub fn new() -> Tuned {
        Tuned::default()
    }

    pub fn insert(&mut self, key: TuneKey, choice: Choice) {
        self.choices.insert(key, choice);
    }

    pub fn get(&self, key: &TuneKey) -> Option<Choice> {
        self.choices.get(key).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.choices.is_empty()
    }

    pub fn len(&self) -> usize {
        self.choices.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&TuneKey, &Choice)> {
        self.choices.iter()
    }

    /// The configuration for `key` out of `candidates`, with the site to record on its kernel
    /// (`None` when there is nothing to choose between): the tuned candidate where this table
    /// holds one made for this very list, else `default` (the family's own choice, found in
    /// the list by equality).
    pub(crate) fn pick<C: Copy + PartialEq + fmt::Debug + Serialize>(
        &self,
        key: TuneKey,
        candidates: &[C],
        default: Option<C>,
    ) -> (Option<C>, Option<TuneSite>) {
        let Some(default) = default else {
            return (None, None);
        };
        if candidates.len() < 2 {
            return (Some(default), None);
        }
        let checksum = checksum(key.family, candidates);
        let default_index = candidates.iter().position(|c| *c == default);
        let tuned = self
            .get(&key)
            .filter(|c| c.checksum == checksum && c.index < candidates.len())
            .map(|c| c.index);
        // A family's default always comes from its own list; should it not, nothing is tuned.
        let Some(default_index) = default_index else {
            return (Some(default), None);
        };
        let chosen = tuned.unwrap_or(default_index);
        let site = TuneSite {
            key,
            candidates: candidates.iter().map(|c| format!("{c:?}")).collect(),
            checksum,
            chosen,
            default: default_index,
        };
        (Some(candidates[chosen]), Some(site))
    }
}

/// FNV-1a over the family and the candidates' serialised form: stable across runs and builds.
pub(crate) fn checksum<C: Serialize>(family: Family, candidates: &[C]) -> u64 {
    let text = serde_json::to_string(&(family, candidates)).expect("configurations serialise");
    crate::ir::fnv1a(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Serialize)]
    struct C(u32);

    fn key() -> TuneKey {
        TuneKey {
            family: Family::GemmMma,
            problem: TuneProblem::Gemm {
                dtype: DType::F16,
                batch: 1,
                m: 77,
                n: 130,
                k: 64,
                a_vec: true,
                b_vec: false,
                b_nk: true,
                epilogue: false,
            },
        }
    }

    #[test]
    fn a_choice_applies_only_to_the_list_it_was_made_for() {
        let cands = [C(1), C(2), C(3)];
        let mut t = Tuned::new();
        let (c, site) = t.pick(key(), &cands, Some(C(2)));
        assert_eq!(c, Some(C(2)), "no entry: the family's own choice");
        let site = site.expect("three candidates: a site");
        assert_eq!((site.chosen, site.default), (1, 1));
        t.insert(
            key(),
            Choice {
                index: 2,
                checksum: site.checksum,
            },
        );
        assert_eq!(t.pick(key(), &cands, Some(C(2))).0, Some(C(3)));
        // Another list (one candidate more) has another checksum: the entry does not apply.
        let more = [C(1), C(2), C(3), C(4)];
        assert_eq!(t.pick(key(), &more, Some(C(2))).0, Some(C(2)));
        assert_ne!(checksum(Family::GemmMma, &more), site.checksum);
        // One candidate: nothing to choose, no site.
        assert_eq!(t.pick(key(), &[C(9)], Some(C(9))), (Some(C(9)), None));
        assert_eq!(t.pick(key(), &cands, None), (None, None));
    }

    fn attention(mask: TuneMask) -> TuneProblem {
        TuneProblem::Attention {
            dtype: DType::F16,
            b: 2,
            hq: 6,
            hkv: 2,
            sq: 77,
            sk: 93,
            d: 64,
            dv: 64,
            causal: true,
            mask,
            window: None,
        }
    }

    /// The JSON a stored tuning record holds, written out by hand as the `String` field
    /// produced it: the enum must serialise to exactly these bytes and read them back.
    #[test]
    fn the_mask_serialises_as_the_old_strings() {
        for (mask, old) in [
            (TuneMask::None, ""),
            (TuneMask::Additive, "additive"),
            (TuneMask::Boolean, "boolean"),
        ] {
            let text = format!(
                r#"{{"attention":{{"dtype":"f16","b":2,"hq":6,"hkv":2,"sq":77,"sk":93,"d":64,"dv":64,"causal":true,"mask":"{old}"}}}}"#
            );
            assert_eq!(serde_json::to_string(&attention(mask)).unwrap(), text);
            let back: TuneProblem = serde_json::from_str(&text).unwrap();
            assert_eq!(back, attention(mask));
            assert_eq!(serde_json::to_string(&mask).unwrap(), format!("\"{old}\""));
        }
        assert!(serde_json::from_str::<TuneMask>(r#""none""#).is_err());
        // The order the strings had: "" < "additive" < "boolean".
        assert!(TuneMask::None < TuneMask::Additive && TuneMask::Additive < TuneMask::Boolean);
        assert_eq!(
            attention(TuneMask::Boolean).to_string(),
            "f16 b2 h6/2 sq77 sk93 d64/64 causal mask:boolean"
        );
        assert_eq!(
            attention(TuneMask::None).to_string(),
            "f16 b2 h6/2 sq77 sk93 d64/64 causal"
        );
    }
}
