//! Finding and opening vendor libraries (the HIP runtime, hiprtc, the CUDA driver, NVRTC) at run
//! time. An environment variable may name the file to use: then that file and no other is used,
//! and a path that is not a regular file (a directory, `/dev/null`, a FIFO) is refused before
//! `dlopen` sees it. Otherwise a list of names is searched, each tried once. Every failure is a
//! short reason for a "no device" message, never a panic.

use std::collections::HashSet;
use std::ffi::c_void;
use std::path::Path;

use libloading::Library;

use crate::ir::file::describe;

/// A loaded library and the name or path it was loaded by.
pub(crate) struct Opened {
    pub lib: Library,
    pub name: String,
    /// The environment variable that named it (the user's choice), or `None` for the search.
    pub env: Option<&'static str>,
}

/// `names` in order with repeats removed (cudarc's candidate list repeats some).
pub(crate) fn unique(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut seen = HashSet::new();
    names
        .into_iter()
        .filter(|n| seen.insert(n.clone()))
        .collect()
}

fn load(name: &str) -> Result<Library, String> {
    // SAFETY: loading a shared library runs its initialisers. The names are the vendor's own
    // libraries (or the file the user named for this purpose), whose initialisers are safe to
    // run in any process.
    unsafe { Library::new(name) }.map_err(|e| e.to_string())
}

/// Why no library was opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// No name of the search loaded: `absent` were not there, `failed` were and would not load
    /// (each `name: reason`). Every name is listed once.
    NotFound {
        absent: Vec<String>,
        failed: Vec<String>,
    },
    /// The file the environment variable names cannot be used.
    Unusable { reason: String },
}

impl OpenError {
    /// The reason in one line; `what` names the library (`NVIDIA driver`, `HIP runtime`) and
    /// `usual` the file a machine with it has (`libcuda.so.1`). Absence is the usual case on a
    /// machine without that vendor's GPU, so the names searched are logged at debug level
    /// (`RUST_LOG=rocmforge=debug`), not printed; a file that is there but would not load is
    /// worth its reason in the line.
    pub fn describe(self, what: &str, usual: &str) -> String {
        match self {
            OpenError::NotFound { absent, failed } => {
                tracing::debug!(
                    library = what,
                    absent = %absent.join(", "),
                    failed = %failed.join(", "),
                    "no library of the search loaded"
                );
                let mut line = format!("no {what}: {usual} not found");
                if !failed.is_empty() {
                    line += &format!(" (and {})", failed.join("; "));
                }
                line
            }
            OpenError::Unusable { reason } => reason,
        }
    }

    /// Every name searched, each once, with the reason where it was not absence.
    pub fn tried(&self) -> String {
        match self {
            OpenError::NotFound { absent, failed } => absent
                .iter()
                .chain(failed)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            OpenError::Unusable { reason } => reason.clone(),
        }
    }
}

/// The library environment variable `env` names, else the first of `search` that loads.
pub(crate) fn open(env: &'static str, search: &[String]) -> Result<Opened, OpenError> {
    if let Some(named) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        return open_named(&named, Some(env));
    }
    let (mut absent, mut failed) = (Vec::new(), Vec::new());
    for name in unique(search.iter().cloned()) {
        match load(&name) {
            Ok(lib) => {
                return Ok(Opened {
                    lib,
                    name,
                    env: None,
                })
            }
            // Absence is the usual case and needs no words; any other failure is worth them.
            Err(e) if e.contains("No such file") => absent.push(name),
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    Err(OpenError::NotFound { absent, failed })
}

/// The library file at `path` and no other: the caller's own choice, as an environment
/// variable would make it (a test opening a library it built, for one).
pub(crate) fn open_path(path: &Path) -> Result<Opened, OpenError> {
    open_named(path.as_os_str(), None)
}

/// The one file the user named, through `env` or directly.
fn open_named(named: &std::ffi::OsStr, env: Option<&'static str>) -> Result<Opened, OpenError> {
    let name = named.to_string_lossy().into_owned();
    let label = match env {
        Some(env) => format!("{env}={name}"),
        None => name.clone(),
    };
    // A path is checked before dlopen reads it (dlopen on a FIFO would block); a bare name
    // is the dynamic loader's to search, as the user asked.
    if name.contains('/') {
        match std::fs::metadata(Path::new(named)) {
            Err(e) => {
                return Err(OpenError::Unusable {
                    reason: format!("{label}: {e}"),
                })
            }
            Ok(m) if !m.is_file() => {
                return Err(OpenError::Unusable {
                    reason: format!("{label}: {}, not a library file", describe(&m)),
                })
            }
            Ok(_) => {}
        }
    }
    let lib = load(&name).map_err(|e| OpenError::Unusable {
        reason: format!("{label}: cannot load it: {e}"),
    })?;
    Ok(Opened { lib, name, env })
}

/// `name` loaded as the dynamic loader finds it, if it does (no environment variable involved).
pub(crate) fn open_by_name(name: &str) -> Option<Opened> {
    load(name).ok().map(|lib| Opened {
        lib,
        name: name.to_string(),
        env: None,
    })
}

impl Opened {
    /// The address `symbol` resolves to in this library, if it exports it.
    pub fn address(&self, symbol: &str) -> Option<usize> {
        // SAFETY: the symbol is read as an address only, never called or dereferenced here.
        unsafe { self.lib.get::<*mut c_void>(symbol.as_bytes()) }
            .ok()
            .map(|s| *s as usize)
    }

    /// Every one of `symbols` is exported, else the reason naming (the first few of) those
    /// missing.
    pub fn require(&self, symbols: &[&str], what: &str) -> Result<(), String> {
        let missing: Vec<&str> = symbols
            .iter()
            .copied()
            .filter(|s| self.address(s).is_none())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut named = missing[..missing.len().min(3)].join(", ");
        if missing.len() > 3 {
            named.push_str(&format!(" and {} more", missing.len() - 3));
        }
        Err(format!(
            "{} lacks {named} of the {} entry points rocmforge needs: not {what}, or too old",
            self.label(),
            symbols.len()
        ))
    }

    /// `ENV=path` for the file an environment variable named, else the name found.
    pub fn label(&self) -> String {
        match self.env {
            Some(env) => format!("{env}={}", self.name),
            None => self.name.clone(),
        }
    }

    /// Keeps the library loaded for the rest of the process, so that a later `dlopen` of the
    /// same file or soname (by cudarc) gets this very object, the one checked.
    pub fn keep(self) {
        std::mem::forget(self.lib);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_tried_once_each() {
        let names = ["a", "b", "a", "c", "b"].map(String::from);
        assert_eq!(unique(names), ["a", "b", "c"]);
    }
}
