//! torch's reading of a settings string, token by token (c10's
//! `ConfigTokenizer` and the walks of its parsers, 2.11 to 2.15, as their
//! wheels behave: `scripts/torch-parser.sh` and the differential test
//! `torch_parser.rs`):
//!
//! - tokens are split at `, : [ ]` (each of them a token) and whitespace
//!   (C's `isspace`) is dropped anywhere, so `expandable _segments` is
//!   `expandable_segments` and `1 28` is `128`;
//! - after a key one token is passed over (it is meant to be `:`, and
//!   torch does not check it), then comes the value; after the value one
//!   more token is passed over (meant to be `,`); a missing value is an
//!   error;
//! - numbers are C's `stoull` / `stod` of the token: the longest prefix
//!   that reads as one (`20MB` is 20, `0.5x` is 0.5), `-1` wraps to the
//!   largest `size_t`, out of range or no digits is an error.
//!
//! No heap: a token is a slice of the string (whitespace inside it kept,
//! skipped by every comparison and conversion).

use super::keys::Refusal;

/// C's `isspace` in the C locale.
const fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

const fn is_separator(b: u8) -> bool {
    matches!(b, b',' | b':' | b'[' | b']')
}

/// One token: a separator (`,`, `:`, `[`, `]`) or a word between them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Token<'a> {
    /// Its text in the string, trimmed (a word may hold whitespace, which
    /// torch drops).
    pub(crate) text: &'a str,
    /// Its offset in the string.
    pub(crate) at: usize,
}

impl<'a> Token<'a> {
    /// Its bytes as torch has them (whitespace dropped).
    fn bytes(self) -> impl Iterator<Item = u8> + 'a {
        self.text.bytes().filter(|b| !is_space(*b))
    }

    /// Whether torch's token is `s`.
    pub(crate) fn is(self, s: &str) -> bool {
        self.bytes().eq(s.bytes())
    }

    /// `True` or `False`, exactly.
    pub(crate) fn to_bool(self) -> Result<bool, Refusal> {
        if self.is("True") {
            Ok(true)
        } else if self.is("False") {
            Ok(false)
        } else {
            Err((
                "Expected 'True' or 'False' (torch takes no other spelling)",
                None,
            ))
        }
    }

    /// C's `stoull` of the token, and whether it read all of it.
    pub(crate) fn to_size(self) -> Result<(u64, bool), Refusal> {
        let mut b = self.bytes().peekable();
        let negative = match b.peek() {
            Some(b'-') => {
                b.next();
                true
            }
            Some(b'+') => {
                b.next();
                false
            }
            _ => false,
        };
        let mut value: u64 = 0;
        let mut digits = 0;
        while let Some(d) = b.peek().copied().filter(u8::is_ascii_digit) {
            b.next();
            digits += 1;
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(d - b'0')))
                .ok_or(("a number out of range (torch's stoull)", None))?;
        }
        if digits == 0 {
            return Err(("expected a number (torch's stoull)", None));
        }
        let whole = b.next().is_none();
        Ok((
            if negative {
                value.wrapping_neg()
            } else {
                value
            },
            whole,
        ))
    }

    /// C's `stod` of the token (decimal and `inf` / `nan`; not hex
    /// floats), and whether it read all of it.
    pub(crate) fn to_double(self) -> Result<(f64, bool), Refusal> {
        // The token without whitespace, on the stack; a number longer
        // than this is refused.
        let mut buf = [0u8; 64];
        let mut n = 0;
        for b in self.bytes() {
            if n == buf.len() {
                return Err(("a number too long to read", None));
            }
            buf[n] = b;
            n += 1;
        }
        let s = &buf[..n];
        let len = double_prefix(s);
        if len == 0 {
            return Err(("expected a number (torch's stod)", None));
        }
        let text = core::str::from_utf8(&s[..len]).map_err(|_| ("expected a number", None))?;
        let x: f64 = text.parse().map_err(|_| ("expected a number", None))?;
        let finite_text = !s[..len]
            .iter()
            .any(|b| b.eq_ignore_ascii_case(&b'i') || b.eq_ignore_ascii_case(&b'n'));
        // `stod` throws on a result out of `double`'s range (ERANGE).
        let mantissa_nonzero = s[..len]
            .iter()
            .take_while(|b| !b.eq_ignore_ascii_case(&b'e'))
            .any(|b| (b'1'..=b'9').contains(b));
        if finite_text && (x.is_infinite() || (mantissa_nonzero && !x.is_normal())) {
            return Err(("a number out of range (torch's stod)", None));
        }
        Ok((x, len == n))
    }
}

/// The length of the longest prefix of `s` that `strtod` reads: a sign,
/// then `inf`, `infinity`, `nan`, or digits with at most one point and an
/// exponent that has digits.
fn double_prefix(s: &[u8]) -> usize {
    let mut i = usize::from(matches!(s.first(), Some(b'+' | b'-')));
    let word = |w: &[u8], at: usize| {
        s.len() >= at + w.len() && s[at..at + w.len()].eq_ignore_ascii_case(w)
    };
    if word(b"infinity", i) {
        return i + 8;
    }
    if word(b"inf", i) || word(b"nan", i) {
        return i + 3;
    }
    let mut digits = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        i += 1;
        digits += 1;
    }
    if i < s.len() && s[i] == b'.' {
        i += 1;
        while i < s.len() && s[i].is_ascii_digit() {
            i += 1;
            digits += 1;
        }
    }
    if digits == 0 {
        return 0;
    }
    if i < s.len() && (s[i] == b'e' || s[i] == b'E') {
        let mut j = i + 1;
        if j < s.len() && (s[j] == b'+' || s[j] == b'-') {
            j += 1;
        }
        let exp_start = j;
        while j < s.len() && s[j].is_ascii_digit() {
            j += 1;
        }
        if j > exp_start {
            i = j;
        }
    }
    i
}

