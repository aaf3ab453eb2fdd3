//! IPC handles, peer access and device-to-device copies on the mock
//! (issue 17, first part): two allocators on one simulated machine stand
//! for two processes.

use cachealloc_core::{
    BlockSlot, CachingAllocator, Config, DeviceAllocator, DeviceBackend, DevicePtr, Error,
    MempoolId, MultiDeviceAllocator, NotShareable, PagesShare, PeerAccess, PoolOptions,
    SegmentSource, SegmentTable, ShareableHandle, StreamFilter, DEFAULT_IPC_HANDLES,
    DEFAULT_IPC_SHARES,
};
use cachealloc_mock::{MockCopy, MockDevice, MockError, MockMachine};

type Alloc = DeviceAllocator<MockDevice, Vec<BlockSlot>>;

fn on(machine: &MockMachine, ordinal: u32, base: u64) -> Alloc {
    DeviceAllocator::new(
        MockDevice::unlimited()
            .with_base(base)
            .with_ordinal(ordinal)
            .with_machine(machine),
        vec![BlockSlot::VACANT; 256],
        Config::DEFAULT,
    )
}

#[test]
fn a_block_shared_by_a_is_opened_by_b_then_released() {
    let m = MockMachine::new();
    let mut a = on(&m, 0, 1 << 40);
    let mut b = on(&m, 0, 2 << 40);
    let _first = a.malloc(4096, 0).unwrap();
    let x = a.malloc(1 << 20, 0).unwrap(); // the same 2 MiB segment, at an offset
    let h = a.share_ipc_handle(x.ptr).unwrap();
    assert_eq!(h.offset, 4096);
    // The exporter cannot open its own handle (the drivers refuse it too).
    let e = a.open_ipc_handle(&h).unwrap_err();
    assert!(e.to_string().contains("its own handle"), "{e}");
    assert_eq!(a.open_ipc_handles(), 0);
    // B sees the same device range.
    let p = b.open_ipc_handle(&h).unwrap();
    assert_eq!(p, x.ptr);
    // Opening again: the same mapping, no second open with the driver.
    assert_eq!(b.open_ipc_handle(&h).unwrap(), x.ptr);
    assert_eq!((b.open_ipc_handles(), m.open_handles()), (1, 1));
    // The driver itself refuses a second open in one process: the cache is
    // what makes it work.
    let e = b.backend_mut().ipc_open_handle(&h.handle).unwrap_err();
    assert!(format!("{e:?}").contains("already mapped"), "{e:?}");
    // A handle of the segment's first block shares the segment's handle.
    let h0 = a.share_ipc_handle(_first.ptr).unwrap();
    assert_eq!((h0.handle, h0.offset), (h.handle, 0));
    assert_eq!(b.open_ipc_handle(&h0).unwrap(), _first.ptr);
    assert_eq!(m.open_handles(), 1, "still one driver open");
    for _ in 0..3 {
        b.close_ipc_handle(&h).unwrap();
    }
    assert_eq!((b.open_ipc_handles(), m.open_handles()), (0, 0));
    assert!(matches!(b.close_ipc_handle(&h), Err(Error::IpcNotOpen)));
    // A frees both while their shares are outstanding: they stay allocated
    // (PyTorch's limbo), so empty_cache keeps the segment.
    a.free(x.handle.unwrap()).unwrap();
    a.free(_first.handle.unwrap()).unwrap();
    assert_eq!(a.ipc_shares(), (2, 2));
    // Held memory is no longer the owner's: a second free, a use on a
    // stream or another share is refused, as for freed memory.
    assert!(matches!(
        a.free(x.handle.unwrap()),
        Err(Error::NotAllocated { .. })
    ));
    assert!(matches!(
        a.record_stream(x.handle.unwrap(), 1),
        Err(Error::NotAllocated { .. })
    ));
    assert!(matches!(
        a.share_ipc_handle(x.ptr),
        Err(Error::NotAllocated { .. })
    ));
    a.empty_cache().unwrap();
    assert_eq!(a.backend().live_segments(), 1);
    assert_eq!(a.stats().allocation.all().current, 2);
    a.check_invariants().unwrap();
    // B's process reports that its consumers are done: now A frees them and
    // releases the segment, and the handle goes stale.
    a.release_ipc_share(x.ptr).unwrap();
    a.release_ipc_share(_first.ptr).unwrap();
    assert_eq!(a.ipc_shares(), (0, 0));
    assert!(matches!(
        a.release_ipc_share(x.ptr),
        Err(Error::IpcNotShared { .. })
    ));
    a.empty_cache().unwrap();
    assert_eq!(a.backend().live_segments(), 0);
    match b.open_ipc_handle(&h) {
        Err(Error::Backend(MockError::InvalidIpcHandle { what })) => {
            assert!(what.contains("stale"), "{what}")
        }
        other => panic!("stale handle opened: {other:?}"),
    }
    a.check_invariants().unwrap();
    b.check_invariants().unwrap();
}

