//! The real-GPU side of the backend tests, written once for CUDA and HIP:
//! [`GpuApi`] is what a test needs of a GPU backend beyond `DeviceBackend`
//! (each backend's test crate implements it on a local type), and
//! [`GpuHarness`] is the conformance suite's [`Harness`] over it, on a real
//! device or on a stub driver. With a stub, the device is simulated (a
//! capacity, stream work pending until synchronized), so every scenario
//! applies; on a real GPU the scenarios that need either are left out.

use crate::harness::Harness;
use crate::stub::Stub;
use cachealloc_core::{DeviceBackend, DevicePtr};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// A GPU backend's stream type.
pub type StreamOf<G> = <<G as GpuApi>::B as DeviceBackend>::Stream;

/// What the tests need of a GPU backend besides `DeviceBackend`.
pub trait GpuApi {
    /// The backend.
    type B: DeviceBackend<Event: Send, Stream: Send> + Send + 'static;
    /// Its name in messages.
    const NAME: &'static str;
    /// Its stub driver.
    const STUB: crate::stub::StubKind;
    /// Open device `ordinal`.
    fn open(ordinal: u32) -> Result<Self::B, String>;
    /// The default stream.
    fn default_stream() -> StreamOf<Self>;
    /// A new stream.
    fn create_stream(b: &Self::B) -> Result<StreamOf<Self>, String>;
    /// Destroy a stream `create_stream` made.
    fn destroy_stream(b: &Self::B, s: StreamOf<Self>) -> Result<(), String>;
    /// Wait for `s` (the whole device when `None`).
    fn synchronize(b: &Self::B, s: Option<StreamOf<Self>>) -> Result<(), String>;
    /// Make the device current on the calling thread, and leave it so.
    fn make_current(b: &Self::B) -> Result<(), String>;
    /// Queue a memset of `n` bytes at `ptr` on `s` (work for a stream).
    fn memset(b: &Self::B, ptr: DevicePtr, n: u64, s: StreamOf<Self>) -> Result<(), String>;
    /// Begin capturing `s` into a graph in global mode, as
    /// `torch.cuda.graph` does (`cuStreamBeginCapture_v2`,
    /// `hipStreamBeginCapture`).
    fn begin_capture(b: &Self::B, s: StreamOf<Self>) -> Result<(), String>;
    /// End the capture of `s`; its graph, instantiated, launched once on
    /// `s` (a replay) and destroyed. The driver's error when a call made
    /// meanwhile invalidated the capture.
    fn end_capture(b: &Self::B, s: StreamOf<Self>) -> Result<(), String>;
}

/// Bytes of the buffer a real GPU's streams are kept busy with.
const SCRATCH: u64 = 256 << 20;

/// The conformance suite's view of a GPU (device 0), real or stubbed.
pub struct GpuHarness<G: GpuApi> {
    stub: Option<Stub>,
    /// Keeps the device open (and a CUDA primary context alive) between the
    /// suite's opens, so the streams stay valid.
    keeper: RefCell<Option<G::B>>,
    streams: RefCell<BTreeMap<u64, StreamOf<G>>>,
    scratch: RefCell<Option<DevicePtr>>,
}

impl<G: GpuApi> GpuHarness<G> {
    /// On a real device (`stub: None`) or on the stub driver this process loaded.
    pub fn new(stub: Option<Stub>) -> Self {
        GpuHarness {
            stub,
            keeper: RefCell::new(None),
            streams: RefCell::new(BTreeMap::new()),
            scratch: RefCell::new(None),
        }
    }

    fn keeper(&self) -> Result<(), String> {
        if self.keeper.borrow().is_some() {
            return Ok(());
        }
        let mut k = G::open(0)?;
        G::make_current(&k)?;
        if self.stub.is_none() {
            let p = k.malloc(SCRATCH).map_err(|e| format!("scratch: {e:?}"))?;
            *self.scratch.borrow_mut() = Some(p);
        }
        *self.keeper.borrow_mut() = Some(k);
        Ok(())
    }
}

impl<G: GpuApi> Drop for GpuHarness<G> {
    /// Give back what the harness made: its streams, its scratch buffer.
    fn drop(&mut self) {
        let Some(mut k) = self.keeper.borrow_mut().take() else {
            return;
        };
        let _ = G::synchronize(&k, None);
        for (_, s) in std::mem::take(&mut *self.streams.borrow_mut()) {
            if let Err(e) = G::destroy_stream(&k, s) {
                eprintln!("{}: destroying a test stream: {e}", G::NAME);
            }
        }
        if let Some(p) = self.scratch.borrow_mut().take() {
            if let Err(e) = k.free(p, SCRATCH) {
                eprintln!("{}: freeing the scratch buffer: {e}", G::NAME);
            }
        }
    }
}

impl<G: GpuApi> Harness for GpuHarness<G> {
    type B = G::B;
    fn name(&self) -> &'static str {
        G::NAME
    }
    fn open(&self, capacity: Option<u64>) -> Result<G::B, String> {
        if let Some(stub) = &self.stub {
            stub.set_capacity(capacity.unwrap_or(u64::MAX));
        }
        self.keeper()?;
        G::open(0)
    }
    fn stream(&self, k: u64) -> StreamOf<G> {
        if k == 0 {
            return G::default_stream();
        }
        let keeper = self.keeper.borrow();
        let keeper = keeper
            .as_ref()
            .expect("opened before streams are asked for");
        *self
            .streams
            .borrow_mut()
            .entry(k)
            .or_insert_with(|| G::create_stream(keeper).expect("create a stream"))
    }
    fn enqueue_work(&self, _b: &mut G::B, k: u64) -> bool {
        if self.stub.is_some() {
            return true; // a stub's stream work is pending until synchronized
        }
        let s = self.stream(k);
        if let (Some(keeper), Some(p)) = (&*self.keeper.borrow(), *self.scratch.borrow()) {
            let _ = G::memset(keeper, p, SCRATCH, s);
        }
        false // a real memset may finish before the event is queried
    }
    fn finish(&self, b: &mut G::B, k: Option<u64>) {
        let s = k.map(|k| self.stream(k));
        G::synchronize(b, s).expect("synchronize");
    }
    fn deterministic(&self) -> bool {
        self.stub.is_some()
    }
    fn simulated(&self) -> bool {
        self.stub.is_some()
    }
    fn begin_capture(&self, b: &mut G::B, k: u64) -> Result<(), String> {
        G::begin_capture(b, self.stream(k))
    }
    fn end_capture(&self, b: &mut G::B, k: u64) -> Result<(), String> {
        G::end_capture(b, self.stream(k))
    }
}
