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
    /// The keys the string set (a later string keeps what it leaves out of
    /// some of them, as PyTorch's parser does).
    pub(crate) mentioned: Mentioned,
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

bitflags::bitflags! {
    /// Keys a settings string set.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub(crate) struct Mentioned: u16 {
        const EXPANDABLE = 1;
        const POLICY = 1 << 1;
        const LARGE_SEGMENT = 1 << 2;
        const NON_SPLIT_ROUNDING = 1 << 3;
        const FRACTION = 1 << 4;
        const THROW = 1 << 5;
        const REUSE = 1 << 6;
    }
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
        mentioned: Mentioned::empty(),
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

    /// Parse a settings string as torch `version`'s parser does: its keys,
    /// its value rules, its reasons (keys added by a later release are
    /// refused, naming the release). Options not mentioned take their
    /// defaults (like PyTorch's `_set_allocator_settings`). Spaces are
    /// ignored; `True` and `False` are spelt so, as torch's tokenizer takes
    /// no other spelling.
    pub fn parse_for(text: &str, version: TorchVersion) -> Result<Config, ConfigError<'_>> {
        let mut c = Config::DEFAULT.with_torch_version(version);
        fn split(item: &str) -> Result<(&str, &str), ConfigError<'_>> {
            match item.split_once(':') {
                Some((k, v)) => Ok((k.trim(), v.trim())),
                None => Err(ConfigError {
                    key: item,
                    value: "",
                    reason: "expected `key:value`",
                    limit: None,
                    suggestion: None,
                }),
            }
        }
        // torch reads `large_segment_size_mb` first: it is the default of
        // `max_non_split_rounding_mb` and the bound of both split sizes.
        for item in ConfigItems::of(text) {
            let (key, value) = split(item)?;
            if key == "large_segment_size_mb" {
                let err = |reason, limit| ConfigError {
                    key,
                    value,
                    reason,
                    limit,
                    suggestion: None,
                };
                let mb: u64 = value
                    .parse()
                    .map_err(|_| err("expected a whole number of MiB", None))?;
                if mb <= MIN_LARGE_SEGMENT_MB {
                    return Err(err(
                        "CachingAllocator option large_segment_size_mb must be > ",
                        Some(MIN_LARGE_SEGMENT_MB),
                    ));
                }
                c.large_segment_size = mb.min(MAX_MB) * MIB;
                c.max_non_split_rounding = c.large_segment_size;
                c.mentioned |= Mentioned::LARGE_SEGMENT;
            }
        }
        for item in ConfigItems::of(text) {
            let (key, value) = split(item)?;
            let err = |reason| ConfigError {
                key,
                value,
                reason,
                limit: None,
                suggestion: None,
            };
            if let Some(since) = key_added_in(key) {
                if version.decisions_of() < since {
                    return Err(ConfigError {
                        key,
                        value,
                        reason: added_later(since),
                        limit: None,
                        suggestion: None,
                    });
                }
            }
            match key {
                "large_segment_size_mb" => {}
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    let mb: u64 = value
                        .parse()
                        .map_err(|_| err("expected a whole number of MiB"))?;
                    let least = c.large_segment_size / MIB;
                    if mb < least {
                        return Err(ConfigError {
                            key,
                            value,
                            reason: if key == "max_split_size_mb" {
                                "CachingAllocator option max_split_size_mb too small, must be >= "
                            } else {
                                "CachingAllocator option max_non_split_rounding_mb too small, must be >= "
                            },
                            limit: Some(least),
                            suggestion: None,
                        });
                    }
                    let bytes = mb.min(MAX_MB) * MIB;
                    if key == "max_split_size_mb" {
                        c.max_split_size = bytes;
                    } else {
                        c.max_non_split_rounding = bytes;
                        c.mentioned |= Mentioned::NON_SPLIT_ROUNDING;
                    }
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value.parse().map_err(|_| err("expected a number"))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(err(
                            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
                        ));
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
                    c.mentioned |= Mentioned::POLICY;
                }
                "expandable_segments" => {
                    c.expandable_segments = parse_bool(value).map_err(err)?;
                    c.mentioned |= Mentioned::EXPANDABLE;
                }
                "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                    c.release_lock_on_malloc = parse_bool(value).map_err(err)?;
                }
                "backend" => match value {
                    "native" => {}
                    "cudaMallocAsync" | "hipMallocAsync" => {
                        return Err(err(
                            "cachealloc is a native caching allocator; the driver's stream-ordered allocator (cudaMallocAsync, hipMallocAsync) is not implemented",
                        ))
                    }
                    _ => {
                        return Err(err(
                            "Unknown allocator backend, options are native and cudaMallocAsync",
                        ))
                    }
                },
                "per_process_memory_fraction" => {
                    let f: f64 = value.parse().map_err(|_| err("expected a number"))?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(err(
                            "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
                        ));
                    }
                    c.per_process_memory_fraction = f;
                    c.mentioned |= Mentioned::FRACTION;
                }
                "throw_on_cudamalloc_oom" => {
                    c.throw_on_cudamalloc_oom = parse_bool(value).map_err(err)?;
                    c.mentioned |= Mentioned::THROW;
                }
                "graph_capture_record_stream_reuse" => {
                    c.graph_capture_record_stream_reuse = parse_bool(value).map_err(err)?;
                    c.mentioned |= Mentioned::REUSE;
                }
                "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                    c.host.pinned_use_host_register = parse_bool(value).map_err(err)?;
                }
                "pinned_use_background_threads" => {
                    c.host.pinned_use_background_threads = parse_bool(value).map_err(err)?;
                }
                "pinned_free_catch_all" => {
                    c.host.pinned_free_catch_all = parse_bool(value).map_err(err)?;
                }
                "pinned_num_register_threads" => {
                    let n: u64 = value.parse().map_err(|_| err("expected a number"))?;
                    if !n.is_power_of_two() {
                        return Err(err("Number of register threads has to be power of 2"));
                    }
                    if n > MAX_REGISTER_THREADS {
                        return Err(ConfigError {
                            key,
                            value,
                            reason: "Number of register threads should be less than or equal to ",
                            limit: Some(MAX_REGISTER_THREADS),
                            suggestion: None,
                        });
                    }
                    c.host.pinned_num_register_threads = n as u32;
                }
                "pinned_reserve_segment_size_mb" => {
                    let n: u64 = value.parse().map_err(|_| err("expected a number"))?;
                    if n == 0 {
                        return Err(err("Pinned reserve segment size has to be greater than 0"));
                    }
                    c.host.pinned_reserve_segment_size_mb = n;
                }
                "pinned_max_round_threshold_mb" | "pinned_max_cached_size_mb" => {
                    let n: u64 = value
                        .parse()
                        .map_err(|_| err("expected a whole number of MiB"))?;
                    if key == "pinned_max_round_threshold_mb" {
                        c.host.pinned_max_round_threshold_mb = n;
                    } else {
                        c.host.pinned_max_cached_size_mb = n;
                    }
                }
                "expandable_segments_reserve" | "expandable_segments_reserve_by_class" => {
                    // torch warns about a bad value and goes on with its
                    // default; so does this parser (without the warning),
                    // and it changes nothing here.
                }
                _ => {
                    return Err(ConfigError {
                        suggestion: suggest_key(key, version),
                        ..err(UNKNOWN_KEY)
                    })
                }
            }
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
    /// parser does: `expandable_segments`, `large_segment_size_mb`,
    /// `per_process_memory_fraction` and `throw_on_cudamalloc_oom` (and
    /// ours, `policy`) stay unless the string sets them, and so does the
    /// torch version; `max_non_split_rounding_mb` follows the large segment
    /// size unless set. Everything else takes the new string's value or
    /// its default.
    pub fn followed_by(&self, mut next: Config) -> Config {
        if !next.mentioned.contains(Mentioned::EXPANDABLE) {
            next.expandable_segments = self.expandable_segments;
        }
        if !next.mentioned.contains(Mentioned::POLICY) {
            next.policy = self.policy;
        }
        if !next.mentioned.contains(Mentioned::LARGE_SEGMENT) {
            next.large_segment_size = self.large_segment_size;
            if !next.mentioned.contains(Mentioned::NON_SPLIT_ROUNDING) {
                next.max_non_split_rounding = self.large_segment_size;
            }
        }
        if !next.mentioned.contains(Mentioned::FRACTION) {
            next.per_process_memory_fraction = self.per_process_memory_fraction;
        }
        if !next.mentioned.contains(Mentioned::THROW) {
            next.throw_on_cudamalloc_oom = self.throw_on_cudamalloc_oom;
        }
        if !next.mentioned.contains(Mentioned::REUSE) {
            next.graph_capture_record_stream_reuse = self.graph_capture_record_stream_reuse;
        }
        next.with_torch_version(self.torch)
    }
}

