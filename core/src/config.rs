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
use crate::torch_version::{BlockOrder, TorchVersion};
use core::fmt;

pub mod keys;
mod tokens;
use keys::{Later, Walk, KEYS};
use tokens::Tokens;

const MIB: u64 = 1 << 20;

/// The settings of `PYTORCH_CUDA_ALLOC_CONF` (every key of torch 2.15's
/// parser, and `policy`, ours), and the torch release whose decisions the
/// allocator takes ([`Config::torch_version`]).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Blocks of this size or more are "oversize": never split, never handed
    /// to smaller requests. `u64::MAX` (the default) means unlimited.
    pub max_split_size: u64,
    /// How much larger than an oversize request a cached oversize block may be
    /// (`max_non_split_rounding_mb`; `large_segment_size` by default).
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
    /// The segment size of the large pool for requests of 1 to 10 MiB
    /// (`large_segment_size_mb`; 20 MiB, `kLargeBuffer`, by default). It is
    /// also the default of `max_non_split_rounding` and the least
    /// `max_split_size`.
    pub large_segment_size: u64,
    /// `per_process_memory_fraction` (1.0 by default): the memory fraction
    /// a new allocator starts with (applied at its first segment, or by
    /// [`crate::DeviceAllocator::apply_configured_fraction`]), and the
    /// limit of the rejection policy.
    pub per_process_memory_fraction: f64,
    /// `throw_on_cudamalloc_oom` (torch 2.12 on): a request whose new
    /// segment would take the reserved bytes over
    /// `per_process_memory_fraction` of the device is refused before any
    /// device call, without the release-and-retry rungs
    /// (`num_oom_rejections`, the rejection observers).
    pub throw_on_cudamalloc_oom: bool,
    /// `graph_capture_record_stream_reuse`: a block freed during a capture
    /// after other streams used it may be handed out again within the
    /// capture once the capture graph shows all later work on its stream
    /// runs after those uses (PyTorch's `free_safe_blocks_in_capture`);
    /// without it such a block waits for the capture's end. Needs a backend
    /// that reads capture graphs ([`crate::DeviceBackend::CAPTURE_GRAPH`]).
    pub graph_capture_record_stream_reuse: bool,
    /// Settings of torch's that cachealloc validates, keeps and reports but
    /// that change nothing here (the pinned host allocator's).
    pub host: HostSettings,
    /// The torch release whose decisions are taken (not a key of the
    /// string: [`Config::with_torch_version`]).
    pub(crate) torch: TorchVersion,
    /// Its block order (kept beside it: read on every split).
    pub(crate) order: BlockOrder,
    /// The keys of [`keys::KEYS`] the string set, bit `i` for key `i`
    /// (only those a later string keeps: it keeps what it leaves out of
    /// them, as PyTorch's parser does).
    pub(crate) mentioned: u32,
    /// The placement policy (`policy:pytorch`, the default, or
    /// `policy:compact`; a key of ours, not PyTorch's).
    pub policy: Policy,
}

/// torch's settings of the pinned host allocator: validated with torch's
/// rules, kept, shown in snapshots; cachealloc has no host allocator, so
/// they have no effect. (torch 2.15's `expandable_segments_reserve` and
/// `_by_class`, the address space reserved for expandable segments, are
/// accepted as torch accepts them, a bad value included, and not kept:
/// cachealloc reserves as before; the settings string shows them.)
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[non_exhaustive]
pub struct HostSettings {
    /// `pinned_use_cuda_host_register` (or `_hip_`).
    pub pinned_use_host_register: bool,
    /// `pinned_num_register_threads` (1 by default).
    pub pinned_num_register_threads: u32,
    /// `pinned_use_background_threads`.
    pub pinned_use_background_threads: bool,
    /// `pinned_reserve_segment_size_mb` (0: unset).
    pub pinned_reserve_segment_size_mb: u64,
    /// `pinned_free_catch_all` (torch 2.12 on).
    pub pinned_free_catch_all: bool,
    /// `pinned_max_round_threshold_mb` (torch 2.13 on; 0: unset).
    pub pinned_max_round_threshold_mb: u64,
    /// `pinned_max_cached_size_mb` (torch 2.13 on; 0: unset).
    pub pinned_max_cached_size_mb: u64,
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
    /// The bound the reason ends with, when it has one ("must be >= 20").
    pub limit: Option<u64>,
    /// For an unknown key, the known key it is most likely a misspelling
    /// of ([`suggest_key`]).
    pub suggestion: Option<&'static str>,
}

