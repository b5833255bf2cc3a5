//! The plumbing every kernel family shares, below the families: rendering a template with a
//! typed context and naming the kernel after its body. Families import it; it imports no
//! family (so `lower.rs`, which dispatches to the families, is the only file above them).

use serde::Serialize;

use super::limits::kernel_args;
use super::plan::{Access, BufferId, Kernel, Launch};
use super::{templates, CodegenError};

/// The placeholder a template's `{{ entry }}` renders as until the body's hash names it.
const ENTRY: &str = "__RF_ENTRY__";

/// Renders a template and names the kernel after its body, so identical kernels are one.
/// `launch` comes checked from `limits`; the parameter count is checked here.
pub(crate) fn finish(
    family: &'static str,
    template: &str,
    ctx: impl Serialize,
    launch: Launch,
    args: Vec<BufferId>,
    node: &str,
) -> Result<Kernel, CodegenError> {
    kernel_args(node, args.len())?;
    let body = render_unnamed(template, ctx)?;
    let access = parameter_access(&body).ok_or_else(|| CodegenError::Template {
        template: template.to_string(),
        message:
            "its entry's parameter list is not one pointer per line of `const T* __restrict__ name`"
                .into(),
    })?;
    if access.len() != args.len() {
        return Err(CodegenError::Template {
            template: template.to_string(),
            message: format!(
                "its entry takes {} pointers, the plan binds {} buffers",
                access.len(),
                args.len()
            ),
        });
    }
    let (entry, body) = name(family, &body);
    Ok(Kernel {
        entry,
        family,
        node: node.to_string(),
        body,
        launch,
        args,
        access,
        tune: None,
        persistent: None,
    })
}

/// `template` rendered with `ctx` and the entry placeholder as its `entry` (see [`name`]).
pub(crate) fn render_unnamed(template: &str, ctx: impl Serialize) -> Result<String, CodegenError> {
    // The typed context becomes one JSON object, with the entry placeholder added.
    let mut ctx = serde_json::to_value(ctx).expect("a context serialises");
    ctx["entry"] = serde_json::Value::from(ENTRY);
    templates::render(template, minijinja::Value::from_serialize(&ctx))
}

/// The entry name of a rendered body (family and a hash of the body) and the body with its
/// placeholder replaced by it.
pub(crate) fn name(family: &str, body: &str) -> (String, String) {
    let h = crate::ir::Fnv1a::new()
        .write(family.as_bytes())
        .write(body.as_bytes())
        .finish();
    let entry = format!("rf_{family}_{:012x}", h >> 16);
    let named = body.replace(ENTRY, &entry);
    (entry, named)
}

/// How the entry point uses each pointer parameter, from the rendered body: the parameters of
/// `ENTRY(...)`, each `const T* ...` (read) or `T* ...` (written). `None` where the list is not
/// made of pointers alone.
fn parameter_access(body: &str) -> Option<Vec<Access>> {
    let at = body.find(&format!("{ENTRY}("))? + ENTRY.len() + 1;
    let params = &body[at..at + body[at..].find(')')?];
    if params.trim().is_empty() {
        return Some(Vec::new());
    }
    params
        .split(',')
        .map(|p| {
            let p = p.trim();
            if !p.contains('*') {
                None
            } else if p.starts_with("const ") {
                Some(Access::Read)
            } else {
                Some(Access::Write)
            }
        })
        .collect()
}
