//! The private-pool ops of a version 2 trace, applied to a [`Replay`]'s
//! device allocators: checked against the format's pool rules first (so
//! `check` and `replay` accept the same traces), then made on the device's
//! allocator (`create_pool`, `begin_allocate_to_pool`, `capture_begin`, ...).

use crate::device::ReplayDevice;
use crate::error::Reason;
use crate::event::{Event, Streams};
use crate::replay::{allocator_error, Replay};
use cachealloc_core::{MempoolId, PoolOptions, StreamFilter};

impl<D: ReplayDevice> Replay<D> {
    /// Apply one pool op.
    pub(crate) fn apply_pool_op(&mut self, ev: Event) -> Result<(), Reason> {
        self.pools.apply(&ev).map_err(Reason::Pool)?;
        let (pool, device) = match ev {
            Event::PoolCreate { pool, device, .. }
            | Event::PoolBegin { pool, device, .. }
            | Event::PoolEnd { pool, device, .. }
            | Event::PoolRelease { pool, device }
            | Event::PoolEmptyCache { pool, device } => (pool, device),
            _ => return Ok(()),
        };
        let id = MempoolId(pool.0, pool.1);
        let k = self.device(device)?;
        let d = &mut self.devices[k];
        let r = match ev {
            Event::PoolCreate {
                use_on_oom,
                no_split,
                ..
            } => {
                let mut o = PoolOptions::NONE;
                if use_on_oom {
                    o = o.use_on_oom();
                }
                if no_split {
                    o = o.no_split();
                }
                d.alloc.create_pool(id, o)
            }
            Event::PoolBegin {
                streams, capture, ..
            } => {
                let filter = match streams {
                    Streams::All => StreamFilter::All,
                    s => {
                        let mut list = Vec::with_capacity(4);
                        for &id in s.as_slice() {
                            list.push(d.stream(id)?);
                        }
                        StreamFilter::streams(&list)
                            .ok_or_else(|| Reason::Pool("1 to 4 streams".to_string()))?
                    }
                };
                if capture {
                    d.alloc.capture_begin(id, filter)
                } else {
                    d.alloc.begin_allocate_to_pool(id, filter)
                }
            }
            Event::PoolEnd { capture, .. } => {
                if capture {
                    d.alloc.capture_end(id)
                } else {
                    d.alloc.end_allocate_to_pool(id)
                }
            }
            Event::PoolRelease { .. } => d.alloc.release_pool(id),
            Event::PoolEmptyCache { .. } => {
                return self
                    .with_room(k, |a| a.empty_cache_pool(id))
                    .map_err(allocator_error)
            }
            _ => Ok(()),
        };
        r.map_err(allocator_error)
    }
}
