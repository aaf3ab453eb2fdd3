//! # cachealloc-capture-graph
//!
//! PyTorch's `record_free_markers`, `update_visited` and the test of
//! `free_safe_blocks_in_capture` (`graph_capture_record_stream_reuse:True`),
//! over the two graph queries a driver offers ([`GraphDriver`]: a stream's
//! capture and terminal nodes, `cudaStreamGetCaptureInfo`; a node's
//! dependencies, `cudaGraphNodeGetDependencies`). The CUDA and HIP backends
//! implement them with their driver calls, the simulated device with its
//! model, and all three keep a [`CaptureGraph`].
//!
//! A block freed during a capture, used by several streams, gets a marker:
//! the terminal nodes of each of those streams' capture then (the nodes the
//! streams' next work will follow). A walk from a stream's terminal nodes up
//! the dependencies gathers every node that precedes its next work; once a
//! marker's nodes are all among them, the block's last uses come before
//! whatever the stream does next, so the block can be handed out again on
//! it. What a walk found is kept per capture and stream and only grows (the
//! next walk stops at nodes found before), until the last capture on the
//! device ends.
//!
//! ```
//! use cachealloc_capture_graph::{Capture, CaptureGraph, GraphDriver, Node};
//! /// Stream 1 captures: node 0, then node 1 after it; stream 2 joined
//! /// with node 2 after node 0.
//! struct Toy { terminals: Vec<(u64, Vec<Node>)> }
//! impl GraphDriver for Toy {
//!     type Stream = u64;
//!     type Error = ();
//!     fn capture(&mut self, s: u64) -> Result<Option<Capture>, ()> {
//!         Ok(self.terminals.iter().find(|t| t.0 == s)
//!             .map(|t| Capture { id: 7, terminals: t.1.clone() }))
//!     }
//!     fn dependencies(&mut self, node: Node) -> Result<Vec<Node>, ()> {
//!         Ok(if node == 0 { vec![] } else { vec![0] })
//!     }
//! }
//! let mut d = Toy { terminals: vec![(1, vec![1]), (2, vec![2])] };
//! let mut g = CaptureGraph::default();
//! let m = g.free_marker(&mut d, &mut [1, 2].into_iter()).unwrap().unwrap();
//! assert!(g.walk(&mut d, 1).unwrap());
//! assert!(!g.reached(1, m), "node 2 (stream 2's work) does not precede stream 1's");
//! d.terminals[0].1 = vec![1, 2]; // stream 1 waits for stream 2
//! g.walk(&mut d, 1).unwrap();
//! assert!(g.reached(1, m));
//! ```

use cachealloc_core::NO_MARKER;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;

/// A graph node, by its handle's value.
pub type Node = usize;

/// A stream's capture: its id and the stream's terminal nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capture {
    /// The capture's id (every stream of one capture has it).
    pub id: u64,
    /// The nodes the stream's next work will depend on.
    pub terminals: Vec<Node>,
}

/// A driver's two graph queries.
pub trait GraphDriver {
    /// A stream.
    type Stream: Copy + Eq + Hash;
    /// The driver's error.
    type Error;
    /// The capture `stream` is part of, `None` when it is not capturing
    /// (`cudaStreamGetCaptureInfo`); an invalidated capture is an error.
    fn capture(&mut self, stream: Self::Stream) -> Result<Option<Capture>, Self::Error>;
    /// The nodes `node` depends on (`cudaGraphNodeGetDependencies`).
    fn dependencies(&mut self, node: Node) -> Result<Vec<Node>, Self::Error>;
}

/// The markers, and what the walks found.
#[derive(Debug)]
pub struct CaptureGraph<S> {
    /// Marker number -> its capture and its nodes (deduplicated). The
    /// capture's id keeps a marker from being compared with another
    /// capture's nodes (a driver may reuse a destroyed graph's node
    /// addresses; PyTorch's bare node lists do not guard against it).
    markers: HashMap<u32, (u64, Vec<Node>)>,
    /// The number the next marker gets unless it is taken.
    next_marker: u32,
    /// (capture id, stream) -> the nodes found to precede the stream's
    /// terminal nodes in that capture.
    visited: HashMap<(u64, S), HashSet<Node>>,
    /// Stream -> the capture it was part of at its last walk.
    walked: HashMap<S, u64>,
}

