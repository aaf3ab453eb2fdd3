//! Replaying a trace through the caching allocator on the simulated device,
//! with the trace format's rules: an `alloc` that fails with out-of-memory is
//! counted and its id remembered, and the later `free` / `record_stream` of
//! that id is skipped. Like PyTorch (and the reference model), the device
//! allocators come into being at the first allocation: an `empty_cache`
//! before it does nothing, and a device first used later has counted every
//! `empty_cache` since then in `num_sync_all_streams`.

use crate::trace::{Event, TraceError, TraceReader};
use cachealloc_core::{BlockId, BlockSlot, Config, DeviceAllocator, DeviceBackend, DeviceStats};
use cachealloc_mock::MockDevice;
use rustc_hash::{FxHashMap, FxHashSet};
use std::time::Instant;

/// The allocator a replay drives (on the simulated device unless said).
pub type Alloc<B = MockDevice> = DeviceAllocator<B, Box<[BlockSlot]>, 1024>;

/// A device a trace can be replayed on: opened by index, trace stream ids
/// mapped to its streams, and a host wait for a stream or for everything.
pub trait ReplayDevice: DeviceBackend + Sized {
    /// Whether the device is simulated (a capacity is then the device's
    /// size; on a real device it becomes a memory limit).
    const SIMULATED: bool;
    /// Open device `index`.
    fn open(index: u64, capacity: Option<u64>) -> Result<Self, String>;
    /// The stream for trace stream `id` (called once per id and device).
    fn stream_for(&mut self, id: u64) -> Result<Self::Stream, String>;
    /// The host waits for `stream` (everything when `None`).
    fn sync(&mut self, stream: Option<Self::Stream>) -> Result<(), String>;
}

impl ReplayDevice for MockDevice {
    const SIMULATED: bool = true;
    fn open(index: u64, capacity: Option<u64>) -> Result<Self, String> {
        Ok(MockDevice::new(capacity).with_ordinal(index as u32))
    }
    fn stream_for(&mut self, id: u64) -> Result<u64, String> {
        Ok(id)
    }
    fn sync(&mut self, stream: Option<u64>) -> Result<(), String> {
        MockDevice::sync(self, stream);
        Ok(())
    }
}

/// How to replay.
#[derive(Clone, Debug)]
pub struct Options {
    /// The allocator policy.
    pub config: Config,
    /// The config string, as given (for reports).
    pub conf: String,
    /// Device capacity; `None`: the trace's `device_capacity`, else unlimited.
    pub capacity: Option<u64>,
    /// `set_per_process_memory_fraction` on each device when it is created
    /// (needs a capacity).
    pub memory_fraction: Option<f64>,
    /// Block slots per device.
    pub slots: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: Config::DEFAULT,
            conf: String::new(),
            capacity: None,
            memory_fraction: None,
            slots: 1 << 17,
        }
    }
}

/// Why a replay stopped.
#[derive(Debug)]
pub enum ReplayError {
    /// The trace is malformed (exit status 2).
    Input(TraceError),
    /// The allocator failed for a reason other than out-of-memory (exit status 1).
    Allocator(TraceError),
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Input(e) | ReplayError::Allocator(e) => e.fmt(f),
        }
    }
}

struct Live {
    dev: usize,
    id: Option<BlockId>,
    size: u64,
}

/// One device's allocator.
pub struct Device<B: ReplayDevice = MockDevice> {
    /// The device index of the trace.
    pub index: u64,
    /// Its allocator.
    pub alloc: Alloc<B>,
    streams: FxHashMap<u64, B::Stream>,
}

impl<B: ReplayDevice> Device<B> {
    #[inline]
    fn stream(&mut self, id: u64) -> Result<B::Stream, ApplyError> {
        if let Some(s) = self.streams.get(&id) {
            return Ok(*s);
        }
        let s = self
            .alloc
            .backend_mut()
            .stream_for(id)
            .map_err(ApplyError::Allocator)?;
        self.streams.insert(id, s);
        Ok(s)
    }
}

