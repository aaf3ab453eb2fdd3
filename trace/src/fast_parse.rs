//! The fast path of event parsing: the lines almost every trace is made of
//! (`alloc`, `free`, `record_stream`, `sync`, `empty_cache`: a flat JSON
//! object of integers, plain strings and the like) read by hand, several
//! times faster than serde. Anything else (escapes, nested values, a
//! repeated or malformed field, any JSON this reader is not sure of) is
//! left to serde (`parse.rs`), which gives the same event or the error with
//! its reason: this path only ever answers what serde would.

use crate::event::Event;

/// The event of `line` if it is one of the plain shapes, else `None`.
pub(crate) fn plain_event(line: &[u8]) -> Option<Event> {
    let mut p = Cursor { s: line, i: 0 };
    p.ws();
    p.eat(b'{')?;
    let mut op: Option<&[u8]> = None;
    let (mut id, mut size, mut stream, mut device) = (None, None, None, None);
    p.ws();
    if p.peek() != Some(b'}') {
        loop {
            p.ws();
            let key = p.string()?;
            p.ws();
            p.eat(b':')?;
            p.ws();
            // A field serde reads twice is its error: leave it to serde.
            match key {
                b"op" => set(&mut op, p.string()?)?,
                b"id" => set(&mut id, p.integer()?)?,
                b"size" => set(&mut size, p.integer()?)?,
                b"stream" => set(&mut stream, p.integer()?)?,
                b"device" => set(&mut device, p.integer()?)?,
                // Fields the ops read from lists or objects, and keys that
                // need escapes: serde's.
                b"pool" | b"streams" | b"use_on_oom" | b"no_split" => return None,
                _ => p.scalar()?,
            }
            p.ws();
            match p.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    } else {
        p.i += 1;
    }
    p.ws();
    if p.i != line.len() {
        return None;
    }
    Some(match op? {
        b"alloc" => Event::Alloc {
            id: id?,
            size: size?,
            stream: stream.unwrap_or(0),
            device: device.unwrap_or(0),
        },
        b"free" => Event::Free { id: id? },
        b"record_stream" => Event::RecordStream {
            id: id?,
            stream: stream?,
        },
        b"sync" => Event::Sync { stream },
        b"empty_cache" => Event::EmptyCache,
        _ => return None,
    })
}

/// `slot` set to `v` unless it was set already.
fn set<T>(slot: &mut Option<T>, v: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(v);
    Some(())
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.i += 1;
        Some(b)
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }

    /// JSON's whitespace.
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// A string without escapes or control characters, its bytes (valid
    /// UTF-8 checked: serde refuses a line that is not).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match self.next()? {
                b'"' => break,
                b'\\' => return None,
                c if c < 0x20 => return None,
                _ => {}
            }
        }
        let bytes = &self.s[start..self.i - 1];
        core::str::from_utf8(bytes).ok()?;
        Some(bytes)
    }

    /// A non-negative JSON integer (no sign, fraction or exponent; no
    /// leading zero) that fits 64 bits.
    fn integer(&mut self) -> Option<u64> {
        let start = self.i;
        let mut v: u64 = 0;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0 || (digits > 1 && self.s[start] == b'0') {
            return None;
        }
        // A fraction or an exponent makes it not an integer: serde says so.
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some(v)
    }

    /// Any JSON number, a plain string, `true`, `false` or `null`, skipped.
    fn scalar(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn word(&mut self, w: &[u8]) -> Option<()> {
        if self.s.get(self.i..self.i + w.len())? == w {
            self.i += w.len();
            Some(())
        } else {
            None
        }
    }

    /// JSON's number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let digits = |c: &mut Self| {
            let start = c.i;
            while matches!(c.peek(), Some(b'0'..=b'9')) {
                c.i += 1;
            }
            c.i - start
        };
        let start = self.i;
        let n = digits(self);
        if n == 0 || (n > 1 && self.s[start] == b'0') {
            return None;
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if digits(self) == 0 {
                return None;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return None;
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_event_serde;

    /// Every line the fast path answers, it answers as serde does; the
    /// lines it leaves are serde's.
    #[test]
    fn the_fast_path_answers_what_serde_answers() {
        let lines: &[&str] = &[
            r#"{"op":"alloc","id":0,"size":154389504,"stream":0,"t":0.0}"#,
            r#"{"op":"free","id":7,"t":12.5}"#,
            r#" { "op" : "alloc" , "id" : 3 , "size" : 512 , "device" : 1 } "#,
            r#"{"op":"record_stream","id":3,"stream":9}"#,
            r#"{"op":"sync"}"#,
            r#"{"op":"sync","stream":2}"#,
            r#"{"op":"empty_cache","t":1e3}"#,
            r#"{"t":-0.5e-3,"op":"free","id":1,"note":"x","flag":true,"n":null}"#,
            r#"{"op":"alloc","id":1,"size":1.0}"#,
            r#"{"op":"alloc","id":1,"size":-1}"#,
            r#"{"op":"alloc","id":01,"size":1}"#,
            r#"{"op":"alloc","id":1}"#,
            r#"{"op":"free","id":1,"id":2}"#,
            r#"{"op":"free","id":1,}"#,
            r#"{"op":"free","id":1}x"#,
            r#"{"op":"fre\u0065","id":1}"#,
            r#"{"op":"free","id":18446744073709551616}"#,
            r#"{"op":"free","id":18446744073709551615}"#,
            r#"{"op":"pool_end","pool":[1,2]}"#,
            r#"{"op":"warp","id":1}"#,
            r#"{"op":"free","id":1,"t":.5}"#,
            r#"{"op":"free","id":1,"t":1e400}"#,
            r#"{"op":"free","id":1,"t":1.}"#,
            r#"{"op":"free","id":1,"x":[1]}"#,
            r#"{}"#,
            r#"{"op":"free" "id":1}"#,
            r#"[1]"#,
            "",
        ];
        for line in lines {
            let serde = parse_event_serde(line.as_bytes());
            if let Some(e) = plain_event(line.as_bytes()) {
                assert_eq!(Ok(e), serde, "{line}");
            }
        }
        // The common lines take the fast path.
        for line in &lines[..8] {
            assert!(plain_event(line.as_bytes()).is_some(), "{line}");
        }
    }

    /// Every event line of the bundled traces: the fast path takes it and
    /// answers what serde answers.
    #[test]
    fn the_bundled_traces_take_the_fast_path() {
        use std::io::BufRead;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/traces");
        let mut lines = 0;
        for entry in std::fs::read_dir(&dir).expect("the bundled traces") {
            let path = entry.expect("an entry").path();
            if !path.to_string_lossy().ends_with(".jsonl.gz") {
                continue;
            }
            let file = std::fs::File::open(&path).expect("open");
            let r = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
            for line in r.lines().skip(1) {
                let line = line.expect("a line");
                let fast = plain_event(line.as_bytes());
                assert!(fast.is_some(), "{}: {line}", path.display());
                assert_eq!(
                    fast.map(Ok),
                    Some(parse_event_serde(line.as_bytes())),
                    "{line}"
                );
                lines += 1;
            }
        }
        assert!(lines > 100_000, "{lines} lines");
    }
}
