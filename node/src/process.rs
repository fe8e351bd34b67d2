//! The node process as the operating system sees it, for the standard `process_*` metrics
//! (the names Prometheus' own client libraries export): CPU time, resident and virtual memory,
//! open and allowed file descriptors, start time. Read from `/proc/self` on Linux; elsewhere
//! there is nothing to read and the metrics are left out.

/// One reading.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU time, summed over every thread.
    pub cpu_seconds: f64,
    pub resident_memory_bytes: u64,
    pub virtual_memory_bytes: u64,
    pub open_fds: u64,
    /// The soft limit on open file descriptors; `None` when unlimited or unreadable.
    pub max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// Reads the running process; `None` where `/proc` cannot be read.
#[cfg(target_os = "linux")]
pub fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot_time_seconds = boot_time_seconds(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let ticks_per_second = rustix::param::clock_ticks_per_second();
    let page_bytes = rustix::param::page_size() as u64;
    let mut stats = parse_stat(&stat, ticks_per_second, page_bytes, boot_time_seconds)?;
    stats.open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    stats.max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| max_open_files(&l));
    Some(stats)
}

#[cfg(not(target_os = "linux"))]
pub fn read() -> Option<ProcessStats> {
    None
}

/// `/proc/self/stat` (see proc(5)); the fields counted after the command name, which is in
/// parentheses and may hold spaces and parentheses itself.
fn parse_stat(
    stat: &str,
    ticks_per_second: u64,
    page_bytes: u64,
    boot_time_seconds: u64,
) -> Option<ProcessStats> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 (state): field n is fields[n - 3].
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = ticks_per_second.max(1) as f64;
    let (utime, stime) = (field(14)?, field(15)?);
    Some(ProcessStats {
        cpu_seconds: (utime + stime) as f64 / ticks,
        start_time_seconds: boot_time_seconds as f64 + field(22)? as f64 / ticks,
        virtual_memory_bytes: field(23)?,
        resident_memory_bytes: field(24)?.saturating_mul(page_bytes),
        open_fds: 0,
        max_fds: None,
    })
}

/// `btime` of `/proc/stat`: when the system booted, in seconds since the Unix epoch.
fn boot_time_seconds(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_past_a_command_name_with_spaces_and_parentheses() {
        // Fields 3-24 of proc(5); utime 250, stime 50, starttime 1000, vsize, rss 300 pages.
        let stat = "4242 (ferry (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1000 123456789 300 18446744073709551615";
        let s = parse_stat(stat, 100, 4096, 1_700_000_000).expect("parsed");
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
        assert_eq!(s.virtual_memory_bytes, 123_456_789);
        assert_eq!(s.resident_memory_bytes, 300 * 4096);
        assert_eq!(parse_stat("4242 (ferry) S 1", 100, 4096, 0), None);
    }

    #[test]
    fn boot_time_and_the_open_files_limit_are_found() {
        assert_eq!(
            boot_time_seconds("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax cpu time              unlimited            unlimited            seconds\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(
            max_open_files(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_as_running_with_memory_and_files() {
        let s = read().expect("/proc/self is readable");
        assert!(
            s.resident_memory_bytes > 0 && s.virtual_memory_bytes > 0,
            "{s:?}"
        );
        assert!(s.open_fds >= 3, "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        assert!(
            s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0 * 365.0,
            "{s:?}"
        );
    }
}
