//! The corpus and the mutations that make new inputs from it: byte-level (bit flips, byte
//! inserts and deletes, splices between inputs, interesting integers over numeric fields,
//! truncation) and, for JSON and the safetensors header, structure-aware (see `json.rs`).

use rand::seq::IndexedRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::json::{self, Words, J};
use super::Structure;

/// A little-endian numeric field of a binary input: where it lies and how many bytes it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub at: usize,
    pub width: usize,
}

/// Integers at the edges of the types a reader may hold them in; written over a field of any
/// width, the low bytes are kept (so -1 is all ones at every width).
pub const INTERESTING: [u64; 24] = [
    0,
    1,
    2,
    4,
    8,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 53,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX - 1,
    u64::MAX,
    u64::MAX - 7,
    0x4000_0000,
];

struct Entry {
    bytes: Vec<u8>,
    /// Whether the input got past the parser's checks (a seed, or an outcome not an error):
    /// half the mutants start from such inputs, where the deeper code is.
    deep: bool,
    /// The parsed JSON (the header's, for safetensors), when there is one.
    json: Option<J>,
}

pub struct Corpus {
    structure: Structure,
    entries: Vec<Entry>,
    keys: Vec<String>,
    strings: Vec<String>,
    donors: Vec<J>,
    /// Byte strings worth inserting: dictionary words as they appear in the input.
    tokens: Vec<Vec<u8>>,
}

/// The JSON header of a safetensors file, and where it ends.
fn safetensors_header(bytes: &[u8]) -> Option<(J, usize)> {
    let n = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let end = n.checked_add(8).filter(|&e| e <= bytes.len())?;
    Some((J::parse(&bytes[8..end])?, end))
}

