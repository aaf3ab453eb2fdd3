//! Byte counts as people write them (`--capacity 16GiB`,
//! `CACHEALLOC_MOCK_CAPACITY=4GiB`).

/// Parse a byte count: a plain integer, or with a unit (`512MiB`, `16GiB`,
/// `2G`, `100MB`; binary multiples either way, as GPU memory is quoted).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid byte count {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("invalid unit in byte count {s:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("byte count {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn units() {
        assert_eq!(parse_bytes("16GiB"), Ok(16 << 30));
        assert_eq!(parse_bytes("2 G"), Ok(2 << 30));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999TiB").is_err());
    }
}
