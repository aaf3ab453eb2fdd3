//! Dispatch over backends: [`DeviceOps`], what the C functions ask of one
//! device's allocator, implemented once for the thread-safe
//! `CachingAllocator` over any backend, and [`open`], which makes device
//! `index` of the configured kind. Streams arrive as the C ABI's `void*`
//! (`cudaStream_t`) and become the backend's stream from the pointer's value
//! (the simulated device: the value itself; CUDA and HIP: the raw handle).

use crate::checkpoint::Restored;
use crate::error::{debug_hooks, mark_out_of_memory, Res};
use crate::observers::{FORWARD, TRACE_FORWARD};
use crate::segments;
use crate::settings::{BackendKind, Settings};
use crate::snapshot::add_device;
use crate::snapshot_walk::Walk;
use crate::stream_filter::{stream_filter, Filter};
use cachealloc_core::{
    Allocation, BlockSlot, CacheInfo, CachingAllocator, CheckpointBlock, DeviceAllocator,
    DeviceBackend, DevicePtr, DeviceStats, MallocFlags, MempoolId, PoolOptions, ShareableHandle,
    TraceActions, TraceEntry,
};
use cachealloc_trace::SnapshotDict;

/// Pending events a device can hold (frees of blocks used on other streams
/// waiting for them, and idle events kept for reuse).
pub(crate) const EVENTS: usize = 1024;

/// Private pools (CUDA graphs) a device can hold at once.
pub(crate) const POOLS: usize = 64;

/// One device's allocator, unlocked.
type Inner<B> = DeviceAllocator<B, Box<[BlockSlot]>, EVENTS, Box<[TraceEntry]>, POOLS>;

/// One device's allocator.
type Alloc<B> = CachingAllocator<B, Box<[BlockSlot]>, EVENTS, Box<[TraceEntry]>, POOLS>;

/// What the C functions ask of one device. Streams are raw handle values.
/// Every call fails on a device that a panic failed (its metadata may be
/// half-updated: `Error::DeviceFailed`).
pub(crate) trait DeviceOps: Send + Sync {
    /// Allocate; the address (0 for zero bytes).
    fn malloc(&self, size: u64, stream: u64) -> Res<u64>;
    /// Allocate at a multiple of `alignment` (a power of two).
    fn malloc_aligned(&self, size: u64, alignment: u64, stream: u64) -> Res<u64>;
    /// Free the allocation starting at `ptr`.
    fn free(&self, ptr: u64) -> Res<()>;
    /// `recordStream` of the allocation starting at `ptr`.
    fn record_stream(&self, ptr: u64, stream: u64) -> Res<()>;
    /// The segment holding `ptr`: base and size.
    fn base_allocation(&self, ptr: u64) -> Res<(u64, u64)>;
    /// `empty_cache`.
    fn empty_cache(&self) -> Res<()>;
    /// `set_per_process_memory_fraction`.
    fn set_memory_fraction(&self, fraction: f64) -> Res<()>;
    /// A copy of the statistics.
    fn stats(&self) -> Res<DeviceStats>;
    /// `reset_peak_memory_stats`.
    fn reset_peak_stats(&self) -> Res<()>;
    /// `reset_accumulated_memory_stats`.
    fn reset_accumulated_stats(&self) -> Res<()>;
    /// Cached bytes and the largest cached block.
    fn cache_info(&self) -> Res<CacheInfo>;
    /// `recordHistory` (`max_entries`: at most the storage; `clear`:
    /// empty it even when staying on; `skip`: actions left out).
    fn record_history(
        &self,
        enabled: bool,
        max_entries: usize,
        clear: bool,
        skip: TraceActions,
    ) -> Res<()>;
    /// The device's free and total memory (the backend's).
    fn mem_info(&self) -> Res<(u64, u64)>;
    /// `emptyCache(mempool_id)`: release one private pool's cached segments.
    fn empty_cache_pool(&self, id: MempoolId) -> Res<()>;
    /// A `user_defined` history entry with context `id`.
    fn record_annotation(&self, id: u64) -> Res<()>;
    /// `beginAllocateToPool` with the streams `filter` accepts routed (all
    /// with `None`), under the capture rules (no device call that could
    /// invalidate a capture).
    fn begin_allocate_to_pool(&self, id: MempoolId, filter: Option<Filter>) -> Res<()>;
    /// Attach the trace tracker that calls the C trackers.
    fn attach_trace_forward(&self) -> Res<()>;
    /// `endAllocateToPool`.
    fn end_allocate_to_pool(&self, id: MempoolId) -> Res<()>;
    /// `releasePool`.
    fn release_pool(&self, id: MempoolId) -> Res<()>;
    /// `createOrIncrefPool` (`MemPool()`), with its options.
    fn create_pool(&self, id: MempoolId, options: PoolOptions) -> Res<()>;
    /// `getPoolUseCount`.
    fn pool_use_count(&self, id: MempoolId) -> Res<u32>;
    /// `setUseOnOOM`.
    fn set_pool_use_on_oom(&self, id: MempoolId, on: bool) -> Res<()>;
    /// `setNoSplit`.
    fn set_pool_no_split(&self, id: MempoolId) -> Res<()>;
    /// `getCheckpointState`: every block of private pool `id`.
    fn checkpoint_pool(&self, id: MempoolId) -> Res<Vec<CheckpointBlock>>;
    /// `setCheckpointPoolState`: the pointers freed and the allocations
    /// made (address, size).
    fn restore_pool(&self, id: MempoolId, blocks: &[CheckpointBlock]) -> Res<Restored>;
    /// `shareIpcHandle` of the allocation starting at `ptr` (one more
    /// consumer until `release_ipc_share`).
    fn share_ipc_handle(&self, ptr: u64) -> Res<ShareableHandle>;
    /// `getIpcDevPtr` plus the offset: the shared allocation's address here.
    fn open_ipc_handle(&self, handle: &ShareableHandle) -> Res<u64>;
    /// One user of an opened handle is done.
    fn close_ipc_handle(&self, handle: &ShareableHandle) -> Res<()>;
    /// One consumer of a share of the allocation at `ptr` is done.
    fn release_ipc_share(&self, ptr: u64) -> Res<()>;
    /// `enablePeerAccess` from this device to `peer`.
    fn enable_peer_access(&self, peer: u32) -> Res<()>;
    /// Whether this device holds an expandable segment.
    fn has_expandable_segments(&self) -> Res<bool>;
    /// A device-to-device copy on `stream`: plain, or through the driver's
    /// peer copy (`peer`: the destination's and the source's devices).
    fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        stream: u64,
        peer: Option<(u32, u32)>,
    ) -> Res<()>;
    /// Take a snapshot as structures (the history with `traces`); with
    /// `record`, it records its `snapshot` entry.
    fn walk(&self, traces: bool, record: bool) -> Res<Walk>;
    /// Take a snapshot (it records its `snapshot` entry) into `dict`;
    /// `names[id - 1]` is annotation `id`'s name.
    fn snapshot(&self, dict: &mut SnapshotDict, names: &[String]) -> Res<()>;
}

