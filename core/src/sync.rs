//! The only file that names a lock. Under `cfg(loom)` the lock is loom's
//! (so the models explore every interleaving), with the `std` feature it is
//! `std::sync::Mutex`, otherwise `spin::Mutex` (`no_std`).

cfg_if::cfg_if! {
    if #[cfg(loom)] {
        use loom::sync::Mutex as Inner;
        /// The guard of [`Mutex`].
        pub(crate) type Guard<'a, T> = loom::sync::MutexGuard<'a, T>;
    } else if #[cfg(feature = "std")] {
        use std::sync::Mutex as Inner;
        /// The guard of [`Mutex`].
        pub(crate) type Guard<'a, T> = std::sync::MutexGuard<'a, T>;
    } else {
        use spin::Mutex as Inner;
        /// The guard of [`Mutex`].
        pub(crate) type Guard<'a, T> = spin::MutexGuard<'a, T>;
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
