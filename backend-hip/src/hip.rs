//! The HIP runtime, loaded at run time: the types and constants the backend
//! uses (their C layout and values, as HIP 5.x to 7.x declare them) and one
//! function per entry point, with the runtime's names and signatures, that
//! calls through the address resolved from `libamdhip64` when the backend
//! was opened.
//!
//! Each entry point is resolved at the symbol version the real library
//! gives it (`dlvsym`; the plain name only for a runtime built without
//! symbol versions, never for a missing version of a versioned one), so
//! that a later runtime's changed ABI under the same name is never picked
//! up. A library that lacks a required entry point is refused,
//! naming it; the virtual-memory, IPC and capture-graph ones are optional
//! (a call of one that is missing fails with `hipErrorNotSupported`).
//!
//! Status codes are a plain `i32` (`hipError_t`): a newer runtime may
//! return a code this file does not name, which an enum could not hold.

#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    missing_docs
)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};
use std::sync::OnceLock;

/// A HIP status code (`Debug` shows the names this file declares).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct hipError_t(pub i32);

macro_rules! hip_errors {
    ($($name:ident = $n:expr),* $(,)?) => {
        impl hipError_t {
            $(pub const $name: Self = Self($n);)*
        }
        impl std::fmt::Debug for hipError_t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self.0 {
                    $($n => f.write_str(stringify!($name)),)*
                    n => write!(f, "hipError_t({n})"),
                }
            }
        }
    };
}

hip_errors! {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorNotInitialized = 3,
    hipErrorNoDevice = 100,
    hipErrorNotReady = 600,
    hipErrorPeerAccessAlreadyEnabled = 704,
    hipErrorNotSupported = 801,
    hipErrorStreamCaptureUnsupported = 900,
    hipErrorStreamCaptureInvalidated = 901,
}

pub type hipStream_t = *mut c_void;
pub type hipEvent_t = *mut c_void;
pub type hipGraph_t = *mut c_void;
pub type hipGraphNode_t = *mut c_void;
pub type hipGraphExec_t = *mut c_void;
pub type hipMemGenericAllocationHandle_t = *mut c_void;
pub type hipDevice_t = c_int;

/// Declares a C enum as a transparent `i32` with the values the backend uses.
macro_rules! c_enum {
    ($name:ident { $($value:ident = $n:expr),* $(,)? }) => {
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name(pub i32);
        impl $name {
            $(pub const $value: Self = Self($n);)*
        }
    };
}

c_enum!(hipStreamCaptureStatus { hipStreamCaptureStatusNone = 0, hipStreamCaptureStatusActive = 1 });
c_enum!(hipStreamCaptureMode { hipStreamCaptureModeGlobal = 0, hipStreamCaptureModeRelaxed = 2 });
c_enum!(hipMemcpyKind { hipMemcpyDeviceToDevice = 3 });
c_enum!(hipMemAllocationType { hipMemAllocationTypePinned = 1 });
c_enum!(hipMemAllocationHandleType { hipMemHandleTypePosixFileDescriptor = 1 });
c_enum!(hipMemLocationType { hipMemLocationTypeDevice = 1 });
c_enum!(hipMemAllocationGranularity_flags { hipMemAllocationGranularityMinimum = 0 });
c_enum!(hipMemAccessFlags { hipMemAccessFlagsProtReadWrite = 3 });

pub const hipIpcMemLazyEnablePeerAccess: u32 = 0;
pub const hipStreamNonBlocking: u32 = 1;
pub const hipEventDisableTiming: u32 = 2;

/// `hipIpcMemHandle_t`: 64 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct hipIpcMemHandle_t {
    pub reserved: [c_char; 64],
}

/// `hipMemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct hipMemLocation {
    pub type_: hipMemLocationType,
    pub id: c_int,
}

/// `hipMemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct hipMemAccessDesc {
    pub location: hipMemLocation,
    pub flags: hipMemAccessFlags,
}

/// The `allocFlags` of [`hipMemAllocationProp`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct hipMemAllocationFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
}

/// `hipMemAllocationProp` (HIP 5.x names its handle field
/// `requestedHandleType`; later headers add the plural as an alias of the
/// same field: one layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct hipMemAllocationProp {
    pub type_: hipMemAllocationType,
    pub requestedHandleType: hipMemAllocationHandleType,
    pub location: hipMemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: hipMemAllocationFlags,
}

