//! Trials that need a tool (hiprtc, the offline clang, a host compiler, ptxas).

use libtest_mimic::{Failed, Trial};

/// A trial that needs `tool`: it runs with it; without it, it fails when `require` (the
/// environment variable that demands the tool) is set to 1, and is reported ignored, with the
/// reason, otherwise.
pub fn needs<T: Clone + Send + 'static, E: std::fmt::Display>(
    tool: &Result<T, E>,
    require: &str,
    name: String,
    f: impl FnOnce(T) -> Result<(), Failed> + Send + 'static,
) -> Trial {
    match tool {
        Ok(t) => {
            let t = t.clone();
            Trial::test(name, move || f(t))
        }
        Err(e) if std::env::var(require).is_ok_and(|v| v == "1") => {
            let msg = format!("{require}=1 but {e}");
            Trial::test(name, move || Err(msg.clone().into()))
        }
        Err(e) => Trial::test(name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind(format!("ignored: {e}")),
    }
}
