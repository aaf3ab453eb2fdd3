//! Expandable segments beyond the scenarios: the real recording made with
//! them (mapped sizes per device against its truth file), a backend without
//! virtual memory, what snapshots and the history show, private pools,
//! metadata exhaustion and the other refusals.

use cachealloc_core::{
    BlockSlot, Config, DeviceAllocator, DeviceBackend, DevicePtr, Error, EventStatus, MallocError,
    MemInfo, MempoolId, PoolOptions, StreamFilter, TraceAction, TraceActions, TraceEntry,
};
use cachealloc_mock::{MockDevice, MockError};
use cachealloc_tests::{shared_part, teardown};
use cachealloc_trace::{run, Options, Quiet};

const MIB: u64 = 1 << 20;

fn expandable() -> Config {
    Config::parse("expandable_segments:True").unwrap()
}

/// `code-location-expandable` (three GPUs, `expandable_segments:True`):
/// the sizes of every page map, in order, per device, and of every unmap,
/// equal the real run's; so do the peaks. The device is taken to be an
/// 80 GiB one (device 1 reserved 78.4 GiB at its peak and then hit an out
/// of memory whose flush unmapped six ranges). Skips when the recordings
/// are not beside the checkout.
#[test]
fn the_real_expandable_recording_maps_what_pytorch_mapped() {
    let Some(dir) = shared_part("real-traces") else {
        println!("real expandable recording: 0 checked (../shared/real-traces is not beside the checkout)");
        return;
    };
    let name = "code-location-expandable";
    let truth: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.truth.json"))).unwrap())
            .unwrap();
    let conf = truth["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"]
        .as_str()
        .unwrap()
        .to_string();
    let opts = Options {
        config: Config::parse(&conf).unwrap(),
        conf,
        capacity: Some(80 << 30),
        history: 1 << 16,
        snapshot: true,
        // Recorded with torch 2.11 or older: its block order.
        torch: Some(cachealloc_core::TorchVersion::V2_11),
        ..Options::default()
    };
    let path = dir.join(format!("{name}.jsonl.gz"));
    let (report, replay) = run(path.to_str().unwrap(), &opts, &mut Quiet).unwrap();
    let (dict, dropped) = report.snapshot.as_ref().unwrap();
    assert!(dropped.iter().all(|d| d.1 == 0));
    let dict = serde_json::to_value(dict).unwrap();
    println!("| device | maps (truth) | unmaps (truth) | peak reserved (truth) | peak allocated (truth) |");
    for (d, entries) in dict["device_traces"].as_array().unwrap().iter().enumerate() {
        let sizes = |action: &str| -> Vec<u64> {
            entries
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["action"] == action)
                .map(|e| e["size"].as_u64().unwrap())
                .collect()
        };
        let t = &truth["devices"][d.to_string()];
        let want = |k: &str| -> Vec<u64> { serde_json::from_value(t[k].clone()).unwrap() };
        let (maps, unmaps) = (sizes("segment_map"), sizes("segment_unmap"));
        let stats = replay.devices[d].alloc.stats();
        let peak_reserved = stats.reserved_bytes.all().peak as u64;
        let peak_allocated = stats.allocated_bytes.all().peak as u64;
        println!(
            "| {d} | {} ({}) | {:?} ({:?}) | {peak_reserved} ({}) | {peak_allocated} ({}) |",
            maps.len(),
            want("segment_map_sizes").len(),
            unmaps,
            want("segment_unmap_sizes"),
            t["peak_reserved_bytes"],
            t["peak_allocated_bytes"]
        );
        assert_eq!(maps, want("segment_map_sizes"), "device {d}: map sizes");
        assert_eq!(
            unmaps,
            want("segment_unmap_sizes"),
            "device {d}: unmap sizes"
        );
        assert_eq!(peak_reserved, t["peak_reserved_bytes"].as_u64().unwrap());
        assert_eq!(peak_allocated, t["peak_allocated_bytes"].as_u64().unwrap());
        assert_eq!(stats.num_device_alloc, maps.len() as i64);
        assert_eq!(stats.segment.all().peak, 0, "maps are never segments");
    }
    println!("real expandable recording: 1 checked ({name}, every device)");
}

