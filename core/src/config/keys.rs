//! The settings table: every key of the settings string, once, with the
//! torch release that added it, torch's rule for its value (and the
//! reasons it refuses one), what a later settings string that leaves it
//! out does to it, its parser and its printer. [`Config::parse_for`],
//! [`Config::followed_by`], `Display for Config`, the suggestions for a
//! misspelt key and the key table of `docs/torch-versions.md` (the test
//! `the_docs_key_table_is_the_settings_table`) all read it.

use super::tokens::Tokens;
use super::{Config, Policy, MIB};
use crate::policy::ROUNDUP_INTERVALS;
use crate::torch_version::TorchVersion;
use core::fmt;

/// What a later settings string (torch's `_set_allocator_settings`) does
/// to a key it leaves out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Later {
    /// Back to its default: torch resets it at every string.
    Reset,
    /// The value in force stays.
    Keep,
    /// Back to the large segment size in force
    /// (`max_non_split_rounding_mb`).
    LargeSegmentSize,
}

/// Which of torch's two parsers reads a key: each walks the whole string
/// and passes over the other's keys (a string must pass both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    /// c10's `AcceleratorAllocatorConfig` (and cachealloc's own `policy`).
    Accelerator,
    /// c10's `CUDAAllocatorConfig`.
    Device,
}

/// A refused value: torch's reason, and the bound it ends with.
pub(super) type Refusal = (&'static str, Option<u64>);

/// A key's value, as the settings string writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Value {
    Bool(bool),
    /// Bytes, written in MiB.
    Mib(u64),
    Number(u64),
    Real(f64),
    Divisions([u32; ROUNDUP_INTERVALS]),
    Word(&'static str),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Value::Bool(b) => f.write_str(if b { "True" } else { "False" }),
            Value::Mib(bytes) => write!(f, "{}", bytes / MIB),
            Value::Number(n) => write!(f, "{n}"),
            Value::Real(x) => write!(f, "{x}"),
            Value::Divisions(d) => {
                f.write_str("[")?;
                for (i, d) in d.iter().enumerate() {
                    write!(f, "{}{}:{d}", if i == 0 { "" } else { "," }, 1u64 << i)?;
                }
                f.write_str("]")
            }
            Value::Word(w) => f.write_str(w),
        }
    }
}

/// One key of the settings string.
#[derive(Clone, Copy)]
pub struct Key {
    /// Its spellings: torch's CUDA and HIP names of one setting, or keys
    /// cachealloc treats alike. The first is the one printed.
    pub names: &'static [&'static str],
    /// The torch release that added it ([`TorchVersion::OLDEST`]: that
    /// release or an older one).
    pub since: TorchVersion,
    /// What a later settings string that leaves it out does to it.
    pub later: Later,
    /// The values torch takes, with its reasons for refusing one.
    pub rule: &'static str,
    /// Which of torch's parsers reads it.
    pub walk: Walk,
    /// Read before every other key (torch reads `large_segment_size_mb`
    /// first: the other sizes are checked against it).
    pub(super) first: bool,
    /// Read its value from the tokens after its `:` and set it.
    pub(super) parse: fn(&mut Config, &mut Tokens<'_>) -> Result<(), Refusal>,
    /// Its value in a `Config`; `None`: not kept, never printed.
    pub(super) value: fn(&Config) -> Option<Value>,
    /// A later string that leaves it out: set it from the earlier
    /// settings (`Keep`) or the new ones (`LargeSegmentSize`).
    pub(super) carry: fn(&Config, &mut Config),
}

/// `large_segment_size_mb` must be more than this (the largest request
/// it serves, 10 MiB, must fit).
const MIN_LARGE_SEGMENT_MB: u64 = 10;
/// torch clamps sizes in MiB so that the bytes fit a `size_t`.
const MAX_MB: u64 = u64::MAX / MIB;
/// `pinned_num_register_threads`' most.
const MAX_REGISTER_THREADS: u64 = 128;

