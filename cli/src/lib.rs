//! # cachealloc-cli
//!
//! The library behind the `cachealloc` command: a streaming reader of
//! allocation traces ([`trace`]), their replay through the caching allocator
//! on the simulated device ([`replay`]), validation and statistics
//! ([`check`]), SVG charts ([`plot`]), and the logic of the `trace` fuzz target ([`fuzzing`]).

pub mod check;
mod devices;
pub mod fuzzing;
pub mod human;
pub mod plot;
pub mod replay;
pub mod trace;
