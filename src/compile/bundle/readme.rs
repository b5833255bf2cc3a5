//! The bundle's `README.md`: what each file is and how to replay and compare by hand, with this
//! bundle's kernels and buffers as tables. Names from the graph appear only through
//! [`display_name`] (they are data in `plan.json`).

use std::fmt::Write;

use super::format::{Access, BundlePlan, Role, Vendor};
use crate::codegen::display_name;

pub(super) fn render(plan: &BundlePlan) -> String {
    let mut s = String::new();
    let t = &plan.target;
    let vendor = match t.vendor {
        Vendor::Amd => "AMD",
        Vendor::Nvidia => "NVIDIA",
    };
    let (load, compile) = match t.vendor {
        Vendor::Amd => (
            "`hipModuleLoadData` then `hipModuleGetFunction(entry)`",
            "hiprtc (or clang `-x hip --offload-arch`) with `--gpu-architecture=<arch>`",
        ),
        Vendor::Nvidia => (
            "`cuModuleLoadData` (the driver compiles the PTX) then `cuModuleGetFunction(entry)`",
            "NVRTC with `--gpu-architecture=<arch>`",
        ),
    };
    let _ = writeln!(s, "# rocmforge replay bundle\n");
    let _ =
        writeln!(
        s,
        "Graph {} compiled for **{}** ({vendor}, wave size {}), {}, inputs and weights drawn with \
         seed {} (as `rocmforge run --seed {}`). Format `{}`.\n",
        display_name(&plan.graph),
        t.arch,
        t.wave_size,
        if plan.fused { "fused" } else { "unfused (--no-fuse)" },
        plan.seed,
        plan.seed,
        plan.format
    );
    match (&plan.compiler.name, &plan.compiler.missing) {
        (Some(name), _) => {
            let _ = writeln!(
                s,
                "Code objects were made by {name} with options `{}`.\n",
                plan.compiler.options.join(" ")
            );
        }
        (None, why) => {
            let _ = writeln!(
                s,
                "**No code objects**: no compiler for {} was found where this bundle was \
                 made ({}). The sources are complete; compile them with {compile}.\n",
                t.arch,
                why.as_deref().unwrap_or("no reason recorded")
            );
        }
    }
    s.push_str(FILES);
    let _ = writeln!(
        s,
        "\n## Replaying\n\nWith rocmforge: `rocmforge replay <this directory> [--device hip:0|cuda:0] \
         [--json]`; `rocmforge replay --check` checks the files against `plan.json` without a \
         GPU.\n\nBy hand (a simulator, another runtime):\n\n\
         1. Allocate one device buffer per entry of `buffers`, `bytes` bytes each (at least 1). \
         Fill inputs, weights, constants, quantized weights and states from \
         `buffers/<id>.bin`; fill status buffers with zeros; fill computed and output buffers with 0xFF bytes (NaN), so a value no kernel \
         writes shows up. Buffers are never reused: every id is its own allocation.\n\
         2. Load each kernel: {load}; or compile `kernels/<entry>.hip` with {compile} and \
         the options in `compiler.options`.\n\
         3. Launch the kernels in the order of `kernels` with their `grid`, `block` and \
         `shared_bytes` (dynamic shared memory). Every parameter is a device pointer: \
         `args[i].buffer` is the buffer bound to parameter `i` (kernelParams is an array of \
         pointers to those device pointers); `ctype` is the parameter's C type and `access` \
         whether the kernel writes through it.\n\
         4. After the last kernel, read each status buffer of `checks`: its first little-endian \
         u64 must be 0 (else it is the bitwise complement of the first failing position, and \
         the second u64 the index found there, outside `0..table_rows`).\n\
         5. Download every buffer whose role is `computed`, `output` or `state` and compare it \
         with `expected/<id>.bin` (a state's is its value after the run). A graph output is a view of its buffer with the type `outputs` \
         gives (a reshape shares its operand's buffer, described once)."
    );
    let _ = writeln!(
        s,
        "\n## Compare rule\n\n{}.\n\n| dtype | tolerance |\n| --- | --- |",
        plan.compare.rule
    );
    for (d, tol) in &plan.compare.tolerances {
        if *tol == 0.0 {
            let _ = writeln!(s, "| {d} | exact |");
        } else {
            let _ = writeln!(s, "| {d} | {tol:e} |");
        }
    }
    let _ = writeln!(
        s,
        "\nComputed buffers are the interpreter's values on the optimised graph (the graph the \
         kernels compute), stored in the buffer's dtype. A computed buffer without \
         `expected` holds no node's value (scratch) and is not compared."
    );
    let _ = writeln!(
        s,
        "\n## Kernels ({})\n\n| # | entry | family | grid | block | shared | args (buffer ids; w = written) |\n| --- | --- | --- | --- | --- | --- | --- |",
        plan.kernels.len()
    );
    for (i, k) in plan.kernels.iter().enumerate() {
        let args: Vec<String> = k
            .args
            .iter()
            .map(|a| match a.access {
                Access::Read => a.buffer.to_string(),
                Access::Write => format!("{}w", a.buffer),
            })
            .collect();
        let _ = writeln!(
            s,
            "| {i} | `{}` | {} | {:?} | {:?} | {} | {} |",
            k.entry,
            k.family,
            k.grid,
            k.block,
            k.shared_bytes,
            args.join(" ")
        );
    }
    let _ = writeln!(
        s,
        "\n## Buffers ({})\n\nNames are in `plan.json`.\n\n| id | role | dtype | shape | bytes | file |\n| --- | --- | --- | --- | --- | --- |",
        plan.buffers.len()
    );
    for b in &plan.buffers {
        let file = b
            .data
            .as_deref()
            .or(b.expected.as_deref())
            .unwrap_or(match b.role {
                Role::Status | Role::Counters => "(zeros)",
                _ => "(none)",
            });
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:?} | {} | `{file}` |",
            b.id,
            b.role.name(),
            b.dtype,
            b.shape,
            b.bytes
        );
    }
    s
}

const FILES: &str = "## Files

| file | what it is |
| --- | --- |
| `plan.json` | the plan (typed, versioned): target, compiler, kernels in launch order with launch geometry and arguments, the buffer table, outputs, post-run checks, the compare rule |
| `kernels/<entry>.hip` | each kernel's complete source: the target's prelude, then the kernel |
| `kernels/<entry>.co` / `.ptx` | its code object (AMD code object, or NVIDIA PTX) from the compiler named in `plan.json` |
| `buffers/<id>.bin` | the contents of each input, weight and constant, and of each state at the start of the run: raw little-endian elements of its dtype, row-major (bool: one byte, 0 or 1; f16/bf16: 2 bytes); for a `quantized` weight, its blocks as stored in the scheme `quant` names (ggml layout, rows of whole 32-value blocks) |
| `expected/<id>.bin` | the interpreter's value of each computed buffer, and of each state after the run, in the same layout |
";
