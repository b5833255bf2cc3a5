//! Structure-aware JSON mutation. A document is parsed into a tree that keeps what serde_json's
//! `Value` cannot: number text as written (so `1e400`, `-0` and 2^64 can be emitted), duplicate
//! keys, and nesting deeper than a parser's recursion limit (written without recursion).

use rand::seq::IndexedRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
pub enum J {
    Null,
    Bool(bool),
    /// Number text, written as is (it need not be valid JSON).
    Num(String),
    Str(String),
    Arr(Vec<J>),
    /// Entries in order; a key may appear twice.
    Obj(Vec<(String, J)>),
    /// `inner` inside `depth` arrays (or objects under key "k").
    Nest {
        depth: usize,
        objects: bool,
        inner: Box<J>,
    },
}

/// Numbers at the edges of every integer and float type a parser may read them into.
pub const EXTREME_NUMBERS: [&str; 34] = [
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "3",
    "0.5",
    "-0.5",
    "1.0",
    "1e2",
    "127",
    "255",
    "256",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "-2147483648",
    "4294967295",
    "4294967296",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "3.4028235e38",
    "1e308",
    "-1e308",
    "1e400",
    "5e-324",
    "1e-400",
];

/// Strings that have broken parsers before: empty, huge, control and non-ASCII characters,
/// path and template syntax.
fn odd_string(rng: &mut ChaCha8Rng) -> String {
    match rng.random_range(0..10) {
        0 => String::new(),
        1 => "a".repeat(rng.random_range(256..20_000)),
        2 => "\u{0}".into(),
        3 => "é∀😀".into(),
        4 => "../../etc/passwd".into(),
        5 => "{{ x }}{% if %}".into(),
        6 => "\"; */ __global__ void x() {} /*".into(),
        7 => " ".into(),
        8 => "NaN".into(),
        _ => "-1".into(),
    }
}

impl J {
    pub fn from_value(v: &Value) -> J {
        match v {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Number(n) => J::Num(n.to_string()),
            Value::String(s) => J::Str(s.clone()),
            Value::Array(a) => J::Arr(a.iter().map(J::from_value).collect()),
            Value::Object(m) => J::Obj(
                m.iter()
                    .map(|(k, v)| (k.clone(), J::from_value(v)))
                    .collect(),
            ),
        }
    }

    pub fn parse(bytes: &[u8]) -> Option<J> {
        serde_json::from_slice::<Value>(bytes)
            .ok()
            .map(|v| J::from_value(&v))
    }

    /// Compact JSON text.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            J::Null => out.extend_from_slice(b"null"),
            J::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            J::Num(n) => out.extend_from_slice(n.as_bytes()),
            J::Str(s) => write_str(s, out),
            J::Arr(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            J::Obj(entries) => {
                out.push(b'{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_str(k, out);
                    out.push(b':');
                    v.write(out);
                }
                out.push(b'}');
            }
            J::Nest {
                depth,
                objects,
                inner,
            } => {
                let (open, close): (&[u8], &[u8]) = if *objects {
                    (b"{\"k\":", b"}")
                } else {
                    (b"[", b"]")
                };
                for _ in 0..*depth {
                    out.extend_from_slice(open);
                }
                inner.write(out);
                for _ in 0..*depth {
                    out.extend_from_slice(close);
                }
            }
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    /// Every node's path (child indices from the root), root first.
    fn paths(&self) -> Vec<Vec<usize>> {
        let mut out = Vec::new();
        let mut stack = vec![(self, Vec::new())];
        while let Some((node, path)) = stack.pop() {
            match node {
                J::Arr(items) => {
                    for (i, item) in items.iter().enumerate() {
                        let mut p = path.clone();
                        p.push(i);
                        stack.push((item, p));
                    }
                }
                J::Obj(entries) => {
                    for (i, (_, v)) in entries.iter().enumerate() {
                        let mut p = path.clone();
                        p.push(i);
                        stack.push((v, p));
                    }
                }
                J::Nest { inner, .. } => {
                    let mut p = path.clone();
                    p.push(0);
                    stack.push((inner, p));
                }
                _ => {}
            }
            out.push(path);
        }
        out
    }

    fn at_mut(&mut self, path: &[usize]) -> &mut J {
        path.iter().fold(self, |node, &i| match node {
            J::Arr(items) => &mut items[i],
            J::Obj(entries) => &mut entries[i].1,
            J::Nest { inner, .. } => inner,
            _ => unreachable!("paths only lead through containers"),
        })
    }

    /// Every subtree, for splicing one document's parts into another.
    pub fn subtrees(&self) -> Vec<&J> {
        let mut out = vec![self];
        let mut i = 0;
        while i < out.len() {
            match out[i] {
                J::Arr(items) => out.extend(items.iter()),
                J::Obj(entries) => out.extend(entries.iter().map(|(_, v)| v)),
                J::Nest { inner, .. } => out.push(inner),
                _ => {}
            }
            i += 1;
        }
        out
    }

    /// Keys, strings and numbers in the document, for the mutation dictionary.
    pub fn collect_words(&self, keys: &mut Vec<String>, strings: &mut Vec<String>) {
        for node in self.subtrees() {
            match node {
                J::Obj(entries) => keys.extend(entries.iter().map(|(k, _)| k.clone())),
                J::Str(s) => strings.push(s.clone()),
                _ => {}
            }
        }
    }
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(
        serde_json::to_string(s)
            .expect("a string serialises")
            .as_bytes(),
    );
}

/// What a structural mutation may draw on besides the document itself.
pub struct Words<'a> {
    pub keys: &'a [String],
    pub strings: &'a [String],
    /// Subtrees of other documents in the corpus.
    pub donors: &'a [J],
}

