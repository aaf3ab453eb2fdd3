//! The process's settings, read from the environment once, at first use:
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `CACHEALLOC_BACKEND` | `cuda`, `hip`, `mock`, or `auto`: the GPU that is present (CUDA first, then HIP; `cachealloc_backend()` says which) | `auto` |
//! | `CACHEALLOC_CONF` | the allocator settings, in `PYTORCH_CUDA_ALLOC_CONF` syntax | torch's variables in torch's order: `PYTORCH_CUDA_ALLOC_CONF`, (on HIP only: `hip`, or `auto` on an AMD GPU) `PYTORCH_HIP_ALLOC_CONF`, then `PYTORCH_ALLOC_CONF`; the first set wins |
//! | `CACHEALLOC_TORCH_VERSION` | the torch release whose decisions to take (`2.13`, `2.15.0+cu132`; `cachealloc.install()` sets it from `torch.__version__`) | the newest known (2.15) |
//! | `CACHEALLOC_MOCK_CAPACITY` | the simulated device's size: bytes, or with a unit (`4GiB`) | unlimited |
//! | `CACHEALLOC_SLOTS` | block slots per device to start with (88 bytes of host memory each, one per block; doubled whenever they run out) | 65536 |
//! | `CACHEALLOC_HISTORY_CAPACITY` | most memory-history entries a device can keep | 131072 |

use crate::error::Res;
use cachealloc_core::{Config, TorchVersion};
use std::sync::{OnceLock, RwLock};

/// Which kind of device the process's allocators run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BackendKind {
    /// The simulated device of `cachealloc-mock`.
    Mock,
    /// NVIDIA GPUs through the CUDA driver.
    #[cfg(feature = "cuda")]
    Cuda,
    /// AMD GPUs through HIP.
    #[cfg(feature = "hip")]
    Hip,
}

/// The settings.
#[derive(Debug)]
pub(crate) struct Settings {
    /// The backend named; `None`: `auto`, chosen at the first device open
    /// ([`backend_kind`]), so that reading the settings touches no GPU
    /// runtime.
    pub(crate) backend: Option<BackendKind>,
    /// The settings string as given (snapshots show it).
    pub(crate) conf_text: String,
    /// The same, NUL-terminated (`cachealloc_get_allocator_settings`).
    pub(crate) conf_c: std::ffi::CString,
    /// The settings, with the torch release whose decisions and
    /// statistics keys are taken (`config.torch_version()`).
    pub(crate) config: Config,
    pub(crate) mock_capacity: Option<u64>,
    pub(crate) slots: usize,
    pub(crate) history: usize,
}

/// Block slots a device starts with unless `CACHEALLOC_SLOTS` says
/// otherwise (doubled whenever they run out).
pub(crate) const DEFAULT_SLOTS: usize = 1 << 16;

/// History entries per device unless `CACHEALLOC_HISTORY_CAPACITY` says otherwise.
pub(crate) const DEFAULT_HISTORY: usize = 1 << 17;

/// The settings (read once; an error in them is kept and reported by
/// every call that needs a device).
pub(crate) fn settings() -> Res<&'static Settings> {
    if let Some(later) = *LATER.read().unwrap_or_else(|p| p.into_inner()) {
        return Ok(later);
    }
    static SETTINGS: OnceLock<Res<Settings>> = OnceLock::new();
    SETTINGS
        .get_or_init(|| read(&|name| std::env::var(name).ok()))
        .as_ref()
        .map_err(Clone::clone)
}

/// The settings since the latest `cachealloc_set_allocator_settings`
/// (`None`: the environment's). Each is kept for the process's life (a
/// few hundred bytes a call), so that what was handed out of one (the
/// string `cachealloc_get_allocator_settings` points to) stays valid.
static LATER: RwLock<Option<&'static Settings>> = RwLock::new(None);

