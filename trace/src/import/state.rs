//! The state a recording began from: the final segments of the snapshot,
//! walked back through the trace (as memory_viz's "Allocator State History"
//! does). A recording that began after the process already held memory
//! (most do: `_record_memory_history` is called mid-run, or the ring
//! buffer dropped the oldest entries) then starts from this state instead
//! of from nothing.

use super::pytorch::{PtEntry, PtSegment};
use cachealloc_core::{policy, Config, Pool};
use std::collections::BTreeMap;

/// A segment at the start of the recording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Base address.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// The raw stream handle.
    pub stream: i64,
    /// Whether it belongs to the small pool (2 MiB segments).
    pub small: bool,
    /// Its live blocks, by address.
    pub blocks: BTreeMap<u64, Block>,
}

impl Segment {
    fn contains(&self, addr: u64) -> bool {
        addr >= self.address && addr - self.address < self.size
    }

    /// The pool of its blocks.
    pub fn pool(&self) -> Pool {
        if self.small {
            Pool::Small
        } else {
            Pool::Large
        }
    }
}

/// A live block at the start of the recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Bytes (`None` until inferred: a block freed during the recording
    /// that was allocated before it, whose size no entry gives).
    pub size: Option<u64>,
    /// Its request.
    pub requested: u64,
}

/// The rebuilt state of one device.
#[derive(Clone, Debug, Default)]
pub struct InitialState {
    /// Segments in address order.
    pub segments: Vec<Segment>,
    /// The first entry the state explains: entries before it contradict the
    /// final state (a gap in the history) and are left out.
    pub first_usable: usize,
    /// Why the entry before `first_usable` was left out.
    pub cut_reason: Option<String>,
    /// Block sizes inferred from the request (`round_size`).
    pub inferred_sizes: u64,
    /// Block sizes inferred from the next block (a remainder that small
    /// would not have been split off).
    pub inferred_from_neighbour: u64,
}

impl InitialState {
    /// Bytes reserved at the start.
    pub fn reserved(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    /// Live blocks at the start.
    pub fn live_blocks(&self) -> usize {
        self.segments.iter().map(|s| s.blocks.len()).sum()
    }
}

/// Segments by base address while walking.
struct Walk {
    segments: BTreeMap<u64, Segment>,
}

impl Walk {
    fn containing(&mut self, addr: u64) -> Option<&mut Segment> {
        self.segments
            .range_mut(..=addr)
            .next_back()
            .map(|(_, s)| s)
            .filter(|s| s.contains(addr))
    }