/// One structural mutation of `doc` at a random node.
pub fn mutate(rng: &mut ChaCha8Rng, doc: &mut J, words: &Words) {
    let paths = doc.paths();
    let path = paths.choose(rng).expect("the root is a path").clone();
    let node = doc.at_mut(&path);
    match rng.random_range(0..12) {
        // An extreme number, or a nearby one.
        0 | 1 => {
            *node = match node {
                J::Num(n) if rng.random_bool(0.5) => J::Num(nudge(rng, n)),
                _ => J::Num((*EXTREME_NUMBERS.choose(rng).expect("non-empty")).to_string()),
            }
        }
        // Another type where this one was expected.
        2 => *node = other_type(rng, node),
        // Deep nesting, around and beyond parsers' recursion limits.
        3 => {
            let depth = *[2, 64, 127, 128, 129, 300, 5_000]
                .choose(rng)
                .expect("non-empty");
            *node = J::Nest {
                depth,
                objects: rng.random_bool(0.3),
                inner: Box::new(node.clone()),
            };
        }
        // A key twice, with its value or another.
        4 => {
            if let J::Obj(entries) = node {
                if let Some((k, v)) = entries.choose(rng).cloned() {
                    let v = if rng.random_bool(0.5) {
                        v
                    } else {
                        other_type(rng, &v)
                    };
                    let at = rng.random_range(0..=entries.len());
                    entries.insert(at, (k, v));
                }
            }
        }
        // A key or element removed.
        5 => match node {
            J::Obj(entries) if !entries.is_empty() => {
                entries.remove(rng.random_range(0..entries.len()));
            }
            J::Arr(items) if !items.is_empty() => {
                items.remove(rng.random_range(0..items.len()));
            }
            _ => *node = J::Null,
        },
        // A key from the dictionary (known to some object in the corpus) added here.
        6 => {
            if let J::Obj(entries) = node {
                let key = words
                    .keys
                    .choose(rng)
                    .cloned()
                    .unwrap_or_else(|| "x".into());
                let value = donor(rng, words).unwrap_or(J::Num("1".into()));
                let at = rng.random_range(0..=entries.len());
                entries.insert(at, (key, value));
            }
        }
        // A subtree of another document.
        7 => {
            if let Some(d) = donor(rng, words) {
                *node = d;
            }
        }
        // An element repeated, or the elements reversed.
        8 => match node {
            J::Arr(items) if !items.is_empty() => {
                if rng.random_bool(0.7) {
                    let i = rng.random_range(0..items.len());
                    let copies = *[1, 2, 7, 100].choose(rng).expect("non-empty");
                    for _ in 0..copies {
                        items.insert(i, items[i].clone());
                    }
                } else {
                    items.reverse();
                }
            }
            J::Obj(entries) => entries.reverse(),
            _ => *node = J::Arr(vec![node.clone()]),
        },
        // A string from the dictionary (op and dtype names, other nodes' names) or an odd one.
        9 | 10 => {
            *node = match words.strings.choose(rng) {
                Some(s) if rng.random_bool(0.8) => J::Str(s.clone()),
                _ => J::Str(odd_string(rng)),
            }
        }
        // A key renamed.
        _ => {
            if let J::Obj(entries) = node {
                if !entries.is_empty() {
                    let i = rng.random_range(0..entries.len());
                    entries[i].0 = match words.keys.choose(rng) {
                        Some(k) if rng.random_bool(0.7) => k.clone(),
                        _ => odd_string(rng),
                    };
                }
            }
        }
    }
}

fn donor(rng: &mut ChaCha8Rng, words: &Words) -> Option<J> {
    words.donors.choose(rng).cloned()
}

/// A value of another type than `node`'s, sometimes holding it.
fn other_type(rng: &mut ChaCha8Rng, node: &J) -> J {
    loop {
        let v = match rng.random_range(0..8) {
            0 => J::Null,
            1 => J::Bool(rng.random()),
            2 => J::Num((*EXTREME_NUMBERS.choose(rng).expect("non-empty")).to_string()),
            3 => J::Str(match node {
                J::Num(n) => n.clone(),
                _ => odd_string(rng),
            }),
            4 => J::Arr(Vec::new()),
            5 => J::Arr(vec![node.clone()]),
            6 => J::Obj(Vec::new()),
            _ => J::Obj(vec![("k".into(), node.clone())]),
        };
        if std::mem::discriminant(&v) != std::mem::discriminant(node) {
            return v;
        }
    }
}

/// A number near `n`: ±1, doubled, halved, negated, or off by a dtype's size.
fn nudge(rng: &mut ChaCha8Rng, n: &str) -> String {
    match n.parse::<i128>() {
        Ok(v) => {
            let w = match rng.random_range(0..6) {
                0 => v.saturating_add(1),
                1 => v.saturating_sub(1),
                2 => v.saturating_mul(2),
                3 => v / 2,
                4 => v.saturating_neg(),
                _ => v.saturating_add(*[2, 4, 8, -2, -4, -8].choose(rng).expect("non-empty")),
            };
            w.to_string()
        }
        Err(_) => match n.parse::<f64>() {
            Ok(f) => {
                let g = match rng.random_range(0..4) {
                    0 => -f,
                    1 => f * 1e10,
                    2 => f / 1e10,
                    _ => f.trunc(),
                };
                // Debug prints a float as JSON can read it back (never `inf` for finite input).
                format!("{g:?}")
            }
            Err(_) => "0".into(),
        },
    }
}