/// Put the later settings string `text`, parsed as `later`, in force as
/// torch's `_set_allocator_settings` does ([`Config::followed_by`]): for
/// the devices created from now on and for what the settings report. The
/// caller holds device creation off and gives it to the created devices.
pub(crate) fn follow(text: &str, later: Config) -> Res<()> {
    let s = settings()?;
    let next = Settings {
        backend: s.backend,
        conf_text: text.to_string(),
        conf_c: std::ffi::CString::new(text.replace('\0', " ")).unwrap_or_default(),
        config: s.config.followed_by(later),
        mock_capacity: s.mock_capacity,
        slots: s.slots,
        history: s.history,
    };
    *LATER.write().unwrap_or_else(|p| p.into_inner()) = Some(Box::leak(Box::new(next)));
    Ok(())
}

/// The backend the settings name, or (`auto`) the GPU that is present,
/// probed once per process at the first device open (it loads the GPU
/// runtimes, which reading the settings must not).
pub(crate) fn backend_kind(s: &Settings) -> Res<BackendKind> {
    match s.backend {
        Some(kind) => Ok(kind),
        None => probed(),
    }
}

/// The GPU this machine has, probed once per process ([`probe_gpus`]).
fn probed() -> Res<BackendKind> {
    static PROBED: OnceLock<Res<BackendKind>> = OnceLock::new();
    PROBED.get_or_init(probe_gpus).clone()
}

/// The settings from `env` (a variable's value, if set).
fn read(env: &dyn Fn(&str) -> Option<String>) -> Res<Settings> {
    let backend = backend(env("CACHEALLOC_BACKEND").as_deref())?;
    let torch = match env("CACHEALLOC_TORCH_VERSION") {
        Some(s) if !s.trim().is_empty() => TorchVersion::parse(&s).ok_or_else(|| {
            format!("CACHEALLOC_TORCH_VERSION={s:?}: expected a torch version such as 2.13 or 2.15.0+cu132")
        })?,
        _ => TorchVersion::NEWEST,
    };
    // torch's order (c10's AcceleratorAllocatorConfig::instance): the first
    // of these that is set, ours ahead of them; HIP's variable only where
    // the backend is HIP. Under `auto` the GPU is probed for it only when
    // HIP's variable would decide (reading the settings loads no GPU
    // runtime otherwise).
    const ON_HIP: &[&str] = &[
        "CACHEALLOC_CONF",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_HIP_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
    ];
    const ELSEWHERE: &[&str] = &[
        "CACHEALLOC_CONF",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
    ];
    let hip_decides =
        || env("PYTORCH_HIP_ALLOC_CONF").is_some() && ON_HIP[..2].iter().all(|n| env(n).is_none());
    let conf_names: &[&str] = match backend {
        #[cfg(feature = "hip")]
        Some(BackendKind::Hip) => ON_HIP,
        #[cfg(feature = "hip")]
        None if hip_decides() && probed() == Ok(BackendKind::Hip) => ON_HIP,
        _ => ELSEWHERE,
    };
    let (conf_name, conf_text) = conf_names
        .iter()
        .find_map(|n| env(n).map(|v| (*n, v)))
        .unwrap_or(("", String::new()));
    // Every bad value is given as `VARIABLE="value": why`.
    let config = Config::parse_noting(&conf_text, torch, &mut |odd| warn(conf_name, odd))
        .map_err(|e| format!("{conf_name}={conf_text:?}: {e} (read as torch {torch})"))?;
    let mock_capacity = match env("CACHEALLOC_MOCK_CAPACITY") {
        Some(s) if !s.trim().is_empty() => Some(
            cachealloc_snapshot::parse_bytes(&s)
                .map_err(|e| format!("CACHEALLOC_MOCK_CAPACITY={s:?}: {e}"))?,
        ),
        _ => None,
    };
    let count = |name: &str, default: usize, most: usize| -> Res<usize> {
        match env(name) {
            Some(s) if !s.trim().is_empty() => match s.trim().parse::<usize>() {
                Ok(n) if n > most => Err(format!("{name}={s:?}: at most {most}")),
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{name}={s:?}: expected a positive count")),
            },
            _ => Ok(default),
        }
    };
    let slots = count("CACHEALLOC_SLOTS", DEFAULT_SLOTS, u32::MAX as usize)?;
    Ok(Settings {
        backend,
        conf_c: std::ffi::CString::new(conf_text.replace('\0', " ")).unwrap_or_default(),
        conf_text,
        config,
        mock_capacity,
        slots,
        history: count("CACHEALLOC_HISTORY_CAPACITY", DEFAULT_HISTORY, usize::MAX)?,
    })
}

