//! Expandable segments across processes through a GPU backend's real FFI,
//! on the stub driver (written once for CUDA and HIP): the pages of an
//! expandable segment exported as POSIX file descriptors
//! (`ipc_export_pages`), taken by **another process** with `pidfd_getfd`
//! and mapped there (`ipc_import_pages`) into a reservation of exactly
//! their size. The stub's exported handle is a sealed memfd that names the
//! physical allocation it stands for (`stubs/stub_core.h`).

use crate::gpu::GpuApi;
use crate::harness::Logged;
use crate::stub::{self, Stub};
use crate::stub_suite::assert_clean;
use cachealloc_core::{BlockSlot, Config, DeviceAllocator, DeviceBackend, DevicePtr, VmError};

/// The environment variable naming the file with the exported pages; the
/// consumer test does nothing without it.
pub const PAGES_FILE: &str = "CACHEALLOC_STUB_PAGES";
/// What the consumer is to do: `import` or `stale`.
pub const PAGES_MODE: &str = "CACHEALLOC_STUB_PAGES_MODE";

/// 20 MiB: a page of a large-pool expandable segment.
const PAGE: u64 = 20 << 20;

/// The exporter's side, in the child process: an expandable segment of
/// two mapped pages exports them (the same descriptors when asked again);
/// another process imports and maps them, finds the exporter's physical
/// allocations behind them, copies into and out of them, and closes them;
/// once the exporter's pages are unmapped, their descriptors are closed
/// and a new consumer's import fails naming `pidfd_getfd`, leaving nothing.
pub fn pages_between_processes<G: GpuApi>(stub: &Stub, consumer_test: &str) {
    let mut a: crate::stub_suite::Alloc<G> = DeviceAllocator::with_events(
        Logged::new(G::open(0).expect("open the device")),
        vec![BlockSlot::VACANT; 256],
        Config::parse("expandable_segments:True").expect("config"),
    );
    let s = G::default_stream();
    let x = a.malloc(24 << 20, s).expect("malloc"); // two 20 MiB pages
    let mut fds = [-1i32; 2];
    a.backend_mut()
        .ipc_export_pages(x.ptr, PAGE, &mut fds)
        .expect("export");
    let mut again = [-1i32; 2];
    a.backend_mut()
        .ipc_export_pages(x.ptr, PAGE, &mut again)
        .expect("export again");
    assert_eq!(fds, again, "a page keeps its descriptor");
    // A page that is not mapped has nothing to export.
    let mut past = [-1i32; 1];
    assert!(a
        .backend_mut()
        .ipc_export_pages(DevicePtr(x.ptr.0 + 4 * PAGE), PAGE, &mut past)
        .is_err());
    let (pid, index, imported) = stub.vmm_source(x.ptr.0).expect("mapped");
    assert_eq!((pid, imported), (u64::from(std::process::id()), false));

    let path = std::env::temp_dir().join(format!("cachealloc-pages-{}.txt", std::process::id()));
    std::fs::write(
        &path,
        format!("{}\n{} {}\n{}\n", std::process::id(), fds[0], fds[1], index),
    )
    .expect("write the pages file");
    let file = path.to_string_lossy().into_owned();
    let run = |mode: &str| {
        stub::run_another_process(consumer_test, &[(PAGES_FILE, &file), (PAGES_MODE, mode)])
            .unwrap_or_else(|out| panic!("the consumer process ({mode}) failed:\n{out}"))
    };
    let out = run("import");
    print!("{out}");
    assert!(out.contains("consumer: imported"), "{out}");

    // The consumer is done: the pages go back, their descriptors close.
    a.free(x.handle.expect("handle")).expect("free");
    a.empty_cache().expect("empty_cache");
    assert_eq!(stub.counters().live_mappings, 0);
    let out = run("stale");
    print!("{out}");
    assert!(out.contains("consumer: stale pages refused"), "{out}");
    let _ = std::fs::remove_file(&path);
    drop(a);
    assert_clean(stub, "exporter of pages");
}

/// The consumer process of [`pages_between_processes`].
pub fn pages_consumer<G: GpuApi>(stub: &Stub) {
    let Ok(file) = std::env::var(PAGES_FILE) else {
        return;
    };
    let text = std::fs::read_to_string(&file).expect("read the pages file");
    let mut lines = text.lines();
    let pid: u32 = lines.next().expect("pid").parse().expect("pid");
    let fds: Vec<i32> = lines
        .next()
        .expect("fds")
        .split(' ')
        .map(|f| f.parse().expect("fd"))
        .collect();
    let first: u64 = lines.next().expect("index").parse().expect("index");
    let mut b = G::open(0).expect("open the device");
    if std::env::var(PAGES_MODE).as_deref() == Ok("stale") {
        let e = b.ipc_import_pages(pid, &fds, PAGE).unwrap_err();
        let text = match &e {
            VmError::Other(e) => e.to_string(),
            other => format!("{other:?}"),
        };
        assert!(text.contains("pidfd_getfd"), "{text}");
        drop(b);
        assert_clean(stub, "stale consumer of pages");
        println!("consumer: stale pages refused: {text}");
        return;
    }
    // A driver failure while importing leaves nothing imported, reserved
    // or mapped.
    stub.fail(None, 0, 999);
    assert!(b.ipc_import_pages(pid, &fds, PAGE).is_err());
    let c = stub.counters();
    assert_eq!(
        (c.live_physical, c.live_reservations, c.live_mappings),
        (0, 0, 0)
    );
    let base = b.ipc_import_pages(pid, &fds, PAGE).expect("import");
    // The reservation is what the pages fill, not the device's size.
    assert_eq!(stub.reserved_bytes(), 2 * PAGE);
    for k in 0..2u64 {
        let (src, index, imported) = stub.vmm_source(base.0 + k * PAGE).expect("mapped");
        assert_eq!((src, index, imported), (u64::from(pid), first + k, true));
    }
    // Read and write: copies into and out of the imported range.
    let s = G::default_stream();
    let local = b.malloc(1 << 20).expect("malloc");
    b.memcpy_async(DevicePtr(base.0 + PAGE + 4096), local, 1 << 20, s)
        .expect("write");
    b.memcpy_async(local, base, 1 << 20, s).expect("read");
    b.synchronize_stream(s).expect("synchronize");
    b.ipc_close_pages(base).expect("close");
    assert!(b.ipc_close_pages(base).is_err(), "closed once");
    b.free(local, 1 << 20).expect("free");
    drop(b);
    assert_clean(stub, "consumer of pages");
    println!(
        "consumer: imported 2 pages of process {pid}, reserved {} bytes",
        2 * PAGE
    );
}
