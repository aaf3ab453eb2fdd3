//! The operation table: every operation a front end asks of one device's
//! allocator, written once. From it come [`SharedAllocator`]'s methods and
//! their implementation (`shared.rs`), the C functions of the operations
//! whose C shape is plain (`cachealloc-capi`'s `shims.rs`), and
//! [`OPERATIONS`], the list the tests and `scripts/surfaces.py` read.
//! Adding an entry adds the operation to every one of them.
//!
//! An entry, one brace block:
//!
//! ```text
//! {
//!     /// The method's documentation.
//!     LOCK fn NAME(ARG: TYPE, ...) -> RESULT = |a| BODY;
//!     /// The C function's documentation (it goes to the header).
//!     c SHAPE C_NAME(C_ARG: C_TYPE, ...) on DEVICE(EXPR) => (ARG_EXPR, ...);
//!     by_hand C_NAME, ...;
//! }
//! ```
//!
//! - `LOCK` is how the call takes the device's lock: `with` (`BODY` cannot
//!   fail), `try_with` (`BODY` is a result) or `try_growing` (a result;
//!   with storage growth, a call that ran out of block slots grows them and
//!   runs again). `BODY` has the locked `DeviceAllocator` as `a`; types
//!   say `Self::Stream` for the backend's stream.
//! - `c` clauses (none, one or more) are generated C functions: `SHAPE` is
//!   `status` (returns 0 or -1), `void` (the error only in
//!   `cachealloc_last_error()`, as PyTorch's hooks) or `value(T, FAILED)`
//!   (the result as `T`, `FAILED` on failure); `DEVICE` is `device` (one
//!   device by its index), `each` (one, or with -1 every device created so
//!   far) or `owner` (the device whose segment holds an address). They are
//!   read in the C library, where `c_int`, `c_void`, `MempoolId`,
//!   `DevicePtr`, `PoolOptions` and `StreamFilter` are in scope.
//! - `by_hand` names the operation's C functions whose shape is special
//!   (out-pointers, strings, callbacks, several devices): they are written
//!   in `capi/src`, and a test checks that the header has them.
//!
//! Operations outside the table, written by hand in `shared.rs`:
//! `is_failed` and `check_invariants` (no lock's result: they answer for a
//! failed device too).

/// One operation of the table.
#[derive(Clone, Copy, Debug)]
pub struct Operation {
    /// The [`SharedAllocator`](crate::SharedAllocator) method.
    pub name: &'static str,
    /// How it takes the lock: `with`, `try_with` or `try_growing`.
    pub lock: &'static str,
    /// Its generated C functions.
    pub c: &'static [CFunction],
    /// Its C functions written by hand.
    pub by_hand: &'static [&'static str],
}

/// A generated C function of an [`Operation`].
#[derive(Clone, Copy, Debug)]
pub struct CFunction {
    /// The C name.
    pub name: &'static str,
    /// Its parameters as Rust writes them (`device: c_int, id0: u64`).
    pub params: &'static str,
    /// Its result as Rust writes it (`c_int`; empty for none).
    pub result: &'static str,
    /// Its documentation, one `///` line each.
    pub docs: &'static [&'static str],
}

/// Every operation of the table, in its order.
pub const OPERATIONS: &[Operation] = crate::operations!([list]);

