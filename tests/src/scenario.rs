//! The PyTorch-parity scenarios of the test data's `conformance/`: loading
//! (the JSON file and every ```json block of the Markdown file, which has
//! more) and running them against the core on any harness.

use crate::harness::{Harness, Logged};
use cachealloc_core::{
    Allocation, BlockSlot, BlockState, Config, DeviceAllocator, DevicePtr, MempoolId, PoolOptions,
    StreamFilter, TorchVersion,
};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// Every scenario of `data/conformance/` (a test-data folder): those of
/// `scenarios.json`, then the ```json blocks of `scenarios.md` whose names
/// are not in it. Either file may be missing, not both.
pub fn load_all(data: &Path) -> Result<Vec<Value>, String> {
    load_suite(data, "scenarios")
}

/// The scenarios of one suite of `data/conformance/`: `{suite}.json`, then
/// the ```json blocks of `{suite}.md` whose names are not in it (`scenarios`:
/// PyTorch's policy; `pools`: private pools). Either file may be missing,
/// not both.
pub fn load_suite(data: &Path, suite: &str) -> Result<Vec<Value>, String> {
    let dir = data.join("conformance");
    let read = |name: &str| match std::fs::read_to_string(dir.join(name)) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", dir.join(name).display())),
    };
    let (json, md) = (
        read(&format!("{suite}.json"))?,
        read(&format!("{suite}.md"))?,
    );
    if json.is_none() && md.is_none() {
        return Err(format!(
            "{}: neither {suite}.json nor {suite}.md",
            dir.display()
        ));
    }
    let mut all: Vec<Value> = match json {
        Some(text) => serde_json::from_str(&text).map_err(|e| format!("{suite}.json: {e}"))?,
        None => Vec::new(),
    };
    for block in md.as_deref().unwrap_or("").split("```json\n").skip(1) {
        let body = block.split("```").next().unwrap_or("");
        let v: Value = serde_json::from_str(body).map_err(|e| format!("{suite}.md block: {e}"))?;
        let name = v.get("scenario").cloned();
        if name.is_some() && !all.iter().any(|s| s.get("scenario") == name.as_ref()) {
            all.push(v);
        }
    }
    Ok(all)
}

/// The distinct scenario names in the files of `data/conformance/`, found by
/// a plain text scan (not by the loader): what the loader must find.
pub fn names_in_files(data: &Path) -> std::collections::BTreeSet<String> {
    names_in_suite(data, "scenarios")
}

/// [`names_in_files`] for one suite.
pub fn names_in_suite(data: &Path, suite: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for f in [format!("{suite}.json"), format!("{suite}.md")] {
        let text = std::fs::read_to_string(data.join("conformance").join(f)).unwrap_or_default();
        for part in text.split("\"scenario\"").skip(1) {
            let rest = part.trim_start().trim_start_matches(':').trim_start();
            if let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// A scenario op, decoded.
#[derive(Clone, Debug)]
pub enum Step {
    /// `next_malloc_at`: the device's next malloc returns this address (a
    /// simulated device; real drivers hand out addresses in no fixed order).
    NextMallocAt(u64),
    /// `alloc` (`must_oom`: `alloc_oom`).
    Alloc {
        name: String,
        size: u64,
        stream: u64,
        must_oom: bool,
    },
    /// `alloc_at NAME SIZE BASE OFFSET [STREAM]`: `malloc_with_address` at
    /// the address allocation `BASE` had plus `OFFSET`;
    /// `alloc_at_error NAME SIZE BASE OFFSET STREAM TEXT`: it must fail
    /// with an error containing `TEXT`.
    AllocAt {
        name: String,
        size: u64,
        base: String,
        offset: u64,
        stream: u64,
        error: Option<String>,
    },
    /// `free`.
    Free { name: String },
    /// `record_stream`.
    RecordStream { name: String, stream: u64 },
    /// `sync`.
    Sync { stream: Option<u64> },
    /// `empty_cache`.
    EmptyCache,
    /// `set_memory_fraction`.
    SetMemoryFraction(f64),
    /// `config`.
    Config(String),
    /// `reset_peak`.
    ResetPeak,
    /// `pool_create P {use_on_oom, no_split}`.
    PoolCreate { pool: String, options: PoolOptions },
    /// `pool_begin P S` (`capture`: `capture_begin P S`).
    PoolBegin {
        pool: String,
        streams: Streams,
        capture: bool,
    },
    /// `pool_end P` (`capture`: `capture_end P`).
    PoolEnd { pool: String, capture: bool },
    /// `pool_release P`.
    PoolRelease { pool: String },
    /// `pool_empty_cache P`.
    PoolEmptyCache { pool: String },
    /// `expect`.
    Expect(serde_json::Map<String, Value>),
}

/// A routing's stream filter in the scenarios: every stream, or a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Streams {
    /// `"all"`.
    All,
    /// One stream, or a capture's streams.
    These(Vec<u64>),
}

fn streams(v: &Value) -> Result<Streams, String> {
    match v {
        Value::String(s) if s == "all" => Ok(Streams::All),
        Value::Array(a) => Ok(Streams::These(a.iter().map(u).collect::<Result<_, _>>()?)),
        v => Ok(Streams::These(vec![u(v)?])),
    }
}

/// Setup and steps of one scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// Device capacity.
    pub capacity: Option<u64>,
    /// Config string in force from the start.
    pub conf: String,
    /// The torch releases whose decisions the expectations are (setup's
    /// `torch`: one version or a list); empty: every release known.
    pub torch: Vec<TorchVersion>,
    /// The ops, the final `expect` last.
    pub steps: Vec<Step>,
}

impl Scenario {
    /// The releases to run it under: its own, else every one known.
    pub fn versions(&self) -> Vec<TorchVersion> {
        if self.torch.is_empty() {
            TorchVersion::KNOWN.to_vec()
        } else {
            self.torch.clone()
        }
    }
}

fn u(v: &Value) -> Result<u64, String> {
    v.as_u64()
        .ok_or_else(|| format!("expected an unsigned integer, got {v}"))
}

fn s(v: &Value) -> Result<String, String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("expected a string, got {v}"))
}

