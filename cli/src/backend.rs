//! The devices `cachealloc replay --backend` can use: the simulated device
//! always, and with cargo features `cuda` / `hip` a real GPU. Trace stream 0
//! is the default stream; every other trace stream id gets a stream of its
//! own, created on first use.

use clap::ValueEnum;

/// A kind of device.
#[derive(Clone, Copy, ValueEnum)]
pub enum Backend {
    /// The simulated device (deterministic, any machine).
    Mock,
    /// An NVIDIA GPU through the CUDA driver (built with `--features cuda`).
    #[cfg(feature = "cuda")]
    Cuda,
    /// An AMD GPU through HIP (built with `--features hip`).
    #[cfg(feature = "hip")]
    Hip,
}

/// A real GPU kind: its `ReplayDevice` over its backend crate.
#[cfg(any(feature = "cuda", feature = "hip"))]
macro_rules! real_device {
    ($(#[$doc:meta])* $name:ident, $backend:ty, $stream:ty) => {
        $(#[$doc])*
        pub struct $name;

        impl cachealloc_trace::ReplayDevice for $name {
            type Backend = $backend;
            const SIMULATED: bool = false;
            fn open(index: u64, _capacity: Option<u64>) -> Result<$backend, String> {
                <$backend>::new(index as u32).map_err(|e| e.to_string())
            }
            fn stream_for(backend: &mut $backend, id: u64) -> Result<$stream, String> {
                if id == 0 {
                    Ok(<$stream>::DEFAULT)
                } else {
                    backend.create_stream().map_err(|e| e.to_string())
                }
            }
            fn sync(backend: &mut $backend, stream: Option<$stream>) -> Result<(), String> {
                match stream {
                    Some(s) => backend.synchronize(s),
                    None => backend.synchronize_all(),
                }
                .map_err(|e| e.to_string())
            }
            fn destroy_stream(backend: &mut $backend, stream: $stream) -> Result<(), String> {
                if stream == <$stream>::DEFAULT {
                    return Ok(());
                }
                backend.destroy_stream(stream).map_err(|e| e.to_string())
            }
        }
    };
}

#[cfg(feature = "cuda")]
real_device!(
    /// CUDA devices.
    Cuda,
    cachealloc_cuda::CudaBackend,
    cachealloc_cuda::CudaStream
);

#[cfg(feature = "hip")]
real_device!(
    /// HIP devices.
    Hip,
    cachealloc_hip::HipBackend,
    cachealloc_hip::HipStream
);