/// Why the runtime could not be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadError {
    /// No library of these names could be loaded (`dlerror` of the last).
    NoLibrary { tried: Vec<String>, reason: String },
    /// The library lacks an entry point the backend needs.
    MissingSymbol {
        library: String,
        symbol: &'static str,
        version: &'static str,
    },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NoLibrary { tried, reason } => {
                write!(f, "no HIP runtime: could not load {} ({reason})", tried.join(", "))
            }
            LoadError::MissingSymbol { library, symbol, version } => write!(
                f,
                "{library} lacks {symbol} (version {version}), which cachealloc needs: a HIP runtime of ROCm 5.1 or later is required"
            ),
        }
    }
}

/// The library names tried, in order: an override, else each soname from
/// the newest major version down, then the development link (which may
/// point at any of them).
pub fn library_names() -> Vec<String> {
    if let Some(path) = std::env::var_os("CACHEALLOC_HIP_LIBRARY") {
        return vec![path.to_string_lossy().into_owned()];
    }
    [
        "libamdhip64.so.7",
        "libamdhip64.so.6",
        "libamdhip64.so.5",
        "libamdhip64.so",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Declares the entry points: a table of addresses, its loader, and a
/// function per entry point that calls through the process's table.
macro_rules! hip_api {
    ($( $req:ident $version:literal fn $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty = $missing:expr; )*) => {
        /// The runtime's entry points, resolved once.
        pub struct Api {
            library: String,
            $( $name: Option<unsafe extern "C" fn($($ty),*) -> $ret>, )*
        }

        impl std::fmt::Debug for Api {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("Api").field("library", &self.library).finish_non_exhaustive()
            }
        }

        impl Api {
            /// Resolve every entry point from an opened library.
            fn resolve(handle: *mut c_void, library: &str) -> Result<Api, LoadError> {
                let versioned = versioned(handle);
                Ok(Api {
                    library: library.to_string(),
                    $( $name: {
                        let f = symbol(handle, stringify!($name), $version, versioned);
                        if f.is_none() && hip_api!(@required $req) {
                            return Err(LoadError::MissingSymbol {
                                library: library.to_string(),
                                symbol: stringify!($name),
                                version: $version,
                            });
                        }
                        // SAFETY: the address is the runtime's entry point of this
                        // name at this version, whose C signature is the one declared.
                        f.map(|p| unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> $ret>(p)
                        })
                    }, )*
                })
            }
        }

        $(
            /// The runtime's entry point of this name (see the module's docs).
            ///
            /// # Safety
            /// As the HIP runtime documents for this call.
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                match api().ok().and_then(|a| a.$name) {
                    // SAFETY: the caller keeps the runtime's contract for this call.
                    Some(f) => unsafe { f($($arg),*) },
                    None => $missing,
                }
            }
        )*
    };
    (@required required) => { true };
    (@required optional) => { false };
}

const NOT_LOADED: hipError_t = hipError_t::hipErrorNotInitialized;
const MISSING: hipError_t = hipError_t::hipErrorNotSupported;

