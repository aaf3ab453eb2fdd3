//! A `no_std`, allocation-free program with a caching allocator in a `static`.
#![no_std]
#![forbid(unsafe_code)]

use cachealloc_core::{testing::TinyBackend, BlockSlot, Config, DeviceAllocator, DevicePtr};

/// The allocator, built at compile time: 1024 block slots, 16 events.
static ALLOC: spin::Mutex<DeviceAllocator<TinyBackend, [BlockSlot; 1024], 16>> =
    spin::Mutex::new(DeviceAllocator::with_events(
        TinyBackend::new(),
        [BlockSlot::VACANT; 1024],
        Config::DEFAULT,
    ));

/// Allocate `size` bytes on the default stream; 0 on failure.
pub extern "C" fn cachealloc_proof_malloc(size: u64) -> u64 {
    ALLOC.lock().malloc(size, 0).map_or(0, |a| a.ptr.0)
}

/// Free what `cachealloc_proof_malloc` returned; false on error.
pub extern "C" fn cachealloc_proof_free(ptr: u64) -> bool {
    ALLOC.lock().free_ptr(DevicePtr(ptr)).is_ok()
}

/// Reserved bytes.
pub extern "C" fn cachealloc_proof_reserved() -> i64 {
    ALLOC.lock().stats().reserved_bytes.all().current
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}
