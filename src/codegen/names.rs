//! Names from the graph next to generated code.
//!
//! Node, buffer and graph names are user text: a name holding a newline, a backslash (which
//! splices a `//` comment onto the next line) or `*/` would turn into code if it reached a
//! kernel. So kernel bodies never contain a name — they are built from shapes, dtypes and
//! numeric attributes alone, and two graphs that differ only in names get byte-identical
//! kernels (and share their cache entries). Names appear only in the plan listing
//! (`show --emit`, snapshots), through [`display_name`].

/// `name` on one line with nothing a C or C++ comment could act on: ASCII letters, digits and
/// `_ . - / : [ ] ( ) ,` stay, every other byte (control characters, `\`, `*`, `?`, `#`,
/// quotes, non-ASCII) becomes `%XX`, so distinct names stay distinct.
pub fn display_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"_.-/:[](),".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_become_inert_single_line_text() {
        assert_eq!(
            display_name("encoder.layer.0/q_proj"),
            "encoder.layer.0/q_proj"
        );
        assert_eq!(
            display_name("x\n#define y */ \\"),
            "x%0A%23define%20y%20%2A/%20%5C"
        );
        assert_eq!(display_name("é\r\0\"'?"), "%C3%A9%0D%00%22%27%3F");
        // Escaping keeps names apart: `%` itself is escaped.
        assert_ne!(display_name("a%0A"), display_name("a\n"));
    }
}