/// The reason for a key torch does not have.
pub const UNKNOWN_KEY: &str = "unknown option (not a key of torch's allocator config)";

/// Every key [`Config::parse_for`] takes (torch's newest, and `policy`),
/// the common ones first: the candidates of [`suggest_key`].
const KEYS: [&str; 23] = [
    "expandable_segments",
    "max_split_size_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "large_segment_size_mb",
    "max_non_split_rounding_mb",
    "per_process_memory_fraction",
    "throw_on_cudamalloc_oom",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "backend",
    "policy",
    "graph_capture_record_stream_reuse",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_use_background_threads",
    "pinned_free_catch_all",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "expandable_segments_reserve",
    "expandable_segments_reserve_by_class",
];

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
    let candidates = || {
        KEYS.iter()
            .copied()
            .filter(move |k| key_added_in(k).is_none_or(|since| version.decisions_of() >= since))
    };
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

/// `large_segment_size_mb` must be more than this (the largest request
/// it serves, 10 MiB, must fit).
const MIN_LARGE_SEGMENT_MB: u64 = 10;
/// torch clamps sizes in MiB so that the bytes fit a `size_t`.
const MAX_MB: u64 = u64::MAX / MIB;
/// `pinned_num_register_threads`' most.
const MAX_REGISTER_THREADS: u64 = 128;