impl fmt::Display for ConfigError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "allocator config: option `{}`", self.key)?;
        if !self.value.is_empty() {
            write!(f, " value `{}`", self.value)?;
        }
        write!(f, ": {}", self.reason)?;
        if let Some(limit) = self.limit {
            write!(f, "{limit}")?;
        }
        if let Some(key) = self.suggestion {
            write!(f, "; did you mean `{key}`?")?;
        }
        Ok(())
    }
}

impl Config {
    /// PyTorch's defaults: unlimited split size, no power-of-two rounding,
    /// no GC, and the decisions of the newest torch release known.
    pub const DEFAULT: Config = Config {
        max_split_size: u64::MAX,
        max_non_split_rounding: LARGE_BUFFER,
        roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
        garbage_collection_threshold: 0.0,
        release_lock_on_malloc: false,
        expandable_segments: false,
        large_segment_size: LARGE_BUFFER,
        per_process_memory_fraction: 1.0,
        throw_on_cudamalloc_oom: false,
        graph_capture_record_stream_reuse: false,
        host: HostSettings {
            pinned_use_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            pinned_free_catch_all: false,
            pinned_max_round_threshold_mb: 0,
            pinned_max_cached_size_mb: 0,
        },
        torch: TorchVersion::NEWEST,
        order: BlockOrder::SizeCounterAddress,
        mentioned: 0,
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

    /// The torch release whose decisions are taken.
    pub const fn torch_version(&self) -> TorchVersion {
        self.torch
    }

    /// The same settings with torch `version`'s decisions.
    pub fn with_torch_version(mut self, version: TorchVersion) -> Config {
        self.torch = version;
        self.order = version.block_order();
        self
    }

    /// How pools order their cached blocks (from the torch version).
    #[inline]
    pub const fn block_order(&self) -> BlockOrder {
        self.order
    }

    /// Parse a `key:value,key:value` string as torch's newest release known
    /// does ([`Config::parse_for`]).
    pub fn parse(text: &str) -> Result<Config, ConfigError<'_>> {
        Config::parse_for(text, TorchVersion::NEWEST)
    }