/// Decode a scenario object.
pub fn parse(v: &Value) -> Result<Scenario, String> {
    let name = s(&v["scenario"])?;
    let setup = v.get("setup");
    let capacity = setup.and_then(|x| x.get("capacity")).map(u).transpose()?;
    let conf = setup
        .and_then(|x| x.get("conf"))
        .map(s)
        .transpose()?
        .unwrap_or_default();
    let version = |v: &Value| {
        v.as_str()
            .and_then(TorchVersion::parse)
            .ok_or_else(|| format!("torch: expected a version such as \"2.13\", got {v}"))
    };
    let torch = match setup.and_then(|x| x.get("torch")) {
        None => Vec::new(),
        Some(Value::Array(vs)) => vs.iter().map(version).collect::<Result<_, _>>()?,
        Some(v) => vec![version(v)?],
    };
    let mut steps = Vec::new();
    for op in v["ops"].as_array().ok_or("ops must be a list")? {
        let a = op.as_array().ok_or("op must be a list")?;
        let kind = a.first().and_then(Value::as_str).ok_or("op kind")?;
        let stream = |i: usize| a.get(i).map(u).transpose().map(|x| x.unwrap_or(0));
        steps.push(match kind {
            "alloc" | "alloc_oom" => Step::Alloc {
                name: s(&a[1])?,
                size: u(&a[2])?,
                stream: stream(3)?,
                must_oom: kind == "alloc_oom",
            },
            "alloc_at" | "alloc_at_error" => Step::AllocAt {
                name: s(&a[1])?,
                size: u(&a[2])?,
                base: s(&a[3])?,
                offset: u(&a[4])?,
                stream: stream(5)?,
                error: if kind == "alloc_at_error" {
                    Some(s(a.get(6).ok_or("alloc_at_error: the error text")?)?)
                } else {
                    None
                },
            },
            "free" => Step::Free { name: s(&a[1])? },
            "record_stream" => Step::RecordStream {
                name: s(&a[1])?,
                stream: u(&a[2])?,
            },
            "sync" => Step::Sync {
                stream: a.get(1).map(u).transpose()?,
            },
            "empty_cache" => Step::EmptyCache,
            "set_memory_fraction" => Step::SetMemoryFraction(a[1].as_f64().ok_or("fraction")?),
            "next_malloc_at" => Step::NextMallocAt(u(&a[1])?),
            "config" => Step::Config(s(&a[1])?),
            "reset_peak" => Step::ResetPeak,
            "pool_create" => {
                let o = a.get(2);
                let flag =
                    |k: &str| o.and_then(|o| o.get(k)).and_then(Value::as_bool) == Some(true);
                let mut options = PoolOptions::NONE;
                if flag("use_on_oom") {
                    options = options.use_on_oom();
                }
                if flag("no_split") {
                    options = options.no_split();
                }
                Step::PoolCreate {
                    pool: s(&a[1])?,
                    options,
                }
            }
            "pool_begin" | "capture_begin" => Step::PoolBegin {
                pool: s(&a[1])?,
                streams: streams(&a[2])?,
                capture: kind == "capture_begin",
            },
            "pool_end" | "capture_end" => Step::PoolEnd {
                pool: s(&a[1])?,
                capture: kind == "capture_end",
            },
            "pool_release" => Step::PoolRelease { pool: s(&a[1])? },
            "pool_empty_cache" => Step::PoolEmptyCache { pool: s(&a[1])? },
            "expect" => Step::Expect(a[1].as_object().ok_or("expect object")?.clone()),
            other => return Err(format!("unknown op {other}")),
        });
    }
    if let Some(e) = v.get("expect") {
        steps.push(Step::Expect(e.as_object().ok_or("expect object")?.clone()));
    }
    Ok(Scenario {
        name,
        capacity,
        conf,
        torch,
        steps,
    })
}

