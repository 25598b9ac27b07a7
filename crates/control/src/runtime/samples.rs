//! The running configuration's devices and pools in `/metrics`: each
//! open device's kind gives its own figures.

use stats::Sample;

use super::Runtime;

impl Runtime {
    /// The figures of every open device (by name) and every open pool
    /// (by name), as their kinds give them.
    pub fn samples(&self) -> Vec<Sample> {
        let mut nodes: Vec<_> = self.live.nodes.iter().collect();
        nodes.sort_by(|a, b| a.0.cmp(b.0));
        let mut out: Vec<Sample> = nodes
            .into_iter()
            .flat_map(|(name, node)| node.settings.spec.samples(name, &*node.device))
            .collect();
        let mut pools: Vec<_> = self
            .pools
            .iter()
            .filter_map(crate::pools::open_now)
            .collect();
        pools.sort_by(|a, b| a.name().cmp(b.name()));
        out.extend(
            pools
                .iter()
                .flat_map(|p| crate::pool_metrics::pool_samples(p)),
        );
        out
    }
}
