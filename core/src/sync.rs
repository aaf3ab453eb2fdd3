//! The only file that names a lock or an atomic. Under `cfg(loom)` they are
//! loom's (so the models explore every interleaving); otherwise, with the
//! `std` feature the locks are `std::sync::Mutex` (whose waiters back off
//! first: [`Held`]), without it `spin`'s (`no_std`), and the atomics are
//! `core`'s.

cfg_if::cfg_if! {
    if #[cfg(loom)] {
        use loom::sync::Mutex as Inner;
        /// The guard of [`Mutex`].
        pub(crate) type Guard<'a, T> = loom::sync::MutexGuard<'a, T>;
    } else if #[cfg(feature = "std")] {
        use std::sync::Mutex as Inner;
        use std::sync::TryLockError;
        /// The guard of [`Mutex`].
        pub(crate) type Guard<'a, T> = std::sync::MutexGuard<'a, T>;
    } else {
        use spin::Mutex as Inner;
        /// The guard of [`Mutex`].
        pub(crate) type Guard<'a, T> = spin::MutexGuard<'a, T>;
    }
}

/// A mutual-exclusion lock over the chosen primitive. A poisoned lock (a
/// panic while it was held: a caller's trace tracker, say, or a bug) is
/// taken over rather than propagated: `CachingAllocator` keeps its own mark
/// of a call that never finished and refuses every later call on that
/// device itself (`Error::DeviceFailed`), and the segment table's writers
/// finish each change before anything can panic.
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

    /// The lock, marked held in `held` while it is ([`Held`]): with `std`,
    /// a waiter backs off on the mark ([`lock_contended`](Self::lock_contended)),
    /// and `None` for a thread that runs a callback under a lock
    /// ([`in_callback`]) and finds this one held: it may be its own, which
    /// it would wait for for ever. Elsewhere this is [`lock`](Self::lock).
    #[inline(always)]
    pub(crate) fn lock_marked(&self, held: &Held) -> Option<Guard<'_, T>> {
        cfg_if::cfg_if! {
            if #[cfg(all(feature = "std", not(loom)))] {
                let g = match self.try_lock() {
                    Some(g) => g,
                    None => self.lock_contended(held)?,
                };
                held.set();
                Some(g)
            } else {
                let _ = held;
                Some(self.lock())
            }
        }
    }

    /// The lock if it is free now.
    #[cfg(all(feature = "std", not(loom)))]
    #[inline(always)]
    fn try_lock(&self) -> Option<Guard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The lock, which [`try_lock`](Self::try_lock) found held: after
    /// backing off on `held` ([`Held`]).
    #[cfg(all(feature = "std", not(loom)))]
    #[cold]
    #[inline(never)]
    fn lock_contended(&self, held: &Held) -> Option<Guard<'_, T>> {
        if IN_CALLBACK.try_with(Cell::get).unwrap_or(0) > 0 {
            return None;
        }
        for doubling in 0..BACKOFF_DOUBLINGS {
            for _ in 0..1u32 << doubling {
                core::hint::spin_loop();
            }
            if !held.is_set() {
                if let Some(g) = self.try_lock() {
                    return Some(g);
                }
            }
        }
        Some(self.lock())
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

cfg_if::cfg_if! {
    if #[cfg(loom)] {
        pub(crate) use loom::sync::atomic::{fence, AtomicU64, AtomicUsize};
        /// A spinning wait's pause (loom's lets the other threads run).
        pub(crate) use loom::hint::spin_loop;
    } else {
        pub(crate) use core::sync::atomic::{fence, AtomicU64, AtomicUsize};
        pub(crate) use core::hint::spin_loop;
    }
}

