//! The recorded entries as trace events: `alloc` -> `alloc`,
//! `free_requested` + `free_completed` -> `free` (a `free_completed` that
//! comes later means other streams used the block: `record_stream` on a
//! stream of its own and a `sync` of it where PyTorch noticed), a burst of
//! `segment_free` that is not an out-of-memory retry -> `empty_cache`,
//! `oom` -> an `alloc` that must fail. Segment entries tell the capacity:
//! a real run whose device malloc failed needs a simulated device no
//! larger than the failed request allowed and no smaller than the most it
//! ever held.

use super::pytorch::PtEntry;
use super::StreamMap;
use crate::event::Event;
use cachealloc_core::policy;
use std::collections::HashMap;

/// Streams that stand for "the other streams that used a block" start here.
pub const PENDING_STREAM_BASE: u64 = 1 << 32;

/// What the entries of one device say about the device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The device mallocs: (address, size), in order.
    pub mallocs: Vec<(u64, u64)>,
    /// Sizes of the segments freed, in order.
    pub segment_frees: Vec<u64>,
    /// Most bytes reserved at once.
    pub peak_reserved: u64,
    /// Smallest capacity the failed device mallocs allow, minus one
    /// (`None`: no malloc failed).
    pub capacity_below: Option<u64>,
    /// Bursts of segment frees that retried a failed device malloc.
    pub oom_retries: u64,
    /// Bursts of segment frees before a device malloc that garbage
    /// collection may have made instead (settings with
    /// `garbage_collection_threshold`): not read as failed mallocs.
    pub gc_bursts: u64,
    /// `oom` entries whose device had room for the segment: a memory limit
    /// (a memory fraction), not the device, refused them.
    pub limit_refusals: u64,
    /// Bursts of segment frees read as `empty_cache`.
    pub empty_caches: u64,
    /// Allocations that failed for good (`oom` entries).
    pub ooms: u64,
    /// Frees whose completion waited for other streams.
    pub deferred_frees: u64,
    /// Frees of blocks allocated before the recording began.
    pub frees_of_earlier_blocks: u64,
}

/// One event of the body, with the device and the time of its entry.
pub struct Timed {
    /// The entry's time (microseconds since the epoch), if recorded.
    pub time_us: Option<i64>,
    /// The event.
    pub event: Event,
}

/// Turns one device's entries into events.
pub struct Body<'a> {
    device: u64,
    streams: &'a StreamMap,
    /// Live blocks: address -> trace id.
    live: HashMap<u64, u64>,
    /// Blocks freed while used by other streams: address -> their stream.
    pending: HashMap<u64, u64>,
    /// Trace ids of blocks that were live when the recording began.
    earlier: std::collections::HashSet<u64>,
    next_pending_stream: &'a mut u64,
    reserved: u64,
    /// The burst of segment frees under way: the bytes reserved when it
    /// began, and whether it is an `empty_cache` (else a failed malloc's
    /// release of the cache).
    burst: Option<(u64, bool)>,
    /// The facts gathered.
    pub facts: DeviceFacts,
    /// The events made.
    pub events: Vec<Timed>,
    /// Garbage collection may free segments before a device malloc.
    gc: bool,
    /// The recorded settings (which cached block a request could take).
    config: cachealloc_core::Config,
}

impl<'a> Body<'a> {
    /// A body for `device`, starting from the warm-up's live blocks and
    /// `reserved` bytes.
    pub fn new(
        device: u64,
        streams: &'a StreamMap,
        live: HashMap<u64, u64>,
        reserved: u64,
        next_pending_stream: &'a mut u64,
    ) -> Self {
        let earlier = live.values().copied().collect();
        Body {
            device,
            streams,
            live,
            pending: HashMap::new(),
            earlier,
            next_pending_stream,
            reserved,
            burst: None,
            gc: false,
            config: cachealloc_core::Config::DEFAULT,
            facts: DeviceFacts {
                peak_reserved: reserved,
                ..DeviceFacts::default()
            },
            events: Vec::new(),
        }
    }

    /// Bursts of segment frees before a device malloc may be garbage
    /// collection's (the recorded settings collect garbage).
    pub fn with_garbage_collection(mut self, gc: bool) -> Self {
        self.gc = gc;
        self
    }

    /// The recorded settings (the rounding and oversize rules say which
    /// freed segment could have served a request).
    pub fn with_config(mut self, config: cachealloc_core::Config) -> Self {
        self.config = config;
        self
    }

    /// Whether a segment freed in the burst starting at `entries[i]` could
    /// have served the request its device malloc was for (the next `alloc`
    /// or `oom`): then the allocator never reached its release-and-retry
    /// rung, and the burst was the program's `empty_cache`. A cached whole
    /// segment serves a request of its pool and stream that it holds,
    /// under the oversize rules.
    fn burst_could_have_served(&self, entries: &[PtEntry], i: usize) -> bool {
        let burst_len = entries[i..]
            .iter()
            .take_while(|n| n.action == "segment_free")
            .count();
        let Some(request) = entries[i + burst_len..]
            .iter()
            .find(|n| n.action == "alloc" || n.action == "oom")
        else {
            return false;
        };
        let Some(rounded) = policy::round_size(request.size, &self.config) else {
            return false;
        };
        let small = rounded <= policy::SMALL_SIZE;
        let mss = self.config.max_split_size;
        entries[i..i + burst_len].iter().any(|f| {
            let seg = f.size;
            f.stream == request.stream
                && (seg == policy::SMALL_BUFFER) == small
                && seg >= rounded
                && !((rounded < mss && seg >= mss)
                    || (rounded >= mss
                        && seg >= rounded.saturating_add(self.config.max_non_split_rounding)))
        })
    }

