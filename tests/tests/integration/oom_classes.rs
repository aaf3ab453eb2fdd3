//! Each out-of-memory class built on the simulated device, with the
//! verdict and the numbers behind it (`DeviceAllocator::last_oom_cause`), PyTorch's
//! message first in the error's text, and the fragmentation accounting
//! agreeing with the verdict's figures.

use cachealloc_core::{
    BlockSlot, Config, DeviceAllocator, DevicePtr, Error, MempoolId, OomCause, OomClass,
    PoolMemory, PoolOptions, SegmentSource, StreamFilter, TorchVersion,
};
use cachealloc_mock::{CaptureMode, MockDevice};

const MIB: u64 = 1 << 20;
const GRAPH: MempoolId = MempoolId(1, 0);

type Alloc = DeviceAllocator<MockDevice, Vec<BlockSlot>, 64>;

/// A device of `capacity` bytes.
fn device(capacity: u64) -> Alloc {
    DeviceAllocator::with_events(
        MockDevice::with_capacity(capacity),
        vec![BlockSlot::VACANT; 512],
        Config::DEFAULT,
    )
}

/// The cause of `a.malloc(size, stream)`'s out-of-memory: the error names
/// its class after PyTorch's message, the allocator keeps the verdict with
/// its bytes, and the two make the full message.
fn oom(a: &mut Alloc, size: u64, stream: u64) -> OomCause {
    match a.malloc(size, stream) {
        Err(Error::OutOfMemory(r)) => {
            let cause = a.last_oom_cause().expect("the allocator keeps the verdict");
            assert_eq!(cause.class, r.class);
            let text = Error::<cachealloc_mock::MockError>::OutOfMemory(r).to_string();
            let pytorch = r.pytorch_message().to_string();
            assert!(pytorch.starts_with("CUDA out of memory. Tried to allocate"));
            assert_eq!(text, format!("{pytorch} cachealloc: {}.", r.class.as_str()));
            let full = r.explained(&cause).to_string();
            let verdict = format!("cachealloc: {}: ", r.class.as_str());
            assert!(
                full[pytorch.len()..].starts_with(&format!(" {verdict}")),
                "{full}"
            );
            a.check_invariants().unwrap();
            cause
        }
        other => panic!("expected an out-of-memory, got {other:?}"),
    }
}

#[test]
fn capacity_live_bytes_leave_no_room() {
    let mut a = device(64 * MIB);
    let _x = a.malloc(40 * MIB, 0).unwrap();
    let c = oom(&mut a, 40 * MIB, 0);
    assert_eq!(c.class, OomClass::Capacity);
    assert_eq!(
        (c.live_bytes, c.needed, c.limit),
        (40 * MIB, 40 * MIB, 64 * MIB)
    );
}

#[test]
fn memory_fraction_refused_what_the_device_had() {
    let mut a = device(256 * MIB);
    a.set_memory_fraction(0.25).unwrap();
    let _x = a.malloc(40 * MIB, 0).unwrap();
    let c = oom(&mut a, 40 * MIB, 0);
    assert_eq!(c.class, OomClass::MemoryFraction);
    assert_eq!((c.limit, c.live_bytes), (64 * MIB, 40 * MIB));
}

/// Three 20 MiB segments, each [6 live | 6 free | 6 live | 2 free]: 24 MiB
/// free on the stream, none of it in one block of 12 MiB, and 4 MiB left on
/// the device.
#[test]
fn fragmentation_enough_free_bytes_in_no_block() {
    let mut a = device(64 * MIB);
    let mut free = Vec::new();
    for _ in 0..3 {
        let _keep = a.malloc(6 * MIB, 0).unwrap();
        free.push(a.malloc(6 * MIB, 0).unwrap());
        let _keep = a.malloc(6 * MIB, 0).unwrap();
    }
    for x in free {
        a.free(x.handle.unwrap()).unwrap();
    }
    let c = oom(&mut a, 12 * MIB, 0);
    assert_eq!(c.class, OomClass::Fragmentation);
    assert_eq!((c.free_bytes, c.largest_free_block), (24 * MIB, 6 * MIB));
    assert_eq!(
        (c.live_bytes, c.needed, c.headroom),
        (36 * MIB, 12 * MIB, 4 * MIB)
    );
    // The accounting agrees: the large pool holds those bytes, in 6 blocks.
    let f = a.fragmentation(0);
    assert_eq!(f.large_pool.free_bytes, 24 * MIB);
    assert_eq!(f.large_pool.free_blocks, 6);
    assert_eq!(f.large_pool.largest_free_block, 6 * MIB);
    assert_eq!(f.large_pool.external_fragmentation(), 0.75);
    assert_eq!(f.stream_free_bytes, 24 * MIB);
}