/// The tokens of a settings string, in order, read forward as torch's
/// parsers read them.
#[derive(Clone, Debug)]
pub(crate) struct Tokens<'a> {
    text: &'a str,
    at: usize,
    /// Whether a value read since it was last cleared was read as only
    /// torch reads it (a number's prefix, whitespace inside a token).
    pub(crate) odd: bool,
}

impl<'a> Tokens<'a> {
    pub(crate) fn of(text: &'a str) -> Self {
        Tokens {
            text,
            at: 0,
            odd: false,
        }
    }

    /// Where the next token starts (whitespace skipped), or the end.
    pub(crate) fn offset(&self) -> usize {
        self.peek().map_or(self.text.len(), |t| t.at)
    }

    /// The string from offset `at` to the last token taken.
    pub(crate) fn since(&self, at: usize) -> &'a str {
        self.text.get(at..self.at).unwrap_or("").trim_end()
    }

    /// The next token as a word value (whitespace inside it noted).
    pub(crate) fn word(&mut self) -> Result<Token<'a>, Refusal> {
        let t = self.value()?;
        self.odd |= t.text.bytes().any(is_space);
        Ok(t)
    }

    /// The next token as `stoull` reads it.
    pub(crate) fn size(&mut self) -> Result<u64, Refusal> {
        let (v, whole) = self.word()?.to_size()?;
        self.odd |= !whole;
        Ok(v)
    }

    /// The next token as `stod` reads it.
    pub(crate) fn real(&mut self) -> Result<f64, Refusal> {
        let (v, whole) = self.word()?.to_double()?;
        self.odd |= !whole;
        Ok(v)
    }

    /// The next token as `True` or `False`.
    pub(crate) fn boolean(&mut self) -> Result<bool, Refusal> {
        self.word()?.to_bool()
    }

    /// The next token without taking it.
    pub(crate) fn peek(&self) -> Option<Token<'a>> {
        self.clone().next()
    }

    /// The next token, which must be there: torch's index check fails
    /// ("Index out of bounds in ConfigTokenizer") when it is not.
    pub(crate) fn value(&mut self) -> Result<Token<'a>, Refusal> {
        self.next()
            .ok_or(("expected a value (the string ends here)", None))
    }

    /// The next token, not taken, which must be there (torch reads it by
    /// index, checked).
    pub(crate) fn value_ahead(&self) -> Result<Token<'a>, Refusal> {
        self.clone().value()
    }

    /// Pass over one token, whatever it is (torch's unchecked `:` or `,`).
    pub(crate) fn pass(&mut self) {
        self.next();
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        let bytes = self.text.as_bytes();
        while self.at < bytes.len() && is_space(bytes[self.at]) {
            self.at += 1;
        }
        let start = self.at;
        let first = *bytes.get(start)?;
        if is_separator(first) {
            self.at += 1;
            return Some(Token {
                text: &self.text[start..start + 1],
                at: start,
            });
        }
        let mut end = start;
        while self.at < bytes.len() && !is_separator(bytes[self.at]) {
            if !is_space(bytes[self.at]) {
                end = self.at + 1;
            }
            self.at += 1;
        }
        Some(Token {
            text: &self.text[start..end],
            at: start,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        Tokens::of(s).count()
    }

    #[test]
    fn tokens_as_torch_splits_them() {
        let t: heapless::Vec<&str, 16> = Tokens::of(" a b:[1 ,>: 2],").map(|t| t.text).collect();
        assert_eq!(
            t.as_slice(),
            ["a b", ":", "[", "1", ",", ">", ":", "2", "]", ","]
        );
        assert!(Tokens::of("expandable _segments")
            .next()
            .unwrap()
            .is("expandable_segments"));
        assert_eq!(words(""), 0);
        assert_eq!(words("  "), 0);
    }

    #[test]
    fn numbers_as_stoull_and_stod_read_them() {
        let size = |s: &str| Tokens::of(s).next().unwrap().to_size().map(|(v, _)| v);
        assert_eq!(size("20MB"), Ok(20));
        assert_eq!(size("1 28"), Ok(128));
        assert_eq!(size("64.5"), Ok(64));
        assert_eq!(size("-1"), Ok(u64::MAX));
        assert_eq!(size("+7"), Ok(7));
        assert!(size("abc").is_err());
        assert!(size("99999999999999999999").is_err());
        assert_eq!(size("18446744073709551615"), Ok(u64::MAX));
        let real = |s: &str| Tokens::of(s).next().unwrap().to_double().map(|(v, _)| v);
        assert_eq!(real("0.5x"), Ok(0.5));
        assert_eq!(real(".5"), Ok(0.5));
        assert_eq!(real("1e-3"), Ok(0.001));
        assert_eq!(real("1e"), Ok(1.0));
        assert!(real("nan").unwrap().is_nan());
        assert!(real("abc").is_err());
        assert!(real(".").is_err());
        assert!(real("1e999").is_err());
        assert!(real("1e-400").is_err());
        assert_eq!(real("0e-400"), Ok(0.0));
    }
}