/// The operation table. `[declare]`: the trait's methods; `[define]`:
/// their implementation for `CachingAllocator`; `[list]`: [`OPERATIONS`];
/// `[c_shims SHIM]`: `SHIM! { ... }` for each `c` clause.
#[doc(hidden)]
#[macro_export]
macro_rules! operations {
    ($mode:tt) => { $crate::operation_entries! { $mode

    // -- allocation ------------------------------------------------------

    {
        /// [`DeviceAllocator::malloc`].
        try_growing fn malloc(size: u64, stream: Self::Stream) -> Allocation
            = |a| a.malloc(size, stream);
        by_hand cachealloc_alloc, cachealloc_pluggable_alloc;
    }
    {
        /// [`DeviceAllocator::malloc_with`].
        try_growing fn malloc_with(size: u64, stream: Self::Stream, flags: MallocFlags) -> Allocation
            = |a| a.malloc_with(size, stream, flags);
    }
    {
        /// [`DeviceAllocator::malloc_aligned`].
        try_growing fn malloc_aligned(size: u64, alignment: u64, stream: Self::Stream, flags: MallocFlags)
            -> Allocation = |a| a.malloc_aligned(size, alignment, stream, flags);
        by_hand cachealloc_alloc_aligned;
    }
    {
        /// [`DeviceAllocator::malloc_with_address`].
        try_growing fn malloc_with_address(size: u64, addr: DevicePtr, stream: Self::Stream)
            -> Allocation = |a| a.malloc_with_address(size, addr, stream);
        by_hand cachealloc_alloc_at;
    }
    {
        /// [`DeviceAllocator::free`].
        try_with fn free(id: BlockId) -> () = |a| a.free(id);
    }
    {
        /// [`DeviceAllocator::free_ptr`].
        try_with fn free_ptr(ptr: DevicePtr) -> () = |a| a.free_ptr(ptr);
        by_hand cachealloc_free, cachealloc_free_checked;
    }
    {
        /// [`DeviceAllocator::record_stream`].
        try_with fn record_stream(id: BlockId, stream: Self::Stream) -> ()
            = |a| a.record_stream(id, stream);
    }
    {
        /// [`DeviceAllocator::record_stream_ptr`].
        try_with fn record_stream_ptr(ptr: DevicePtr, stream: Self::Stream) -> ()
            = |a| a.record_stream_ptr(ptr, stream);
        by_hand cachealloc_record_stream;
    }
    {
        /// [`DeviceAllocator::allocation_info`].
        try_with fn allocation_info(id: BlockId) -> AllocationInfo<Self::Stream>
            = |a| a.allocation_info(id);
    }
    {
        /// [`DeviceAllocator::allocation_info_ptr`].
        try_with fn allocation_info_ptr(ptr: DevicePtr) -> AllocationInfo<Self::Stream>
            = |a| a.allocation_info_ptr(ptr);
    }
    {
        /// [`DeviceAllocator::base_allocation`].
        try_with fn base_allocation(ptr: DevicePtr) -> (DevicePtr, u64)
            = |a| a.base_allocation(ptr);
        by_hand cachealloc_base_alloc;
    }
    {
        /// Whether `ptr` lies in a segment of this device (under its lock; a
        /// [`SegmentRegistry`] answers without it).
        with fn owns(ptr: DevicePtr) -> bool = |a| a.owns(ptr);
    }

    // -- the cache and the device ---------------------------------------

    {
        /// [`DeviceAllocator::empty_cache`].
        try_growing fn empty_cache() -> () = |a| a.empty_cache();
        /// `torch.cuda.empty_cache()` for `device`, or for every device created so
        /// far with -1: wait for the frees pending on other streams, then return
        /// every cached segment that is entirely free to the device. Returns 0, or
        /// -1 (with -1, after trying every device).
        c status cachealloc_empty_cache(device: c_int) on each(device) => ();
        /// PyTorch's `reset` hook (`set_reset_fn`, called by
        /// `torch.cuda.empty_cache()`): `empty_cache` on every device created so
        /// far (`cachealloc_empty_cache(-1)`).
        c void cachealloc_reset() on each(-1) => ();
    }
    {
        /// [`DeviceAllocator::cache_info`].
        with fn cache_info() -> CacheInfo = |a| a.cache_info();
        by_hand cachealloc_cache_info;
    }
    {
        /// [`DeviceAllocator::fragmentation`].
        with fn fragmentation(stream: Self::Stream) -> Fragmentation = |a| a.fragmentation(stream);
        by_hand cachealloc_get_fragmentation;
    }
    {
        /// [`DeviceAllocator::last_oom_cause`]: the device's, whichever thread
        /// ran out (an out-of-memory observer is told its own).
        with fn last_oom_cause() -> Option<OomCause> = |a| a.last_oom_cause();
    }
    {
        /// [`DeviceAllocator::oom_cause`]: the verdict on out-of-memory number
        /// `seq` of the device (a failed call's, by its error's number).
        with fn oom_cause(seq: u32) -> Option<OomCause> = |a| a.oom_cause(seq);
        by_hand cachealloc_last_oom_cause;
    }
    {
        /// [`DeviceAllocator::pool_memory`].
        try_with fn pool_memory(id: MempoolId, pool: Pool) -> PoolMemory
            = |a| a.pool_memory(id, pool);
        by_hand cachealloc_get_pool_memory;
    }
    {
        /// [`DeviceAllocator::set_memory_fraction`].
        try_with fn set_memory_fraction(fraction: f64) -> () = |a| a.set_memory_fraction(fraction);
        /// PyTorch's `memory_fraction` hook (`set_memory_fraction_fn`,
        /// `torch.cuda.set_per_process_memory_fraction`): from now on no new
        /// segment may take `device`'s reserved memory above `fraction` (0 to 1) of
        /// its total memory. Errors go to `cachealloc_last_error()`.
        c void cachealloc_set_memory_fraction(fraction: f64, device: c_int) on device(device)
            => (fraction);
    }
    {
        /// [`DeviceAllocator::set_memory_limit`] (`None`:
        /// [`clear_memory_limit`](DeviceAllocator::clear_memory_limit)).
        with fn set_memory_limit(bytes: Option<u64>) -> () = |a| match bytes {
            Some(b) => a.set_memory_limit(b),
            None => a.clear_memory_limit(),
        };
    }
    {
        /// [`DeviceAllocator::memory_limit`].
        with fn memory_limit() -> Option<u64> = |a| a.memory_limit();
    }
    {
        /// [`DeviceAllocator::memory_fraction`].
        try_with fn memory_fraction() -> f64 = |a| a.memory_fraction();
        /// The memory fraction of `device` (PyTorch's `getMemoryFraction`,
        /// `torch.cuda.get_per_process_memory_fraction`): its memory limit over its
        /// total memory, 1.0 when none is set, whichever front end set it
        /// (`cachealloc_set_memory_fraction`, torch, the settings). Returns -1.0 on
        /// failure (the reason in `cachealloc_last_error()`).
        c value(f64, -1.0) cachealloc_get_memory_fraction(device: c_int) on device(device) => ();
    }
    {
        /// The device's free and total memory, from the backend.
        try_with fn mem_info() -> MemInfo = |a| a.backend_mut().mem_info().map_err(Error::Backend);
        by_hand cachealloc_mem_get_info;
    }
    {
        /// The device's ordinal.
        with fn ordinal() -> u32 = |a| a.backend().ordinal();
    }
    {
        /// [`DeviceAllocator::set_config`]: a later settings string's
        /// settings, with torch's rules for the keys it leaves out
        /// ([`Config::followed_by`]).
        with fn set_config(config: Config) -> () = |a| a.set_config(config);
        by_hand cachealloc_set_allocator_settings;
    }
    {
        /// [`DeviceAllocator::has_expandable_segments`].
        with fn has_expandable_segments() -> bool = |a| a.has_expandable_segments();
    }

    // -- statistics ------------------------------------------------------

    {
        /// A copy of the statistics (the lock is held only for the copy).
        with fn stats() -> DeviceStats = |a| *a.stats();
        by_hand cachealloc_memory_stats, cachealloc_get_device_stats;
    }
    {
        /// [`DeviceAllocator::reset_peak_stats`].
        with fn reset_peak_stats() -> () = |a| a.reset_peak_stats();
        /// `torch.cuda.reset_peak_memory_stats(device)`: every peak becomes its
        /// current value. Returns 0, or -1.
        c status cachealloc_reset_peak_stats(device: c_int) on device(device) => ();
    }
    {
        /// [`DeviceAllocator::reset_peak_allocated_bytes`].
        with fn reset_peak_allocated_bytes() -> () = |a| a.reset_peak_allocated_bytes();
    }
    {
        /// [`DeviceAllocator::reset_accumulated_stats`].
        with fn reset_accumulated_stats() -> () = |a| a.reset_accumulated_stats();
        /// `torch.cuda.reset_accumulated_memory_stats(device)`: the accumulated
        /// counts (`allocated`, `freed`, `num_alloc_retries`, `num_ooms`, ...)
        /// become 0. Returns 0, or -1.
        c status cachealloc_reset_accumulated_stats(device: c_int) on device(device) => ();
    }
    {
        /// [`DeviceAllocator::reserved_bytes_by_private_pools`] (`f` runs under
        /// the lock).
        with fn reserved_bytes_by_private_pools(f: &mut dyn FnMut(MempoolId, &StatArray)) -> ()
            = |a| a.reserved_bytes_by_private_pools(|id, s| f(id, s));
        by_hand cachealloc_pool_reserved_stats;
    }

    // -- history, observers, snapshots -----------------------------------

    {
        /// [`DeviceAllocator::record_history`].
        with fn record_history(enabled: bool, max_entries: usize, clear: bool, skip: TraceActions)
            -> () = |a| a.record_history(enabled, max_entries, clear, skip);
        by_hand cachealloc_record_history, cachealloc_record_history_ex;
    }
    {
        /// [`DeviceAllocator::record_annotation`].
        with fn record_annotation(id: u64) -> () = |a| a.record_annotation(id);
        by_hand cachealloc_record_annotation;
    }
    {
        /// [`DeviceAllocator::attach_trace_tracker`]: [`Error::CallbacksFull`]
        /// when the device has as many trackers as it holds.
        try_with fn attach_trace_tracker(tracker: &'static dyn TraceTracker) -> ()
            = |a| a.attach_trace_tracker(tracker).map_err(|_| callbacks_full("trace trackers"));
        by_hand cachealloc_attach_trace_tracker;
    }
    {
        /// [`DeviceAllocator::attach_out_of_memory_observer`]:
        /// [`Error::CallbacksFull`] when the device has as many observers as it
        /// holds. Observers are called after the device's lock is released.
        try_with fn attach_out_of_memory_observer(observer: &'static dyn OutOfMemoryObserver) -> ()
            = |a| a.attach_out_of_memory_observer(observer)
                .map_err(|_| callbacks_full("out-of-memory observers"));
    }
    {
        /// [`DeviceAllocator::snapshot`] (it records its `snapshot` entry),
        /// given to `f` under the lock.
        with fn snapshot(f: &mut dyn FnMut(Snapshot<'_, Self::Stream>)) -> ()
            = |a| f(a.snapshot());
        by_hand cachealloc_snapshot, cachealloc_snapshot_walk;
    }
    {
        /// [`DeviceAllocator::segments`] (nothing recorded), given to `f` under
        /// the lock with the device's ordinal.
        with fn segments(f: &mut dyn FnMut(u32, Segments<'_, Self::Stream>)) -> ()
            = |a| f(a.backend().ordinal(), a.segments());
    }

    // -- private pools (CUDA graphs, MemPool) -----------------------------

    {
        /// [`DeviceAllocator::create_pool`].
        try_with fn create_pool(id: MempoolId, options: PoolOptions) -> ()
            = |a| a.create_pool(id, options);
        /// `torch.cuda.MemPool()` (PyTorch's `createOrIncrefPool`): create private
        /// pool `(id0, id1)` of `device` with one user, or add a user to it; a
        /// nonzero `use_on_oom` lets a default-pool request that would fail take a
        /// free block of it, a nonzero `no_split` never splits its blocks. Nothing
        /// is routed to it (`cachealloc_begin_allocate_to_pool_filtered` does
        /// that); `cachealloc_release_pool` takes the user away. Returns 0, or -1
        /// (the id `(0, 0)`, a pool with no users left, too many pools).
        c status cachealloc_create_pool(device: c_int, id0: u64, id1: u64, use_on_oom: c_int,
            no_split: c_int) on device(device) => (MempoolId(id0, id1), {
                let mut options = PoolOptions::NONE;
                options.use_on_oom = use_on_oom != 0;
                options.no_split = no_split != 0;
                options
            });
    }
    {
        /// [`DeviceAllocator::create_pool_with_source`].
        try_with fn create_pool_with_source(id: MempoolId, options: PoolOptions, source: SegmentSource)
            -> () = |a| a.create_pool_with_source(id, options, source);
        by_hand cachealloc_create_pool_with_source;
    }
    {
        /// [`DeviceAllocator::begin_allocate_to_pool`]: from now on, requests
        /// on the streams `filter` accepts (from any thread) go to pool `id`.
        try_with fn begin_allocate_to_pool(id: MempoolId, filter: StreamFilter<Self::Stream>) -> ()
            = |a| a.begin_allocate_to_pool(id, filter);
    }
    {
        /// [`DeviceAllocator::end_allocate_to_pool`].
        try_with fn end_allocate_to_pool(id: MempoolId) -> () = |a| a.end_allocate_to_pool(id);
        /// PyTorch's `end_allocate_to_pool` hook (`set_end_allocate_to_pool_fn`):
        /// stop sending `device`'s requests to pool `(id0, id1)`. The pool's
        /// `MempoolId_t` (a `std::pair` of two `unsigned long long`, passed by
        /// value) arrives as the two integers. Errors (not routing to that pool) go
        /// to `cachealloc_last_error()`.
        c void cachealloc_end_allocate_to_pool(device: c_int, id0: u64, id1: u64)
            on device(device) => (MempoolId(id0, id1));
    }
    {
        /// [`DeviceAllocator::capture_begin`].
        try_with fn capture_begin(id: MempoolId, filter: StreamFilter<Self::Stream>) -> ()
            = |a| a.capture_begin(id, filter);
        /// PyTorch's `begin_allocate_to_pool` hook (`set_begin_allocate_to_pool`,
        /// called by CUDA graph capture and `_cuda_beginAllocateToPool`): create
        /// private pool `(id0, id1)` (or add a user to it) and send `device`'s
        /// requests to it until `cachealloc_end_allocate_to_pool`.
        ///
        /// `filter` is PyTorch's `std::function<bool(cudaStream_t)>`, passed as a
        /// pointer that C cannot call: it is ignored, and every stream of the
        /// device is routed to the pool while it is active (an all-streams filter).
        /// Until `cachealloc_end_allocate_to_pool` the device is treated as
        /// capturing (PyTorch calls this before `cudaStreamBeginCapture` and the end
        /// after `cudaStreamEndCapture`): the library makes no driver call that
        /// could invalidate a capture (no event query or record, no device free, no
        /// synchronization; a freed block that other streams used waits for the
        /// end), and makes its device mallocs and page maps in relaxed capture
        /// mode.
        /// Errors (already routing to this pool, too many pools) go to
        /// `cachealloc_last_error()`.
        c void cachealloc_begin_allocate_to_pool(device: c_int, id0: u64, id1: u64,
            filter: *const c_void) on device(device) => (MempoolId(id0, id1), StreamFilter::All);
    }
    {
        /// [`DeviceAllocator::begin_allocate_to_pool_torch`].
        try_with fn begin_allocate_to_pool_torch(id: MempoolId, filter: StreamFilter<Self::Stream>)
            -> () = |a| a.begin_allocate_to_pool_torch(id, filter);
        by_hand cachealloc_begin_allocate_to_pool_filtered;
    }
    {
        /// [`DeviceAllocator::mark_capture_begin`].
        with fn mark_capture_begin() -> () = |a| a.mark_capture_begin();
        /// PyTorch's `markCaptureBegin` (torch 2.13 on, called by
        /// `CUDAGraph::capture_begin` on `device`): a capture is under way on
        /// the device until `cachealloc_mark_capture_end` (marks nest). With
        /// `cachealloc_begin_allocate_to_pool_filtered`, what tells a graph's
        /// capture from a routing alone (`torch.cuda.use_mem_pool`) under torch
        /// 2.13 and later. Returns 0, or -1.
        c status cachealloc_mark_capture_begin(device: c_int) on device(device) => ();
    }
    {
        /// [`DeviceAllocator::mark_capture_end`].
        try_with fn mark_capture_end() -> () = |a| a.mark_capture_end();
        /// PyTorch's `markCaptureEnd`: the capture `cachealloc_mark_capture_begin`
        /// marked on `device` is over. Returns 0, or -1 (none is marked).
        c status cachealloc_mark_capture_end(device: c_int) on device(device) => ();
    }
    {
        /// [`DeviceAllocator::capture_end`].
        try_with fn capture_end(id: MempoolId) -> () = |a| a.capture_end(id);
    }
    {
        /// [`DeviceAllocator::release_pool`].
        try_with fn release_pool(id: MempoolId) -> () = |a| a.release_pool(id);
        /// PyTorch's `release_pool` hook (`set_release_pool`, `CUDAGraph::reset`):
        /// one user less of pool `(id0, id1)`; once it has none, the next
        /// `empty_cache` returns its memory and deletes it. Errors go to
        /// `cachealloc_last_error()`.
        c void cachealloc_release_pool(device: c_int, id0: u64, id1: u64) on device(device)
            => (MempoolId(id0, id1));
    }
    {
        /// [`DeviceAllocator::pool_use_count`].
        with fn pool_use_count(id: MempoolId) -> u32 = |a| a.pool_use_count(id);
        /// The users of private pool `(id0, id1)` of `device` (PyTorch's
        /// `getPoolUseCount`): 0 for a pool with none left or none at all; -1 on
        /// failure (a bad device).
        c value(i64, -1) cachealloc_pool_use_count(device: c_int, id0: u64, id1: u64)
            on device(device) => (MempoolId(id0, id1));
    }
    {
        /// [`DeviceAllocator::pool_info`].
        with fn pool_info(id: MempoolId) -> Option<PoolInfo> = |a| a.pool_info(id);
    }
    {
        /// [`DeviceAllocator::set_use_on_oom`].
        try_with fn set_use_on_oom(id: MempoolId, on: bool) -> () = |a| a.set_use_on_oom(id, on);
        /// PyTorch's `setUseOnOOM`: whether a default-pool request that would fail
        /// may take a free block of pool `(id0, id1)`. Returns 0, or -1 (no such
        /// pool).
        c status cachealloc_set_pool_use_on_oom(device: c_int, id0: u64, id1: u64,
            use_on_oom: c_int) on device(device) => (MempoolId(id0, id1), use_on_oom != 0);
    }
    {
        /// [`DeviceAllocator::set_no_split`].
        try_with fn set_no_split(id: MempoolId) -> () = |a| a.set_no_split(id);
        /// PyTorch's `setNoSplit`: blocks of pool `(id0, id1)` are never split from
        /// now on. Returns 0, or -1 (no such pool).
        c status cachealloc_set_pool_no_split(device: c_int, id0: u64, id1: u64)
            on device(device) => (MempoolId(id0, id1));
    }
    {
        /// [`DeviceAllocator::empty_cache_pool`].
        try_growing fn empty_cache_pool(id: MempoolId) -> () = |a| a.empty_cache_pool(id);
        /// `torch.cuda.empty_cache()` for one private pool (PyTorch's
        /// `emptyCache(mempool_id)`, which `MemPool`'s destructor calls): return
        /// the cached segments of pool `(id0, id1)` of `device` (-1: of every
        /// device created so far) that are entirely free; the pool `(0, 0)` is the
        /// default pools (`cachealloc_empty_cache`). Returns 0, or -1.
        c status cachealloc_empty_cache_pool(device: c_int, id0: u64, id1: u64) on each(device)
            => (MempoolId(id0, id1));
    }
    {
        /// [`DeviceAllocator::check_pool_live_allocations`].
        try_with fn check_pool_live_allocations(id: MempoolId, ptrs: &[DevicePtr]) -> bool
            = |a| a.check_pool_live_allocations(id, ptrs);
    }
    {
        /// [`DeviceAllocator::checkpoint_len`].
        try_with fn checkpoint_len(id: MempoolId) -> usize = |a| a.checkpoint_len(id);
    }
    {
        /// [`DeviceAllocator::checkpoint_pool`]: how many blocks of `out` it
        /// filled.
        try_with fn checkpoint_pool(id: MempoolId, out: &mut [CheckpointBlock]) -> usize
            = |a| a.checkpoint_pool(id, out).map(|b| b.len());
        by_hand cachealloc_checkpoint_pool;
    }
    {
        /// [`DeviceAllocator::restore_pool`].
        try_with fn restore_pool(id: MempoolId, blocks: &[CheckpointBlock], freed: &mut [DevicePtr],
            allocated: &mut [Allocation]) -> RestoreCounts
            = |a| a.restore_pool(id, blocks, freed, allocated);
        by_hand cachealloc_restore_pool;
    }

    // -- IPC, peers, copies -----------------------------------------------

    {
        /// [`DeviceAllocator::share_ipc_handle`].
        try_with fn share_ipc_handle(ptr: DevicePtr) -> ShareableHandle
            = |a| a.share_ipc_handle(ptr);
        by_hand cachealloc_share_ipc_handle;
    }
    {
        /// [`DeviceAllocator::release_ipc_share`].
        try_with fn release_ipc_share(ptr: DevicePtr) -> () = |a| a.release_ipc_share(ptr);
        /// One consumer of a share of the allocation at `ptr` is done with it (it
        /// closed the handle). The last release of an allocation its owner has
        /// freed frees it. Returns 0, or -1 (no share outstanding).
        c status cachealloc_release_ipc_share(ptr: *mut c_void) on owner(ptr as usize as u64)
            => (DevicePtr(ptr as usize as u64));
    }
    {
        /// [`DeviceAllocator::open_ipc_handle`].
        try_with fn open_ipc_handle(handle: &ShareableHandle) -> DevicePtr
            = |a| a.open_ipc_handle(handle);
        by_hand cachealloc_open_ipc_handle;
    }
    {
        /// [`DeviceAllocator::close_ipc_handle`].
        try_with fn close_ipc_handle(handle: &ShareableHandle) -> () = |a| a.close_ipc_handle(handle);
        by_hand cachealloc_close_ipc_handle;
    }
    {
        /// [`DeviceAllocator::share_ipc_pages`].
        try_with fn share_ipc_pages(ptr: DevicePtr, fds: &mut [i32]) -> PagesShare
            = |a| a.share_ipc_pages(ptr, fds);
        by_hand cachealloc_share_ipc_pages;
    }
    {
        /// [`DeviceAllocator::open_ipc_pages`].
        try_with fn open_ipc_pages(pid: u32, share: &PagesShare, fds: &[i32]) -> DevicePtr
            = |a| a.open_ipc_pages(pid, share, fds);
        by_hand cachealloc_open_ipc_pages;
    }
    {
        /// [`DeviceAllocator::close_ipc_pages`].
        try_with fn close_ipc_pages(pid: u32, share: &PagesShare, fds: &[i32]) -> ()
            = |a| a.close_ipc_pages(pid, share, fds);
        by_hand cachealloc_close_ipc_pages;
    }
    {
        /// [`DeviceAllocator::enable_peer_access`].
        try_with fn enable_peer_access(peer: u32) -> PeerAccess = |a| a.enable_peer_access(peer);
        by_hand cachealloc_enable_peer_access;
    }
    {
        /// A device-to-device copy of `bytes` on `stream`: plain
        /// ([`DeviceAllocator::memcpy_async`]), or through the driver's peer
        /// copy with `peer` = the destination's and the source's devices
        /// ([`DeviceAllocator::memcpy_peer_async`]).
        try_with fn memcpy_async(dst: DevicePtr, src: DevicePtr, bytes: u64, stream: Self::Stream,
            peer: Option<(u32, u32)>) -> () = |a| match peer {
            None => a.memcpy_async(dst, src, bytes, stream),
            Some((dd, sd)) => a.memcpy_peer_async(dst, dd, src, sd, bytes, stream),
        };
        by_hand cachealloc_memcpy_async;
    }

    // -- the device's place in a process ----------------------------------

    {
        /// [`DeviceAllocator::attach_segment_registry`].
        try_with fn attach_segment_registry(registry: &'static dyn SegmentRegistry, device: u32) -> ()
            = |a| a.attach_segment_registry(registry, device);
    }
    {
        /// [`DeviceAllocator::detach_segment_registry`].
        with fn detach_segment_registry() -> () = |a| a.detach_segment_registry();
    }

    } };
}

/// The operation table's entries, each one brace block, handed one by one
/// to [`operation!`](crate::operation) (or, for `[list]`, as an array).
#[doc(hidden)]
#[macro_export]
macro_rules! operation_entries {
    ([list] $({ $($entry:tt)* })*) => { &[ $( $crate::operation! { [list] $($entry)* } ),* ] };
    ($mode:tt $({ $($entry:tt)* })*) => { $( $crate::operation! { $mode $($entry)* } )* };
}

/// One entry of the operation table in one mode (see [`operations!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! operation {
    ([declare] $(#[$doc:meta])* $lock:ident fn $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty
        = |$a:ident| $body:expr; $($c:tt)*) => {
        $(#[$doc])*
        fn $name(&self, $($arg: $ty),*) -> $crate::SharedResult<$ret, Self::BackendError>;
    };
    ([define] $(#[$doc:meta])* $lock:ident fn $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty
        = |$a:ident| $body:expr; $($c:tt)*) => {
        #[inline]
        fn $name(&self, $($arg: $ty),*) -> $crate::SharedResult<$ret, Self::BackendError> {
            self.$lock(|$a| $body)
        }
    };
    ([list] $(#[$doc:meta])* $lock:ident fn $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty
        = |$a:ident| $body:expr;
        $( $(#[doc = $cdoc:literal])* c $shape:ident $(($rt:ty, $failed:expr))?
            $cname:ident ($($carg:ident: $cty:ty),*) on $sel:ident($dev:expr) => ($($call:expr),*); )*
        $( by_hand $($hand:ident),+; )?) => {
        $crate::Operation {
            name: stringify!($name),
            lock: stringify!($lock),
            c: &[ $( $crate::CFunction {
                name: stringify!($cname),
                params: stringify!($($carg: $cty),*),
                result: $crate::c_result!($shape $(($rt))?),
                docs: &[$($cdoc),*],
            } ),* ],
            by_hand: &[ $($(stringify!($hand)),+)? ],
        }
    };
    ([c_shims $shim:ident] $(#[$doc:meta])* $lock:ident fn $name:ident ($($arg:ident: $ty:ty),*)
        -> $ret:ty = |$a:ident| $body:expr;
        $( $(#[doc = $cdoc:literal])* c $shape:ident $(($rt:ty, $failed:expr))?
            $cname:ident ($($carg:ident: $cty:ty),*) on $sel:ident($dev:expr) => ($($call:expr),*); )*
        $( by_hand $($hand:ident),+; )?) => {
        $( $shim! {
            $(#[doc = $cdoc])* $shape $(($rt, $failed))? $cname($($carg: $cty),*)
            on $sel($dev) => $name($($call),*)
        } )*
    };
}

/// A generated C function's result type as Rust writes it.
#[doc(hidden)]
#[macro_export]
macro_rules! c_result {
    (status) => {
        "c_int"
    };
    (void) => {
        ""
    };
    (value($t:ty)) => {
        stringify!($t)
    };
}