/// `e` as the C library reports it.
fn text<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// An allocation's error as the C library reports it, an out-of-memory
/// marked as one (`cachealloc_last_error_code`).
fn alloc_error<E: std::fmt::Debug + std::fmt::Display>(e: cachealloc_core::Error<E>) -> String {
    if e.is_out_of_memory() {
        mark_out_of_memory();
    }
    e.to_string()
}

impl<B> DeviceOps for Alloc<B>
where
    B: DeviceBackend,
    Alloc<B>: Send + Sync,
{
    fn malloc(&self, size: u64, stream: u64) -> Res<u64> {
        let stream = B::Stream::from(stream);
        self.try_with(|a| {
            debug_hooks::inside_lock();
            a.with_growing_storage(|a| a.malloc(size, stream), twice)
        })
        .map(|a| a.ptr.0)
        .map_err(alloc_error)
    }

    fn malloc_aligned(&self, size: u64, alignment: u64, stream: u64) -> Res<u64> {
        let stream = B::Stream::from(stream);
        self.try_with(|a| {
            debug_hooks::inside_lock();
            a.with_growing_storage(
                |a| a.malloc_aligned(size, alignment, stream, MallocFlags::empty()),
                twice,
            )
        })
        .map(|a| a.ptr.0)
        .map_err(alloc_error)
    }

    fn free(&self, ptr: u64) -> Res<()> {
        self.try_with(|a| {
            debug_hooks::inside_lock();
            a.free_ptr(DevicePtr(ptr))
        })
        .map_err(text)
    }

    fn record_stream(&self, ptr: u64, stream: u64) -> Res<()> {
        self.record_stream_ptr(DevicePtr(ptr), B::Stream::from(stream))
            .map_err(text)
    }

    fn base_allocation(&self, ptr: u64) -> Res<(u64, u64)> {
        self.try_with(|a| a.base_allocation(DevicePtr(ptr)))
            .map(|(base, size)| (base.0, size))
            .map_err(text)
    }

    fn empty_cache(&self) -> Res<()> {
        self.try_with(|a| a.with_growing_storage(|a| a.empty_cache(), twice))
            .map_err(text)
    }

    fn set_memory_fraction(&self, fraction: f64) -> Res<()> {
        self.try_with(|a| a.set_memory_fraction(fraction))
            .map_err(text)
    }

    fn stats(&self) -> Res<DeviceStats> {
        CachingAllocator::stats(self).map_err(text)
    }

    fn reset_peak_stats(&self) -> Res<()> {
        self.with(|a| a.reset_peak_stats()).map_err(text)
    }

    fn reset_accumulated_stats(&self) -> Res<()> {
        self.with(|a| a.reset_accumulated_stats()).map_err(text)
    }

    fn cache_info(&self) -> Res<CacheInfo> {
        CachingAllocator::cache_info(self).map_err(text)
    }

    fn record_history(
        &self,
        enabled: bool,
        max_entries: usize,
        clear: bool,
        skip: TraceActions,
    ) -> Res<()> {
        self.with(|a| a.record_history(enabled, max_entries, clear, skip))
            .map_err(text)
    }

    fn mem_info(&self) -> Res<(u64, u64)> {
        self.with(|a| a.backend_mut().mem_info())
            .map_err(text)?
            .map(|m| (m.free, m.total))
            .map_err(|e| format!("memory info: {e}"))
    }

    fn empty_cache_pool(&self, id: MempoolId) -> Res<()> {
        self.try_with(|a| a.with_growing_storage(|a| a.empty_cache_pool(id), twice))
            .map_err(text)
    }

    fn record_annotation(&self, id: u64) -> Res<()> {
        self.with(|a| a.record_annotation(id)).map_err(text)
    }

    fn begin_allocate_to_pool(&self, id: MempoolId, filter: Option<Filter>) -> Res<()> {
        self.capture_begin(id, stream_filter(filter)).map_err(text)
    }

    fn attach_trace_forward(&self) -> Res<()> {
        self.with(|a| a.attach_trace_tracker(&TRACE_FORWARD))
            .map_err(text)?
            .map_err(|_| "the device has 4 trace trackers already".to_string())
    }

    fn end_allocate_to_pool(&self, id: MempoolId) -> Res<()> {
        CachingAllocator::end_allocate_to_pool(self, id).map_err(text)
    }

    fn release_pool(&self, id: MempoolId) -> Res<()> {
        CachingAllocator::release_pool(self, id).map_err(text)
    }

    fn create_pool(&self, id: MempoolId, options: PoolOptions) -> Res<()> {
        self.try_with(|a| a.create_pool(id, options)).map_err(text)
    }

    fn pool_use_count(&self, id: MempoolId) -> Res<u32> {
        self.with(|a| a.pool_use_count(id)).map_err(text)
    }

    fn set_pool_use_on_oom(&self, id: MempoolId, on: bool) -> Res<()> {
        self.try_with(|a| a.set_use_on_oom(id, on)).map_err(text)
    }

    fn checkpoint_pool(&self, id: MempoolId) -> Res<Vec<CheckpointBlock>> {
        self.try_with(|a| {
            let mut out = vec![CheckpointBlock::EMPTY; a.checkpoint_len(id)?];
            a.checkpoint_pool(id, &mut out).map(|b| b.to_vec())
        })
        .map_err(text)
    }

    fn restore_pool(&self, id: MempoolId, blocks: &[CheckpointBlock]) -> Res<Restored> {
        self.try_with(|a| {
            // Room: every block of the pool now may be a live allocation.
            let mut freed = vec![DevicePtr::NULL; a.checkpoint_len(id)?];
            let mut made = vec![Allocation::NULL; blocks.iter().filter(|b| b.allocated).count()];
            let n = a.restore_pool(id, blocks, &mut freed, &mut made)?;
            Ok(Restored {
                freed: freed[..n.freed].iter().map(|p| p.0).collect(),
                allocated: made[..n.allocated]
                    .iter()
                    .map(|m| (m.ptr.0, m.size))
                    .collect(),
            })
        })
        .map_err(text)
    }

    fn set_pool_no_split(&self, id: MempoolId) -> Res<()> {
        self.try_with(|a| a.set_no_split(id)).map_err(text)
    }

    fn share_ipc_handle(&self, ptr: u64) -> Res<ShareableHandle> {
        CachingAllocator::share_ipc_handle(self, DevicePtr(ptr)).map_err(text)
    }

    fn open_ipc_handle(&self, handle: &ShareableHandle) -> Res<u64> {
        CachingAllocator::open_ipc_handle(self, handle)
            .map(|p| p.0)
            .map_err(text)
    }

    fn close_ipc_handle(&self, handle: &ShareableHandle) -> Res<()> {
        CachingAllocator::close_ipc_handle(self, handle).map_err(text)
    }

    fn release_ipc_share(&self, ptr: u64) -> Res<()> {
        CachingAllocator::release_ipc_share(self, DevicePtr(ptr)).map_err(text)
    }

    fn enable_peer_access(&self, peer: u32) -> Res<()> {
        CachingAllocator::enable_peer_access(self, peer)
            .map(|_| ())
            .map_err(text)
    }

    fn has_expandable_segments(&self) -> Res<bool> {
        self.with(|a| a.has_expandable_segments()).map_err(text)
    }

    fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        stream: u64,
        peer: Option<(u32, u32)>,
    ) -> Res<()> {
        let stream = B::Stream::from(stream);
        self.try_with(|a| match peer {
            None => a.memcpy_async(DevicePtr(dst), DevicePtr(src), bytes, stream),
            Some((dd, sd)) => {
                a.memcpy_peer_async(DevicePtr(dst), dd, DevicePtr(src), sd, bytes, stream)
            }
        })
        .map_err(text)
    }

    fn walk(&self, traces: bool, record: bool) -> Res<Walk> {
        self.with(|a| {
            if record {
                Walk::of(a.snapshot(), traces)
            } else {
                Walk::of_parts(a.backend().ordinal(), a.segments(), None)
            }
        })
        .map_err(text)
    }

    fn snapshot(&self, dict: &mut SnapshotDict, names: &[String]) -> Res<()> {
        self.with(|a| add_device(dict, a.snapshot(), names))
            .map_err(text)
    }
}