/// A split size of at least the large segment size in force, in bytes.
fn split_size(c: &Config, t: &mut Tokens<'_>, too_small: &'static str) -> Result<u64, Refusal> {
    let mb = t.size()?;
    let least = c.large_segment_size / MIB;
    if mb < least {
        return Err((too_small, Some(least)));
    }
    Ok(mb.min(MAX_MB) * MIB)
}

/// A value read and dropped (torch 2.15's reserve: a bad value only warns).
fn ignored(_: &mut Config, t: &mut Tokens<'_>) -> Result<(), Refusal> {
    t.value().map(|_| ())
}

/// torch 2.15's `expandable_segments_reserve_by_class`: a list
/// `[class:reserve,...]`, read to its `]` and dropped.
fn ignored_list(_: &mut Config, t: &mut Tokens<'_>) -> Result<(), Refusal> {
    loop {
        if t.value()?.is("]") {
            return Ok(());
        }
    }
}

/// `roundup_power2_divisions`' value, with torch's rules: one power of two
/// for every bucket, or a list `[mib:divisions,...,>:divisions]` (the
/// first entry also fills every bucket below its own, `>` fills every
/// bucket after the last entry's, the others only their own).
fn divisions(out: &mut [u32; ROUNDUP_INTERVALS], t: &mut Tokens<'_>) -> Result<(), Refusal> {
    let count = |d: u64| {
        u32::try_from(d).map_err(|_| ("more divisions than cachealloc holds (at most 2^31)", None))
    };
    if !t.peek().is_some_and(|v| v.is("[")) {
        let d = t.size()?;
        if !d.is_power_of_two() {
            return Err(("For roundups, the divisions has to be power of 2", None));
        }
        *out = [count(d)?; ROUNDUP_INTERVALS];
        return Ok(());
    }
    t.pass();
    let mut first = true;
    let mut last = 0;
    loop {
        let key = t.value()?;
        if key.is("]") {
            return Ok(());
        }
        t.pass(); // `:`
        let d = t.size()?;
        if d != 0 && !d.is_power_of_two() {
            return Err((
                "For roundups, the divisions has to be power of 2 or 0 to disable roundup",
                None,
            ));
        }
        let d = count(d)?;
        if key.is(">") {
            for slot in out.iter_mut().skip(last + 1) {
                *slot = d;
            }
        } else {
            let (mib, whole) = key.to_size()?;
            t.odd |= !whole;
            if !mib.is_power_of_two() {
                return Err(("For roundups, the intervals have to be power of 2", None));
            }
            let index = (mib.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
            if first {
                for slot in out.iter_mut().take(index) {
                    *slot = d;
                }
                first = false;
            }
            out[index] = d;
            last = index;
        }
        // torch passes over the token after an entry unless it ends the list.
        if !t.value_ahead()?.is("]") {
            t.pass();
        }
    }
}

/// Nothing to print, nothing to carry.
fn no_value(_: &Config) -> Option<Value> {
    None
}
fn no_carry(_: &Config, _: &mut Config) {}

/// The parser, printer and carrier of a key that is one field of `Config`
/// read as torch reads a boolean (`bool`) or a count (`number`), for the
/// rest of its entry to complete (`..plain!(bool, host.pinned_free_catch_all)`).
macro_rules! plain {
    (bool, $($f:ident).+) => {
        Key {
            parse: |c, t| {
                c.$($f).+ = t.boolean()?;
                Ok(())
            },
            value: |c| Some(Value::Bool(c.$($f).+)),
            carry: |from, to| to.$($f).+ = from.$($f).+,
            ..PLAIN
        }
    };
    (number, $($f:ident).+) => {
        Key {
            parse: |c, t| {
                c.$($f).+ = t.size()?;
                Ok(())
            },
            value: |c| Some(Value::Number(c.$($f).+)),
            carry: |from, to| to.$($f).+ = from.$($f).+,
            ..PLAIN
        }
    };
}

/// What `plain!` leaves to the entry.
const PLAIN: Key = Key {
    names: &[],
    since: TorchVersion::OLDEST,
    later: Later::Keep,
    walk: Walk::Accelerator,
    rule: "",
    first: false,
    parse: ignored,
    value: no_value,
    carry: no_carry,
};

/// Every key, in the order the settings string is printed.
pub const KEYS: &[Key] = &[
    Key {
        names: &["large_segment_size_mb"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Accelerator,
        rule: "> 10 (\"CachingAllocator option large_segment_size_mb must be > 10\"); \
               new in 2.11 (#172056); read before the other keys; sets \
               `max_non_split_rounding_mb`'s default",
        first: true,
        parse: |c, t| {
            let mb = t.size()?;
            if mb <= MIN_LARGE_SEGMENT_MB {
                return Err((
                    "CachingAllocator option large_segment_size_mb must be > ",
                    Some(MIN_LARGE_SEGMENT_MB),
                ));
            }
            c.large_segment_size = mb.min(MAX_MB) * MIB;
            c.max_non_split_rounding = c.large_segment_size;
            Ok(())
        },
        value: |c| Some(Value::Mib(c.large_segment_size)),
        carry: |from, to| to.large_segment_size = from.large_segment_size,
    },
    Key {
        names: &["max_split_size_mb"],
        since: TorchVersion::OLDEST,
        later: Later::Reset,
        walk: Walk::Accelerator,
        rule: "at least `large_segment_size_mb` (\"... too small, must be >= 20\"): \
               **20 is accepted**",
        first: false,
        parse: |c, t| {
            c.max_split_size = split_size(
                c,
                t,
                "CachingAllocator option max_split_size_mb too small, must be >= ",
            )?;
            Ok(())
        },
        value: |c| Some(Value::Mib(c.max_split_size)),
        carry: no_carry,
    },
    Key {
        names: &["max_non_split_rounding_mb"],
        since: TorchVersion::OLDEST,
        later: Later::LargeSegmentSize,
        walk: Walk::Accelerator,
        rule: "at least `large_segment_size_mb` (\"... too small, must be >= 20\")",
        first: false,
        parse: |c, t| {
            c.max_non_split_rounding = split_size(
                c,
                t,
                "CachingAllocator option max_non_split_rounding_mb too small, must be >= ",
            )?;
            Ok(())
        },
        value: |c| Some(Value::Mib(c.max_non_split_rounding)),
        carry: |_, to| to.max_non_split_rounding = to.large_segment_size,
    },
    Key {
        names: &["roundup_power2_divisions"],
        since: TorchVersion::OLDEST,
        later: Later::Reset,
        walk: Walk::Accelerator,
        rule: "a power of two (not 0), or a list `[mib:v,...,>:v]` (0 allowed): the first entry \
               also fills the buckets below its own, `>` those after the last entry's, the \
               others only their own",
        first: false,
        parse: |c, t| divisions(&mut c.roundup_power2_divisions, t),
        value: |c| Some(Value::Divisions(c.roundup_power2_divisions)),
        carry: no_carry,
    },
    Key {
        names: &["garbage_collection_threshold"],
        since: TorchVersion::OLDEST,
        later: Later::Reset,
        walk: Walk::Accelerator,
        rule: "in (0, 1) (\"garbage_collect_threshold is invalid, set it in (0.0, 1.0)\")",
        first: false,
        parse: |c, t| {
            let x = t.real()?;
            if !(x > 0.0 && x < 1.0) {
                return Err((
                    "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
                    None,
                ));
            }
            c.garbage_collection_threshold = x;
            Ok(())
        },
        value: |c| Some(Value::Real(c.garbage_collection_threshold)),
        carry: no_carry,
    },
    Key {
        names: &["release_lock_on_cudamalloc", "release_lock_on_hipmalloc"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Device,
        rule: "boolean",
        first: false,
        ..plain!(bool, release_lock_on_malloc)
    },
    Key {
        names: &["expandable_segments"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Accelerator,
        rule: "boolean",
        first: false,
        ..plain!(bool, expandable_segments)
    },
    Key {
        names: &["backend"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Device,
        rule: "`native` or `cudaMallocAsync` (cachealloc refuses the latter: it is not \
               implemented)",
        first: false,
        parse: |_, t| match t.word()? {
            v if v.is("native") => Ok(()),
            v if v.is("cudaMallocAsync") || v.is("hipMallocAsync") => Err((
                "cachealloc is a native caching allocator; the driver's stream-ordered allocator \
                 (cudaMallocAsync, hipMallocAsync) is not implemented",
                None,
            )),
            _ => Err((
                "Unknown allocator backend, options are native and cudaMallocAsync",
                None,
            )),
        },
        value: no_value,
        carry: no_carry,
    },
    Key {
        names: &["per_process_memory_fraction"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Device,
        rule: "in [0, 1] (\"per_process_memory_fraction is invalid, set it in [0.0, 1.0]\"); \
               new in 2.11; applied as the memory fraction when the allocator is made \
               (`NativeCachingAllocator::init` → `setMemoryFraction`, 0x29808), and the \
               rejection policy's limit",
        first: false,
        parse: |c, t| {
            let f = t.real()?;
            if !(0.0..=1.0).contains(&f) {
                return Err((
                    "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
                    None,
                ));
            }
            c.per_process_memory_fraction = f;
            Ok(())
        },
        value: |c| Some(Value::Real(c.per_process_memory_fraction)),
        carry: |from, to| to.per_process_memory_fraction = from.per_process_memory_fraction,
    },
    Key {
        names: &["throw_on_cudamalloc_oom"],
        since: TorchVersion::V2_12,
        later: Later::Keep,
        walk: Walk::Device,
        rule: "boolean",
        first: false,
        ..plain!(bool, throw_on_cudamalloc_oom)
    },
    Key {
        names: &["graph_capture_record_stream_reuse"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Device,
        rule: "boolean, default False; new in 2.11 (see below)",
        first: false,
        ..plain!(bool, graph_capture_record_stream_reuse)
    },
    Key {
        names: &[
            "pinned_use_cuda_host_register",
            "pinned_use_hip_host_register",
        ],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Device,
        rule: "boolean",
        first: false,
        ..plain!(bool, host.pinned_use_host_register)
    },
    Key {
        names: &["pinned_num_register_threads"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Device,
        rule: "a power of two, at most 128",
        first: false,
        parse: |c, t| {
            let n = t.size()?;
            if !n.is_power_of_two() {
                return Err(("Number of register threads has to be power of 2", None));
            }
            if n > MAX_REGISTER_THREADS {
                return Err((
                    "Number of register threads should be less than or equal to ",
                    Some(MAX_REGISTER_THREADS),
                ));
            }
            c.host.pinned_num_register_threads = n as u32;
            Ok(())
        },
        value: |c| Some(Value::Number(c.host.pinned_num_register_threads.into())),
        carry: |from, to| {
            to.host.pinned_num_register_threads = from.host.pinned_num_register_threads
        },
    },
    Key {
        names: &["pinned_use_background_threads"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Accelerator,
        rule: "boolean",
        first: false,
        ..plain!(bool, host.pinned_use_background_threads)
    },
    Key {
        names: &["pinned_reserve_segment_size_mb"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Device,
        rule: "> 0; new in 2.11",
        first: false,
        parse: |c, t| {
            let n = t.size()?;
            if n == 0 {
                return Err(("Pinned reserve segment size has to be greater than 0", None));
            }
            c.host.pinned_reserve_segment_size_mb = n;
            Ok(())
        },
        value: |c| Some(Value::Number(c.host.pinned_reserve_segment_size_mb)),
        carry: |from, to| {
            to.host.pinned_reserve_segment_size_mb = from.host.pinned_reserve_segment_size_mb
        },
    },
    Key {
        names: &["pinned_free_catch_all"],
        since: TorchVersion::V2_12,
        later: Later::Keep,
        walk: Walk::Device,
        rule: "boolean",
        first: false,
        ..plain!(bool, host.pinned_free_catch_all)
    },
    Key {
        names: &["pinned_max_round_threshold_mb"],
        since: TorchVersion::V2_13,
        later: Later::Keep,
        walk: Walk::Accelerator,
        rule: "a size in MiB",
        first: false,
        ..plain!(number, host.pinned_max_round_threshold_mb)
    },
    Key {
        names: &["pinned_max_cached_size_mb"],
        since: TorchVersion::V2_13,
        later: Later::Keep,
        walk: Walk::Accelerator,
        rule: "a size in MiB",
        first: false,
        ..plain!(number, host.pinned_max_cached_size_mb)
    },
    Key {
        names: &["expandable_segments_reserve"],
        since: TorchVersion::V2_15,
        later: Later::Reset,
        walk: Walk::Device,
        // torch warns about a bad value and goes on with its default; so
        // does this parser (without the warning), and it changes nothing
        // here.
        rule: "a fraction or `<n>G`; a bad value only warns (cachealloc reserves as before)",
        first: false,
        parse: ignored,
        value: no_value,
        carry: no_carry,
    },
    Key {
        names: &["expandable_segments_reserve_by_class"],
        since: TorchVersion::V2_15,
        later: Later::Reset,
        walk: Walk::Device,
        rule: "a list `[class:reserve,...]` (a single value is refused); a bad reserve only warns",
        first: false,
        parse: ignored_list,
        value: no_value,
        carry: no_carry,
    },
    Key {
        names: &["policy"],
        since: TorchVersion::OLDEST,
        later: Later::Keep,
        walk: Walk::Accelerator,
        rule: "cachealloc's own: `pytorch` (the default) or `compact`",
        first: false,
        parse: |c, t| {
            let v = t.word()?;
            c.policy = if v.is("pytorch") || v.is("PyTorch") {
                Policy::PyTorch
            } else if v.is("compact") {
                Policy::Compact
            } else {
                return Err(("expected pytorch or compact", None));
            };
            Ok(())
        },
        value: |c| Some(Value::Word(c.policy.name())),
        carry: |from, to| to.policy = from.policy,
    },
];

// `Config::mentioned` has a bit per key.
const _: () = assert!(KEYS.len() <= 32);

/// The key torch reads in `token`, with its place in [`KEYS`].
pub(super) fn find(token: &super::tokens::Token<'_>) -> Option<(usize, &'static Key)> {
    KEYS.iter()
        .enumerate()
        .find(|(_, k)| k.names.iter().any(|n| token.is(n)))
}

/// Every spelling of every key torch `version` has, in the table's order.
pub(super) fn names_of(version: TorchVersion) -> impl Iterator<Item = &'static str> + Clone {
    KEYS.iter()
        .filter(move |k| version.decisions_of() >= k.since)
        .flat_map(|k| k.names.iter().copied())
}

/// The key table of `docs/torch-versions.md`, in Markdown, as [`KEYS`]
/// gives it (a test checks the docs have it).
pub struct KeyTable;

impl fmt::Display for KeyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "| key | since | a later string without it | value rule (torch's message) |"
        )?;
        writeln!(f, "| --- | --- | --- | --- |")?;
        for k in KEYS {
            for (i, name) in k.names.iter().enumerate() {
                write!(f, "{}`{name}`", if i == 0 { "| " } else { ", " })?;
            }
            let since = if k.since == TorchVersion::OLDEST {
                "≤2.11"
            } else {
                ""
            };
            if since.is_empty() {
                write!(f, " | **{}**", k.since)?;
            } else {
                write!(f, " | {since}")?;
            }
            let later = match k.later {
                Later::Reset => "reset to the default",
                Later::Keep => "kept",
                Later::LargeSegmentSize => "the large segment size in force",
            };
            writeln!(f, " | {later} | {} |", k.rule)?;
        }
        Ok(())
    }
}
