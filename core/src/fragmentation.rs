//! Fragmentation accounting: where a device's reserved memory is, pool by
//! pool, beside PyTorch's statistics (which keep PyTorch's names and
//! values). Computed on demand, in one pass over the block slots, so the
//! cache-hit path pays nothing for it ([`DeviceAllocator::fragmentation`],
//! [`DeviceAllocator::pool_memory`]).
//!
//! [`DeviceAllocator::fragmentation`]: crate::DeviceAllocator::fragmentation
//! [`DeviceAllocator::pool_memory`]: crate::DeviceAllocator::pool_memory

/// The memory of one pool, or of several pools together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolMemory {
    /// Bytes of mapped segments (PyTorch's reserved bytes).
    pub reserved_bytes: u64,
    /// Bytes of the blocks handed out.
    pub allocated_bytes: u64,
    /// Bytes their callers asked for (before rounding).
    pub requested_bytes: u64,
    /// Bytes of cached blocks: free, and reusable by a request of their
    /// pool and stream.
    pub free_bytes: u64,
    /// The largest cached block.
    pub largest_free_block: u64,
    /// Cached blocks.
    pub free_blocks: u64,
    /// Bytes of freed blocks not cached yet: waiting on the events of the
    /// other streams that used them (`record_stream`), or parked until a
    /// CUDA-graph capture ends.
    pub pending_free_bytes: u64,
    /// Expandable segments: reserved address space with no page mapped
    /// (costs no device memory).
    pub unmapped_bytes: u64,
}

impl PoolMemory {
    /// External fragmentation: 1 - largest free block / free bytes (0 with
    /// nothing free; near 1 when the free bytes are in many small pieces).
    pub fn external_fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / self.free_bytes as f64
        }
    }

    /// Rounding waste: bytes handed out beyond what was asked for.
    pub fn rounding_waste(&self) -> u64 {
        self.allocated_bytes.saturating_sub(self.requested_bytes)
    }

    /// Add `other`'s memory to this.
    pub fn add(&mut self, other: &PoolMemory) {
        self.reserved_bytes += other.reserved_bytes;
        self.allocated_bytes += other.allocated_bytes;
        self.requested_bytes += other.requested_bytes;
        self.free_bytes += other.free_bytes;
        self.largest_free_block = self.largest_free_block.max(other.largest_free_block);
        self.free_blocks += other.free_blocks;
        self.pending_free_bytes += other.pending_free_bytes;
        self.unmapped_bytes += other.unmapped_bytes;
    }
}

/// One device's memory by pool, and the cached bytes a request on one
/// stream can and cannot use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fragmentation {
    /// Every pool together.
    pub device: PoolMemory,
    /// The default small pool (blocks of up to 1 MiB, in 2 MiB segments).
    pub small_pool: PoolMemory,
    /// The default large pool.
    pub large_pool: PoolMemory,
    /// Every private pool (CUDA graphs, `MemPool`) together;
    /// [`pool_memory`](crate::DeviceAllocator::pool_memory) gives each.
    pub private_pools: PoolMemory,
    /// The stream the next two figures are about.
    pub stream: u64,
    /// Bytes cached in the default pools in blocks of `stream`.
    pub stream_free_bytes: u64,
    /// Bytes cached in the default pools in blocks of other streams: a
    /// request on `stream` never gets them (PyTorch's policy).
    pub other_streams_free_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_fragmentation_and_rounding_waste() {
        let m = PoolMemory {
            free_bytes: 4 << 20,
            largest_free_block: 1 << 20,
            allocated_bytes: 3 << 20,
            requested_bytes: (3 << 20) - 100,
            ..PoolMemory::default()
        };
        assert_eq!(m.external_fragmentation(), 0.75);
        assert_eq!(m.rounding_waste(), 100);
        assert_eq!(PoolMemory::default().external_fragmentation(), 0.0);
        let mut sum = m;
        sum.add(&PoolMemory {
            free_bytes: 8 << 20,
            largest_free_block: 8 << 20,
            free_blocks: 1,
            ..PoolMemory::default()
        });
        assert_eq!(
            (sum.free_bytes, sum.largest_free_block, sum.free_blocks),
            (12 << 20, 8 << 20, 1)
        );
    }
}
