//! IPC handles, peer access and device-to-device copies on the mock
//! (issue 17, first part): two allocators on one simulated machine stand
//! for two processes.

use cachealloc_core::{
    BlockSlot, Config, DeviceAllocator, DevicePtr, Error, PeerAccess, ShareableHandle,
    DEFAULT_IPC_HANDLES,
};
use cachealloc_mock::{MockDevice, MockError, MockMachine};

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
    // B sees the same device range.
    let p = b.open_ipc_handle(&h).unwrap();
    assert_eq!(p, x.ptr);
    // Opening again: the same mapping, no second open with the driver.
    assert_eq!(b.open_ipc_handle(&h).unwrap(), x.ptr);
    assert_eq!((b.open_ipc_handles(), m.open_handles()), (1, 1));
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
    // A frees and releases the segment: its handle goes stale.
    a.free(x.id.unwrap()).unwrap();
    a.free(_first.id.unwrap()).unwrap();
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
    a.free(x.id.unwrap()).unwrap();
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
    assert_eq!(d0.backend().copies(), &[(y.ptr, x.ptr, 1 << 20, 3)]);
}
