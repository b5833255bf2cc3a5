//! AMD code objects: `runtime::parse_code_object` (the ELF `NT_AMDGPU_METADATA` note and its
//! msgpack), then the resource table drawn from what it read. Mutation aims interesting
//! integers at the ELF fields the reader trusts: section header offset, size and count, each
//! section's type, offset and size, and each note's name and payload sizes.

use std::path::Path;

use rocmforge::runtime::{parse_code_object, report_table};

use super::mutate::Field;
use super::{message_label, read_dir_files, root, Outcome, Structure, Target};

pub struct CodeObjectTarget;

fn le(b: &[u8], at: usize, width: usize) -> Option<usize> {
    let bytes = b.get(at..at.checked_add(width)?)?;
    let v = bytes
        .iter()
        .rev()
        .fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
    usize::try_from(v).ok()
}

/// The numeric fields of an ELF64 file as far as they can be found (a mutated file may lie).
fn elf_fields(b: &[u8]) -> Vec<Field> {
    let f = |at, width| Field { at, width };
    let mut out = vec![f(0x28, 8), f(0x3a, 2), f(0x3c, 2), f(0x3e, 2)];
    let (Some(shoff), Some(shentsize), Some(shnum)) =
        (le(b, 0x28, 8), le(b, 0x3a, 2), le(b, 0x3c, 2))
    else {
        return out;
    };
    for i in 0..shnum.min(64) {
        let Some(hdr) = i.checked_mul(shentsize).and_then(|o| o.checked_add(shoff)) else {
            break;
        };
        if hdr >= b.len() {
            break;
        }
        out.extend([f(hdr + 4, 4), f(hdr + 0x18, 8), f(hdr + 0x20, 8)]);
        // Note sections: each note's name size, payload size and type.
        if le(b, hdr + 4, 4) == Some(7) {
            let (Some(off), Some(size)) = (le(b, hdr + 0x18, 8), le(b, hdr + 0x20, 8)) else {
                continue;
            };
            let end = off.saturating_add(size).min(b.len());
            let mut at = off;
            while at.saturating_add(12) <= end {
                out.extend([f(at, 4), f(at + 4, 4), f(at + 8, 4)]);
                let (Some(namesz), Some(descsz)) = (le(b, at, 4), le(b, at + 4, 4)) else {
                    break;
                };
                at = at
                    .saturating_add(12)
                    .saturating_add(namesz.div_ceil(4) * 4)
                    .saturating_add(descsz.div_ceil(4) * 4);
            }
        }
    }
    out.retain(|x| x.at + x.width <= b.len());
    out
}

impl Target for CodeObjectTarget {
    fn name(&self) -> &'static str {
        "code_object"
    }

    fn structure(&self) -> Structure {
        Structure::Binary
    }

    fn input_file(&self) -> &'static str {
        "kernel.co"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        let mut seeds = read_dir_files(&root().join("tests/data/code_objects"), &[]);
        seeds.extend(read_dir_files(
            &root().join("tests/data/fuzz/code_object"),
            &[],
        ));
        seeds
    }

    fn fields(&self, input: &[u8]) -> Vec<Field> {
        elf_fields(input)
    }

    fn run(&mut self, input: &[u8], _path: &Path) -> Outcome {
        match parse_code_object(input) {
            Ok(info) => {
                let rows: Vec<(String, _)> = info
                    .kernels
                    .iter()
                    .map(|k| ("node".to_string(), k.clone()))
                    .collect();
                report_table(&rows);
                Ok(format!("ok:{} kernels", info.kernels.len().min(3)))
            }
            Err(e) => Ok(format!("err:{}", message_label(&e.to_string()))),
        }
    }
}
