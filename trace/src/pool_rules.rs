//! [`PoolRules`]: the format's rules for the private-pool ops (version 2),
//! for `check` and `replay` alike: a pool is routed to at most once at a
//! time (`pool_begin` / `capture_begin` ... `pool_end` / `capture_end`, the
//! end of the same kind as the begin), `pool_release` needs a user, and an
//! id whose use count reached 0 is not used again (PyTorch's ids are never
//! reused: graphs and `MemPool`s count up).

use crate::event::{Event, PoolId};
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, Default)]
struct PoolState {
    users: u64,
    /// Routed to: `Some(capture)`.
    routed: Option<bool>,
    released: bool,
}

/// The private pools of a trace, per device.
#[derive(Debug, Default)]
pub struct PoolRules {
    pools: HashMap<(u64, PoolId), PoolState>,
}

fn name(pool: PoolId) -> String {
    format!("[{}, {}]", pool.0, pool.1)
}

impl PoolRules {
    /// No pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply a pool op (other events pass); why it breaks a rule.
    pub fn apply(&mut self, ev: &Event) -> Result<(), String> {
        match *ev {
            Event::PoolCreate { pool, device, .. } => self.add_user(device, pool, "pool_create"),
            Event::PoolBegin {
                pool,
                device,
                capture,
                ..
            } => {
                let op = if capture {
                    "capture_begin"
                } else {
                    "pool_begin"
                };
                if self
                    .pools
                    .get(&(device, pool))
                    .is_some_and(|p| p.routed.is_some())
                {
                    return Err(format!(
                        "{op} of pool {}, which is already routed to (PyTorch: already recording to mempool_id)",
                        name(pool)
                    ));
                }
                self.add_user(device, pool, op)?;
                if let Some(p) = self.pools.get_mut(&(device, pool)) {
                    p.routed = Some(capture);
                }
                Ok(())
            }
            Event::PoolEnd {
                pool,
                device,
                capture,
            } => {
                let op = if capture { "capture_end" } else { "pool_end" };
                let p = self.pools.get_mut(&(device, pool));
                match p {
                    Some(p) if p.routed == Some(capture) || (!capture && p.routed.is_some()) => {
                        p.routed = None;
                        Ok(())
                    }
                    _ => Err(format!(
                        "{op} of pool {}, which is not {}",
                        name(pool),
                        if capture {
                            "captured into"
                        } else {
                            "routed to"
                        }
                    )),
                }
            }
            Event::PoolRelease { pool, device } => match self.pools.get_mut(&(device, pool)) {
                Some(p) if p.users > 0 => {
                    p.users -= 1;
                    p.released = p.users == 0;
                    Ok(())
                }
                _ => Err(format!(
                    "pool_release of pool {}, which has no user",
                    name(pool)
                )),
            },
            _ => Ok(()),
        }
    }

    fn add_user(&mut self, device: u64, pool: PoolId, op: &str) -> Result<(), String> {
        let p = self.pools.entry((device, pool)).or_default();
        if p.released {
            return Err(format!(
                "{op} of pool {}, whose use count reached 0: a pool id is not used again",
                name(pool)
            ));
        }
        p.users += 1;
        Ok(())
    }

    /// Pools seen.
    pub fn len(&self) -> usize {
        self.pools.len()
    }

    /// Whether no pool was seen.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }
}
