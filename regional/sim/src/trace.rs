//! Reading a workload trace in the Philly format.
//!
//! Columns (by name, in any order; others are ignored): `timestamp` (submit
//! time, `YYYY-MM-DD HH:MM:SS`, UTC), `duration` (run time in seconds, a
//! float), `num_gpus`, `cluster` (the tenant). Rows with zero GPUs or an empty
//! duration are skipped and counted; rows that do not parse are skipped and
//! counted as malformed, with the first few kept as examples. An empty
//! `cluster` becomes the tenant `unknown`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::csv::{column, records};

/// One job of the trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceJob {
    /// 1-based line of the CSV file it came from.
    pub line: usize,
    /// Submit time, seconds since the Unix epoch.
    pub submit_unix_s: i64,
    /// Run time in seconds at full speed.
    pub duration_s: f64,
    /// GPUs as the trace records them (before rounding to whole nodes).
    pub gpus: u32,
    pub tenant: String,
}

/// Rows left out of a trace, by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SkippedRows {
    pub zero_gpus: u64,
    pub empty_duration: u64,
    pub malformed: u64,
    /// The first few malformed rows: `line N: why`.
    pub examples: Vec<String>,
}

impl SkippedRows {
    pub fn total(&self) -> u64 {
        self.zero_gpus + self.empty_duration + self.malformed
    }
}

/// A parsed trace: its jobs in submit order (ties keep file order).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Trace {
    pub jobs: Vec<TraceJob>,
    pub skipped: SkippedRows,
}

/// Why a trace could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the trace is empty: no header row")]
    Empty,
    #[error(
        "the trace's header has no {0:?} column (expected timestamp, duration, num_gpus, cluster)"
    )]
    MissingColumn(&'static str),
}

const MAX_EXAMPLES: usize = 5;

impl Trace {
    /// Reads a Philly-format trace file.
    pub fn load(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Trace::parse(&text)
    }

    /// Parses Philly-format CSV text.
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let mut rows = records(text);
        let (_, header) = rows.next().ok_or(TraceError::Empty)?;
        let header = header.map_err(|_| TraceError::Empty)?;
        let col = |name: &'static str| column(&header, name).ok_or(TraceError::MissingColumn(name));
        let (c_ts, c_dur, c_gpus, c_tenant) = (
            col("timestamp")?,
            col("duration")?,
            col("num_gpus")?,
            col("cluster")?,
        );
        let width = 1 + c_ts.max(c_dur).max(c_gpus).max(c_tenant);
        let mut trace = Trace::default();
        for (line, fields) in rows {
            let bad = |trace: &mut Trace, why: String| {
                trace.skipped.malformed += 1;
                if trace.skipped.examples.len() < MAX_EXAMPLES {
                    trace.skipped.examples.push(format!("line {line}: {why}"));
                }
            };
            let fields = match fields {
                Ok(f) => f,
                Err(why) => {
                    bad(&mut trace, why);
                    continue;
                }
            };
            if fields.len() < width {
                bad(
                    &mut trace,
                    format!("{} fields, expected at least {width}", fields.len()),
                );
                continue;
            }
            let (ts, dur, gpus) = (
                fields[c_ts].trim(),
                fields[c_dur].trim(),
                fields[c_gpus].trim(),
            );
            let Ok(gpus) = gpus.parse::<f64>() else {
                bad(&mut trace, format!("num_gpus {gpus:?} is not a number"));
                continue;
            };
            if !(gpus.is_finite() && gpus >= 0.0 && gpus.fract() == 0.0 && gpus <= 1e6) {
                bad(&mut trace, format!("num_gpus {gpus} is not a GPU count"));
                continue;
            }
            if gpus == 0.0 {
                trace.skipped.zero_gpus += 1;
                continue;
            }
            if dur.is_empty() {
                trace.skipped.empty_duration += 1;
                continue;
            }
            let duration_s = match dur.parse::<f64>() {
                Ok(d) if d.is_finite() && d >= 0.0 => d,
                _ => {
                    bad(
                        &mut trace,
                        format!("duration {dur:?} is not a number of seconds"),
                    );
                    continue;
                }
            };
            let Some(submit_unix_s) = parse_timestamp(ts) else {
                bad(
                    &mut trace,
                    format!("timestamp {ts:?} is not YYYY-MM-DD HH:MM:SS"),
                );
                continue;
            };
            let tenant = match fields[c_tenant].trim() {
                "" => "unknown".to_string(),
                t => t.to_string(),
            };
            trace.jobs.push(TraceJob {
                line,
                submit_unix_s,
                duration_s,
                gpus: gpus as u32,
                tenant,
            });
        }
        // Stable: equal submit times keep file order.
        trace.jobs.sort_by_key(|j| j.submit_unix_s);
        Ok(trace)
    }

    /// Keeps only the first `n` jobs by submit time.
    pub fn truncate(&mut self, n: usize) {
        self.jobs.truncate(n);
    }
}

/// `YYYY-MM-DD HH:MM:SS` (or with a `T`) as seconds since the Unix epoch, UTC.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b' ' | b'T') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = &s[r];
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 60
    {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days since 1970-01-01 (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_timestamp("2017-10-09 07:01:55"), Some(1_507_532_515));
        assert_eq!(parse_timestamp("2016-02-29T00:00:00"), Some(1_456_704_000));
        for bad in [
            "2017-02-29 00:00:00",
            "2017-13-01 00:00:00",
            "2017-10-09",
            "2017-10-09 24:00:00",
            "2017-1x-09 07:01:55",
            "",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn reads_the_philly_header_and_skips_bad_rows() {
        let text = "timestamp,duration,num_gpus,gpu_time,cluster\n\
            2017-10-09 07:01:55,66.0,1,66.0,11cb48\n\
            2017-10-09 06:13:03,2951.0,8,23608.0,6214e9\n\
            2017-10-09 06:13:04,,1,,6214e9\n\
            2017-10-09 06:13:05,10.0,0,0.0,6214e9\n\
            2017-10-09 06:13:06,ten,1,10,6214e9\n\
            not a time,10.0,1,10,6214e9\n\
            2017-10-09 06:13:07,10.0,1.5,15,6214e9\n\
            2017-10-09 06:13:08,10.0\n\
            \n\
            2017-10-09 06:13:03,5.0,2,10.0,\n";
        let t = Trace::parse(text).unwrap();
        assert_eq!(t.jobs.len(), 3);
        // Sorted by submit time, ties in file order.
        assert_eq!(
            t.jobs
                .iter()
                .map(|j| (j.line, j.gpus, j.tenant.as_str()))
                .collect::<Vec<_>>(),
            vec![(3, 8, "6214e9"), (11, 2, "unknown"), (2, 1, "11cb48")]
        );
        assert_eq!(t.jobs[2].duration_s, 66.0);
        assert_eq!(t.skipped.zero_gpus, 1);
        assert_eq!(t.skipped.empty_duration, 1);
        assert_eq!(t.skipped.malformed, 4);
        assert_eq!(t.skipped.total(), 6);
        assert!(
            t.skipped.examples[0].starts_with("line 6:"),
            "{:?}",
            t.skipped
        );
        assert!(matches!(
            Trace::parse("timestamp,duration,num_gpus\n"),
            Err(TraceError::MissingColumn("cluster"))
        ));
        assert!(matches!(Trace::parse(""), Err(TraceError::Empty)));
    }
}
