//! Peak resident memory of this process, read from `/proc/self/status` (Linux).

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

#[cfg(test)]
mod tests {
    use super::*;

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