/// The simulated device with its virtual memory hidden.
pub(crate) struct NoVirtualMemory(pub(crate) MockDevice);

impl DeviceBackend for NoVirtualMemory {
    type Stream = u64;
    type Event = <MockDevice as DeviceBackend>::Event;
    type Error = MockError;
    const NAME: &'static str = "a device without virtual memory";
    fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<MockError>> {
        self.0.malloc(size)
    }
    fn free(&mut self, ptr: DevicePtr, size: u64) -> Result<(), MockError> {
        self.0.free(ptr, size)
    }
    fn event_create(&mut self) -> Result<Self::Event, MockError> {
        self.0.event_create()
    }
    fn event_record(&mut self, e: &Self::Event, s: u64) -> Result<(), MockError> {
        self.0.event_record(e, s)
    }
    fn event_query(&mut self, e: &Self::Event) -> Result<EventStatus, MockError> {
        self.0.event_query(e)
    }
    fn event_destroy(&mut self, e: &Self::Event) -> Result<(), MockError> {
        self.0.event_destroy(e)
    }
    fn mem_info(&mut self) -> Result<MemInfo, MockError> {
        self.0.mem_info()
    }
}

/// A backend without virtual memory still builds; asking it for an
/// expandable segment is an error that names the backend, and changes
/// nothing. Turning the option off makes it work again.
#[test]
fn a_backend_without_virtual_memory_refuses_by_name() {
    let mut a = DeviceAllocator::new(
        NoVirtualMemory(MockDevice::new(None)),
        vec![BlockSlot::VACANT; 64].into_boxed_slice(),
        expandable(),
    );
    let e = a.malloc(4 * MIB, 0).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("expandable_segments:True") && msg.contains("a device without virtual memory"),
        "{msg}"
    );
    a.check_invariants().unwrap();
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    a.set_config(Config::parse("expandable_segments:False").unwrap());
    let x = a.malloc(4 * MIB, 0).unwrap();
    a.free_ptr(x.ptr).unwrap();
    assert_eq!(a.release_all().unwrap(), 0);
    assert_eq!(a.backend().0.held_bytes(), 0);
}

/// A snapshot shows one segment per run of mapped pages (PyTorch's
/// `snapshot()`), each `is_expandable`; the history has `segment_map` and
/// `segment_unmap` entries with the mapped ranges.
#[test]
fn snapshots_and_history_show_mapped_runs() {
    let mut a: DeviceAllocator<MockDevice, Vec<BlockSlot>, 64, Vec<TraceEntry>> =
        DeviceAllocator::with_history(
            MockDevice::new(Some(1 << 30)),
            vec![BlockSlot::VACANT; 256],
            vec![TraceEntry::EMPTY; 64],
            expandable(),
        );
    a.record_history(true, usize::MAX, false, TraceActions::NONE);
    let page = 20 * MIB;
    let x: Vec<_> = (0..3).map(|_| a.malloc(page, 0).unwrap()).collect();
    a.free_ptr(x[1].ptr).unwrap();
    a.empty_cache().unwrap();
    // [x0 | unmapped hole | x2 | unmapped tail]
    let segs: Vec<_> = a.segments().collect();
    assert_eq!(segs.len(), 2, "{segs:?}");
    for (s, want) in segs.iter().zip([x[0].ptr, x[2].ptr]) {
        assert!(s.is_expandable);
        assert_eq!((s.address, s.total_size, s.block_count), (want, page, 1));
        assert_eq!(s.blocks().count(), 1);
    }
    assert_eq!(a.cache_info().cached_bytes, 0);
    let snap = a.snapshot();
    let maps: Vec<_> = snap
        .history
        .clone()
        .filter(|e| e.action == TraceAction::SegmentMap)
        .map(|e| (e.addr, e.size))
        .collect();
    let unmaps: Vec<_> = snap
        .history
        .filter(|e| e.action == TraceAction::SegmentUnmap)
        .map(|e| (e.addr, e.size))
        .collect();
    assert_eq!(maps, x.iter().map(|a| (a.ptr.0, page)).collect::<Vec<_>>());
    assert_eq!(unmaps, vec![(x[1].ptr.0, page)]);
    assert!(matches!(
        a.base_allocation(x[0].ptr),
        Err(Error::Unsupported { .. })
    ));
    a.free_ptr(x[0].ptr).unwrap();
    a.free_ptr(x[2].ptr).unwrap();
    assert_eq!(a.release_all().unwrap(), 0);
    let m = a.backend();
    assert_eq!(
        (m.held_bytes(), m.mapped_pages(), m.live_reservations()),
        (0, 0, 0)
    );
}

