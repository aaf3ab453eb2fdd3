//! The C functions made from the operation table (core's `operations.rs`):
//! each `c` clause of an entry is one function here, its documentation and
//! parameters as the table gives them, its body "the device, the arguments,
//! the operation, the status". The header has them as cbindgen makes them
//! of [`cachealloc_core::OPERATIONS`] (the test `header`).

use crate::backend::{on_device, text};
use crate::error::{guard, status};
use crate::registry;
// What the table's C clauses name.
use cachealloc_core::{DevicePtr, MempoolId, PoolOptions, SharedAllocator, StreamFilter};
use std::ffi::{c_int, c_void};

/// The device a C clause names, as `a`, for `body`.
macro_rules! on_selected {
    (device($d:expr), |$a:ident| $body:expr) => {
        on_device!(registry::device($d)?, |$a| $body)
    };
    (owner($p:expr), |$a:ident| $body:expr) => {
        on_device!(registry::owner($p)?, |$a| $body)
    };
    (each($d:expr), |$a:ident| $body:expr) => {
        registry::each($d, |d| on_device!(d, |$a| $body))
    };
}

/// One C function of the table.
macro_rules! shim {
    ($(#[doc = $doc:literal])* status $name:ident($($arg:ident: $ty:ty),*)
        on $sel:ident($dev:expr) => $op:ident($($call:expr),*)) => {
        $(#[doc = $doc])*
        #[no_mangle]
        #[allow(unused_variables)]
        pub extern "C" fn $name($($arg: $ty),*) -> c_int {
            status(stringify!($name), || {
                on_selected!($sel($dev), |a| a.$op($($call),*).map(|_| ()).map_err(text))
            })
        }
    };
    ($(#[doc = $doc:literal])* void $name:ident($($arg:ident: $ty:ty),*)
        on $sel:ident($dev:expr) => $op:ident($($call:expr),*)) => {
        $(#[doc = $doc])*
        #[no_mangle]
        #[allow(unused_variables)]
        pub extern "C" fn $name($($arg: $ty),*) {
            guard(stringify!($name), (), || {
                on_selected!($sel($dev), |a| a.$op($($call),*).map(|_| ()).map_err(text))
            })
        }
    };
    ($(#[doc = $doc:literal])* value($rt:ty, $failed:expr) $name:ident($($arg:ident: $ty:ty),*)
        on $sel:ident($dev:expr) => $op:ident($($call:expr),*)) => {
        $(#[doc = $doc])*
        #[no_mangle]
        #[allow(unused_variables)]
        pub extern "C" fn $name($($arg: $ty),*) -> $rt {
            guard(stringify!($name), $failed, || {
                on_selected!($sel($dev), |a| a.$op($($call),*).map(<$rt>::from).map_err(text))
            })
        }
    };
}

cachealloc_core::operations!([c_shims shim]);
