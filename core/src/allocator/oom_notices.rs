//! Out-of-memory notices for the observers: told at once by a bare
//! allocator, kept while a thread-safe front end holds its lock and
//! delivered after it is released (PyTorch unlocks before it calls them);
//! and the device's last verdict, with its bytes.

use super::DeviceAllocator;
use crate::arena::BlockSlot;
use crate::backend::DeviceBackend;
use crate::error::OomReport;
use crate::history::{HistoryStorage, OutOfMemoryObserver};
use crate::oom_cause::{OomCause, OomClass};

/// An out-of-memory to tell the observers about: the report, the verdict
/// with its bytes, and the total the observers' four-number call names
/// (the memory limit, when one is set).
#[derive(Clone, Copy)]
pub(crate) struct OomNotice {
    pub(crate) report: OomReport,
    pub(crate) cause: OomCause,
    pub(crate) device_total: u64,
}

/// The notices a call left, with the observers to tell (taken under the
/// lock, delivered after it).
pub(crate) struct OomDelivery {
    observers: heapless::Vec<&'static dyn OutOfMemoryObserver, { super::MAX_CALLBACKS }>,
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
    let r = &n.report;
    if r.class == OomClass::Rejected {
        for o in observers {
            o.oom_rejected_explained(r, &n.cause);
            o.oom_rejected(r.device, r.alloc_size, r.reserved, r.device_total);
        }
        return;
    }
    for o in observers {
        o.out_of_memory_explained(r, &n.cause);
        o.out_of_memory(r.device, r.alloc_size, n.device_total, r.device_free);
    }
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
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

    /// Why the last allocation that ran out of memory did, with the bytes
    /// behind the verdict (its error, [`OomReport`], names only the
    /// class). `None` before the first. Several threads sharing a device
    /// see each other's: an observer gets the verdict of the
    /// out-of-memory it is told of
    /// ([`OutOfMemoryObserver::out_of_memory_explained`]).
    pub fn last_oom_cause(&self) -> Option<OomCause> {
        self.last_ooms.back().map(|&(_, c)| c)
    }

    /// The verdict on out-of-memory number `seq` (its error's
    /// [`OomReport::seq`]), while the device keeps it: the last
    /// [`OOM_CAUSES_KEPT`](super::OOM_CAUSES_KEPT) are kept, so a thread
    /// finds its own failure's even after other out-of-memories on the
    /// device (an observer's, another thread's).
    pub fn oom_cause(&self, seq: u32) -> Option<OomCause> {
        self.last_ooms
            .iter()
            .rev()
            .find(|&&(n, _)| n == seq)
            .map(|&(_, c)| c)
    }

    /// The number of the next out-of-memory.
    pub(super) fn next_oom_seq(&mut self) -> u32 {
        self.oom_seq = self.oom_seq.wrapping_add(1);
        self.oom_seq
    }

    /// Keep the verdict, and tell the out-of-memory observers now or keep
    /// the notice.
    pub(super) fn notify_out_of_memory(
        &mut self,
        report: &OomReport,
        cause: &OomCause,
        device_total: u64,
    ) {
        if self.last_ooms.is_full() {
            self.last_ooms.pop_front();
        }
        // Not full: room was made above.
        let _ = self.last_ooms.push_back((report.seq, *cause));
        if self.oom_observers.is_empty() {
            return;
        }
        let notice = OomNotice {
            report: *report,
            cause: *cause,
            device_total,
        };
        if self.keep_oom {
            let _ = self.oom_kept.push(notice);
        } else {
            deliver(&self.oom_observers, &notice);
        }
    }
}
