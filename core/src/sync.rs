//! The only file that names a lock. Under `cfg(loom)` the locks are loom's
//! (so the models explore every interleaving), with the `std` feature they
//! are `std::sync::{Mutex, RwLock}`, otherwise `spin`'s (`no_std`).

cfg_if::cfg_if! {
    if #[cfg(loom)] {
        use loom::sync::Mutex as Inner;
        use loom::sync::RwLock as RwInner;
        /// The guard of [`Mutex`].
        pub(crate) type Guard<'a, T> = loom::sync::MutexGuard<'a, T>;
        /// The guards of [`RwLock`].
        pub(crate) type ReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
        pub(crate) type WriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;
    } else if #[cfg(feature = "std")] {
        use std::sync::Mutex as Inner;
        use std::sync::RwLock as RwInner;
        /// The guard of [`Mutex`].
        pub(crate) type Guard<'a, T> = std::sync::MutexGuard<'a, T>;
        /// The guards of [`RwLock`].
        pub(crate) type ReadGuard<'a, T> = std::sync::RwLockReadGuard<'a, T>;
        pub(crate) type WriteGuard<'a, T> = std::sync::RwLockWriteGuard<'a, T>;
    } else {
        use spin::Mutex as Inner;
        use spin::RwLock as RwInner;
        /// The guard of [`Mutex`].
        pub(crate) type Guard<'a, T> = spin::MutexGuard<'a, T>;
        /// The guards of [`RwLock`].
        pub(crate) type ReadGuard<'a, T> = spin::RwLockReadGuard<'a, T>;
        pub(crate) type WriteGuard<'a, T> = spin::RwLockWriteGuard<'a, T>;
    }
}

/// A mutual-exclusion lock over the chosen primitive. A poisoned lock (a
/// panic while held, which the allocator never causes) is taken over rather
/// than propagated: the allocator's state is consistent between operations.
pub(crate) struct Mutex<T>(Inner<T>);

impl<T> Mutex<T> {
    #[cfg(not(loom))]
    pub(crate) const fn new(value: T) -> Self {
        Mutex(Inner::new(value))
    }

    #[cfg(loom)]
    #[inline(always)]
    pub(crate) fn new(value: T) -> Self {
        Mutex(Inner::new(value))
    }

    #[inline]
    pub(crate) fn lock(&self) -> Guard<'_, T> {
        cfg_if::cfg_if! {
            if #[cfg(any(loom, feature = "std"))] {
                self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
            } else {
                self.0.lock()
            }
        }
    }

    pub(crate) fn into_inner(self) -> T {
        cfg_if::cfg_if! {
            if #[cfg(any(loom, feature = "std"))] {
                self.0.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner())
            } else {
                self.0.into_inner()
            }
        }
    }
}

/// A reader-writer lock over the chosen primitive; poisoning is taken over
/// as for [`Mutex`].
pub(crate) struct RwLock<T>(RwInner<T>);

impl<T> RwLock<T> {
    #[cfg(not(loom))]
    pub(crate) const fn new(value: T) -> Self {
        RwLock(RwInner::new(value))
    }

    #[cfg(loom)]
    pub(crate) fn new(value: T) -> Self {
        RwLock(RwInner::new(value))
    }

    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        cfg_if::cfg_if! {
            if #[cfg(any(loom, feature = "std"))] {
                self.0.read().unwrap_or_else(|poisoned| poisoned.into_inner())
            } else {
                self.0.read()
            }
        }
    }

    #[inline]
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        cfg_if::cfg_if! {
            if #[cfg(any(loom, feature = "std"))] {
                self.0.write().unwrap_or_else(|poisoned| poisoned.into_inner())
            } else {
                self.0.write()
            }
        }
    }
}
