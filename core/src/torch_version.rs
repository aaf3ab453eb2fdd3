//! [`TorchVersion`]: which PyTorch release's decisions the allocator takes.
//!
//! Releases differ where the allocator decides (the order among cached
//! blocks of one size above all; docs/torch-versions.md has the table, with
//! the lines of each release's source). The version is a setting of
//! [`crate::Config`], defaulting to the newest release this crate knows;
//! a version newer than that takes the newest known decisions, an older one
//! (before 2.11) those of 2.11.
//!
//! ```
//! use cachealloc_core::{BlockOrder, TorchVersion};
//! let v = TorchVersion::parse("2.13.0+cu130").unwrap();
//! assert_eq!(v, TorchVersion::V2_13);
//! assert_eq!(v.block_order(), BlockOrder::SizeCounterAddress);
//! assert_eq!(TorchVersion::V2_11.block_order(), BlockOrder::SizeAddress);
//! assert_eq!(TorchVersion::parse("2.16.0.dev20261101"), Some(TorchVersion::new(2, 16)));
//! ```

use core::fmt;

/// A PyTorch release, by major and minor number (patch releases of one
/// minor release make the same decisions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TorchVersion {
    major: u16,
    minor: u16,
}

/// How a pool orders its cached blocks, which decides the block a request
/// takes among several of one size (`BlockPool::blocks`' comparator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BlockOrder {
    /// (stream, size, address): `BlockComparatorSize`, torch 2.11 and before.
    SizeAddress,
    /// (stream, size, counter, address) with the counter of the block's
    /// segment; in torch 2.12 (`BlockComparatorRegistrationCounter`).
    RegistrationCounter,
    /// (stream, size, counter, address): `BlockComparatorSizeCounterAddress`,
    /// torch 2.13 and later; the counter numbers the allocator's device
    /// mallocs, and a split inherits its segment's.
    SizeCounterAddress,
}

impl BlockOrder {
    /// Whether blocks carry a counter that orders them ahead of their address.
    #[inline]
    pub const fn uses_counter(self) -> bool {
        !matches!(self, BlockOrder::SizeAddress)
    }
}

impl TorchVersion {
    /// torch 2.11.
    pub const V2_11: TorchVersion = TorchVersion::new(2, 11);
    /// torch 2.12.
    pub const V2_12: TorchVersion = TorchVersion::new(2, 12);
    /// torch 2.13.
    pub const V2_13: TorchVersion = TorchVersion::new(2, 13);
    /// torch 2.14.
    pub const V2_14: TorchVersion = TorchVersion::new(2, 14);
    /// torch 2.15.
    pub const V2_15: TorchVersion = TorchVersion::new(2, 15);
    /// The newest release whose source this crate follows (the default).
    pub const NEWEST: TorchVersion = TorchVersion::V2_15;
    /// The oldest release shown exact.
    pub const OLDEST: TorchVersion = TorchVersion::V2_11;
    /// Every release the table of docs/torch-versions.md covers, oldest first.
    pub const KNOWN: [TorchVersion; 5] = [
        TorchVersion::V2_11,
        TorchVersion::V2_12,
        TorchVersion::V2_13,
        TorchVersion::V2_14,
        TorchVersion::V2_15,
    ];

    /// `major.minor`.
    pub const fn new(major: u16, minor: u16) -> TorchVersion {
        TorchVersion { major, minor }
    }

    /// Its major number.
    pub const fn major(self) -> u16 {
        self.major
    }

    /// Its minor number.
    pub const fn minor(self) -> u16 {
        self.minor
    }

    /// `torch.__version__` or a version as people write it: `2.13`,
    /// `2.13.0`, `2.13.0+cu130`, `2.16.0.dev20261101`, `v2.14.1`. `None`
    /// if it does not start with `major.minor`.
    pub fn parse(text: &str) -> Option<TorchVersion> {
        let t = text.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let (major, rest) = t.split_once('.')?;
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let minor = rest[..digits].parse().ok()?;
        Some(TorchVersion::new(major.parse().ok()?, minor))
    }

    /// Whether this crate's table covers the release (else it behaves as
    /// [`Self::decisions_of`] says).
    pub fn is_known(self) -> bool {
        TorchVersion::KNOWN.contains(&self)
    }

    /// The known release whose decisions this one takes: itself if known,
    /// the newest for a newer one, the oldest for an older one.
    pub fn decisions_of(self) -> TorchVersion {
        if self > TorchVersion::NEWEST {
            TorchVersion::NEWEST
        } else if self < TorchVersion::OLDEST {
            TorchVersion::OLDEST
        } else {
            self
        }
    }

    /// The order of cached blocks of one size.
    pub fn block_order(self) -> BlockOrder {
        let v = self.decisions_of();
        if v >= TorchVersion::V2_13 {
            BlockOrder::SizeCounterAddress
        } else if v == TorchVersion::V2_12 {
            BlockOrder::RegistrationCounter
        } else {
            BlockOrder::SizeAddress
        }
    }
}

impl Default for TorchVersion {
    fn default() -> Self {
        TorchVersion::NEWEST
    }
}

impl fmt::Display for TorchVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}
