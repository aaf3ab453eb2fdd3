//! C callbacks of one kind (out-of-memory observers, their cause
//! observers, trace trackers), each with its caller's user pointer:
//! attached under a lock, called without one. A trace tracker runs at every
//! history entry of every device: its list is read with one atomic load
//! and nothing written, so devices tracked on different threads share no
//! written cache line, and a callback may attach another while the list is
//! being called (it is not called this time).

use crate::error::Res;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// The most callbacks of one kind a process can attach.
pub(crate) const MAX_CALLBACKS: usize = 64;

/// An append-only list of callbacks and their user pointers (kept as
/// integers: the caller's, passed back untouched).
pub(crate) struct Callbacks<F: 'static> {
    slots: [OnceLock<(F, usize)>; MAX_CALLBACKS],
    /// How many slots are set: each is set before it is counted.
    len: AtomicUsize,
    /// Serialises the attachments.
    adding: Mutex<()>,
}

impl<F: Copy + 'static> Callbacks<F> {
    pub(crate) const fn new() -> Self {
        Callbacks {
            slots: [const { OnceLock::new() }; MAX_CALLBACKS],
            len: AtomicUsize::new(0),
            adding: Mutex::new(()),
        }
    }

    /// Attach `callback` with `user`; `what` names the kind in the error
    /// of a full list.
    pub(crate) fn push(&self, callback: F, user: *mut c_void, what: &str) -> Res<()> {
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.len.load(Ordering::Relaxed);
        let slot = self.slots.get(n).ok_or_else(|| {
            format!("{MAX_CALLBACKS} {what}s are attached already (the most a process can have)")
        })?;
        let _ = slot.set((callback, user as usize));
        self.len.store(n + 1, Ordering::Release);
        Ok(())
    }

    /// Whether none is attached.
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// Call `call` with each callback attached so far and its user pointer.
    #[inline]
    pub(crate) fn each(&self, mut call: impl FnMut(F, *mut c_void)) {
        let n = self.len.load(Ordering::Acquire);
        for slot in self.slots.iter().take(n) {
            if let Some(&(f, user)) = slot.get() {
                call(f, user as *mut c_void);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callbacks_are_called_in_order_and_the_list_fills() {
        let list: Callbacks<u32> = Callbacks::new();
        assert!(list.is_empty());
        for k in 0..MAX_CALLBACKS as u32 {
            list.push(k, k as usize as *mut c_void, "test callback")
                .unwrap();
        }
        let e = list
            .push(99, std::ptr::null_mut(), "test callback")
            .unwrap_err();
        assert_eq!(
            e,
            "64 test callbacks are attached already (the most a process can have)"
        );
        let mut seen = Vec::new();
        list.each(|f, user| seen.push((f, user as usize)));
        assert_eq!(seen.len(), MAX_CALLBACKS);
        assert!(seen
            .iter()
            .enumerate()
            .all(|(k, &(f, u))| f as usize == k && u == k));
    }
}
