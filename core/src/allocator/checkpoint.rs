//! Checkpointing a private pool (PyTorch's `getCheckpointState` /
//! `setCheckpointPoolState`, which cudagraph trees use to rewind a shared
//! pool to the layout it had after a recording). A checkpoint is a flat
//! list of [`CheckpointBlock`]s in caller storage: every block of every
//! segment of the pool, segment by segment. Restoring frees every
//! allocated block of the pool, then carves each recorded segment into its
//! recorded blocks (splitting whatever the policy says: PyTorch keeps
//! splitting while space is left), allocating them all, and frees those that
//! were free: the same frees, allocations and statistics as PyTorch's.
//!
//! Differences, on purpose: segments are taken in address order (PyTorch's
//! order is a hash set's); a restore checks everything first and changes
//! nothing when a check fails (PyTorch throws half-way); the stream uses and
//! GC ages PyTorch stores and never reads back are not recorded.
//! Expandable segments are not checkpointed.

use super::{DeviceAllocator, Res};
use crate::allocation::Allocation;
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::pool::Pool;
use crate::private_pool::MempoolId;

/// One block of a checkpointed pool (PyTorch's `BlockState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointBlock {
    /// Its address.
    pub ptr: DevicePtr,
    /// Its size.
    pub size: u64,
    /// Its stream (raw handle value).
    pub stream: u64,
    /// Whether it was allocated (else free).
    pub allocated: bool,
    /// Whether it is the first block of its segment.
    pub segment_start: bool,
}

impl CheckpointBlock {
    /// A placeholder (what storage starts as).
    pub const EMPTY: CheckpointBlock = CheckpointBlock {
        ptr: DevicePtr::NULL,
        size: 0,
        stream: 0,
        allocated: false,
        segment_start: false,
    };
}

/// What a restore did: how many allocations of the pool it freed, how many
/// it made (the checkpoint's allocated blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestoreCounts {
    /// Allocations freed (their pointers in the `freed` output).
    pub freed: usize,
    /// Allocations made (in the `allocated` output).
    pub allocated: usize,
}

