//! The process's map from device addresses to the devices that hold them:
//! the core's [`SegmentTable`], which every device's allocator keeps up to
//! date (its segments and expandable segments' reservations, each under its
//! own lock) and which the C functions that find a pointer's device (a
//! free with device -1, as torch's `raw_delete` makes, `record_stream`,
//! `base_alloc`, the IPC calls) read without any lock and without writing
//! anything shared. It grows in chunks from the heap, kept for the
//! process's life (a lookup may be reading one as it grows); see
//! `SegmentRegistry` for why a lookup is never answered with another
//! device.

use cachealloc_core::{SegmentSlot, SegmentTable};

/// Entries held inline; beyond them the table grows by chunks of 1,024,
/// 2,048, ... entries (24 bytes each).
const INLINE: usize = 1024;

/// Room for `n` more entries, for good.
fn chunk(n: usize) -> Option<&'static [SegmentSlot]> {
    let slots: Vec<SegmentSlot> = (0..n).map(|_| SegmentSlot::default()).collect();
    Some(Box::leak(slots.into_boxed_slice()))
}

/// The process's map.
pub(crate) fn map() -> &'static SegmentTable<INLINE> {
    static MAP: SegmentTable<INLINE> = SegmentTable::new().with_growth(chunk);
    &MAP
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachealloc_core::{RegistryRefusal, SegmentRegistry};

    #[test]
    fn ranges_by_device_with_a_release_in_flight() {
        let m = SegmentTable::<2>::new().with_growth(chunk);
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
        m.insert(2, 200, 50).unwrap(); // the driver reused the address: it grows
        assert_eq!((m.owner(210), m.owner(260)), (Some(2), None));
        m.settle(1, 200, true);
        assert_eq!((m.count(1), m.count(2)), (0, 1));
        m.hide(0, 100);
        m.settle(0, 100, false); // the device refused to take it back
        assert!(m.holds(0, 100, 50));
        assert_eq!(m.owner(120), Some(0));
        assert_eq!(m.capacity(), 4);
    }
}
