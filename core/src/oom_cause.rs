//! Why an allocation ran out of memory: the classification an
//! [`OomReport`](crate::OomReport) carries after PyTorch's numbers, made
//! from the allocator's state once every rung of PyTorch's ladder (cache
//! flush included) has failed.

use crate::policy::FormatSize;
use core::fmt;

/// Every class, once: its variant, its name in reports, and what it means.
/// The enum, [`OomClass::as_str`], [`OomClass::as_cstr`] and
/// [`OomClass::ALL`] are all made from this one list, so a new class cannot
/// be named in one place and missed in another.
macro_rules! oom_classes {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal,)*) => {
        /// The kind of out-of-memory: what stood between the request and
        /// memory. Each class but [`Mixed`](OomClass::Mixed) and the two
        /// that need no cached bytes ([`Capacity`](OomClass::Capacity),
        /// [`OtherMemory`](OomClass::OtherMemory)) is given only when bytes
        /// of its own kind exist and, with the device's headroom, would have
        /// served the request.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum OomClass {
            $($(#[doc = $doc])* $variant,)*
        }

        impl OomClass {
            /// Every class, in the order of their numbers
            /// (`OomClass::ALL[c.index()] == c`; the C library's
            /// `cachealloc_oom_cause::class_`).
            pub const ALL: [OomClass; Self::COUNT] = [$(OomClass::$variant,)*];

            /// How many classes there are.
            pub const COUNT: usize = [$(OomClass::$variant,)*].len();

            /// The class's name in reports (`replay --json`, the C library,
            /// Python).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(OomClass::$variant => $name,)*
                }
            }

            /// [`as_str`](Self::as_str) as a C string (the C library's
            /// `class_name`).
            pub const fn as_cstr(self) -> &'static core::ffi::CStr {
                match self {
                    $(OomClass::$variant => match core::ffi::CStr::from_bytes_with_nul(
                        concat!($name, "\0").as_bytes(),
                    ) {
                        Ok(c) => c,
                        Err(_) => c"?",
                    },)*
                }
            }
        }
    };
}

oom_classes! {
    /// The live bytes and the request exceed what the device (or the
    /// memory limit) allows: nothing the allocator does could fit it. Also
    /// a device whose headroom holds the block but not the segment the
    /// allocator asks for, with nothing cached that would serve it.
    Capacity => "capacity",
    /// The per-process limit (`set_per_process_memory_fraction`) refused
    /// it; the device had room.
    MemoryFraction => "memory_fraction",
    /// Enough bytes are cached in the request's pool (its block size) on
    /// its stream, in no block large enough.
    Fragmentation => "fragmentation",
    /// Enough bytes only with the freed blocks of the request's pool on its
    /// stream that wait on events of other streams (`record_stream`), or
    /// that a capture parked.
    PendingFrees => "pending_frees",
    /// Enough bytes cached (or waiting on events) in the request's pool in
    /// blocks of other streams, which a request on this stream never gets.
    OtherStreams => "other_streams",
    /// Enough bytes cached in private pools (CUDA graphs, `MemPool`), or in
    /// the default pools for a request routed to a private pool, that the
    /// request cannot use.
    PrivatePools => "private_pools",
    /// No one reason holds the bytes, two or more together do: the figures
    /// say how many each.
    Mixed => "mixed",
    /// The device's free memory is short though the allocator holds little
    /// of it cached: other processes, or allocations outside this
    /// allocator, use it. (Beyond the classes PyTorch users name; it is
    /// what is left when none of the others holds.)
    OtherMemory => "other_memory",
    /// Enough bytes cached (or waiting on events) in the request's pools on
    /// any stream, but in blocks of the other size: small-pool blocks (2
    /// MiB segments, requests of at most 1 MiB) never serve a large
    /// request, nor large-pool blocks a small one, and the live blocks
    /// beside them keep their segments from being released.
    OtherSize => "other_size",
    /// The rejection policy (`throw_on_cudamalloc_oom`, torch 2.12 on)
    /// refused it before any device call: the new segment would have taken
    /// the reserved bytes over `per_process_memory_fraction` of the device.
    /// No cache was released to make room.
    Rejected => "rejected",
    /// The allocator of the private pool the request was routed to (a
    /// `MemPool` with an allocator of its own: a segment source) returned
    /// no memory for the segment: the device was not asked, so its
    /// figures say nothing about this request (torch 2.15: "The custom
    /// allocator backing this MemPool returned nullptr").
    PoolAllocator => "pool_allocator",
}

