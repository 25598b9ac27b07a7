//! The client machine a report was measured on, from /proc.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
    pub memory_gib: f64,
}

impl Machine {
    pub fn describe() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let cores = cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count();
        let memory_kib: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Machine {
            hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
            cpu_model,
            cores,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            memory_gib: memory_kib / (1024.0 * 1024.0),
        }
    }
}