/// The allocator a scenario drives on harness `H`.
pub type HarnessAllocator<H> = DeviceAllocator<Logged<<H as Harness>::B>, Box<[BlockSlot]>, 256>;

/// Whether `sc` chooses where the device's mallocs land (`next_malloc_at`).
pub fn needs_placement(sc: &Scenario) -> bool {
    sc.steps.iter().any(|s| matches!(s, Step::NextMallocAt(_)))
}

/// Whether scenario `sc` can run on harness `h`: capacities and memory
/// fractions need a simulated device, event timing (record_stream) a
/// device whose stream work completes only when told, and placed mallocs
/// a device that can place them.
pub fn runnable<H: Harness>(h: &H, sc: &Scenario) -> bool {
    let needs_capacity = sc.capacity.is_some()
        || sc
            .steps
            .iter()
            .any(|s| matches!(s, Step::SetMemoryFraction(_) | Step::NextMallocAt(_)));
    if needs_placement(sc) && !h.places_mallocs() {
        return false;
    }
    let needs_timing = sc
        .steps
        .iter()
        .any(|s| matches!(s, Step::RecordStream { .. }));
    (h.simulated() || !needs_capacity) && (h.deterministic() || !needs_timing)
}

/// The state of a running scenario.
pub struct Run<'h, H: Harness> {
    /// The device.
    pub harness: &'h H,
    /// The allocator.
    pub alloc: HarnessAllocator<H>,
    /// Live allocations by name.
    pub names: HashMap<String, Allocation>,
    /// The address each name was last given (kept after its free).
    pub addresses: HashMap<String, u64>,
    /// The message of the last OOM.
    pub last_oom: Option<String>,
    /// Allocations whose name was reused while they were live (only after a
    /// failed op, under fault injection); kept so teardown frees them.
    pub orphans: Vec<Allocation>,
    /// Pool ids by name: `(0, k)` for the k-th name seen.
    pub pools: Vec<String>,
    /// Captures under way in the device's model: pool name, streams.
    pub capturing: Vec<(String, Vec<u64>)>,
}

impl<'h, H: Harness> Run<'h, H> {
    /// A fresh run of `sc` on `harness` with `slots` block slots, taking
    /// the decisions of the first release it names (the newest if none).
    pub fn new(harness: &'h H, sc: &Scenario, slots: usize) -> Result<Self, String> {
        let torch = sc.torch.first().copied().unwrap_or(TorchVersion::NEWEST);
        Self::under(harness, sc, slots, torch)
    }

    /// [`Run::new`] under torch `torch`'s decisions.
    pub fn under(
        harness: &'h H,
        sc: &Scenario,
        slots: usize,
        torch: TorchVersion,
    ) -> Result<Self, String> {
        let config = Config::parse_for(&sc.conf, torch).map_err(|e| e.to_string())?;
        let backend = harness.open(sc.capacity)?;
        Ok(Run {
            harness,
            alloc: DeviceAllocator::with_events(
                Logged::new(backend),
                vec![BlockSlot::VACANT; slots].into_boxed_slice(),
                config,
            ),
            names: HashMap::new(),
            addresses: HashMap::new(),
            last_oom: None,
            orphans: Vec::new(),
            pools: Vec::new(),
            capturing: Vec::new(),
        })
    }

