//! `LIKE` patterns, matched without backtracking.
//!
//! A pattern is split at each `%` into segments of fixed length (`_` is a one-character wildcard
//! inside a segment). The first segment must match at the start of the text, the last at its end,
//! and the ones between are found left to right, each at its leftmost place after the previous
//! one. Leftmost is always safe: a later place would leave less text for the segments after it.
//! Time is at most (text length × pattern length) character comparisons; characters are Unicode
//! scalar values.

#[derive(Debug, Clone, PartialEq)]
pub(super) struct LikePattern {
    /// The pieces between `%` wildcards, in order; one piece when the pattern has no `%`.
    segments: Vec<Vec<Atom>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Atom {
    /// `_`: any one character.
    AnyChar,
    Char(char),
}

impl Atom {
    fn matches(self, c: char) -> bool {
        match self {
            Atom::AnyChar => true,
            Atom::Char(want) => want == c,
        }
    }
}

impl LikePattern {
    /// Compiles `pattern`; after `escape`, any character (`%` and `_` included) is literal.
    /// The error is the reason a pattern is invalid.
    pub(super) fn compile(pattern: &str, escape: Option<char>) -> Result<LikePattern, String> {
        let mut segments = vec![Vec::new()];
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            let atom = if Some(c) == escape {
                let literal = chars.next().ok_or_else(|| {
                    format!(
                        "the LIKE pattern ends with the escape character {c:?}, which must be \
                         followed by the character to take literally (write it twice to match \
                         {c:?} itself)"
                    )
                })?;
                Atom::Char(literal)
            } else if c == '%' {
                segments.push(Vec::new());
                continue;
            } else if c == '_' {
                Atom::AnyChar
            } else {
                Atom::Char(c)
            };
            if let Some(segment) = segments.last_mut() {
                segment.push(atom);
            }
        }
        Ok(LikePattern { segments })
    }

    pub(super) fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        let Some((first, rest)) = self.segments.split_first() else {
            return text.is_empty();
        };
        let Some((last, middle)) = rest.split_last() else {
            return fits(first, &text);
        };
        if first.len() + last.len() > text.len() {
            return false;
        }
        let (head, tail) = text.split_at(first.len());
        let (mut window, end) = tail.split_at(tail.len() - last.len());
        if !fits(first, head) || !fits(last, end) {
            return false;
        }
        for segment in middle {
            match find(segment, window) {
                Some(at) => window = &window[at + segment.len()..],
                None => return false,
            }
        }
        true
    }
}

/// Whether `segment` matches all of `text`.
fn fits(segment: &[Atom], text: &[char]) -> bool {
    segment.len() == text.len() && segment.iter().zip(text).all(|(a, &c)| a.matches(c))
}

/// The leftmost index in `text` where `segment` matches.
fn find(segment: &[Atom], text: &[char]) -> Option<usize> {
    let last_start = text.len().checked_sub(segment.len())?;
    (0..=last_start).find(|&at| fits(segment, &text[at..at + segment.len()]))
}
