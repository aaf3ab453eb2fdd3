//! The backends: [`Device`], one device's thread-safe allocator over the
//! configured backend, which every C function reaches through
//! [`SharedAllocator`] ([`on_device!`]), and [`open`], which makes device
//! `index` of the configured kind. Streams arrive as the C ABI's `void*`
//! (`cudaStream_t`) and become the backend's stream from the pointer's value
//! (the simulated device: the value itself; CUDA and HIP: the raw handle).

use crate::error::{mark_out_of_memory, Res};
use crate::forward::FORWARD;
use crate::segments;
use crate::settings::{BackendKind, Settings};
use cachealloc_core::{BlockSlot, CachingAllocator, DeviceAllocator, DeviceBackend, TraceEntry};

/// Pending events a device can hold (frees of blocks used on other streams
/// waiting for them, and idle events kept for reuse).
pub(crate) const EVENTS: usize = 1024;

/// Private pools (CUDA graphs) a device can hold at once.
pub(crate) const POOLS: usize = 64;

/// One device's allocator, unlocked.
type Inner<B> = DeviceAllocator<B, Box<[BlockSlot]>, EVENTS, Box<[TraceEntry]>, POOLS>;

/// One device's allocator: every C function reaches it through
/// [`SharedAllocator`](cachealloc_core::SharedAllocator).
pub(crate) type Alloc<B> = CachingAllocator<B, Box<[BlockSlot]>, EVENTS, Box<[TraceEntry]>, POOLS>;

/// One device's allocator, of the backend the settings chose. An enum, not
/// a `dyn`: each backend has its own stream and error types, and a C
/// function's body is written once for all of them ([`on_device!`]).
pub(crate) enum Device {
    /// The simulated device.
    Mock(Box<Alloc<cachealloc_mock::MockDevice>>),
    /// An NVIDIA GPU.
    #[cfg(feature = "cuda")]
    Cuda(Box<Alloc<cachealloc_cuda::CudaBackend>>),
    /// An AMD GPU.
    #[cfg(feature = "hip")]
    Hip(Box<Alloc<cachealloc_hip::HipBackend>>),
}

/// Run `$body` with `$a` bound to the device's allocator, whatever its
/// backend: `on_device!(device, |a| a.empty_cache().map_err(text))`.
/// Streams arrive as raw handle values: `stream.into()` makes the
/// backend's.
macro_rules! on_device {
    ($device:expr, |$a:ident| $body:expr) => {
        match $device {
            // The simulated device's streams are `u64`s already.
            #[allow(clippy::useless_conversion)]
            $crate::backend::Device::Mock($a) => $body,
            #[cfg(feature = "cuda")]
            $crate::backend::Device::Cuda($a) => $body,
            #[cfg(feature = "hip")]
            $crate::backend::Device::Hip($a) => $body,
        }
    };
}
pub(crate) use on_device;

/// `e` as the C library reports it.
pub(crate) fn text<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// An allocation's error on device `a` as the C library reports it, an
/// out-of-memory marked as one (`cachealloc_last_error_code`) with its
/// verdict, which the device keeps under the error's number (once the
/// call returned: observers that ran out of memory meanwhile, or other
/// threads, have numbers of their own).
pub(crate) fn alloc_error<A: cachealloc_core::SharedAllocator>(
    a: &A,
    e: cachealloc_core::Error<A::BackendError>,
) -> String {
    match &e {
        cachealloc_core::Error::OutOfMemory(r) => {
            mark_out_of_memory();
            let cause = a.oom_cause(r.seq).ok().flatten();
            crate::oom_cause::explained(r, cause)
        }
        _ if e.is_out_of_memory() => {
            // Refused before the allocator (1 EiB or more): no verdict, and
            // not the one of an earlier out-of-memory.
            mark_out_of_memory();
            crate::oom_cause::forget();
            e.to_string()
        }
        _ => e.to_string(),
    }
}

