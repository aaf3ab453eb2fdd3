//! The small and large pools: [`Pool`], the one mapping from a pool to its
//! index and its block flag, and [`BlockPool`], a pool's cache: the free
//! index (exact order by (stream, size, address), like PyTorch's
//! `BlockPool::blocks`; see `free_index`) and the GC clock PyTorch calls
//! `get_free_blocks_call_count`.

use crate::arena::{BlockSlot, Flags, NIL};
use crate::free_index::FreeIndex;
pub(crate) use crate::free_index::FreeIndexKey;
use crate::index::{self, FreeKey, Links, UnmappedKey};
use crate::invariants::{expect, fail, InvariantViolation};

/// The pool a rounded size is served from.
///
/// ```
/// use cachealloc_core::policy::{pool_for, Pool};
/// assert_eq!(pool_for(1 << 20), Pool::Small);
/// assert_eq!(pool_for((1 << 20) + 512), Pool::Large);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pool {
    /// Rounded sizes up to 1 MiB, packed in 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl Pool {
    /// Both pools, in index order.
    pub(crate) const ALL: [Pool; 2] = [Pool::Small, Pool::Large];

    /// The pool's index: 0 small, 1 large (statistics arrays add 1 for "all").
    #[inline]
    pub(crate) const fn index(self) -> usize {
        match self {
            Pool::Small => 0,
            Pool::Large => 1,
        }
    }

    /// The pool a block belongs to, from its flags.
    #[inline]
    pub(crate) fn of(flags: Flags) -> Pool {
        if flags.contains(Flags::SMALL) {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    /// The flag that marks the pool's blocks.
    #[inline]
    pub(crate) fn flag(self) -> Flags {
        match self {
            Pool::Small => Flags::SMALL,
            Pool::Large => Flags::empty(),
        }
    }
}

/// One pool's cache.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockPool {
    /// The free index.
    free: FreeIndex,
    /// Cached blocks in the index.
    len: u32,
    /// Lookups made while garbage collection was possible.
    gc_clock: u64,
    /// Root of the unmapped index (expandable segments).
    unmapped_root: u32,
    /// Unmapped blocks in it.
    unmapped_len: u32,
}

impl BlockPool {
    pub(crate) const EMPTY: BlockPool = BlockPool {
        free: FreeIndex::EMPTY,
        len: 0,
        gc_clock: 0,
        unmapped_root: NIL,
        unmapped_len: 0,
    };

    /// Add unmapped block `i` to the unmapped index.
    pub(crate) fn insert_unmapped(&mut self, slots: &mut [BlockSlot], i: u32) {
        index::insert::<UnmappedKey>(slots, &mut self.unmapped_root, i);
        self.unmapped_len += 1;
    }

    /// Take unmapped block `i` out of the unmapped index, if it is in.
    pub(crate) fn remove_unmapped(&mut self, slots: &mut [BlockSlot], i: u32) {
        if index::remove::<UnmappedKey>(slots, &mut self.unmapped_root, i) {
            self.unmapped_len -= 1;
        }
    }

    /// The unmapped block with the smallest (stream, address) `>= key`, or `NIL`.
    pub(crate) fn unmapped_lower_bound(&self, slots: &[BlockSlot], key: (u64, u64)) -> u32 {
        index::lower_bound::<UnmappedKey>(slots, self.unmapped_root, key)
    }

    /// The unmapped block after `key`, or `NIL`.
    pub(crate) fn unmapped_successor(&self, slots: &[BlockSlot], key: (u64, u64)) -> u32 {
        index::successor::<UnmappedKey>(slots, self.unmapped_root, key)
    }

    /// Whether unmapped block `i` is in the unmapped index.
    pub(crate) fn contains_unmapped(&self, slots: &[BlockSlot], i: u32) -> bool {
        slots
            .get(i as usize)
            .is_some_and(|s| self.unmapped_lower_bound(slots, UnmappedKey::key(s)) == i)
    }

    /// Unmapped blocks in the unmapped index.
    pub(crate) fn unmapped_len(&self) -> u32 {
        self.unmapped_len
    }

    /// Add slot `i` (its key must not be in the index).
    #[inline]
    pub(crate) fn insert(&mut self, slots: &mut [BlockSlot], i: u32) {
        self.free.insert(slots, i);
        self.len += 1;
    }

    /// Take slot `i` out, if it is in (whether it was).
    #[inline]
    pub(crate) fn remove(&mut self, slots: &mut [BlockSlot], i: u32) -> bool {
        let found = self.free.remove(slots, i);
        if found {
            self.len -= 1;
        }
        found
    }

    /// The cached block with the smallest key `>= key`, or `NIL`.
    #[inline]
    pub(crate) fn lower_bound(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        self.free.lower_bound(slots, key)
    }

    /// The cached block with the smallest key `> key`, or `NIL`.
    #[inline]
    pub(crate) fn successor(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        self.free.successor(slots, key)
    }

    /// The cached block with the largest key `< key`, or `NIL`.
    #[inline]
    pub(crate) fn predecessor(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        self.free.predecessor(slots, key)
    }

    /// Whether a cached block of `size` may take `new_size` in place, its
    /// key's neighbours unchanged (see `FreeIndex::may_resize`).
    #[inline]
    pub(crate) fn may_resize(&self, size: u64, new_size: u64) -> bool {
        self.free.may_resize(size, new_size)
    }

    /// Test hook: the free index uses its bins now (see `FreeIndex`).
    #[cfg(test)]
    pub(crate) fn force_bins(&mut self, slots: &mut [BlockSlot], stream: u64) {
        self.free.force_bins(slots, stream);
    }

    /// Whether slot `i` is in the index (found by a search for its key).
    pub(crate) fn contains(&self, slots: &[BlockSlot], i: u32) -> bool {
        slots
            .get(i as usize)
            .is_some_and(|s| self.lower_bound(slots, FreeKey::key(s)) == i)
    }

    /// Cached blocks in the index.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// The GC clock.
    #[inline]
    pub(crate) fn gc_clock(&self) -> u64 {
        self.gc_clock
    }

    /// One more lookup while garbage collection is possible.
    #[inline]
    pub(crate) fn tick(&mut self) {
        self.gc_clock += 1;
    }

    /// The free index is valid, of at most `limit` blocks, and holds `len`
    /// blocks; likewise the unmapped index. Returns the free index's count.
    pub(crate) fn verify(
        &self,
        slots: &[BlockSlot],
        limit: u32,
    ) -> Result<u32, InvariantViolation> {
        let n = self
            .free
            .verify(slots, limit)
            .map_err(|w| fail(w, None, 0, 1))?;
        expect(
            "free index: size == its count",
            None,
            self.len as i64,
            n as i64,
        )?;
        let u = index::verify::<UnmappedKey>(slots, self.unmapped_root, limit)
            .map_err(|w| fail(w, None, 0, 1))?;
        expect(
            "unmapped index: size == its count",
            None,
            self.unmapped_len as i64,
            u as i64,
        )?;
        Ok(n)
    }
}

/// The small and the large pool.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pools([BlockPool; 2]);

impl Pools {
    pub(crate) const EMPTY: Pools = Pools([BlockPool::EMPTY; 2]);

    /// One pool.
    #[inline]
    pub(crate) fn get(&self, pool: Pool) -> &BlockPool {
        &self.0[pool.index()]
    }

    /// One pool, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, pool: Pool) -> &mut BlockPool {
        &mut self.0[pool.index()]
    }
}
