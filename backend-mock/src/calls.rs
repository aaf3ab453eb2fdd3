//! Counting the backend calls and failing the ones a test planted
//! ([`CallKind`], [`Counters`], the fault list).

use crate::MockError;
use std::collections::HashMap;

/// The kinds of backend call, for counters and fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CallKind {
    /// `malloc`
    Malloc,
    /// `free`
    Free,
    /// `event_create`
    EventCreate,
    /// `event_record`
    EventRecord,
    /// `event_query`
    EventQuery,
    /// `event_synchronize`
    EventSynchronize,
    /// `event_destroy`
    EventDestroy,
    /// `mem_info`
    MemInfo,
    /// `reserve_address_space`
    Reserve,
    /// `release_address_space`
    Unreserve,
    /// `map_pages`
    Map,
    /// `unmap_pages`
    Unmap,
    /// `synchronize_stream`
    StreamSynchronize,
    /// `device_total_memory`
    TotalMemory,
    /// `allocation_granularity`
    Granularity,
    /// `stream_wait_event`
    StreamWaitEvent,
}

impl CallKind {
    /// Every kind.
    pub const ALL: [CallKind; 16] = [
        CallKind::Malloc,
        CallKind::Free,
        CallKind::EventCreate,
        CallKind::EventRecord,
        CallKind::EventQuery,
        CallKind::EventSynchronize,
        CallKind::EventDestroy,
        CallKind::MemInfo,
        CallKind::Reserve,
        CallKind::Unreserve,
        CallKind::Map,
        CallKind::Unmap,
        CallKind::StreamSynchronize,
        CallKind::TotalMemory,
        CallKind::Granularity,
        CallKind::StreamWaitEvent,
    ];
}

/// Counts of calls, by kind and in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `malloc` calls (including failed ones).
    pub malloc: u64,
    /// `malloc` calls that failed with out-of-memory.
    pub malloc_oom: u64,
    /// `free` calls.
    pub free: u64,
    /// `event_create` calls.
    pub event_create: u64,
    /// `event_record` calls.
    pub event_record: u64,
    /// `event_query` calls.
    pub event_query: u64,
    /// `event_synchronize` calls.
    pub event_synchronize: u64,
    /// `event_destroy` calls.
    pub event_destroy: u64,
    /// `mem_info` calls.
    pub mem_info: u64,
    /// `reserve_address_space` calls.
    pub reserve: u64,
    /// `release_address_space` calls.
    pub unreserve: u64,
    /// `map_pages` calls (including failed ones).
    pub map: u64,
    /// `map_pages` calls that failed with out-of-memory.
    pub map_oom: u64,
    /// `unmap_pages` calls.
    pub unmap: u64,
    /// `synchronize_stream` calls.
    pub stream_synchronize: u64,
    /// `device_total_memory` and `allocation_granularity` calls.
    pub device_properties: u64,
    /// `stream_wait_event` calls.
    pub stream_wait_event: u64,
    /// All calls.
    pub total: u64,
}

#[derive(Clone, Copy, Debug)]
enum FaultAt {
    AnyCall(u64),
    Kind(CallKind, u64),
}

/// The call counters and the planted failures.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    pub(crate) counters: Counters,
    per_kind: HashMap<CallKind, u64>,
    /// Where each failure fires, and whether a failed malloc is out-of-memory.
    faults: Vec<(FaultAt, bool)>,
}

impl Calls {
    /// Fail the `n`-th call from now, of any kind.
    pub(crate) fn fail_call(&mut self, n: u64) {
        self.faults
            .push((FaultAt::AnyCall(self.counters.total + n), false));
    }

    /// Fail the `n`-th call of `kind` from now (`oom`: a malloc fails with
    /// out-of-memory).
    pub(crate) fn fail_nth(&mut self, kind: CallKind, n: u64, oom: bool) {
        let base = self.per_kind.get(&kind).copied().unwrap_or(0);
        self.faults.push((FaultAt::Kind(kind, base + n), oom));
    }

    /// Forget planted failures that have not fired.
    pub(crate) fn clear_faults(&mut self) {
        self.faults.clear();
    }

    /// Count a call; `Some((error, oom))` if a planted failure fires.
    pub(crate) fn call(&mut self, kind: CallKind) -> Option<(MockError, bool)> {
        let total = self.counters.total;
        self.counters.total += 1;
        let c = &mut self.counters;
        match kind {
            CallKind::Malloc => c.malloc += 1,
            CallKind::Free => c.free += 1,
            CallKind::EventCreate => c.event_create += 1,
            CallKind::EventRecord => c.event_record += 1,
            CallKind::EventQuery => c.event_query += 1,
            CallKind::EventSynchronize => c.event_synchronize += 1,
            CallKind::EventDestroy => c.event_destroy += 1,
            CallKind::MemInfo => c.mem_info += 1,
            CallKind::Reserve => c.reserve += 1,
            CallKind::Unreserve => c.unreserve += 1,
            CallKind::Map => c.map += 1,
            CallKind::Unmap => c.unmap += 1,
            CallKind::StreamSynchronize => c.stream_synchronize += 1,
            CallKind::TotalMemory | CallKind::Granularity => c.device_properties += 1,
            CallKind::StreamWaitEvent => c.stream_wait_event += 1,
        }
        let nth = self.per_kind.entry(kind).or_insert(0);
        let this = *nth;
        *nth += 1;
        let pos = self.faults.iter().position(|(at, _)| match *at {
            FaultAt::AnyCall(n) => n == total,
            FaultAt::Kind(k, n) => k == kind && n == this,
        })?;
        let (_, oom) = self.faults.swap_remove(pos);
        Some((MockError::Injected { kind, call: total }, oom))
    }
}
