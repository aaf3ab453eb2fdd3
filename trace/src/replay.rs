//! [`Replay`]: a trace's events applied to one caching allocator per device,
//! with the format's rules. An `alloc` that fails with out-of-memory is
//! counted, and its id stays live (in the trace's terms) until its `free`,
//! which is skipped, as is a `record_stream` of it. Like PyTorch (and the
//! reference model), the device allocators come into being at the first
//! allocation: an `empty_cache` before it does nothing, and a device first
//! used later has counted every `empty_cache` since then in
//! `num_sync_all_streams`.

use crate::device::ReplayDevice;
use crate::error::Reason;
use crate::event::{Event, Header, MallocAddresses};
use crate::liveness::Liveness;
use crate::pool_rules::PoolRules;
use crate::run::Options;
use cachealloc_core::{
    BlockId, BlockSlot, DeviceAllocator, DeviceBackend, Error, TraceActions, TraceEntry,
};
use cachealloc_mock::MockDevice;

/// The allocator a replay drives (on the simulated device unless said),
/// with room for `Options::history` trace entries.
pub type Alloc<D = MockDevice> = DeviceAllocator<
    <D as ReplayDevice>::Backend,
    Box<[BlockSlot]>,
    1024,
    Box<[TraceEntry]>,
    REPLAY_POOLS,
>;

/// Private pools a replay's device can hold at once.
pub const REPLAY_POOLS: usize = 64;

/// The stream type of a device kind.
type Stream<D> = <<D as ReplayDevice>::Backend as DeviceBackend>::Stream;

/// A live id of the trace.
enum Live {
    /// Served by device `dev` (`id` is `None` for a zero-byte allocation).
    Served {
        dev: usize,
        id: Option<BlockId>,
        size: u64,
    },
    /// Its `alloc` failed with out-of-memory.
    OutOfMemory,
}

/// One device's allocator.
pub struct Device<D: ReplayDevice = MockDevice> {
    /// The device index of the trace.
    pub index: u64,
    /// Its allocator.
    pub alloc: Alloc<D>,
    /// Device streams by trace stream id (a trace uses a handful).
    streams: Vec<(u64, Stream<D>)>,
    /// Requested bytes of its live allocations, and their peak.
    pub live_bytes: u64,
    /// The peak of `live_bytes`.
    pub peak_live: u64,
}

/// An error of the allocator a replay drives.
pub(crate) type AllocError<D> = Error<<<D as ReplayDevice>::Backend as DeviceBackend>::Error>;

/// Twice the block slots of a storage that has `capacity`.
#[cold]
fn twice(capacity: u32) -> Box<[BlockSlot]> {
    vec![BlockSlot::VACANT; (capacity as usize).max(1) * 2].into_boxed_slice()
}

impl<D: ReplayDevice> Device<D> {
    #[inline]
    pub(crate) fn stream(&mut self, id: u64) -> Result<Stream<D>, Reason> {
        if let Some(&(_, s)) = self.streams.iter().find(|(k, _)| *k == id) {
            return Ok(s);
        }
        let s = D::stream_for(self.alloc.backend_mut(), id).map_err(Reason::Device)?;
        self.streams.push((id, s));
        Ok(s)
    }
}

/// The state of a replay.
pub struct Replay<D: ReplayDevice = MockDevice> {
    opts: Options,
    capacity: Option<u64>,
    /// The recorded mallocs per device, when the replay hands them out.
    real_mallocs: MallocAddresses,
    /// Device allocators, in order of first use.
    pub devices: Vec<Device<D>>,
    live: Liveness<Live>,
    /// Slot storage made ahead for the first device, so it is not timed.
    spare: Option<Box<[BlockSlot]>>,
    empty_caches_since_init: u64,
    /// Events applied.
    pub events: u64,
    /// `alloc` events.
    pub allocs: u64,
    /// Allocations that failed with out-of-memory.
    pub ooms: u64,
    /// Of which, by verdict (`OomClass::index`).
    pub oom_classes: [u64; cachealloc_core::OomClass::COUNT],
    /// The first out-of-memory.
    pub first_oom: Option<FirstOom>,
    /// Sum of the requested sizes of live (served) allocations.
    pub live_bytes: u64,
    /// Its peak.
    pub peak_live: u64,
    /// The trace line being applied (the history's context).
    line: u64,
    /// The private-pool rules (version 2 traces).
    pub(crate) pools: PoolRules,
}

