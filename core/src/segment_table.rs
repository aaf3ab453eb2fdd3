//! Which device owns an address, answered without taking any lock and
//! without writing anything shared: a [`SegmentRegistry`] that the
//! allocators of several devices keep up to date (each under its own lock)
//! and that lookups read on their own. [`SegmentTable`] is the one
//! implementation: fixed capacity (no heap) for `MultiDeviceAllocator`, or
//! growing in chunks the host gives it (the C library).
//!
//! The contract that makes a lookup right: an allocator registers a
//! segment (or an expandable segment's address-space reservation) after
//! the device made it and before any of it is handed out, and hides it
//! before the device takes it back. So the visible entries are always
//! ranges that their device holds at that moment (the driver never hands
//! one address range to two holders), and a pointer to a live allocation
//! is always found on its device. A pointer to memory being created or
//! released may be "unknown" for a moment; it is never given to another
//! device.

use crate::sync::{fence, spin_loop, AtomicU64, AtomicUsize, Mutex};
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// Why a registry refused a new segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistryRefusal {
    /// No room for another entry.
    Full {
        /// The registry's capacity.
        capacity: usize,
    },
    /// The range overlaps a visible segment of `device`: the backend
    /// handed out memory that another holder holds.
    Overlaps {
        /// The device that holds the overlapping segment.
        device: u32,
    },
}

/// Segment ranges by device, shared by the allocators of several devices
/// (each calls it under its own lock, with the device number it was given)
/// and read by lookups that take no allocator's lock.
pub trait SegmentRegistry: Sync {
    /// Device `device` holds `[base, base + size)` from now on (it made it;
    /// nothing of it is handed out yet).
    fn insert(&self, device: u32, base: u64, size: u64) -> Result<(), RegistryRefusal>;
    /// The segment of `device` at `base` is about to go back to the device:
    /// lookups no longer find it.
    fn hide(&self, device: u32, base: u64);
    /// The hidden segment of `device` at `base` is gone (`gone`: the device
    /// took it back, forget it) or stays (the device refused it: lookups find
    /// it again).
    fn settle(&self, device: u32, base: u64, gone: bool);
    /// The device whose visible segment contains `ptr`.
    fn owner(&self, ptr: u64) -> Option<u32>;
    /// Whether `[base, base + size)` is a visible segment of `device` (the
    /// invariant checker's question).
    fn holds(&self, device: u32, base: u64, size: u64) -> bool;
    /// How many segments of `device` the registry has, visible or hidden.
    fn count(&self, device: u32) -> usize;
}

/// One range, as the table stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    base: u64,
    end: u64,
    device: u32,
    /// A release is in flight: lookups step over it.
    hidden: bool,
    /// Removed (a tombstone): it keeps its base, so the entries stay
    /// sorted, and everything steps over it until a compaction drops it or
    /// an insertion next to it takes its slot.
    dead: bool,
}

impl Entry {
    /// Whether lookups may answer with it.
    fn visible(&self) -> bool {
        !self.hidden && !self.dead
    }
}

/// [`Entry::hidden`] in a slot's `tag` (the device is the low 32 bits).
const HIDDEN: u64 = 1 << 32;
/// [`Entry::dead`] in a slot's `tag`.
const DEAD: u64 = 1 << 33;

/// Room for one entry of a [`SegmentTable`]: given to
/// [`SegmentTable::with_growth`]'s function by the host, in chunks, for
/// good (a lookup may be reading one while the table grows).
#[derive(Debug, Default)]
pub struct SegmentSlot {
    base: AtomicU64,
    end: AtomicU64,
    tag: AtomicU64,
}

