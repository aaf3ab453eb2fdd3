//! Snapshots recorded with `expandable_segments:True`: their segments are
//! the mapped runs of reservations, and their history has `segment_map` /
//! `segment_unmap` entries instead of `segment_alloc` / `segment_free`. A
//! recording whose history covers the allocator's whole life (a cold
//! start) imports: the history read forward from nothing must map every
//! block it allocates, and end with exactly the final snapshot's runs. A
//! warm start (the state before the history would have to be rebuilt
//! inside reservations) is refused, with why.

use super::pytorch::{PtEntry, PtSegment};
use super::state::InitialState;
use std::collections::{BTreeMap, HashSet};

/// Mapped address ranges: start -> end, adjacent ranges merged.
#[derive(Default)]
struct Mapped(BTreeMap<u64, u64>);

impl Mapped {
    fn map(&mut self, start: u64, end: u64) -> Result<(), String> {
        if self.overlaps(start, end) {
            return Err(format!(
                "segment_map of {start:#x}..{end:#x}: already mapped"
            ));
        }
        let (mut s, mut e) = (start, end);
        if let Some((&ps, &pe)) = self.0.range(..start).next_back() {
            if pe == start {
                self.0.remove(&ps);
                s = ps;
            }
        }
        if let Some(&ne) = self.0.get(&end) {
            self.0.remove(&end);
            e = ne;
        }
        self.0.insert(s, e);
        Ok(())
    }

    fn unmap(&mut self, start: u64, end: u64) -> Result<(), String> {
        let (&s, &e) = self
            .0
            .range(..=start)
            .next_back()
            .filter(|(_, &e)| e >= end)
            .ok_or(format!("segment_unmap of {start:#x}..{end:#x}: not mapped"))?;
        self.0.remove(&s);
        if s < start {
            self.0.insert(s, start);
        }
        if end < e {
            self.0.insert(end, e);
        }
        Ok(())
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }

    fn contains(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= end)
    }
}

/// The initial state of a device whose snapshot has expandable segments:
/// empty, once the history, read forward from nothing, maps every block it
/// allocates, frees only blocks it allocated, and ends with the final runs.
pub fn cold_start(segments: &[&PtSegment], entries: &[PtEntry]) -> Result<InitialState, String> {
    const WARM: &str = "expandable segments: only a recording whose history covers the allocator's whole life (a cold start) can be imported yet";
    let mut mapped = Mapped::default();
    let mut live = HashSet::new();
    for (i, e) in entries.iter().enumerate() {
        let addr = e.addr.unwrap_or(0);
        let end = addr.saturating_add(e.size);
        let at = |why: String| format!("{WARM}; entry {i} ({}): {why}", e.action);
        match e.action.as_str() {
            "segment_map" | "segment_alloc" => mapped.map(addr, end).map_err(at)?,
            "segment_unmap" | "segment_free" => mapped.unmap(addr, end).map_err(at)?,
            "alloc" => {
                if !mapped.contains(addr, end) {
                    return Err(at(format!("{addr:#x} is not in mapped memory")));
                }
                live.insert(addr);
            }
            "free_requested" if !live.contains(&addr) => {
                return Err(at(format!("{addr:#x} was allocated before the history")));
            }
            "free_completed" => {
                live.remove(&addr);
            }
            _ => {}
        }
    }
    let mut recorded = Mapped::default();
    for s in segments {
        recorded
            .map(s.address, s.address.saturating_add(s.total_size))
            .map_err(|e| format!("{WARM}; the final segments: {e}"))?;
    }
    if recorded.0 != mapped.0 {
        return Err(format!(
            "{WARM}; the history maps {} bytes in {} runs, the final segments {} in {}",
            mapped.0.iter().map(|(s, e)| e - s).sum::<u64>(),
            mapped.0.len(),
            recorded.0.iter().map(|(s, e)| e - s).sum::<u64>(),
            recorded.0.len()
        ));
    }
    Ok(InitialState::default())
}
