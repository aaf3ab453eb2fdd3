//! Real devices for `cachealloc replay --backend cuda|hip` (cargo features
//! `cuda` and `hip`). Trace stream 0 is the default stream; every other
//! trace stream id gets a stream of its own, created on first use.

#[cfg(feature = "cuda")]
mod cuda {
    use crate::replay::ReplayDevice;
    use cachealloc_cuda::{CudaBackend, CudaStream};

    impl ReplayDevice for CudaBackend {
        const SIMULATED: bool = false;
        fn open(index: u64, _capacity: Option<u64>) -> Result<Self, String> {
            CudaBackend::new(index as u32).map_err(|e| e.to_string())
        }
        fn stream_for(&mut self, id: u64) -> Result<CudaStream, String> {
            if id == 0 {
                Ok(CudaStream::DEFAULT)
            } else {
                self.create_stream().map_err(|e| e.to_string())
            }
        }
        fn sync(&mut self, stream: Option<CudaStream>) -> Result<(), String> {
            match stream {
                Some(s) => self.synchronize(s),
                None => self.synchronize_all(),
            }
            .map_err(|e| e.to_string())
        }
    }
}

#[cfg(feature = "hip")]
mod hip {
    use crate::replay::ReplayDevice;
    use cachealloc_hip::{HipBackend, HipStream};

    impl ReplayDevice for HipBackend {
        const SIMULATED: bool = false;
        fn open(index: u64, _capacity: Option<u64>) -> Result<Self, String> {
            HipBackend::new(index as u32).map_err(|e| e.to_string())
        }
        fn stream_for(&mut self, id: u64) -> Result<HipStream, String> {
            if id == 0 {
                Ok(HipStream::DEFAULT)
            } else {
                self.create_stream().map_err(|e| e.to_string())
            }
        }
        fn sync(&mut self, stream: Option<HipStream>) -> Result<(), String> {
            match stream {
                Some(s) => self.synchronize(s),
                None => self.synchronize_all(),
            }
            .map_err(|e| e.to_string())
        }
    }
}