    /// Undo one entry (the state before it, from the state after it).
    fn undo(&mut self, e: &PtEntry) -> Result<(), String> {
        let addr = e.addr.unwrap_or(0);
        match e.action.as_str() {
            "alloc" => {
                let seg = self
                    .containing(addr)
                    .ok_or_else(|| format!("alloc at {addr:#x}: no segment holds it"))?;
                seg.blocks
                    .remove(&addr)
                    .map(|_| ())
                    .ok_or_else(|| format!("alloc at {addr:#x}: no live block there after it"))
            }
            "free_completed" => {
                let seg = self
                    .containing(addr)
                    .ok_or_else(|| format!("free_completed at {addr:#x}: no segment holds it"))?;
                if seg.blocks.contains_key(&addr) {
                    return Err(format!(
                        "free_completed at {addr:#x}: the block is live after it"
                    ));
                }
                seg.blocks.insert(
                    addr,
                    Block {
                        size: None,
                        requested: e.size,
                    },
                );
                Ok(())
            }
            "free_requested" => match self.containing(addr) {
                Some(seg) if seg.blocks.contains_key(&addr) => Ok(()),
                _ => Err(format!(
                    "free_requested at {addr:#x}: no live block there after it"
                )),
            },
            "segment_alloc" => match self.segments.get(&addr) {
                Some(s) if s.size == e.size && s.blocks.is_empty() => {
                    self.segments.remove(&addr);
                    Ok(())
                }
                Some(s) if s.size == e.size => Err(format!(
                    "segment_alloc at {addr:#x}: it holds live blocks right after"
                )),
                _ => Err(format!(
                    "segment_alloc at {addr:#x} ({} bytes): no such segment after it",
                    e.size
                )),
            },
            "segment_free" => {
                let end = addr.saturating_add(e.size);
                let clash = self
                    .segments
                    .range(..end)
                    .next_back()
                    .is_some_and(|(&b, s)| b.saturating_add(s.size) > addr);
                if clash {
                    return Err(format!(
                        "segment_free at {addr:#x}: overlaps a segment that exists after it"
                    ));
                }
                self.segments.insert(
                    addr,
                    Segment {
                        address: addr,
                        size: e.size,
                        stream: e.stream,
                        small: e.size == policy::SMALL_BUFFER,
                        blocks: BTreeMap::new(),
                    },
                );
                Ok(())
            }
            "segment_map" | "segment_unmap" => Err(format!(
                "{}: expandable segments are imported from a cold start only (import routes them to that check)",
                e.action
            )),
            _ => Ok(()), // oom, snapshot, annotations: no state change
        }
    }
}

/// The state of one device at the start of its `entries`, from its final
/// `segments`. An entry the final state contradicts ends the walk: the
/// entries up to it are left out (`first_usable`).
pub fn initial_state(
    segments: &[&PtSegment],
    entries: &[PtEntry],
    config: &Config,
) -> Result<InitialState, String> {
    let mut walk = Walk {
        segments: BTreeMap::new(),
    };
    for s in segments {
        if s.is_expandable {
            return Err("expandable segments are imported from a cold start only (import routes them to that check)".to_string());
        }
        let mut blocks = BTreeMap::new();
        let mut addr = s.address;
        for b in &s.blocks {
            if b.is_active() {
                let requested = b.requested_size.unwrap_or(b.size);
                blocks.insert(
                    addr,
                    Block {
                        size: Some(b.size),
                        requested,
                    },
                );
            }
            addr += b.size;
        }
        walk.segments.insert(
            s.address,
            Segment {
                address: s.address,
                size: s.total_size,
                stream: s.stream,
                small: s
                    .segment_type
                    .as_deref()
                    .map_or(s.total_size == policy::SMALL_BUFFER, |t| t == "small"),
                blocks,
            },
        );
    }
    let mut state = InitialState::default();
    for (i, e) in entries.iter().enumerate().rev() {
        let before = walk.segments.clone();
        if let Err(why) = walk.undo(e) {
            walk.segments = before;
            state.first_usable = i + 1;
            state.cut_reason = Some(format!("entry {i}: {why}"));
            break;
        }
    }
    state.segments = walk.segments.into_values().collect();
    infer_sizes(&mut state, config)?;
    Ok(state)
}

/// Sizes of the blocks no entry gives: `round_size` of the request, or up
/// to the next block where PyTorch would not have split the remainder off.
fn infer_sizes(state: &mut InitialState, config: &Config) -> Result<(), String> {
    for seg in &mut state.segments {
        let end = seg.address + seg.size;
        let addrs: Vec<u64> = seg.blocks.keys().copied().collect();
        for (k, &addr) in addrs.iter().enumerate() {
            let next = addrs.get(k + 1).copied().unwrap_or(end);
            let room = next - addr;
            let pool = seg_pool(seg.small);
            let Some(b) = seg.blocks.get_mut(&addr) else {
                continue;
            };
            let size = match b.size {
                Some(s) => s,
                None => {
                    let rounded = policy::round_size(b.requested, config).unwrap_or(u64::MAX);
                    if rounded == room
                        || (rounded < room && policy::should_split(pool, room, rounded, config))
                    {
                        state.inferred_sizes += 1;
                        rounded
                    } else {
                        state.inferred_from_neighbour += 1;
                        room
                    }
                }
            };
            if size > room {
                return Err(format!(
                    "block at {addr:#x} ({size} bytes) overlaps the next one at {next:#x}"
                ));
            }
            b.size = Some(size);
        }
    }
    Ok(())
}

fn seg_pool(small: bool) -> Pool {
    if small {
        Pool::Small
    } else {
        Pool::Large
    }
}