/// Say on stderr, once (the settings are read once a string), that a value
/// of `source`'s string is read as only torch reads it (`20MB` as 20): the
/// string means the same as under torch, which says nothing.
pub(crate) fn warn(source: &str, odd: cachealloc_core::Oddity<'_>) {
    eprintln!("cachealloc: warning: {source}: {odd}");
}

/// The backend a `CACHEALLOC_BACKEND` value names (`None`: the machine's
/// GPU, [`probe_gpus`]).
fn backend(name: Option<&str>) -> Res<Option<BackendKind>> {
    let name = name.map(str::trim).filter(|n| !n.is_empty());
    let given = name.unwrap_or("auto");
    match given.to_ascii_lowercase().as_str() {
        "auto" => Ok(None),
        "mock" => Ok(Some(BackendKind::Mock)),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Some(BackendKind::Cuda)),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err("CACHEALLOC_BACKEND=\"cuda\": this library was built without the `cuda` feature (CACHEALLOC_BACKEND=mock for the simulated device)".to_string()),
        #[cfg(feature = "hip")]
        "hip" => Ok(Some(BackendKind::Hip)),
        #[cfg(not(feature = "hip"))]
        "hip" => Err("CACHEALLOC_BACKEND=\"hip\": this library was built without the `hip` feature (CACHEALLOC_BACKEND=mock for the simulated device)".to_string()),
        _ => Err(format!(
            "CACHEALLOC_BACKEND={given:?}: expected cuda, hip, mock or auto"
        )),
    }
}

/// The GPU this machine has: CUDA's if its driver finds a device, else
/// HIP's; neither is an error naming what each said.
fn probe_gpus() -> Res<BackendKind> {
    let mut why = Vec::new();
    #[cfg(feature = "cuda")]
    match cachealloc_cuda::device_count() {
        Ok(n) if n > 0 => return Ok(BackendKind::Cuda),
        Ok(_) => why.push("CUDA: the driver found no device".to_string()),
        Err(e) => why.push(format!("CUDA: {e}")),
    }
    #[cfg(not(feature = "cuda"))]
    why.push("CUDA: not built in".to_string());
    #[cfg(feature = "hip")]
    match cachealloc_hip::device_count() {
        Ok(n) if n > 0 => return Ok(BackendKind::Hip),
        Ok(_) => why.push("HIP: the runtime found no device".to_string()),
        Err(e) => why.push(format!("HIP: {e}")),
    }
    #[cfg(not(feature = "hip"))]
    why.push("HIP: not built in".to_string());
    Err(format!(
        "no GPU found ({}); CACHEALLOC_BACKEND=mock runs on the simulated device",
        why.join("; ")
    ))
}