/// The state of a replay.
pub struct Replay<B: ReplayDevice = MockDevice> {
    opts: Options,
    capacity: Option<u64>,
    /// Device allocators, in order of first use.
    pub devices: Vec<Device<B>>,
    live: FxHashMap<u64, Live>,
    /// Slot storage made ahead for the first device, so it is not timed.
    spare: Option<Box<[BlockSlot]>>,
    failed: FxHashSet<u64>,
    empty_caches_since_init: u64,
    /// Events applied.
    pub events: u64,
    /// `alloc` events.
    pub allocs: u64,
    /// Allocations that failed with out-of-memory.
    pub ooms: u64,
    /// Sum of the requested sizes of live allocations.
    pub live_bytes: u64,
    /// Its peak.
    pub peak_live: u64,
}

/// What went wrong applying one event: bad input or an allocator failure.
pub enum ApplyError {
    /// Bad input (the reason).
    Input(String),
    /// The allocator failed (the reason).
    Allocator(String),
}

impl<B: ReplayDevice> Replay<B> {
    /// A replay with `opts`; `header_capacity` is the trace's `device_capacity`.
    pub fn new(opts: Options, header_capacity: Option<u64>) -> Self {
        let capacity = opts.capacity.or(header_capacity);
        let slots = opts.slots;
        Replay {
            opts,
            capacity,
            devices: Vec::new(),
            spare: Some(vec![BlockSlot::VACANT; slots].into_boxed_slice()),
            live: FxHashMap::default(),
            failed: FxHashSet::default(),
            empty_caches_since_init: 0,
            events: 0,
            allocs: 0,
            ooms: 0,
            live_bytes: 0,
            peak_live: 0,
        }
    }

