//! The process's map from device addresses to the devices that hold them:
//! every device's allocator keeps its segments (and expandable segments'
//! reservations) in it, each under its own lock, and the C functions that
//! find a pointer's device (`cachealloc_record_stream`,
//! `cachealloc_base_alloc`, the IPC calls) read it without taking any
//! device's lock. It grows as needed (the core's `SegmentTable` is the
//! fixed-capacity one); see `SegmentRegistry` for why a lookup is never
//! answered with another device.

use cachealloc_core::{RegistryRefusal, SegmentRegistry};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A range: where it ends, and whether it is being given back (hidden).
#[derive(Clone, Copy)]
struct Range {
    end: u64,
    hidden: bool,
}

/// Ranges keyed by (base, device): two entries share a base only while one
/// of them is hidden (the device gave it back and another device was handed
/// the same address before the first forgot it).
#[derive(Default)]
pub(crate) struct SegmentMap {
    ranges: RwLock<BTreeMap<(u64, u32), Range>>,
}

/// The process's map.
pub(crate) fn map() -> &'static SegmentMap {
    static MAP: OnceLock<SegmentMap> = OnceLock::new();
    MAP.get_or_init(SegmentMap::default)
}

impl SegmentMap {
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<(u64, u32), Range>> {
        self.ranges.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<(u64, u32), Range>> {
        self.ranges.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// The visible range with the highest base at or below `at` (the only one
/// that can contain `at`: visible ranges do not overlap).
fn visible_below(m: &BTreeMap<(u64, u32), Range>, at: u64) -> Option<((u64, u32), Range)> {
    m.range(..=(at, u32::MAX))
        .rev()
        .find(|(_, r)| !r.hidden)
        .map(|(k, r)| (*k, *r))
}

impl SegmentRegistry for SegmentMap {
    fn insert(&self, device: u32, base: u64, size: u64) -> Result<(), RegistryRefusal> {
        let end = base.saturating_add(size);
        let mut m = self.write();
        if let Some(((_, d), r)) = visible_below(&m, base) {
            if r.end > base {
                return Err(RegistryRefusal::Overlaps { device: d });
            }
        }
        let above = m
            .range((Bound::Excluded((base, u32::MAX)), Bound::Unbounded))
            .find(|(_, r)| !r.hidden);
        if let Some((&(b, d), _)) = above {
            if b < end {
                return Err(RegistryRefusal::Overlaps { device: d });
            }
        }
        m.insert((base, device), Range { end, hidden: false });
        Ok(())
    }

    fn hide(&self, device: u32, base: u64) {
        if let Some(r) = self.write().get_mut(&(base, device)) {
            r.hidden = true;
        }
    }

    fn settle(&self, device: u32, base: u64, gone: bool) {
        let mut m = self.write();
        if gone {
            m.remove(&(base, device));
        } else if let Some(r) = m.get_mut(&(base, device)) {
            r.hidden = false;
        }
    }

    fn owner(&self, ptr: u64) -> Option<u32> {
        visible_below(&self.read(), ptr)
            .filter(|(_, r)| ptr < r.end)
            .map(|((_, d), _)| d)
    }

    fn holds(&self, device: u32, base: u64, size: u64) -> bool {
        self.read()
            .get(&(base, device))
            .is_some_and(|r| !r.hidden && r.end == base.saturating_add(size))
    }

    fn count(&self, device: u32) -> usize {
        self.read().keys().filter(|(_, d)| *d == device).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_by_device_with_a_release_in_flight() {
        let m = SegmentMap::default();
        m.insert(0, 100, 50).unwrap();
        m.insert(1, 200, 100).unwrap();
        assert_eq!(
            (m.owner(99), m.owner(100), m.owner(149), m.owner(150)),
            (None, Some(0), Some(0), None)
        );
        assert_eq!(
            m.insert(2, 120, 10),
            Err(RegistryRefusal::Overlaps { device: 0 })
        );
        assert_eq!(
            m.insert(2, 190, 20),
            Err(RegistryRefusal::Overlaps { device: 1 })
        );
        m.hide(1, 200);
        assert_eq!(m.owner(210), None);
        m.insert(2, 200, 50).unwrap(); // the driver reused the address
        assert_eq!((m.owner(210), m.owner(260)), (Some(2), None));
        m.settle(1, 200, true);
        assert_eq!((m.count(1), m.count(2)), (0, 1));
        m.hide(0, 100);
        m.settle(0, 100, false); // the device refused to take it back
        assert!(m.holds(0, 100, 50));
        assert_eq!(m.owner(120), Some(0));
    }
}
