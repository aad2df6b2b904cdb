//! Facts about the machine that sizing decisions read (Linux; `None` where they cannot be told).

/// Bytes of memory available now (Linux `MemAvailable` in /proc/meminfo).
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    mem_available_in(&text)
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn mem_available_in(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_reads_the_kib_line() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   12345 kB\n";
        assert_eq!(mem_available_in(text), Some(12345 * 1024));
        assert_eq!(mem_available_in("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available_in("MemAvailable: lots kB\n"), None);
    }
}
