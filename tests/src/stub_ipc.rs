//! IPC handles, peer access and device-to-device copies through a GPU
//! backend's real FFI, on the stub driver (written once for CUDA and HIP).
//!
//! IPC runs between **two processes**: the exporter (the child process of
//! the stub tests) shares an allocation and starts the consumer, this test
//! binary again, filtered to one test, which reads the handle from a file.
//! The stub keeps each process's state in the process and tells the
//! consumer whether the exporter still holds the memory through a marker
//! file (see `stubs/stub_core.h`).

use crate::gpu::GpuApi;
use crate::stub::{self, Stub};
use crate::stub_suite::{allocator_on, assert_clean};
use cachealloc_core::{
    DeviceBackend, DevicePtr, Error, IpcMemHandle, PeerAccess, ShareableHandle, VmError,
};

/// The unknown-error code of both drivers (`CUDA_ERROR_UNKNOWN`,
/// `hipErrorUnknown`), for injected failures.
const UNKNOWN: i32 = 999;

/// The environment variable naming the file with the shared handle; the
/// consumer test does nothing without it.
pub const HANDLE_FILE: &str = "CACHEALLOC_STUB_IPC_HANDLE";
/// What the consumer is to do: `open` or `stale`.
pub const MODE: &str = "CACHEALLOC_STUB_IPC_MODE";

/// What the exporter writes for the consumer: the handle, and what the
/// consumer must find behind it (the exporter's pid and address).
struct Note {
    handle: ShareableHandle,
    pid: u64,
    ptr: u64,
}

impl Note {
    fn write(&self, path: &std::path::Path) {
        let hex: String = self
            .handle
            .handle
            .0
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let text = format!(
            "{hex}\n{}\n{}\n{}\n",
            self.handle.offset, self.pid, self.ptr
        );
        std::fs::write(path, text).expect("write the handle file");
    }

    fn read(path: &str) -> Note {
        let text = std::fs::read_to_string(path).expect("read the handle file");
        let mut lines = text.lines();
        let hex = lines.next().expect("handle line");
        let mut handle = [0u8; 64];
        for (k, b) in handle.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * k..2 * k + 2], 16).expect("hex");
        }
        let mut num = || -> u64 { lines.next().expect("line").parse().expect("number") };
        let offset = num();
        let (pid, ptr) = (num(), num());
        Note {
            handle: ShareableHandle {
                handle: IpcMemHandle(handle),
                offset,
            },
            pid,
            ptr,
        }
    }
}

/// The exporter's side, in the child process: share a block with another
/// process, which opens it (twice: one driver open), sees the exporter's
/// memory behind it, copies into it and closes it; the exporter's free is
/// held until the consumer is done; after the exporter releases the
/// segment, a new consumer's open is refused as stale; nothing leaks.
/// `consumer_test`: the name of the test that calls [`ipc_consumer`].
pub fn ipc_between_processes<G: GpuApi>(stub: &Stub, consumer_test: &str) {
    let mut a = allocator_on::<G>(0);
    let s = G::default_stream();
    let first = a.malloc(4096, s).expect("malloc");
    let x = a.malloc(1 << 20, s).expect("malloc"); // the same 2 MiB segment
                                                   // A driver failure while sharing is an error value and counts no share.
    stub.fail(None, 0, UNKNOWN);
    assert!(a.share_ipc_handle(x.ptr).is_err());
    assert_eq!(a.ipc_shares(), (0, 0));
    let h = a.share_ipc_handle(x.ptr).expect("share");
    assert_eq!(h.offset, 4096);
    // The exporting process cannot open its own handle (the driver's
    // invalid context), and the failure leaves nothing in the table.
    let e = a.open_ipc_handle(&h).unwrap_err();
    assert!(e.to_string().contains("(201)"), "{e}");
    assert_eq!(a.open_ipc_handles(), 0);

    let path = std::env::temp_dir().join(format!("cachealloc-ipc-{}.txt", std::process::id()));
    Note {
        handle: h,
        pid: u64::from(std::process::id()),
        ptr: x.ptr.0,
    }
    .write(&path);
    let file = path.to_string_lossy().into_owned();
    let run = |mode: &str| {
        stub::run_another_process(consumer_test, &[(HANDLE_FILE, &file), (MODE, mode)])
            .unwrap_or_else(|out| panic!("the consumer process ({mode}) failed:\n{out}"))
    };
    let out = run("open");
    print!("{out}");
    assert!(out.contains("consumer: opened"), "{out}");

    // The consumer is done (a real embedder learns it from its own
    // counter); the free before the release is held.
    a.free(x.handle.expect("handle")).expect("free");
    a.empty_cache().expect("empty_cache");
    assert_eq!(stub.counters().live_allocations, 1, "held while shared");
    a.release_ipc_share(x.ptr).expect("release");
    a.free(first.handle.expect("handle")).expect("free");
    a.empty_cache().expect("empty_cache");
    assert_eq!(stub.counters().live_allocations, 0);
    let out = run("stale");
    print!("{out}");
    assert!(out.contains("consumer: stale handle refused"), "{out}");
    let _ = std::fs::remove_file(&path);
    a.check_invariants().expect("consistent");
    drop(a);
    assert_clean(stub, "ipc exporter");
}