/// A capture parks the free of a block another stream used: with it (and
/// the 4 MiB left on the device) the pool would have had the bytes.
#[test]
fn pending_frees_bytes_wait_on_other_streams() {
    let mut a = device(64 * MIB);
    let _big = a.malloc(40 * MIB, 0).unwrap();
    a.capture_begin(GRAPH, StreamFilter::stream(1)).unwrap();
    a.backend_mut()
        .begin_capture(1, CaptureMode::Global)
        .unwrap();
    let x = a.malloc(6 * MIB, 1).unwrap();
    let y = a.malloc(6 * MIB, 1).unwrap();
    a.record_stream(x.handle.unwrap(), 2).unwrap();
    a.free(x.handle.unwrap()).unwrap(); // parked until the capture ends
    let c = oom(&mut a, 14 * MIB, 1);
    assert_eq!(c.class, OomClass::PendingFrees);
    assert_eq!(c.headroom, 4 * MIB);
    assert_eq!((c.free_bytes, c.pending_free_bytes), (8 * MIB, 6 * MIB));
    let graph: PoolMemory = a.pool_memory(GRAPH, cachealloc_core::Pool::Large).unwrap();
    assert_eq!(graph.pending_free_bytes, 6 * MIB);
    assert_eq!(graph.free_bytes, 8 * MIB);
    a.backend_mut().end_capture(1).unwrap();
    a.capture_end(GRAPH).unwrap();
    a.free(y.handle.unwrap()).unwrap();
    a.check_invariants().unwrap();
}

/// Bytes cached in another stream's blocks are never served to this one.
#[test]
fn other_streams_cached_in_their_blocks() {
    let mut a = device(64 * MIB);
    let x = a.malloc(6 * MIB, 1).unwrap();
    let _y = a.malloc(6 * MIB, 1).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    let _big = a.malloc(40 * MIB, 0).unwrap();
    let c = oom(&mut a, 8 * MIB, 0);
    assert_eq!(c.class, OomClass::OtherStreams);
    assert_eq!((c.other_streams_bytes, c.free_bytes), (14 * MIB, 0));
    assert_eq!(a.fragmentation(0).other_streams_free_bytes, 14 * MIB);
    assert_eq!(a.fragmentation(1).stream_free_bytes, 14 * MIB);
}

/// A private pool keeps its cached blocks from the default pools.
#[test]
fn private_pools_hold_the_bytes() {
    let mut a = device(64 * MIB);
    a.begin_allocate_to_pool(GRAPH, StreamFilter::stream(0))
        .unwrap();
    let x = a.malloc(6 * MIB, 0).unwrap();
    let _y = a.malloc(6 * MIB, 0).unwrap();
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    let _big = a.malloc(40 * MIB, 0).unwrap();
    let c = oom(&mut a, 8 * MIB, 0);
    assert_eq!(c.class, OomClass::PrivatePools);
    assert_eq!(c.private_pools_bytes, 14 * MIB);
    assert_eq!(a.fragmentation(0).private_pools.free_bytes, 14 * MIB);
}

/// Neither this stream's free bytes nor another's alone (each with the 4
/// MiB left on the device), both together.
#[test]
fn mixed_several_reasons_together() {
    let mut a = device(64 * MIB);
    for stream in [1, 0] {
        let _a = a.malloc(6 * MIB, stream).unwrap();
        let b = a.malloc(6 * MIB, stream).unwrap();
        let _c = a.malloc(6 * MIB, stream).unwrap();
        a.free(b.handle.unwrap()).unwrap();
    }
    let _g = a.malloc(20 * MIB, 0).unwrap();
    let c = oom(&mut a, 14 * MIB, 0);
    assert_eq!(c.class, OomClass::Mixed);
    assert_eq!(c.headroom, 4 * MIB);
    assert_eq!((c.free_bytes, c.other_streams_bytes), (8 * MIB, 8 * MIB));
    assert_eq!(c.largest_free_block, 6 * MIB);
}

/// The device refuses a segment it reports room for: someone else uses
/// its memory (or the driver cannot give one piece).
#[test]
fn other_memory_used_outside_the_allocator() {
    let mut a = device(64 * MIB);
    let _x = a.malloc(10 * MIB, 0).unwrap();
    a.backend_mut().fail_nth_malloc_oom(0);
    a.backend_mut().fail_nth_malloc_oom(1);
    let c = oom(&mut a, 20 * MIB, 0);
    assert_eq!(c.class, OomClass::OtherMemory);
    assert_eq!(c.live_bytes, 10 * MIB);
}

