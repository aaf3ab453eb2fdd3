//! [`DeviceStats`]: every counter of PyTorch's `DeviceStats`, with its
//! semantics, listed under the flat key names of `torch.cuda.memory_stats()`.
//!
//! ```
//! use cachealloc_core::DeviceStats;
//! let s = DeviceStats::new(None);
//! assert_eq!(s.get("max_split_size"), Some(-1));
//! let mut n = 0;
//! s.for_each(|_key, _value| n += 1);
//! assert_eq!(n, DeviceStats::KEY_COUNT);
//! ```

use crate::policy::Pool;
use crate::torch_version::TorchVersion;

/// One statistic: current value, peak, and the running sums of increases
/// (`allocated`) and decreases (`freed`). Signed, like PyTorch's `Stat`.
///
/// ```
/// use cachealloc_core::Stat;
/// let mut s = Stat::ZERO;
/// s.increase(5);
/// s.decrease(3);
/// assert_eq!((s.current, s.peak, s.allocated, s.freed), (2, 5, 5, 3));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// The value now.
    pub current: i64,
    /// The largest `current` since creation or the last peak reset.
    pub peak: i64,
    /// The sum of all increases.
    pub allocated: i64,
    /// The sum of all decreases.
    pub freed: i64,
}

impl Stat {
    /// All zero.
    pub const ZERO: Stat = Stat {
        current: 0,
        peak: 0,
        allocated: 0,
        freed: 0,
    };

    /// `current += x`, raising `peak` if needed.
    #[inline]
    pub fn increase(&mut self, x: u64) {
        let x = x as i64;
        self.current = self.current.wrapping_add(x);
        self.peak = self.peak.max(self.current);
        self.allocated = self.allocated.wrapping_add(x);
    }

    /// `current -= x`; the peak stays.
    #[inline]
    pub fn decrease(&mut self, x: u64) {
        let x = x as i64;
        self.current = self.current.wrapping_sub(x);
        self.freed = self.freed.wrapping_add(x);
    }
}

/// A statistic for all pools together, the small pool and the large pool.
///
/// ```
/// use cachealloc_core::{policy::Pool, StatArray};
/// let mut a = StatArray::ZERO;
/// a.increase(Pool::Small, 512);
/// assert_eq!(a.all().current, 512);
/// assert_eq!(a.small_pool().current, 512);
/// assert_eq!(a.large_pool().current, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// All zero.
    pub const ZERO: StatArray = StatArray([Stat::ZERO; 3]);

    /// Aggregate over both pools ("all").
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }
    /// The small pool.
    pub fn small_pool(&self) -> &Stat {
        &self.0[1]
    }
    /// The large pool.
    pub fn large_pool(&self) -> &Stat {
        &self.0[2]
    }
    /// The entry of one pool.
    pub fn pool(&self, pool: Pool) -> &Stat {
        &self.0[pool_index(pool)]
    }

    /// Increase the aggregate and the pool's entry.
    #[inline]
    pub fn increase(&mut self, pool: Pool, x: u64) {
        self.0[0].increase(x);
        self.0[pool_index(pool)].increase(x);
    }

    /// Decrease the aggregate and the pool's entry.
    #[inline]
    pub fn decrease(&mut self, pool: Pool, x: u64) {
        self.0[0].decrease(x);
        self.0[pool_index(pool)].decrease(x);
    }

    /// Apply a signed change as one increase or one decrease.
    #[inline]
    pub fn apply(&mut self, pool: Pool, delta: i64) {
        if delta > 0 {
            self.increase(pool, delta as u64);
        } else if delta < 0 {
            self.decrease(pool, delta.unsigned_abs());
        }
    }

    pub(crate) fn reset_peak(&mut self) {
        for s in &mut self.0 {
            s.peak = s.current;
        }
    }

    pub(crate) fn reset_accumulated(&mut self) {
        for s in &mut self.0 {
            s.allocated = 0;
            s.freed = 0;
        }
    }
}

#[inline]
fn pool_index(pool: Pool) -> usize {
    1 + pool.index()
}

