//! [`Config`] and the parser of the `PYTORCH_CUDA_ALLOC_CONF` syntax.
//!
//! ```
//! use cachealloc_core::Config;
//! let c = Config::parse("max_split_size_mb:128, garbage_collection_threshold:0.8")?;
//! assert_eq!(c.max_split_size, 128 << 20);
//! assert_eq!(c.garbage_collection_threshold, 0.8);
//! let err = Config::parse("max_split_size_mb:8").unwrap_err();
//! assert_eq!(err.key, "max_split_size_mb");
//! # Ok::<(), cachealloc_core::ConfigError<'static>>(())
//! ```

use crate::policy::{LARGE_BUFFER, ROUNDUP_INTERVALS};
use core::fmt;

const MIB: u64 = 1 << 20;

/// The policy knobs of `PYTORCH_CUDA_ALLOC_CONF`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Blocks of this size or more are "oversize": never split, never handed
    /// to smaller requests. `u64::MAX` (the default) means unlimited.
    pub max_split_size: u64,
    /// How much larger than an oversize request a cached oversize block may be
    /// (`max_non_split_rounding_mb`; 20 MiB, `kLargeBuffer`, by default).
    pub max_non_split_rounding: u64,
    /// Divisions per power-of-two interval, bucket `i` covering
    /// `[2^i, 2^(i+1))` MiB; 0 or 1 is off.
    pub roundup_power2_divisions: [u32; ROUNDUP_INTERVALS],
    /// Fraction of the memory limit above which cached segments are garbage
    /// collected before a new one is created (0 = off; needs a memory fraction).
    pub garbage_collection_threshold: f64,
    /// What `release_lock_on_cudamalloc` asked for. Not in force: a
    /// device's lock is held through its device mallocs (a call's work is
    /// one `&mut` borrow of the allocator), so snapshots report it false
    /// (`AllocatorSettings::release_lock_on_cudamalloc`).
    pub release_lock_on_malloc: bool,
    /// Expandable segments (`expandable_segments:True`): new memory comes
    /// from pages mapped into one large reservation per stream and pool
    /// (needs a backend with virtual memory).
    pub expandable_segments: bool,
    /// Whether the string set `expandable_segments` (PyTorch's settings
    /// parser keeps the previous value when a new string does not).
    pub(crate) expandable_mentioned: bool,
    /// Whether the string set `policy` (a new string that does not keeps the
    /// policy in force, so PyTorch's own settings strings cannot turn it off).
    pub(crate) policy_mentioned: bool,
    /// The placement policy (`policy:pytorch`, the default, or
    /// `policy:compact`; a key of ours, not PyTorch's).
    pub policy: Policy,
}

/// Where new memory comes from and which cached blocks a request may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Policy {
    /// PyTorch's, exactly (with or without expandable segments).
    #[default]
    PyTorch,
    /// Needs little more than the live bytes: every request is served from
    /// one expandable segment per pool kind with 2 MiB pages; before pages
    /// are mapped, free whole pages elsewhere are unmapped; a stream with no
    /// cached block that fits takes one freed on another stream (its stream
    /// waits on an event of the other, on the device). Needs a backend with
    /// virtual memory.
    Compact,
}

