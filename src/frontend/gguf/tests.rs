//! The GGUF reader against files written byte by byte: what reads back, and the typed error of
//! every kind of malformed file.

use super::*;

/// A GGUF file built field by field, so a test can write exactly the bytes it means.
#[derive(Default)]
struct Writer {
    b: Vec<u8>,
}

impl Writer {
    fn u32(mut self, v: u32) -> Self {
        self.b.extend(v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.b.extend(v.to_le_bytes());
        self
    }
    fn str(self, s: &str) -> Self {
        self.bytes_str(s.as_bytes())
    }
    fn bytes_str(mut self, s: &[u8]) -> Self {
        self.b.extend((s.len() as u64).to_le_bytes());
        self.b.extend(s);
        self
    }
    fn raw(mut self, bytes: &[u8]) -> Self {
        self.b.extend(bytes);
        self
    }
    fn header(version: u32, tensors: u64, keys: u64) -> Self {
        Writer::default()
            .raw(b"GGUF")
            .u32(version)
            .u64(tensors)
            .u64(keys)
    }
    fn kv_u32(self, k: &str, v: u32) -> Self {
        self.str(k).u32(4).u32(v)
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Self {
        let mut w = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            w = w.u64(d);
        }
        w.u32(ty).u64(offset)
    }
    /// Pads to `align` then appends `data`.
    fn data(mut self, align: usize, data: &[u8]) -> Self {
        while !self.b.len().is_multiple_of(align) {
            self.b.push(0);
        }
        self.b.extend(data);
        self
    }
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rocmforge-gguf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn open_bytes(d: &Path, bytes: &[u8]) -> Result<Gguf, ModelError> {
    let p = d.join("m.gguf");
    std::fs::write(&p, bytes).unwrap();
    Gguf::open(&p)
}

fn error_of(d: &Path, bytes: &[u8]) -> GgufError {
    match open_bytes(d, bytes) {
        Err(ModelError::Gguf { error, .. }) => error,
        Err(e) => panic!("not a GGUF error: {e}"),
        Ok(_) => panic!("opened"),
    }
}

/// Two tensors (an F32 [2, 3] and a Q8_0 [32]) and a few typed keys, alignment 32.
fn good() -> Vec<u8> {
    let f: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let mut q = vec![0x00, 0x3c]; // d = 1.0
    q.extend((0..32).map(|j: i32| (j - 16) as i8 as u8));
    let mut data = f.clone();
    data.resize(32, 0);
    data.extend(&q);
    Writer::header(3, 2, 4)
        .kv_u32("llama.block_count", 30)
        .str("general.name")
        .u32(8)
        .str("tiny")
        .str("tokenizer.ggml.tokens")
        .u32(9)
        .u32(8)
        .u64(2)
        .str("a")
        .str("b")
        .str("flag")
        .u32(7)
        .raw(&[1])
        .tensor("t.f32", &[3, 2], 0, 0)
        .tensor("t.q8", &[32], 8, 32)
        .data(32, &data)
        .b
}

#[test]
fn a_small_file_reads_back_its_metadata_and_tensors() {
    let d = dir("good");
    let g = open_bytes(&d, &good()).unwrap();
    assert_eq!((g.version, g.alignment), (3, 32));
    assert_eq!(g.u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.str("general.name").unwrap(), "tiny");
    assert_eq!(g.strings("tokenizer.ggml.tokens").unwrap(), ["a", "b"]);
    assert!(g.bool("flag").unwrap());
    assert!(matches!(
        g.u32("general.name"),
        Err(ModelError::Gguf {
            error: GgufError::KeyType { .. },
            ..
        })
    ));
    assert!(matches!(
        g.f32("nope"),
        Err(ModelError::Gguf {
            error: GgufError::MissingKey { .. },
            ..
        })
    ));
    let t = g.tensor("t.f32", &[2, 3], DType::F32).unwrap();
    assert_eq!(t.to_f64_vec(), [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
    assert!(matches!(
        g.tensor("t.f32", &[3, 2], DType::F32),
        Err(ModelError::TensorShape { .. })
    ));
    let q = g.dequantize("t.q8").unwrap();
    assert_eq!(q, (0..32).map(|j| (j - 16) as f32).collect::<Vec<_>>());
    assert_eq!(g.tensor_names().collect::<Vec<_>>(), ["t.f32", "t.q8"]);
    // Version 2 has the same layout.
    let mut v2 = good();
    v2[4] = 2;
    assert!(open_bytes(&d, &v2).is_ok());
    std::fs::remove_dir_all(&d).ok();
}

/// Hand-made malformed files: each a typed error naming what is wrong, none a panic or a
/// huge allocation (counts are bounded by the bytes present before anything is reserved).
#[test]
fn malformed_files_give_typed_errors() {
    let d = dir("bad");
    let good = good();
    let tensor_file = |name: &str, dims: &[u64], ty: u32, offset: u64, data: usize| {
        Writer::header(3, 1, 0)
            .tensor(name, dims, ty, offset)
            .data(32, &vec![0u8; data])
            .b
    };
    type Check = fn(&GgufError) -> bool;
    let cases: Vec<(&str, Vec<u8>, Check)> = vec![
        ("empty", vec![], |e| matches!(e, GgufError::BadMagic { .. })),
        ("magic", b"GGML\x03\0\0\0".to_vec(), |e| {
            matches!(e, GgufError::BadMagic { .. })
        }),
        ("version 1", Writer::header(1, 0, 0).b, |e| {
            matches!(e, GgufError::UnsupportedVersion { version: 1 })
        }),
        ("version 4", Writer::header(4, 0, 0).b, |e| {
            matches!(e, GgufError::UnsupportedVersion { version: 4 })
        }),
        ("truncated header", good[..14].to_vec(), |e| {
            matches!(e, GgufError::Truncated { .. })
        }),
        ("truncated metadata", good[..60].to_vec(), |e| {
            matches!(e, GgufError::Truncated { .. })
        }),
        (
            "truncated data",
            good[..good.len() - 1].to_vec(),
            |e| matches!(e, GgufError::OutOfRange { tensor, .. } if tensor == "t.q8"),
        ),
        ("huge tensor count", Writer::header(3, u64::MAX, 0).b, |e| {
            matches!(
                e,
                GgufError::TooMany {
                    count: u64::MAX,
                    ..
                }
            )
        }),
        ("huge key count", Writer::header(3, 0, 1 << 40).b, |e| {
            matches!(e, GgufError::TooMany { .. })
        }),
        (
            "huge array",
            Writer::header(3, 0, 1)
                .str("a")
                .u32(9)
                .u32(8)
                .u64(1 << 61)
                .b,
            |e| matches!(e, GgufError::TooMany { .. }),
        ),
        (
            "huge string",
            Writer::header(3, 0, 1).str("s").u32(8).u64(u64::MAX).b,
            |e| matches!(e, GgufError::Truncated { need: u64::MAX, .. }),
        ),
        (
            "unknown value type",
            Writer::header(3, 0, 1).str("k").u32(13).u32(0).b,
            |e| matches!(e, GgufError::UnknownValueType { type_id: 13, .. }),
        ),
        (
            "unknown array element type",
            Writer::header(3, 0, 1).str("k").u32(9).u32(99).u64(0).b,
            |e| matches!(e, GgufError::UnknownValueType { type_id: 99, .. }),
        ),
        (
            "nested too deep",
            {
                let mut w = Writer::header(3, 0, 1).str("k").u32(9);
                for _ in 0..6 {
                    w = w.u32(9).u64(1);
                }
                w.b
            },
            |e| matches!(e, GgufError::NestedTooDeep { .. }),
        ),
        (
            "bad bool",
            Writer::header(3, 0, 1).str("k").u32(7).raw(&[2]).b,
            |e| matches!(e, GgufError::BadBool { found: 2, .. }),
        ),
        (
            "bad utf-8 key",
            Writer::header(3, 0, 1)
                .bytes_str(b"\xff\xfe")
                .u32(4)
                .u32(0)
                .b,
            |e| matches!(e, GgufError::BadUtf8 { .. }),
        ),
        (
            "bad utf-8 value",
            Writer::header(3, 0, 1)
                .str("k")
                .u32(8)
                .bytes_str(b"a\xc0")
                .b,
            |e| matches!(e, GgufError::BadUtf8 { .. }),
        ),
        (
            "duplicate key",
            Writer::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).b,
            |e| matches!(e, GgufError::DuplicateKey { key } if key == "k"),
        ),
        (
            "alignment not a power of two",
            Writer::header(3, 0, 1).kv_u32("general.alignment", 24).b,
            |e| matches!(e, GgufError::BadAlignment { value: 24 }),
        ),
        (
            "alignment zero",
            Writer::header(3, 0, 1).kv_u32("general.alignment", 0).b,
            |e| matches!(e, GgufError::BadAlignment { value: 0 }),
        ),
        (
            "alignment of the wrong type",
            Writer::header(3, 0, 1)
                .str("general.alignment")
                .u32(8)
                .str("32")
                .b,
            |e| matches!(e, GgufError::KeyType { .. }),
        ),
        (
            "a ggml type not run",
            tensor_file("t", &[256], 23, 0, 256),
            |e| {
                matches!(e, GgufError::UnknownTensorType { type_id: 23, ggml_name: "IQ4_XS", tensor } if tensor == "t")
                    && e.to_string().contains("`t`: ggml type IQ4_XS (id 23)")
            },
        ),
        (
            "an id ggml does not define",
            tensor_file("t", &[32], 99, 0, 256),
            |e| {
                matches!(
                    e,
                    GgufError::UnknownTensorType {
                        type_id: 99,
                        ggml_name: "unknown",
                        ..
                    }
                )
            },
        ),
        (
            "too many dims",
            tensor_file("t", &[1, 1, 1, 1, 1], 0, 0, 4),
            |e| matches!(e, GgufError::BadShape { .. }),
        ),
        (
            "dims overflow",
            tensor_file("t", &[1 << 40, 1 << 40], 0, 0, 4),
            |e| matches!(e, GgufError::BadShape { .. }),
        ),
        ("partial block", tensor_file("t", &[48], 3, 0, 64), |e| {
            matches!(e, GgufError::BadShape { .. })
        }),
        ("misaligned offset", tensor_file("t", &[1], 0, 4, 8), |e| {
            matches!(e, GgufError::Misaligned { offset: 4, .. })
        }),
        (
            "offset past the end",
            tensor_file("t", &[1], 0, 64, 32),
            |e| matches!(e, GgufError::OutOfRange { start: 64, .. }),
        ),
        (
            "offset overflows",
            tensor_file("t", &[8], 0, u64::MAX - 31, 32),
            |e| matches!(e, GgufError::OutOfRange { .. }),
        ),
        (
            "overlapping tensors",
            Writer::header(3, 2, 0)
                .tensor("a", &[16], 0, 0)
                .tensor("b", &[16], 0, 32)
                .data(32, &[0u8; 128])
                .b,
            |e| matches!(e, GgufError::Overlap { tensor, other, .. } if tensor == "b" && other == "a"),
        ),
        (
            "duplicate tensor",
            Writer::header(3, 2, 0)
                .tensor("a", &[4], 0, 0)
                .tensor("a", &[4], 0, 32)
                .data(32, &[0u8; 64])
                .b,
            |e| matches!(e, GgufError::DuplicateTensor { name } if name == "a"),
        ),
    ];
    for (name, bytes, check) in cases {
        let e = error_of(&d, &bytes);
        assert!(check(&e), "{name}: {e}");
    }
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn special_files_are_not_models() {
    let d = dir("special");
    let fifo = d.join("fifo.gguf");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for p in [fifo.as_path(), Path::new("/dev/zero"), d.as_path()] {
        assert!(matches!(
            Gguf::open(p),
            Err(ModelError::File(crate::ir::FileError::NotRegular { .. }))
        ));
    }
    std::fs::remove_dir_all(&d).ok();
}
