//! Generated ids to text as they arrive: what may be sent now, what must wait, and where a stop
//! string ends the completion. One `TextStream` serves the streamed and the whole responses,
//! so the streamed pieces concatenate to the whole text by construction.
//!
//! Text is held back while (a) the decoding ends in what may be an incomplete UTF-8 sequence (a
//! byte-level token's first half decodes to U+FFFD; at most [`MAX_UNSETTLED`] tokens, after
//! which the bytes are invalid for good and their U+FFFD is final), or (b) its end could be the start of a stop string:
//! a client must never see part of a stop string that then completes.

/// What one new id gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text to send now (may be empty).
    Text(String),
    /// A stop string appeared: the text before it that was not sent yet; generation ends.
    Stop(String),
}

/// Tokens after which a decoding that still ends in U+FFFD is sent as it is: a UTF-8 character
/// has at most 4 bytes and every byte-level token at least one, so by then the bytes can no
/// longer complete a character, and no later token changes how they decode.
pub const MAX_UNSETTLED: usize = 4;

#[derive(Clone, Debug, Default)]
pub struct TextStream {
    /// Consecutive pushes whose decoding ended in U+FFFD.
    unsettled: usize,
    ids: Vec<u32>,
    /// The decoding of `ids` at the last step.
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
    stops: Vec<String>,
}

impl TextStream {
    /// `stops`: the request's stop strings (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..TextStream::default()
        }
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Adds `id`; `decode` turns the ids so far into text.
    pub fn push<E>(
        &mut self,
        id: u32,
        decode: impl Fn(&[u32]) -> Result<String, E>,
    ) -> Result<Piece, E> {
        self.ids.push(id);
        let text = decode(&self.ids)?;
        if text.ends_with('\u{fffd}') {
            self.unsettled += 1;
            if self.unsettled < MAX_UNSETTLED {
                return Ok(Piece::Text(String::new()));
            }
        }
        self.unsettled = 0;
        self.text = text;
        // A stop string lies wholly after what was sent: the hold-back below kept every
        // possible start of one unsent. Search from a little before, on a char boundary, in
        // case a decoding changed earlier text.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.sent.saturating_sub(longest).min(self.text.len());
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        if let Some(at) = hit {
            let rest = self.text.get(self.sent..at).unwrap_or("").to_string();
            self.sent = self.text.len();
            return Ok(Piece::Stop(rest));
        }
        let hold = self
            .stops
            .iter()
            .map(|s| partial_suffix(&self.text, s))
            .max()
            .unwrap_or(0);
        let end = self.text.len() - hold;
        Ok(Piece::Text(self.take_to(end)))
    }

    /// What is left unsent when generation ends without a stop string: everything (a
    /// trailing incomplete character included, as U+FFFD, as `generate` prints it).
    pub fn finish<E>(&mut self, decode: impl Fn(&[u32]) -> Result<String, E>) -> Result<String, E> {
        self.text = decode(&self.ids)?;
        Ok(self.take_to(self.text.len()))
    }

    fn take_to(&mut self, end: usize) -> String {
        if end <= self.sent || !self.text.is_char_boundary(self.sent) {
            return String::new();
        }
        let piece = self.text[self.sent..end].to_string();
        self.sent = end;
        piece
    }
}

/// The length of the longest proper prefix of `stop` that `text` ends with (0 if none).
fn partial_suffix(text: &str, stop: &str) -> usize {
    (1..stop.len())
        .rev()
        .filter(|&k| stop.is_char_boundary(k))
        .find(|&k| text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoder over a fixed table of byte strings (ids index it), lossy like the tokenizer.
    fn decoder(table: &'static [&'static [u8]]) -> impl Fn(&[u32]) -> Result<String, ()> {
        move |ids: &[u32]| {
            let bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&i| table[i as usize].to_vec())
                .collect();
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }
    }

    fn run(table: &'static [&'static [u8]], ids: &[u32], stops: &[&str]) -> (Vec<Piece>, String) {
        let d = decoder(table);
        let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut pieces = Vec::new();
        for &id in ids {
            let p = s.push(id, &d).unwrap();
            let stop = matches!(p, Piece::Stop(_));
            pieces.push(p);
            if stop {
                return (pieces, String::new());
            }
        }
        let rest = s.finish(&d).unwrap();
        (pieces, rest)
    }

    fn joined(pieces: &[Piece], rest: &str) -> String {
        let mut out: String = pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) | Piece::Stop(t) => t.as_str(),
            })
            .collect();
        out.push_str(rest);
        out
    }

    const TABLE: &[&[u8]] = &[
        b"Hel", b"lo", b" wor", b"ld", b"\xc3", b"\xa9", b"EN", b"D", b"!", b"\x80",
    ];

    #[test]
    fn pieces_concatenate_to_the_decoding() {
        let (pieces, rest) = run(TABLE, &[0, 1, 2, 3, 4, 5, 8], &[]);
        assert_eq!(joined(&pieces, &rest), "Hello world\u{e9}!");
        // The first half of é is held, then sent whole with its second half.
        assert_eq!(pieces[4], Piece::Text(String::new()));
        assert_eq!(pieces[5], Piece::Text("\u{e9}".into()));
        // A trailing half character is flushed at the end as U+FFFD.
        let (pieces, rest) = run(TABLE, &[0, 4], &[]);
        assert_eq!(joined(&pieces, &rest), "Hel\u{fffd}");
        // Bytes that never make a character are held MAX_UNSETTLED tokens, then sent: a model
        // that emits them does not stall the stream until its end.
        let (pieces, rest) = run(TABLE, &[0, 9, 9, 9, 9, 9, 8], &[]);
        assert_eq!(pieces[1..4], vec![Piece::Text(String::new()); 3]);
        assert_eq!(pieces[4], Piece::Text("\u{fffd}".repeat(4)));
        assert_eq!(
            joined(&pieces, &rest),
            format!("Hel{}!", "\u{fffd}".repeat(5))
        );
    }

    #[test]
    fn a_stop_string_ends_the_text_before_it_and_is_never_sent_in_part() {
        let (pieces, _) = run(TABLE, &[0, 1, 6, 7, 8], &["END"]);
        assert_eq!(
            pieces,
            [
                Piece::Text("Hel".into()),
                Piece::Text("lo".into()),
                // "EN" could start "END": held.
                Piece::Text(String::new()),
                Piece::Stop(String::new()),
            ]
        );
        assert_eq!(joined(&pieces, ""), "Hello");
        // A held prefix that does not complete is sent afterwards.
        let (pieces, rest) = run(TABLE, &[6, 8], &["END"]);
        assert_eq!(joined(&pieces, &rest), "EN!");
        // A stop string inside one token: the text before it, in the same step.
        let (pieces, _) = run(TABLE, &[0, 1, 2], &["o w", "zz"]);
        assert_eq!(pieces.last(), Some(&Piece::Stop(String::new())));
        assert_eq!(joined(&pieces, ""), "Hell");
        let (pieces, _) = run(TABLE, &[0, 1, 2], &["wo"]);
        assert_eq!(joined(&pieces, ""), "Hello ");
        // The earliest of several.
        let (pieces, _) = run(TABLE, &[0, 1, 2, 3], &["ld", "lo"]);
        assert_eq!(joined(&pieces, ""), "Hel");
    }

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_suffix("abcEN", "END"), 2);
        assert_eq!(partial_suffix("abc", "END"), 0);
        // A whole stop string is found by the search, not held as a prefix.
        assert_eq!(partial_suffix("END", "END"), 0);
        assert_eq!(partial_suffix("x\u{e9}", "\u{e9}z"), 2);
    }
}
