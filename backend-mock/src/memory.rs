//! The simulated device's memory: where each malloc lands (the bump
//! pointer, a test's placements, or the addresses of a recorded run), what
//! is held against the capacity, and the log of every malloc.

use crate::MockError;
use cachealloc_core::DevicePtr;
use std::collections::{BTreeMap, VecDeque};

/// Where the simulated device's first segment starts (2 MiB aligned).
pub const DEVICE_BASE: u64 = 0x7F00_0000_0000;
pub(crate) const SEGMENT_ALIGN: u64 = 2 << 20;

/// How the real addresses of a recorded run were used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RealAddressUse {
    /// Mallocs that got their recorded address.
    pub placed: u64,
    /// Mallocs whose size differed from the next recorded one (the replay
    /// went another way), or whose recorded range was still held: they got
    /// a bump address above every recorded one.
    pub missed: u64,
    /// Recorded addresses never used.
    pub unused: u64,
}

#[derive(Debug)]
pub(crate) struct Memory {
    next_addr: u64,
    /// Addresses the next mallocs return instead of the bump pointer's.
    placements: VecDeque<u64>,
    /// A recorded run's mallocs, in order: (address, size).
    real: VecDeque<(u64, u64)>,
    real_use: RealAddressUse,
    pub(crate) capacity: Option<u64>,
    pub(crate) held: u64,
    /// Held segments: base -> size.
    live: BTreeMap<u64, u64>,
    /// Reserved address ranges (virtual memory): base -> size.
    reservations: BTreeMap<u64, u64>,
    /// Mapped pages: base -> page size.
    pages: BTreeMap<u64, u64>,
    /// Every malloc and every reservation, in order: (base, size).
    log: Vec<(DevicePtr, u64)>,
}