    fn emit(&mut self, e: &PtEntry, event: Event) {
        self.events.push(Timed {
            time_us: e.time_us,
            event,
        });
    }

    /// Convert `entries[i]`; `entries` is the whole usable list (for the
    /// look-ahead that pairs frees and classifies bursts).
    pub fn entry(
        &mut self,
        entries: &[PtEntry],
        i: usize,
        next_id: &mut u64,
    ) -> Result<(), String> {
        let e = &entries[i];
        let addr = e.addr.unwrap_or(0);
        let what = || format!("entry {i} ({} at {addr:#x})", e.action);
        let burst = if e.action == "segment_free" || e.action == "segment_unmap" {
            self.burst
        } else {
            self.burst.take()
        };
        match e.action.as_str() {
            "alloc" => {
                if self.live.contains_key(&addr) {
                    return Err(format!("{}: the address is already live", what()));
                }
                let id = *next_id;
                *next_id += 1;
                self.live.insert(addr, id);
                self.emit(
                    e,
                    Event::Alloc {
                        id,
                        size: e.size,
                        stream: self.streams.id(e.stream),
                        device: self.device,
                    },
                );
            }
            "free_requested" => {
                let id = self
                    .live
                    .remove(&addr)
                    .ok_or_else(|| format!("{}: no live block there", what()))?;
                if self.earlier.contains(&id) {
                    self.facts.frees_of_earlier_blocks += 1;
                }
                let completes_now = entries
                    .get(i + 1)
                    .is_some_and(|n| n.action == "free_completed" && n.addr == e.addr);
                if !completes_now {
                    let stream = *self.next_pending_stream;
                    *self.next_pending_stream += 1;
                    self.pending.insert(addr, stream);
                    self.facts.deferred_frees += 1;
                    self.emit(e, Event::RecordStream { id, stream });
                }
                self.emit(e, Event::Free { id });
            }
            "free_completed" => {
                if let Some(stream) = self.pending.remove(&addr) {
                    self.emit(
                        e,
                        Event::Sync {
                            stream: Some(stream),
                        },
                    );
                } else if let Some(id) = self.live.remove(&addr) {
                    // Freed before the recording began, completed in it.
                    self.emit(e, Event::Free { id });
                }
                // Else: the completion of the free just before it.
            }
            // Expandable segments: pages mapped into a reservation and
            // unmapped from it count as the device's mallocs and frees.
            "segment_alloc" | "segment_map" => {
                if let Some((before, false)) = burst {
                    if self.gc {
                        self.facts.gc_bursts += 1;
                    } else {
                        self.retried(before, e.size);
                    }
                }
                self.reserved += e.size;
                self.facts.peak_reserved = self.facts.peak_reserved.max(self.reserved);
                self.facts.mallocs.push((addr, e.size));
            }
            "segment_free" | "segment_unmap" => {
                if burst.is_none() {
                    let ends_in_malloc = entries[i..]
                        .iter()
                        .find(|n| n.action != "segment_free" && n.action != "segment_unmap")
                        .is_some_and(|n| {
                            matches!(n.action.as_str(), "segment_alloc" | "segment_map" | "oom")
                        });
                    // A retry's release comes only after the cache failed the
                    // request: a burst that frees a segment that would have
                    // served it is the program's empty_cache.
                    let ends_in_malloc =
                        ends_in_malloc && (self.gc || !self.burst_could_have_served(entries, i));
                    if !ends_in_malloc {
                        self.facts.empty_caches += 1;
                        self.emit(e, Event::EmptyCache);
                    }
                    self.burst = Some((self.reserved, !ends_in_malloc));
                }
                self.reserved = self.reserved.saturating_sub(e.size);
                self.facts.segment_frees.push(e.size);
            }
            "oom" => {
                self.facts.ooms += 1;
                let segment = policy::allocation_size(e.size).unwrap_or(e.size);
                if e.device_free.is_some_and(|free| free >= segment) {
                    self.facts.limit_refusals += 1;
                }
                self.capacity_below(self.reserved.saturating_add(segment));
                let id = *next_id;
                *next_id += 1;
                self.emit(
                    e,
                    Event::Alloc {
                        id,
                        size: e.size,
                        stream: self.streams.id(e.stream),
                        device: self.device,
                    },
                );
            }
            _ => {} // snapshot, annotations
        }
        Ok(())
    }

    /// A device malloc of `size` bytes failed with `reserved` bytes held,
    /// was retried after the cache was released, and succeeded.
    fn retried(&mut self, reserved: u64, size: u64) {
        self.facts.oom_retries += 1;
        self.capacity_below(reserved.saturating_add(size));
    }

    /// A device malloc that would have held `held` bytes failed.
    fn capacity_below(&mut self, held: u64) {
        let bound = held.saturating_sub(1);
        self.facts.capacity_below = Some(self.facts.capacity_below.map_or(bound, |b| b.min(bound)));
    }
}