    /// The id of pool `name` (`(0, k)`, given at first sight).
    pub fn pool_id(&mut self, name: &str) -> MempoolId {
        let k = match self.pools.iter().position(|p| p == name) {
            Some(k) => k,
            None => {
                self.pools.push(name.to_string());
                self.pools.len() - 1
            }
        };
        MempoolId(0, k as u64 + 1)
    }

    /// The name of pool `id` (`"default"` for the default pools).
    fn pool_name(&self, id: MempoolId) -> String {
        if id.is_default() {
            return "default".to_string();
        }
        self.pools
            .get(id.1 as usize - 1)
            .cloned()
            .unwrap_or_else(|| format!("{id:?}"))
    }

    /// Execute one non-`expect` step. `Err` carries the allocator's error text.
    pub fn step(&mut self, step: &Step) -> Result<(), String> {
        let h = self.harness;
        let a = &mut self.alloc;
        match step {
            Step::Alloc {
                name,
                size,
                stream,
                must_oom,
            } => match a.malloc(*size, h.stream(*stream)) {
                Ok(x) => {
                    self.addresses.insert(name.clone(), x.ptr.0);
                    if let Some(old) = self.names.insert(name.clone(), x) {
                        self.orphans.push(old);
                    }
                    if *must_oom {
                        return Err(format!("{name}: expected out of memory, got {x:?}"));
                    }
                }
                Err(e) if e.is_out_of_memory() => {
                    self.last_oom = Some(e.to_string());
                    // The name no longer stands for an earlier allocation
                    // (one left live by a failed op): teardown frees that.
                    if let Some(old) = self.names.remove(name) {
                        self.orphans.push(old);
                    }
                    return Err(e.to_string());
                }
                Err(e) => return Err(e.to_string()),
            },
            Step::AllocAt {
                name,
                size,
                base,
                offset,
                stream,
                error,
            } => {
                let at = self
                    .addresses
                    .get(base)
                    .ok_or_else(|| format!("alloc_at: unknown name {base}"))?
                    + offset;
                match (
                    a.malloc_with_address(*size, DevicePtr(at), h.stream(*stream)),
                    error,
                ) {
                    (Ok(x), None) => {
                        self.addresses.insert(name.clone(), x.ptr.0);
                        if let Some(old) = self.names.insert(name.clone(), x) {
                            self.orphans.push(old);
                        }
                    }
                    (Ok(x), Some(want)) => {
                        self.names.insert(format!("{name} (unexpected)"), x);
                        return Err(format!(
                            "{name}: expected an error with {want:?}, got {x:?}"
                        ));
                    }
                    (Err(e), Some(want)) if e.to_string().contains(want.as_str()) => {}
                    (Err(e), _) => return Err(e.to_string()),
                }
            }
            Step::Free { name } => {
                let x = self
                    .names
                    .get(name)
                    .ok_or_else(|| format!("free of unknown name {name}"))?;
                a.free_ptr(x.ptr).map_err(|e| e.to_string())?;
                self.names.remove(name);
            }
            Step::RecordStream { name, stream } => {
                let x = self
                    .names
                    .get(name)
                    .ok_or_else(|| format!("record_stream of unknown name {name}"))?;
                a.record_stream_ptr(x.ptr, h.stream(*stream))
                    .map_err(|e| e.to_string())?;
            }
            Step::Sync { stream } => h.finish(&mut a.backend_mut().inner, *stream),
            Step::EmptyCache => a.empty_cache().map_err(|e| e.to_string())?,
            Step::SetMemoryFraction(f) => a.set_memory_fraction(*f).map_err(|e| e.to_string())?,
            Step::NextMallocAt(addr) => {
                if !self
                    .harness
                    .place_next_malloc(&mut a.backend_mut().inner, *addr)
                {
                    return Err("next_malloc_at: this device cannot place mallocs".into());
                }
            }
            Step::Config(c) => a.set_config(
                Config::parse_for(c, a.config().torch_version()).map_err(|e| e.to_string())?,
            ),
            Step::ResetPeak => a.reset_peak_stats(),
            Step::PoolCreate { pool, options } => {
                let id = self.pool_id(pool);
                self.alloc
                    .create_pool(id, *options)
                    .map_err(|e| e.to_string())?;
            }
            Step::PoolBegin {
                pool,
                streams,
                capture,
            } => {
                let id = self.pool_id(pool);
                let filter = match streams {
                    Streams::All => StreamFilter::All,
                    Streams::These(list) => {
                        let list: Vec<_> = list.iter().map(|&s| h.stream(s)).collect();
                        StreamFilter::streams(&list).ok_or("1 to 4 streams")?
                    }
                };
                let a = &mut self.alloc;
                if *capture {
                    // As `torch.cuda.graph`: the allocator first, then the
                    // runtime begins capturing (the device model then
                    // refuses what the driver refuses during a capture).
                    a.capture_begin(id, filter).map_err(|e| e.to_string())?;
                    let ks = match streams {
                        Streams::All => Vec::new(),
                        Streams::These(list) => list.clone(),
                    };
                    for &k in &ks {
                        h.begin_capture(&mut a.backend_mut().inner, k)?;
                    }
                    self.capturing.push((pool.clone(), ks));
                } else {
                    // `beginAllocateToPool` as the release treats it: a
                    // capture context under 2.11 and 2.12, a routing alone
                    // from 2.13 (conformance/versions.md, V05).
                    a.begin_allocate_to_pool_torch(id, filter)
                        .map_err(|e| e.to_string())?;
                }
            }
            Step::PoolEnd { pool, capture } => {
                let id = self.pool_id(pool);
                if *capture {
                    self.end_capture_of(pool)?;
                    self.alloc.capture_end(id)
                } else {
                    self.alloc.end_allocate_to_pool(id)
                }
                .map_err(|e| e.to_string())?;
            }
            Step::PoolRelease { pool } => {
                let id = self.pool_id(pool);
                self.alloc.release_pool(id).map_err(|e| e.to_string())?;
            }
            Step::PoolEmptyCache { pool } => {
                let id = self.pool_id(pool);
                self.alloc.empty_cache_pool(id).map_err(|e| e.to_string())?;
            }
            Step::Expect(_) => {}
        }
        Ok(())
    }