impl<S> Default for CaptureGraph<S> {
    fn default() -> Self {
        CaptureGraph {
            markers: HashMap::new(),
            next_marker: 0,
            visited: HashMap::new(),
            walked: HashMap::new(),
        }
    }
}

impl<S: Copy + Eq + Hash> CaptureGraph<S> {
    /// PyTorch's `record_free_markers`: the terminal nodes of every stream
    /// in `streams`, kept under a new marker number. `None` (the block waits
    /// for the capture's end) when a stream is not capturing, when they are
    /// not all of one capture (PyTorch asserts they are), or when none has a
    /// node (PyTorch's empty marker list, which its
    /// `free_safe_blocks_in_capture` skips).
    pub fn free_marker<D: GraphDriver<Stream = S>>(
        &mut self,
        driver: &mut D,
        streams: &mut dyn Iterator<Item = S>,
    ) -> Result<Option<u32>, D::Error> {
        let mut nodes = Vec::new();
        let mut capture = None;
        for s in streams {
            let Some(c) = driver.capture(s)? else {
                return Ok(None);
            };
            if *capture.get_or_insert(c.id) != c.id {
                return Ok(None);
            }
            nodes.extend(c.terminals);
        }
        nodes.sort_unstable();
        nodes.dedup();
        let (Some(id), false) = (capture, nodes.is_empty()) else {
            return Ok(None);
        };
        let m = self.fresh_marker();
        self.markers.insert(m, (id, nodes));
        Ok(Some(m))
    }

    /// PyTorch's `update_visited`: whether `stream` captures with terminal
    /// nodes; if so, the nodes that precede them are added to what its
    /// capture's walks found.
    pub fn walk<D: GraphDriver<Stream = S>>(
        &mut self,
        driver: &mut D,
        stream: S,
    ) -> Result<bool, D::Error> {
        let Some(c) = driver.capture(stream)? else {
            self.walked.remove(&stream);
            return Ok(false);
        };
        self.walked.insert(stream, c.id);
        if c.terminals.is_empty() {
            return Ok(false);
        }
        let found = self.visited.entry((c.id, stream)).or_default();
        let mut stack = c.terminals;
        while let Some(node) = stack.pop() {
            if !found.insert(node) {
                continue;
            }
            match driver.dependencies(node) {
                Ok(deps) => stack.extend(deps.into_iter().filter(|d| !found.contains(d))),
                Err(e) => {
                    // A walk cut short leaves nodes whose ancestors were not
                    // gathered: start again from nothing next time.
                    self.visited.remove(&(c.id, stream));
                    return Err(e);
                }
            }
        }
        Ok(true)
    }

    /// Whether `marker` was made in the capture of `stream`'s last walk and
    /// every node of it was found by the stream's walks there.
    pub fn reached(&self, stream: S, marker: u32) -> bool {
        let (Some((made_in, nodes)), Some(&id)) =
            (self.markers.get(&marker), self.walked.get(&stream))
        else {
            return false;
        };
        *made_in == id
            && self
                .visited
                .get(&(id, stream))
                .is_some_and(|found| nodes.iter().all(|n| found.contains(n)))
    }

    /// Forget `marker`.
    pub fn drop_marker(&mut self, marker: u32) {
        self.markers.remove(&marker);
    }

    /// The last capture on the device ended: what the walks found goes (the
    /// markers stay until dropped).
    pub fn captures_ended(&mut self) {
        self.visited.clear();
        self.walked.clear();
    }

    /// Markers kept (each one made is dropped by the allocator in the end).
    pub fn markers(&self) -> usize {
        self.markers.len()
    }

