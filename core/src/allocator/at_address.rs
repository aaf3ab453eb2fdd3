//! `malloc_with_address`: PyTorch's `mallocWithAddress` (torch 2.13 on,
//! behind `allocateWithAddress` and `UntypedStorage._resize_with_addr_`),
//! which rebuilds a storage at the address it had (an optimizer's CUDA
//! graph keeps its gradients at fixed addresses). It serves a request only
//! from the free block of the request's stream and pool that holds the
//! address with room for the rounded size; it never asks the device for
//! memory and never runs the ladder.
//!
//! PyTorch's steps, kept for their statistics and trace: the free block's
//! low end up to the address (the prefix) is allocated first, split off
//! whatever the split rules say; then the request takes the block at the
//! address, split by the usual rules; then the prefix is freed (merging
//! with a free block before it). The peaks see prefix and request live
//! together, and the history has `alloc` (prefix), `alloc` (request),
//! `free_requested` and `free_completed` (prefix).

use super::{DeviceAllocator, Res};
use crate::allocation::Allocation;
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::policy;
use crate::pool::Pool;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// PyTorch's `mallocWithAddress(size, stream, addr)`: `size` bytes for
    /// `stream` starting exactly at `addr`, carved out of the free block
    /// that holds it (at its start, in its middle, or at its end with room
    /// enough). The request goes to the pool `malloc` would pick (the
    /// routing, then small or large by the rounded size), and only that
    /// pool's free blocks of the same stream are looked at.
    ///
    /// Errors, with nothing changed: [`Error::UnalignedAddress`] (`addr`
    /// not a multiple of 512, PyTorch's `TORCH_CHECK`), and
    /// [`Error::NoFreeBlockAt`] for every other miss (inside a live block,
    /// outside every segment, an unmapped page, another stream's or another
    /// pool's block, too little room: PyTorch's "Could not allocate CUDA
    /// storage at exact address"). Zero bytes give [`Allocation::NULL`].
    ///
    /// ```
    /// # use cachealloc_mock::MockDevice;
    /// use cachealloc_core::{BlockSlot, Config, DeviceAllocator, DevicePtr};
    /// let mut a = DeviceAllocator::new(MockDevice::new(None), [BlockSlot::VACANT; 16], Config::DEFAULT);
    /// let x = a.malloc(4 << 20, 0)?;                // a 20 MiB segment
    /// a.free(x.handle.unwrap())?;
    /// let at = DevicePtr(x.ptr.0 + (6 << 20));
    /// let y = a.malloc_with_address(3 << 20, at, 0)?;
    /// assert_eq!(y.ptr, at);
    /// assert_eq!(a.stats().allocated_bytes.all().peak, 9 << 20); // prefix and request
    /// assert!(a.malloc_with_address(512, at, 0).is_err()); // live now
    /// # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
    /// ```
    pub fn malloc_with_address(
        &mut self,
        size: u64,
        addr: DevicePtr,
        stream: B::Stream,
    ) -> Res<Allocation, B> {
        if !addr.0.is_multiple_of(policy::MIN_BLOCK_SIZE) {
            return Err(Error::UnalignedAddress { ptr: addr });
        }
        if size == 0 {
            return Ok(Allocation::NULL);
        }
        if size >= policy::ONE_EIB {
            return Err(Error::TooLarge {
                requested: size,
                platform: B::PLATFORM,
            });
        }
        self.reserve_slots()?;
        self.settle_before_request(stream)?;
        let rounded = self.rounded(size)?;
        let pool = policy::pool_for(rounded);
        let owner = self.route(stream);
        let skey: u64 = stream.into();
        let b = self.free_block_holding(addr.0, rounded, skey, owner, pool);
        if b == NIL {
            return Err(Error::NoFreeBlockAt {
                ptr: addr,
                size: rounded,
            });
        }
        let prefix = addr.0 - self.slot(b).addr;
        // Out of the free index before each carve: the block is not the
        // smallest that fits, so `carve` may not re-key it in place.
        self.cache_remove(b);
        let (target, prefix_block) = if prefix > 0 {
            // The prefix is split off whatever the split rules say.
            let p = self.carve(b, prefix, prefix, pool, true);
            let rest = self.slot(b).next;
            self.cache_remove(rest);
            (rest, p.handle.map(|h| h.index()))
        } else {
            (b, None)
        };
        let split = self.wants_split(target, rounded, pool);
        let x = self.carve(target, size, rounded, pool, split);
        if let Some(p) = prefix_block {
            self.free_slot(p)?;
        }
        Ok(x)
    }

    /// The cached (free, mapped) block of owner `owner`'s `pool` on stream
    /// `skey` that holds `addr` with at least `size` bytes from there to its
    /// end; `NIL` if none.
    fn free_block_holding(&self, addr: u64, size: u64, skey: u64, owner: u8, pool: Pool) -> u32 {
        let slots = self.arena.slots();
        let head = self.segments.floor(slots, addr);
        if head == NIL || slots[head as usize].end_of_segment() <= addr {
            return NIL;
        }
        let mut b = head;
        while b != NIL {
            let s = &slots[b as usize];
            if s.addr <= addr && addr < s.addr.saturating_add(s.size) {
                let fits = s.has(Flags::CACHED)
                    && s.stream == skey
                    && s.owner == owner
                    && Pool::of(s.flags) == pool
                    && s.size - (addr - s.addr) >= size;
                return if fits { b } else { NIL };
            }
            b = s.next;
        }
        NIL
    }
}