    /// The value of a pool key (`pool:P.x`, `live_in_pool:P`, `pool_of:NAME`),
    /// `None` for other keys.
    fn pool_key(&mut self, k: &str) -> Option<Value> {
        if let Some(rest) = k.strip_prefix("pool:") {
            let (name, field) = rest.rsplit_once('.')?;
            let id = self.pool_id(name);
            let info = self.alloc.pool_info(id);
            return Some(match field {
                "use_count" => self.alloc.pool_use_count(id).into(),
                "exists" => info.is_some().into(),
                "segments" => info.map_or(0, |p| p.segments).into(),
                "reserved_bytes" => info.map_or(0, |p| p.reserved_bytes).into(),
                _ => Value::Null,
            });
        }
        if let Some(name) = k.strip_prefix("live_in_pool:") {
            let id = self.pool_id(name);
            let n: usize = self
                .alloc
                .segments()
                .filter(|s| s.pool_id == id)
                .map(|s| {
                    s.blocks()
                        .filter(|b| b.state == BlockState::ActiveAllocated)
                        .count()
                })
                .sum();
            return Some(n.into());
        }
        if let Some(name) = k.strip_prefix("pool_of:") {
            let x = self.names.get(name)?;
            let id = self.alloc.allocation_info_ptr(x.ptr).ok()?.pool;
            return Some(self.pool_name(id).into());
        }
        None
    }

    /// Every allocation the run still holds.
    pub fn live(&self) -> Vec<DevicePtr> {
        self.names
            .values()
            .chain(&self.orphans)
            .map(|x| x.ptr)
            .collect()
    }

    /// Check an `expect` map; one line per mismatch.
    pub fn check(
        &mut self,
        expect: &serde_json::Map<String, Value>,
        where_: &str,
        out: &mut Vec<String>,
    ) {
        for (k, want) in expect {
            if let Some(got) = self.pool_key(k) {
                if &got != want {
                    out.push(format!("{where_}: {k} expected {want} got {got}"));
                }
                continue;
            }
            let a = &self.alloc;
            if let Some(name) = k.strip_prefix("at:") {
                let got = self.names.get(name).and_then(|x| {
                    let (seg, off) = a.backend().locate(x.ptr)?;
                    let size = a.allocation_info_ptr(x.ptr).ok()?.size;
                    Some(serde_json::json!([seg, off, size]))
                });
                if got.as_ref() != Some(want) {
                    out.push(format!("{where_}: {k} expected {want} got {got:?}"));
                }
            } else if k == "oom_message_contains" {
                let msg = self.last_oom.clone().unwrap_or_default();
                let subs: Vec<&Value> = match want {
                    Value::Array(v) => v.iter().collect(),
                    v => vec![v],
                };
                for sub in subs {
                    if !msg.contains(sub.as_str().unwrap_or("\u{0}")) {
                        out.push(format!("{where_}: OOM message lacks {sub}: {msg:?}"));
                    }
                }
            } else {
                let got = a.stats().get(k);
                if got.is_none() || Some(want) != got.map(Value::from).as_ref() {
                    out.push(format!("{where_}: {k} expected {want} got {got:?}"));
                }
            }
        }
    }