impl OomClass {
    /// The class's number (the C library's `cachealloc_oom_class`).
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Why an allocation ran out of memory, with the bytes behind the verdict.
/// "The request's pools" are those it was served from: the default pools,
/// or the private pool its stream was routed to (both block sizes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OomCause {
    /// The verdict.
    pub class: OomClass,
    /// The block size the request needed (rounded).
    pub needed: u64,
    /// Bytes handed out, in every pool, when it failed.
    pub live_bytes: u64,
    /// What the allocator may hold: the memory limit, else the device's
    /// total.
    pub limit: u64,
    /// The segment the allocator asked the device for (PyTorch's "Tried to
    /// allocate").
    pub segment: u64,
    /// Bytes the device could still have given, under the limit: its free
    /// memory, at most the limit minus what the allocator reserves (less
    /// than the segment, or the device refused a segment it had room for).
    pub headroom: u64,
    /// Bytes cached in the request's pool (its block size: small or large)
    /// on its stream.
    pub free_bytes: u64,
    /// The largest of those blocks.
    pub largest_free_block: u64,
    /// Bytes of the request's pool on its stream waiting on events (or
    /// parked by a capture).
    pub pending_free_bytes: u64,
    /// Bytes cached, or waiting on events, in the request's pool (its
    /// block size) in other streams' blocks.
    pub other_streams_bytes: u64,
    /// Bytes cached, or waiting on events, in other pools than the
    /// request's: private pools (CUDA graphs, `MemPool`), or the default
    /// pools for a request routed to a private pool.
    pub private_pools_bytes: u64,
    /// Bytes cached, or waiting on events, in the request's pools on any
    /// stream in blocks of the other block size (small for a large
    /// request, large for a small one): they never serve it.
    pub other_size_bytes: u64,
    /// Reserved address space of expandable segments with no page mapped.
    pub unmapped_bytes: u64,
}

/// What [`classify`] weighs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OomFacts {
    pub(crate) needed: u64,
    pub(crate) alloc_size: u64,
    pub(crate) live_bytes: u64,
    pub(crate) reserved_bytes: u64,
    pub(crate) device_total: u64,
    pub(crate) device_free: u64,
    pub(crate) allowed: Option<u64>,
    pub(crate) free_bytes: u64,
    pub(crate) largest_free_block: u64,
    pub(crate) pending_free_bytes: u64,
    pub(crate) other_streams_bytes: u64,
    pub(crate) private_pools_bytes: u64,
    pub(crate) other_size_bytes: u64,
    pub(crate) unmapped_bytes: u64,
    /// The segment was asked of a pool's own allocator, which returned
    /// none.
    pub(crate) source_refused: bool,
}

