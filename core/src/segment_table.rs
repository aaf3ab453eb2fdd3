//! Which device owns an address, answered without taking any device's
//! lock: a [`SegmentRegistry`] that the allocators of several devices keep
//! up to date (each under its own lock) and that lookups read on their
//! own. [`SegmentTable`] is the fixed-capacity one (no heap);
//! `MultiDeviceAllocator` routes `free_ptr` and `record_stream_ptr` with it,
//! and the C library keeps one that grows.
//!
//! The contract that makes a lookup right: an allocator registers a
//! segment (or an expandable segment's address-space reservation) after
//! the device made it and before any of it is handed out, and hides it
//! before the device takes it back. So the visible entries are always
//! ranges that their device holds at that moment (the driver never hands
//! one address range to two holders), and a pointer to a live allocation
//! is always found on its device. A pointer to memory being created or
//! released may be "unknown" for a moment; it is never given to another
//! device.

use crate::sync::RwLock;

/// Why a registry refused a new segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistryRefusal {
    /// No room for another entry.
    Full {
        /// The registry's capacity.
        capacity: usize,
    },
    /// The range overlaps a visible segment of `device`: the backend
    /// handed out memory that another holder holds.
    Overlaps {
        /// The device that holds the overlapping segment.
        device: u32,
    },
}

/// Segment ranges by device, shared by the allocators of several devices
/// (each calls it under its own lock, with the device number it was given)
/// and read by lookups that take no allocator's lock.
pub trait SegmentRegistry: Sync {
    /// Device `device` holds `[base, base + size)` from now on (it made it;
    /// nothing of it is handed out yet).
    fn insert(&self, device: u32, base: u64, size: u64) -> Result<(), RegistryRefusal>;
    /// The segment of `device` at `base` is about to go back to the device:
    /// lookups no longer find it.
    fn hide(&self, device: u32, base: u64);
    /// The hidden segment of `device` at `base` is gone (`gone`: the device
    /// took it back, forget it) or stays (the device refused it: lookups find
    /// it again).
    fn settle(&self, device: u32, base: u64, gone: bool);
    /// The device whose visible segment contains `ptr`.
    fn owner(&self, ptr: u64) -> Option<u32>;
    /// Whether `[base, base + size)` is a visible segment of `device` (the
    /// invariant checker's question).
    fn holds(&self, device: u32, base: u64, size: u64) -> bool;
    /// How many segments of `device` the registry has, visible or hidden.
    fn count(&self, device: u32) -> usize;
}

/// One range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    base: u64,
    end: u64,
    device: u32,
    hidden: bool,
}

/// A [`SegmentRegistry`] of at most `N` segments (all devices together),
/// kept sorted by base address behind a reader-writer lock: a lookup is a
/// binary search under the read lock; a segment's creation or release is
/// an insertion or removal under the write lock (O(N), as rare as a device
/// malloc). A full table refuses the new segment, which its allocator then
/// gives back (`Error::SegmentTableFull`).
///
/// ```
/// use cachealloc_core::{SegmentRegistry, SegmentTable};
/// let t = SegmentTable::<8>::new();
/// t.insert(1, 0x1000, 0x1000).unwrap();
/// assert_eq!(t.owner(0x1fff), Some(1));
/// t.hide(1, 0x1000); // about to be freed
/// assert_eq!(t.owner(0x1000), None);
/// t.settle(1, 0x1000, true);
/// assert_eq!(t.count(1), 0);
/// ```
pub struct SegmentTable<const N: usize> {
    entries: RwLock<heapless::Vec<Entry, N>>,
}

impl<const N: usize> SegmentTable<N> {
    /// An empty table (`const`, for statics; not under loom).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        SegmentTable {
            entries: RwLock::new(heapless::Vec::new()),
        }
    }

    /// An empty table.
    #[cfg(loom)]
    pub fn new() -> Self {
        SegmentTable {
            entries: RwLock::new(heapless::Vec::new()),
        }
    }

    /// Segments it holds, visible or hidden.
    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<const N: usize> Default for SegmentTable<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// The visible entry of `v` (sorted by base) whose range contains `ptr`.
