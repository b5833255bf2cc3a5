//! The parameter list of a kernel's entry point, read from its source. A bundle records each
//! argument's C type from here, and a replay checks the recorded list against the source, so a
//! launch never passes a kernel more or fewer pointers than it declares.

use super::format::Access;

/// The C types of `entry`'s parameters in `source`, in order, each with its access (a `const`
/// pointer is read). Every parameter must be a pointer: kernels take one device buffer each.
pub(super) fn parameters(source: &str, entry: &str) -> Result<Vec<(String, Access)>, String> {
    let open = format!("{entry}(");
    let start = source
        .match_indices(&open)
        .map(|(i, _)| i)
        // The entry itself, not a longer name that ends in it.
        .find(|&i| {
            source[..i]
                .chars()
                .next_back()
                .is_some_and(|c| !(c.is_ascii_alphanumeric() || c == '_'))
        })
        .ok_or_else(|| format!("the source does not define `{entry}`"))?
        + open.len();
    let len = source[start..]
        .find(')')
        .ok_or_else(|| format!("the parameter list of `{entry}` is not closed"))?;
    let list = source[start..start + len].trim();
    if list.is_empty() {
        return Ok(vec![]);
    }
    list.split(',')
        .map(|p| {
            let words: Vec<&str> = p
                .split_whitespace()
                .filter(|w| *w != "__restrict__")
                .collect();
            let name_ok = words
                .last()
                .is_some_and(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            let ty = if name_ok && words.len() >= 2 {
                words[..words.len() - 1].join(" ")
            } else {
                String::new()
            };
            if !ty.ends_with('*') {
                return Err(format!(
                    "parameter `{}` of `{entry}` is not a named pointer",
                    p.trim()
                ));
            }
            let access = if words[0] == "const" {
                Access::Read
            } else {
                Access::Write
            };
            Ok((ty, access))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_types_and_access_of_each_parameter() {
        let src = "__device__ void rf_x_1a(int) {}\nextern \"C\" __global__ void \
                   __launch_bounds__(256) rf_x_1(const float* __restrict__ a, \
                   const __half* __restrict__ b, unsigned long long* __restrict__ s, \
                   float* __restrict__ out) {\n}";
        assert_eq!(
            parameters(src, "rf_x_1").unwrap(),
            vec![
                ("const float*".to_string(), Access::Read),
                ("const __half*".to_string(), Access::Read),
                ("unsigned long long*".to_string(), Access::Write),
                ("float*".to_string(), Access::Write),
            ]
        );
    }

    #[test]
    fn refuses_sources_that_do_not_declare_the_entry_as_pointers() {
        for (src, why) in [
            ("void rf_y(float* a) {}", "does not define"),
            ("void xrf_x(float* a) {}", "does not define"),
            ("void rf_x(float* a", "not closed"),
            ("void rf_x(int n, float* a) {}", "not a named pointer"),
            ("void rf_x(float*) {}", "not a named pointer"),
        ] {
            let e = parameters(src, "rf_x").unwrap_err();
            assert!(e.contains(why), "{src}: {e}");
        }
        assert_eq!(parameters("void rf_x( ) {}", "rf_x").unwrap(), vec![]);
    }
}
