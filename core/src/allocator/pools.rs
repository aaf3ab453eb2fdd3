//! The private-pool API (PyTorch's `CUDAAllocator` pool calls):
//! `create_pool` (`createOrIncrefPool`, `MemPool()`), routing
//! (`begin_allocate_to_pool` / `end_allocate_to_pool`), captures
//! (`capture_begin` / `capture_end`: routing plus PyTorch's capture rules),
//! `release_pool`, `empty_cache_pool` (`emptyCache(mempool_id)`), use counts,
//! options and `check_pool_live_allocations`.
//!
//! One deliberate difference: PyTorch's `beginAllocateToPool` adds to the
//! use count before it checks that the pool is not already routed to, and
//! does not undo it when that check throws; here a refused call changes
//! nothing.

use super::{DeviceAllocator, Res};
use crate::arena::BlockSlot;
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::private_pool::{MempoolId, PoolInfo, PoolOptions, Route, SegmentSource, StreamFilter};

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// The owner number of private pool `id`.
    fn owner(&self, id: MempoolId) -> Res<u8, B> {
        if id.is_default() {
            return Err(Error::UnknownPool { id });
        }
        self.private.owner_of(id).ok_or(Error::UnknownPool { id })
    }

    /// `createOrIncrefPool`: a new pool with use count 1 (`torch.cuda.MemPool`),
    /// or one more user of an existing one; `options` are switched on
    /// (`setUseOnOOM`, `setNoSplit`). A freeable pool (use count 0) cannot be
    /// revived.
    ///
    /// ```
    /// # use cachealloc_mock::MockDevice;
    /// use cachealloc_core::{BlockSlot, Config, DeviceAllocator, MempoolId, PoolOptions, StreamFilter};
    /// let mut a = DeviceAllocator::new(MockDevice::new(None), [BlockSlot::VACANT; 16], Config::DEFAULT);
    /// let pool = MempoolId(0, 1);
    /// a.create_pool(pool, PoolOptions::NONE)?;               // MemPool()
    /// a.begin_allocate_to_pool(pool, StreamFilter::All)?;    // with use_mem_pool(pool):
    /// let x = a.malloc(1000, 0)?;
    /// a.end_allocate_to_pool(pool)?;
    /// a.release_pool(pool)?;
    /// assert_eq!(a.allocation_info(x.handle.unwrap())?.pool, pool);
    /// assert_eq!(a.pool_use_count(pool), 1);
    /// # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
    /// ```
    pub fn create_pool(&mut self, id: MempoolId, options: PoolOptions) -> Res<(), B> {
        let owner = self.create_or_incref(id)?;
        if let Some(p) = self.private.get_mut(owner) {
            p.options.use_on_oom |= options.use_on_oom;
            p.options.no_split |= options.no_split;
        }
        Ok(())
    }

    /// `createOrIncrefPool(id, allocator)` (`torch.cuda.MemPool(allocator=...)`):
    /// a new pool with use count 1 whose segments come from `source`
    /// instead of the device (see [`SegmentSource`] for the rules such a
    /// pool follows). The pool must not exist ([`Error::PoolExists`]).
    ///
    /// ```
    /// # use cachealloc_mock::MockDevice;
    /// use cachealloc_core::{BlockSlot, Config, DevicePtr, DeviceAllocator, MempoolId};
    /// use cachealloc_core::{PoolOptions, SegmentSource, StreamFilter};
    /// fn alloc(_: usize, _size: u64, _: u64) -> Option<DevicePtr> { Some(DevicePtr(1 << 44)) }
    /// fn free(_: usize, _: DevicePtr, _: u64, _: u64) {}
    /// let mut a = DeviceAllocator::new(MockDevice::new(None), [BlockSlot::VACANT; 16], Config::DEFAULT);
    /// let pool = MempoolId(0, 1);
    /// a.create_pool_with_source(pool, PoolOptions::NONE, SegmentSource::new(alloc, free, 0))?;
    /// a.begin_allocate_to_pool(pool, StreamFilter::All)?;
    /// let x = a.malloc(1000, 0)?;
    /// a.end_allocate_to_pool(pool)?;
    /// assert_eq!(x.ptr, DevicePtr(1 << 44));
    /// assert!(a.pool_info(pool).unwrap().has_source);
    /// # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
    /// ```
    pub fn create_pool_with_source(
        &mut self,
        id: MempoolId,
        options: PoolOptions,
        source: SegmentSource,
    ) -> Res<(), B> {
        if id.is_default() {
            return Err(Error::UnknownPool { id });
        }
        if self.private.owner_of(id).is_some() {
            return Err(Error::PoolExists { id });
        }
        self.private
            .create(id, options, Some(source))
            .ok_or(Error::PoolTableFull {
                capacity: self.private.capacity(),
            })?;
        self.arm_drop();
        Ok(())
    }

    fn create_or_incref(&mut self, id: MempoolId) -> Res<u8, B> {
        if id.is_default() {
            return Err(Error::UnknownPool { id });
        }
        if let Some(owner) = self.private.owner_of(id) {
            let p = self
                .private
                .get_mut(owner)
                .ok_or(Error::UnknownPool { id })?;
            if p.use_count == 0 {
                return Err(Error::PoolFreeable { id });
            }
            p.use_count += 1;
            return Ok(owner);
        }
        self.private
            .create(id, PoolOptions::NONE, None)
            .ok_or(Error::PoolTableFull {
                capacity: self.private.capacity(),
            })
    }

    /// `beginAllocateToPool(id, filter)`: create the pool (or add a user),
    /// and route requests on the streams `filter` accepts to it until
    /// [`end_allocate_to_pool`](Self::end_allocate_to_pool). The newest
    /// routing wins where filters overlap.
    pub fn begin_allocate_to_pool(
        &mut self,
        id: MempoolId,
        filter: StreamFilter<B::Stream>,
    ) -> Res<(), B> {
        self.begin(id, filter, false)
    }

    /// `CUDAGraph::capture_begin`: [`begin_allocate_to_pool`](Self::begin_allocate_to_pool)
    /// plus a capture under way on the device, to be called before the
    /// runtime begins capturing (and [`capture_end`](Self::capture_end)
    /// after it ended). Until then the allocator makes no device call that
    /// could invalidate a capture (docs/capture-notes.md): no event is
    /// queried or recorded (frees of blocks that other streams used wait
    /// for the capture to end), no rung of the ladder gives memory back,
    /// `empty_cache` does nothing, and the backend is told
    /// ([`DeviceBackend::set_capture_underway`]) so that it makes its device
    /// mallocs and page maps in relaxed capture mode.
    ///
    /// With `graph_capture_record_stream_reuse:True` a backend that cannot
    /// read capture graphs ([`DeviceBackend::CAPTURE_GRAPH`]) is refused
    /// here, before anything changes.
    pub fn capture_begin(&mut self, id: MempoolId, filter: StreamFilter<B::Stream>) -> Res<(), B> {
        if self.config.graph_capture_record_stream_reuse && !B::CAPTURE_GRAPH {
            return Err(Error::Unsupported {
                what: "graph_capture_record_stream_reuse:True (reading the capture graph)",
                backend: B::NAME,
            });
        }
        self.begin(id, filter, true)
    }

    fn begin(
        &mut self,
        id: MempoolId,
        filter: StreamFilter<B::Stream>,
        capture: bool,
    ) -> Res<(), B> {
        if self.routes.iter().any(|r| r.id == id) {
            return Err(Error::AlreadyRouting { id });
        }
        if self.routes.is_full() {
            return Err(Error::PoolTableFull {
                capacity: self.private.capacity(),
            });
        }
        let owner = self.create_or_incref(id)?;
        let route = Route {
            id,
            owner,
            filter,
            capture,
        };
        if self.routes.push(route).is_err() {
            return Err(Error::PoolTableFull {
                capacity: self.private.capacity(),
            });
        }
        if capture {
            self.captures += 1;
            if self.captures == 1 {
                self.backend.set_capture_underway(true);
            }
        }
        Ok(())
    }

    /// PyTorch's `beginAllocateToPool(id, filter)` as the selected torch
    /// release treats it: torch 2.11 and 2.12 take any routing for a
    /// capture (their `malloc` skips the cache flush and its retry while a
    /// pool is routed to: [`capture_begin`](Self::capture_begin)); from
    /// 2.13, whose `CUDAGraph::capture_begin` marks the capture apart
    /// ([`mark_capture_begin`](Self::mark_capture_begin)), a routing
    /// alone (`use_mem_pool`) is no capture: the flush runs, and the pool's
    /// allocator is asked again ([`begin_allocate_to_pool`](Self::begin_allocate_to_pool)).
    pub fn begin_allocate_to_pool_torch(
        &mut self,
        id: MempoolId,
        filter: StreamFilter<B::Stream>,
    ) -> Res<(), B> {
        if self.config.torch_version().decisions_of() >= crate::TorchVersion::V2_13 {
            self.begin_allocate_to_pool(id, filter)
        } else {
            self.capture_begin(id, filter)
        }
    }

    /// PyTorch's `markCaptureBegin(device)` (torch 2.13 on, from
    /// `CUDAGraph::capture_begin`): a capture is under way on the device
    /// (marks nest) until [`mark_capture_end`](Self::mark_capture_end),
    /// whatever is routed where: what tells a graph's capture from a
    /// routing alone (`use_mem_pool`), at every place torch asks
    /// `is_capture_context` (the ladder's flush, frees, `empty_cache`,
    /// `record_stream`, ...).
    pub fn mark_capture_begin(&mut self) {
        self.marked_captures += 1;
        self.captures += 1;
        if self.captures == 1 {
            self.backend.set_capture_underway(true);
        }
    }

    /// PyTorch's `markCaptureEnd(device)`: the marked capture is over.
    /// [`Error::NoCaptureMarked`] when none is.
    pub fn mark_capture_end(&mut self) -> Res<(), B> {
        if self.marked_captures == 0 {
            return Err(Error::NoCaptureMarked);
        }
        self.marked_captures -= 1;
        self.captures -= 1;
        if self.captures == 0 {
            self.backend.set_capture_underway(false);
            self.give_back_later_ones();
        }
        Ok(())
    }

    /// `endAllocateToPool(id)`: stop routing to the pool (its use count is
    /// unchanged). Ends the capture too if it was one.
    pub fn end_allocate_to_pool(&mut self, id: MempoolId) -> Res<(), B> {
        let k = self
            .routes
            .iter()
            .position(|r| r.id == id)
            .ok_or(Error::NotRouting { id })?;
        let r = self.routes.remove(k);
        if r.capture {
            self.captures -= 1;
            if self.captures == 0 {
                self.backend.set_capture_underway(false);
                self.give_back_later_ones();
            }
        }
        Ok(())
    }

    /// `CUDAGraph::capture_end`: the capture into pool `id` is over and
    /// routing to it ends.
    pub fn capture_end(&mut self, id: MempoolId) -> Res<(), B> {
        if !self.routes.iter().any(|r| r.id == id && r.capture) {
            return Err(Error::NotRouting { id });
        }
        self.end_allocate_to_pool(id)
    }

    /// `releasePool(id)`: one user less; at 0 the pool is freeable, and the
    /// next `empty_cache` (or [`empty_cache_pool`](Self::empty_cache_pool))
    /// returns its whole free segments and deletes it once it has none.
    /// Frees nothing itself.
    pub fn release_pool(&mut self, id: MempoolId) -> Res<(), B> {
        let owner = self.owner(id)?;
        let p = self
            .private
            .get_mut(owner)
            .ok_or(Error::UnknownPool { id })?;
        if p.use_count == 0 {
            return Err(Error::PoolFreeable { id });
        }
        p.use_count -= 1;
        Ok(())
    }

    /// `getPoolUseCount(id)`: its users; 0 for a freeable pool or one that
    /// does not exist.
    pub fn pool_use_count(&self, id: MempoolId) -> u32 {
        self.private
            .owner_of(id)
            .and_then(|o| self.private.get(o))
            .map_or(0, |p| p.use_count)
    }

    /// `setUseOnOOM(id, on)`.
    pub fn set_use_on_oom(&mut self, id: MempoolId, on: bool) -> Res<(), B> {
        let owner = self.owner(id)?;
        if let Some(p) = self.private.get_mut(owner) {
            p.options.use_on_oom = on;
        }
        Ok(())
    }

    /// `setNoSplit(id)`.
    pub fn set_no_split(&mut self, id: MempoolId) -> Res<(), B> {
        let owner = self.owner(id)?;
        if let Some(p) = self.private.get_mut(owner) {
            p.options.no_split = true;
        }
        Ok(())
    }

    /// PyTorch's `emptyCache(mempool_id)` (called by `~MemPool`): for the
    /// default id, [`empty_cache`](Self::empty_cache); for a freeable pool,
    /// wait for its blocks' events (one `num_sync_all_streams`), return its
    /// whole free segments and delete it if none is left; for a pool in use,
    /// or one that does not exist, nothing; nothing either while a capture
    /// is under way (as [`empty_cache`](Self::empty_cache)).
    pub fn empty_cache_pool(&mut self, id: MempoolId) -> Res<(), B> {
        if id.is_default() {
            return self.empty_cache();
        }
        let Some(owner) = self.private.owner_of(id) else {
            return Ok(());
        };
        if self.private.get(owner).is_none_or(|p| p.use_count > 0) {
            return Ok(());
        }
        if self.capturing() {
            // PyTorch asserts here; the pool stays freeable, and the next
            // `empty_cache` after the capture returns it.
            return Ok(());
        }
        self.synchronize_and_free_events(Some(owner))?;
        self.release_pool_segments(owner)
    }

    /// `checkPoolLiveAllocations(id, ptrs)`: whether the allocated blocks
    /// of pool `id` are exactly those at `ptrs` (order and repeats aside).
    pub fn check_pool_live_allocations(&self, id: MempoolId, ptrs: &[DevicePtr]) -> Res<bool, B> {
        self.owner(id)?;
        let mut live = 0usize;
        for seg in self.segments().filter(|s| s.pool_id == id) {
            for b in seg.blocks() {
                if b.state == crate::snapshot::BlockState::ActiveAllocated {
                    live += 1;
                    if !ptrs.contains(&b.address) {
                        return Ok(false);
                    }
                }
            }
        }
        let mut distinct = 0usize;
        for (k, p) in ptrs.iter().enumerate() {
            if !ptrs[..k].contains(p) {
                distinct += 1;
            }
        }
        Ok(live == distinct)
    }

    /// The pool `id` now, if it exists.
    pub fn pool_info(&self, id: MempoolId) -> Option<PoolInfo> {
        let owner = self.private.owner_of(id)?;
        Some(self.private.get(owner)?.info())
    }

    /// Every private pool that exists, in table order.
    pub fn pools(&self) -> impl Iterator<Item = PoolInfo> + '_ {
        self.private.iter().map(|(_, p)| p.info())
    }

    /// The id of the pool owner `owner` stands for.
    pub(crate) fn pool_id_of(&self, owner: u8) -> MempoolId {
        self.private.get(owner).map_or(MempoolId::DEFAULT, |p| p.id)
    }
}