/// The first out-of-memory of a replay: where, and why.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FirstOom {
    /// The trace line of the failing `alloc`.
    pub line: u64,
    /// Its device.
    pub device: u64,
    /// Its stream.
    pub stream: u64,
    /// The bytes it asked for.
    pub size: u64,
    /// The verdict and its figures.
    pub cause: cachealloc_core::OomCause,
    /// The error's message (PyTorch's, then the verdict).
    pub message: String,
}

pub(crate) fn allocator_error(e: impl std::fmt::Display) -> Reason {
    Reason::Allocator(e.to_string())
}

impl<D: ReplayDevice> Replay<D> {
    /// A replay with `opts` of a trace with `header` (its `device_capacity`,
    /// and its `malloc_addresses` if `opts.real_addresses`).
    pub fn new(mut opts: Options, header: &Header) -> Self {
        let capacity = opts.capacity.or(header.device_capacity);
        // A recording made under a memory fraction replays under it.
        opts.memory_fraction = opts.memory_fraction.or(header.memory_fraction);
        if let Some(v) = opts.torch.or(header.torch_version) {
            opts.config = opts.config.with_torch_version(v);
        }
        let slots = opts.slots;
        let real_mallocs = if opts.real_addresses {
            header.malloc_addresses.clone()
        } else {
            Vec::new()
        };
        Replay {
            opts,
            capacity,
            real_mallocs,
            devices: Vec::new(),
            spare: Some(vec![BlockSlot::VACANT; slots].into_boxed_slice()),
            live: Liveness::new(),
            empty_caches_since_init: 0,
            events: 0,
            allocs: 0,
            ooms: 0,
            oom_classes: [0; cachealloc_core::OomClass::COUNT],
            first_oom: None,
            live_bytes: 0,
            peak_live: 0,
            line: 0,
            pools: PoolRules::new(),
        }
    }

    /// The device capacity in force (`None`: unlimited).
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// The memory fraction in force: the options', else the trace's.
    pub fn memory_fraction(&self) -> Option<f64> {
        self.opts.memory_fraction
    }

    /// The position of device `index` in `devices`, created at first use.
    #[inline]
    pub(crate) fn device(&mut self, index: u64) -> Result<usize, Reason> {
        match self.devices.iter().position(|d| d.index == index) {
            Some(k) => Ok(k),
            None => self.open_device(index),
        }
    }