hip_api! {
    required "hip_4.2" fn hipGetDeviceCount(count: *mut c_int) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipGetDevice(device: *mut c_int) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipSetDevice(device: c_int) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipDeviceSynchronize() -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipDeviceTotalMem(bytes: *mut usize, device: hipDevice_t) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipGetErrorName(e: hipError_t) -> *const c_char = std::ptr::null();
    required "hip_4.2" fn hipGetLastError() -> hipError_t = NOT_LOADED;
    optional "hip_4.2" fn hipRuntimeGetVersion(version: *mut c_int) -> hipError_t = MISSING;
    required "hip_4.2" fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipFree(ptr: *mut c_void) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipStreamCreateWithFlags(stream: *mut hipStream_t, flags: c_uint) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipStreamDestroy(stream: hipStream_t) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipStreamSynchronize(stream: hipStream_t) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipStreamWaitEvent(stream: hipStream_t, event: hipEvent_t, flags: c_uint) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipEventCreateWithFlags(event: *mut hipEvent_t, flags: c_uint) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipEventDestroy(event: hipEvent_t) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipEventQuery(event: hipEvent_t) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipEventSynchronize(event: hipEvent_t) -> hipError_t = NOT_LOADED;
    required "hip_4.2" fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, bytes: usize, kind: hipMemcpyKind, stream: hipStream_t) -> hipError_t = NOT_LOADED;
    optional "hip_4.2" fn hipIpcGetMemHandle(handle: *mut hipIpcMemHandle_t, ptr: *mut c_void) -> hipError_t = MISSING;
    optional "hip_4.2" fn hipIpcOpenMemHandle(ptr: *mut *mut c_void, handle: hipIpcMemHandle_t, flags: c_uint) -> hipError_t = MISSING;
    optional "hip_4.2" fn hipIpcCloseMemHandle(ptr: *mut c_void) -> hipError_t = MISSING;
    optional "hip_4.2" fn hipDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> hipError_t = MISSING;
    optional "hip_4.2" fn hipMemcpyPeerAsync(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, bytes: usize, stream: hipStream_t) -> hipError_t = MISSING;
    optional "hip_4.5" fn hipStreamGetCaptureInfo_v2(stream: hipStream_t, status: *mut hipStreamCaptureStatus, id: *mut c_ulonglong, graph: *mut hipGraph_t, deps: *mut *const hipGraphNode_t, count: *mut usize) -> hipError_t = MISSING;
    optional "hip_4.5" fn hipGraphNodeGetDependencies(node: hipGraphNode_t, deps: *mut hipGraphNode_t, count: *mut usize) -> hipError_t = MISSING;
    optional "hip_5.0" fn hipThreadExchangeStreamCaptureMode(mode: *mut hipStreamCaptureMode) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemGetAllocationGranularity(granularity: *mut usize, prop: *const hipMemAllocationProp, option: hipMemAllocationGranularity_flags) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemAddressReserve(ptr: *mut *mut c_void, size: usize, alignment: usize, addr: *mut c_void, flags: c_ulonglong) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemAddressFree(ptr: *mut c_void, size: usize) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemCreate(handle: *mut hipMemGenericAllocationHandle_t, size: usize, prop: *const hipMemAllocationProp, flags: c_ulonglong) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemMap(ptr: *mut c_void, size: usize, offset: usize, handle: hipMemGenericAllocationHandle_t, flags: c_ulonglong) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemSetAccess(ptr: *mut c_void, size: usize, desc: *const hipMemAccessDesc, count: usize) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemUnmap(ptr: *mut c_void, size: usize) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemRelease(handle: hipMemGenericAllocationHandle_t) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemExportToShareableHandle(shareable: *mut c_void, handle: hipMemGenericAllocationHandle_t, kind: hipMemAllocationHandleType, flags: c_ulonglong) -> hipError_t = MISSING;
    // Beside the allocator (tests, embedders): filling memory, and
    // capturing a stream into a graph and launching it.
    optional "hip_4.2" fn hipMemsetAsync(dst: *mut c_void, value: c_int, bytes: usize, stream: hipStream_t) -> hipError_t = MISSING;
    optional "hip_4.3" fn hipStreamBeginCapture(stream: hipStream_t, mode: hipStreamCaptureMode) -> hipError_t = MISSING;
    optional "hip_4.3" fn hipStreamEndCapture(stream: hipStream_t, graph: *mut hipGraph_t) -> hipError_t = MISSING;
    optional "hip_4.3" fn hipGraphInstantiate(exec: *mut hipGraphExec_t, graph: hipGraph_t, error_node: *mut hipGraphNode_t, log: *mut c_char, log_size: usize) -> hipError_t = MISSING;
    optional "hip_4.3" fn hipGraphLaunch(exec: hipGraphExec_t, stream: hipStream_t) -> hipError_t = MISSING;
    optional "hip_4.3" fn hipGraphExecDestroy(exec: hipGraphExec_t) -> hipError_t = MISSING;
    optional "hip_4.3" fn hipGraphDestroy(graph: hipGraph_t) -> hipError_t = MISSING;
    optional "hip_5.1" fn hipMemImportFromShareableHandle(handle: *mut hipMemGenericAllocationHandle_t, os_handle: *mut c_void, kind: hipMemAllocationHandleType) -> hipError_t = MISSING;
}

/// The entry point every runtime has, at its first symbol version: how a
/// runtime is told to be versioned, and found already loaded.
const PROBE: (&CStr, &CStr) = (c"hipMalloc", c"hip_4.2");

