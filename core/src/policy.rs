//! PyTorch's sizing policy as pure functions of a [`Config`] and sizes.
//!
//! ```
//! use cachealloc_core::{policy, Config};
//! let c = Config::DEFAULT;
//! assert_eq!(policy::round_size(1, &c), Some(512));
//! assert_eq!(policy::allocation_size(512), Some(2 << 20));
//! assert_eq!(policy::allocation_size((10 << 20) + 512), Some(12 << 20));
//! ```

use crate::config::Config;
pub use crate::pool::Pool;
use core::fmt;

/// Every size is rounded up to a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// The largest rounded size served by the small pool (`kSmallSize`, 1 MiB).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size for small requests (`kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for requests in (1 MiB, 10 MiB) (`kLargeBuffer`, 20 MiB).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Requests of at least this get a segment of their own (`kMinLargeAlloc`, 10 MiB).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Granularity of those segments (`kRoundLarge`, 2 MiB).
pub const ROUND_LARGE: u64 = 2 << 20;
/// Number of `roundup_power2_divisions` buckets (1 MiB .. 32 GiB and above).
pub const ROUNDUP_INTERVALS: usize = 16;
/// Requests of this size or more are refused before the allocator (1 EiB).
pub const ONE_EIB: u64 = 1 << 60;

/// Which pool serves a rounded size (`get_pool`: `<= 1 MiB` is small).
#[inline]
pub const fn pool_for(rounded: u64) -> Pool {
    if rounded <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The `roundup_power2_divisions` bucket of a size: `floor(log2(size)) - 20`,
/// clamped to `0..16`.
#[inline]
pub const fn division_bucket(size: u64) -> usize {
    if size == 0 {
        return 0;
    }
    let log = 63 - size.leading_zeros() as i64;
    let idx = log - 20;
    if idx < 0 {
        0
    } else if idx as usize >= ROUNDUP_INTERVALS {
        ROUNDUP_INTERVALS - 1
    } else {
        idx as usize
    }
}

/// `roundup_power2_next_division`: round `size` up to the next of
/// `divisions` equal steps between two powers of two. `None` on overflow.
#[inline]
pub fn roundup_power2_next_division(size: u64, divisions: u32) -> Option<u64> {
    if size.is_power_of_two() || divisions < 2 {
        return Some(size);
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (31 - divisions.leading_zeros());
    if step == 0 {
        return floor.checked_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        Some(size)
    } else {
        down.checked_add(step)
    }
}

/// `round_size`: the block size a request of `size` bytes needs. `None` when
/// rounding overflows.
#[inline]
pub fn round_size(size: u64, config: &Config) -> Option<u64> {
    let d = config.divisions_for(size);
    if d > 1 && size > MIN_BLOCK_SIZE * d as u64 {
        return roundup_power2_next_division(size, d);
    }
    round_size_plain(size)
}

/// [`round_size`] when no interval rounds to divisions.
#[inline]
pub fn round_size_plain(size: u64) -> Option<u64> {
    if size < MIN_BLOCK_SIZE {
        return Some(MIN_BLOCK_SIZE);
    }
    round_up(size, MIN_BLOCK_SIZE)
}

/// `get_allocation_size`: the device malloc size of a new segment for a
/// rounded request, with the default large segment size. `None` on overflow.
#[inline]
pub fn allocation_size(rounded: u64) -> Option<u64> {
    allocation_size_with(rounded, LARGE_BUFFER)
}

/// `get_allocation_size` with `large_segment_size_mb` in bytes: the
/// segment size for requests of 1 to 10 MiB.
#[inline]
pub fn allocation_size_with(rounded: u64, large_segment: u64) -> Option<u64> {
    if rounded <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if rounded < MIN_LARGE_ALLOC {
        Some(large_segment)
    } else {
        round_up(rounded, ROUND_LARGE)
    }
}

/// `should_split`: whether handing `block_size` bytes to a request of
/// `rounded` bytes splits off the remainder. Small pool, or any pool with
/// expandable segments on: at least 512 bytes would remain. Large pool: the
/// request is not oversize and more than 1 MiB would remain.
#[inline]
pub fn should_split(pool: Pool, block_size: u64, rounded: u64, config: &Config) -> bool {
    should_split_as(pool, block_size, rounded, config, config.maps_pages())
}

/// [`should_split`] with whether the request counts as one of expandable
/// segments given (PyTorch's `is_expandable_segments_active`, false for a
/// pool with an allocator of its own whatever the config says).
#[inline]
pub fn should_split_as(
    pool: Pool,
    block_size: u64,
    rounded: u64,
    config: &Config,
    expandable: bool,
) -> bool {
    let remaining = block_size.saturating_sub(rounded);
    match pool {
        Pool::Small => remaining >= MIN_BLOCK_SIZE,
        Pool::Large if expandable => remaining >= MIN_BLOCK_SIZE,
        Pool::Large => rounded < config.max_split_size && remaining > SMALL_SIZE,
    }
}

/// `size` rounded up to a multiple of `to` (a power of two), or `None`.
#[inline]
pub const fn round_up(size: u64, to: u64) -> Option<u64> {
    match size.checked_add(to - 1) {
        Some(v) => Some(v & !(to - 1)),
        None => None,
    }
}

/// PyTorch's `format_size`: "N bytes" up to 1 KiB, then KiB / MiB / GiB with
/// two decimals (so exactly 1 MiB prints "1024.00 KiB").
///
/// ```
/// use cachealloc_core::policy::FormatSize;
/// assert_eq!(format!("{}", FormatSize(2 << 20)), "2.00 MiB");
/// assert_eq!(format!("{}", FormatSize(1024)), "1024 bytes");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct FormatSize(pub u64);

impl fmt::Display for FormatSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n <= 1024 {
            write!(f, "{} bytes", n)
        } else if n <= 1 << 20 {
            write!(f, "{:.2} KiB", n as f64 / 1024.0)
        } else if n <= 1 << 30 {
            write!(f, "{:.2} MiB", n as f64 / 1048576.0)
        } else {
            write!(f, "{:.2} GiB", n as f64 / 1073741824.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_examples_from_the_spec() {
        let c = Config::DEFAULT;
        assert_eq!(round_size(0, &c), Some(512));
        assert_eq!(round_size(513, &c), Some(1024));
        let c4 = Config::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(round_size(1200, &c4), Some(1536));
        assert_eq!(round_size(4097, &c4), Some(5120));
        assert_eq!(round_size((1 << 20) + 1, &c4), Some(1310720));
        assert_eq!(round_size(88080384, &c4), Some(100663296));
        assert_eq!(round_size(8 << 20, &c4), Some(8 << 20));
        assert_eq!(allocation_size((10 << 20) - 512), Some(20 << 20));
        assert_eq!(allocation_size(10 << 20), Some(10 << 20));
        assert_eq!(round_size(u64::MAX, &c), None);
    }

    #[test]
    fn rounding_is_monotone_and_covers() {
        let c = Config::parse("roundup_power2_divisions:[1:2,4:8,>:4]").unwrap();
        let mut prev = 0;
        let mut x = 1u64;
        while x < 1 << 40 {
            let r = round_size(x, &c).unwrap();
            assert!(r >= x && r.is_multiple_of(512) && r >= prev, "{x} -> {r}");
            prev = r;
            x = x + x / 7 + 1;
        }
    }
}