impl SegmentSlot {
    /// An empty slot (`const`, for statics; not under loom).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        SegmentSlot {
            base: AtomicU64::new(0),
            end: AtomicU64::new(0),
            tag: AtomicU64::new(0),
        }
    }

    fn load(&self) -> Entry {
        let tag = self.tag.load(Relaxed);
        Entry {
            base: self.base.load(Relaxed),
            end: self.end.load(Relaxed),
            device: tag as u32,
            hidden: tag & HIDDEN != 0,
            dead: tag & DEAD != 0,
        }
    }

    fn store(&self, e: Entry) {
        self.base.store(e.base, Relaxed);
        self.end.store(e.end, Relaxed);
        let marks = if e.hidden { HIDDEN } else { 0 } | if e.dead { DEAD } else { 0 };
        self.tag.store(u64::from(e.device) | marks, Relaxed);
    }
}

/// Where a growing [`SegmentTable`] gets room: `more(n)` gives at least
/// `n` empty slots for good, or `None`.
pub type MoreSlots = fn(usize) -> Option<&'static [SegmentSlot]>;

/// The most chunks a table grows by (chunk `k` has `N << (k - 1)` slots:
/// the table holds `N << k` entries after `k` of them).
const CHUNKS: usize = 32;

/// A [`SegmentRegistry`] kept sorted by base address.
///
/// A lookup takes no lock and writes nothing: it reads the entries between
/// two reads of a sequence number that writers make odd while they change
/// the table (a seqlock), and reads them again if it changed; a binary
/// search over up to `N` entries (or the grown table's). So a free by
/// pointer (torch's `raw_delete`, which knows no device) shares no written
/// cache line between threads, on one device or several.
///
/// Writes are small, so a lookup never waits long behind one: a writer
/// finds its entry by binary search and changes one slot to hide it, show
/// it again or remove it (a tombstone that keeps its base, so the entries
/// stay sorted). An insertion takes a tombstone next to its place, or
/// shifts the entries up to the nearest one (or to the end). Tombstones
/// at the end are dropped at once; when they pass half the entries, one
/// write compacts the table (once per as many removals as it has entries).
///
/// `N` entries live inline (no heap). A full table refuses the new
/// segment, which its allocator then gives back
/// (`Error::SegmentTableFull`), unless it was given
/// [`with_growth`](Self::with_growth): it then asks for chunks of `N`,
/// `2N`, `4N`, ... slots, which it keeps for good (lookups may be reading
/// them), so it holds at most twice its largest size.
///
/// ```
/// use cachealloc_core::{SegmentRegistry, SegmentTable};
/// let t = SegmentTable::<8>::new();
/// t.insert(1, 0x1000, 0x1000).unwrap();
/// assert_eq!(t.owner(0x1fff), Some(1));
/// t.hide(1, 0x1000); // about to be freed
/// assert_eq!(t.owner(0x1000), None);
/// t.settle(1, 0x1000, true);
/// assert_eq!(t.count(1), 0);
/// ```
pub struct SegmentTable<const N: usize> {
    /// Even while the table is stable, odd while a writer changes it.
    seq: AtomicUsize,
    /// Slots in use, tombstones included.
    len: AtomicUsize,
    /// Tombstones among them (changed under the writers' lock).
    dead: AtomicUsize,
    inline: [SegmentSlot; N],
    /// Chunk `k` (from 1) at `chunks[k - 1]`, set once.
    chunks: [spin::Once<&'static [SegmentSlot]>; CHUNKS],
    grow: Option<MoreSlots>,
    /// Serialises the writers (the allocators of different devices).
    writer: Mutex<()>,
}

impl<const N: usize> SegmentTable<N> {
    /// An empty table of `N` entries (`const`, for statics; not under
    /// loom).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        SegmentTable {
            seq: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            dead: AtomicUsize::new(0),
            inline: [const { SegmentSlot::new() }; N],
            chunks: [const { spin::Once::new() }; CHUNKS],
            grow: None,
            writer: Mutex::new(()),
        }
    }

    /// An empty table of `N` entries.
    #[cfg(loom)]
    pub fn new() -> Self {
        SegmentTable {
            seq: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            dead: AtomicUsize::new(0),
            inline: core::array::from_fn(|_| SegmentSlot::default()),
            chunks: core::array::from_fn(|_| spin::Once::new()),
            grow: None,
            writer: Mutex::new(()),
        }
    }

    /// A table that grows when full: `more(n)` gives at least `n` empty
    /// slots for good (say, a leaked `Box<[SegmentSlot]>`), or `None` (the
    /// table is full, as without it).
    pub const fn with_growth(mut self, more: MoreSlots) -> Self {
        self.grow = Some(more);
        self
    }

    /// Segments it holds, visible or hidden.
    pub fn len(&self) -> usize {
        self.read(|t, len| len.saturating_sub(t.dead.load(Relaxed)))
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots in use, tombstones of removed segments included (at most
    /// twice [`len`](Self::len), plus one).
    pub fn slots_in_use(&self) -> usize {
        self.len.load(Acquire)
    }

    /// Entries it has room for now.
    pub fn capacity(&self) -> usize {
        let chunks = self.chunks.iter().take_while(|c| c.get().is_some()).count();
        N << chunks
    }

    /// Slot `i`, if the table has room for it.
    fn slot(&self, i: usize) -> Option<&SegmentSlot> {
        if i < N || N == 0 {
            return self.inline.get(i);
        }
        // Chunk k holds the slots from N << (k - 1) to N << k.
        let k = (usize::BITS - (i / N).leading_zeros()) as usize;
        let chunk = self.chunks.get(k.checked_sub(1)?)?.get()?;
        chunk.get(i - (N << (k - 1)))
    }

    /// Entry `i` (a writer's read, or a lookup's, which checks the
    /// sequence number after it).
    fn entry(&self, i: usize) -> Option<Entry> {
        self.slot(i).map(SegmentSlot::load)
    }

    /// Run `f` on a consistent view of the table: read between two equal
    /// even sequence numbers (again, if a writer changed it meanwhile).
    /// `f` may see a torn view on the reads that are thrown away: it must
    /// only read (entries past the end read as missing).
    fn read<R>(&self, f: impl Fn(&Self, usize) -> R) -> R {
        loop {
            let before = self.seq.load(Acquire);
            if before & 1 == 0 {
                let r = f(self, self.len.load(Relaxed));
                fence(Acquire);
                if self.seq.load(Relaxed) == before {
                    return r;
                }
            }
            spin_loop();
        }
    }

    /// Change the table with the sequence number odd while `f` runs
    /// (lookups meanwhile read again). The caller holds the writers' lock.
    fn change<R>(&self, f: impl FnOnce(&Self) -> R) -> R {
        let seq = self.seq.load(Relaxed);
        self.seq.store(seq.wrapping_add(1), Relaxed);
        fence(Release);
        let r = f(self);
        self.seq.store(seq.wrapping_add(2), Release);
        r
    }

    /// The number of entries of the first `len` whose base is at or below
    /// `at` (they are sorted by base, tombstones included).
    fn partition(&self, len: usize, at: u64) -> usize {
        let (mut lo, mut hi) = (0, len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.entry(mid) {
                Some(e) if e.base <= at => lo = mid + 1,
                Some(_) => hi = mid,
                None => return lo,
            }
        }
        lo
    }

    /// The visible entry of the first `len` whose range contains `ptr`.
    fn visible_at(&self, len: usize, ptr: u64) -> Option<Entry> {
        // Visible ranges never overlap: the candidate is the visible entry
        // with the highest base at or below `ptr`. Hidden ones (a release
        // in flight) may overlap a newer segment, tombstones are gone: both
        // are stepped over.
        (0..self.partition(len, ptr))
            .rev()
            .filter_map(|i| self.entry(i))
            .find(Entry::visible)
            .filter(|e| ptr < e.end)
    }

    /// Make room for slot `len` (a writer's): a chunk more if it grows.
    fn room(&self, len: usize) -> Result<(), RegistryRefusal> {
        if self.slot(len).is_some() {
            return Ok(());
        }
        let full = RegistryRefusal::Full {
            capacity: self.capacity(),
        };
        if N == 0 {
            return Err(full);
        }
        let k = (usize::BITS - (len / N).leading_zeros()) as usize;
        let (Some(grow), Some(once)) = (self.grow, self.chunks.get(k.wrapping_sub(1))) else {
            return Err(full);
        };
        let want = N << (k - 1);
        match grow(want) {
            Some(chunk) if chunk.len() >= want => {
                once.call_once(|| chunk);
                Ok(())
            }
            _ => Err(full),
        }
    }

    /// The position of `device`'s live entry at `base` among the first
    /// `len`, hidden or not as asked: a binary search, then a step back
    /// over the entries of the same base (tombstones, or another device's
    /// hidden one).
    fn find(&self, len: usize, device: u32, base: u64, hidden: bool) -> Option<usize> {
        let mut i = self.partition(len, base);
        while i > 0 {
            i -= 1;
            let e = self.entry(i)?;
            if e.base != base {
                return None;
            }
            if !e.dead && e.device == device && e.hidden == hidden {
                return Some(i);
            }
        }
        None
    }

    /// Whether entry `i` is a tombstone.
    fn is_dead(&self, i: usize) -> bool {
        self.entry(i).is_some_and(|e| e.dead)
    }

    /// Set the marks of entry `i` (one slot's write).
    fn mark(&self, i: usize, hidden: bool, dead: bool) {
        if let (Some(slot), Some(e)) = (self.slot(i), self.entry(i)) {
            slot.store(Entry { hidden, dead, ..e });
        }
    }

    /// Move entry `from` to slot `to`.
    fn copy(&self, from: usize, to: usize) {
        if let (Some(e), Some(slot)) = (self.entry(from), self.slot(to)) {
            slot.store(e);
        }
    }

    /// The tombstone nearest to `at` among the first `len` entries, if any
    /// (a writer's question, under the writers' lock).
    fn nearest_dead(&self, len: usize, at: usize) -> Option<usize> {
        if self.dead.load(Relaxed) == 0 {
            return None;
        }
        (0..len.max(1)).find_map(|d| {
            let up = at.checked_add(d).filter(|&i| i < len && self.is_dead(i));
            up.or_else(|| at.checked_sub(d + 1).filter(|&i| self.is_dead(i)))
        })
    }

    /// Drop tombstones (a writer's, under the writers' lock): those at the
    /// end at once (a length's write), all of them once they pass half the
    /// entries (one write of every entry).
    fn drop_tombstones(&self) {
        let (mut len, mut dead) = (self.len.load(Relaxed), self.dead.load(Relaxed));
        while len > 0 && self.is_dead(len - 1) {
            (len, dead) = (len - 1, dead.saturating_sub(1));
        }
        if dead * 2 > len {
            self.change(|t| {
                let mut kept = 0;
                for i in 0..len {
                    if !t.is_dead(i) {
                        t.copy(i, kept);
                        kept += 1;
                    }
                }
                t.len.store(kept, Relaxed);
            });
            dead = 0;
        } else if len != self.len.load(Relaxed) {
            self.change(|t| t.len.store(len, Relaxed));
        }
        self.dead.store(dead, Relaxed);
    }
}

impl<const N: usize> Default for SegmentTable<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> SegmentRegistry for SegmentTable<N> {
    fn insert(&self, device: u32, base: u64, size: u64) -> Result<(), RegistryRefusal> {
        let end = base.saturating_add(size);
        let new = Entry {
            base,
            end,
            device,
            hidden: false,
            dead: false,
        };
        // Checked and made room for before the sequence number goes odd
        // (the writers' lock keeps the table as it is meanwhile).
        let _writer = self.writer.lock();
        let len = self.len.load(Relaxed);
        let at = self.partition(len, base);
        // The visible neighbours are the only ones that could overlap.
        let below = (0..at)
            .rev()
            .filter_map(|i| self.entry(i))
            .find(Entry::visible);
        if let Some(e) = below.filter(|e| e.end > base) {
            return Err(RegistryRefusal::Overlaps { device: e.device });
        }
        let above = (at..len).filter_map(|i| self.entry(i)).find(Entry::visible);
        if let Some(e) = above.filter(|e| e.base < end) {
            return Err(RegistryRefusal::Overlaps { device: e.device });
        }
        // Its place is between entries `at - 1` and `at`: a tombstone there
        // (or the nearest one, the entries between shifted towards it)
        // takes it; without one it goes in at the end's side.
        let Some(d) = self.nearest_dead(len, at) else {
            self.room(len)?;
            self.change(|t| {
                for i in (at..len).rev() {
                    t.copy(i, i + 1);
                }
                if let Some(slot) = t.slot(at) {
                    slot.store(new);
                }
                t.len.store(len + 1, Relaxed);
            });
            return Ok(());
        };
        self.change(|t| {
            let to = if d >= at {
                for i in (at..d).rev() {
                    t.copy(i, i + 1);
                }
                at
            } else {
                for i in d + 1..at {
                    t.copy(i, i - 1);
                }
                at - 1
            };
            if let Some(slot) = t.slot(to) {
                slot.store(new);
            }
        });
        self.dead
            .store(self.dead.load(Relaxed).saturating_sub(1), Relaxed);
        Ok(())
    }

    fn hide(&self, device: u32, base: u64) {
        let _writer = self.writer.lock();
        if let Some(i) = self.find(self.len.load(Relaxed), device, base, false) {
            self.change(|t| t.mark(i, true, false));
        }
    }

    fn settle(&self, device: u32, base: u64, gone: bool) {
        let _writer = self.writer.lock();
        let Some(i) = self.find(self.len.load(Relaxed), device, base, true) else {
            return;
        };
        self.change(|t| t.mark(i, false, gone));
        if gone {
            self.dead.store(self.dead.load(Relaxed) + 1, Relaxed);
            self.drop_tombstones();
        }
    }

    fn owner(&self, ptr: u64) -> Option<u32> {
        self.read(|t, len| t.visible_at(len, ptr).map(|e| e.device))
    }

    fn holds(&self, device: u32, base: u64, size: u64) -> bool {
        let end = base.saturating_add(size);
        self.read(|t, len| {
            t.find(len, device, base, false)
                .and_then(|i| t.entry(i))
                .is_some_and(|e| e.end == end)
        })
    }

    fn count(&self, device: u32) -> usize {
        self.read(|t, len| {
            (0..len)
                .filter_map(|i| t.entry(i))
                .filter(|e| !e.dead && e.device == device)
                .count()
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn lookups_find_visible_ranges_only() {
        let t = SegmentTable::<4>::new();
        t.insert(0, 100, 50).unwrap();
        t.insert(1, 200, 100).unwrap();
        assert_eq!(t.owner(99), None);
        assert_eq!(t.owner(100), Some(0));
        assert_eq!(t.owner(149), Some(0));
        assert_eq!(t.owner(150), None);
        assert_eq!(t.owner(250), Some(1));
        assert_eq!(
            t.insert(2, 140, 20),
            Err(RegistryRefusal::Overlaps { device: 0 })
        );
        assert_eq!(
            t.insert(2, 150, 60),
            Err(RegistryRefusal::Overlaps { device: 1 })
        );
        // Device 1 releases its segment; before it forgets it, device 2 is
        // handed an overlapping range by the driver.
        t.hide(1, 200);
        assert_eq!(t.owner(250), None);
        t.insert(2, 180, 100).unwrap();
        assert_eq!(t.owner(250), Some(2));
        assert_eq!(t.owner(279), Some(2));
        assert_eq!(t.owner(290), None, "the hidden range is not anyone's");
        t.settle(1, 200, true);
        assert_eq!((t.count(1), t.count(2)), (0, 1));
        assert!(t.holds(2, 180, 100) && !t.holds(2, 180, 99));
        // A release the device refused: visible again.
        t.hide(0, 100);
        t.settle(0, 100, false);
        assert_eq!(t.owner(120), Some(0));
        t.insert(3, 1000, 1).unwrap();
        t.insert(3, 2000, 1).unwrap();
        assert_eq!(
            t.insert(3, 3000, 1),
            Err(RegistryRefusal::Full { capacity: 4 })
        );
        assert_eq!(t.len(), 4);
    }

    /// A host's chunks: leaked, as the C library's are (a test may leak).
    fn chunk(n: usize) -> Option<&'static [SegmentSlot]> {
        extern crate std;
        use std::boxed::Box;
        use std::vec::Vec;
        let v: Vec<SegmentSlot> = (0..n).map(|_| SegmentSlot::default()).collect();
        Some(Box::leak(v.into_boxed_slice()))
    }

    #[test]
    fn a_growing_table_keeps_every_entry_in_order() {
        let t = SegmentTable::<3>::new().with_growth(chunk);
        // Inserted out of order, 3 + 3 + 6 + 12 + some: four chunks.
        let bases: heapless::Vec<u64, 40> = (0..40u64).map(|k| (k * 37 % 40) * 0x1000).collect();
        for (k, &b) in bases.iter().enumerate() {
            t.insert(k as u32 % 5, b, 0x800).unwrap();
        }
        assert_eq!((t.len(), t.capacity()), (40, 48));
        for (k, &b) in bases.iter().enumerate() {
            assert_eq!(t.owner(b + 0x7ff), Some(k as u32 % 5), "{b:#x}");
            assert_eq!(t.owner(b + 0x800), None);
        }
        for (k, &b) in bases.iter().enumerate().filter(|(k, _)| k % 2 == 0) {
            t.hide(k as u32 % 5, b);
            t.settle(k as u32 % 5, b, true);
        }
        assert_eq!(t.len(), 20);
        for (k, &b) in bases.iter().enumerate() {
            let want = (k % 2 == 1).then_some(k as u32 % 5);
            assert_eq!(t.owner(b), want, "{b:#x}");
        }
        // A table of no entries refuses every segment, growing or not.
        let none = SegmentTable::<0>::new().with_growth(chunk);
        assert_eq!(
            none.insert(0, 0, 1),
            Err(RegistryRefusal::Full { capacity: 0 })
        );
        assert_eq!(none.owner(0), None);
        // Without growth it is full at N.
        let fixed = SegmentTable::<3>::new();
        for b in 0..3 {
            fixed.insert(0, b * 10, 5).unwrap();
        }
        assert_eq!(
            fixed.insert(0, 100, 5),
            Err(RegistryRefusal::Full { capacity: 3 })
        );
    }
    #[test]
    fn removals_leave_tombstones_that_insertions_take_and_compaction_drops() {
        let t = SegmentTable::<16>::new();
        for k in 0..10u64 {
            t.insert(0, k * 0x100, 0x80).unwrap();
        }
        for k in [1u64, 3, 5] {
            t.hide(0, k * 0x100);
            t.settle(0, k * 0x100, true);
        }
        assert_eq!((t.len(), t.slots_in_use()), (7, 10), "three tombstones");
        assert_eq!((t.owner(0x310), t.owner(0x410)), (None, Some(0)));
        // Its place is next to a tombstone: it takes its slot.
        t.insert(1, 0x340, 0x40).unwrap();
        assert_eq!((t.len(), t.slots_in_use()), (8, 10));
        // Its place is at the end: the entries from the nearest tombstone
        // (5) shift down to it; nothing grows.
        t.insert(2, 0x990, 0x10).unwrap();
        assert_eq!((t.len(), t.slots_in_use()), (9, 10));
        assert_eq!(
            (t.owner(0x350), t.owner(0x995), t.owner(0x910)),
            (Some(1), Some(2), Some(0))
        );
        // A tombstone at the end goes at once.
        t.hide(2, 0x990);
        t.settle(2, 0x990, true);
        assert_eq!((t.len(), t.slots_in_use()), (8, 9));
        // Past half the entries dead, one write compacts the table.
        for k in [0u64, 2, 4, 6, 7] {
            t.hide(0, k * 0x100);
            t.settle(0, k * 0x100, true);
        }
        assert_eq!((t.len(), t.slots_in_use()), (3, 4));
        assert_eq!((t.count(0), t.count(1)), (2, 1));
        assert!(t.holds(0, 0x800, 0x80) && t.holds(0, 0x900, 0x80) && t.holds(1, 0x340, 0x40));
    }

    /// Thousands of random insertions, hides and settles (gone or kept),
    /// on two devices whose ranges the driver reuses, against a plain list:
    /// every lookup, `holds` and `count` agrees, and the slots in use stay
    /// under twice the entries.
    #[test]
    fn random_changes_agree_with_a_plain_list() {
        extern crate std;
        use std::vec::Vec;
        let t = SegmentTable::<4>::new().with_growth(chunk);
        // (device, base, end, hidden)
        let mut model: Vec<(u32, u64, u64, bool)> = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rand = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for step in 0..6000 {
            match rand(3) {
                0 => {
                    let (d, base, size) = (rand(2) as u32, rand(64) * 0x100, 0x100 * (1 + rand(2)));
                    let clash = model
                        .iter()
                        .any(|&(_, b, e, h)| !h && b < base + size && base < e);
                    let r = t.insert(d, base, size);
                    assert_eq!(
                        r.is_ok(),
                        !clash,
                        "step {step}: insert {d} {base:#x}+{size:#x}"
                    );
                    if r.is_ok() {
                        model.push((d, base, base + size, false));
                    }
                }
                1 if !model.is_empty() => {
                    let k = rand(model.len() as u64) as usize;
                    let (d, base, _, hidden) = model[k];
                    // A device releases one segment at a time: it never
                    // has two hidden at one base.
                    let twice = model.iter().any(|&(e, b, _, h)| h && (e, b) == (d, base));
                    if !hidden && !twice {
                        t.hide(d, base);
                        model[k].3 = true;
                    }
                }
                _ => {
                    if let Some(k) = model.iter().position(|e| e.3) {
                        let (d, base, end, _) = model[k];
                        // A device that refuses a free still holds the
                        // range: the driver gave none of it to anyone else.
                        let reused = model.iter().any(|&(_, b, e, h)| !h && b < end && base < e);
                        let gone = reused || rand(4) != 0;
                        t.settle(d, base, gone);
                        if gone {
                            model.remove(k);
                        } else {
                            model[k].3 = false;
                        }
                    }
                }
            }
            for p in (0..0x4200).step_by(0x80) {
                let want = model
                    .iter()
                    .find(|&&(_, b, e, h)| !h && b <= p && p < e)
                    .map(|e| e.0);
                assert_eq!(t.owner(p), want, "step {step}: owner of {p:#x}");
            }
            for &(d, b, e, _) in &model {
                let want = model.contains(&(d, b, e, false));
                assert_eq!(t.holds(d, b, e - b), want, "step {step}");
            }
            for d in 0..2 {
                assert_eq!(t.count(d), model.iter().filter(|e| e.0 == d).count());
            }
            assert_eq!(t.len(), model.len());
            assert!(t.slots_in_use() <= 2 * t.len() + 1, "step {step}");
        }
    }
}
