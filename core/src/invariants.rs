//! [`InvariantViolation`], what every structure's `verify()` returns when
//! its state is broken. The one checker, `DeviceAllocator::check_invariants`
//! (in `allocator/invariants.rs`), composes the structures' own checks
//! (`Arena`, the free index of each pool, the segment index, the live-pointer
//! index, the event queue) with the cross-checks only the whole allocator can
//! make. Unit tests, integration tests, loom models and fuzz targets all call
//! it.

use core::fmt;

/// A broken invariant: what, where (a slot index, when one is involved), and
/// the expected and found values where numbers are involved.
///
/// ```
/// use cachealloc_core::InvariantViolation;
/// let v = InvariantViolation::new("example", Some(3), 1, 2);
/// assert_eq!(v.to_string(), "invariant broken: example (slot 3): expected 1, found 2");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvariantViolation {
    /// The invariant.
    pub what: &'static str,
    /// The slot involved, if one is.
    pub slot: Option<u32>,
    /// The value it should have.
    pub expected: i64,
    /// The value it has.
    pub found: i64,
}

impl InvariantViolation {
    /// A violation of `what` at `slot`.
    pub const fn new(what: &'static str, slot: Option<u32>, expected: i64, found: i64) -> Self {
        InvariantViolation {
            what,
            slot,
            expected,
            found,
        }
    }
}

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant broken: {}", self.what)?;
        if let Some(slot) = self.slot {
            write!(f, " (slot {slot})")?;
        }
        write!(f, ": expected {}, found {}", self.expected, self.found)
    }
}

impl core::error::Error for InvariantViolation {}

/// The violation `what` at `slot`.
pub(crate) const fn fail(
    what: &'static str,
    slot: Option<u32>,
    expected: i64,
    found: i64,
) -> InvariantViolation {
    InvariantViolation::new(what, slot, expected, found)
}

/// `Ok` if `expected == found`, else the violation `what`.
pub(crate) fn expect(
    what: &'static str,
    slot: Option<u32>,
    expected: i64,
    found: i64,
) -> Result<(), InvariantViolation> {
    if expected == found {
        Ok(())
    } else {
        Err(fail(what, slot, expected, found))
    }
}

/// `Ok` if `holds`, else the violation `what` at `slot` (expected 1, found 0).
pub(crate) fn ensure(
    holds: bool,
    what: &'static str,
    slot: Option<u32>,
) -> Result<(), InvariantViolation> {
    if holds {
        Ok(())
    } else {
        Err(fail(what, slot, 1, 0))
    }
}
