//! Warm-up events: allocations and frees that make a fresh allocator hold
//! exactly the state a recording began from (its segments, in address
//! order, with their live blocks at their offsets), the way the converted
//! traces of real recordings do:
//!
//! 1. every segment is created in address order by placeholder
//!    allocations that fill it exactly (a small segment: two 1 MiB
//!    requests; a large one: one request of its size), so the device
//!    mallocs come in the same order as the real addresses;
//! 2. segment by segment, its placeholders are freed and its layout is
//!    allocated from its start: fillers for the gaps, the live blocks,
//!    a filler for the tail (best fit can only use this segment: every
//!    other one of its pool and stream is full);
//! 3. the fillers are freed, leaving the live blocks where they were.
//!
//! Each request is checked against the policy (`round_size`, the segment
//! size, splitting), so a state the policy could not have made is an
//! error, not a silently different replay.

use super::state::{InitialState, Segment};
use super::StreamMap;
use crate::event::Event;
use cachealloc_core::{policy, Config, Pool};
use std::collections::HashMap;

/// The warm-up of one device.
#[derive(Debug, Default)]
pub struct Warmup {
    /// The events.
    pub events: Vec<Event>,
    /// The trace id of each live block at the start, by address.
    pub live: HashMap<u64, u64>,
    /// The device mallocs it makes: (address, size), in order.
    pub mallocs: Vec<(u64, u64)>,
}

struct Builder<'a> {
    device: u64,
    config: &'a Config,
    next_id: &'a mut u64,
    out: Warmup,
}

impl Builder<'_> {
    fn alloc(&mut self, size: u64, stream: u64) -> u64 {
        let id = *self.next_id;
        *self.next_id += 1;
        self.out.events.push(Event::Alloc {
            id,
            size,
            stream,
            device: self.device,
        });
        id
    }

    fn free(&mut self, id: u64) {
        self.out.events.push(Event::Free { id });
    }

    /// Requests that fill `bytes` of a segment of `pool` exactly.
    fn fill(
        &mut self,
        bytes: u64,
        pool: Pool,
        stream: u64,
        ids: &mut Vec<u64>,
    ) -> Result<(), String> {
        let mut left = bytes;
        while left > 0 {
            let take = match pool {
                Pool::Small => left.min(policy::SMALL_SIZE),
                _ => left,
            };
            self.check(take, take, pool)?;
            ids.push(self.alloc(take, stream));
            left -= take;
        }
        Ok(())
    }

    /// A request of `request` bytes makes a block of exactly `size` bytes
    /// in `pool`.
    fn check(&self, request: u64, size: u64, pool: Pool) -> Result<(), String> {
        let rounded = policy::round_size(request, self.config);
        if rounded != Some(size) || policy::pool_for(size) != pool {
            return Err(format!(
                "cannot rebuild a {size}-byte {} block with this allocator config",
                pool_name(pool)
            ));
        }
        Ok(())
    }

    /// The placeholder requests that create `seg`.
    fn create(&mut self, seg: &Segment, stream: u64) -> Result<Vec<u64>, String> {
        let mut ids = Vec::new();
        if seg.small {
            if seg.size != policy::SMALL_BUFFER {
                return Err(format!(
                    "a small segment of {} bytes (PyTorch's are {})",
                    seg.size,
                    policy::SMALL_BUFFER
                ));
            }
            self.fill(seg.size, Pool::Small, stream, &mut ids)?;
        } else {
            let made = policy::round_size(seg.size, self.config).and_then(policy::allocation_size);
            if made != Some(seg.size) || seg.size <= policy::SMALL_SIZE {
                return Err(format!(
                    "cannot rebuild a {}-byte large segment with this allocator config",
                    seg.size
                ));
            }
            ids.push(self.alloc(seg.size, stream));
        }
        Ok(ids)
    }

    /// Lay out `seg` (entirely free now) from its start; the fillers' ids.
    fn lay_out(&mut self, seg: &Segment, stream: u64) -> Result<Vec<u64>, String> {
        let pool = seg.pool();
        let mut fillers = Vec::new();
        let mut cursor = seg.address;
        let mut left = seg.size;
        for (&addr, b) in &seg.blocks {
            let size = b.size.unwrap_or(0);
            if addr > cursor {
                self.fill(addr - cursor, pool, stream, &mut fillers)?;
                left -= addr - cursor;
            }
            // The block is carved from the `left` bytes after the cursor: a
            // remainder the policy would not split off would join it.
            let rounded = policy::round_size(size, self.config).unwrap_or(u64::MAX);
            if left > size && !policy::should_split(pool, left, rounded, self.config) {
                return Err(format!(
                    "block at {addr:#x} ({size} bytes): the {} bytes after it could not have been split off",
                    left - size
                ));
            }
            let request = if policy::round_size(b.requested, self.config) == Some(size) {
                b.requested
            } else {
                size
            };
            self.check(request, size, pool)?;
            let id = self.alloc(request, stream);
            self.out.live.insert(addr, id);
            cursor = addr + size;
            left -= size;
        }
        if left > 0 {
            self.fill(left, pool, stream, &mut fillers)?;
        }
        Ok(fillers)
    }
}

fn pool_name(pool: Pool) -> &'static str {
    match pool {
        Pool::Small => "small-pool",
        _ => "large-pool",
    }
}

/// The warm-up of device `device` that rebuilds `state`; ids from `next_id`.
pub fn warmup(
    device: u64,
    state: &InitialState,
    streams: &StreamMap,
    config: &Config,
    next_id: &mut u64,
) -> Result<Warmup, String> {
    let mut b = Builder {
        device,
        config,
        next_id,
        out: Warmup::default(),
    };
    let mut placeholders = Vec::new();
    for seg in &state.segments {
        placeholders.push(b.create(seg, streams.id(seg.stream))?);
        b.out.mallocs.push((seg.address, seg.size));
    }
    let mut fillers = Vec::new();
    for (seg, ids) in state.segments.iter().zip(placeholders) {
        for id in ids {
            b.free(id);
        }
        fillers.extend(b.lay_out(seg, streams.id(seg.stream))?);
    }
    for id in fillers {
        b.free(id);
    }
    Ok(b.out)
}