/// The test hook `cachealloc_debug_fail_inside_lock` (feature
/// `debug-hooks`; nothing without it): when this thread armed it, panic
/// inside the device's lock (which fails the device).
#[inline(always)]
pub(crate) fn debug_inside_lock<B>(a: &Alloc<B>)
where
    B: DeviceBackend,
{
    #[cfg(feature = "debug-hooks")]
    if crate::debug_hooks::armed() {
        let _ = a.with(|_| crate::debug_hooks::inside_lock());
    }
    #[cfg(not(feature = "debug-hooks"))]
    let _ = a;
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
pub(crate) fn open(s: &Settings, index: u32) -> Res<Device> {
    match crate::settings::backend_kind(s)? {
        BackendKind::Mock => {
            let base = cachealloc_mock::DEVICE_BASE + u64::from(index) * MOCK_DEVICE_SPAN;
            let device = cachealloc_mock::MockDevice::new(s.mock_capacity)
                .with_ordinal(index)
                .with_base(base)
                .with_machine(mock_machine());
            Ok(Device::Mock(allocator(s, device, index)?))
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let device = cachealloc_cuda::CudaBackend::new(index).map_err(|e| e.to_string())?;
            Ok(Device::Cuda(allocator(s, device, index)?))
        }
        #[cfg(feature = "hip")]
        BackendKind::Hip => {
            let device = cachealloc_hip::HipBackend::new(index).map_err(|e| e.to_string())?;
            Ok(Device::Hip(allocator(s, device, index)?))
        }
    }
}

/// Stack for building a device's allocator: it is built by value and moved
/// a few times, which takes several times its size of stack (more in a
/// debug build); room for that with a wide margin.
const OPEN_STACK: usize = 16 << 20;

/// The allocator of `backend` as device `index`, built on a thread of its
/// own with room for it ([`OPEN_STACK`]; address space, committed only as
/// it is touched): the caller's thread may have a small stack (musl's 128
/// KiB, a runtime's pool threads), which building it there would overflow,
/// killing the process. Where no thread can be started, it is built here.
fn allocator<B>(s: &Settings, backend: B, index: u32) -> Res<Box<Alloc<B>>>
where
    B: DeviceBackend + Send,
    Alloc<B>: Send,
{
    let backend = std::sync::Mutex::new(Some(backend));
    let take = || backend.lock().unwrap_or_else(|p| p.into_inner()).take();
    let built = std::thread::scope(|scope| {
        let helper = std::thread::Builder::new()
            .name("cachealloc-open".to_string())
            .stack_size(OPEN_STACK)
            .spawn_scoped(scope, || take().map(|b| build(s, b, index)));
        match helper.map(|h| h.join()) {
            Ok(Ok(built)) => built,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => None,
        }
    });
    // The backend went to one of the two, which built it (a panic there
    // was passed on): never None.
    built
        .or_else(|| take().map(|b| build(s, b, index)))
        .ok_or_else(|| format!("device {index}: its allocator could not be built"))
}

/// The allocator of `backend` as device `index` (about 230 KiB), boxed,
/// with the out-of-memory forwarder attached and its segments kept in the
/// process's segment table.
fn build<B>(s: &Settings, backend: B, index: u32) -> Box<Alloc<B>>
where
    B: DeviceBackend,
{
    let slots = vec![BlockSlot::VACANT; s.slots].into_boxed_slice();
    let history = vec![TraceEntry::EMPTY; s.history].into_boxed_slice();
    let mut inner = Inner::<B>::with_events_and_history(backend, slots, history, s.config);
    // A fresh allocator has room for 4 observers: this cannot be refused.
    let _ = inner.attach_out_of_memory_observer(&FORWARD);
    // A fresh allocator holds no segment: nothing to refuse.
    let _ = inner.attach_segment_registry(segments::map(), index);
    // The configured fraction from the start, as torch's allocator sets it
    // when it is made (a failed read of the device's memory leaves it to
    // the first segment).
    let _ = inner.apply_configured_fraction();
    Box::new(CachingAllocator::new(inner).with_storage_growth(twice))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachealloc_core::{Config, SharedAllocator};

    /// A device that starts with 8 slots serves 2,000 live blocks: its
    /// storage doubles as they run out, and everything frees cleanly.
    #[test]
    fn slots_grow_as_blocks_need_them() {
        let s = Settings {
            backend: Some(BackendKind::Mock),
            conf_text: String::new(),
            conf_c: Default::default(),
            config: Config::DEFAULT,
            mock_capacity: None,
            slots: 8,
            history: 0,
        };
        let Device::Mock(d) = open(&s, 5).expect("a simulated device") else {
            unreachable!("the settings ask for the simulated device")
        };
        let ptrs: Vec<_> = (0..2000u64)
            .map(|k| d.malloc(512 * (1 + k % 100), 0).expect("room grows").ptr)
            .collect();
        assert_eq!(d.stats().unwrap().allocation.all().current, 2000);
        for p in ptrs {
            d.free_ptr(p).expect("free");
        }
        d.empty_cache().expect("empty_cache");
        assert_eq!(d.stats().unwrap().reserved_bytes.all().current, 0);
    }
}