impl Policy {
    /// Its name in a config string.
    pub const fn name(self) -> &'static str {
        match self {
            Policy::PyTorch => "pytorch",
            Policy::Compact => "compact",
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::DEFAULT
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string that could not be parsed: the key and
/// value at fault (slices of the input) and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError<'a> {
    /// The option name as written (may be empty).
    pub key: &'a str,
    /// The value as written (may be empty).
    pub value: &'a str,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for ConfigError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "allocator config: option `{}`", self.key)?;
        if !self.value.is_empty() {
            write!(f, " value `{}`", self.value)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl Config {
    /// PyTorch's defaults: unlimited split size, no power-of-two rounding, no GC.
    pub const DEFAULT: Config = Config {
        max_split_size: u64::MAX,
        max_non_split_rounding: LARGE_BUFFER,
        roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
        garbage_collection_threshold: 0.0,
        release_lock_on_malloc: false,
        expandable_segments: false,
        expandable_mentioned: false,
        policy_mentioned: false,
        policy: Policy::PyTorch,
    };

    /// Whether new memory comes from pages mapped into expandable segments
    /// (expandable segments, or the compact policy).
    #[inline]
    pub const fn maps_pages(&self) -> bool {
        self.expandable_segments || matches!(self.policy, Policy::Compact)
    }

    /// Whether the compact policy is in force.
    #[inline]
    pub const fn compact(&self) -> bool {
        matches!(self.policy, Policy::Compact)
    }

    /// Parse a `key:value,key:value` string. Options not mentioned take their
    /// defaults (like PyTorch's `_set_allocator_settings`). Spaces are ignored.
    pub fn parse(text: &str) -> Result<Config, ConfigError<'_>> {
        let mut c = Config::DEFAULT;
        for item in ConfigItems::of(text) {
            let (key, value) = match item.split_once(':') {
                Some((k, v)) => (k.trim(), v.trim()),
                None => {
                    return Err(ConfigError {
                        key: item,
                        value: "",
                        reason: "expected `key:value`",
                    })
                }
            };
            let err = |reason| ConfigError { key, value, reason };
            match key {
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    let mb: u64 = value
                        .parse()
                        .map_err(|_| err("expected a whole number of MiB"))?;
                    if mb <= LARGE_BUFFER / MIB {
                        return Err(err("must be greater than 20 (MiB)"));
                    }
                    let bytes = mb.checked_mul(MIB).ok_or(err("too large"))?;
                    if key == "max_split_size_mb" {
                        c.max_split_size = bytes;
                    } else {
                        c.max_non_split_rounding = bytes;
                    }
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value.parse().map_err(|_| err("expected a number"))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(err("must be between 0 and 1, exclusive"));
                    }
                    c.garbage_collection_threshold = t;
                }
                "roundup_power2_divisions" => {
                    c.roundup_power2_divisions = parse_divisions(value).map_err(err)?;
                }
                "policy" => {
                    c.policy = match value {
                        "pytorch" | "PyTorch" => Policy::PyTorch,
                        "compact" => Policy::Compact,
                        _ => return Err(err("expected pytorch or compact")),
                    };
                    c.policy_mentioned = true;
                }
                "expandable_segments" => {
                    c.expandable_segments = match value {
                        "False" | "false" => false,
                        "True" | "true" => true,
                        _ => return Err(err("expected True or False")),
                    };
                    c.expandable_mentioned = true;
                }
                "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                    c.release_lock_on_malloc = parse_bool(value).map_err(err)?;
                }
                "backend" => {
                    if value != "native" {
                        return Err(err("only the native backend is implemented"));
                    }
                }
                "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                    parse_bool(value).map_err(err)?;
                }
                "pinned_num_register_threads" => {
                    let n: u64 = value.parse().map_err(|_| err("expected a number"))?;
                    if !n.is_power_of_two() || n > 128 {
                        return Err(err("must be a power of two up to 128"));
                    }
                }
                _ => return Err(err("unknown option")),
            }
        }
        Ok(c)
    }

    /// The divisions that apply to a size.
    pub fn divisions_for(&self, size: u64) -> u32 {
        self.roundup_power2_divisions[crate::policy::division_bucket(size)]
    }
}

fn parse_bool(v: &str) -> Result<bool, &'static str> {
    match v {
        "True" | "true" => Ok(true),
        "False" | "false" => Ok(false),
        _ => Err("expected True or False"),
    }
}

/// The `key:value` items of a settings string, in order: split at the
/// commas outside brackets (`roundup_power2_divisions:[256:1,>:4]` is one
/// item), trimmed, empty ones skipped. The one splitter of settings
/// strings: [`Config::parse`] reads them so, and so does every tool that
/// edits a string item by item.
///
/// ```
/// use cachealloc_core::ConfigItems;
/// let items: Vec<&str> =
///     ConfigItems::of(" expandable_segments:True,, roundup_power2_divisions:[256:1,>:4]").collect();
/// assert_eq!(items, ["expandable_segments:True", "roundup_power2_divisions:[256:1,>:4]"]);
/// ```
#[derive(Clone, Debug)]
pub struct ConfigItems<'a> {
    rest: &'a str,
}

impl<'a> ConfigItems<'a> {
    /// The items of `text`.
    pub fn of(text: &'a str) -> Self {
        ConfigItems { rest: text }
    }
}

impl<'a> Iterator for ConfigItems<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        while !self.rest.is_empty() {
            let (item, tail) = split_top_level(self.rest);
            self.rest = tail;
            let item = item.trim();
            if !item.is_empty() {
                return Some(item);
            }
        }
        None
    }
}

/// The next comma-separated item outside brackets, and the rest.
fn split_top_level(s: &str) -> (&str, &str) {
    let mut depth = 0i32;
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth <= 0 => return (&s[..i], &s[i + 1..]),
            _ => {}
        }
    }
    (s, "")
}

fn parse_power_of_two_or_zero(v: &str) -> Result<u32, &'static str> {
    let d: u32 = v
        .trim()
        .parse()
        .map_err(|_| "divisions must be a whole number")?;
    if d != 0 && !d.is_power_of_two() {
        return Err("divisions must be a power of two");
    }
    Ok(d)
}

