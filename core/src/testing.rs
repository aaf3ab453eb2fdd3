//! [`TinyBackend`]: a host-only device for examples and unit tests. It hands
//! out addresses from a bump pointer (each segment, and each address-space
//! reservation, at the next 2 MiB boundary), finishes all stream work at
//! once, and can be given a capacity (which mapped pages count against, as
//! mallocs do).
//! The full simulated device, with streams, fault injection and counters, is
//! the `cachealloc-mock` crate.

use crate::backend::{DeviceBackend, DevicePtr, EventStatus, MallocError, MemInfo, VmError};
use core::fmt;

/// The error of [`TinyBackend`] (it fails only when told to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TinyError;

impl fmt::Display for TinyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tiny backend: injected failure")
    }
}

impl core::error::Error for TinyError {}

/// A bump-pointer device with optional capacity.
///
/// ```
/// use cachealloc_core::{testing::TinyBackend, DeviceBackend};
/// let mut d = TinyBackend::with_capacity(4 << 20);
/// let p = d.malloc(2 << 20).unwrap();
/// assert!(d.malloc(4 << 20).unwrap_err().is_out_of_memory());
/// d.free(p, 2 << 20).unwrap();
/// assert_eq!(d.held, 0);
/// ```
#[derive(Clone, Debug)]
pub struct TinyBackend {
    /// The next segment's address.
    pub next: u64,
    /// Bytes held by the allocator.
    pub held: u64,
    /// Device size (`None`: unlimited).
    pub capacity: Option<u64>,
    /// Make the next `free` fail once.
    pub fail_next_free: bool,
    /// Address-space reservations held.
    pub reservations: u32,
}

impl Default for TinyBackend {
    fn default() -> Self {
        TinyBackend::new()
    }
}

impl TinyBackend {
    /// An unlimited device (`const`, for statics).
    pub const fn new() -> Self {
        TinyBackend {
            next: 1 << 40,
            held: 0,
            capacity: None,
            fail_next_free: false,
            reservations: 0,
        }
    }

    /// A device of `bytes`.
    pub fn with_capacity(bytes: u64) -> Self {
        TinyBackend {
            capacity: Some(bytes),
            ..Self::default()
        }
    }
}

impl DeviceBackend for TinyBackend {
    type Stream = u64;
    type Event = ();
    type Error = TinyError;

    fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<TinyError>> {
        if let Some(cap) = self.capacity {
            if self.held.saturating_add(size) > cap {
                return Err(MallocError::OutOfMemory);
            }
        }
        let p = self.next;
        let step = size.div_ceil(2 << 20).max(1) * (2 << 20);
        self.next = self
            .next
            .checked_add(step)
            .ok_or(MallocError::OutOfMemory)?;
        self.held += size;
        Ok(DevicePtr(p))
    }

    fn free(&mut self, _ptr: DevicePtr, size: u64) -> Result<(), TinyError> {
        if core::mem::take(&mut self.fail_next_free) {
            return Err(TinyError);
        }
        self.held -= size;
        Ok(())
    }

    fn event_create(&mut self) -> Result<(), TinyError> {
        Ok(())
    }

    fn event_record(&mut self, _event: &(), _stream: u64) -> Result<(), TinyError> {
        Ok(())
    }

    fn event_query(&mut self, _event: &()) -> Result<EventStatus, TinyError> {
        Ok(EventStatus::Ready)
    }

    fn event_destroy(&mut self, _event: &()) -> Result<(), TinyError> {
        Ok(())
    }

    const NAME: &'static str = "the tiny test backend";
    const VIRTUAL_MEMORY: bool = true;

    /// The capacity, or 80 GiB for an unlimited device.
    fn device_total_memory(&mut self) -> Result<u64, TinyError> {
        Ok(self.capacity.unwrap_or(80 << 30))
    }

    fn allocation_granularity(&mut self) -> Result<u64, VmError<TinyError>> {
        Ok(2 << 20)
    }

    fn reserve_address_space(&mut self, size: u64) -> Result<DevicePtr, VmError<TinyError>> {
        let p = self.next;
        let step = size.div_ceil(2 << 20).max(1) * (2 << 20);
        self.next = self.next.checked_add(step).ok_or(VmError::OutOfMemory)?;
        self.reservations += 1;
        Ok(DevicePtr(p))
    }

    fn release_address_space(
        &mut self,
        _ptr: DevicePtr,
        _size: u64,
    ) -> Result<(), VmError<TinyError>> {
        self.reservations -= 1;
        Ok(())
    }

    fn map_pages(
        &mut self,
        _ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<TinyError>> {
        let bytes = pages.saturating_mul(page_size);
        if self
            .capacity
            .is_some_and(|cap| self.held.saturating_add(bytes) > cap)
        {
            return Err(VmError::OutOfMemory);
        }
        self.held += bytes;
        Ok(())
    }

    fn unmap_pages(
        &mut self,
        _ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<TinyError>> {
        self.held -= pages * page_size;
        Ok(())
    }

    fn mem_info(&mut self) -> Result<MemInfo, TinyError> {
        let total = self.capacity.unwrap_or(u64::MAX);
        Ok(MemInfo {
            free: total - self.held,
            total,
        })
    }
}
