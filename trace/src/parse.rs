//! Parsing one line of a trace: the header, or an event. Every error says
//! which field is wrong and why.

use crate::error::Reason;
use crate::event::{Event, Header, MallocAddresses, PoolId, Streams};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// An integer field as found: a non-negative integer, or why not.
enum Int {
    Ok(u64),
    Bad(&'static str),
}

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Int, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Int;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                Ok(Int::Ok(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(if v >= 0 {
                    Int::Ok(v as u64)
                } else {
                    Int::Bad("is negative")
                })
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Int, E> {
                Ok(Int::Bad("is not an integer"))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Int, E> {
                Ok(Int::Bad("is a boolean, not an integer"))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Int, E> {
                Ok(Int::Bad("is a string, not an integer"))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Int, E> {
                Ok(Int::Bad("is null, not an integer"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Int, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Int::Bad("is an object, not an integer"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Int, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Int::Bad("is a list, not an integer"))
            }
        }
        d.deserialize_any(V)
    }
}

/// Any JSON value, kept for the fields of the pool ops (which are rare: the
/// hot path parses no `Value`).
#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(borrow)]
    op: Option<Cow<'a, str>>,
    id: Option<Int>,
    size: Option<Int>,
    stream: Option<Int>,
    device: Option<Int>,
    pool: Option<serde_json::Value>,
    streams: Option<serde_json::Value>,
    use_on_oom: Option<serde_json::Value>,
    no_split: Option<serde_json::Value>,
}

/// `pool`: a pair of non-negative integers, not both 0.
fn pool_field(v: Option<serde_json::Value>) -> Result<PoolId, String> {
    const SHAPE: &str = "`pool` must be a pair of non-negative integers [a, b], not [0, 0]";
    let v = v.ok_or("missing `pool`")?;
    let pair = match v.as_array().map(Vec::as_slice) {
        Some([a, b]) => (a.as_u64().ok_or(SHAPE)?, b.as_u64().ok_or(SHAPE)?),
        _ => return Err(SHAPE.to_string()),
    };
    if pair == (0, 0) {
        return Err(SHAPE.to_string());
    }
    Ok(pair)
}

/// `streams`: `"all"`, a stream, or a list of 1 to 4 streams.
fn streams_field(v: Option<serde_json::Value>) -> Result<Streams, String> {
    const SHAPE: &str =
        "`streams` must be \"all\", a non-negative integer, or a list of 1 to 4 of them";
    let v = v.ok_or("missing `streams`")?;
    let items: Vec<serde_json::Value> = match v {
        serde_json::Value::String(s) if s == "all" => return Ok(Streams::All),
        serde_json::Value::Array(a) => a,
        n @ serde_json::Value::Number(_) => vec![n],
        _ => return Err(SHAPE.to_string()),
    };
    if items.is_empty() || items.len() > 4 {
        return Err(SHAPE.to_string());
    }
    let mut list = [0u64; 4];
    for (k, x) in items.iter().enumerate() {
        list[k] = x.as_u64().ok_or(SHAPE)?;
    }
    Ok(Streams::List {
        list,
        len: items.len() as u8,
    })
}

/// An optional boolean field.
fn flag(v: Option<serde_json::Value>, key: &str) -> Result<bool, String> {
    match v {
        None => Ok(false),
        Some(serde_json::Value::Bool(b)) => Ok(b),
        Some(_) => Err(format!("`{key}` must be true or false")),
    }
}

fn field(v: Option<Int>, key: &str, required: bool) -> Result<Option<u64>, String> {
    match v {
        Some(Int::Ok(x)) => Ok(Some(x)),
        Some(Int::Bad(why)) => Err(format!("`{key}` {why}; it must be a non-negative integer")),
        None if required => Err(format!("missing `{key}`")),
        None => Ok(None),
    }
}

/// Parse one event line (not the header): the plain shapes by hand
/// (`fast_parse.rs`), anything else through serde.
pub fn parse_event(line: &[u8]) -> Result<Event, Reason> {
    match crate::fast_parse::plain_event(line) {
        Some(e) => Ok(e),
        None => parse_event_serde(line),
    }
}

/// [`parse_event`] through serde alone (the reference of the fast path).
pub(crate) fn parse_event_serde(line: &[u8]) -> Result<Event, Reason> {
    parse_event_fields(line).map_err(Reason::Event)
}

fn parse_event_fields(line: &[u8]) -> Result<Event, String> {
    let raw: RawEvent<'_> = serde_json::from_slice(line).map_err(|e| {
        if e.is_data() {
            format!("not an event object ({e})")
        } else {
            format!("invalid JSON ({e})")
        }
    })?;
    let Some(op) = raw.op else {
        return Err("missing `op`".to_string());
    };
    let req = |v, k| field(v, k, true).map(|x| x.unwrap_or(0));
    Ok(match op.as_ref() {
        "alloc" => Event::Alloc {
            id: req(raw.id, "id")?,
            size: req(raw.size, "size")?,
            stream: field(raw.stream, "stream", false)?.unwrap_or(0),
            device: field(raw.device, "device", false)?.unwrap_or(0),
        },
        "free" => Event::Free {
            id: req(raw.id, "id")?,
        },
        "record_stream" => Event::RecordStream {
            id: req(raw.id, "id")?,
            stream: req(raw.stream, "stream")?,
        },
        "sync" => Event::Sync {
            stream: field(raw.stream, "stream", false)?,
        },
        "empty_cache" => Event::EmptyCache,
        "pool_create" => Event::PoolCreate {
            pool: pool_field(raw.pool)?,
            device: field(raw.device, "device", false)?.unwrap_or(0),
            use_on_oom: flag(raw.use_on_oom, "use_on_oom")?,
            no_split: flag(raw.no_split, "no_split")?,
        },
        "pool_begin" | "capture_begin" => Event::PoolBegin {
            pool: pool_field(raw.pool)?,
            device: field(raw.device, "device", false)?.unwrap_or(0),
            streams: streams_field(raw.streams)?,
            capture: op.as_ref() == "capture_begin",
        },
        "pool_end" | "capture_end" => Event::PoolEnd {
            pool: pool_field(raw.pool)?,
            device: field(raw.device, "device", false)?.unwrap_or(0),
            capture: op.as_ref() == "capture_end",
        },
        "pool_release" => Event::PoolRelease {
            pool: pool_field(raw.pool)?,
            device: field(raw.device, "device", false)?.unwrap_or(0),
        },
        "pool_empty_cache" => Event::PoolEmptyCache {
            pool: pool_field(raw.pool)?,
            device: field(raw.device, "device", false)?.unwrap_or(0),
        },
        other => return Err(format!("unknown op {other:?}")),
    })
}

/// Parse the header line.
pub fn parse_header(line: &[u8]) -> Result<Header, Reason> {
    parse_header_fields(line).map_err(Reason::Header)
}

fn parse_header_fields(line: &[u8]) -> Result<Header, String> {
    let v: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| format!("invalid JSON ({e})"))?;
    let Some(obj) = v.as_object() else {
        return Err("missing header: the first line must be a JSON object".to_string());
    };
    match obj.get("format") {
        None => return Err("missing header: the first line has no `format`".to_string()),
        Some(f) if f != "cachealloc-trace" => {
            return Err(format!("unknown format {f}, expected \"cachealloc-trace\""))
        }
        _ => {}
    }
    let version = match obj.get("version") {
        Some(serde_json::Value::Number(n)) if matches!(n.as_u64(), Some(1 | 2)) => {
            n.as_u64().unwrap_or(1)
        }
        Some(v) => {
            return Err(format!(
                "unsupported version {v}; this reader supports versions 1 and 2"
            ))
        }
        None => return Err("header has no `version`".to_string()),
    };
    let device_capacity = match obj.get("device_capacity") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or("`device_capacity` must be a non-negative integer or null")?,
        ),
    };
    let memory_fraction = match obj.get("memory_fraction") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .filter(|f| *f > 0.0 && *f <= 1.0)
                .ok_or("`memory_fraction` must be a number in (0, 1] or null")?,
        ),
    };
    let source = obj
        .get("source")
        .and_then(|s| s.as_str())
        .unwrap_or("")
        .to_string();
    let prefix_events = match obj.get("prefix_events") {
        None | Some(serde_json::Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .ok_or("`prefix_events` must be a non-negative integer")?,
    };
    let malloc_addresses = match obj.get("malloc_addresses") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(v) => malloc_addresses(v)?,
    };
    let torch_version = match obj.get("torch_version") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(
            v.as_str()
                .and_then(cachealloc_core::TorchVersion::parse)
                .ok_or("`torch_version` must be a torch version such as \"2.13\"")?,
        ),
    };
    Ok(Header {
        torch_version,
        version,
        source,
        device_capacity,
        memory_fraction,
        prefix_events,
        malloc_addresses,
    })
}