/// Twice the slots of a storage that has `capacity`.
fn twice(capacity: u32) -> Box<[BlockSlot]> {
    vec![BlockSlot::VACANT; (capacity as usize).max(1) * 2].into_boxed_slice()
}

/// Address space between two simulated devices (their segments must not
/// overlap: pointers are routed to the device that owns them).
const MOCK_DEVICE_SPAN: u64 = 1 << 40;

/// The simulated machine every simulated device of the process joins, so
/// an IPC handle of one device opens on another.
fn mock_machine() -> &'static cachealloc_mock::MockMachine {
    static MACHINE: std::sync::OnceLock<cachealloc_mock::MockMachine> = std::sync::OnceLock::new();
    MACHINE.get_or_init(cachealloc_mock::MockMachine::new)
}

/// Open device `index` of the configured kind, with its allocator.
pub(crate) fn open(s: &Settings, index: u32) -> Res<Box<dyn DeviceOps>> {
    match s.backend {
        BackendKind::Mock => {
            let base = cachealloc_mock::DEVICE_BASE + u64::from(index) * MOCK_DEVICE_SPAN;
            let device = cachealloc_mock::MockDevice::new(s.mock_capacity)
                .with_ordinal(index)
                .with_base(base)
                .with_machine(mock_machine());
            Ok(allocator(s, device, index))
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let device = cachealloc_cuda::CudaBackend::new(index).map_err(|e| e.to_string())?;
            Ok(allocator(s, device, index))
        }
        #[cfg(feature = "hip")]
        BackendKind::Hip => {
            let device = cachealloc_hip::HipBackend::new(index).map_err(|e| e.to_string())?;
            Ok(allocator(s, device, index))
        }
    }
}

