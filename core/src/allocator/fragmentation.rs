//! Fragmentation accounting and the out-of-memory verdict's facts, counted
//! on demand from the block slots (one pass; nothing on the hot path).

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, Flags};
use crate::backend::DeviceBackend;
use crate::error::Error;
use crate::fragmentation::{Fragmentation, PoolMemory};
use crate::history::HistoryStorage;
use crate::invariants::{expect, InvariantViolation};
use crate::oom_cause::OomFacts;
use crate::pool::Pool;
use crate::private_pool::MempoolId;
use crate::stats::DeviceStats;

/// Count block `s` into `m`.
fn add_block(m: &mut PoolMemory, s: &BlockSlot) {
    if s.has(Flags::UNMAPPED) {
        m.unmapped_bytes += s.size;
        return;
    }
    m.reserved_bytes += s.size;
    if s.has(Flags::ALLOCATED) {
        m.allocated_bytes += s.size;
        m.requested_bytes += s.requested;
    } else if s.has(Flags::CACHED) {
        m.free_bytes += s.size;
        m.free_blocks += 1;
        m.largest_free_block = m.largest_free_block.max(s.size);
    } else {
        // Freed, waiting on events or parked by a capture.
        m.pending_free_bytes += s.size;
    }
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Every block, once.
    fn each_block(&self, mut f: impl FnMut(&BlockSlot)) {
        let slots = self.arena.slots();
        let used = slots
            .get(..self.arena.high_water() as usize)
            .unwrap_or(slots);
        for s in used.iter().filter(|s| s.has(Flags::IN_USE)) {
            f(s);
        }
    }

    /// The device's memory by pool, and what is cached for requests on
    /// `stream` and for other streams. One pass over the blocks.
    ///
    /// ```
    /// # use cachealloc_mock::MockDevice;
    /// use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
    /// let mut a = DeviceAllocator::new(MockDevice::new(None), [BlockSlot::VACANT; 16], Config::DEFAULT);
    /// let x = a.malloc(3 << 20, 0)?;
    /// let y = a.malloc(3 << 20, 0)?; // the same 20 MiB segment
    /// a.free(x.handle.unwrap())?;
    /// let f = a.fragmentation(0);
    /// assert_eq!(f.large_pool.free_bytes, 17 << 20);
    /// assert_eq!(f.large_pool.largest_free_block, 14 << 20);
    /// assert_eq!(f.other_streams_free_bytes, 0);
    /// # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
    /// ```
    pub fn fragmentation(&self, stream: B::Stream) -> Fragmentation {
        let stream: u64 = stream.into();
        let mut f = Fragmentation {
            stream,
            ..Fragmentation::default()
        };
        self.each_block(|s| {
            add_block(&mut f.device, s);
            let pool = match (s.owner, Pool::of(s.flags)) {
                (0, Pool::Small) => &mut f.small_pool,
                (0, Pool::Large) => &mut f.large_pool,
                _ => &mut f.private_pools,
            };
            add_block(pool, s);
            if s.owner == 0 && s.has(Flags::CACHED) {
                if s.stream == stream {
                    f.stream_free_bytes += s.size;
                } else {
                    f.other_streams_free_bytes += s.size;
                }
            }
        });
        f
    }

    /// The memory of one pool: `pool`'s blocks of the default pools
    /// ([`MempoolId::DEFAULT`]) or of private pool `id`.
    pub fn pool_memory(&self, id: MempoolId, pool: Pool) -> Res<PoolMemory, B> {
        let owner = if id.is_default() {
            0
        } else {
            self.private.owner_of(id).ok_or(Error::UnknownPool { id })?
        };
        let mut m = PoolMemory::default();
        self.each_block(|s| {
            if s.owner == owner && Pool::of(s.flags) == pool {
                add_block(&mut m, s);
            }
        });
        Ok(m)
    }

    /// What the out-of-memory verdict weighs for a request of `needed`
    /// bytes on `stream` for `pool`, served from `owner`'s pools.
    pub(super) fn oom_facts(&self, owner: u8, pool: Pool, stream: u64, needed: u64) -> OomFacts {
        let mut f = OomFacts {
            needed,
            ..OomFacts::default()
        };
        self.each_block(|s| {
            if s.has(Flags::UNMAPPED) {
                f.unmapped_bytes += s.size;
                return;
            }
            if s.has(Flags::ALLOCATED) {
                f.live_bytes += s.size;
                return;
            }
            // Each free byte is counted in one kind, the first that holds
            // it: another pool, the other block size (on any stream: such
            // a block never serves the request), another stream, then the
            // request's own pool and stream. Cached or pending alike but
            // on the request's own pool and stream, where the two differ.
            let cached = s.has(Flags::CACHED);
            if s.owner != owner {
                f.private_pools_bytes += s.size;
            } else if Pool::of(s.flags) != pool {
                f.other_size_bytes += s.size;
            } else if s.stream != stream {
                f.other_streams_bytes += s.size;
            } else if cached {
                f.free_bytes += s.size;
                f.largest_free_block = f.largest_free_block.max(s.size);
            } else {
                f.pending_free_bytes += s.size;
            }
        });
        f
    }
}

/// The invariant checker's part: `f`, counted from the blocks, agrees with
/// `recount` (the statistics recounted by the checker's walk) and adds up:
/// the pools make the device, and the default pools' free bytes are those
/// of the stream plus those of the others.
pub(crate) fn check_fragmentation(
    f: &Fragmentation,
    recount: &DeviceStats,
) -> Result<(), InvariantViolation> {
    let d = &f.device;
    expect(
        "fragmentation: reserved bytes == reserved_bytes",
        None,
        recount.reserved_bytes.all().current,
        d.reserved_bytes as i64,
    )?;
    expect(
        "fragmentation: allocated bytes == allocated_bytes",
        None,
        recount.allocated_bytes.all().current,
        d.allocated_bytes as i64,
    )?;
    expect(
        "fragmentation: pools add up to the device",
        None,
        d.reserved_bytes as i64,
        (f.small_pool.reserved_bytes + f.large_pool.reserved_bytes + f.private_pools.reserved_bytes)
            as i64,
    )?;
    expect(
        "fragmentation: the default pools' free bytes are the stream's and the others'",
        None,
        (f.small_pool.free_bytes + f.large_pool.free_bytes) as i64,
        (f.stream_free_bytes + f.other_streams_free_bytes) as i64,
    )
}