impl BackendKind {
    /// The name `CACHEALLOC_BACKEND` gives it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BackendKind::Mock => "mock",
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => "cuda",
            #[cfg(feature = "hip")]
            BackendKind::Hip => "hip",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Res<Settings> {
        read(&|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_and_overrides() {
        let s = with(&[("CACHEALLOC_BACKEND", "mock")]).unwrap();
        assert_eq!(s.backend, Some(BackendKind::Mock));
        assert_eq!(
            (s.slots, s.history, s.mock_capacity),
            (DEFAULT_SLOTS, DEFAULT_HISTORY, None)
        );
        let s = with(&[
            ("CACHEALLOC_BACKEND", "MOCK"),
            ("CACHEALLOC_MOCK_CAPACITY", "4GiB"),
            ("CACHEALLOC_SLOTS", "4096"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
        ])
        .unwrap();
        assert_eq!((s.mock_capacity, s.slots), (Some(4 << 30), 4096));
        assert_eq!(s.config.max_split_size, 64 << 20);
        let s = with(&[
            ("CACHEALLOC_BACKEND", "mock"),
            ("CACHEALLOC_CONF", "expandable_segments:True"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
        ])
        .unwrap();
        assert!(s.config.expandable_segments, "CACHEALLOC_CONF wins");
        assert_eq!(s.config.max_split_size, u64::MAX);
    }

    #[test]
    fn torchs_variables_in_torchs_order() {
        let mock = ("CACHEALLOC_BACKEND", "mock");
        // PYTORCH_ALLOC_CONF alone (what newer launchers set).
        let s = with(&[
            mock,
            (
                "PYTORCH_ALLOC_CONF",
                "expandable_segments:True,large_segment_size_mb:12",
            ),
        ])
        .unwrap();
        assert!(s.config.expandable_segments);
        assert_eq!(s.config.large_segment_size, 12 << 20);
        // PYTORCH_CUDA_ALLOC_CONF first, as torch reads them.
        let s = with(&[
            mock,
            ("PYTORCH_ALLOC_CONF", "max_split_size_mb:128"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
        ])
        .unwrap();
        assert_eq!(s.config.max_split_size, 64 << 20);
        // A bad value names the key and the variable it came from.
        let e = with(&[
            mock,
            ("PYTORCH_ALLOC_CONF", "throw_on_cudamalloc_oom:maybe"),
        ])
        .unwrap_err();
        assert!(
            e.contains("throw_on_cudamalloc_oom") && e.contains("PYTORCH_ALLOC_CONF"),
            "{e}"
        );
        // The torch version decides which keys exist.
        let conf = (
            "PYTORCH_ALLOC_CONF",
            "per_process_memory_fraction:0.4,throw_on_cudamalloc_oom:True",
        );
        assert!(with(&[mock, conf]).unwrap().config.throw_on_cudamalloc_oom);
        let e = with(&[mock, conf, ("CACHEALLOC_TORCH_VERSION", "2.11.0+cu130")]).unwrap_err();
        assert!(
            e.contains("torch 2.12 added it") && e.contains("torch 2.11"),
            "{e}"
        );
        let s = with(&[mock, ("CACHEALLOC_TORCH_VERSION", "2.12.1")]).unwrap();
        assert_eq!(s.config.torch_version(), TorchVersion::V2_12);
        let e = with(&[mock, ("CACHEALLOC_TORCH_VERSION", "latest")]).unwrap_err();
        assert!(e.contains("CACHEALLOC_TORCH_VERSION"), "{e}");
    }

    #[test]
    fn auto_takes_the_gpu_that_is_present_and_says_why_when_none_is() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        // Unset or `auto`: left to the first device open; reading the
        // settings probes nothing.
        for vars in [
            &[][..],
            &[("CACHEALLOC_BACKEND", "auto")][..],
            &[("CACHEALLOC_BACKEND", " AUTO ")][..],
        ] {
            assert_eq!(read(&env(vars)).unwrap().backend, None, "{vars:?}");
        }
        // HIP's variable counts only on HIP: under `auto` on a machine
        // without an AMD GPU (this one) it is not read, as torch's CUDA
        // build does not read it.
        let s = read(&env(&[("PYTORCH_HIP_ALLOC_CONF", "max_split_size_mb:64")])).unwrap();
        if probed() != Ok(BackendKind::Hip) {
            assert_eq!(s.config.max_split_size, u64::MAX);
        }
        let s = read(&env(&[
            ("CACHEALLOC_BACKEND", "hip"),
            ("PYTORCH_HIP_ALLOC_CONF", "max_split_size_mb:64"),
        ]))
        .unwrap();
        assert_eq!(s.config.max_split_size, 64 << 20);
        let s = read(&env(&[("CACHEALLOC_BACKEND", "mock")])).unwrap();
        assert_eq!(backend_kind(&s), Ok(BackendKind::Mock));
        // On this machine (no GPU) the probe names what each runtime said.
        if let Err(e) = probe_gpus() {
            assert!(
                e.starts_with("no GPU found (CUDA: ") && e.contains("; HIP: "),
                "{e}"
            );
            assert!(e.contains("CACHEALLOC_BACKEND=mock"), "{e}");
        }
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        let e = with(&[("CACHEALLOC_BACKEND", "tpu")]).unwrap_err();
        assert!(e.contains("CACHEALLOC_BACKEND"), "{e}");
        let e = with(&[
            ("CACHEALLOC_BACKEND", "mock"),
            ("CACHEALLOC_MOCK_CAPACITY", "lots"),
        ])
        .unwrap_err();
        assert!(e.contains("CACHEALLOC_MOCK_CAPACITY"), "{e}");
        let e = with(&[("CACHEALLOC_BACKEND", "mock"), ("CACHEALLOC_SLOTS", "0")]).unwrap_err();
        assert!(e.contains("CACHEALLOC_SLOTS"), "{e}");
        let e = with(&[
            ("CACHEALLOC_BACKEND", "mock"),
            ("CACHEALLOC_CONF", "bogus:1"),
        ])
        .unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }

    /// A bad value is given as `VARIABLE="value": why`, the variable it
    /// came from first (of the four settings variables, the one read); a
    /// misspelt key with the key it is likely a misspelling of.
    #[test]
    fn a_bad_value_starts_with_its_variable() {
        let mock = ("CACHEALLOC_BACKEND", "mock");
        for var in [
            "CACHEALLOC_CONF",
            "PYTORCH_CUDA_ALLOC_CONF",
            "PYTORCH_ALLOC_CONF",
        ] {
            let e = with(&[mock, (var, "expandable_segment:True")]).unwrap_err();
            assert_eq!(
                e,
                format!(
                    "{var}=\"expandable_segment:True\": allocator config: option `expandable_segment` value `True`: \
                     unknown option (not a key of torch's allocator config); did you mean `expandable_segments`? \
                     (read as torch {})",
                    TorchVersion::NEWEST
                )
            );
        }
        // The one read is named, not one torch would read after it.
        let e = with(&[
            mock,
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:3"),
            ("PYTORCH_ALLOC_CONF", "max_split_size_mb:64"),
        ])
        .unwrap_err();
        assert!(
            e.starts_with("PYTORCH_CUDA_ALLOC_CONF=\"max_split_size_mb:3\": "),
            "{e}"
        );
        for (vars, start) in [
            (
                vec![("CACHEALLOC_BACKEND", "TPU")],
                "CACHEALLOC_BACKEND=\"TPU\": ",
            ),
            (
                vec![mock, ("CACHEALLOC_MOCK_CAPACITY", "lots")],
                "CACHEALLOC_MOCK_CAPACITY=\"lots\": ",
            ),
            (
                vec![mock, ("CACHEALLOC_SLOTS", "0")],
                "CACHEALLOC_SLOTS=\"0\": ",
            ),
            (
                vec![mock, ("CACHEALLOC_SLOTS", "99999999999")],
                "CACHEALLOC_SLOTS=\"99999999999\": at most 4294967295",
            ),
            (
                vec![mock, ("CACHEALLOC_HISTORY_CAPACITY", "-3")],
                "CACHEALLOC_HISTORY_CAPACITY=\"-3\": ",
            ),
            (
                vec![mock, ("CACHEALLOC_TORCH_VERSION", "latest")],
                "CACHEALLOC_TORCH_VERSION=\"latest\": ",
            ),
        ] {
            let e = with(&vars).unwrap_err();
            assert!(e.starts_with(start), "{vars:?}: {e}");
        }
    }
}