impl Memory {
    pub(crate) fn new(capacity: Option<u64>) -> Self {
        Memory {
            next_addr: DEVICE_BASE,
            placements: VecDeque::new(),
            real: VecDeque::new(),
            real_use: RealAddressUse::default(),
            capacity,
            held: 0,
            live: BTreeMap::new(),
            reservations: BTreeMap::new(),
            pages: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    pub(crate) fn set_base(&mut self, base: u64) {
        self.next_addr = base.div_ceil(SEGMENT_ALIGN) * SEGMENT_ALIGN;
    }

    pub(crate) fn place_next(&mut self, addr: u64) {
        self.placements.push_back(addr);
    }

    /// Hand out these (address, size) pairs to the mallocs of matching size,
    /// in order; bump addresses start above all of them.
    pub(crate) fn use_real_addresses(&mut self, mallocs: &[(u64, u64)]) {
        let top = mallocs
            .iter()
            .map(|&(a, s)| a.saturating_add(s))
            .max()
            .unwrap_or(0);
        if top > self.next_addr {
            self.set_base(top);
        }
        self.real.extend(mallocs.iter().copied());
    }

    pub(crate) fn real_address_use(&self) -> RealAddressUse {
        RealAddressUse {
            unused: self.real.len() as u64,
            ..self.real_use
        }
    }

    pub(crate) fn live_segments(&self) -> usize {
        self.live.len()
    }

    pub(crate) fn log(&self) -> &[(DevicePtr, u64)] {
        &self.log
    }

    /// Whether `[addr, addr + size)` overlaps a held segment.
    fn overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        self.live
            .range(..end)
            .next_back()
            .is_some_and(|(&b, &s)| b.saturating_add(s) > addr)
    }

    /// A segment of `size` bytes, or `None` when the capacity (or the
    /// address space) has no room.
    pub(crate) fn malloc(&mut self, size: u64) -> Option<DevicePtr> {
        if let Some(cap) = self.capacity {
            if self.held.saturating_add(size) > cap {
                return None;
            }
        }
        let addr = match self.placements.pop_front() {
            Some(a) => a,
            None => match self.next_real(size) {
                Some(a) => a,
                None => self.bump(size)?,
            },
        };
        self.held += size;
        self.live.insert(addr, size);
        self.log.push((DevicePtr(addr), size));
        Some(DevicePtr(addr))
    }

    /// The next recorded address, if its size is `size` and it is free.
    fn next_real(&mut self, size: u64) -> Option<u64> {
        let &(addr, recorded) = self.real.front()?;
        if recorded == size && !self.overlaps(addr, size) {
            self.real.pop_front();
            self.real_use.placed += 1;
            Some(addr)
        } else {
            self.real_use.missed += 1;
            None
        }
    }

    fn bump(&mut self, size: u64) -> Option<u64> {
        let span = size
            .div_ceil(SEGMENT_ALIGN)
            .max(1)
            .saturating_mul(SEGMENT_ALIGN);
        let next = self.next_addr.checked_add(span)?;
        let addr = self.next_addr;
        self.next_addr = next;
        Some(addr)
    }

    /// Reserve `size` bytes of address space (no capacity used); logged
    /// with the mallocs (both create a segment).
    pub(crate) fn reserve(&mut self, size: u64) -> Option<DevicePtr> {
        let addr = self.bump(size)?;
        self.reservations.insert(addr, size);
        self.log.push((DevicePtr(addr), size));
        Some(DevicePtr(addr))
    }

    /// Give back a reservation with no page mapped in it.
    pub(crate) fn release_reservation(
        &mut self,
        ptr: DevicePtr,
        size: u64,
    ) -> Result<(), MockError> {
        let end = ptr.0.saturating_add(size);
        let whole = self.reservations.get(&ptr.0) == Some(&size);
        if !whole || self.pages.range(ptr.0..end).next().is_some() {
            return Err(MockError::InvalidVirtualMemory {
                what: "release of a range that is not a reservation, or that has mapped pages",
                ptr,
            });
        }
        self.reservations.remove(&ptr.0);
        Ok(())
    }

    /// Whether `[ptr, ptr + n * page)` lies in one reservation.
    fn reserved(&self, ptr: u64, bytes: u64) -> bool {
        self.reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &s)| ptr.saturating_add(bytes) <= b.saturating_add(s))
    }

    /// Map `n` pages of `page` bytes from `ptr`: all or nothing; `Ok(false)`
    /// when the capacity has no room for them.
    pub(crate) fn map(&mut self, ptr: DevicePtr, n: u64, page: u64) -> Result<bool, MockError> {
        let bytes = n.saturating_mul(page);
        let bad = |what| MockError::InvalidVirtualMemory { what, ptr };
        if !self.reserved(ptr.0, bytes) || page == 0 {
            return Err(bad("map outside a reservation"));
        }
        if self.pages.range(ptr.0..ptr.0 + bytes).next().is_some() {
            return Err(bad("map of a page already mapped"));
        }
        if self
            .capacity
            .is_some_and(|cap| self.held.saturating_add(bytes) > cap)
        {
            return Ok(false);
        }
        for k in 0..n {
            self.pages.insert(ptr.0 + k * page, page);
        }
        self.held += bytes;
        Ok(true)
    }

    /// Unmap `n` mapped pages of `page` bytes from `ptr`.
    pub(crate) fn unmap(&mut self, ptr: DevicePtr, n: u64, page: u64) -> Result<(), MockError> {
        let all = (0..n).all(|k| self.pages.get(&(ptr.0 + k * page)) == Some(&page));
        if !all {
            return Err(MockError::InvalidVirtualMemory {
                what: "unmap of a page that is not mapped",
                ptr,
            });
        }
        for k in 0..n {
            self.pages.remove(&(ptr.0 + k * page));
        }
        self.held -= n * page;
        Ok(())
    }

    /// Reservations held.
    pub(crate) fn live_reservations(&self) -> usize {
        self.reservations.len()
    }

    /// Pages mapped.
    pub(crate) fn mapped_pages(&self) -> usize {
        self.pages.len()
    }

    pub(crate) fn free(&mut self, ptr: DevicePtr, size: u64) -> Result<(), MockError> {
        match self.live.get(&ptr.0) {
            Some(&s) if s == size => {
                self.live.remove(&ptr.0);
                self.held -= size;
                Ok(())
            }
            _ => Err(MockError::InvalidFree { ptr, size }),
        }
    }

    /// The size of the held segment that starts at `base`.
    pub(crate) fn segment_at(&self, base: u64) -> Option<u64> {
        self.live.get(&base).copied()
    }

    /// The latest malloc whose range holds `ptr`: its index in the log and
    /// the offset of `ptr`.
    pub(crate) fn locate(&self, ptr: DevicePtr) -> Option<(usize, u64)> {
        self.log
            .iter()
            .enumerate()
            .rev()
            .find(|(_, (base, size))| ptr.0 >= base.0 && ptr.0 - base.0 < *size)
            .map(|(k, (base, _))| (k, ptr.0 - base.0))
    }
}