    /// A marker number not in use (never [`NO_MARKER`]).
    fn fresh_marker(&mut self) -> u32 {
        loop {
            let m = self.next_marker;
            self.next_marker = if m == NO_MARKER - 1 { 0 } else { m + 1 };
            if !self.markers.contains_key(&m) {
                return m;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One capture (id 1) of streams 1 and 2 over nodes whose dependencies
    /// are given; a failure planted on one node's query.
    struct Fixed {
        terminals: HashMap<u64, Vec<Node>>,
        deps: HashMap<Node, Vec<Node>>,
        fail_at: Option<Node>,
        queries: usize,
    }

    impl GraphDriver for Fixed {
        type Stream = u64;
        type Error = &'static str;
        fn capture(&mut self, s: u64) -> Result<Option<Capture>, &'static str> {
            Ok(self.terminals.get(&s).map(|t| Capture {
                id: 1,
                terminals: t.clone(),
            }))
        }
        fn dependencies(&mut self, node: Node) -> Result<Vec<Node>, &'static str> {
            self.queries += 1;
            if self.fail_at == Some(node) {
                return Err("planted");
            }
            Ok(self.deps.get(&node).cloned().unwrap_or_default())
        }
    }

    /// 0 <- 1 <- 3 on stream 1, 0 <- 2 on stream 2.
    fn fork() -> Fixed {
        Fixed {
            terminals: [(1, vec![3]), (2, vec![2])].into_iter().collect(),
            deps: [(1, vec![0]), (2, vec![0]), (3, vec![1])]
                .into_iter()
                .collect(),
            fail_at: None,
            queries: 0,
        }
    }

    #[test]
    fn a_marker_is_reached_once_the_walk_finds_all_its_nodes() {
        let mut d = fork();
        let mut g = CaptureGraph::default();
        let m = g
            .free_marker(&mut d, &mut [1, 2].into_iter())
            .unwrap()
            .unwrap();
        assert!(!g.reached(1, m), "not walked yet");
        assert!(g.walk(&mut d, 1).unwrap());
        assert!(!g.reached(1, m));
        d.terminals.insert(1, vec![4]);
        d.deps.insert(4, vec![3, 2]);
        let before = d.queries;
        assert!(g.walk(&mut d, 1).unwrap());
        assert_eq!(
            d.queries - before,
            2,
            "the walk stops at nodes found before (4, then 2)"
        );
        assert!(g.reached(1, m));
        g.drop_marker(m);
        assert!(!g.reached(1, m));
        assert_eq!(g.markers(), 0);
    }

    #[test]
    fn no_marker_outside_a_capture_or_without_a_node() {
        let mut d = fork();
        let mut g = CaptureGraph::default();
        assert_eq!(g.free_marker(&mut d, &mut [1, 9].into_iter()), Ok(None));
        d.terminals.insert(1, vec![]);
        assert_eq!(g.free_marker(&mut d, &mut [1].into_iter()), Ok(None));
        assert!(!g.walk(&mut d, 1).unwrap(), "no terminal node");
        assert!(!g.walk(&mut d, 9).unwrap(), "not capturing");
    }

    /// A marker of an ended capture is never reached in a later one, even
    /// over nodes with the same handles.
    #[test]
    fn a_marker_belongs_to_its_capture() {
        struct Two(Fixed, u64);
        impl GraphDriver for Two {
            type Stream = u64;
            type Error = &'static str;
            fn capture(&mut self, s: u64) -> Result<Option<Capture>, &'static str> {
                let id = self.1;
                Ok(self.0.capture(s)?.map(|c| Capture { id, ..c }))
            }
            fn dependencies(&mut self, node: Node) -> Result<Vec<Node>, &'static str> {
                self.0.dependencies(node)
            }
        }
        let mut d = Two(fork(), 1);
        let mut g = CaptureGraph::default();
        let m = g
            .free_marker(&mut d, &mut [1].into_iter())
            .unwrap()
            .unwrap();
        g.captures_ended();
        d.1 = 2;
        assert!(g.walk(&mut d, 1).unwrap());
        assert!(!g.reached(1, m));
    }

    #[test]
    fn a_failed_walk_starts_over_and_an_ended_capture_forgets() {
        let mut d = fork();
        let mut g = CaptureGraph::default();
        let m = g
            .free_marker(&mut d, &mut [1].into_iter())
            .unwrap()
            .unwrap();
        d.fail_at = Some(1);
        assert_eq!(g.walk(&mut d, 1), Err("planted"));
        assert!(!g.reached(1, m));
        d.fail_at = None;
        assert!(g.walk(&mut d, 1).unwrap());
        assert!(g.reached(1, m));
        g.captures_ended();
        assert!(
            !g.reached(1, m),
            "what the walks found goes with the capture"
        );
        assert_eq!(g.markers(), 1, "markers stay until dropped");
    }
}
