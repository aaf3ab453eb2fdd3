//! [`Liveness`]: the one place that enforces the format's liveness rules,
//! for `check` and `replay` alike: an `alloc` needs an id that is not live,
//! a `free` or `record_stream` one that is. Each live id carries what its
//! user needs (a size for `check`, the allocation for `replay`).

use crate::error::{LivenessError, Op};
use rustc_hash::FxHashMap;

/// The live ids of a trace, each with a value.
#[derive(Debug)]
pub struct Liveness<T> {
    live: FxHashMap<u64, T>,
}

impl<T> Default for Liveness<T> {
    fn default() -> Self {
        Liveness {
            live: FxHashMap::default(),
        }
    }
}

impl<T> Liveness<T> {
    /// No id live.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether an `alloc` of `id` is allowed (it is not live).
    #[inline]
    pub fn can_alloc(&self, id: u64) -> Result<(), LivenessError> {
        if self.live.contains_key(&id) {
            Err(LivenessError { op: Op::Alloc, id })
        } else {
            Ok(())
        }
    }

    /// `alloc` of `id`: it becomes live with `value`.
    #[inline]
    pub fn alloc(&mut self, id: u64, value: T) -> Result<(), LivenessError> {
        match self.live.entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => {
                Err(LivenessError { op: Op::Alloc, id })
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(value);
                Ok(())
            }
        }
    }

    /// `free` of `id`: it is no longer live; its value.
    #[inline]
    pub fn free(&mut self, id: u64) -> Result<T, LivenessError> {
        self.live
            .remove(&id)
            .ok_or(LivenessError { op: Op::Free, id })
    }

    /// `record_stream` of `id`: its value.
    #[inline]
    pub fn record_stream(&self, id: u64) -> Result<&T, LivenessError> {
        self.live.get(&id).ok_or(LivenessError {
            op: Op::RecordStream,
            id,
        })
    }

    /// Live ids.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no id is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The values of the live ids (in no particular order).
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.live.values()
    }

    /// Forget every live id, yielding their values.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.live.drain().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_and_their_messages() {
        let mut l = Liveness::new();
        l.alloc(1, 10u64).unwrap();
        assert_eq!(
            l.alloc(1, 20).unwrap_err().to_string(),
            "alloc of id 1, which is already live"
        );
        assert_eq!(l.record_stream(1), Ok(&10));
        assert_eq!(l.free(1), Ok(10));
        assert_eq!(
            l.free(1).unwrap_err().to_string(),
            "free of id 1, which is not live"
        );
        assert_eq!(
            l.record_stream(2).unwrap_err().to_string(),
            "record_stream of id 2, which is not live"
        );
        assert!(l.is_empty());
    }
}
