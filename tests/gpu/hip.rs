//! The HIP runtime path through the shim on an NVIDIA GPU (`hip::`).

use crate::attention::check_attention;
use crate::common::attention_graphs::{Mask, Scale, Spec};
use crate::common::*;
use crate::decode::check_decode;
use crate::device::{
    hold_keeps_the_stream_until_released, memory_returns_to_baseline, mma_atom_probe,
    planted_bug_is_caught, profile_times_every_kernel,
};
use crate::edges::launch_past_the_device_limits;
use crate::gemm::linear_layer_matches_interpreter;
use crate::harness::*;
use crate::hipshim;
use libtest_mimic::{Failed, Trial};
use rocmforge::arch::Platform;
use rocmforge::ir::{format, DType};
use rocmforge::runtime::{Device, HipLibraries, KernelCache};

/// A trial on the shim-backed HIP device.
pub type HipTrial = Box<dyn FnOnce(&Device) -> Result<(), Failed> + Send>;

/// The HIP device path through `tests/hipshim` (`hip::`): the shim's own device facts, every
/// example graph, the op zoo, attention, GEMM and decode cases, the target's matrix atoms,
/// launch limits, poisoning, stream holds and event timing, and memory back to its baseline;
/// each against the interpreter as on `cuda:0`. A shim that cannot be built for want of tools
/// makes them ignored with the reason; one that fails to build or open fails each.
pub fn hip_trials(
    trials: &mut Vec<Trial>,
    main_device: &Device,
    shim: &Option<hipshim::Shim>,
    hip: &Result<Device, hipshim::Unavailable>,
) {
    let mut add = |name: &str, f: HipTrial| {
        let name = format!("hip::{name}");
        match hip {
            Ok(d) => {
                let d = d.clone();
                trials.push(Trial::test(name, move || f(&d)));
            }
            // On an AMD GPU the shim has no CUDA driver to run over: nothing to require.
            Err(hipshim::Unavailable::NotNvidia(why)) if main_device.is_gpu() => trials.push(
                Trial::test(name, || Ok(()))
                    .with_ignored_flag(true)
                    .with_kind(format!("ignored: {why}")),
            ),
            Err(hipshim::Unavailable::NotNvidia(why) | hipshim::Unavailable::NoCompiler(why)) => {
                trials.push(unavailable(name, why, REQUIRE_GPU))
            }
            Err(hipshim::Unavailable::Broken(why)) => {
                let why = why.clone();
                trials.push(Trial::test(name, move || Err(why.into())));
            }
        }
    };
    let cuda_arch = main_device.target().map(|t| t.arch.clone());
    // The CUDA device compiles for the arch-specific row where there is one (sm_90a on an
    // H100); the HIP runtime names the portable processor (sm_90): the same GPU either way.
    let cuda_portable = main_device.target().map(|t| {
        t.caps
            .specific_of
            .map_or(t.arch.clone(), |s| s.of.to_string())
    });
    add(
        "device::is_the_nvidia_platform_of_this_gpu",
        Box::new(move |d| {
            let t = d.target().ok_or("no target")?;
            if d.spec() != "hip:0"
                || t.platform != Platform::Nvidia
                || (Some(&t.arch) != cuda_arch.as_ref() && Some(&t.arch) != cuda_portable.as_ref())
                || !d.label().contains("libhipshim.so")
            {
                return Err(
                    format!("{} (target {}), cuda arch {cuda_arch:?}", d.label(), t.arch).into(),
                );
            }
            Ok(())
        }),
    );
    let shim_files = shim.clone();
    add(
        "shim::graph_capture_replays",
        Box::new(move |_| match &shim_files {
            Some(s) => hipshim::graph_check(s).map_err(Failed::from),
            None => Err("no shim was built".into()),
        }),
    );
    let library = shim.as_ref().map(|s| s.library.clone());
    add(
        "device::ordinal_past_the_last_gpu",
        Box::new(move |_| {
            let libraries = HipLibraries {
                runtime: library.clone(),
                hiprtc: library,
            };
            match Device::open_hip(i32::MAX as usize, &libraries, KernelCache::with_disk(None)) {
                Err(rocmforge::runtime::RuntimeError::NoDevice { reason, .. })
                    if reason.contains("GPU(s) present") =>
                {
                    Ok(())
                }
                other => Err(format!("{:?}", other.map(|d| d.label().to_string())).into()),
            }
        }),
    );
    // The persistent decode kernel through HIP: its argument table from HIP addresses, and a
    // grid codegen bounds (HIP's occupancy is not queried), more blocks than can be resident:
    // tasks are claimed in order, so it must finish all the same.
    add(
        "llama::tiny_persistent_decode_equals_per_kernel",
        Box::new(crate::llama::tiny_persistent),
    );
    add(
        "llama::tiny_persistent_stall_is_a_typed_error",
        Box::new(crate::llama::tiny_persistent_stall),
    );
    for path in files::graph_files() {
        for fuse in [true, false] {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let path = path.clone();
            add(
                &format!("graph::{stem}::{}", if fuse { "fused" } else { "unfused" }),
                Box::new(move |d| {
                    check_graph(d, &format::load(&path).map_err(|e| e.to_string())?, fuse, 3)
                }),
            );
        }
    }
    for g in op_zoo::zoo() {
        add(
            &format!("zoo::{}", g.name),
            Box::new(move |d| check_graph(d, &g, true, 4)),
        );
    }
    // The SIMT and matrix-core attention kernels: GQA, masks, causal offsets, odd sizes.
    let attention = [
        (
            2,
            6,
            2,
            17,
            33,
            64,
            DType::F32,
            Mask::Causal,
            Scale::DivScores,
        ),
        (
            2,
            4,
            4,
            200,
            200,
            128,
            DType::F16,
            Mask::Padding,
            Scale::OnQ,
        ),
        (
            1,
            6,
            2,
            77,
            300,
            64,
            DType::BF16,
            Mask::Causal,
            Scale::MulScores,
        ),
    ];
    for (i, (b, hq, hkv, sq, sk, d, dtype, mask, scale)) in attention.into_iter().enumerate() {
        let spec = Spec {
            hkv,
            sk,
            dtype,
            mask,
            scale,
            cast_softmax: dtype != DType::F32,
            offset: if sq < sk { (sk - sq) as i64 } else { 0 },
            ..Spec::new(b, hq, sq, d)
        };
        add(
            &format!("attention::{i}::{dtype}::{mask:?}"),
            Box::new(move |dev| check_attention(dev, spec, 10 + i as u64)),
        );
    }
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        add(
            &format!("gemm::linear_M17_N384_K1536_{dtype}_bias_gelu"),
            Box::new(move |d| linear_layer_matches_interpreter(d, (17, 384, 1536), dtype, true)),
        );
    }
    for g in gemm_cases::cases(DType::F16, false).into_iter().take(4) {
        add(
            &format!("gemm_mma::{}", g.name),
            Box::new(move |d| check_graph(d, &g, false, 12)),
        );
    }
    for (i, case) in decode_cases::gpu_cases()
        .into_iter()
        .enumerate()
        .step_by(41)
        .take(4)
    {
        add(
            &format!("decode::{}", case.name()),
            Box::new(move |d| check_decode(d, case, 300 + i as u64)),
        );
    }
    if let Ok(d) = hip {
        for &atom in d.target().map_or(&[][..], |t| t.caps.mma) {
            add(
                &format!("mma::{}::exact_product", atom.name),
                Box::new(move |d| mma_atom_probe(d, atom)),
            );
        }
    }
    let device_trials: [(&str, DeviceTrial); 5] = [
        (
            "launch::past_the_device_limits_is_refused",
            launch_past_the_device_limits,
        ),
        ("poison::planted_bug_is_caught", planted_bug_is_caught),
        (
            "profile::hold_keeps_the_stream_until_released",
            hold_keeps_the_stream_until_released,
        ),
        (
            "profile::times_every_kernel_of_the_plan",
            profile_times_every_kernel,
        ),
        ("memory::returns_to_baseline", memory_returns_to_baseline),
    ];
    for (name, f) in device_trials {
        add(name, Box::new(f));
    }
    // Sessions and hipGraph replay through the HIP runtime's entry points.
    for name in crate::sessions::GRAPHS {
        add(
            &format!("session::warm_matches_run::{name}"),
            Box::new(move |d| crate::sessions::warm_session_matches_run(d, name)),
        );
    }
    let session_device_trials: [(&str, DeviceTrial); 4] = [
        ("session::device_scalar_loop::replay", |d| {
            crate::sessions::device_scalar_loop(d, true)
        }),
        ("session::device_scalar_loop::plain", |d| {
            crate::sessions::device_scalar_loop(d, false)
        }),
        (
            "session::warm_runs_allocate_nothing",
            crate::sessions::warm_runs_allocate_nothing,
        ),
        (
            "session::buffers_outlive_the_graph",
            crate::sessions::buffers_outlive_the_graph,
        ),
    ];
    for (name, f) in session_device_trials {
        add(name, Box::new(f));
    }
}