    /// Parse a settings string as torch `version`'s parser does
    /// (`tokens.rs`): its keys, its value rules, its reasons (keys added by
    /// a later release are refused, naming the release). Options not
    /// mentioned take their defaults (like PyTorch's
    /// `_set_allocator_settings`). Whitespace is dropped anywhere; `True`
    /// and `False` are spelt so; numbers are read as C's `stoull` / `stod`
    /// read them (`20MB` is 20: [`Config::parse_noting`] says where).
    pub fn parse_for(text: &str, version: TorchVersion) -> Result<Config, ConfigError<'_>> {
        Config::parse_noting(text, version, &mut |_| {})
    }

    /// [`Config::parse_for`], telling `note` of each value read as only
    /// torch reads it (a number's prefix, whitespace inside a word), for a
    /// front end to warn once.
    pub fn parse_noting<'a>(
        text: &'a str,
        version: TorchVersion,
        note: &mut dyn FnMut(Oddity<'a>),
    ) -> Result<Config, ConfigError<'a>> {
        Config::parse_from(Config::DEFAULT.with_torch_version(version), text, note)
    }

    /// A later settings string (torch's `_set_allocator_settings`) as torch
    /// reads it after this one: its split sizes checked against the large
    /// segment size in force. What it leaves out is this one's business:
    /// [`followed_by`](Self::followed_by) (or
    /// [`DeviceAllocator::set_config`](crate::DeviceAllocator::set_config))
    /// of the result. `note` is told of odd values as by
    /// [`parse_noting`](Self::parse_noting).
    pub fn parse_later<'a>(
        &self,
        text: &'a str,
        note: &mut dyn FnMut(Oddity<'a>),
    ) -> Result<Config, ConfigError<'a>> {
        let mut start = Config::DEFAULT.with_torch_version(self.torch);
        start.large_segment_size = self.large_segment_size;
        start.max_non_split_rounding = self.large_segment_size;
        Config::parse_from(start, text, note)
    }

    /// Parse `text` into `c` (its torch version's keys and rules).
    fn parse_from<'a>(
        mut c: Config,
        text: &'a str,
        note: &mut dyn FnMut(Oddity<'a>),
    ) -> Result<Config, ConfigError<'a>> {
        let version = c.torch;
        // torch reads `large_segment_size_mb` first (the bound of both
        // split sizes and the default of the rounding), then each of its
        // two parsers reads the whole string, passing over the other's
        // keys.
        for pass in [Pass::First, Pass::Accelerator, Pass::Device] {
            walk(&mut c, text, version, pass, note)?;
        }
        Ok(c)
    }

    /// Whether any interval rounds to divisions (`roundup_power2_divisions`
    /// above 1 somewhere).
    #[inline]
    pub const fn rounds_to_divisions(&self) -> bool {
        let mut k = 0;
        while k < ROUNDUP_INTERVALS {
            if self.roundup_power2_divisions[k] > 1 {
                return true;
            }
            k += 1;
        }
        false
    }

    /// The divisions that apply to a size.
    pub fn divisions_for(&self, size: u64) -> u32 {
        self.roundup_power2_divisions[crate::policy::division_bucket(size)]
    }

    /// What a new settings string leaves in force of this one, as PyTorch's
    /// parser does: each key the string leaves out is as the settings
    /// table says ([`keys::Later`]): kept, reset to its default, or (for
    /// `max_non_split_rounding_mb`) the large segment size in force. The
    /// torch version stays.
    pub fn followed_by(&self, mut next: Config) -> Config {
        for (i, k) in KEYS.iter().enumerate() {
            if k.later != Later::Reset && next.mentioned & (1 << i) == 0 {
                (k.carry)(self, &mut next);
                next.mentioned |= self.mentioned & (1 << i);
            }
        }
        next.with_torch_version(self.torch)
    }

    /// The defaults as this configuration's keys read them (the rounding
    /// of oversize blocks follows its large segment size).
    fn defaults(&self) -> Config {
        Config {
            max_non_split_rounding: self.large_segment_size,
            ..Config::DEFAULT
        }
    }
}

/// A value torch reads in its own way, which cachealloc reads the same
/// ([`Config::parse_noting`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Oddity<'a> {
    /// The key as written.
    pub key: &'a str,
    /// Its value as written.
    pub value: &'a str,
}