/// The release that added a key, for keys younger than torch 2.11.
fn key_added_in(key: &str) -> Option<TorchVersion> {
    match key {
        "pinned_free_catch_all" | "throw_on_cudamalloc_oom" => Some(TorchVersion::V2_12),
        "pinned_max_round_threshold_mb" | "pinned_max_cached_size_mb" => Some(TorchVersion::V2_13),
        "expandable_segments_reserve" | "expandable_segments_reserve_by_class" => {
            Some(TorchVersion::V2_15)
        }
        _ => None,
    }
}

/// The reason for a key of a later release.
fn added_later(since: TorchVersion) -> &'static str {
    match since.minor() {
        12 => "not a key of this torch's allocator config (torch 2.12 added it; --torch-version selects the release)",
        13 => "not a key of this torch's allocator config (torch 2.13 added it; --torch-version selects the release)",
        _ => "not a key of this torch's allocator config (torch 2.15 added it; --torch-version selects the release)",
    }
}

fn parse_bool(v: &str) -> Result<bool, &'static str> {
    match v {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err("Expected 'True' or 'False' (torch takes no other spelling)"),
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

/// Writes the canonical string of the options that differ from the default
/// (or that a later string would keep); [`Config::parse`] of it gives the
/// same `Config` back (the torch version aside: it is not a key).
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut item = |f: &mut fmt::Formatter<'_>, args: fmt::Arguments<'_>| {
            let sep = if first { "" } else { "," };
            first = false;
            write!(f, "{sep}{args}")
        };
        if self.large_segment_size != LARGE_BUFFER
            || self.mentioned.contains(Mentioned::LARGE_SEGMENT)
        {
            item(
                f,
                format_args!("large_segment_size_mb:{}", self.large_segment_size / MIB),
            )?;
        }
        if self.max_split_size != u64::MAX {
            item(
                f,
                format_args!("max_split_size_mb:{}", self.max_split_size / MIB),
            )?;
        }
        if self.max_non_split_rounding != self.large_segment_size
            || self.mentioned.contains(Mentioned::NON_SPLIT_ROUNDING)
        {
            item(
                f,
                format_args!(
                    "max_non_split_rounding_mb:{}",
                    self.max_non_split_rounding / MIB
                ),
            )?;
        }
        if self.roundup_power2_divisions != [0; ROUNDUP_INTERVALS] {
            item(f, format_args!("roundup_power2_divisions:["))?;
            for (i, d) in self.roundup_power2_divisions.iter().enumerate() {
                write!(f, "{}{}:{}", if i == 0 { "" } else { "," }, 1u64 << i, d)?;
            }
            write!(f, "]")?;
        }
        if self.garbage_collection_threshold != 0.0 {
            item(
                f,
                format_args!(
                    "garbage_collection_threshold:{}",
                    self.garbage_collection_threshold
                ),
            )?;
        }
        let tf = |b: bool| if b { "True" } else { "False" };
        if self.release_lock_on_malloc {
            item(f, format_args!("release_lock_on_cudamalloc:True"))?;
        }
        if self.mentioned.contains(Mentioned::EXPANDABLE) {
            item(
                f,
                format_args!("expandable_segments:{}", tf(self.expandable_segments)),
            )?;
        }
        if self.per_process_memory_fraction != 1.0 || self.mentioned.contains(Mentioned::FRACTION) {
            item(
                f,
                format_args!(
                    "per_process_memory_fraction:{}",
                    self.per_process_memory_fraction
                ),
            )?;
        }
        if self.throw_on_cudamalloc_oom || self.mentioned.contains(Mentioned::THROW) {
            item(
                f,
                format_args!(
                    "throw_on_cudamalloc_oom:{}",
                    tf(self.throw_on_cudamalloc_oom)
                ),
            )?;
        }
        if self.graph_capture_record_stream_reuse || self.mentioned.contains(Mentioned::REUSE) {
            item(
                f,
                format_args!(
                    "graph_capture_record_stream_reuse:{}",
                    tf(self.graph_capture_record_stream_reuse)
                ),
            )?;
        }
        let h = &self.host;
        let d = &Config::DEFAULT.host;
        if h.pinned_use_host_register {
            item(f, format_args!("pinned_use_cuda_host_register:True"))?;
        }
        if h.pinned_num_register_threads != d.pinned_num_register_threads {
            item(
                f,
                format_args!(
                    "pinned_num_register_threads:{}",
                    h.pinned_num_register_threads
                ),
            )?;
        }
        if h.pinned_use_background_threads {
            item(f, format_args!("pinned_use_background_threads:True"))?;
        }
        if h.pinned_reserve_segment_size_mb != 0 {
            item(
                f,
                format_args!(
                    "pinned_reserve_segment_size_mb:{}",
                    h.pinned_reserve_segment_size_mb
                ),
            )?;
        }
        if h.pinned_free_catch_all {
            item(f, format_args!("pinned_free_catch_all:True"))?;
        }
        if h.pinned_max_round_threshold_mb != 0 {
            item(
                f,
                format_args!(
                    "pinned_max_round_threshold_mb:{}",
                    h.pinned_max_round_threshold_mb
                ),
            )?;
        }
        if h.pinned_max_cached_size_mb != 0 {
            item(
                f,
                format_args!("pinned_max_cached_size_mb:{}", h.pinned_max_cached_size_mb),
            )?;
        }
        if self.mentioned.contains(Mentioned::POLICY) || self.policy != Policy::PyTorch {
            item(f, format_args!("policy:{}", self.policy.name()))?;
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
        for k in KEYS {
            let e = Config::parse(k).unwrap_err();
            assert_eq!(e.reason, "expected `key:value`", "{k}");
            let bad = format!("{k}:\u{1}");
            if let Err(e) = Config::parse(&bad) {
                assert_ne!(e.reason, UNKNOWN_KEY, "{k}");
            }
        }
    }
}