/// Whether the library gives its entry points symbol versions (every
/// ROCm build does): then a missing version is a missing entry point.
fn versioned(handle: *mut c_void) -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: `handle` is a live handle from dlopen (or RTLD_DEFAULT);
        // both strings are NUL-terminated statics.
        !unsafe { libc::dlvsym(handle, PROBE.0.as_ptr(), PROBE.1.as_ptr()) }.is_null()
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = handle;
        false
    }
}

/// The address of `name` at `version` in the library; for a library
/// without symbol versions (`versioned` false), under its plain name.
fn symbol(handle: *mut c_void, name: &str, version: &str, versioned: bool) -> Option<*mut c_void> {
    let name = CString::new(name).ok()?;
    if versioned {
        #[cfg(target_env = "gnu")]
        {
            let version = CString::new(version).ok()?;
            // SAFETY: `handle` is a live handle from dlopen; both strings
            // are NUL-terminated and outlive the call.
            let p = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
            return (!p.is_null()).then_some(p);
        }
    }
    let _ = version; // no symbol versions: the default one
                     // SAFETY: as above.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The file of a HIP runtime already in the process's global scope, under
/// whatever name it was loaded (a ROCm build of torch's copy, say), found
/// by its entry point: `None` when there is none.
pub fn loaded_runtime() -> Option<String> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: RTLD_DEFAULT searches the global scope; the strings are
        // NUL-terminated statics.
        let p = unsafe { libc::dlvsym(libc::RTLD_DEFAULT, PROBE.0.as_ptr(), PROBE.1.as_ptr()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: an all-zero Dl_info is a valid value (null pointers).
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `p` is an address inside a loaded object; `info` is
        // writable and outlives the call.
        if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dladdr set a NUL-terminated file name of a loaded object.
        Some(
            unsafe { CStr::from_ptr(info.dli_fname) }
                .to_string_lossy()
                .into_owned(),
        )
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

/// The last `dlerror` message.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until
    // the next dl call on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".to_string();
    }
    // SAFETY: non-null and NUL-terminated per the contract above.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Open the first library of `names` that loads (one already in the
/// process first, such as the copy a ROCm build of torch carries, so that
/// the process has one HIP runtime) and resolve the entry points from it.
/// The library stays loaded for the life of the process.
pub fn load(names: &[String]) -> Result<Api, LoadError> {
    let mut reason = String::from("no library name");
    for flags in [
        libc::RTLD_NOW | libc::RTLD_NOLOAD,
        libc::RTLD_NOW | libc::RTLD_LOCAL,
    ] {
        for name in names {
            let Ok(c) = CString::new(name.as_str()) else {
                continue;
            };
            // SAFETY: a NUL-terminated name; loading runs the library's
            // initialisers, as linking it at build time would have.
            let handle = unsafe { libc::dlopen(c.as_ptr(), flags) };
            if handle.is_null() {
                reason = dl_error();
                continue;
            }
            return Api::resolve(handle, name);
        }
    }
    Err(LoadError::NoLibrary {
        tried: names.to_vec(),
        reason,
    })
}

static API: OnceLock<Result<Api, LoadError>> = OnceLock::new();

/// The process's runtime, loaded at the first call: the one already in
/// the process if there is one (unless `CACHEALLOC_HIP_LIBRARY` names
/// another), so that the process has one HIP runtime.
pub fn api() -> Result<&'static Api, &'static LoadError> {
    API.get_or_init(|| {
        if std::env::var_os("CACHEALLOC_HIP_LIBRARY").is_none() {
            if let Some(api) = loaded_runtime().and_then(|path| load(&[path]).ok()) {
                return Ok(api);
            }
        }
        load(&library_names())
    })
    .as_ref()
}

impl Api {
    /// The library the entry points came from.
    pub fn library(&self) -> &str {
        &self.library
    }
}

/// This file's declarations against hip-sys's bindings of the HIP headers
/// (the feature `rocm`, which builds them): the same sizes, layouts and
/// values. Checked when the crate compiles, so every build with the
/// feature (`cargo check`, clippy, the docs) checks them, and a difference
/// is a compile error that names it.
#[cfg(feature = "rocm")]
mod against_hip_sys {
    use super::*;
    use hip_sys::hiprt as h;
    use std::mem::{align_of, offset_of, size_of};

    /// `ours == theirs`, or the build stops naming both.
    macro_rules! same {
        ($($ours:expr => $theirs:expr),* $(,)?) => {
            $(const _: () = assert!(
                $ours == $theirs,
                concat!("backend-hip: ", stringify!($ours), " differs from hip-sys's ", stringify!($theirs))
            );)*
        };
    }

    // The types' layouts.
    same! {
        size_of::<hipIpcMemHandle_t>() => size_of::<h::hipIpcMemHandle_t>(),
        size_of::<hipMemLocation>() => size_of::<h::hipMemLocation>(),
        size_of::<hipMemAccessDesc>() => size_of::<h::hipMemAccessDesc>(),
        size_of::<hipMemAllocationProp>() => size_of::<h::hipMemAllocationProp>(),
        align_of::<hipMemAllocationProp>() => align_of::<h::hipMemAllocationProp>(),
        offset_of!(hipMemAllocationProp, allocFlags) => offset_of!(h::hipMemAllocationProp, allocFlags),
        size_of::<hipError_t>() => size_of::<h::hipError_t>(),
    }

    // The status codes.
    same! {
        hipError_t::hipSuccess.0 => h::hipError_t::hipSuccess as i32,
        hipError_t::hipErrorInvalidValue.0 => h::hipError_t::hipErrorInvalidValue as i32,
        hipError_t::hipErrorOutOfMemory.0 => h::hipError_t::hipErrorOutOfMemory as i32,
        hipError_t::hipErrorNotInitialized.0 => h::hipError_t::hipErrorNotInitialized as i32,
        hipError_t::hipErrorNoDevice.0 => h::hipError_t::hipErrorNoDevice as i32,
        hipError_t::hipErrorNotReady.0 => h::hipError_t::hipErrorNotReady as i32,
        hipError_t::hipErrorPeerAccessAlreadyEnabled.0 => h::hipError_t::hipErrorPeerAccessAlreadyEnabled as i32,
        hipError_t::hipErrorNotSupported.0 => h::hipError_t::hipErrorNotSupported as i32,
        hipError_t::hipErrorStreamCaptureUnsupported.0 => h::hipError_t::hipErrorStreamCaptureUnsupported as i32,
        hipError_t::hipErrorStreamCaptureInvalidated.0 => h::hipError_t::hipErrorStreamCaptureInvalidated as i32,
    }

    // The enums' values and the flags.
    same! {
        hipStreamCaptureStatus::hipStreamCaptureStatusNone.0 => h::hipStreamCaptureStatus::hipStreamCaptureStatusNone as i32,
        hipStreamCaptureStatus::hipStreamCaptureStatusActive.0 => h::hipStreamCaptureStatus::hipStreamCaptureStatusActive as i32,
        hipStreamCaptureMode::hipStreamCaptureModeGlobal.0 => h::hipStreamCaptureMode::hipStreamCaptureModeGlobal as i32,
        hipStreamCaptureMode::hipStreamCaptureModeRelaxed.0 => h::hipStreamCaptureMode::hipStreamCaptureModeRelaxed as i32,
        hipMemcpyKind::hipMemcpyDeviceToDevice.0 => h::hipMemcpyKind::hipMemcpyDeviceToDevice as i32,
        hipMemAllocationType::hipMemAllocationTypePinned.0 => h::hipMemAllocationType::hipMemAllocationTypePinned as i32,
        hipMemAllocationHandleType::hipMemHandleTypePosixFileDescriptor.0
            => h::hipMemAllocationHandleType::hipMemHandleTypePosixFileDescriptor as i32,
        hipMemLocationType::hipMemLocationTypeDevice.0 => h::hipMemLocationType::hipMemLocationTypeDevice as i32,
        hipMemAllocationGranularity_flags::hipMemAllocationGranularityMinimum.0
            => h::hipMemAllocationGranularity_flags::hipMemAllocationGranularityMinimum as i32,
        hipMemAccessFlags::hipMemAccessFlagsProtReadWrite.0 => h::hipMemAccessFlags::hipMemAccessFlagsProtReadWrite as i32,
        hipIpcMemLazyEnablePeerAccess => h::hipIpcMemLazyEnablePeerAccess,
        hipStreamNonBlocking => h::hipStreamNonBlocking,
        hipEventDisableTiming => h::hipEventDisableTiming,
    }
}
