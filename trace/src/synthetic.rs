//! Synthetic workloads that real traces do not cover.
//!
//! [`fresh_streams`]: a training loop that runs every step on a new stream
//! (as runtimes that take a stream per request or per step do). Weights and
//! optimizer state live on stream 0 for the whole run; each step, on its own
//! stream, allocates its activations layer by layer in the forward pass (plus
//! short-lived workspaces), then walks back, allocating each layer's
//! gradients and freeing its activations, runs the optimizer's temporaries,
//! and frees everything of the step. Sizes vary a little from step to step
//! (a batch whose length changes), from a seeded generator, so the trace is
//! the same for the same arguments.
//!
//! [`scale`]: N small blocks allocated, then all freed in random, allocation
//! or reverse order: the allocator's metadata at the size of a big workload
//! (millions of live blocks), for the scale benchmark.

use crate::event::Event;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// The events of [`fresh_streams`] and a header for them.
pub struct Synthetic {
    /// The header line (a JSON object).
    pub header: serde_json::Value,
    /// The events.
    pub events: Vec<Event>,
}

/// `steps` training steps of a `layers`-layer model, step `k` on stream
/// `k` (1, 2, ...), from `seed`.
pub fn fresh_streams(steps: u64, layers: u64, seed: u64) -> Synthetic {
    let mut rng = Rng(seed);
    let mut events = Vec::new();
    let mut next_id = 0u64;
    let mut alloc = |events: &mut Vec<Event>, size: u64, stream: u64| {
        let id = next_id;
        next_id += 1;
        events.push(Event::Alloc {
            id,
            size,
            stream,
            device: 0,
        });
        id
    };
    // The model: per layer a weight, a bias, and two optimizer states.
    let shapes: Vec<(u64, u64)> = (0..layers)
        .map(|_| {
            (
                rng.range(2, 24) * MIB + rng.range(0, 1023) * KIB,
                rng.range(1, 64) * KIB,
            )
        })
        .collect();
    for &(w, b) in &shapes {
        for size in [w, b, w, w] {
            alloc(&mut events, size, 0);
        }
    }
    for k in 1..=steps {
        // The batch's length this step: 88% to 112% of the nominal one.
        let scale = rng.range(88, 112);
        let act = |w: u64| (w * scale / 100).div_ceil(512) * 512;
        let mut activations = Vec::new();
        for &(w, _) in &shapes {
            activations.push(alloc(&mut events, act(w) * 2, k));
            let ws = alloc(&mut events, rng.range(256, 8 * 1024) * KIB, k);
            let small = alloc(&mut events, rng.range(1, 512) * KIB, k);
            events.push(Event::Free { id: ws });
            activations.push(small);
        }
        for (l, &(w, b)) in shapes.iter().enumerate().rev() {
            let gw = alloc(&mut events, w, k);
            let gb = alloc(&mut events, b, k);
            for id in [activations[2 * l], activations[2 * l + 1]] {
                events.push(Event::Free { id });
            }
            let tmp = alloc(&mut events, act(w), k);
            events.push(Event::Free { id: tmp });
            activations[2 * l] = gw;
            activations[2 * l + 1] = gb;
        }
        // The optimizer: one temporary per layer, then the gradients go.
        for &(w, _) in &shapes {
            let t = alloc(&mut events, w, k);
            events.push(Event::Free { id: t });
        }
        for id in activations {
            events.push(Event::Free { id });
        }
    }
    let header = serde_json::json!({
        "format": "cachealloc-trace",
        "version": 1,
        "source": format!(
            "synthetic: {steps} training steps of a {layers}-layer model, step k on a new stream k (weights on stream 0); seed {seed}"
        ),
        "device_capacity": null,
    });
    Synthetic { header, events }
}

/// The order in which [`scale`] frees its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeOrder {
    /// A random permutation (from the seed).
    Random,
    /// The order of allocation (first in, first out).
    Forward,
    /// The reverse order (last in, first out).
    Reverse,
}

/// `blocks` allocations of 512 B to 64 KiB (sizes from `seed`) on stream 0,
/// all live at once, then all freed in `order`.
pub fn scale(blocks: u64, order: FreeOrder, seed: u64) -> Synthetic {
    let mut rng = Rng(seed);
    let mut events = Vec::with_capacity(2 * blocks as usize);
    for id in 0..blocks {
        let size = rng.range(1, 128) * 512;
        events.push(Event::Alloc {
            id,
            size,
            stream: 0,
            device: 0,
        });
    }
    let mut ids: Vec<u64> = (0..blocks).collect();
    match order {
        FreeOrder::Forward => {}
        FreeOrder::Reverse => ids.reverse(),
        FreeOrder::Random => {
            for i in (1..ids.len()).rev() {
                let j = rng.range(0, i as u64) as usize;
                ids.swap(i, j);
            }
        }
    }
    events.extend(ids.into_iter().map(|id| Event::Free { id }));
    let header = serde_json::json!({
        "format": "cachealloc-trace",
        "version": 1,
        "source": format!(
            "synthetic: {blocks} blocks of 512 B to 64 KiB allocated, then freed in {} order; seed {seed}",
            match order {
                FreeOrder::Random => "random",
                FreeOrder::Forward => "allocation",
                FreeOrder::Reverse => "reverse",
            }
        ),
        "device_capacity": null,
    });
    Synthetic { header, events }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every allocation is freed once, after it was made, except the model's.
    #[test]
    fn every_step_frees_what_it_allocated() {
        let s = fresh_streams(3, 4, 1);
        let mut live = std::collections::BTreeSet::new();
        for e in &s.events {
            match *e {
                Event::Alloc { id, .. } => assert!(live.insert(id)),
                Event::Free { id } => assert!(live.remove(&id)),
                _ => unreachable!(),
            }
        }
        assert_eq!(live.len(), 4 * 4, "the model's tensors stay");
        assert_eq!(fresh_streams(3, 4, 1).events, s.events, "deterministic");
    }

    #[test]
    fn scale_frees_each_block_once_in_the_order_asked() {
        for order in [FreeOrder::Random, FreeOrder::Forward, FreeOrder::Reverse] {
            let s = scale(1000, order, 7);
            let frees: Vec<u64> = s
                .events
                .iter()
                .filter_map(|e| match *e {
                    Event::Free { id } => Some(id),
                    _ => None,
                })
                .collect();
            let mut sorted = frees.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
            match order {
                FreeOrder::Forward => assert_eq!(frees, sorted),
                FreeOrder::Reverse => assert!(frees.iter().rev().eq(sorted.iter())),
                FreeOrder::Random => assert_ne!(frees, sorted),
            }
        }
    }
}
