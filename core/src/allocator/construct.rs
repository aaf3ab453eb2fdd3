//! Making an allocator: [`DeviceAllocator::new`] (64 events, no history),
//! `with_history`, `with_events`, and the general
//! `with_events_and_history`. All `const`, for `static`s.

use super::{ConfigShape, Deferred, DeviceAllocator, DEFAULT_EVENTS};
use crate::arena::{Arena, BlockSlot};
use crate::backend::DeviceBackend;
use crate::config::Config;
use crate::events::EventQueue;
use crate::history::{History, HistoryStorage};
use crate::live::LiveIndex;
use crate::pool::Pools;
use crate::private_pool::PoolTable;
use crate::segment_index::SegmentIndex;
use crate::stats::DeviceStats;

impl<B, S> DeviceAllocator<B, S, DEFAULT_EVENTS>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
{
    /// A new allocator over `backend`, keeping block metadata in `storage`,
    /// with [`DEFAULT_EVENTS`] events and no history. `const`, so a
    /// `no_std` program can build it in a `static`.
    pub const fn new(backend: B, storage: S, config: Config) -> Self {
        Self::with_events_and_history(backend, storage, [], config)
    }
}

impl<B, S, H> DeviceAllocator<B, S, DEFAULT_EVENTS, H>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// [`new`](DeviceAllocator::new) with room for a memory history of
    /// `history.len()` entries (recorded once
    /// [`record_history`](Self::record_history) turns it on).
    pub const fn with_history(backend: B, storage: S, history: H, config: Config) -> Self {
        Self::with_events_and_history(backend, storage, history, config)
    }
}

impl<B, S, const E: usize> DeviceAllocator<B, S, E>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
{
    /// [`new`](DeviceAllocator::new) with an event capacity of `E`:
    /// `DeviceAllocator::<_, _, 256>::with_events(backend, storage, config)`.
    pub const fn with_events(backend: B, storage: S, config: Config) -> Self {
        Self::with_events_and_history(backend, storage, [], config)
    }
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// The general constructor: event capacity `E`, history storage `H`, and
    /// room for `P` private pools:
    /// `DeviceAllocator::<_, _, 64, NoHistory, 64>::with_events_and_history(..)`.
    pub const fn with_events_and_history(
        backend: B,
        storage: S,
        history: H,
        config: Config,
    ) -> Self {
        const { assert!(E <= u16::MAX as usize, "E must fit a u16") };
        DeviceAllocator {
            backend,
            arena: Arena::new(storage),
            pools: Pools::EMPTY,
            segments: SegmentIndex::EMPTY,
            live: LiveIndex::EMPTY,
            events: EventQueue::new(),
            config,
            initial_config: config,
            stats: DeviceStats::new(if config.max_split_size == u64::MAX {
                None
            } else {
                Some(config.max_split_size)
            }),
            limit: None,
            total_allocated_memory: 0,
            next_allocation_id: 1,
            next_counter: 0,
            shape: ConfigShape::of(&config),
            device_total: None,
            fraction_pending: config.per_process_memory_fraction < 1.0,
            rejected: None,
            source_refused: false,
            callbacks: heapless::Vec::new(),
            history: History::new(history),
            trackers: heapless::Vec::new(),
            oom_observers: heapless::Vec::new(),
            trace_context: 0,
            tracing: false,
            private: PoolTable::new(),
            routes: heapless::Vec::new(),
            captures: 0,
            marked_captures: 0,
            deferred: Deferred::EMPTY,
            compact: super::compact::CompactHeads::NONE,
            handovers: 0,
            reserved_high: 0,
            ipc_opened: super::ipc::Opened::EMPTY,
            ipc_shared: super::ipc::Shared::EMPTY,
            registry: None,
            keep_oom: false,
            oom_kept: heapless::Vec::new(),
            last_ooms: heapless::Deque::new(),
            oom_seq: 0,
            given_back_later: heapless::Vec::new(),
            on_drop: None,
        }
    }
}