#[test]
fn only_the_start_of_a_live_allocation_can_be_shared() {
    let m = MockMachine::new();
    let mut a = on(&m, 0, 1 << 40);
    let x = a.malloc(8192, 0).unwrap();
    let interior = DevicePtr(x.ptr.0 + 512);
    assert!(matches!(
        a.share_ipc_handle(interior),
        Err(Error::InteriorPointer { .. })
    ));
    assert!(matches!(
        a.share_ipc_handle(DevicePtr(7)),
        Err(Error::UnknownPointer { .. })
    ));
    a.free(x.handle.unwrap()).unwrap();
    assert!(matches!(
        a.share_ipc_handle(x.ptr),
        Err(Error::NotAllocated { .. })
    ));
}

#[test]
fn bad_handles_and_backends_without_ipc_give_clear_errors() {
    let m = MockMachine::new();
    let mut b = on(&m, 0, 2 << 40);
    let mut junk = ShareableHandle {
        handle: cachealloc_core::IpcMemHandle([7; 64]),
        offset: 0,
    };
    let e = b.open_ipc_handle(&junk).unwrap_err();
    assert!(
        e.to_string().contains("not a handle of a mock device"),
        "{e}"
    );
    // A real-looking handle of an export that does not exist.
    let mut a = on(&m, 0, 1 << 40);
    let x = a.malloc(4096, 0).unwrap();
    junk.handle = a.share_ipc_handle(x.ptr).unwrap().handle;
    junk.handle.0[16] = 99;
    let e = b.open_ipc_handle(&junk).unwrap_err();
    assert!(e.to_string().contains("no such export"), "{e}");
    assert_eq!(
        b.open_ipc_handles(),
        0,
        "a failed open leaves nothing behind"
    );
    // No machine: not supported, as an error value.
    let mut lone = DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 64],
        Config::DEFAULT,
    );
    let y = lone.malloc(4096, 0).unwrap();
    let e = lone.share_ipc_handle(y.ptr).unwrap_err();
    assert_eq!(
        e.to_string(),
        "sharing memory through IPC handles is not supported by the simulated device"
    );
}