/// The consumer's side, in its own process (does nothing unless
/// [`HANDLE_FILE`] is set).
pub fn ipc_consumer<G: GpuApi>(stub: &Stub) {
    let Ok(file) = std::env::var(HANDLE_FILE) else {
        return;
    };
    let note = Note::read(&file);
    let h = note.handle;
    // Device 1: the exporter's memory is on its device 0.
    let mut b = allocator_on::<G>(1);
    let s = G::default_stream();
    if std::env::var(MODE).as_deref() == Ok("stale") {
        let e = b.open_ipc_handle(&h).unwrap_err();
        assert!(e.to_string().contains("(205)"), "map failed: {e}");
        assert_eq!(b.open_ipc_handles(), 0);
        println!("consumer: stale handle refused: {e}");
        drop(b);
        assert_clean(stub, "stale consumer");
        return;
    }
    // A driver failure while opening leaves nothing open.
    stub.fail(None, 0, UNKNOWN);
    assert!(b.open_ipc_handle(&h).is_err());
    assert_eq!((b.open_ipc_handles(), stub.counters().live_imports), (0, 0));
    // HIP: the runtime of ROCm 6, whose lazy-peer-access flag differs
    // from the bindings' (the backend tries both).
    stub.set_ipc_open_flag(1);
    let p = b.open_ipc_handle(&h).expect("open");
    stub.set_ipc_open_flag(0);
    assert_eq!(
        b.open_ipc_handle(&h).expect("open again"),
        p,
        "the cached mapping"
    );
    assert_eq!(stub.counters().live_imports, 1, "one driver open");
    // The same device range: the exporter's block, behind the offset.
    assert_eq!(stub.ipc_source(p.0), Some((note.pid, note.ptr)));
    // Without the allocator's cache, a second driver open is refused.
    match b.backend_mut().ipc_open_handle(&h.handle) {
        Err(VmError::Other(e)) => assert!(e.to_string().contains("(208)"), "{e}"),
        other => panic!("a second driver open: {other:?}"),
    }
    // A copy from local memory into the shared block.
    let y = b.malloc(4096, s).expect("malloc");
    b.memcpy_async(p, y.ptr, 4096, s)
        .expect("copy into shared memory");
    // A handle that is not a handle.
    let junk = ShareableHandle {
        handle: IpcMemHandle([0x5a; 64]),
        offset: 0,
    };
    let e = b.open_ipc_handle(&junk).unwrap_err();
    assert!(e.to_string().contains("(400)"), "{e}");
    b.close_ipc_handle(&h).expect("close");
    assert_eq!(stub.counters().live_imports, 1, "one user left");
    // The last close fails in the driver: still open, and a retry closes.
    stub.fail(None, 0, UNKNOWN);
    assert!(b.close_ipc_handle(&h).is_err());
    assert_eq!((b.open_ipc_handles(), stub.counters().live_imports), (1, 1));
    b.close_ipc_handle(&h).expect("close");
    assert_eq!(stub.counters().live_imports, 0, "closed with the driver");
    assert!(matches!(b.close_ipc_handle(&h), Err(Error::IpcNotOpen)));
    println!(
        "consumer: opened {p} = process {}'s {:#x}",
        note.pid, note.ptr
    );
    b.free(y.handle.expect("handle")).expect("free");
    b.release_all().expect("release_all");
    drop(b);
    assert_clean(stub, "consumer");
}

/// Peer access and device-to-device copies through the FFI: enabled, then
/// already enabled (no error, as in PyTorch); itself, a missing device and
/// a pair that cannot are the driver's errors; plain and peer copies
/// between two devices; a copy from memory that is not allocated is
/// refused; nothing leaks (CUDA: the peer's primary context is released).
pub fn peer_access_and_copies<G: GpuApi>(stub: &Stub) {
    let mut d0 = allocator_on::<G>(0);
    let mut d1 = allocator_on::<G>(1);
    let s = G::default_stream();
    assert_eq!(
        d0.enable_peer_access(1).expect("enable"),
        PeerAccess::Enabled
    );
    assert_eq!(
        d0.enable_peer_access(1).expect("again"),
        PeerAccess::AlreadyEnabled
    );
    let e = d0.enable_peer_access(0).unwrap_err();
    assert!(e.to_string().contains("(101)"), "itself: {e}");
    let e = d0.enable_peer_access(7).unwrap_err();
    assert!(e.to_string().contains("(101)"), "no device 7: {e}");
    stub.set_peer_capable(1, 0, false);
    let e = d1.enable_peer_access(0).unwrap_err();
    assert!(e.to_string().contains("(217)"), "unsupported pair: {e}");
    println!("peer access: a pair that cannot: {e}");
    let x = d0.malloc(1 << 20, s).expect("malloc");
    let y = d1.malloc(1 << 20, s).expect("malloc");
    d0.memcpy_async(y.ptr, x.ptr, 1 << 20, s).expect("copy");
    d0.memcpy_peer_async(y.ptr, 1, x.ptr, 0, 1 << 20, s)
        .expect("peer copy");
    let e = d0
        .memcpy_async(y.ptr, DevicePtr(0x1234), 16, s)
        .unwrap_err();
    assert!(e.to_string().contains("(1)"), "{e}");
    d0.free(x.handle.expect("handle")).expect("free");
    d1.free(y.handle.expect("handle")).expect("free");
    d0.release_all().expect("release_all");
    d1.release_all().expect("release_all");
    drop((d0, d1));
    assert_clean(stub, "peer access");
}