impl fmt::Display for Oddity<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}:{}` is read as torch reads it (a number's leading digits, whitespace dropped)",
            self.key, self.value
        )
    }
}

/// One of the reads of a settings string.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The keys read before the others.
    First,
    /// The keys of torch's `AcceleratorAllocatorConfig`.
    Accelerator,
    /// The keys of torch's `CUDAAllocatorConfig`.
    Device,
}

/// One read of `text` as torch's parsers walk it: each key, one token
/// passed over (the `:`), its value, one token passed over (the `,`).
/// The keys of this pass are set in `c`, the others passed over as torch
/// passes over a key it leaves to its other parser.
fn walk<'a>(
    c: &mut Config,
    text: &'a str,
    version: TorchVersion,
    pass: Pass,
    note: &mut dyn FnMut(Oddity<'a>),
) -> Result<(), ConfigError<'a>> {
    let mut t = Tokens::of(text);
    while let Some(key) = t.next() {
        let err = |value, (reason, limit): keys::Refusal| ConfigError {
            key: key.text,
            value,
            reason,
            limit,
            suggestion: None,
        };
        let found = keys::find(&key).filter(|(_, k)| version.decisions_of() >= k.since);
        // The first read only looks for its keys: what is wrong elsewhere
        // is for the full reads to say.
        let skip = |t: &mut Tokens<'a>| match skip_value(t) {
            Err(_) if pass == Pass::First => Ok(false),
            Err(r) => Err(err("", r)),
            Ok(()) => Ok(true),
        };
        let Some((i, k)) = found else {
            if pass != Pass::Accelerator {
                if !skip(&mut t)? {
                    return Ok(());
                }
                t.pass();
                continue;
            }
            let reason = match keys::find(&key) {
                Some((_, k)) => added_later(k.since),
                None => UNKNOWN_KEY,
            };
            let suggestion = match keys::find(&key) {
                Some(_) => None,
                None => suggest_key(key.text, version),
            };
            let mut rest = t.clone();
            rest.pass();
            let value = rest.next().map_or("", |v| v.text);
            return Err(ConfigError {
                suggestion,
                ..err(value, (reason, None))
            });
        };
        let ours = match pass {
            Pass::First => k.first,
            Pass::Accelerator => k.walk == Walk::Accelerator && !k.first,
            Pass::Device => k.walk == Walk::Device,
        };
        if !ours {
            if !skip(&mut t)? {
                return Ok(());
            }
            t.pass();
            continue;
        }
        t.pass(); // `:`
        let at = t.offset();
        t.odd = key.text.bytes().any(|b| b.is_ascii_whitespace());
        (k.parse)(c, &mut t).map_err(|r| err(t.since(at), r))?;
        if t.odd {
            note(Oddity {
                key: key.text,
                value: t.since(at),
            });
        }
        // Remembered for a later string (a key with nothing kept, such as
        // `backend`, has nothing to remember).
        if k.later != Later::Reset && (k.value)(c).is_some() {
            c.mentioned |= 1 << i;
        }
        t.pass(); // `,`
    }
    Ok(())
}

/// Pass over a key's `:` and value as torch's `skipKey` does: one token,
/// or a list to its `]`.
fn skip_value(t: &mut Tokens<'_>) -> Result<(), keys::Refusal> {
    t.pass();
    if t.value()?.is("[") {
        while !t.value()?.is("]") {}
    }
    Ok(())
}

/// The reason for a key torch does not have.
pub const UNKNOWN_KEY: &str = "unknown option (not a key of torch's allocator config)";

/// Keys longer than this get no suggestion (the longest known has 36
/// bytes): the edit distance works in rows of this many on the stack.
const MAX_SUGGESTED_LEN: usize = 48;

/// The edit distance of `a` and `b` (insertions, deletions, substitutions
/// and swaps of neighbours, each 1; ASCII case ignored), or `None` when
/// either is longer than [`MAX_SUGGESTED_LEN`]. No heap: three rows on
/// the stack.
fn edit_distance(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() > MAX_SUGGESTED_LEN || b.len() > MAX_SUGGESTED_LEN {
        return None;
    }
    let eq = |x: u8, y: u8| x.eq_ignore_ascii_case(&y);
    // Rows i-2, i-1 and i of the table, at i % 3.
    let mut rows = [[0usize; MAX_SUGGESTED_LEN + 1]; 3];
    for (j, d) in rows[0].iter_mut().enumerate().take(b.len() + 1) {
        *d = j;
    }
    for i in 1..=a.len() {
        let (cur, prev, prev2) = (i % 3, (i + 2) % 3, (i + 1) % 3);
        rows[cur][0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(!eq(a[i - 1], b[j - 1]));
            let mut d = (rows[prev][j] + 1)
                .min(rows[cur][j - 1] + 1)
                .min(rows[prev][j - 1] + cost);
            if i > 1 && j > 1 && eq(a[i - 1], b[j - 2]) && eq(a[i - 2], b[j - 1]) {
                d = d.min(rows[prev2][j - 2] + 1);
            }
            rows[cur][j] = d;
        }
    }
    Some(rows[a.len() % 3][b.len()])
}

/// Whether `s` starts with `prefix`, ASCII case ignored.
fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// The known key (of torch `version`) that `key`, which is not one, is
/// most likely a misspelling of: the nearest within 2 edits, or one per 8
/// letters for long keys (fewer edits than the key has letters), else the shortest key that starts with it (of 4
/// letters or more), else the longest key it starts with. `None` when no
/// key is near. Computed without the heap.
///
/// ```
/// use cachealloc_core::{config::suggest_key, TorchVersion};
/// assert_eq!(suggest_key("expandable_segment", TorchVersion::NEWEST), Some("expandable_segments"));
/// assert_eq!(suggest_key("max_split_size", TorchVersion::NEWEST), Some("max_split_size_mb"));
/// assert_eq!(suggest_key("colour", TorchVersion::NEWEST), None);
/// ```
pub fn suggest_key(key: &str, version: TorchVersion) -> Option<&'static str> {
    let candidates = || keys::names_of(version);
    let mut best: Option<(usize, &'static str)> = None;
    for k in candidates() {
        if let Some(d) = edit_distance(key.as_bytes(), k.as_bytes()) {
            if d <= (key.len() / 8).max(2) && d < key.len() && best.is_none_or(|(b, _)| d < b) {
                best = Some((d, k));
            }
        }
    }
    if let Some((_, k)) = best {
        return Some(k);
    }
    if key.len() >= 4 {
        let longer = candidates()
            .filter(|k| starts_with_ignore_case(k, key))
            .min_by_key(|k| k.len());
        if longer.is_some() {
            return longer;
        }
    }
    candidates()
        .filter(|k| k.len() >= 4 && starts_with_ignore_case(key, k))
        .max_by_key(|k| k.len())
}