/// The verdict on `f`, in this order: a memory limit that refused a
/// segment the device had room for; live bytes that leave no room; a
/// device that refused a segment it reported room for; then the first of
/// fragmentation, pending frees, other streams, other pools and the other
/// block size whose bytes (some of that kind, with the device's remaining
/// headroom) would have served the request (the block, or the segment
/// when the headroom holds the block); two or more kinds together; a
/// device whose headroom holds the block but not the segment the allocator
/// asks for (capacity, at the segment's granularity); and else memory used
/// outside the allocator.
pub(crate) fn classify(f: &OomFacts) -> OomCause {
    let limit = f.allowed.unwrap_or(f.device_total);
    let need = f.needed;
    let headroom = f.device_free.min(limit.saturating_sub(f.reserved_bytes));
    // What a kind of bytes must make up with the headroom: the block; or,
    // when the headroom holds the block already, the segment the allocator
    // asks the device for (any cached bytes at all would "make up" a
    // block the device could hold; only the ones that would have made room
    // for the segment stood in the way).
    let target = if headroom >= need {
        f.alloc_size.max(need)
    } else {
        need
    };
    // Some bytes of this kind, and with the headroom enough.
    let with = |bytes: u64| bytes > 0 && bytes.saturating_add(headroom) >= target;
    let limit_refused = f
        .allowed
        .is_some_and(|a| f.reserved_bytes.saturating_add(f.alloc_size) > a);
    // Each kind of bytes that could have served the request, apart: a
    // byte is counted in one kind only (`oom_facts`).
    let kinds = [
        f.free_bytes,
        f.pending_free_bytes,
        f.other_streams_bytes,
        f.private_pools_bytes,
        f.other_size_bytes,
    ];
    let contributors = kinds.iter().filter(|&&b| b > 0).count();
    let together = kinds.iter().fold(0u64, |t, &b| t.saturating_add(b));
    let class = if f.source_refused {
        OomClass::PoolAllocator
    } else if limit_refused && f.device_free >= f.alloc_size {
        OomClass::MemoryFraction
    } else if f.live_bytes.saturating_add(need) > limit {
        OomClass::Capacity
    } else if f.device_free >= f.alloc_size && !limit_refused {
        OomClass::OtherMemory
    } else if with(f.free_bytes) {
        OomClass::Fragmentation
    } else if f.pending_free_bytes > 0 && with(f.free_bytes + f.pending_free_bytes) {
        OomClass::PendingFrees
    } else if with(f.other_streams_bytes) {
        OomClass::OtherStreams
    } else if with(f.private_pools_bytes) {
        OomClass::PrivatePools
    } else if with(f.other_size_bytes) {
        OomClass::OtherSize
    } else if contributors >= 2 && with(together) {
        OomClass::Mixed
    } else if headroom >= need {
        OomClass::Capacity
    } else {
        OomClass::OtherMemory
    };
    OomCause {
        class,
        needed: need,
        live_bytes: f.live_bytes,
        limit,
        segment: f.alloc_size,
        headroom,
        free_bytes: f.free_bytes,
        largest_free_block: f.largest_free_block,
        pending_free_bytes: f.pending_free_bytes,
        other_streams_bytes: f.other_streams_bytes,
        private_pools_bytes: f.private_pools_bytes,
        other_size_bytes: f.other_size_bytes,
        unmapped_bytes: f.unmapped_bytes,
    }
}

impl OomCause {
    /// The same figures with the rejection's class.
    pub(crate) fn rejected(mut self) -> OomCause {
        self.class = OomClass::Rejected;
        self
    }

    /// The bytes reserved when a request was rejected: the limit less
    /// the headroom (what [`classify`]'s caller puts there for a rejection).
    fn reserved_at_rejection(&self) -> u64 {
        self.limit.saturating_sub(self.headroom)
    }
}