/// A private pool gets its own expandable segments; its segment count is
/// the reservations it holds and its reserved bytes the pages mapped. Once
/// released and emptied it is deleted with them. A pool with expandable
/// segments cannot be checkpointed.
#[test]
fn private_pools_get_their_own_expandable_segments() {
    let mut a = DeviceAllocator::new(
        MockDevice::new(Some(1 << 30)),
        vec![BlockSlot::VACANT; 256].into_boxed_slice(),
        expandable(),
    );
    let id = MempoolId(0, 1);
    let outside = a.malloc(3 * MIB, 0).unwrap();
    a.create_pool(id, PoolOptions::NONE).unwrap();
    a.begin_allocate_to_pool(id, StreamFilter::All).unwrap();
    let small = a.malloc(4096, 0).unwrap();
    let large = a.malloc(30 * MIB, 0).unwrap();
    a.end_allocate_to_pool(id).unwrap();
    let info = a.pool_info(id).unwrap();
    assert_eq!(
        (info.segments, info.reserved_bytes),
        (2, 2 * MIB + 40 * MIB)
    );
    // Three reservations in all: the default large pool's and the pool's two.
    assert_eq!(a.backend().live_reservations(), 3);
    let mut out = [cachealloc_core::CheckpointBlock::EMPTY; 16];
    assert!(matches!(
        a.checkpoint_pool(id, &mut out),
        Err(Error::Checkpoint { .. })
    ));
    a.check_invariants().unwrap();
    a.free_ptr(small.ptr).unwrap();
    a.free_ptr(large.ptr).unwrap();
    while a.pool_use_count(id) > 0 {
        a.release_pool(id).unwrap();
    }
    a.empty_cache().unwrap();
    assert!(
        a.pool_info(id).is_none(),
        "the emptied pool is deleted: {:?}",
        a.pool_info(id)
    );
    assert_eq!(
        a.backend().live_reservations(),
        1,
        "the default pool's, holding `outside`"
    );
    a.check_invariants().unwrap();
    teardown(&mut a, [outside.ptr]).unwrap();
}

/// With too few block slots, what needs one more fails with
/// `MetadataExhausted`; the allocator stays consistent and releases
/// everything afterwards.
#[test]
fn metadata_exhaustion_is_an_error_value() {
    for slots in 3..12 {
        let mut a = DeviceAllocator::new(
            MockDevice::new(Some(1 << 30)),
            vec![BlockSlot::VACANT; slots].into_boxed_slice(),
            expandable(),
        );
        let mut live = Vec::new();
        for k in 0..12u64 {
            match a.malloc((k % 4 + 1) * 7 * MIB + 512 * k, k % 2) {
                Ok(x) => live.push(x.ptr),
                Err(Error::MetadataExhausted { .. }) => {}
                Err(e) => panic!("{slots} slots: {e}"),
            }
            a.check_invariants().unwrap();
            if k % 3 == 2 {
                if let Some(p) = live.pop() {
                    a.free_ptr(p).unwrap();
                }
                match a.empty_cache() {
                    Ok(()) | Err(Error::MetadataExhausted { .. }) => {}
                    Err(e) => panic!("{slots} slots: {e}"),
                }
                a.check_invariants().unwrap();
            }
        }
        for p in live.drain(..) {
            a.free_ptr(p).unwrap();
        }
        // Every unmap can need two slots; with everything free the blocks
        // have merged and the release goes through.
        teardown(&mut a, []).unwrap_or_else(|e| panic!("{slots} slots: {e}"));
    }
}
