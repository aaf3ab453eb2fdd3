//! The size classes of the free index and the two-level bitmap of its
//! non-empty bins: the first non-empty class at or above a request (or at or
//! below a key) in O(1), as TLSF finds its free lists.

/// Size classes (bins) of one free index.
pub(crate) const BINS: usize = 256;
const WORDS: usize = BINS / 64;

/// Classes below this are exact (one per 512-byte step, up to 8 KiB).
const EXACT: u64 = 16;
/// Classes per doubling above the exact ones.
const SUB_BITS: u32 = 3;

/// The class of a block size: exact in 512-byte steps below 8 KiB, then
/// eight classes per power of two; everything from 8 TiB up shares the last.
/// Non-decreasing in `size`, so each class holds one contiguous range of the
/// exact (size, address) order.
///
/// ```text
/// 0..512 -> 0, 512 -> 1, ..., 7.5 KiB -> 15, 8 KiB -> 16, 9 KiB -> 17, 10 KiB -> 18, 16 KiB -> 24
/// ```
#[inline]
pub(crate) fn size_class(size: u64) -> usize {
    let u = size >> 9;
    if u < EXACT {
        return u as usize;
    }
    let e = 63 - u.leading_zeros(); // >= 4
    let sub = (u >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    let c = EXACT as usize + ((e - 4) as usize) * (1 << SUB_BITS) + sub as usize;
    if c < BINS {
        c
    } else {
        BINS - 1
    }
}

/// Which bins hold blocks: one bit per bin, and one bit per word of bins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BinMap {
    top: u64,
    words: [u64; WORDS],
}

impl BinMap {
    pub(crate) const EMPTY: BinMap = BinMap {
        top: 0,
        words: [0; WORDS],
    };

    #[inline]
    pub(crate) fn get(&self, c: usize) -> bool {
        self.words[c >> 6] & (1 << (c & 63)) != 0
    }

    #[inline]
    pub(crate) fn set(&mut self, c: usize) {
        self.words[c >> 6] |= 1 << (c & 63);
        self.top |= 1 << (c >> 6);
    }

    #[inline]
    pub(crate) fn clear(&mut self, c: usize) {
        let w = c >> 6;
        self.words[w] &= !(1 << (c & 63));
        if self.words[w] == 0 {
            self.top &= !(1 << w);
        }
    }

    /// The first non-empty bin `>= c`.
    #[inline]
    pub(crate) fn next_from(&self, c: usize) -> Option<usize> {
        if c >= BINS {
            return None;
        }
        let w = c >> 6;
        let m = self.words[w] & (u64::MAX << (c & 63));
        if m != 0 {
            return Some((w << 6) + m.trailing_zeros() as usize);
        }
        let t = self.top & (u64::MAX << w << 1);
        if t == 0 {
            return None;
        }
        let w = t.trailing_zeros() as usize;
        Some((w << 6) + self.words[w].trailing_zeros() as usize)
    }

    /// The last non-empty bin `<= c`.
    #[inline]
    pub(crate) fn prev_from(&self, c: usize) -> Option<usize> {
        let c = if c < BINS { c } else { BINS - 1 };
        let w = c >> 6;
        let m = self.words[w] & (u64::MAX >> (63 - (c & 63)));
        if m != 0 {
            return Some((w << 6) + 63 - m.leading_zeros() as usize);
        }
        let t = self.top & ((1u64 << w) - 1);
        if t == 0 {
            return None;
        }
        let w = 63 - t.leading_zeros() as usize;
        Some((w << 6) + 63 - self.words[w].leading_zeros() as usize)
    }

    /// The top level agrees with the words.
    pub(crate) fn consistent(&self) -> bool {
        (0..WORDS).all(|w| (self.words[w] != 0) == (self.top & (1 << w) != 0))
            && self.top >> WORDS == 0
    }

    /// Test hook: flip one bin's bit without touching the top level.
    #[cfg(test)]
    pub(crate) fn corrupt(&mut self, c: usize) {
        self.words[c >> 6] ^= 1 << (c & 63);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotone_and_cover_the_range() {
        let mut last = 0;
        let mut size = 0u64;
        while size < (1 << 50) {
            let c = size_class(size);
            assert!(c >= last && c < BINS, "size {size}: class {c} after {last}");
            last = c;
            size = size + 512 + size / 37;
        }
        assert_eq!(size_class(u64::MAX), BINS - 1);
        assert_eq!(size_class(511), 0);
        assert_eq!(size_class(7 << 10), 14);
        assert_eq!(size_class(8 << 10), 16);
        assert_eq!(size_class(8 << 10 | 511), 16);
        assert_eq!(size_class(9 << 10), 17);
        assert_eq!(size_class(10 << 10), 18);
        assert_eq!(size_class(16 << 10), 24);
        assert_eq!(size_class(2 << 20), 16 + 8 * 8);
    }

    #[test]
    fn next_and_prev_match_a_scan() {
        let mut m = BinMap::EMPTY;
        let mut model = [false; BINS];
        let mut x = 99u64;
        for _ in 0..4000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let c = (x % BINS as u64) as usize;
            if model[c] {
                m.clear(c);
            } else {
                m.set(c);
            }
            model[c] = !model[c];
            assert!(m.consistent());
            let q = ((x >> 20) % (BINS as u64 + 3)) as usize;
            let next = (q..BINS).find(|&k| model[k]);
            let prev = (0..=q.min(BINS - 1)).rev().find(|&k| model[k]);
            assert_eq!(m.next_from(q), next, "next_from({q})");
            assert_eq!(m.prev_from(q), prev, "prev_from({q})");
            assert_eq!(m.get(c), model[c]);
        }
    }
}
