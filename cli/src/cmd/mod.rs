//! The subcommands, one file each: its arguments (`#[derive(Args)]`) and
//! what it does. Each returns the exit status: 0, 1 (the allocator or the
//! device failed), or 2 (bad input).

pub mod advise;
pub mod check;
pub mod compare;
pub mod completions;
pub mod generate;
pub mod import;
pub mod plot;
pub mod replay;

use cachealloc_core::{Config, TorchVersion};
use cachealloc_trace::{Options, TraceError};

/// `--torch-version`.
fn torch_version(s: &str) -> Result<TorchVersion, String> {
    let v = TorchVersion::parse(s).ok_or_else(|| format!("{s:?}: a torch version such as 2.13"))?;
    if !v.is_known() {
        eprintln!(
            "--torch-version {v}: not in cachealloc's table (2.11 to 2.15); taking torch {}'s decisions",
            v.decisions_of()
        );
    }
    Ok(v)
}

/// Replay options with the policy of `--conf` (as torch `torch`'s parser
/// reads it; the newest's without one) and a capacity; a bad `--conf` is
/// printed and gives exit status 2.
fn options(conf: &str, capacity: Option<u64>, torch: Option<TorchVersion>) -> Result<Options, u8> {
    Ok(Options {
        config: parse_conf(conf, torch)?,
        torch,
        conf: conf.to_string(),
        capacity,
        ..Options::default()
    })
}

/// `--conf` as torch `torch`'s parser reads it (the newest's without one);
/// a bad one is printed naming the option (`--conf "...": ...`) and gives
/// exit status 2.
fn parse_conf(conf: &str, torch: Option<TorchVersion>) -> Result<Config, u8> {
    Config::parse_for(conf, torch.unwrap_or(TorchVersion::NEWEST)).map_err(|e| {
        eprintln!("--conf {conf:?}: {e}");
        2
    })
}

/// Print `e`; its exit status: 2 for bad input, 1 for the rest.
fn report_error(e: &TraceError) -> u8 {
    eprintln!("{e}");
    if e.is_bad_input() {
        2
    } else {
        1
    }
}
