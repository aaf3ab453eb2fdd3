//! Keeping a [`SegmentRegistry`] up to date for the thread-safe front ends
//! (segments and reservations registered once the device made them and
//! before anything of them is handed out, hidden before the device takes
//! them back), and handing back to the device a range it just made that the
//! allocator will not keep (later, when a capture is under way).

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::private_pool::SegmentSource;
use crate::segment_table::{RegistryRefusal, SegmentRegistry};
use crate::sync::in_callback;

/// Where a range the allocator just got came from, to hand it back there.
#[derive(Clone, Copy, Debug)]
pub(super) enum Origin {
    /// A device malloc.
    Device,
    /// An address-space reservation (expandable segments).
    Reservation,
    /// A pool's segment source, for a request on this stream.
    Source(SegmentSource, u64),
}

impl Origin {
    /// `reserved` for an address reservation, `malloc` otherwise.
    pub(super) fn pick(self, malloc: &'static str, reserved: &'static str) -> &'static str {
        match self {
            Origin::Reservation => reserved,
            _ => malloc,
        }
    }
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Keep `registry` up to date with this allocator's segments (and
    /// expandable segments' reservations) as device `device`: the ones it
    /// holds now are registered at once, later ones as they come and go.
    /// A registry already attached is left (its entries of this allocator
    /// removed). If the registry refuses one of the segments held now
    /// ([`Error::SegmentTableFull`], or [`Error::BackendContract`] for a
    /// range another device holds), none is left registered and no
    /// registry is attached.
    pub fn attach_segment_registry(
        &mut self,
        registry: &'static dyn SegmentRegistry,
        device: u32,
    ) -> Res<(), B> {
        self.detach_segment_registry();
        let slots = self.arena.slots();
        let mut h = self.segments.first(slots);
        while h != NIL {
            let s = &slots[h as usize];
            if let Err(r) = registry.insert(device, s.addr, s.seg_size) {
                // Take back what went in before the refusal.
                self.remove_segments_from(registry, device, h);
                return Err(refusal(r, s.addr));
            }
            h = self.segments.successor(slots, s.addr);
        }
        self.registry = Some((registry, device));
        self.arm_drop();
        Ok(())
    }

    /// Stop keeping the attached registry up to date, and remove this
    /// allocator's segments from it.
    pub fn detach_segment_registry(&mut self) {
        if let Some((registry, device)) = self.registry.take() {
            self.remove_segments_from(registry, device, NIL);
        }
    }

    /// Remove this allocator's segments from `registry` (as device
    /// `device`), in address order up to, not including, segment `stop`
    /// (`NIL`: all of them).
    fn remove_segments_from(&self, registry: &dyn SegmentRegistry, device: u32, stop: u32) {
        let slots = self.arena.slots();
        let mut h = self.segments.first(slots);
        while h != stop {
            let base = slots[h as usize].addr;
            registry.hide(device, base);
            registry.settle(device, base, true);
            h = self.segments.successor(slots, base);
        }
    }

    /// The attached registry and this device's number there.
    pub fn segment_registry(&self) -> Option<(&'static dyn SegmentRegistry, u32)> {
        self.registry
    }

    /// Register a segment the device (or a pool's source) just made. On a refusal the error says why, and the range goes
    /// back to the device (`give_back`) when the table was full; when it
    /// overlaps another device's segment it is not given back (that would
    /// free the other device's memory): it leaks, as a contract violation
    /// must.
    pub(super) fn register_segment(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        origin: Origin,
    ) -> Res<(), B> {
        let Some((registry, device)) = self.registry else {
            return Ok(());
        };
        match registry.insert(device, ptr.0, size) {
            Ok(()) => Ok(()),
            Err(r) => {
                if let RegistryRefusal::Full { .. } = r {
                    self.give_back(ptr, size, origin);
                }
                Err(refusal(r, ptr.0))
            }
        }
    }

    /// Hand a range the device just made, and the allocator will not keep,
    /// back to where it came from; best effort, its result ignored. While a
    /// capture is under way a device free would invalidate it: the range
    /// waits (up to 4 of them; a fifth leaks) until the last capture ends.
    /// A pool's source takes it back at once (PyTorch calls `raw_delete`
    /// whenever it frees such a segment).
    pub(super) fn give_back(&mut self, ptr: DevicePtr, size: u64, origin: Origin) {
        let reserved = match origin {
            Origin::Source(src, stream) => {
                return in_callback(|| (src.free)(src.ctx, ptr, size, stream))
            }
            Origin::Device => false,
            Origin::Reservation => true,
        };
        if self.capturing() {
            let _ = self.given_back_later.push((ptr.0, size, reserved));
            return;
        }
        if reserved {
            let _ = self.backend.release_address_space(ptr, size);
        } else {
            let _ = self.backend.free(ptr, size);
        }
    }

    /// The ranges `give_back` kept during a capture go back now (no capture
    /// is under way any more).
    pub(super) fn give_back_later_ones(&mut self) {
        while let Some((p, size, reserved)) = self.given_back_later.pop() {
            let origin = if reserved {
                Origin::Reservation
            } else {
                Origin::Device
            };
            self.give_back(DevicePtr(p), size, origin);
        }
    }

    /// Give the segment at `base` back to the device with `give`, keeping
    /// the registry true: lookups stop finding it first, and it is gone
    /// from the registry once the device took it (kept when it refused).
    #[inline]
    pub(super) fn unregistered<T, X>(
        &mut self,
        base: u64,
        give: impl FnOnce(&mut B) -> Result<T, X>,
    ) -> Result<T, X> {
        let Some((registry, device)) = self.registry else {
            return give(&mut self.backend);
        };
        registry.hide(device, base);
        let r = give(&mut self.backend);
        registry.settle(device, base, r.is_ok());
        r
    }
}

/// The error of a registry's refusal of the segment at `base`.
fn refusal<E>(r: RegistryRefusal, base: u64) -> Error<E> {
    match r {
        RegistryRefusal::Full { capacity } => Error::SegmentTableFull { capacity },
        RegistryRefusal::Overlaps { .. } => Error::BackendContract {
            what: "a new segment overlaps a segment of another device",
            ptr: DevicePtr(base),
        },
    }
}
