//! The small and large pools: each a free index (a treap root) and the GC
//! clock PyTorch calls `get_free_blocks_call_count`.

use crate::arena::{Flags, NIL};
use crate::policy::Pool;

/// One pool's cache.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockPool {
    /// Root of the free index keyed (stream, size, address).
    pub(crate) root: u32,
    /// Number of cached blocks in the index.
    pub(crate) len: u32,
    /// Lookups made while garbage collection was possible.
    pub(crate) gc_clock: u64,
}

impl BlockPool {
    pub(crate) const EMPTY: BlockPool = BlockPool {
        root: NIL,
        len: 0,
        gc_clock: 0,
    };
}

/// The pool a block belongs to, from its flags.
#[inline]
pub(crate) fn pool_of(flags: Flags) -> Pool {
    if flags.contains(Flags::SMALL) {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The flag that marks a pool's blocks.
#[inline]
pub(crate) fn pool_flag(pool: Pool) -> Flags {
    match pool {
        Pool::Small => Flags::SMALL,
        Pool::Large => Flags::empty(),
    }
}
