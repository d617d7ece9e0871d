//! A peer's log lines within a window of time, for a failure message that says what the
//! peer was doing then. `murmur run` writes each line after an RFC 3339 UTC timestamp
//! (`2026-11-29T01:10:27.347425Z`), which sorts as text in time order.

use std::path::Path;

/// Up to `max` lines of the log at `path` stamped from `from_ms` to `to_ms` (milliseconds
/// since the Unix epoch), the first ones kept; none when the log cannot be read.
pub(crate) fn lines_between(path: &Path, from_ms: u64, to_ms: u64, max: usize) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let (from, to) = (utc_stamp(from_ms), utc_stamp(to_ms + 1));
    text.lines()
        .filter(|line| {
            let stamp = line.get(..from.len()).unwrap_or("");
            stamp >= from.as_str() && stamp < to.as_str()
        })
        .take(max)
        .map(str::to_owned)
        .collect()
}

/// `unix_ms` as `YYYY-MM-DDTHH:MM:SS.mmm`, UTC.
pub(crate) fn utc_stamp(unix_ms: u64) -> String {
    let (days, ms_of_day) = (unix_ms / 86_400_000, unix_ms % 86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
    let (second, ms) = (ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{ms:03}")
}

/// The proleptic Gregorian date `days` after 1970-01-01 (the algorithm of Howard
/// Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_dates_and_times() {
        assert_eq!(utc_stamp(0), "1970-01-01T00:00:00.000");
        // 2026-11-29T01:10:27.347Z, a leap year's day after February, and 2000-02-29.
        assert_eq!(utc_stamp(1_795_914_627_347), "2026-11-29T01:10:27.347");
        assert_eq!(utc_stamp(1_709_164_800_000), "2024-02-29T00:00:00.000");
        assert_eq!(utc_stamp(951_782_400_000), "2000-02-29T00:00:00.000");
    }

    #[test]
    fn only_the_window_s_lines_are_kept() {
        let dir = std::env::temp_dir().join(format!("murmur-log-window-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("murmur.log");
        std::fs::write(
            &log,
            "2026-11-29T01:10:26.999000Z  INFO before\n\
             2026-11-29T01:10:27.347425Z  WARN inside\n\
             2026-11-29T01:10:28.000999Z  INFO last inside\n\
             2026-11-29T01:10:28.001000Z  INFO after\n",
        )
        .unwrap();
        let lines = lines_between(&log, 1_795_914_627_000, 1_795_914_628_000, 10);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].ends_with("inside") && lines[1].ends_with("last inside"));
        assert_eq!(
            lines_between(&log, 1_795_914_627_000, 1_795_914_628_000, 1).len(),
            1
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
