//! Running a replay: [`run`] streams a trace through a [`Replay`] in chunks
//! of events (each chunk read and parsed, then applied, so the two costs are
//! timed apart), tells an [`Observer`] as it goes, and returns a [`Report`].

use crate::device::ReplayDevice;
use crate::error::{Reason, TraceError};
use crate::event::Event;
use crate::pipeline::for_each_chunk;
use crate::reader::TraceReader;
use crate::replay::Replay;
use crate::report::Report;
use cachealloc_core::Config;
use cachealloc_mock::MockDevice;
use std::time::Instant;

/// How to replay.
#[derive(Clone, Debug)]
pub struct Options {
    /// The allocator policy.
    pub config: Config,
    /// The torch release whose decisions to take; `None`: the trace's
    /// `torch_version`, else the config's (the newest by default).
    pub torch: Option<cachealloc_core::TorchVersion>,
    /// The config string, as given (for reports).
    pub conf: String,
    /// Device capacity; `None`: the trace's `device_capacity`, else unlimited.
    pub capacity: Option<u64>,
    /// `set_per_process_memory_fraction` on each device when it is created
    /// (needs a capacity).
    pub memory_fraction: Option<f64>,
    /// Block slots per device at the start (8,192 by default: 704 KiB; a
    /// replay that needs more grows them, unless `grow_slots` is off).
    pub slots: usize,
    /// Whether a device whose slots run out gets twice as many (the event
    /// is retried) instead of failing with "metadata exhausted".
    pub grow_slots: bool,
    /// Trace entries of memory history kept per device (0: no history).
    pub history: usize,
    /// Whether the report carries a snapshot (taken at the end, or where
    /// the observer stopped the replay).
    pub snapshot: bool,
    /// Give the simulated device's mallocs the addresses the recorded run
    /// got (the header's `malloc_addresses`, which `import` writes).
    pub real_addresses: bool,
    /// Where the recorded part of an imported trace begins (its header's
    /// `prefix_events`; the events before it rebuild the starting state):
    /// with `Some(n)`, history records from event `n` on and the peaks
    /// are reset there, so both describe the recorded part only.
    pub recorded_from: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: Config::DEFAULT,
            torch: None,
            conf: String::new(),
            capacity: None,
            memory_fraction: None,
            slots: 1 << 13,
            grow_slots: true,
            history: 0,
            snapshot: false,
            real_addresses: false,
            recorded_from: None,
        }
    }
}

/// Called as a replay goes.
pub trait Observer<D: ReplayDevice = MockDevice> {
    /// After each event (`index` counts from 0).
    fn after_event(&mut self, _index: u64, _replay: &Replay<D>) {}
    /// Bytes of the file read so far, and its size.
    fn progress(&mut self, _read: u64, _total: u64) {}
    /// Whether to stop after the event with this index.
    fn stop_after(&self, _index: u64) -> bool {
        false
    }
}

/// Observes nothing.
pub struct Quiet;

impl<D: ReplayDevice> Observer<D> for Quiet {}

/// Replay the trace at `path`, streaming it in chunks of events: a chunk is
/// read and parsed (on a second thread for a large file, while the previous
/// one is applied), then applied; the two costs are timed apart.
pub fn run<O: Observer>(
    path: &str,
    opts: &Options,
    obs: &mut O,
) -> Result<(Report, Replay), TraceError> {
    run_on::<MockDevice, O>(path, opts, obs)
}

/// [`run`] on an opened trace.
pub fn run_reader<O: Observer>(
    reader: TraceReader,
    opts: &Options,
    obs: &mut O,
) -> Result<(Report, Replay), TraceError> {
    run_reader_on::<MockDevice, O>(reader, opts, obs)
}

/// [`run`] on device type `B` (a real device: the replay queues no kernels,
/// so stream work completes at once; `sync` is a stream synchronize).
pub fn run_on<D: ReplayDevice, O: Observer<D>>(
    path: &str,
    opts: &Options,
    obs: &mut O,
) -> Result<(Report, Replay<D>), TraceError> {
    let reader = TraceReader::open(path)?;
    run_reader_on(reader, opts, obs)
}