/// Whether a [`Mutex`] is held, beside it, for its waiters to back off on
/// ([`Mutex::lock_contended`]): the holder sets it once it has the lock and
/// clears it before it lets go. With `std` only (a spin lock's waiters
/// spin anyway, and loom's models need no hint); elsewhere it is nothing.
///
/// A waiter backs off with waits that double (1, 2, 4, ... up to 512
/// spin-loop pauses, 1,023 in all), reading only this mark, and tries the
/// lock when it looks free; after the last wait it blocks in the lock
/// (which sleeps). The holder of a device's lock usually leaves within
/// some tens of nanoseconds and comes back as quickly: a waiter that backs
/// off lets it run many calls in a row with the allocator's cache lines on
/// its core, where one that takes the lock at every release makes each
/// call pay for moving them (and `std`'s lock, once a waiter sleeps, a
/// wake-up call at every release). The waits only read the mark: trying
/// the lock at each one is a write, which takes the line from the holder.
/// A holder that stays (a device malloc) costs a waiter those pauses
/// before it sleeps. (BENCHMARKS.md, "Threads".)
pub(crate) struct Held {
    #[cfg(all(feature = "std", not(loom)))]
    held: core::sync::atomic::AtomicBool,
}

/// A holder's handle on the [`Held`] mark ([`Held::by_ref`]).
#[cfg(all(feature = "std", not(loom)))]
pub(crate) type HeldRef<'a> = &'a Held;

/// A holder's handle on the [`Held`] mark: nothing without `std`.
#[cfg(not(all(feature = "std", not(loom))))]
#[derive(Clone, Copy)]
pub(crate) struct HeldRef<'a>(core::marker::PhantomData<&'a Held>);

#[cfg(not(all(feature = "std", not(loom))))]
impl HeldRef<'_> {
    /// Nothing to clear.
    #[inline(always)]
    pub(crate) fn clear(&self) {}
}

#[cfg(all(feature = "std", not(loom)))]
std::thread_local! {
    /// How deep this thread is in callbacks that run under a device's lock
    /// ([`in_callback`]).
    static IN_CALLBACK: Cell<u32> = const { Cell::new(0) };
}

#[cfg(all(feature = "std", not(loom)))]
use core::cell::Cell;

/// Run `f`, a caller's callback that runs while a device's lock is held (a
/// trace tracker, a segment source, a stream filter, a free-memory
/// callback): with `std`, a lock this thread finds held meanwhile is
/// refused ([`Mutex::lock_marked`]) instead of waited for, since it may be
/// the one held around `f`. Costs only the callbacks (two thread-local
/// writes); the uncontended lock never looks.
#[inline]
pub(crate) fn in_callback<R>(f: impl FnOnce() -> R) -> R {
    cfg_if::cfg_if! {
        if #[cfg(all(feature = "std", not(loom)))] {
            /// Leaves the depth as it was, even if `f` unwinds.
            struct Depth;
            impl Drop for Depth {
                fn drop(&mut self) {
                    let _ = IN_CALLBACK.try_with(|d| d.set(d.get().saturating_sub(1)));
                }
            }
            let _ = IN_CALLBACK.try_with(|d| d.set(d.get().saturating_add(1)));
            let _depth = Depth;
            f()
        } else {
            f()
        }
    }
}

/// How many times a waiter doubles its wait ([`Held`]).
#[cfg(all(feature = "std", not(loom)))]
const BACKOFF_DOUBLINGS: u32 = 10;

impl Held {
    pub(crate) const fn new() -> Self {
        Held {
            #[cfg(all(feature = "std", not(loom)))]
            held: core::sync::atomic::AtomicBool::new(false),
        }
    }

    /// What a lock's holder keeps to clear the mark when it lets go: a
    /// reference with `std`, nothing elsewhere.
    #[inline(always)]
    pub(crate) fn by_ref(&self) -> HeldRef<'_> {
        cfg_if::cfg_if! {
            if #[cfg(all(feature = "std", not(loom)))] {
                self
            } else {
                HeldRef(core::marker::PhantomData)
            }
        }
    }

    /// The lock was taken.
    #[cfg(all(feature = "std", not(loom)))]
    #[inline(always)]
    fn set(&self) {
        self.held.store(true, core::sync::atomic::Ordering::Relaxed);
    }

    /// The lock is about to be released.
    #[cfg(all(feature = "std", not(loom)))]
    #[inline(always)]
    pub(crate) fn clear(&self) {
        self.held
            .store(false, core::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the lock looks held.
    #[cfg(all(feature = "std", not(loom)))]
    #[inline(always)]
    fn is_set(&self) -> bool {
        self.held.load(core::sync::atomic::Ordering::Relaxed)
    }
}