fn visible_at(v: &[Entry], ptr: u64) -> Option<&Entry> {
    // Visible ranges never overlap: the candidate is the visible entry with
    // the highest base at or below `ptr`. Hidden ones (a release in flight)
    // may overlap a newer segment; they are stepped over.
    let at = v.partition_point(|e| e.base <= ptr);
    v[..at]
        .iter()
        .rev()
        .find(|e| !e.hidden)
        .filter(|e| ptr < e.end)
}

impl<const N: usize> SegmentRegistry for SegmentTable<N> {
    fn insert(&self, device: u32, base: u64, size: u64) -> Result<(), RegistryRefusal> {
        let end = base.saturating_add(size);
        let mut v = self.entries.write();
        let at = v.partition_point(|e| e.base <= base);
        // The visible neighbours are the only ones that could overlap.
        if let Some(e) = v[..at].iter().rev().find(|e| !e.hidden) {
            if e.end > base {
                return Err(RegistryRefusal::Overlaps { device: e.device });
            }
        }
        if let Some(e) = v[at..].iter().find(|e| !e.hidden) {
            if e.base < end {
                return Err(RegistryRefusal::Overlaps { device: e.device });
            }
        }
        v.insert(
            at,
            Entry {
                base,
                end,
                device,
                hidden: false,
            },
        )
        .map_err(|_| RegistryRefusal::Full { capacity: N })
    }

    fn hide(&self, device: u32, base: u64) {
        let mut v = self.entries.write();
        if let Some(e) = v
            .iter_mut()
            .find(|e| e.base == base && e.device == device && !e.hidden)
        {
            e.hidden = true;
        }
    }

    fn settle(&self, device: u32, base: u64, gone: bool) {
        let mut v = self.entries.write();
        if let Some(k) = v
            .iter()
            .position(|e| e.base == base && e.device == device && e.hidden)
        {
            if gone {
                v.remove(k);
            } else {
                v[k].hidden = false;
            }
        }
    }

    fn owner(&self, ptr: u64) -> Option<u32> {
        visible_at(&self.entries.read(), ptr).map(|e| e.device)
    }

    fn holds(&self, device: u32, base: u64, size: u64) -> bool {
        self.entries.read().iter().any(|e| {
            e.device == device && e.base == base && e.end == base.saturating_add(size) && !e.hidden
        })
    }

    fn count(&self, device: u32) -> usize {
        self.entries
            .read()
            .iter()
            .filter(|e| e.device == device)
            .count()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn lookups_find_visible_ranges_only() {
        let t = SegmentTable::<4>::new();
        t.insert(0, 100, 50).unwrap();
        t.insert(1, 200, 100).unwrap();
        assert_eq!(t.owner(99), None);
        assert_eq!(t.owner(100), Some(0));
        assert_eq!(t.owner(149), Some(0));
        assert_eq!(t.owner(150), None);
        assert_eq!(t.owner(250), Some(1));
        assert_eq!(
            t.insert(2, 140, 20),
            Err(RegistryRefusal::Overlaps { device: 0 })
        );
        assert_eq!(
            t.insert(2, 150, 60),
            Err(RegistryRefusal::Overlaps { device: 1 })
        );
        // Device 1 releases its segment; before it forgets it, device 2 is
        // handed an overlapping range by the driver.
        t.hide(1, 200);
        assert_eq!(t.owner(250), None);
        t.insert(2, 180, 100).unwrap();
        assert_eq!(t.owner(250), Some(2));
        assert_eq!(t.owner(279), Some(2));
        assert_eq!(t.owner(290), None, "the hidden range is not anyone's");
        t.settle(1, 200, true);
        assert_eq!((t.count(1), t.count(2)), (0, 1));
        assert!(t.holds(2, 180, 100) && !t.holds(2, 180, 99));
        // A release the device refused: visible again.
        t.hide(0, 100);
        t.settle(0, 100, false);
        assert_eq!(t.owner(120), Some(0));
        t.insert(3, 1000, 1).unwrap();
        t.insert(3, 2000, 1).unwrap();
        assert_eq!(
            t.insert(3, 3000, 1),
            Err(RegistryRefusal::Full { capacity: 4 })
        );
        assert_eq!(t.len(), 4);
    }
}