    /// Create device `index` (apart from `device`, whose every call would
    /// otherwise reserve and probe the stack frame of an allocator).
    #[cold]
    #[inline(never)]
    fn open_device(&mut self, index: u64) -> Result<usize, Reason> {
        let storage = self
            .spare
            .take()
            .unwrap_or_else(|| vec![BlockSlot::VACANT; self.opts.slots].into_boxed_slice());
        let mut backend = D::open(index, self.capacity).map_err(Reason::Device)?;
        if self.opts.real_addresses {
            let mallocs = self
                .real_mallocs
                .iter()
                .find(|(d, _)| *d == index)
                .map_or(&[][..], |(_, m)| m.as_slice());
            D::use_real_addresses(&mut backend, mallocs).map_err(Reason::Option)?;
        }
        let history = vec![TraceEntry::EMPTY; self.opts.history].into_boxed_slice();
        let mut alloc =
            DeviceAllocator::with_events_and_history(backend, storage, history, self.opts.config);
        if self.opts.history > 0 && self.recording() {
            alloc.record_history(true, usize::MAX, false, TraceActions::NONE);
            alloc.set_trace_context(self.line);
        }
        if let (false, Some(cap)) = (D::SIMULATED, self.capacity) {
            alloc.set_memory_limit(cap);
        }
        if let Some(f) = self.opts.memory_fraction {
            // The limit a recording ran under: f of the device, a limit
            // even at 1.0 (the import writes 1.0 for a limit it read off the
            // out-of-memory entries), where torch's
            // set_per_process_memory_fraction(1.0) sets none.
            if !(0.0..=1.0).contains(&f) {
                return Err(Reason::Option(format!(
                    "--memory-fraction {f}: expected a fraction in [0, 1]"
                )));
            }
            let total = alloc
                .backend_mut()
                .mem_info()
                .map_err(|e| Reason::Option(format!("--memory-fraction {f}: {e}")))?
                .total;
            alloc.set_memory_limit((f * total as f64) as u64);
        }
        for _ in 0..self.empty_caches_since_init {
            alloc.empty_cache().map_err(allocator_error)?;
        }
        self.devices.push(Device {
            index,
            alloc,
            streams: Vec::new(),
            live_bytes: 0,
            peak_live: 0,
        });
        Ok(self.devices.len() - 1)
    }

    /// Run `op` on device `dev`'s allocator; when the options allow it, a
    /// lack of block slots gives the device twice as many and `op` runs
    /// again (`DeviceAllocator::with_growing_storage`).
    #[inline]
    pub(crate) fn with_room<T>(
        &mut self,
        dev: usize,
        mut op: impl FnMut(&mut Alloc<D>) -> Result<T, AllocError<D>>,
    ) -> Result<T, AllocError<D>> {
        let alloc = &mut self.devices[dev].alloc;
        if self.opts.grow_slots {
            alloc.with_growing_storage(op, twice)
        } else {
            op(alloc)
        }
    }

    /// The trace line of the next event (with history on, the entries it
    /// makes carry it as their context).
    #[inline]
    pub fn set_line(&mut self, line: u64) {
        self.line = line;
        if self.opts.history > 0 {
            for d in &mut self.devices {
                d.alloc.set_trace_context(line);
            }
        }
    }

    /// Whether the events applied so far are past the rebuilt starting state
    /// of an imported trace (always, for other traces).
    #[inline]
    fn recording(&self) -> bool {
        self.opts.recorded_from.is_none_or(|n| self.events > n)
    }

    /// The recorded part of an imported trace begins: history starts and
    /// the peaks restart from the state the warm-up rebuilt.
    #[cold]
    fn begin_recorded_part(&mut self) {
        for d in &mut self.devices {
            d.alloc.reset_peak_stats();
            if self.opts.history > 0 {
                d.alloc
                    .record_history(true, usize::MAX, false, TraceActions::NONE);
                d.alloc.set_trace_context(self.line);
            }
        }
        self.peak_live = self.live_bytes;
        for d in &mut self.devices {
            d.peak_live = d.live_bytes;
        }
    }

