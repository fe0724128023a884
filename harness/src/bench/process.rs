//! What the OS says about this process (Linux `/proc`): peak resident memory, and CPU time and
//! run-queue waiting of its threads — the latter tells how much a shared machine slowed a run.

use serde::{Deserialize, Serialize};

/// The peak resident set size (`VmHWM`) of this process in bytes, or `None` where
/// `/proc/self/status` is unavailable (not Linux) or has no such line. Memory-mapped model
/// pages count once they have been touched, as they do for llama.cpp's mmap loader.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

/// Parses the `VmHWM:  <n> kB` line of a `/proc/<pid>/status` text into bytes.
pub fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut fields = line["VmHWM:".len()..].split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => Some(value * 1024),
        _ => None,
    }
}

/// CPU time of this process's live threads, summed from `/proc/self/task/*/schedstat`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct CpuTimes {
    /// Seconds the threads ran on a CPU.
    pub on_cpu_s: f64,
    /// Seconds the threads were runnable but waited for a CPU (machine contention).
    pub runqueue_wait_s: f64,
}

impl CpuTimes {
    /// `self - earlier`, field by field (times of threads alive at both snapshots).
    pub fn since(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            on_cpu_s: self.on_cpu_s - earlier.on_cpu_s,
            runqueue_wait_s: self.runqueue_wait_s - earlier.runqueue_wait_s,
        }
    }
}

/// The summed [`CpuTimes`] of this process's threads now, or `None` where `/proc` has no
/// schedstat (not Linux, or a kernel without scheduler statistics).
pub fn cpu_times() -> Option<CpuTimes> {
    let mut total = CpuTimes::default();
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        // A thread may exit between listing and reading: skip it.
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            let t = parse_schedstat(&text)?;
            total.on_cpu_s += t.on_cpu_s;
            total.runqueue_wait_s += t.runqueue_wait_s;
        }
    }
    Some(total)
}

/// Parses a `schedstat` line: `<ns on cpu> <ns waiting on a runqueue> <timeslices>`.
pub fn parse_schedstat(text: &str) -> Option<CpuTimes> {
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    let on_cpu = fields.next()??;
    let wait = fields.next()??;
    Some(CpuTimes {
        on_cpu_s: on_cpu as f64 * 1e-9,
        runqueue_wait_s: wait as f64 * 1e-9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schedstat_and_subtracts() {
        let t = parse_schedstat("2000000000 500000000 77\n").unwrap();
        assert_eq!(
            t,
            CpuTimes {
                on_cpu_s: 2.0,
                runqueue_wait_s: 0.5
            }
        );
        assert!(parse_schedstat("12").is_none());
        assert!(parse_schedstat("x 1 2").is_none());
        let later = CpuTimes {
            on_cpu_s: 3.5,
            runqueue_wait_s: 1.0,
        };
        assert_eq!(
            later.since(&t),
            CpuTimes {
                on_cpu_s: 1.5,
                runqueue_wait_s: 0.5
            }
        );
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn own_cpu_time_grows_with_work() {
        let Some(before) = cpu_times() else { return }; // kernel without schedstat
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        let after = cpu_times().unwrap();
        assert!(x != 1, "keep the loop");
        assert!(after.since(&before).on_cpu_s > 0.0);
    }

    #[test]
    fn parses_the_hwm_line() {
        let text = "Name:\tspecdec\nVmPeak:\t  999 kB\nVmHWM:\t  123456 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(parse_vm_hwm(text), Some(123_456 * 1024));
        assert_eq!(parse_vm_hwm("VmRSS:\t1 kB\n"), None);
        assert_eq!(parse_vm_hwm("VmHWM:\tlots kB\n"), None);
        assert_eq!(parse_vm_hwm("VmHWM:\t12 MB\n"), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn own_peak_covers_a_touched_buffer() {
        let buf = vec![1u8; 8 << 20];
        let peak = peak_rss_bytes().expect("Linux has /proc/self/status");
        assert!(peak >= buf.len() as u64, "{peak}");
        assert_eq!(buf.iter().map(|&b| b as usize).sum::<usize>(), 8 << 20);
    }
}