/// Blocks no device can share as a handle say why, by a value a caller
/// branches on (the C library's status code), on a device that can share:
/// a block of an expandable segment (shared as its pages instead), and a
/// block of a pool whose segments come from its own allocator.
#[test]
fn blocks_that_are_never_shareable_as_handles_say_why() {
    let m = MockMachine::new();
    let mut e = DeviceAllocator::new(
        MockDevice::unlimited().with_machine(&m),
        vec![BlockSlot::VACANT; 64],
        Config::parse("expandable_segments:True").unwrap(),
    );
    let x = e.malloc(4096, 0).unwrap();
    let err = e.share_ipc_handle(x.ptr).unwrap_err();
    assert!(
        matches!(err, Error::IpcNotShareable { ptr, why: NotShareable::ExpandableSegment } if ptr == x.ptr),
        "{err:?}"
    );
    assert!(err.to_string().contains("shared as its pages"), "{err}");
    let mut pages = [0i32; 0];
    match e.share_ipc_pages(x.ptr, &mut pages) {
        Err(Error::BufferTooSmall { needed: 1 }) => {}
        other => panic!("{other:?}"),
    }
    e.free_ptr(x.ptr).unwrap();

    fn src_alloc(_: usize, _: u64, _: u64) -> Option<DevicePtr> {
        Some(DevicePtr(1 << 50))
    }
    fn src_free(_: usize, _: DevicePtr, _: u64, _: u64) {}
    let mut a = on(&m, 0, 1 << 40);
    let pool = MempoolId(3, 3);
    a.create_pool_with_source(
        pool,
        PoolOptions::NONE,
        SegmentSource::new(src_alloc, src_free, 0),
    )
    .unwrap();
    a.begin_allocate_to_pool(pool, StreamFilter::All).unwrap();
    let y = a.malloc(4096, 0).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    let err = a.share_ipc_handle(y.ptr).unwrap_err();
    assert!(
        matches!(
            err,
            Error::IpcNotShareable {
                why: NotShareable::PoolWithSource,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("its own allocator") && !text.contains("simulated device"),
        "{text}"
    );
    a.free_ptr(y.ptr).unwrap();
}

/// Page descriptions another process sent are checked before anything is
/// imported: a size (page size times pages) beyond 64 bits, or an offset
/// outside the pages, is `BadIpcPages`, and nothing is opened.
#[test]
fn hostile_page_descriptions_are_refused_before_any_import() {
    let m = MockMachine::new();
    let mut a = DeviceAllocator::new(
        MockDevice::unlimited().with_machine(&m),
        vec![BlockSlot::VACANT; 64],
        Config::parse("expandable_segments:True").unwrap(),
    );
    let fds = [3, 4];
    for share in [
        PagesShare {
            page_size: 1 << 63,
            pages: 2,
            offset: 0,
        },
        PagesShare {
            page_size: 2 << 20,
            pages: 2,
            offset: 4 << 20,
        },
    ] {
        let e = a.open_ipc_pages(1, &share, &fds).unwrap_err();
        // Refused by the check, before the backend is asked (the
        // simulated device would say it cannot import pages).
        assert!(
            matches!(e, Error::BadIpcPages { pages: 2, fds: 2 }),
            "{e:?}"
        );
    }
}

#[test]
fn the_table_of_opened_handles_is_bounded() {
    let m = MockMachine::new();
    let mut a = on(&m, 0, 1 << 40);
    let mut b = on(&m, 0, 2 << 40);
    let mut handles = Vec::new();
    for _ in 0..=DEFAULT_IPC_HANDLES {
        let x = a.malloc(30 << 20, 0).unwrap(); // a segment each
        handles.push(a.share_ipc_handle(x.ptr).unwrap());
    }
    for h in &handles[..DEFAULT_IPC_HANDLES] {
        b.open_ipc_handle(h).unwrap();
    }
    assert!(matches!(
        b.open_ipc_handle(&handles[DEFAULT_IPC_HANDLES]),
        Err(Error::IpcTableFull {
            capacity: DEFAULT_IPC_HANDLES
        })
    ));
    b.close_ipc_handle(&handles[0]).unwrap();
    b.open_ipc_handle(&handles[DEFAULT_IPC_HANDLES]).unwrap();
    assert_eq!(m.open_handles() as usize, DEFAULT_IPC_HANDLES);
}

#[test]
fn peer_access_and_device_to_device_copies() {
    let m = MockMachine::new();
    let mut d0 = on(&m, 0, 1 << 40);
    let mut d1 = on(&m, 1, 2 << 40);
    assert_eq!(d0.enable_peer_access(1).unwrap(), PeerAccess::Enabled);
    assert_eq!(
        d0.enable_peer_access(1).unwrap(),
        PeerAccess::AlreadyEnabled
    );
    let e = d0.enable_peer_access(0).unwrap_err();
    assert!(e.to_string().contains("to itself"), "{e}");
    let x = d0.malloc(1 << 20, 0).unwrap();
    let y = d1.malloc(1 << 20, 0).unwrap();
    d0.memcpy_async(y.ptr, x.ptr, 1 << 20, 3).unwrap();
    assert_eq!(
        d0.backend().copies(),
        &[MockCopy {
            dst: y.ptr,
            src: x.ptr,
            bytes: 1 << 20,
            stream: 3,
            peer: None
        }]
    );
}

#[test]
fn a_share_released_before_the_free_leaves_a_plain_free() {
    let m = MockMachine::new();
    let mut a = on(&m, 0, 1 << 40);
    let x = a.malloc(4096, 0).unwrap();
    let h1 = a.share_ipc_handle(x.ptr).unwrap();
    let h2 = a.share_ipc_handle(x.ptr).unwrap();
    assert_eq!(h1, h2);
    assert_eq!(a.ipc_shares(), (1, 0));
    a.release_ipc_share(x.ptr).unwrap();
    a.release_ipc_share(x.ptr).unwrap(); // two shares, two releases
    assert_eq!(a.ipc_shares(), (0, 0));
    a.free(x.handle.unwrap()).unwrap();
    assert_eq!(a.stats().allocation.all().current, 0);
    a.empty_cache().unwrap();
    assert_eq!(a.backend().live_segments(), 0);
}

#[test]
fn the_table_of_shared_allocations_is_bounded() {
    let m = MockMachine::new();
    let mut a = on(&m, 0, 1 << 40);
    let xs: Vec<_> = (0..=DEFAULT_IPC_SHARES)
        .map(|_| a.malloc(4096, 0).unwrap())
        .collect();
    for x in &xs[..DEFAULT_IPC_SHARES] {
        a.share_ipc_handle(x.ptr).unwrap();
    }
    let e = a.share_ipc_handle(xs[DEFAULT_IPC_SHARES].ptr).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IpcSharesFull {
                capacity: DEFAULT_IPC_SHARES
            }
        ),
        "{e}"
    );
    // A second share of an allocation already in the table still works.
    a.share_ipc_handle(xs[0].ptr).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn two_devices_of_a_multi_device_allocator() {
    let m = MockMachine::new();
    let dev = |ordinal: u32, conf: &str| {
        CachingAllocator::new(DeviceAllocator::new(
            MockDevice::unlimited()
                .with_base(u64::from(ordinal + 1) << 40)
                .with_ordinal(ordinal)
                .with_machine(&m),
            vec![BlockSlot::VACANT; 256],
            Config::parse(conf).unwrap(),
        ))
    };
    let table: &'static SegmentTable<64> = Box::leak(Box::default());
    let multi = MultiDeviceAllocator::new([dev(0, ""), dev(1, "")], table).unwrap();
    // Peer access, both ways; again is no error; itself or a missing
    // device is.
    assert_eq!(multi.enable_peer_access(0, 1).unwrap(), PeerAccess::Enabled);
    assert_eq!(
        multi.enable_peer_access(0, 1).unwrap(),
        PeerAccess::AlreadyEnabled
    );
    assert_eq!(multi.enable_peer_access(1, 0).unwrap(), PeerAccess::Enabled);
    assert!(multi.enable_peer_access(1, 1).is_err());
    assert!(matches!(
        multi.enable_peer_access(0, 2),
        Err(Error::NoSuchDevice { device: 2 })
    ));
    let x = multi.malloc(0, 1 << 20, 0).unwrap();
    let y = multi.malloc(1, 1 << 20, 0).unwrap();
    let (xp, yp) = (x.allocation.ptr, y.allocation.ptr);
    assert_eq!((multi.owner(xp), multi.owner(yp)), (Some(0), Some(1)));
    // Shared by address from its device, opened on the other.
    let h = multi.share_ipc_handle(xp).unwrap();
    assert_eq!(multi.open_ipc_handle(1, &h).unwrap(), xp);
    multi.close_ipc_handle(1, &h).unwrap();
    multi.release_ipc_share(xp).unwrap();
    assert!(matches!(
        multi.share_ipc_handle(DevicePtr(7)),
        Err(Error::UnknownPointer { .. })
    ));
    // No expandable segment anywhere: a plain copy, queued on the source
    // device, with or without p2p.
    multi.memcpy_async(yp, 1, xp, 0, 4096, 5).unwrap();
    macro_rules! copies {
        ($m:expr, $d:expr) => {
            $m.device($d)
                .unwrap()
                .with(|a| a.backend().copies().to_vec())
                .unwrap()
        };
    }
    assert_eq!(copies!(multi, 0)[0].peer, None);
    assert!(copies!(multi, 1).is_empty());
    // Now device 1 holds an expandable segment: without p2p the copy
    // goes through the driver's peer copy (PyTorch's memcpyAsync).
    let multi = {
        let [d0, d1] = multi.into_devices();
        // The new device 1 is simulated at the old one's addresses.
        d1.with(|a| a.detach_segment_registry()).unwrap();
        MultiDeviceAllocator::new([d0, dev(1, "expandable_segments:True")], table).unwrap()
    };
    let z = multi.malloc(1, 1 << 20, 0).unwrap();
    assert!(multi
        .device(1)
        .unwrap()
        .with(|a| a.has_expandable_segments())
        .unwrap());
    multi
        .memcpy_async(z.allocation.ptr, 1, xp, 0, 4096, 5)
        .unwrap();
    assert_eq!(copies!(multi, 0)[1].peer, Some((1, 0)));
    // PyTorch copies plainly when p2p is enabled, since its peer access
    // covers expandable pages; ours does not, so still the peer copy.
    multi
        .memcpy_async(z.allocation.ptr, 1, xp, 0, 4096, 5)
        .unwrap();
    assert_eq!(copies!(multi, 0)[2].peer, Some((1, 0)));
    multi.memcpy_async(xp, 0, xp, 0, 16, 5).unwrap();
    assert_eq!(copies!(multi, 0)[3].peer, None, "one device: a plain copy");
    multi.free_ptr(xp).unwrap();
    // Routed by address to the device whose expandable segment holds it
    // (`owns` used to ask `base_allocation`, which refuses expandable
    // segments: this was UnknownPointer).
    multi.free_ptr(z.allocation.ptr).unwrap();
    multi.check_invariants().unwrap();
}

#[test]
fn a_pool_with_a_shared_block_is_not_restored_from_a_checkpoint() {
    use cachealloc_core::{CheckpointBlock, MempoolId, StreamFilter};
    const POOL: MempoolId = MempoolId(1, 0);
    let m = MockMachine::new();
    let mut a = on(&m, 0, 1 << 40);
    a.capture_begin(POOL, StreamFilter::stream(1)).unwrap();
    let x = a.malloc(4096, 1).unwrap();
    a.capture_end(POOL).unwrap();
    let mut cp = vec![CheckpointBlock::EMPTY; a.checkpoint_len(POOL).unwrap()];
    let cp = a.checkpoint_pool(POOL, &mut cp).unwrap().to_vec();
    a.share_ipc_handle(x.ptr).unwrap();
    a.free(x.handle.unwrap()).unwrap(); // held
    let (mut freed, mut allocated) = (vec![DevicePtr::NULL; 4], vec![x; 4]);
    let e = a
        .restore_pool(POOL, &cp, &mut freed, &mut allocated)
        .unwrap_err();
    assert!(e.to_string().contains("shared through IPC"), "{e}");
    a.check_invariants().unwrap();
    // Released (and so freed), the pool restores.
    a.release_ipc_share(x.ptr).unwrap();
    a.restore_pool(POOL, &cp, &mut freed, &mut allocated)
        .unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_failed_open_counts_no_use_and_release_all_closes_what_is_open() {
    let m = MockMachine::new();
    let mut a = on(&m, 0, 1 << 40);
    let mut b = on(&m, 0, 2 << 40);
    let x = a.malloc(4096, 0).unwrap();
    let h = a.share_ipc_handle(x.ptr).unwrap();
    b.open_ipc_handle(&h).unwrap();
    // The same segment's handle with an offset past the address space.
    let far = ShareableHandle {
        offset: u64::MAX,
        ..h
    };
    assert!(matches!(
        b.open_ipc_handle(&far),
        Err(Error::SizeOverflow { .. })
    ));
    b.close_ipc_handle(&h).unwrap();
    assert_eq!(
        (b.open_ipc_handles(), m.open_handles()),
        (0, 0),
        "the failed open counted no use"
    );
    // A first open that overflows closes its driver open again.
    assert!(b.open_ipc_handle(&far).is_err());
    assert_eq!(m.open_handles(), 0);
    // Teardown closes what is still open, however often it was opened.
    b.open_ipc_handle(&h).unwrap();
    b.open_ipc_handle(&h).unwrap();
    assert_eq!(b.release_all().unwrap(), 0);
    assert_eq!((b.open_ipc_handles(), m.open_handles()), (0, 0));
}