/// PyTorch's `DeviceStats`, field for field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceStats {
    /// Allocations handed out and not yet freed (`allocation`).
    pub allocation: StatArray,
    /// Device segments held (`segment`).
    pub segment: StatArray,
    /// Blocks allocated or waiting on events (`active`).
    pub active: StatArray,
    /// Free blocks inside segments of more than one block (`inactive_split`).
    pub inactive_split: StatArray,
    /// Bytes of allocated blocks (`allocated_bytes`).
    pub allocated_bytes: StatArray,
    /// Bytes of device segments (`reserved_bytes`).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks (`active_bytes`).
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks (`inactive_split_bytes`).
    pub inactive_split_bytes: StatArray,
    /// Unrounded request bytes of active blocks (`requested_bytes`).
    pub requested_bytes: StatArray,
    /// Segment creations retried after releasing every cached segment.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors raised by malloc.
    pub num_ooms: i64,
    /// Requests the rejection policy refused (`throw_on_cudamalloc_oom`;
    /// torch 2.12 on; not counted in `num_ooms`).
    pub num_oom_rejections: i64,
    /// Allocations of at least `max_split_size` bytes.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` bytes.
    pub oversize_segments: Stat,
    /// Times every pending event was waited for (`empty_cache`, the flush rung).
    pub num_sync_all_streams: i64,
    /// Successful device mallocs.
    pub num_device_alloc: i64,
    /// Device frees.
    pub num_device_free: i64,
    /// `max_split_size` at creation, -1 when unlimited (never updated later).
    pub max_split_size: i64,
}

macro_rules! array_keys {
    ($self:ident, $f:ident; $($name:ident),*) => {$(
        array_keys!(@one $self, $f, $name, all, 0);
        array_keys!(@one $self, $f, $name, large_pool, 2);
        array_keys!(@one $self, $f, $name, small_pool, 1);
    )*};
    (@one $self:ident, $f:ident, $name:ident, $pool:ident, $i:expr) => {
        $f(concat!(stringify!($name), ".", stringify!($pool), ".allocated"), $self.$name.0[$i].allocated);
        $f(concat!(stringify!($name), ".", stringify!($pool), ".current"), $self.$name.0[$i].current);
        $f(concat!(stringify!($name), ".", stringify!($pool), ".freed"), $self.$name.0[$i].freed);
        $f(concat!(stringify!($name), ".", stringify!($pool), ".peak"), $self.$name.0[$i].peak);
    };
}

macro_rules! single_keys {
    ($self:ident, $f:ident; $($name:ident),*) => {$(
        $f(concat!(stringify!($name), ".allocated"), $self.$name.allocated);
        $f(concat!(stringify!($name), ".current"), $self.$name.current);
        $f(concat!(stringify!($name), ".freed"), $self.$name.freed);
        $f(concat!(stringify!($name), ".peak"), $self.$name.peak);
    )*};
}

macro_rules! scalar_keys {
    ($self:ident, $f:ident; $($name:ident),*) => {$(
        $f(stringify!($name), $self.$name);
    )*};
}

macro_rules! currents {
    ($self:ident; $($name:ident),*; $($single:ident),*) => {[
        $(
            (concat!(stringify!($name), ".all.current"), $self.$name.0[0].current),
            (concat!(stringify!($name), ".small_pool.current"), $self.$name.0[1].current),
            (concat!(stringify!($name), ".large_pool.current"), $self.$name.0[2].current),
        )*
        $((concat!(stringify!($single), ".current"), $self.$single.current),)*
    ]};
}

impl DeviceStats {
    /// The number of flat keys of `torch.cuda.memory_stats()` in the newest
    /// torch ([`Self::key_count`] for another; the keys of private pools'
    /// reserved bytes, torch 2.13 on, come on top, one set per pool).
    pub const KEY_COUNT: usize = 123;

    /// The number of flat keys torch `version` has (122 up to 2.11; 2.12
    /// added `num_oom_rejections`).
    pub fn key_count(version: TorchVersion) -> usize {
        if Self::has_oom_rejections(version) {
            123
        } else {
            122
        }
    }

