//! The kernel templates of `kernel_templates/`, compiled into the binary and rendered with
//! minijinja.

use std::sync::OnceLock;

use minijinja::Environment;

use super::CodegenError;

const TEMPLATES: &[(&str, &str)] = &[
    (
        "prelude_amd.hip",
        include_str!("../../kernel_templates/prelude_amd.hip"),
    ),
    (
        "prelude_nvidia.hip",
        include_str!("../../kernel_templates/prelude_nvidia.hip"),
    ),
    (
        "common.hip",
        include_str!("../../kernel_templates/common.hip"),
    ),
    (
        "elementwise.hip",
        include_str!("../../kernel_templates/elementwise.hip"),
    ),
    ("copy.hip", include_str!("../../kernel_templates/copy.hip")),
    (
        "persistent.hip",
        include_str!("../../kernel_templates/persistent.hip"),
    ),
    (
        "gather.hip",
        include_str!("../../kernel_templates/gather.hip"),
    ),
    (
        "cache_write.hip",
        include_str!("../../kernel_templates/cache_write.hip"),
    ),
    (
        "paged_write.hip",
        include_str!("../../kernel_templates/paged_write.hip"),
    ),
    (
        "paged_decode.hip",
        include_str!("../../kernel_templates/paged_decode.hip"),
    ),
    (
        "argmax.hip",
        include_str!("../../kernel_templates/argmax.hip"),
    ),
    (
        "argmax_split.hip",
        include_str!("../../kernel_templates/argmax_split.hip"),
    ),
    (
        "causal_mask.hip",
        include_str!("../../kernel_templates/causal_mask.hip"),
    ),
    (
        "matmul.hip",
        include_str!("../../kernel_templates/matmul.hip"),
    ),
    (
        "gemm_scalar.hip",
        include_str!("../../kernel_templates/gemm_scalar.hip"),
    ),
    (
        "gemm_small_m.hip",
        include_str!("../../kernel_templates/gemm_small_m.hip"),
    ),
    (
        "gemm_quant.hip",
        include_str!("../../kernel_templates/gemm_quant.hip"),
    ),
    (
        "gemm_quant_dot.hip",
        include_str!("../../kernel_templates/gemm_quant_dot.hip"),
    ),
    (
        "gemm_quant_act.hip",
        include_str!("../../kernel_templates/gemm_quant_act.hip"),
    ),
    (
        "quant_parts.hip",
        include_str!("../../kernel_templates/quant_parts.hip"),
    ),
    (
        "dequantize.hip",
        include_str!("../../kernel_templates/dequantize.hip"),
    ),
    (
        "gemm_parts.hip",
        include_str!("../../kernel_templates/gemm_parts.hip"),
    ),
    (
        "gemm_mma.hip",
        include_str!("../../kernel_templates/gemm_mma.hip"),
    ),
    (
        "gemm_wgmma.hip",
        include_str!("../../kernel_templates/gemm_wgmma.hip"),
    ),
    (
        "gemm_wgmma_tma.hip",
        include_str!("../../kernel_templates/gemm_wgmma_tma.hip"),
    ),
    (
        "softmax.hip",
        include_str!("../../kernel_templates/softmax.hip"),
    ),
    (
        "layernorm.hip",
        include_str!("../../kernel_templates/layernorm.hip"),
    ),
    (
        "rmsnorm.hip",
        include_str!("../../kernel_templates/rmsnorm.hip"),
    ),
    ("rope.hip", include_str!("../../kernel_templates/rope.hip")),
    (
        "rope_parts.hip",
        include_str!("../../kernel_templates/rope_parts.hip"),
    ),
    (
        "decode_merge.hip",
        include_str!("../../kernel_templates/decode_merge.hip"),
    ),
    (
        "reduce.hip",
        include_str!("../../kernel_templates/reduce.hip"),
    ),
    (
        "flash_attention.hip",
        include_str!("../../kernel_templates/flash_attention.hip"),
    ),
    (
        "flash_attention_mma.hip",
        include_str!("../../kernel_templates/flash_attention_mma.hip"),
    ),
    (
        "flash_attention_wgmma.hip",
        include_str!("../../kernel_templates/flash_attention_wgmma.hip"),
    ),
    (
        "flash_decode.hip",
        include_str!("../../kernel_templates/flash_decode.hip"),
    ),
    (
        "flash_attention_simt.hip",
        include_str!("../../kernel_templates/flash_attention_simt.hip"),
    ),
    (
        "mma_probe.hip",
        include_str!("../../kernel_templates/mma_probe.hip"),
    ),
];

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_keep_trailing_newline(true);
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        for (name, text) in TEMPLATES {
            env.add_template(name, text)
                .expect("kernel templates parse (checked by tests)");
        }
        env
    })
}

pub(crate) fn render(name: &str, ctx: minijinja::Value) -> Result<String, CodegenError> {
    env()
        .get_template(name)
        .and_then(|t| t.render(ctx))
        .map_err(|e| CodegenError::Template {
            template: name.to_string(),
            message: format!("{e:#}"),
        })
}