    /// The device capacity in force (`None`: unlimited).
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    fn device(&mut self, index: u64) -> Result<usize, ApplyError> {
        if let Some(k) = self.devices.iter().position(|d| d.index == index) {
            return Ok(k);
        }
        let storage = self
            .spare
            .take()
            .unwrap_or_else(|| vec![BlockSlot::VACANT; self.opts.slots].into_boxed_slice());
        let backend = B::open(index, self.capacity).map_err(ApplyError::Allocator)?;
        let mut alloc = DeviceAllocator::new(backend, storage, self.opts.config);
        if let (false, Some(cap)) = (B::SIMULATED, self.capacity) {
            alloc.set_memory_limit(cap);
        }
        if let Some(f) = self.opts.memory_fraction {
            alloc
                .set_memory_fraction(f)
                .map_err(|e| ApplyError::Input(format!("--memory-fraction {f}: {e}")))?;
        }
        for _ in 0..self.empty_caches_since_init {
            alloc
                .empty_cache()
                .map_err(|e| ApplyError::Allocator(e.to_string()))?;
        }
        self.devices.push(Device {
            index,
            alloc,
            streams: FxHashMap::default(),
        });
        Ok(self.devices.len() - 1)
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
    pub fn apply(&mut self, ev: Event) -> Result<(), ApplyError> {
        self.events += 1;
        match ev {
            Event::Alloc {
                id,
                size,
                stream,
                device,
            } => {
                if self.live.contains_key(&id) {
                    return Err(ApplyError::Input(format!(
                        "alloc of id {id}, which is already live"
                    )));
                }
                self.failed.remove(&id);
                self.allocs += 1;
                let dev = self.device(device)?;
                let s = self.devices[dev].stream(stream)?;
                match self.devices[dev].alloc.malloc(size, s) {
                    Ok(x) => {
                        self.live.insert(
                            id,
                            Live {
                                dev,
                                id: x.id,
                                size,
                            },
                        );
                        self.live_bytes = self.live_bytes.saturating_add(size);
                        self.peak_live = self.peak_live.max(self.live_bytes);
                    }
                    Err(e) if e.is_out_of_memory() => {
                        self.ooms += 1;
                        self.failed.insert(id);
                    }
                    Err(e) => return Err(ApplyError::Allocator(e.to_string())),
                }
            }
            Event::Free { id } => {
                if self.failed.remove(&id) {
                    return Ok(());
                }
                let l = self.live.remove(&id).ok_or_else(|| {
                    ApplyError::Input(format!("free of id {id}, which is not live"))
                })?;
                self.live_bytes -= l.size;
                if let Some(bid) = l.id {
                    self.devices[l.dev]
                        .alloc
                        .free(bid)
                        .map_err(|e| ApplyError::Allocator(e.to_string()))?;
                }
            }
            Event::RecordStream { id, stream } => {
                if self.failed.contains(&id) {
                    return Ok(());
                }
                let l = self.live.get(&id).ok_or_else(|| {
                    ApplyError::Input(format!("record_stream of id {id}, which is not live"))
                })?;
                if let Some(bid) = l.id {
                    let dev = &mut self.devices[l.dev];
                    let s = dev.stream(stream)?;
                    dev.alloc
                        .record_stream(bid, s)
                        .map_err(|e| ApplyError::Allocator(e.to_string()))?;
                }
            }
            Event::Sync { stream } => {
                for d in &mut self.devices {
                    let s = match stream {
                        Some(id) => Some(d.stream(id)?),
                        None => None,
                    };
                    d.alloc
                        .backend_mut()
                        .sync(s)
                        .map_err(ApplyError::Allocator)?;
                }
            }
            Event::EmptyCache => {
                if !self.devices.is_empty() {
                    self.empty_caches_since_init += 1;
                }
                for d in &mut self.devices {
                    d.alloc
                        .empty_cache()
                        .map_err(|e| ApplyError::Allocator(e.to_string()))?;
                }
            }
        }
        Ok(())
    }

    /// Free every live allocation, wait for all streams, and return every
    /// cached segment and idle event to the device (after a replay on a real
    /// device, so the next one starts from an empty GPU).
    pub fn release(&mut self) -> Result<(), ApplyError> {
        let err = |e: String| ApplyError::Allocator(e);
        for (_, l) in self.live.drain() {
            if let Some(id) = l.id {
                self.devices[l.dev]
                    .alloc
                    .free(id)
                    .map_err(|e| err(e.to_string()))?;
            }
        }
        self.live_bytes = 0;
        for d in &mut self.devices {
            d.alloc.backend_mut().sync(None).map_err(err)?;
            d.alloc.empty_cache().map_err(|e| err(e.to_string()))?;
            d.alloc
                .release_idle_events()
                .map_err(|e| err(e.to_string()))?;
        }
        Ok(())
    }

    /// Make sure device 0 exists when no event created a device (so an empty
    /// trace still reports a full set of statistics).
    pub fn finish(&mut self) -> Result<(), ApplyError> {
        if self.devices.is_empty() {
            self.device(0)?;
        }
        self.devices.sort_by_key(|d| d.index);
        Ok(())
    }
}

/// Called as a replay goes.
pub trait Observer<B: ReplayDevice = MockDevice> {
    /// After each event (`index` counts from 0).
    fn after_event(&mut self, _index: u64, _replay: &Replay<B>) {}
    /// Bytes of the file read so far, and its size.
    fn progress(&mut self, _read: u64, _total: u64) {}
    /// Whether to stop after the event with this index.
    fn stop_after(&self, _index: u64) -> bool {
        false
    }
}

/// Observes nothing.
pub struct Quiet;

impl<B: ReplayDevice> Observer<B> for Quiet {}

/// The result of a replay.
pub struct Report {
    /// The trace file.
    pub trace: String,
    /// The header's `source`.
    pub source: String,
    /// The config string.
    pub conf: String,
    /// Device capacity in force.
    pub capacity: Option<u64>,
    /// Events.
    pub events: u64,
    /// `alloc` events.
    pub allocs: u64,
    /// Allocations that failed with out-of-memory.
    pub ooms: u64,
    /// Peak of the sum of requested sizes of live allocations.
    pub peak_live_bytes: u64,
    /// Peak reserved bytes (summed over devices' peaks).
    pub peak_reserved_bytes: u64,
    /// Per device: its index and statistics.
    pub devices: Vec<(u64, DeviceStats)>,
    /// Wall time of the whole run: reading, decompressing, parsing, replaying.
    pub total_seconds: f64,
    /// Of which reading, decompressing and parsing.
    pub parse_seconds: f64,
    /// Of which replaying the parsed events: the allocator's bookkeeping on
    /// the simulated device and the replay's id map (the replay figure).
    pub replay_seconds: f64,
}

impl Report {
    /// `peak_reserved_bytes / peak_live_bytes`.
    pub fn fragmentation(&self) -> f64 {
        if self.peak_live_bytes == 0 {
            if self.peak_reserved_bytes == 0 {
                1.0
            } else {
                f64::INFINITY
            }
        } else {
            self.peak_reserved_bytes as f64 / self.peak_live_bytes as f64
        }
    }