    /// Whether torch `version` has the `num_oom_rejections` key.
    pub fn has_oom_rejections(version: TorchVersion) -> bool {
        version.decisions_of() >= TorchVersion::V2_12
    }

    /// All zero; `max_split_size` as PyTorch reports it (-1 for unlimited).
    pub const fn new(max_split_size: Option<u64>) -> DeviceStats {
        DeviceStats {
            allocation: StatArray::ZERO,
            segment: StatArray::ZERO,
            active: StatArray::ZERO,
            inactive_split: StatArray::ZERO,
            allocated_bytes: StatArray::ZERO,
            reserved_bytes: StatArray::ZERO,
            active_bytes: StatArray::ZERO,
            inactive_split_bytes: StatArray::ZERO,
            requested_bytes: StatArray::ZERO,
            num_alloc_retries: 0,
            num_ooms: 0,
            num_oom_rejections: 0,
            oversize_allocations: Stat::ZERO,
            oversize_segments: Stat::ZERO,
            num_sync_all_streams: 0,
            num_device_alloc: 0,
            num_device_free: 0,
            max_split_size: match max_split_size {
                Some(v) if v <= i64::MAX as u64 => v as i64,
                _ => -1,
            },
        }
    }

    /// Calls `f(key, value)` for every flat key of `torch.cuda.memory_stats()`
    /// of the newest torch, in the same (sorted) order, without allocating.
    pub fn for_each(&self, f: impl FnMut(&'static str, i64)) {
        self.for_each_of(TorchVersion::NEWEST, f)
    }

    /// [`Self::for_each`] with the keys of torch `version`.
    pub fn for_each_of(&self, version: TorchVersion, mut f: impl FnMut(&'static str, i64)) {
        array_keys!(self, f; active, active_bytes, allocated_bytes, allocation,
                    inactive_split, inactive_split_bytes);
        scalar_keys!(self, f; max_split_size, num_alloc_retries, num_device_alloc,
                     num_device_free);
        if Self::has_oom_rejections(version) {
            f("num_oom_rejections", self.num_oom_rejections);
        }
        scalar_keys!(self, f; num_ooms, num_sync_all_streams);
        single_keys!(self, f; oversize_allocations, oversize_segments);
        array_keys!(self, f; requested_bytes, reserved_bytes, segment);
    }

    /// The value of one flat key, e.g. `"reserved_bytes.all.peak"`.
    pub fn get(&self, key: &str) -> Option<i64> {
        let mut out = None;
        self.for_each(|k, v| {
            if k == key {
                out = Some(v);
            }
        });
        out
    }

    /// `reset_peak_memory_stats`: every peak becomes its current value.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.reset_peak();
        }
        self.oversize_allocations.peak = self.oversize_allocations.current;
        self.oversize_segments.peak = self.oversize_segments.current;
    }

    /// `reset_accumulated_memory_stats`: increases, decreases and counters to 0.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.reset_accumulated();
        }
        for s in [&mut self.oversize_allocations, &mut self.oversize_segments] {
            s.allocated = 0;
            s.freed = 0;
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_oom_rejections = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// Every `current` value the invariant checker recounts, by key.
    pub(crate) fn currents(&self) -> [(&'static str, i64); 29] {
        currents!(self; allocation, segment, active, inactive_split, allocated_bytes,
                  reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
                  oversize_allocations, oversize_segments)
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn keys_are_sorted_unique_and_complete() {
        let s = DeviceStats::new(Some(40 << 20));
        let mut keys = Vec::new();
        s.for_each(|k, _| keys.push(k));
        assert_eq!(keys.len(), DeviceStats::KEY_COUNT);
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(keys, sorted);
        assert_eq!(s.get("max_split_size"), Some(40 << 20));
        assert_eq!(s.get("allocation.large_pool.peak"), Some(0));
        assert_eq!(s.get("allocated.all.current"), None);
    }
}