impl Corpus {
    pub fn new(structure: Structure, seeds: &[Vec<u8>], extra_words: &[String]) -> Corpus {
        let mut corpus = Corpus {
            structure,
            entries: Vec::new(),
            keys: Vec::new(),
            strings: extra_words.to_vec(),
            donors: Vec::new(),
            tokens: Vec::new(),
        };
        for seed in seeds {
            corpus.add(seed.clone(), true);
        }
        for entry in &corpus.entries {
            if let Some(j) = &entry.json {
                j.collect_words(&mut corpus.keys, &mut corpus.strings);
                corpus.donors.extend(j.subtrees().into_iter().cloned());
            }
        }
        for list in [&mut corpus.keys, &mut corpus.strings] {
            list.sort();
            list.dedup();
        }
        // Very large subtrees (whole graphs) make every splice huge; keep the smaller ones.
        corpus.donors.retain(|d| d.to_bytes().len() <= 2048);
        corpus.tokens = corpus
            .keys
            .iter()
            .chain(&corpus.strings)
            .map(|w| {
                serde_json::to_string(w)
                    .expect("a string serialises")
                    .into_bytes()
            })
            .collect();
        corpus
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn add(&mut self, bytes: Vec<u8>, deep: bool) {
        let json = match self.structure {
            Structure::Json => J::parse(&bytes),
            Structure::Safetensors => safetensors_header(&bytes).map(|(j, _)| j),
            Structure::Binary => None,
        };
        self.entries.push(Entry { bytes, deep, json });
    }

    /// A new input: a corpus entry with one to eight mutations stacked.
    pub fn mutant(
        &self,
        rng: &mut ChaCha8Rng,
        max_len: usize,
        fields: &dyn Fn(&[u8]) -> Vec<Field>,
    ) -> Vec<u8> {
        let entry = if rng.random_bool(0.5) {
            let deep: Vec<&Entry> = self.entries.iter().filter(|e| e.deep).collect();
            deep.choose(rng).copied()
        } else {
            None
        }
        .unwrap_or_else(|| self.entries.choose(rng).expect("the corpus has seeds"));
        let mut bytes = entry.bytes.clone();
        let mut tree = entry.json.clone();
        // Usually one or two mutations: each one more makes an input that fails earlier.
        let rounds = (0..3)
            .map(|_| rng.random_range(1..=8u32))
            .min()
            .expect("three draws");
        for _ in 0..rounds {
            // Mostly structural: a byte mutation usually breaks the JSON, and the tree with it.
            let structural = tree.is_some() && rng.random_bool(0.85);
            if structural {
                let words = Words {
                    keys: &self.keys,
                    strings: &self.strings,
                    donors: &self.donors,
                };
                let doc = tree.as_mut().expect("checked");
                json::mutate(rng, doc, &words);
                bytes = self.rebuild(rng, &bytes, doc);
            } else {
                let other = &self.entries.choose(rng).expect("non-empty").bytes;
                let fields = match self.structure {
                    Structure::Binary => fields(&bytes),
                    // The header length is one field among the header's and the data's bytes.
                    Structure::Safetensors if rng.random_bool(0.3) => {
                        vec![Field { at: 0, width: 8 }]
                    }
                    Structure::Safetensors | Structure::Json => Vec::new(),
                };
                let text = self.structure == Structure::Json;
                mutate_bytes(rng, &mut bytes, other, &fields, &self.tokens, text);
                // The tree no longer describes the bytes.
                tree = None;
            }
        }
        bytes.truncate(max_len);
        bytes
    }

    /// The input after its JSON changed: the text itself, or for safetensors the new header
    /// with (usually) a length that matches it, before the old data.
    fn rebuild(&self, rng: &mut ChaCha8Rng, old: &[u8], doc: &J) -> Vec<u8> {
        let text = doc.to_bytes();
        match self.structure {
            Structure::Json | Structure::Binary => text,
            Structure::Safetensors => {
                let data = safetensors_header(old).map_or(&[][..], |(_, end)| &old[end..]);
                let len = if rng.random_bool(0.9) {
                    text.len() as u64
                } else {
                    *INTERESTING.choose(rng).expect("non-empty")
                };
                let mut out = len.to_le_bytes().to_vec();
                out.extend_from_slice(&text);
                out.extend_from_slice(data);
                out
            }
        }
    }
}

fn write_le(bytes: &mut [u8], at: usize, width: usize, v: u64) {
    for (k, b) in bytes.iter_mut().skip(at).take(width).enumerate() {
        *b = (v >> (8 * k)) as u8;
    }
}

fn read_le(bytes: &[u8], at: usize, width: usize) -> u64 {
    bytes
        .iter()
        .skip(at)
        .take(width)
        .enumerate()
        .fold(0, |acc, (k, &b)| acc | (u64::from(b) << (8 * k)))
}

/// A random range within `len` bytes (empty when `len` is 0).
fn range(rng: &mut ChaCha8Rng, len: usize) -> std::ops::Range<usize> {
    if len == 0 {
        return 0..0;
    }
    let start = rng.random_range(0..len);
    let max = (len - start).min(if rng.random_bool(0.8) { 16 } else { len });
    start..start + rng.random_range(1..=max)
}

/// One byte-level mutation of `data`. For `text` (JSON), new bytes are mostly ASCII: input
/// that is not UTF-8 stops at the first check, so a little of it goes a long way.
pub fn mutate_bytes(
    rng: &mut ChaCha8Rng,
    data: &mut Vec<u8>,
    other: &[u8],
    fields: &[Field],
    tokens: &[Vec<u8>],
    text: bool,
) {
    let len = data.len();
    let top_bit = !text || rng.random_bool(0.05);
    let byte = |rng: &mut ChaCha8Rng| -> u8 {
        let b: u8 = rng.random();
        if top_bit {
            b
        } else {
            b & 0x7f
        }
    };
    match rng.random_range(0..11) {
        // A bit flipped.
        0 if len > 0 => {
            let i = rng.random_range(0..len);
            data[i] ^= 1 << rng.random_range(0..if top_bit { 8 } else { 7 });
        }
        // A byte replaced by a random or structural one.
        1 if len > 0 => {
            let i = rng.random_range(0..len);
            data[i] = *[
                0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'}', b'[', b']', b',', b':', b'-',
            ]
            .choose(rng)
            .expect("non-empty");
            if rng.random_bool(0.3) {
                data[i] = byte(rng);
            }
        }
        // Bytes inserted: random, or a dictionary word.
        2 => {
            let at = rng.random_range(0..=len);
            let insert: Vec<u8> = match tokens.choose(rng) {
                Some(t) if rng.random_bool(0.5) => t.clone(),
                _ => (0..rng.random_range(1..=8)).map(|_| byte(rng)).collect(),
            };
            data.splice(at..at, insert);
        }
        // A range deleted.
        3 if len > 0 => {
            data.drain(range(rng, len));
        }
        // A range copied elsewhere.
        4 if len > 0 => {
            let r = range(rng, len);
            let copy = data[r].to_vec();
            let at = rng.random_range(0..=len);
            data.splice(at..at, copy);
        }
        // Truncated.
        5 if len > 0 => data.truncate(rng.random_range(0..len)),
        // Spliced: this input's start, the other's end.
        6 if !other.is_empty() => {
            let cut = rng.random_range(0..=len);
            let from = rng.random_range(0..other.len());
            data.truncate(cut);
            data.extend_from_slice(&other[from..]);
        }
        // An interesting integer over a numeric field (or any aligned spot); text has its
        // numbers in digits, replaced below.
        7 | 8 if !text => {
            let field = match fields.choose(rng) {
                Some(f) if rng.random_bool(0.8) => *f,
                _ if len > 0 => {
                    let width = *[1, 2, 4, 8].choose(rng).expect("non-empty");
                    Field {
                        at: rng.random_range(0..len) / width * width,
                        width,
                    }
                }
                _ => return,
            };
            let v = if rng.random_bool(0.2) {
                // Sizes near the input's own length pass "fits in the file" checks.
                (len as u64)
                    .wrapping_add(rng.random_range(0..16))
                    .wrapping_sub(8)
            } else {
                *INTERESTING.choose(rng).expect("non-empty")
            };
            write_le(data, field.at, field.width, v);
        }
        // A field nudged by a little.
        9 if !text => {
            if let Some(f) = fields.choose(rng) {
                let v = read_le(data, f.at, f.width);
                let delta = *[1u64, 2, 4, 8, 16].choose(rng).expect("non-empty");
                let v = if rng.random_bool(0.5) {
                    v.wrapping_add(delta)
                } else {
                    v.wrapping_sub(delta)
                };
                write_le(data, f.at, f.width, v);
            }
        }
        // A run of ASCII digits replaced by an extreme number.
        _ => {
            let digits: Vec<usize> = (0..len).filter(|&i| data[i].is_ascii_digit()).collect();
            if let Some(&i) = digits.choose(rng) {
                let start = (0..=i)
                    .rev()
                    .take_while(|&k| data[k].is_ascii_digit() || data[k] == b'-')
                    .last()
                    .unwrap_or(i);
                let end = (i..len).find(|&k| !data[k].is_ascii_digit()).unwrap_or(len);
                let n = json::EXTREME_NUMBERS.choose(rng).expect("non-empty");
                data.splice(start..end, n.bytes());
            }
        }
    }
}