/// [`hip_shim_binds`] where `cc` is here; without it the trial is ignored with the reason (it
/// used to pass), and fails under `ROCMFORGE_REQUIRE_GPU=1`.
pub fn shim_binds_trial() -> Trial {
    let name = "hip::shim::exports_every_entry_point_rocmforge_binds".to_string();
    match hipshim::cc_missing() {
        None => Trial::test(name, hip_shim_binds),
        Some(why) => unavailable(name, &why, REQUIRE_GPU),
    }
}

/// Runs on any machine with `cc`, GPU or not: the shim exports every entry point rocmforge
/// binds as the HIP runtime (a missing one fails the open before `hipInit` is called) and as
/// hiprtc. Without a CUDA driver the open stops at `hipInit` with the shim's reason.
pub fn hip_shim_binds() -> Result<(), Failed> {
    let shim = match hipshim::compile("binds") {
        Ok(s) => s,
        Err(
            hipshim::Unavailable::NotNvidia(why)
            | hipshim::Unavailable::NoCompiler(why)
            | hipshim::Unavailable::Broken(why),
        ) => return Err(why.into()),
    };
    let result = (|| -> Result<(), Failed> {
        let libraries = HipLibraries {
            runtime: Some(shim.library.clone()),
            hiprtc: Some(shim.library.clone()),
        };
        match Device::open_hip(0, &libraries, KernelCache::with_disk(None)) {
            Ok(_) => {}
            Err(rocmforge::runtime::RuntimeError::NoDevice { reason, .. })
                if reason.contains("hipInit failed") && reason.contains("no CUDA driver") => {}
            Err(e) => return Err(e.to_string().into()),
        }
        rocmforge::runtime::Hiprtc::load_from(Some(&shim.library))
            .map(|_| ())
            .map_err(|e| e.to_string().into())
    })();
    hipshim::remove(Some(shim));
    result
}