/// Expandable segments: the reserved address space without pages shows
/// as unmapped bytes, in the accounting and in the verdict.
#[test]
fn expandable_segments_unmapped_address_space() {
    let mut a: Alloc = DeviceAllocator::with_events(
        MockDevice::with_capacity(64 * MIB),
        vec![BlockSlot::VACANT; 512],
        Config::parse("expandable_segments:True").unwrap(),
    );
    let x = a.malloc(30 * MIB, 0).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    a.empty_cache().unwrap();
    let _y = a.malloc(10 * MIB, 0).unwrap();
    let f = a.fragmentation(0);
    assert!(f.large_pool.unmapped_bytes > 0, "{f:?}");
    assert_eq!(
        f.device.reserved_bytes,
        a.stats().reserved_bytes.all().current as u64
    );
}

/// Which stream holds the free bytes, relative to the request's.
#[derive(Clone, Copy, Debug)]
enum Holder {
    SameStream,
    OtherStream,
}

/// Which pool size the free bytes are in (the request is large: 20 MiB).
#[derive(Clone, Copy, Debug)]
enum Size {
    Small,
    Large,
}

/// How the free bytes are held.
#[derive(Clone, Copy, Debug)]
enum Held {
    /// Cached in the request's pools.
    Cached,
    /// Freed while a capture is under way, with a use on another stream:
    /// parked until the capture ends (the request is captured too).
    Pending,
    /// Cached in a private pool the request is not routed to.
    PrivatePool,
}

/// A 64 MiB device whose free bytes are all of one kind, in segments that
/// live blocks keep from being released, then a 20 MiB request. Large:
/// three 20 MiB segments of five 4 MiB blocks, the 2nd and 4th freed (24
/// MiB free, 4 MiB left on the device). Small: the whole device in 2 MiB
/// segments of four 512 KiB blocks, the 2nd and 4th freed (32 MiB free).
/// Either way the bytes, with what is left on the device, would hold the
/// request, and the live bytes leave room for it.
fn verdict(holder: Holder, size: Size, held: Held) -> OomCause {
    const POOL: MempoolId = MempoolId(2, 0);
    let mut a = device(64 * MIB);
    // Captured requests go to GRAPH from streams 1 and 2.
    let (request_stream, other) = match held {
        Held::Pending => (1, 2),
        _ => (0, 1),
    };
    let stream = match holder {
        Holder::SameStream => request_stream,
        Holder::OtherStream => other,
    };
    match held {
        Held::Cached => {}
        Held::Pending => {
            let both = StreamFilter::streams(&[1, 2]).unwrap();
            a.capture_begin(GRAPH, both).unwrap();
            a.backend_mut()
                .begin_capture(1, CaptureMode::Global)
                .unwrap();
        }
        Held::PrivatePool => a
            .begin_allocate_to_pool(POOL, StreamFilter::stream(stream))
            .unwrap(),
    }
    let (block, blocks) = match size {
        Size::Large => (4 * MIB, 15),
        Size::Small => (MIB / 2, 128),
    };
    let xs: Vec<_> = (0..blocks)
        .map(|_| a.malloc(block, stream).unwrap())
        .collect();
    if let Held::PrivatePool = held {
        a.end_allocate_to_pool(POOL).unwrap();
    }
    let per_segment = match size {
        Size::Large => 5,
        Size::Small => 4,
    };
    for (k, x) in xs.iter().enumerate() {
        if k % per_segment == 1 || k % per_segment == 3 {
            if let Held::Pending = held {
                a.record_stream(x.handle.unwrap(), 3).unwrap();
            }
            a.free(x.handle.unwrap()).unwrap();
        }
    }
    oom(&mut a, 20 * MIB, request_stream)
}