impl fmt::Display for OomCause {
    /// One sentence after PyTorch's message: "cachealloc: fragmentation:
    /// ...".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let need = FormatSize(self.needed);
        write!(f, "cachealloc: {}: ", self.class.as_str())?;
        match self.class {
            OomClass::Capacity if self.live_bytes.saturating_add(self.needed) <= self.limit => {
                write!(
                    f,
                    "{} is left on the device, room for the {need} block but not for the {} segment the allocator asks the device for, and what is cached would not make room for it",
                    FormatSize(self.headroom),
                    FormatSize(self.segment)
                )
            }
            OomClass::Capacity => write!(
                f,
                "{} live plus the {need} block needed exceed the {} allowed",
                FormatSize(self.live_bytes),
                FormatSize(self.limit)
            ),
            OomClass::MemoryFraction => write!(
                f,
                "the per-process memory limit of {} refused the {need} block; the device had room",
                FormatSize(self.limit)
            ),
            OomClass::Fragmentation => write!(
                f,
                "{} is cached for this request's pool and stream and {} is left on the device, but in pieces: the largest free block is {} (needed {need})",
                FormatSize(self.free_bytes),
                FormatSize(self.headroom),
                FormatSize(self.largest_free_block)
            ),
            OomClass::PendingFrees => write!(
                f,
                "{} is cached, {} is left on the device and {} more waits on events of other streams (record_stream) to be freed (needed {need})",
                FormatSize(self.free_bytes),
                FormatSize(self.headroom),
                FormatSize(self.pending_free_bytes)
            ),
            OomClass::OtherStreams => write!(
                f,
                "{} is cached in blocks of other streams, which a request on this stream never gets (needed {need})",
                FormatSize(self.other_streams_bytes)
            ),
            OomClass::PrivatePools => write!(
                f,
                "{} is cached in other pools (private pools: CUDA graphs, MemPool) that this request cannot use (needed {need})",
                FormatSize(self.private_pools_bytes)
            ),
            OomClass::Mixed => write!(
                f,
                "needed {need}: {} left on the device, {} cached on this stream (largest block {}), {} waiting on events, {} cached on other streams, {} in other pools, {} in blocks of the other size",
                FormatSize(self.headroom),
                FormatSize(self.free_bytes),
                FormatSize(self.largest_free_block),
                FormatSize(self.pending_free_bytes),
                FormatSize(self.other_streams_bytes),
                FormatSize(self.private_pools_bytes),
                FormatSize(self.other_size_bytes)
            ),
            OomClass::Rejected => write!(
                f,
                "throw_on_cudamalloc_oom refused a {} segment before any device call: the allocator reserves {} and may reserve {} (per_process_memory_fraction of the device); nothing cached was released to make room",
                FormatSize(self.segment),
                FormatSize(self.reserved_at_rejection()),
                FormatSize(self.limit)
            ),
            OomClass::OtherSize => write!(
                f,
                "{} is cached in blocks of the other size, which never serve this request (small-pool blocks serve requests of at most 1 MiB, large-pool blocks larger ones), in segments that live blocks keep from being released; {} is left on the device (needed {need})",
                FormatSize(self.other_size_bytes),
                FormatSize(self.headroom)
            ),
            OomClass::PoolAllocator => write!(
                f,
                "the allocator of the pool this request was routed to (a MemPool's own allocator) returned no memory for a {} segment; the device was not asked (needed {need})",
                FormatSize(self.segment)
            ),
            OomClass::OtherMemory if self.headroom >= self.segment => write!(
                f,
                "the device refused a {} segment with {} free: other processes or allocations outside this allocator hold its memory, or it is too fragmented to give one piece",
                FormatSize(self.segment),
                FormatSize(self.headroom)
            ),
            OomClass::OtherMemory => write!(
                f,
                "{} is live here of the {} allowed and nothing cached would serve the {need} block: the device's memory is used outside this allocator (other processes, other allocations)",
                FormatSize(self.live_bytes),
                FormatSize(self.limit)
            ),
        }?;
        write!(f, ".")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn facts() -> OomFacts {
        OomFacts {
            needed: 100 * MIB,
            alloc_size: 100 * MIB,
            live_bytes: 500 * MIB,
            reserved_bytes: 500 * MIB,
            device_total: 1024 * MIB,
            device_free: 10 * MIB,
            ..OomFacts::default()
        }
    }

    #[test]
    fn each_class_from_its_facts() {
        let c = |f: OomFacts| classify(&f).class;
        assert_eq!(c(facts()), OomClass::OtherMemory);
        assert_eq!(
            c(OomFacts {
                live_bytes: 1000 * MIB,
                ..facts()
            }),
            OomClass::Capacity
        );
        assert_eq!(
            c(OomFacts {
                allowed: Some(512 * MIB),
                device_free: 400 * MIB,
                ..facts()
            }),
            OomClass::MemoryFraction
        );
        assert_eq!(
            c(OomFacts {
                free_bytes: 150 * MIB,
                largest_free_block: 20 * MIB,
                ..facts()
            }),
            OomClass::Fragmentation
        );
        assert_eq!(
            c(OomFacts {
                free_bytes: 50 * MIB,
                pending_free_bytes: 60 * MIB,
                ..facts()
            }),
            OomClass::PendingFrees
        );
        assert_eq!(
            c(OomFacts {
                other_streams_bytes: 100 * MIB,
                ..facts()
            }),
            OomClass::OtherStreams
        );
        assert_eq!(
            c(OomFacts {
                private_pools_bytes: 200 * MIB,
                ..facts()
            }),
            OomClass::PrivatePools
        );
        assert_eq!(
            c(OomFacts {
                free_bytes: 30 * MIB,
                other_streams_bytes: 40 * MIB,
                private_pools_bytes: 40 * MIB,
                ..facts()
            }),
            OomClass::Mixed
        );
        assert_eq!(
            c(OomFacts {
                other_size_bytes: 100 * MIB,
                ..facts()
            }),
            OomClass::OtherSize
        );
    }

    #[test]
    fn mixed_needs_two_kinds_of_bytes() {
        // One kind, short even with the headroom: not mixed, whatever else
        // is counted (the headroom is no kind of cached bytes).
        for one in 0..KINDS {
            let mut f = facts();
            *kind(&mut f, one) = 50 * MIB;
            assert_ne!(classify(&f).class, OomClass::Mixed, "kind {one} alone");
        }
        // Two kinds, each short, together enough.
        let c = classify(&OomFacts {
            other_streams_bytes: 50 * MIB,
            other_size_bytes: 50 * MIB,
            ..facts()
        });
        assert_eq!(c.class, OomClass::Mixed);
    }