fn refuse<T, E>(what: &'static str, ptr: DevicePtr) -> Result<T, Error<E>> {
    Err(Error::Checkpoint { what, ptr })
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// The heads of pool `owner`'s segments, in address order, through `f`.
    fn for_pool_segments(&self, owner: u8, mut f: impl FnMut(u32)) {
        let slots = self.arena.slots();
        let mut h = self.segments.first(slots);
        while h != NIL {
            let next = self.segments.successor(slots, slots[h as usize].addr);
            if slots[h as usize].owner == owner {
                f(h);
            }
            h = next;
        }
    }

    /// The private pool `id` (its owner number).
    fn private_owner(&self, id: MempoolId) -> Res<u8, B> {
        if id.is_default() {
            return Err(Error::UnknownPool { id });
        }
        self.private.owner_of(id).ok_or(Error::UnknownPool { id })
    }

    /// Blocks a checkpoint of pool `id` has (storage to give
    /// [`checkpoint_pool`](Self::checkpoint_pool)).
    pub fn checkpoint_len(&self, id: MempoolId) -> Res<usize, B> {
        let owner = self.private_owner(id)?;
        let mut n = 0;
        self.for_pool_segments(owner, |h| {
            let mut i = h;
            while i != NIL {
                n += 1;
                i = self.slot(i).next;
            }
        });
        Ok(n)
    }

    /// PyTorch's `getCheckpointState`: record every block of pool `id` into
    /// `out` (segment by segment, in address order) after settling the frees
    /// a finished capture deferred. Fails (changing nothing else) when a
    /// block still waits for events, or `out` is too short.
    pub fn checkpoint_pool<'a>(
        &mut self,
        id: MempoolId,
        out: &'a mut [CheckpointBlock],
    ) -> Res<&'a [CheckpointBlock], B> {
        let owner = self.private_owner(id)?;
        if self.deferred.len > 0 {
            self.settle_deferred(false)?;
        }
        let mut n = 0usize;
        let mut problem = None;
        self.for_pool_segments(owner, |h| {
            let mut i = h;
            while i != NIL {
                let s = self.slot(i);
                if s.has(Flags::EXPANDABLE) {
                    problem.get_or_insert((
                        "a pool with expandable segments cannot be checkpointed",
                        s.addr,
                    ));
                } else if s.events > 0 || s.has(Flags::DEFERRED) {
                    problem.get_or_insert((
                        "events should have completed when checkpointing a block",
                        s.addr,
                    ));
                } else if let Some(r) = out.get_mut(n) {
                    *r = CheckpointBlock {
                        ptr: DevicePtr(s.addr),
                        size: s.size,
                        stream: s.stream,
                        allocated: s.has(Flags::ALLOCATED),
                        segment_start: i == h,
                    };
                } else {
                    problem.get_or_insert(("the checkpoint storage is too short", s.addr));
                }
                n += 1;
                i = s.next;
            }
        });
        if let Some((what, addr)) = problem {
            return refuse(what, DevicePtr(addr));
        }
        Ok(&out[..n])
    }

    /// PyTorch's `setCheckpointPoolState`: make pool `id` hold exactly the
    /// layout of `blocks` (a checkpoint of it): every allocation of the pool
    /// is freed (its pointer written to `freed`), each recorded segment is
    /// carved into its recorded blocks, and its allocated blocks become new
    /// allocations (written to `allocated`, with the block size as the
    /// request, as PyTorch does). No device call. Everything is checked
    /// first: a recorded segment that is gone or changed size, a pool block
    /// with events, stream uses or a parked free, a routing to the pool, a
    /// freeable pool, outputs or slots too short, a malformed list; then
    /// nothing changes.
    pub fn restore_pool(
        &mut self,
        id: MempoolId,
        blocks: &[CheckpointBlock],
        freed: &mut [DevicePtr],
        allocated: &mut [Allocation],
    ) -> Res<RestoreCounts, B> {
        let owner = self.validate_restore(id, blocks, freed.len(), allocated.len())?;
        // Phase 1: free every allocation of the pool.
        let mut live = 0usize;
        let mut victims = 0usize;
        self.for_pool_segments(owner, |h| {
            let mut i = h;
            while i != NIL {
                if self.slot(i).has(Flags::ALLOCATED) {
                    if let Some(f) = freed.get_mut(victims) {
                        *f = DevicePtr(self.slot(i).addr);
                    }
                    victims += 1;
                }
                i = self.slot(i).next;
            }
        });
        for &ptr in freed[..victims].iter() {
            let i = self.live.find(self.arena.slots(), ptr.0);
            if i != NIL {
                self.free_slot(i)?;
                live += 1;
            }
        }
        // Per recorded segment: allocate every block, then free the free ones.
        let mut made = 0usize;
        let mut start = 0usize;
        while start < blocks.len() {
            let end = start
                + 1
                + blocks[start + 1..]
                    .iter()
                    .position(|b| b.segment_start)
                    .unwrap_or(blocks.len() - start - 1);
            let seg = &blocks[start..end];
            let mut cur = self.segments.containing(self.arena.slots(), seg[0].ptr.0);
            let kind = Pool::of(self.slot(cur).flags);
            for b in seg {
                let split = self.slot(cur).size > b.size;
                let next_free = {
                    let a = self.carve(cur, b.size, b.size, kind, split);
                    if b.allocated {
                        if let Some(out) = allocated.get_mut(made) {
                            *out = a;
                        }
                        made += 1;
                    }
                    a
                };
                cur = self
                    .slot(self.live.find(self.arena.slots(), next_free.ptr.0))
                    .next;
            }
            for b in seg.iter().filter(|b| !b.allocated) {
                let i = self.live.find(self.arena.slots(), b.ptr.0);
                if i != NIL {
                    self.free_slot(i)?;
                }
            }
            start = end;
        }
        Ok(RestoreCounts {
            freed: live,
            allocated: made,
        })
    }

    /// The checks of a restore; the pool's owner number.
    fn validate_restore(
        &self,
        id: MempoolId,
        blocks: &[CheckpointBlock],
        freed_room: usize,
        allocated_room: usize,
    ) -> Res<u8, B> {
        let owner = self.private_owner(id)?;
        let here = DevicePtr::NULL;
        if self.private.get(owner).is_none_or(|p| p.use_count == 0) {
            return Err(Error::PoolFreeable { id });
        }
        if self.routes.iter().any(|r| r.owner == owner) {
            return refuse("the pool is being routed to", here);
        }
        let (mut live, mut blocks_now, mut segs_now) = (0usize, 0i64, 0i64);
        let mut busy = None;
        let mut expandable = false;
        let mut shared = None;
        self.for_pool_segments(owner, |h| {
            segs_now += 1;
            let mut i = h;
            while i != NIL {
                let s = self.slot(i);
                blocks_now += 1;
                live += s.has(Flags::ALLOCATED) as usize;
                if s.events > 0 || s.flags.intersects(Flags::DEFERRED | Flags::HAS_USES) {
                    busy.get_or_insert(s.addr);
                }
                expandable |= s.has(Flags::EXPANDABLE);
                if s.has(Flags::ALLOCATED) {
                    if let Some(p) = self.shares_in(s.addr, s.end()) {
                        shared.get_or_insert(p);
                    }
                }
                i = s.next;
            }
        });
        if let Some(p) = shared {
            return refuse(
                "a block of the pool is shared through IPC (release its shares first)",
                DevicePtr(p),
            );
        }
        if expandable {
            return refuse("a pool with expandable segments cannot be restored", here);
        }
        if let Some(addr) = busy {
            return refuse(
                "a block of the pool has events, stream uses or a parked free",
                DevicePtr(addr),
            );
        }
        if freed_room < live {
            return refuse("the output for freed pointers is too short", here);
        }
        let wanted = blocks.iter().filter(|b| b.allocated).count();
        if allocated_room < wanted {
            return refuse("the output for allocations is too short", here);
        }
        let mut recorded_blocks = 0i64;
        let mut recorded_segs = 0i64;
        let mut k = 0usize;
        while k < blocks.len() {
            let b0 = blocks[k];
            if !b0.segment_start {
                return refuse(
                    "a checkpoint must start each segment with its first block",
                    b0.ptr,
                );
            }
            let mut end = b0.ptr.0;
            let mut n = 0usize;
            while let Some(b) = blocks.get(k + n).filter(|b| n == 0 || !b.segment_start) {
                if b.ptr.0 != end || b.size == 0 || b.size % crate::policy::MIN_BLOCK_SIZE != 0 {
                    return refuse("the blocks of a checkpointed segment do not tile it", b.ptr);
                }
                end += b.size;
                n += 1;
            }
            let slots = self.arena.slots();
            let h = self.segments.containing(slots, b0.ptr.0);
            if h == NIL || slots[h as usize].addr != b0.ptr.0 || slots[h as usize].owner != owner {
                return refuse(
                    "could not find the checkpointed segment in the pool",
                    b0.ptr,
                );
            }
            if slots[h as usize].seg_size != end - b0.ptr.0 {
                return refuse("a checkpointed segment changed size", b0.ptr);
            }
            recorded_blocks += n as i64;
            recorded_segs += 1;
            k += n;
        }
        // Slots after the restore (the most it ever holds): every pool
        // segment whole, plus the recorded splits.
        let needed = self.arena.in_use() as i64 - (blocks_now - segs_now)
            + (recorded_blocks - recorded_segs);
        if needed > self.arena.capacity() as i64 {
            return refuse("too few block slots for the checkpointed layout", here);
        }
        Ok(owner)
    }
}