/// [`run_on`] on an opened trace.
pub fn run_reader_on<D: ReplayDevice, O: Observer<D>>(
    reader: TraceReader,
    opts: &Options,
    obs: &mut O,
) -> Result<(Report, Replay<D>), TraceError> {
    let path = reader.path().to_string();
    if opts.real_addresses && reader.header.malloc_addresses.is_empty() {
        return Err(reader.error(
            0,
            Reason::Option(
                "--real-addresses: the trace records no malloc addresses (`cachealloc import` writes them)"
                    .to_string(),
            ),
        ));
    }
    let mut r = Replay::<D>::new(opts.clone(), &reader.header);
    if r.memory_fraction().is_some() && r.capacity().is_none() {
        return Err(reader.error(
            0,
            Reason::Option(
                "a memory fraction (--memory-fraction, or the trace's memory_fraction) needs a device capacity (--capacity or the trace's device_capacity)"
                    .to_string(),
            ),
        ));
    }
    let t0 = Instant::now();
    let (mut parse, mut alloc) = (0f64, 0f64);
    let mut index = 0u64;
    let source = reader.header.source.clone();
    let header_torch = reader.header.torch_version;
    for_each_chunk(reader, |p| {
        parse += p.seconds;
        if let Some(e) = &p.error {
            // Apply what came before the bad line first: its errors come first.
            for &(line, ev) in &p.events {
                apply(&mut r, &path, line, ev)?;
            }
            return Err(e.clone());
        }
        let ta = Instant::now();
        let mut stop = false;
        for &(line, ev) in &p.events {
            apply(&mut r, &path, line, ev)?;
            obs.after_event(index, &r);
            if obs.stop_after(index) {
                stop = true;
                break;
            }
            index += 1;
        }
        alloc += ta.elapsed().as_secs_f64();
        obs.progress(p.read.0, p.read.1);
        Ok(stop)
    })?;
    r.finish().map_err(|e| file_error(&path, e))?;
    let report = Report {
        trace: path.clone(),
        source,
        conf: opts.conf.clone(),
        capacity: r.capacity(),
        events: r.events,
        allocs: r.allocs,
        ooms: r.ooms,
        oom_classes: r.oom_classes,
        first_oom: r.first_oom.clone(),
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
        device_peak_live: r.devices.iter().map(|d| d.peak_live).collect(),
        slots: r
            .devices
            .iter()
            .map(|d| (d.index, d.alloc.slots_high_water(), d.alloc.slot_capacity()))
            .collect(),
        pools: r
            .devices
            .iter()
            .flat_map(|d| d.alloc.pools().map(|p| (d.index, p)))
            .collect(),
        torch_version: opts
            .torch
            .or(header_torch)
            .unwrap_or(opts.config.torch_version()),
        pool_reserved: r
            .devices
            .iter()
            .flat_map(|d| {
                let mut v = Vec::new();
                d.alloc
                    .reserved_bytes_by_private_pools(|id, s| v.push((d.index, id, *s)));
                v
            })
            .collect(),
        real_addresses: r
            .devices
            .iter()
            .filter_map(|d| Some((d.index, D::real_address_use(d.alloc.backend())?)))
            .filter(|_| opts.real_addresses)
            .collect(),
        snapshot: opts.snapshot.then(|| r.snapshot_dict(&path, &opts.conf)),
        fragmentation: r
            .devices
            .iter()
            .map(|d| (d.index, d.alloc.fragmentation(0.into())))
            .collect(),
        total_seconds: t0.elapsed().as_secs_f64(),
        parse_seconds: parse,
        replay_seconds: alloc,
    };
    if !D::SIMULATED {
        r.release().map_err(|e| file_error(&path, e))?;
    }
    Ok((report, r))
}

#[inline]
fn apply<D: ReplayDevice>(
    r: &mut Replay<D>,
    path: &str,
    line: u64,
    ev: Event,
) -> Result<(), TraceError> {
    r.set_line(line);
    r.apply(ev).map_err(|reason| TraceError {
        path: path.to_string(),
        line,
        reason,
    })
}

/// An error of the trace as a whole.
fn file_error(path: &str, reason: Reason) -> TraceError {
    TraceError {
        path: path.to_string(),
        line: 0,
        reason,
    }
}
