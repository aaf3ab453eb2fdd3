//! The allocator's side of two things its thread-safe front ends need:
//! keeping a [`SegmentRegistry`] up to date (segments and reservations
//! registered once the device made them and before anything of them is
//! handed out, hidden before the device takes them back), and holding
//! out-of-memory notices for the observers until the front end's lock is
//! released (PyTorch unlocks before it calls them).

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Error;
use crate::history::{HistoryStorage, OutOfMemoryObserver};
use crate::segment_table::{RegistryRefusal, SegmentRegistry};

/// An out-of-memory to tell the observers about: their arguments.
#[derive(Clone, Copy)]
pub(crate) struct OomNotice {
    pub(crate) device: u32,
    pub(crate) alloc_size: u64,
    pub(crate) device_total: u64,
    pub(crate) device_free: u64,
}

/// The notices a call left, with the observers to tell (taken under the
/// lock, delivered after it).
pub(crate) struct OomDelivery {
    observers: heapless::Vec<&'static dyn OutOfMemoryObserver, 4>,
    notices: heapless::Vec<OomNotice, 4>,
}

impl OomDelivery {
    /// Call the observers, for each notice.
    pub(crate) fn deliver(&self) {
        for n in self.notices.iter() {
            deliver(&self.observers, n);
        }
    }
}

/// Call `observers` with notice `n`.
fn deliver(observers: &[&'static dyn OutOfMemoryObserver], n: &OomNotice) {
    for o in observers {
        o.out_of_memory(n.device, n.alloc_size, n.device_total, n.device_free);
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
                let mut g = self.segments.first(slots);
                while g != h {
                    let t = &slots[g as usize];
                    registry.hide(device, t.addr);
                    registry.settle(device, t.addr, true);
                    g = self.segments.successor(slots, t.addr);
                }
                return Err(refusal(r, s.addr));
            }
            h = self.segments.successor(slots, s.addr);
        }
        self.registry = Some((registry, device));
        Ok(())
    }

    /// Stop keeping the attached registry up to date, and remove this
    /// allocator's segments from it.
    pub fn detach_segment_registry(&mut self) {
        let Some((registry, device)) = self.registry.take() else {
            return;
        };
        let slots = self.arena.slots();
        let mut h = self.segments.first(slots);
        while h != NIL {
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

    /// Register a segment the device just made (`reserved`: an address
    /// reservation). On a refusal the error says why, and the range goes
    /// back to the device (`give_back`) when the table was full; when it
    /// overlaps another device's segment it is not given back (that would
    /// free the other device's memory): it leaks, as a contract violation
    /// must.
    pub(super) fn register_segment(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        reserved: bool,
    ) -> Res<(), B> {
        let Some((registry, device)) = self.registry else {
            return Ok(());
        };
        match registry.insert(device, ptr.0, size) {
            Ok(()) => Ok(()),
            Err(r) => {
                if let RegistryRefusal::Full { .. } = r {
                    self.give_back(ptr, size, reserved);
                }
                Err(refusal(r, ptr.0))
            }
        }
    }

    /// Hand a range the device just made, and the allocator will not keep,
    /// back to the device (`reserved`: an address reservation); best
    /// effort, its result ignored. While a capture is under way a device
    /// free would invalidate it: the range waits (up to 4 of them; a fifth
    /// leaks) until the last capture ends.
    pub(super) fn give_back(&mut self, ptr: DevicePtr, size: u64, reserved: bool) {
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
            self.give_back(DevicePtr(p), size, reserved);
        }
    }

    /// Before the segment at `base` goes back to the device: lookups stop
    /// finding it.
    #[inline]
    pub(super) fn unregister_begin(&self, base: u64) {
        if let Some((registry, device)) = self.registry {
            registry.hide(device, base);
        }
    }

    /// After the device took the segment at `base` back (`gone`) or
    /// refused it.
    #[inline]
    pub(super) fn unregister_end(&self, base: u64, gone: bool) {
        if let Some((registry, device)) = self.registry {
            registry.settle(device, base, gone);
        }
    }

    /// Whether notices were kept since they were last taken.
    #[inline]
    pub(crate) fn has_oom_notices(&self) -> bool {
        !self.oom_kept.is_empty()
    }

    /// The notices kept since the last call (at most 4: a fifth
    /// out-of-memory before they are taken is not told), with the
    /// observers attached now.
    pub(crate) fn take_oom_notices(&mut self) -> OomDelivery {
        OomDelivery {
            observers: self.oom_observers.clone(),
            notices: core::mem::take(&mut self.oom_kept),
        }
    }

    /// Tell the out-of-memory observers now, or keep the notice.
    pub(super) fn notify_out_of_memory(
        &mut self,
        alloc_size: u64,
        device_total: u64,
        device_free: u64,
    ) {
        if self.oom_observers.is_empty() {
            return;
        }
        let notice = OomNotice {
            device: self.backend.ordinal(),
            alloc_size,
            device_total,
            device_free,
        };
        if self.keep_oom {
            let _ = self.oom_kept.push(notice);
        } else {
            deliver(&self.oom_observers, &notice);
        }
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