    /// Reserved bytes over all devices now.
    pub fn reserved(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| d.alloc.stats().reserved_bytes.all().current as u64)
            .sum()
    }

    /// Apply one event.
    #[inline]
    pub fn apply(&mut self, ev: Event) -> Result<(), Reason> {
        if self.opts.recorded_from == Some(self.events) {
            self.begin_recorded_part();
        }
        self.events += 1;
        match ev {
            Event::Alloc {
                id,
                size,
                stream,
                device,
            } => self.alloc(id, size, stream, device)?,
            Event::Free { id } => {
                if let Live::Served { dev, id, size } = self.live.free(id)? {
                    self.live_bytes -= size;
                    self.devices[dev].live_bytes -= size;
                    if let Some(bid) = id {
                        self.devices[dev].alloc.free(bid).map_err(allocator_error)?;
                    }
                }
            }
            Event::RecordStream { id, stream } => {
                if let Live::Served {
                    dev, id: Some(bid), ..
                } = *self.live.record_stream(id)?
                {
                    let d = &mut self.devices[dev];
                    let s = d.stream(stream)?;
                    d.alloc.record_stream(bid, s).map_err(allocator_error)?;
                }
            }
            Event::Sync { stream } => {
                for d in &mut self.devices {
                    let s = match stream {
                        Some(id) => Some(d.stream(id)?),
                        None => None,
                    };
                    D::sync(d.alloc.backend_mut(), s).map_err(Reason::Device)?;
                }
            }
            Event::EmptyCache => {
                if !self.devices.is_empty() {
                    self.empty_caches_since_init += 1;
                }
                for dev in 0..self.devices.len() {
                    self.with_room(dev, |a| a.empty_cache())
                        .map_err(allocator_error)?;
                }
            }
            pool_op => self.apply_pool_op(pool_op)?,
        }
        Ok(())
    }

    /// An `alloc` event.
    #[inline]
    fn alloc(&mut self, id: u64, size: u64, stream: u64, device: u64) -> Result<(), Reason> {
        // The liveness check comes first: a bad line changes nothing.
        self.live.can_alloc(id)?;
        self.allocs += 1;
        let dev = self.device(device)?;
        let s = self.devices[dev].stream(stream)?;
        let live = match self.with_room(dev, |a| a.malloc(size, s)) {
            Ok(x) => {
                self.live_bytes = self.live_bytes.saturating_add(size);
                self.peak_live = self.peak_live.max(self.live_bytes);
                let d = &mut self.devices[dev];
                d.live_bytes = d.live_bytes.saturating_add(size);
                d.peak_live = d.peak_live.max(d.live_bytes);
                Live::Served {
                    dev,
                    id: x.handle,
                    size,
                }
            }
            Err(e) if e.is_out_of_memory() => {
                self.ooms += 1;
                if let Error::OutOfMemory(r) = &e {
                    self.oom_classes[r.class.index()] += 1;
                    if self.first_oom.is_none() {
                        // The verdict's bytes are the allocator's, beside
                        // the error (which names only the class).
                        if let Some(cause) = self.devices[dev].alloc.last_oom_cause() {
                            self.first_oom = Some(FirstOom {
                                line: self.line,
                                device,
                                stream,
                                size,
                                cause,
                                message: r.explained(&cause).to_string(),
                            });
                        }
                    }
                }
                Live::OutOfMemory
            }
            Err(e @ Error::MetadataExhausted { .. }) => {
                return Err(Reason::Allocator(format!(
                    "{e}: the replay's slots are fixed (--slots); raise them, or leave --slots \
                     out and the replay doubles them whenever they run out"
                )))
            }
            Err(e) => return Err(allocator_error(e)),
        };
        self.live.alloc(id, live)?;
        Ok(())
    }

    /// Free every live allocation, wait for all streams, and return every
    /// cached segment and idle event to the device (after a replay on a real
    /// device, so the next one starts from an empty GPU).
    pub fn release(&mut self) -> Result<(), Reason> {
        for l in self.live.drain() {
            if let Live::Served {
                dev, id: Some(id), ..
            } = l
            {
                self.devices[dev].alloc.free(id).map_err(allocator_error)?;
            }
        }
        self.live_bytes = 0;
        for d in &mut self.devices {
            d.live_bytes = 0;
            D::sync(d.alloc.backend_mut(), None).map_err(Reason::Device)?;
            d.alloc.release_all().map_err(allocator_error)?;
            for (_, s) in d.streams.drain(..) {
                D::destroy_stream(d.alloc.backend_mut(), s).map_err(Reason::Device)?;
            }
        }
        Ok(())
    }

    /// Make sure device 0 exists when no event created a device (so an empty
    /// trace still reports a full set of statistics), and order the devices.
    pub fn finish(&mut self) -> Result<(), Reason> {
        if self.devices.is_empty() {
            self.device(0)?;
        }
        self.devices.sort_by_key(|d| d.index);
        Ok(())
    }
}
