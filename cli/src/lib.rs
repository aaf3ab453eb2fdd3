//! # cachealloc-cli
//!
//! The library part of the `cachealloc` command: byte and count formatting
//! ([`human`]) and SVG charts ([`plot`]). Traces, their validation and
//! replay are the `cachealloc-trace` crate; the subcommands are in the
//! binary (`src/cmd/`).

pub mod human;
pub mod plot;