/// The reason for a key of a later release.
fn added_later(since: TorchVersion) -> &'static str {
    match since.minor() {
        12 => "not a key of this torch's allocator config (torch 2.12 added it; --torch-version selects the release)",
        13 => "not a key of this torch's allocator config (torch 2.13 added it; --torch-version selects the release)",
        _ => "not a key of this torch's allocator config (torch 2.15 added it; --torch-version selects the release)",
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

/// Writes the canonical string: the keys that differ from their default
/// or that the string set (those a later string would keep), in the
/// settings table's order; [`Config::parse`] of it gives the same `Config`
/// back (the torch version aside: it is not a key).
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let defaults = self.defaults();
        let mut sep = "";
        for (i, k) in KEYS.iter().enumerate() {
            let Some(value) = (k.value)(self) else {
                continue;
            };
            if self.mentioned & (1 << i) != 0 || Some(value) != (k.value)(&defaults) {
                write!(f, "{sep}{}:{value}", k.names[0])?;
                sep = ",";
            }
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
        // torch's rule: `>` fills the buckets after the last entry's, a
        // list that starts with `>` leaves bucket 0 alone, and buckets
        // between entries keep their 0 (torch 2.11 to 2.15).
        let q = Config::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(
            q.roundup_power2_divisions,
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8]
        );
        let gaps = Config::parse("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]").unwrap();
        assert_eq!(
            gaps.roundup_power2_divisions,
            [8, 8, 8, 8, 8, 8, 8, 0, 4, 0, 4, 1, 1, 1, 1, 1]
        );
        let tail = Config::parse("roundup_power2_divisions:[>:2]").unwrap();
        assert_eq!(tail.roundup_power2_divisions[..2], [0, 2]);
    }

    #[test]
    fn errors_name_the_key() {
        for (s, key) in [
            ("max_split_size_mb:19", "max_split_size_mb"),
            ("expandable_segments:true", "expandable_segments"),
            ("throw_on_cudamalloc_oom:maybe", "throw_on_cudamalloc_oom"),
            (
                "per_process_memory_fraction:1.5",
                "per_process_memory_fraction",
            ),
            ("large_segment_size_mb:10", "large_segment_size_mb"),
            (
                "large_segment_size_mb:64,max_split_size_mb:40",
                "max_split_size_mb",
            ),
            (
                "pinned_num_register_threads:3",
                "pinned_num_register_threads",
            ),
            (
                "pinned_num_register_threads:256",
                "pinned_num_register_threads",
            ),
            (
                "pinned_reserve_segment_size_mb:0",
                "pinned_reserve_segment_size_mb",
            ),
            (
                "graph_capture_record_stream_reuse:true",
                "graph_capture_record_stream_reuse",
            ),
            ("backend:cudaMallocAsync", "backend"),
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

    /// Every key of torch 2.15's parser, with a valid value.
    const TORCH_2_15_KEYS: &str = "max_split_size_mb:64,max_non_split_rounding_mb:32,\
        garbage_collection_threshold:0.6,roundup_power2_divisions:[256:1,>:4],\
        expandable_segments:True,large_segment_size_mb:12,release_lock_on_cudamalloc:False,\
        release_lock_on_hipmalloc:False,backend:native,pinned_use_cuda_host_register:True,\
        pinned_use_hip_host_register:False,pinned_num_register_threads:8,\
        pinned_use_background_threads:True,pinned_reserve_segment_size_mb:16,\
        pinned_free_catch_all:True,pinned_max_round_threshold_mb:4,pinned_max_cached_size_mb:64,\
        per_process_memory_fraction:0.4,throw_on_cudamalloc_oom:True,\
        graph_capture_record_stream_reuse:False,expandable_segments_reserve:0.5,\
        expandable_segments_reserve_by_class:[decode:40G,prefill:0.25]";

    #[test]
    fn every_key_of_torch_2_15() {
        let c = Config::parse(TORCH_2_15_KEYS).unwrap();
        assert_eq!(c.large_segment_size, 12 << 20);
        assert_eq!(c.max_non_split_rounding, 32 << 20);
        assert_eq!(c.per_process_memory_fraction, 0.4);
        assert!(c.throw_on_cudamalloc_oom && c.expandable_segments);
        assert!(c.host.pinned_free_catch_all);
        // The large segment size sets the default of max_non_split_rounding
        // and the least split sizes, wherever it stands in the string.
        let c = Config::parse("max_split_size_mb:12,large_segment_size_mb:12").unwrap();
        assert_eq!(
            (c.max_split_size, c.max_non_split_rounding),
            (12 << 20, 12 << 20)
        );
        // torch takes 20 MiB, its default large segment, as a split size.
        assert_eq!(
            Config::parse("max_split_size_mb:20")
                .unwrap()
                .max_split_size,
            20 << 20
        );
    }

    #[test]
    fn keys_of_later_releases_are_refused_by_earlier_ones() {
        for (s, ok_from) in [
            ("throw_on_cudamalloc_oom:True", TorchVersion::V2_12),
            ("pinned_free_catch_all:True", TorchVersion::V2_12),
            ("pinned_max_cached_size_mb:64", TorchVersion::V2_13),
            ("expandable_segments_reserve:0.5", TorchVersion::V2_15),
            ("large_segment_size_mb:12", TorchVersion::V2_11),
        ] {
            for v in TorchVersion::KNOWN {
                let r = Config::parse_for(s, v);
                assert_eq!(r.is_ok(), v >= ok_from, "{s} under torch {v}");
                if let Err(e) = r {
                    assert!(format!("{e}").contains("added it"), "{e}");
                }
            }
        }
    }

    #[test]
    fn reasons_are_torchs() {
        let msg = |s| format!("{}", Config::parse(s).unwrap_err());
        assert_eq!(
            msg("per_process_memory_fraction:1.5"),
            "allocator config: option `per_process_memory_fraction` value `1.5`: per_process_memory_fraction is invalid, set it in [0.0, 1.0]"
        );
        assert!(msg("max_split_size_mb:19").ends_with("max_split_size_mb too small, must be >= 20"));
        assert!(msg("large_segment_size_mb:64,max_split_size_mb:40").ends_with("must be >= 64"));
        assert!(msg("large_segment_size_mb:10").ends_with("large_segment_size_mb must be > 10"));
        assert!(msg("throw_on_cudamalloc_oom:maybe").contains("Expected 'True' or 'False'"));
        let reuse = Config::parse("graph_capture_record_stream_reuse:True").unwrap();
        assert!(reuse.graph_capture_record_stream_reuse);
        let later = reuse.followed_by(Config::parse("max_split_size_mb:40").unwrap());
        assert!(
            later.graph_capture_record_stream_reuse,
            "a later string keeps it"
        );
        assert_eq!(format!("{reuse}"), "graph_capture_record_stream_reuse:True");
    }

    #[test]
    fn a_later_string_keeps_what_torch_keeps() {
        let first = Config::parse(
            "expandable_segments:True,large_segment_size_mb:64,max_split_size_mb:128,\
             per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True",
        )
        .unwrap()
        .with_torch_version(TorchVersion::V2_12);
        let next = first.followed_by(Config::parse("garbage_collection_threshold:0.5").unwrap());
        assert!(next.expandable_segments && next.throw_on_cudamalloc_oom);
        assert_eq!(next.large_segment_size, 64 << 20);
        assert_eq!(next.max_non_split_rounding, 64 << 20);
        assert_eq!(next.per_process_memory_fraction, 0.5);
        assert_eq!(next.max_split_size, u64::MAX);
        assert_eq!(next.torch_version(), TorchVersion::V2_12);
        assert_eq!(next.block_order(), crate::BlockOrder::RegistrationCounter);
    }

    /// A later string keeps what torch keeps: `release_lock_on_cudamalloc`
    /// and the pinned allocator's keys among them (torch's CUDA parser
    /// never resets them), and the table says so for each.
    #[test]
    fn a_later_string_keeps_the_lock_and_pinned_keys() {
        let first = Config::parse(
            "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,\
             pinned_num_register_threads:8,pinned_use_background_threads:True,\
             pinned_reserve_segment_size_mb:16,pinned_free_catch_all:True,\
             pinned_max_round_threshold_mb:4,pinned_max_cached_size_mb:64,max_split_size_mb:40",
        )
        .unwrap();
        let next = first.followed_by(Config::parse("garbage_collection_threshold:0.5").unwrap());
        assert!(next.release_lock_on_malloc);
        assert_eq!(next.host, first.host);
        assert_eq!(next.max_split_size, u64::MAX, "reset, as torch does");
        // A key the later string sets is the later string's.
        let off = first.followed_by(Config::parse("pinned_num_register_threads:1").unwrap());
        assert_eq!(off.host.pinned_num_register_threads, 1);
        assert!(off.host.pinned_use_host_register);
        assert_eq!(
            format!("{off}"),
            "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,\
             pinned_num_register_threads:1,pinned_use_background_threads:True,\
             pinned_reserve_segment_size_mb:16,pinned_free_catch_all:True,\
             pinned_max_round_threshold_mb:4,pinned_max_cached_size_mb:64"
        );
        for k in KEYS {
            let kept =
                k.names[0] == "release_lock_on_cudamalloc" || k.names[0].starts_with("pinned_");
            if kept {
                assert_eq!(k.later, Later::Keep, "{}", k.names[0]);
            }
        }
    }

    /// The key table of `docs/torch-versions.md` is the settings table's
    /// (`CACHEALLOC_BLESS=1` rewrites it).
    #[test]
    fn the_docs_key_table_is_the_settings_table() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/torch-versions.md");
        let docs = std::fs::read_to_string(&path).expect("docs/torch-versions.md");
        let table = format!("{}", keys::KeyTable);
        let start = docs.find("| key | since |").expect("the docs' key table");
        let end = docs[start..]
            .find("\n\n")
            .map_or(docs.len(), |e| start + e + 1);
        if std::env::var_os("CACHEALLOC_BLESS").is_some() {
            let fresh = format!("{}{table}{}", &docs[..start], &docs[end..]);
            std::fs::write(&path, fresh).expect("write the docs");
            return;
        }
        assert_eq!(
            &docs[start..end],
            table,
            "docs/torch-versions.md's key table is not the settings table (core/src/config/keys.rs); \
             refresh it with CACHEALLOC_BLESS=1 cargo test -p cachealloc-core --lib the_docs_key_table"
        );
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
            "expandable_segments:True,large_segment_size_mb:12",
            "large_segment_size_mb:64,max_non_split_rounding_mb:80,max_split_size_mb:64",
            "per_process_memory_fraction:0.4,throw_on_cudamalloc_oom:True",
            "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,pinned_use_background_threads:True",
            "pinned_reserve_segment_size_mb:64,pinned_free_catch_all:True,pinned_max_round_threshold_mb:4,pinned_max_cached_size_mb:1024",
            // A reserve (a bad value too: torch only warns) changes nothing,
            // and a rounding set to its default is still printed.
            "expandable_segments_reserve:1]",
            "max_non_split_rounding_mb:20",
            "large_segment_size_mb:20,pinned_num_register_threads:1,pinned_max_cached_size_mb:0",
        ] {
            let c = Config::parse(s).unwrap();
            let text = format!("{c}");
            assert_eq!(Config::parse(&text).unwrap(), c, "{s} -> {text}");
        }
    }

    /// A misspelt key is refused with the key it is likely a misspelling
    /// of; a key far from every one gets no guess.
    #[test]
    fn an_unknown_key_suggests_the_nearest() {
        let e = Config::parse("expandable_segment:True").unwrap_err();
        assert_eq!(
            (e.key, e.reason, e.suggestion),
            (
                "expandable_segment",
                UNKNOWN_KEY,
                Some("expandable_segments")
            )
        );
        assert_eq!(
            format!("{e}"),
            "allocator config: option `expandable_segment` value `True`: unknown option (not a key of torch's allocator config); did you mean `expandable_segments`?"
        );
        let v = TorchVersion::NEWEST;
        for (typed, want) in [
            ("expandable_segmets", Some("expandable_segments")),
            ("Expandable_Segments", Some("expandable_segments")),
            ("max_spilt_size_mb", Some("max_split_size_mb")),
            ("max_split_size", Some("max_split_size_mb")),
            (
                "garbage_collect_threshold",
                Some("garbage_collection_threshold"),
            ),
            (
                "garbage_collection_treshold",
                Some("garbage_collection_threshold"),
            ),
            ("roundup_power2_division", Some("roundup_power2_divisions")),
            ("polcy", Some("policy")),
            ("backnd", Some("backend")),
            ("expandable", Some("expandable_segments")),
            ("release_lock_on_malloc", None),
            ("pinned_use_host_register", None),
            ("bogus", None),
            ("a", None),
            ("", None),
        ] {
            assert_eq!(suggest_key(typed, v), want, "{typed}");
        }
        // The prefix rule: a key that starts with the typed one.
        assert_eq!(
            suggest_key("garbage_coll", v),
            Some("garbage_collection_threshold")
        );
        // A very long key: no suggestion, and no overflow of the rows.
        let long = "expandable_segments_".repeat(10);
        assert_eq!(suggest_key(&long, v), Some("expandable_segments"));
        assert_eq!(suggest_key(&"x".repeat(200), v), None);
        // Only keys of the release asked for.
        assert_eq!(
            suggest_key("throw_on_cudamaloc_oom", TorchVersion::NEWEST),
            Some("throw_on_cudamalloc_oom")
        );
        assert_eq!(
            suggest_key("throw_on_cudamaloc_oom", TorchVersion::V2_11),
            None
        );
        // Every key suggested is one the parser takes.
        for k in KEYS.iter().flat_map(|k| k.names) {
            let e = Config::parse(k).unwrap_err();
            assert_eq!(e.reason, "expected a value (the string ends here)", "{k}");
            let bad = format!("{k}:\u{1}");
            if let Err(e) = Config::parse(&bad) {
                assert_ne!(e.reason, UNKNOWN_KEY, "{k}");
            }
        }
    }
}