/// `roundup_power2_divisions`: one power of two for every bucket, or
/// `[k:v,...,>:v]` with PyTorch's fill rules (the first key also fills every
/// lower bucket; `>` fills from the last key's own bucket to the end).
fn parse_divisions(value: &str) -> Result<[u32; ROUNDUP_INTERVALS], &'static str> {
    let mut out = [0u32; ROUNDUP_INTERVALS];
    let Some(body) = value.strip_prefix('[') else {
        let d = parse_power_of_two_or_zero(value)?;
        if d == 0 {
            return Err("divisions must be a power of two");
        }
        return Ok([d; ROUNDUP_INTERVALS]);
    };
    let body = body.strip_suffix(']').ok_or("missing `]`")?;
    let mut first = true;
    let mut last_index = 0usize;
    let mut any = false;
    for item in body.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        any = true;
        let (k, v) = item
            .split_once(':')
            .ok_or("expected `interval:divisions` in the list")?;
        let d = parse_power_of_two_or_zero(v)?;
        let k = k.trim();
        if k == ">" {
            for slot in out.iter_mut().skip(last_index) {
                *slot = d;
            }
        } else {
            let mb: u64 = k
                .parse()
                .map_err(|_| "interval must be a power-of-two number of MiB or `>`")?;
            if !mb.is_power_of_two() {
                return Err("interval must be a power of two (MiB)");
            }
            let index = (63 - mb.leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
            if first {
                for slot in out.iter_mut().take(index) {
                    *slot = d;
                }
                first = false;
            }
            out[index] = d;
            last_index = index;
        }
    }
    if !any {
        return Err("empty list");
    }
    Ok(out)
}

/// Writes the canonical string of the options that differ from the default;
/// [`Config::parse`] of it gives the same `Config` back.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if self.max_split_size != u64::MAX {
            write!(f, "{sep}max_split_size_mb:{}", self.max_split_size / MIB)?;
            sep = ",";
        }
        if self.max_non_split_rounding != LARGE_BUFFER {
            write!(
                f,
                "{sep}max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            )?;
            sep = ",";
        }
        if self.roundup_power2_divisions != [0; ROUNDUP_INTERVALS] {
            write!(f, "{sep}roundup_power2_divisions:[")?;
            for (i, d) in self.roundup_power2_divisions.iter().enumerate() {
                write!(f, "{}{}:{}", if i == 0 { "" } else { "," }, 1u64 << i, d)?;
            }
            write!(f, "]")?;
            sep = ",";
        }
        if self.garbage_collection_threshold != 0.0 {
            write!(
                f,
                "{sep}garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            )?;
            sep = ",";
        }
        if self.release_lock_on_malloc {
            write!(f, "{sep}release_lock_on_cudamalloc:True")?;
            sep = ",";
        }
        if self.expandable_mentioned {
            let v = if self.expandable_segments {
                "True"
            } else {
                "False"
            };
            write!(f, "{sep}expandable_segments:{v}")?;
            sep = ",";
        }
        if self.policy_mentioned || self.policy != Policy::PyTorch {
            write!(f, "{sep}policy:{}", self.policy.name())?;
        }
        Ok(())
    }
}

impl core::error::Error for ConfigError<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn bracket_fill_rules() {
        let c =
            Config::parse("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]").unwrap();
        assert_eq!(
            c.roundup_power2_divisions,
            [8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1]
        );
        let q = Config::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(q.roundup_power2_divisions[10], 8);
    }

    #[test]
    fn errors_name_the_key() {
        for (s, key) in [
            ("max_split_size_mb:20", "max_split_size_mb"),
            (
                "garbage_collection_threshold:1.0",
                "garbage_collection_threshold",
            ),
            ("roundup_power2_divisions:3", "roundup_power2_divisions"),
            ("nonsense:1", "nonsense"),
            ("expandable_segments:Yes", "expandable_segments"),
            ("policy:tight", "policy"),
            ("max_split_size_mb", "max_split_size_mb"),
        ] {
            assert_eq!(Config::parse(s).unwrap_err().key, key, "{s}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "",
            "max_split_size_mb:40",
            "roundup_power2_divisions:4,garbage_collection_threshold:0.625",
            "roundup_power2_divisions:[64:8,>:2],max_split_size_mb:128,release_lock_on_cudamalloc:True",
            "expandable_segments:True,max_split_size_mb:40",
            "expandable_segments:False",
            "policy:compact,max_split_size_mb:64",
        ] {
            let c = Config::parse(s).unwrap();
            let text = format!("{c}");
            assert_eq!(Config::parse(&text).unwrap(), c, "{s} -> {text}");
        }
    }
}
