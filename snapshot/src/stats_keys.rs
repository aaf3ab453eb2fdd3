//! The flat keys of `torch.cuda.memory_stats()`, as each torch release
//! names them (the C library and the replay report both list them).

/// The flat keys of `torch.cuda.memory_stats()` in torch `version`,
/// sorted as torch sorts them: a device's statistics and each private
/// pool's reserved bytes (`pools`; torch 2.13 on).
pub fn memory_stats_keys(
    stats: &cachealloc_core::DeviceStats,
    version: cachealloc_core::TorchVersion,
    pools: &[(cachealloc_core::MempoolId, cachealloc_core::StatArray)],
) -> Vec<(String, i64)> {
    let mut keys = Vec::new();
    stats.for_each_of(version, |k, v| keys.push((k.to_string(), v)));
    for (id, s) in pools {
        for (i, pool) in ["all", "small_pool", "large_pool"].iter().enumerate() {
            let st = &s.0[i];
            for (name, v) in [
                ("allocated", st.allocated),
                ("current", st.current),
                ("freed", st.freed),
                ("peak", st.peak),
            ] {
                keys.push((
                    format!(
                        "reserved_bytes_by_private_pools.{}_{}.{pool}.{name}",
                        id.0, id.1
                    ),
                    v,
                ));
            }
        }
    }
    keys.sort();
    keys
}