    /// Events replayed per second of bookkeeping (parsing excluded; the
    /// figure the benchmarks quote).
    pub fn events_per_second(&self) -> f64 {
        self.events as f64 / self.replay_seconds.max(1e-9)
    }

    /// Events per second of the whole run, reading and parsing included.
    pub fn end_to_end_events_per_second(&self) -> f64 {
        self.events as f64 / self.total_seconds.max(1e-9)
    }

    /// The statistics of the lowest device (device 0 in single-device traces).
    pub fn stats(&self) -> &DeviceStats {
        &self.devices[0].1
    }

    /// The JSON object of the replay contract (design.md).
    pub fn to_json(&self) -> serde_json::Value {
        let stats_json = |s: &DeviceStats| {
            let mut m = serde_json::Map::new();
            s.for_each(|k, v| {
                m.insert(k.to_string(), v.into());
            });
            serde_json::Value::Object(m)
        };
        let mut v = serde_json::json!({
            "trace": self.trace,
            "source": self.source,
            "conf": self.conf,
            "capacity": self.capacity,
            "events": self.events,
            "allocs": self.allocs,
            "ooms": self.ooms,
            "memory_stats": stats_json(self.stats()),
            "peak_live_bytes": self.peak_live_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "fragmentation": self.fragmentation(),
            "num_device_alloc": self.devices.iter().map(|d| d.1.num_device_alloc).sum::<i64>(),
            "num_device_free": self.devices.iter().map(|d| d.1.num_device_free).sum::<i64>(),
            "replay_seconds": self.replay_seconds,
            "parse_seconds": self.parse_seconds,
            "total_seconds": self.total_seconds,
            "events_per_second": self.events_per_second(),
            "end_to_end_events_per_second": self.end_to_end_events_per_second(),
        });
        if self.devices.len() > 1 {
            let devs: serde_json::Map<_, _> = self
                .devices
                .iter()
                .map(|(i, s)| {
                    (
                        i.to_string(),
                        serde_json::json!({"memory_stats": stats_json(s)}),
                    )
                })
                .collect();
            v["devices"] = serde_json::Value::Object(devs);
        }
        v
    }
}

const CHUNK: usize = 4096;

/// Replay the trace at `path`, streaming it in chunks of events: each chunk
/// is read and parsed, then applied, so the two costs are timed apart.
pub fn run<O: Observer>(
    path: &str,
    opts: &Options,
    obs: &mut O,
) -> Result<(Report, Replay), ReplayError> {
    run_on::<MockDevice, O>(path, opts, obs)
}

/// [`run`] on an opened trace.
pub fn run_reader<O: Observer>(
    reader: TraceReader,
    opts: &Options,
    obs: &mut O,
) -> Result<(Report, Replay), ReplayError> {
    run_reader_on::<MockDevice, O>(reader, opts, obs)
}

/// [`run`] on device type `B` (a real device: the replay queues no kernels,
/// so stream work completes at once; `sync` is a stream synchronize).
pub fn run_on<B: ReplayDevice, O: Observer<B>>(
    path: &str,
    opts: &Options,
    obs: &mut O,
) -> Result<(Report, Replay<B>), ReplayError> {
    let reader = TraceReader::open(path).map_err(ReplayError::Input)?;
    run_reader_on(reader, opts, obs)
}

/// [`run_on`] on an opened trace.
pub fn run_reader_on<B: ReplayDevice, O: Observer<B>>(
    mut reader: TraceReader,
    opts: &Options,
    obs: &mut O,
) -> Result<(Report, Replay<B>), ReplayError> {
    let path = reader.path().to_string();
    let mut r = Replay::<B>::new(opts.clone(), reader.header.device_capacity);
    if opts.memory_fraction.is_some() && r.capacity().is_none() {
        return Err(ReplayError::Input(reader.error(0, "--memory-fraction needs a device capacity (--capacity or the trace's device_capacity)".to_string())));
    }
    let t0 = Instant::now();
    let mut chunk: Vec<(u64, Event)> = Vec::with_capacity(CHUNK);
    let (mut parse, mut alloc) = (0f64, 0f64);
    let mut index = 0u64;
    let mut done = false;
    while !done {
        let tp = Instant::now();
        chunk.clear();
        while chunk.len() < CHUNK {
            match reader.next_event() {
                None => {
                    done = true;
                    break;
                }
                Some(Ok(e)) => chunk.push(e),
                Some(Err(e)) => {
                    // Apply what came before the bad line first: its errors come first.
                    for &(line, ev) in &chunk {
                        apply(&mut r, &reader, line, ev)?;
                    }
                    return Err(ReplayError::Input(e));
                }
            }
        }
        let ta = Instant::now();
        parse += (ta - tp).as_secs_f64();
        for &(line, ev) in &chunk {
            apply(&mut r, &reader, line, ev)?;
            obs.after_event(index, &r);
            if obs.stop_after(index) {
                done = true;
                break;
            }
            index += 1;
        }
        alloc += ta.elapsed().as_secs_f64();
        let (read, total) = reader.progress();
        obs.progress(read, total);
    }
    r.finish().map_err(|e| to_error(&reader, 0, e))?;
    let report = Report {
        trace: path,
        source: reader.header.source.clone(),
        conf: opts.conf.clone(),
        capacity: r.capacity,
        events: r.events,
        allocs: r.allocs,
        ooms: r.ooms,
        peak_live_bytes: r.peak_live,
        peak_reserved_bytes: r
            .devices
            .iter()
            .map(|d| d.alloc.stats().reserved_bytes.all().peak as u64)
            .sum(),
        devices: r
            .devices
            .iter()
            .map(|d| (d.index, *d.alloc.stats()))
            .collect(),
        total_seconds: t0.elapsed().as_secs_f64(),
        parse_seconds: parse,
        replay_seconds: alloc,
    };
    if !B::SIMULATED {
        r.release().map_err(|e| to_error(&reader, 0, e))?;
    }
    Ok((report, r))
}

fn to_error(reader: &TraceReader, line: u64, e: ApplyError) -> ReplayError {
    match e {
        ApplyError::Input(s) => ReplayError::Input(reader.error(line, s)),
        ApplyError::Allocator(s) => ReplayError::Allocator(reader.error(line, s)),
    }
}

#[inline]
fn apply<B: ReplayDevice>(
    r: &mut Replay<B>,
    reader: &TraceReader,
    line: u64,
    ev: Event,
) -> Result<(), ReplayError> {
    r.apply(ev).map_err(|e| to_error(reader, line, e))
}

/// The smallest capacity (a multiple of 2 MiB) at which the trace replays
/// without an OOM, by bisection between the peak live bytes (which must fail
/// below) and the unlimited run's peak reserved bytes (which succeeds); the
/// trace is streamed again for every probe.
pub fn min_capacity(trace: &str, opts: &Options, unlimited: &Report) -> Result<u64, ReplayError> {
    const STEP: u64 = 2 << 20;
    let mut hi = unlimited.peak_reserved_bytes.div_ceil(STEP).max(1);
    let mut lo = (unlimited.peak_live_bytes / STEP).saturating_sub(1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let o = Options {
            capacity: Some(mid * STEP),
            ..opts.clone()
        };
        let (r, _) = run(trace, &o, &mut Quiet)?;
        if r.ooms == 0 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi * STEP)
}