/// `{"DEVICE": [[ADDRESS, SIZE], ...], ...}`, devices in increasing order.
fn malloc_addresses(v: &serde_json::Value) -> Result<MallocAddresses, String> {
    const SHAPE: &str =
        "`malloc_addresses` must map device numbers to lists of [address, size] pairs";
    let obj = v.as_object().ok_or(SHAPE)?;
    let mut out = Vec::with_capacity(obj.len());
    for (dev, list) in obj {
        let dev: u64 = dev.parse().map_err(|_| SHAPE)?;
        let pairs = list
            .as_array()
            .ok_or(SHAPE)?
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([a, s]) => Some((a.as_u64()?, s.as_u64()?)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or(SHAPE)?;
        out.push((dev, pairs));
    }
    out.sort_by_key(|(d, _)| *d);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_extensions_parse_and_bad_ones_are_named() {
        let h = parse_header(
            br#"{"format":"cachealloc-trace","version":1,"prefix_events":3,"malloc_addresses":{"1":[[4096,2097152]],"0":[]}}"#,
        )
        .unwrap();
        assert_eq!(h.prefix_events, 3);
        assert_eq!(h.mallocs_of(1), &[(4096, 2 << 20)]);
        assert_eq!(h.mallocs_of(7), &[]);
        for bad in [
            &br#"{"format":"cachealloc-trace","version":1,"prefix_events":-1}"#[..],
            br#"{"format":"cachealloc-trace","version":1,"malloc_addresses":[1]}"#,
            br#"{"format":"cachealloc-trace","version":1,"malloc_addresses":{"x":[]}}"#,
            br#"{"format":"cachealloc-trace","version":1,"malloc_addresses":{"0":[[1]]}}"#,
        ] {
            assert!(parse_header(bad).is_err());
        }
    }

    #[test]
    fn events_parse_and_bad_fields_are_named() {
        assert_eq!(
            parse_event(br#"{"op":"alloc","id":3,"size":512,"t":1.5,"note":"x"}"#),
            Ok(Event::Alloc {
                id: 3,
                size: 512,
                stream: 0,
                device: 0
            })
        );
        assert_eq!(
            parse_event(br#"{"op":"sync"}"#),
            Ok(Event::Sync { stream: None })
        );
        for (line, want) in [
            (
                &br#"{"op":"alloc","id":-1,"size":5}"#[..],
                "`id` is negative",
            ),
            (
                br#"{"op":"alloc","id":1,"size":1.5}"#,
                "`size` is not an integer",
            ),
            (
                br#"{"op":"alloc","id":1,"size":true}"#,
                "`size` is a boolean",
            ),
            (br#"{"op":"alloc","id":1,"size":"5"}"#, "`size` is a string"),
            (br#"{"op":"alloc","id":1}"#, "missing `size`"),
            (br#"{"op":"explode"}"#, "unknown op"),
            (br#"{"id":1}"#, "missing `op`"),
            (br#"{"op":"free","id":1"#, "invalid JSON"),
            (br#"[1,2]"#, "not an event object"),
        ] {
            let e = parse_event(line).unwrap_err().to_string();
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }
}