/// The allocator of `backend` as device `index` (about 70 KiB, most of it
/// the event queue), boxed, with the out-of-memory forwarder attached and
/// its segments kept in the process's segment map.
fn allocator<B>(s: &Settings, backend: B, index: u32) -> Box<dyn DeviceOps>
where
    B: DeviceBackend + 'static,
    Alloc<B>: Send + Sync,
{
    let slots = vec![BlockSlot::VACANT; s.slots].into_boxed_slice();
    let history = vec![TraceEntry::EMPTY; s.history].into_boxed_slice();
    let mut inner = Inner::<B>::with_events_and_history(backend, slots, history, s.config);
    // A fresh allocator has room for 4 observers: this cannot be refused.
    let _ = inner.attach_out_of_memory_observer(&FORWARD);
    // A fresh allocator holds no segment: nothing to refuse.
    let _ = inner.attach_segment_registry(segments::map(), index);
    Box::new(CachingAllocator::new(inner))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachealloc_core::Config;

    /// A device that starts with 8 slots serves 2,000 live blocks: its
    /// storage doubles as they run out, and everything frees cleanly.
    #[test]
    fn slots_grow_as_blocks_need_them() {
        let s = Settings {
            backend: BackendKind::Mock,
            conf_text: String::new(),
            conf_c: Default::default(),
            config: Config::DEFAULT,
            mock_capacity: None,
            slots: 8,
            history: 0,
        };
        let d = open(&s, 5).expect("a simulated device");
        let ptrs: Vec<u64> = (0..2000u64)
            .map(|k| d.malloc(512 * (1 + k % 100), 0).expect("room grows"))
            .collect();
        assert_eq!(d.stats().unwrap().allocation.all().current, 2000);
        for p in ptrs {
            d.free(p).expect("free");
        }
        d.empty_cache().expect("empty_cache");
        assert_eq!(d.stats().unwrap().reserved_bytes.all().current, 0);
    }
}
