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
use cachealloc_core::{BlockSlot, Config, DeviceAllocator, DevicePtr, Error, PagesShare};

/// The environment variable naming the file with the exported pages; the
/// consumer test does nothing without it.
pub const PAGES_FILE: &str = "CACHEALLOC_STUB_PAGES";
/// What the consumer is to do: `import` or `stale`.
pub const PAGES_MODE: &str = "CACHEALLOC_STUB_PAGES_MODE";

/// 20 MiB: a page of a large-pool expandable segment.
const PAGE: u64 = 20 << 20;

/// The exporter's side, in the child process, through the allocator: a
/// block that starts 8 MiB into an expandable segment and ends 12 MiB into
/// its second page is shared as those two pages; its owner frees it while
/// it is shared, and `empty_cache` leaves its pages mapped; another process
/// opens it (twice: one import), finds the exporter's physical allocations
/// behind it, reserved no more than they fill, copies into and out of it
/// and closes it; then the share is released, the block freed, its pages
/// unmapped and their descriptors closed, and a new consumer's open fails
/// naming `pidfd_getfd`, leaving nothing.
pub fn pages_between_processes<G: GpuApi>(stub: &Stub, consumer_test: &str) {
    let mut a: crate::stub_suite::Alloc<G> = DeviceAllocator::with_events(
        Logged::new(G::open(0).expect("open the device")),
        vec![BlockSlot::VACANT; 256],
        Config::parse("expandable_segments:True").expect("config"),
    );
    let s = G::default_stream();
    let y = a.malloc(8 << 20, s).expect("malloc");
    let x = a.malloc(24 << 20, s).expect("malloc"); // 8 MiB into page 0, into page 1
    let mut fds = [-1i32; 4];
    assert!(matches!(
        a.share_ipc_pages(x.ptr, &mut fds[..1]),
        Err(Error::BufferTooSmall { needed: 2 })
    ));
    assert_eq!(a.ipc_shares(), (0, 0));
    let share = a.share_ipc_pages(x.ptr, &mut fds).expect("share");
    assert_eq!(
        share,
        PagesShare {
            page_size: PAGE,
            pages: 2,
            offset: 8 << 20
        }
    );
    let fds = [fds[0], fds[1]];
    let (pid, index, imported) = stub.vmm_source(x.ptr.0).expect("mapped");
    assert_eq!((pid, imported), (u64::from(std::process::id()), false));
    // The owner frees it while shared: held, its pages stay mapped.
    a.free(x.handle.expect("handle")).expect("free");
    a.free(y.handle.expect("handle")).expect("free");
    let mapped = stub.counters().live_mappings;
    a.empty_cache().expect("empty_cache");
    assert_eq!(stub.counters().live_mappings, mapped, "held while shared");

    let path = std::env::temp_dir().join(format!("cachealloc-pages-{}.txt", std::process::id()));
    std::fs::write(
        &path,
        format!(
            "{}\n{} {}\n{}\n{}\n{}\n",
            std::process::id(),
            fds[0],
            fds[1],
            index,
            share.offset,
            x.ptr.0
        ),
    )
    .expect("write the pages file");
    let file = path.to_string_lossy().into_owned();
    let run_on = |mode: &str, hip_version: &str| {
        stub::run_another_process(
            consumer_test,
            &[
                (PAGES_FILE, &file),
                (PAGES_MODE, mode),
                ("CACHEALLOC_STUB_HIP_VERSION", hip_version),
            ],
        )
        .unwrap_or_else(|out| panic!("the consumer process ({mode}) failed:\n{out}"))
    };
    let run = |mode: &str| run_on(mode, "");
    let out = run("import");
    print!("{out}");
    assert!(out.contains("consumer: imported"), "{out}");
    // HIP before ROCm 7.1 takes a pointer to the descriptor, not its value
    // (the CUDA stub ignores the version).
    let out = run_on("import", "60200000");
    print!("{out}");
    assert!(
        out.contains("consumer: imported"),
        "as ROCm 6.2's runtime: {out}"
    );

    // The consumer closed it: the share is released, the block freed, the
    // pages go back and their descriptors close.
    a.release_ipc_share(x.ptr).expect("release");
    assert_eq!(a.ipc_shares(), (0, 0));
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
    let mut num = || -> u64 { lines.next().expect("line").parse().expect("number") };
    let (first, offset, _their_ptr) = (num(), num(), num());
    let share = PagesShare {
        page_size: PAGE,
        pages: fds.len() as u32,
        offset,
    };
    let mut b = crate::stub_suite::allocator_on::<G>(0);
    if std::env::var(PAGES_MODE).as_deref() == Ok("stale") {
        let e = b.open_ipc_pages(pid, &share, &fds).unwrap_err();
        // The sender closed the descriptors: taking them fails, or (when
        // the sender's busy process has reused those numbers for other
        // files meanwhile) the driver refuses what it is given instead.
        let msg = e.to_string();
        assert!(
            msg.contains("pidfd_getfd") || msg.contains("ImportFromShareableHandle"),
            "{e}"
        );
        assert_eq!(b.open_ipc_handles(), 0);
        drop(b);
        // Nothing left behind; a descriptor the driver refused is the one
        // bad handle the stub counted.
        let mut c = stub.counters();
        if !msg.contains("pidfd_getfd") {
            c.bad_handles = c.bad_handles.saturating_sub(1);
        }
        assert!(c.clean(), "stale consumer of pages: {c:?}");
        println!("consumer: stale pages refused: {e}");
        return;
    }
    // A driver failure while importing leaves nothing imported, reserved
    // or mapped.
    stub.fail(None, 0, 999);
    assert!(b.open_ipc_pages(pid, &share, &fds).is_err());
    let c = stub.counters();
    assert_eq!(
        (c.live_physical, c.live_reservations, c.live_mappings),
        (0, 0, 0)
    );
    assert_eq!(b.open_ipc_handles(), 0);
    let p = b.open_ipc_pages(pid, &share, &fds).expect("open");
    assert_eq!(
        b.open_ipc_pages(pid, &share, &fds).expect("open again"),
        p,
        "one import"
    );
    let base = p.0 - offset;
    // The reservation is what the pages fill, not the device's size.
    assert_eq!(stub.reserved_bytes(), 2 * PAGE);
    for k in 0..2u64 {
        let (src, index, imported) = stub.vmm_source(base + k * PAGE).expect("mapped");
        assert_eq!((src, index, imported), (u64::from(pid), first + k, true));
    }
    // Read and write: copies into and out of the shared block.
    let s = G::default_stream();
    let local = b.malloc(1 << 20, s).expect("malloc");
    b.memcpy_async(p, local.ptr, 1 << 20, s).expect("write");
    b.memcpy_async(local.ptr, DevicePtr(p.0 + (23 << 20)), 1 << 20, s)
        .expect("read");
    b.close_ipc_pages(pid, &share, &fds).expect("close");
    assert_eq!(stub.counters().live_mappings, 2, "one user left");
    b.close_ipc_pages(pid, &share, &fds).expect("close");
    assert!(b.close_ipc_pages(pid, &share, &fds).is_err(), "closed");
    b.free(local.handle.expect("handle")).expect("free");
    b.empty_cache().expect("empty_cache");
    drop(b);
    assert_clean(stub, "consumer of pages");
    println!(
        "consumer: imported 2 pages of process {pid}, reserved {} bytes",
        2 * PAGE
    );
}
