//! The graphs captures build, as far as the allocator reads them
//! (`graph_capture_record_stream_reuse`): work queued on a capturing stream
//! ([`MockDevice::launch`](crate::MockDevice::launch)) adds a node that
//! depends on the stream's terminal nodes and becomes its only terminal; a
//! stream that waits for another's work
//! ([`MockDevice::capture_join`](crate::MockDevice::capture_join)) takes the
//! other's terminal nodes as well, and joins its capture if it was outside
//! one (the fork and join of multi-stream capture). The allocator's queries
//! are the drivers' (a stream's capture and terminal nodes, a node's
//! dependencies), kept as the GPU backends keep them
//! (`cachealloc-capture-graph`).

use cachealloc_capture_graph::{Capture, CaptureGraph, GraphDriver, Node};
use std::collections::HashMap;
use std::convert::Infallible;

/// A stream's part in a capture.
#[derive(Clone, Debug)]
struct Member {
    capture: u64,
    terminals: Vec<Node>,
}

/// Every node of every capture, and the capturing streams.
#[derive(Debug, Default)]
struct Model {
    /// Each node's dependencies.
    deps: Vec<Vec<Node>>,
    members: HashMap<u64, Member>,
    captures: u64,
}

impl GraphDriver for Model {
    type Stream = u64;
    type Error = Infallible;
    fn capture(&mut self, stream: u64) -> Result<Option<Capture>, Infallible> {
        Ok(self.members.get(&stream).map(|m| Capture {
            id: m.capture,
            terminals: m.terminals.clone(),
        }))
    }
    fn dependencies(&mut self, node: Node) -> Result<Vec<Node>, Infallible> {
        Ok(self.deps.get(node).cloned().unwrap_or_default())
    }
}

/// The model, and the allocator's free markers and walks over it.
#[derive(Debug, Default)]
pub(crate) struct Graphs {
    model: Model,
    book: CaptureGraph<u64>,
}

impl Graphs {
    /// `stream` begins a capture of its own.
    pub(crate) fn begin(&mut self, stream: u64) {
        let m = &mut self.model;
        m.captures += 1;
        let member = Member {
            capture: m.captures,
            terminals: Vec::new(),
        };
        m.members.insert(stream, member);
    }

    /// The capture `stream` began is over, for every stream in it.
    pub(crate) fn end(&mut self, stream: u64) {
        let m = &mut self.model;
        if let Some(id) = m.members.get(&stream).map(|s| s.capture) {
            m.members.retain(|_, s| s.capture != id);
        }
    }

    /// Work queued on `stream`: a node, if it captures.
    pub(crate) fn launch(&mut self, stream: u64) {
        let m = &mut self.model;
        if let Some(s) = m.members.get_mut(&stream) {
            let node = m.deps.len();
            m.deps.push(std::mem::replace(&mut s.terminals, vec![node]));
        }
    }

    /// `stream` waits for the work queued on `from` so far; `false` (and
    /// nothing changes) when the wait would cross a capture's boundary, as
    /// the drivers refuse it: a capturing stream waiting for work outside
    /// its capture.
    pub(crate) fn join(&mut self, stream: u64, from: u64) -> bool {
        let m = &mut self.model;
        let own = m.members.get(&stream).map(|s| s.capture);
        let Some(f) = m.members.get(&from).cloned() else {
            return own.is_none();
        };
        if own.is_some_and(|c| c != f.capture) {
            return false;
        }
        let s = m.members.entry(stream).or_insert(Member {
            capture: f.capture,
            terminals: Vec::new(),
        });
        for n in f.terminals {
            if !s.terminals.contains(&n) {
                s.terminals.push(n);
            }
        }
        true
    }

    pub(crate) fn is_capturing(&self, stream: u64) -> bool {
        self.model.members.contains_key(&stream)
    }

    pub(crate) fn free_marker(&mut self, streams: &mut dyn Iterator<Item = u64>) -> Option<u32> {
        match self.book.free_marker(&mut self.model, streams) {
            Ok(m) => m,
            Err(never) => match never {},
        }
    }

    pub(crate) fn walk(&mut self, stream: u64) -> bool {
        match self.book.walk(&mut self.model, stream) {
            Ok(w) => w,
            Err(never) => match never {},
        }
    }

    pub(crate) fn reached(&self, stream: u64, marker: u32) -> bool {
        self.book.reached(stream, marker)
    }

    pub(crate) fn drop_marker(&mut self, marker: u32) {
        self.book.drop_marker(marker);
    }

    /// No capture is under way: the walks are forgotten.
    pub(crate) fn forget_walks(&mut self) {
        self.book.captures_ended();
    }

    /// Markers kept.
    pub(crate) fn markers(&self) -> usize {
        self.book.markers()
    }
}
