//! Devices that share one address space and reuse each other's addresses at
//! once, as a real driver may (with CUDA's unified addressing, the range one
//! device just freed can be the next range another device gets): the
//! backend for tests of owner lookups racing with segment creation and
//! release, where answering with the wrong device is possible at all. Every
//! segment takes one slot of [`SLOT`] bytes; the most recently freed slot is
//! handed out first. Events are always complete. Under `cfg(loom)` its lock
//! is loom's. (A module of the integration tests and of the loom models,
//! `loom/tests/loom.rs`, where loom is a dev-dependency.)
#![allow(dead_code)]

use cachealloc_core::{DeviceBackend, DevicePtr, EventStatus, MallocError, MemInfo};
use std::fmt;

#[cfg(loom)]
use loom::sync::{Arc, Mutex};
#[cfg(not(loom))]
use std::sync::{Arc, Mutex};

/// Bytes of a slot: the largest segment a device can get.
pub const SLOT: u64 = 32 << 20;

/// The base of the first slot.
const BASE: u64 = 0x7000_0000_0000;

/// The shared address space: the slots not held, the last freed on top.
#[derive(Clone)]
pub struct Space {
    free: Arc<Mutex<Vec<u64>>>,
    slots: u64,
}

impl Space {
    /// A space of `slots` slots.
    pub fn new(slots: u64) -> Space {
        Space {
            free: Arc::new(Mutex::new(
                (0..slots).rev().map(|k| BASE + k * SLOT).collect(),
            )),
            slots,
        }
    }

    /// Device `ordinal` of this space.
    pub fn device(&self, ordinal: u32) -> SharedSpace {
        SharedSpace {
            space: self.clone(),
            ordinal,
        }
    }
}

/// One device of a [`Space`].
pub struct SharedSpace {
    space: Space,
    ordinal: u32,
}

/// A free of an address that is not a slot, or one free already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadFree(pub u64);

impl fmt::Display for BadFree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "free of {:#x}: not a held slot", self.0)
    }
}

impl std::error::Error for BadFree {}

impl DeviceBackend for SharedSpace {
    type Stream = u64;
    type Event = ();
    type Error = BadFree;

    fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<BadFree>> {
        if size > SLOT {
            return Err(MallocError::OutOfMemory);
        }
        let mut free = self.space.free.lock().unwrap_or_else(|p| p.into_inner());
        free.pop().map(DevicePtr).ok_or(MallocError::OutOfMemory)
    }

    fn free(&mut self, ptr: DevicePtr, _size: u64) -> Result<(), BadFree> {
        let mut free = self.space.free.lock().unwrap_or_else(|p| p.into_inner());
        let slot = ptr.0.wrapping_sub(BASE);
        if ptr.0 < BASE
            || !slot.is_multiple_of(SLOT)
            || slot / SLOT >= self.space.slots
            || free.contains(&ptr.0)
        {
            return Err(BadFree(ptr.0));
        }
        free.push(ptr.0);
        Ok(())
    }

    fn event_create(&mut self) -> Result<(), BadFree> {
        Ok(())
    }

    fn event_record(&mut self, _event: &(), _stream: u64) -> Result<(), BadFree> {
        Ok(())
    }

    fn event_query(&mut self, _event: &()) -> Result<EventStatus, BadFree> {
        Ok(EventStatus::Ready)
    }

    fn event_synchronize(&mut self, _event: &()) -> Result<(), BadFree> {
        Ok(())
    }

    fn event_destroy(&mut self, _event: &()) -> Result<(), BadFree> {
        Ok(())
    }

    fn mem_info(&mut self) -> Result<MemInfo, BadFree> {
        let free = self
            .space
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len() as u64;
        Ok(MemInfo {
            free: free * SLOT,
            total: self.space.slots * SLOT,
        })
    }

    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    const NAME: &'static str = "a device of a shared address space";
}
