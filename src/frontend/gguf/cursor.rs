//! The byte reader under the GGUF header: every read names what it reads, and a count or
//! length read from the file is bounded by the bytes left before anything is allocated.

use super::GgufError;

/// A reader over the header bytes that names what it reads when they run out.
pub(super) struct Cursor<'a> {
    pub(super) buf: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn take(
        &mut self,
        n: u64,
        what: impl FnOnce() -> String,
    ) -> Result<&'a [u8], GgufError> {
        let truncated = || GgufError::Truncated {
            what: what(),
            at: self.at,
            need: n,
            len: self.buf.len(),
        };
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.at.checked_add(n))
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(truncated)?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub(super) fn array<const N: usize>(
        &mut self,
        what: &dyn Fn() -> String,
    ) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what)?;
        Ok(b.try_into().expect("N bytes taken"))
    }

    pub(super) fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(super) fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    pub(super) fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }

    pub(super) fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let n = self.u64(&|| format!("the length of {}", what()))?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 { what: what() })
    }

    /// A count of elements of at least `min_bytes` each: more than the remaining bytes could
    /// hold is refused before anything is allocated for it.
    pub(super) fn count(
        &mut self,
        min_bytes: u64,
        max: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        let fits = n
            .checked_mul(min_bytes)
            .is_some_and(|b| b <= self.remaining() as u64);
        if n > max || !fits {
            return Err(GgufError::TooMany {
                what: what(),
                count: n,
                max: max.min(self.remaining() as u64 / min_bytes.max(1)),
            });
        }
        Ok(usize::try_from(n).expect("at most the remaining bytes"))
    }
}