    #[test]
    fn every_class_has_one_name_and_one_number() {
        for (i, c) in OomClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(c.as_cstr().to_str(), Ok(c.as_str()));
            assert_eq!(
                OomClass::ALL
                    .iter()
                    .filter(|d| d.as_str() == c.as_str())
                    .count(),
                1
            );
        }
        assert_eq!(OomClass::ALL.len(), OomClass::COUNT);
    }

    #[test]
    fn the_device_headroom_counts_with_the_cached_bytes() {
        // 30 MiB cached and 80 MiB left on the device: the memory is there,
        // in pieces.
        let c = classify(&OomFacts {
            free_bytes: 30 * MIB,
            device_free: 80 * MIB,
            ..facts()
        });
        assert_eq!((c.class, c.headroom), (OomClass::Fragmentation, 80 * MIB));
        // The headroom stops at the limit.
        let c = classify(&OomFacts {
            free_bytes: 30 * MIB,
            device_free: 80 * MIB,
            device_total: 520 * MIB,
            ..facts()
        });
        assert_eq!(c.class, OomClass::Capacity);
        // A device that refused a segment it reported room for.
        let c = classify(&OomFacts {
            device_free: 200 * MIB,
            ..facts()
        });
        assert_eq!(c.class, OomClass::OtherMemory);
        assert!(heapless_string(&c).contains("refused a 100.00 MiB segment with 200.00 MiB free"));
    }

    #[test]
    fn headroom_for_the_block_but_not_the_segment_is_capacity() {
        // 3 MiB asked, a 20 MiB segment needed, 14 MiB left, nothing cached.
        let c = classify(&OomFacts {
            needed: 3 * MIB,
            alloc_size: 20 * MIB,
            device_free: 14 * MIB,
            ..facts()
        });
        assert_eq!(c.class, OomClass::Capacity);
        assert!(heapless_string(&c)
            .contains("room for the 3.00 MiB block but not for the 20.00 MiB segment"));
        // A little cached beside it changes nothing: 1.5 MiB of small
        // blocks and 14 MiB left still hold no 20 MiB segment.
        for k in 0..KINDS {
            let mut f = OomFacts {
                needed: 3 * MIB,
                alloc_size: 20 * MIB,
                device_free: 14 * MIB,
                ..facts()
            };
            *kind(&mut f, k) = 3 * MIB / 2;
            assert_eq!(classify(&f).class, OomClass::Capacity, "kind {k}");
            // Enough of it to make room for the segment names it.
            *kind(&mut f, k) = 6 * MIB;
            assert_ne!(classify(&f).class, OomClass::Capacity, "kind {k}");
        }
        // A limit that was not reached refused nothing: the device did.
        let c = classify(&OomFacts {
            allowed: Some(900 * MIB),
            device_free: 200 * MIB,
            ..facts()
        });
        assert_eq!(c.class, OomClass::OtherMemory);
    }

    #[test]
    fn the_sentence_names_the_numbers() {
        let cause = classify(&OomFacts {
            free_bytes: 150 * MIB,
            largest_free_block: 20 * MIB,
            ..facts()
        });
        let s = heapless_string(&cause);
        assert_eq!(
            s,
            "cachealloc: fragmentation: 150.00 MiB is cached for this request's pool and stream and 10.00 MiB is left on the device, but in pieces: the largest free block is 20.00 MiB (needed 100.00 MiB)."
        );
    }

    /// How many kinds of cached bytes the facts count.
    const KINDS: usize = 5;

    /// Kind `k` of the facts' cached bytes.
    fn kind(f: &mut OomFacts, k: usize) -> &mut u64 {
        match k {
            0 => &mut f.free_bytes,
            1 => &mut f.pending_free_bytes,
            2 => &mut f.other_streams_bytes,
            3 => &mut f.private_pools_bytes,
            _ => &mut f.other_size_bytes,
        }
    }

    fn heapless_string(c: &OomCause) -> heapless::String<512> {
        use core::fmt::Write;
        let mut s = heapless::String::new();
        write!(s, "{c}").expect("fits");
        s
    }
}