/// The verdict names the kind of bytes that would have served the request,
/// whichever stream holds them where the stream cannot matter: small-pool
/// blocks never serve a 20 MiB request, on any stream.
#[test]
fn each_kind_of_free_bytes_gets_its_own_class() {
    use Held::*;
    use Holder::*;
    use Size::*;
    let rows = [
        (SameStream, Large, Cached, OomClass::Fragmentation),
        (SameStream, Large, Pending, OomClass::PendingFrees),
        (SameStream, Large, PrivatePool, OomClass::PrivatePools),
        (OtherStream, Large, Cached, OomClass::OtherStreams),
        (OtherStream, Large, Pending, OomClass::OtherStreams),
        (OtherStream, Large, PrivatePool, OomClass::PrivatePools),
        (SameStream, Small, Cached, OomClass::OtherSize),
        (SameStream, Small, Pending, OomClass::OtherSize),
        (SameStream, Small, PrivatePool, OomClass::PrivatePools),
        (OtherStream, Small, Cached, OomClass::OtherSize),
        (OtherStream, Small, Pending, OomClass::OtherSize),
        (OtherStream, Small, PrivatePool, OomClass::PrivatePools),
    ];
    for (holder, size, held, class) in rows {
        let c = verdict(holder, size, held);
        let row = format!("{holder:?} x {size:?} x {held:?}: {c:?}");
        assert_eq!(c.class, class, "{row}");
        // The bytes are counted in the class's kind, and in no other.
        let free = match size {
            Large => 24 * MIB,
            Small => 32 * MIB,
        };
        let kinds = [
            c.free_bytes,
            c.pending_free_bytes,
            c.other_streams_bytes,
            c.private_pools_bytes,
            c.other_size_bytes,
        ];
        assert_eq!(kinds.iter().sum::<u64>(), free, "{row}");
        assert_eq!(kinds.iter().filter(|&&b| b > 0).count(), 1, "{row}");
    }
}

/// A pool whose own allocator returns nothing: the verdict is the pool's
/// allocator (whatever the device has), and torch 2.15's message says so
/// where 2.14's does not.
#[test]
fn pool_allocator_returned_nothing() {
    fn refuse(_: usize, _: u64, _: u64) -> Option<DevicePtr> {
        None
    }
    fn free(_: usize, _: DevicePtr, _: u64, _: u64) {}
    const SENTENCE: &str = " The custom allocator backing this MemPool returned nullptr.";
    for (torch, said) in [(TorchVersion::V2_14, false), (TorchVersion::V2_15, true)] {
        let mut a: Alloc = DeviceAllocator::with_events(
            MockDevice::with_capacity(64 * MIB),
            vec![BlockSlot::VACANT; 512],
            Config::DEFAULT.with_torch_version(torch),
        );
        let pool = MempoolId(7, 0);
        a.create_pool_with_source(pool, PoolOptions::NONE, SegmentSource::new(refuse, free, 0))
            .unwrap();
        a.begin_allocate_to_pool(pool, StreamFilter::All).unwrap();
        let cause = oom(&mut a, 4 * MIB, 0);
        assert_eq!(cause.class, OomClass::PoolAllocator);
        assert!(
            cause.to_string().contains("the device was not asked"),
            "{cause}"
        );
        let Err(Error::OutOfMemory(r)) = a.malloc(4 * MIB, 0) else {
            panic!("the pool's allocator refuses again")
        };
        let m = r.pytorch_message().to_string();
        assert_eq!(m.contains(SENTENCE), said, "torch {torch}: {m}");
        // The device was not asked: it has all its memory.
        assert_eq!(a.stats().num_device_alloc, 0);
        a.end_allocate_to_pool(pool).unwrap();
        // Default-pool requests are the device's as before.
        let x = a.malloc(4 * MIB, 0).unwrap();
        a.free_ptr(x.ptr).unwrap();
        a.check_invariants().unwrap();
    }
}

/// torch 2.15, with expandable segments on: its sentence on their address
/// space in place of the advice to turn them on; 2.14 gives the advice.
#[test]
fn expandable_segments_get_torch_2_15s_sentence() {
    for (torch, said) in [(TorchVersion::V2_14, false), (TorchVersion::V2_15, true)] {
        let mut a: Alloc = DeviceAllocator::with_events(
            MockDevice::with_capacity(64 * MIB),
            vec![BlockSlot::VACANT; 512],
            Config::parse("expandable_segments:True")
                .unwrap()
                .with_torch_version(torch),
        );
        let Err(Error::OutOfMemory(r)) = a.malloc(100 * MIB, 0) else {
            panic!("100 MiB on a 64 MiB device")
        };
        let m = r.pytorch_message().to_string();
        assert_eq!(
            m.contains(
                " expandable_segments is enabled. If instead the process is running out of virtual address space (VSZ)"
            ),
            said,
            "{m}"
        );
        assert_eq!(
            m.contains("If reserved but unallocated memory is large"),
            !said,
            "{m}"
        );
    }
}