    /// End every routing and capture, and release every pool to use count
    /// 0: pools in use keep their memory, so a teardown starts here.
    pub fn end_pools(&mut self) -> Result<(), String> {
        // Every capture is ended, even after one reports an error.
        let mut ended = Ok(());
        while let Some((pool, _)) = self.capturing.last().cloned() {
            let r = self.end_capture_of(&pool);
            if ended.is_ok() {
                ended = r;
            }
        }
        ended?;
        for k in 0..self.pools.len() {
            let id = MempoolId(0, k as u64 + 1);
            let _ = self.alloc.end_allocate_to_pool(id);
            while self.alloc.pool_use_count(id) > 0 {
                self.alloc.release_pool(id).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// The runtime ends the capture into `pool` on every stream it began
    /// on: an error if a call made meanwhile invalidated it.
    fn end_capture_of(&mut self, pool: &str) -> Result<(), String> {
        let Some(k) = self.capturing.iter().position(|(p, _)| p == pool) else {
            return Ok(());
        };
        let (_, ks) = self.capturing.remove(k);
        let h = self.harness;
        let mut ended = Ok(());
        for k in ks {
            let r = h
                .end_capture(&mut self.alloc.backend_mut().inner, k)
                .map_err(|e| format!("the capture of stream {k} into pool {pool}: {e}"));
            if ended.is_ok() {
                ended = r;
            }
        }
        ended
    }

    /// Free what is live, wait for all streams, empty the cache and drop the
    /// idle events: afterwards the device must hold nothing.
    pub fn release_all(&mut self) -> Result<(), String> {
        self.end_pools()?;
        let live = self.live();
        self.names.clear();
        self.orphans.clear();
        let h = self.harness;
        crate::release_everything(&mut self.alloc, live, |b| h.finish(&mut b.inner, None))?;
        let b = self.alloc.backend();
        if b.held != 0 || b.event_creates != b.event_destroys || b.reservations != 0 {
            return Err(format!(
                "{} still holds {} bytes, {} events and {} reservations",
                h.name(),
                b.held,
                b.event_creates - b.event_destroys,
                b.reservations
            ));
        }
        Ok(())
    }
}

/// Run a scenario on `harness`, checking every expectation and the
/// invariants after every op, then release everything. Returns the
/// mismatches (empty: pass).
pub fn run<H: Harness>(harness: &H, sc: &Scenario) -> Vec<String> {
    let torch = sc.torch.first().copied().unwrap_or(TorchVersion::NEWEST);
    run_under(harness, sc, torch)
}

/// [`run`] under every release the scenario names (every one known when
/// it names none); each failure says under which.
pub fn run_every_version<H: Harness>(harness: &H, sc: &Scenario) -> Vec<String> {
    sc.versions()
        .into_iter()
        .flat_map(|v| {
            run_under(harness, sc, v)
                .into_iter()
                .map(move |f| format!("torch {v}: {f}"))
        })
        .collect()
}

/// [`run`] under torch `torch`'s decisions.
pub fn run_under<H: Harness>(harness: &H, sc: &Scenario, torch: TorchVersion) -> Vec<String> {
    let mut out = Vec::new();
    let mut r = match Run::under(harness, sc, 4096, torch) {
        Ok(r) => r,
        Err(e) => return vec![e],
    };
    for (n, step) in sc.steps.iter().enumerate() {
        let where_ = format!("op {n} {step:?}");
        if let Step::Expect(e) = step {
            r.check(e, &where_, &mut out);
            continue;
        }
        let res = r.step(step);
        let expected_oom = matches!(step, Step::Alloc { must_oom: true, .. });
        match res {
            Err(e) if !(expected_oom && r.last_oom.as_deref() == Some(e.as_str())) => {
                out.push(format!("{where_}: {e}"))
            }
            _ => {}
        }
        if let Err(v) = r.alloc.check_invariants() {
            out.push(format!("{where_}: {v}"));
        }
    }
    if let Err(e) = r.release_all() {
        out.push(format!("release: {e}"));
    }
    out
}
