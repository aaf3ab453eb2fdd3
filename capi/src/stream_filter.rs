//! Private pools as `torch.cuda.MemPool` uses them
//! (`cachealloc_create_pool`, `cachealloc_pool_use_count`, the options),
//! and `cachealloc_begin_allocate_to_pool_filtered`: route the requests on the
//! streams a caller's filter accepts to a private pool (PyTorch's
//! `beginAllocateToPool(device, id, filter)`, whose filter torch's CUDA
//! graphs use to send only the capturing streams' requests to the graph's
//! pool, and `use_mem_pool` only the current thread's).
//!
//! The core keeps a filter as a `&'static` closure: one is made, and kept
//! for the process's life, per distinct (function, user pointer) pair, so a
//! caller that reuses its user pointers (the C++ allocator for torch keeps
//! a fixed table of them) costs a fixed amount of memory however many pools
//! it routes to.

use crate::backend::{on_device, text};
use crate::error::{status, Res};
use crate::registry;
use cachealloc_core::{MempoolId, SharedAllocator, StreamFilter};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{LazyLock, Mutex};

/// A stream filter: nonzero when requests on `stream` (a `cudaStream_t`)
/// go to the pool; called with the caller's `user` pointer.
#[allow(non_camel_case_types)]
pub type cachealloc_stream_filter = Option<extern "C" fn(*mut c_void, *mut c_void) -> c_int>;

/// A filter function and its user pointer (an integer: the caller's,
/// passed back untouched).
pub(crate) type Filter = (extern "C" fn(*mut c_void, *mut c_void) -> c_int, usize);

/// A boxed closure over one backend's stream type.
type Closure<St> = Box<dyn Fn(St) -> bool + Send + Sync>;

/// The closures made so far, by (function, user, device, stream type).
type Made = HashMap<(usize, usize, c_int, TypeId), &'static (dyn Any + Send + Sync)>;

static MADE: LazyLock<Mutex<Made>> = LazyLock::new(Mutex::default);

/// The core's filter for `f` over streams of type `St`, called under
/// `device`'s lock.
pub(crate) fn stream_filter<St>(f: Option<Filter>, device: c_int) -> StreamFilter<St>
where
    St: Into<u64> + Copy + 'static,
{
    let Some((call, user)) = f else {
        return StreamFilter::All;
    };
    let key = (call as usize, user, device, TypeId::of::<St>());
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let any: &'static (dyn Any + Send + Sync) = *made.entry(key).or_insert_with(|| {
        let closure: Closure<St> = Box::new(move |s: St| {
            let stream = Into::<u64>::into(s) as usize as *mut c_void;
            crate::error::under_lock(device, || call(stream, user as *mut c_void)) != 0
        });
        Box::leak(Box::new(closure))
    });
    match any.downcast_ref::<Closure<St>>() {
        Some(c) => StreamFilter::With(&**c),
        // The key names the type: a closure of another type is never stored under it.
        None => StreamFilter::All,
    }
}

/// `cachealloc_begin_allocate_to_pool` with a stream filter: create private
/// pool `(id0, id1)` (or add a user to it) and send the requests of
/// `device` on the streams `filter(stream, user)` accepts to it until
/// `cachealloc_end_allocate_to_pool` (NULL `filter`: every stream). The
/// newest routing wins where filters overlap. PyTorch's `beginAllocateToPool`
/// as the selected torch release treats it: under torch 2.11 and 2.12 the
/// device is treated as capturing until the end (no driver call that could
/// invalidate a capture; no cache flush for a request that finds no room);
/// from 2.13 a routing alone is no capture, and a graph's capture is marked
/// apart (`cachealloc_mark_capture_begin`).
///
/// The filter is called on the allocating thread while the device's lock
/// is held, at each allocation while the routing lasts: a call into
/// cachealloc from it fails ("called from a callback while device N is
/// locked"). One small record per distinct (filter, user, device) is kept
/// for the process's life. Returns 0, or -1 (already routing to this
/// pool, too many pools).
#[no_mangle]
pub extern "C" fn cachealloc_begin_allocate_to_pool_filtered(
    device: c_int,
    id0: u64,
    id1: u64,
    filter: cachealloc_stream_filter,
    user: *mut c_void,
) -> c_int {
    status(
        "cachealloc_begin_allocate_to_pool_filtered",
        || -> Res<()> {
            let f = filter.map(|f| (f, user as usize));
            on_device!(registry::device(device)?, |a| a
                .begin_allocate_to_pool_torch(MempoolId(id0, id1), stream_filter(f, device))
                .map_err(text))
        },
    )
}
