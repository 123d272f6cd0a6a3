//! Ships real workers' output to the region with each sync, as it is
//! written: `stdout.log` and `stderr.log` in each worker's directory are
//! read from where the last kept chunk ended, a bounded piece per stream
//! and sync, and moved past only once the region says it kept them (it
//! keeps each piece once by its offset, so one sent twice costs nothing).
//! A worker's output is followed while it is reported and until its files
//! are read to their end, so an exit's last lines go too. What a node
//! wrote is then off the node: its loss loses at most one sync's worth.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use gangway_shared::agent::{LogChunk, LogStream, WorkerReport};

use crate::executor::WorkerKey;

/// Most bytes of one stream in one sync.
const CHUNK_MAX: u64 = 64 * 1024;
/// Most bytes of output in one sync, every worker together.
const SYNC_MAX: u64 = 1024 * 1024;

#[derive(Debug, Default)]
pub(crate) struct LogShipper {
    work_dir: PathBuf,
    /// Bytes of each worker stream the region has kept.
    kept: BTreeMap<(WorkerKey, LogStream), u64>,
}

/// A worker's directory (`executor::real::worker_dir`).
pub(crate) fn worker_dir(work_dir: &Path, key: &WorkerKey) -> PathBuf {
    work_dir
        .join("jobs")
        .join(key.job_id.to_string())
        .join(format!("rank-{}-attempt-{}", key.rank, key.attempt))
}

/// Up to `max` bytes of `path` from `offset`, cut back to whole UTF-8
/// characters (a character split at the end waits for the next read).
fn read_from(path: &Path, offset: u64, max: u64) -> Option<(String, u64)> {
    let mut f = std::fs::File::open(path).ok()?;
    let size = f.metadata().ok()?.len();
    if size <= offset {
        return None;
    }
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut buf = Vec::new();
    f.take(max.min(size - offset)).read_to_end(&mut buf).ok()?;
    let whole = match std::str::from_utf8(&buf) {
        Ok(_) => buf.len(),
        // An incomplete character at the end: leave it for later, unless
        // it is all there is (then it is sent as it is, replaced).
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
        Err(_) => buf.len(),
    };
    buf.truncate(whole);
    let len = buf.len() as u64;
    Some((String::from_utf8_lossy(&buf).into_owned(), len))
}

impl LogShipper {
    pub fn new(work_dir: &Path) -> Self {
        LogShipper {
            work_dir: work_dir.to_path_buf(),
            kept: BTreeMap::new(),
        }
    }

    /// What to send with this sync: new output of the reported workers and
    /// of earlier ones not yet read to their end.
    pub fn pending(&mut self, reports: &[WorkerReport]) -> Vec<LogChunk> {
        for r in reports {
            for stream in [LogStream::Stdout, LogStream::Stderr] {
                self.kept
                    .entry((WorkerKey::reported(r), stream))
                    .or_insert(0);
            }
        }
        let reported = |k: &WorkerKey| {
            reports
                .iter()
                .any(|r| (r.job_id, r.rank, r.attempt) == (k.job_id, k.rank, k.attempt))
        };
        let (mut out, mut budget) = (Vec::new(), SYNC_MAX);
        let mut done = Vec::new();
        for ((key, stream), &offset) in &self.kept {
            let file = worker_dir(&self.work_dir, key).join(format!("{}.log", stream.as_str()));
            match read_from(&file, offset, CHUNK_MAX.min(budget)) {
                Some((text, len)) => {
                    budget -= len;
                    out.push(LogChunk {
                        job_id: key.job_id,
                        rank: key.rank,
                        attempt: key.attempt,
                        stream: *stream,
                        offset,
                        text,
                        len,
                    });
                }
                // Read to its end and no longer reported: done.
                None if !reported(key) => done.push((*key, *stream)),
                None => {}
            }
            if budget == 0 {
                break;
            }
        }
        for k in done {
            self.kept.remove(&k);
        }
        out
    }

    /// The region kept `chunks`.
    pub fn kept(&mut self, chunks: &[LogChunk]) {
        for c in chunks {
            let key = WorkerKey {
                job_id: c.job_id,
                rank: c.rank,
                attempt: c.attempt,
            };
            if let Some(at) = self.kept.get_mut(&(key, c.stream)) {
                *at = (*at).max(c.offset + c.len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(job: uuid::Uuid) -> WorkerReport {
        serde_json::from_value(serde_json::json!({
            "job_id": job, "rank": 0, "attempt": 1, "status": "running"
        }))
        .unwrap()
    }

    #[test]
    fn output_goes_once_it_is_kept_and_to_the_end_after_the_worker_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let job = uuid::Uuid::new_v4();
        let key = WorkerKey {
            job_id: job,
            rank: 0,
            attempt: 1,
        };
        let wd = worker_dir(dir.path(), &key);
        std::fs::create_dir_all(&wd).unwrap();
        std::fs::write(wd.join("stdout.log"), "one\ntwo\n").unwrap();
        let mut s = LogShipper::new(dir.path());
        let running = vec![report(job)];
        let first = s.pending(&running);
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].offset, first[0].text.as_str()), (0, "one\ntwo\n"));
        // Not kept: sent again.
        assert_eq!(s.pending(&running), first);
        s.kept(&first);
        assert!(s.pending(&running).is_empty());
        // More output, then the worker is no longer reported: its last
        // lines still go, then it is forgotten.
        std::fs::write(wd.join("stdout.log"), "one\ntwo\nthree é").unwrap();
        std::fs::write(wd.join("stderr.log"), "oops\n").unwrap();
        let last = s.pending(&[]);
        let texts: Vec<(&str, u64)> = last.iter().map(|c| (c.text.as_str(), c.offset)).collect();
        assert_eq!(texts, vec![("three é", 8), ("oops\n", 0)]);
        s.kept(&last);
        assert!(s.pending(&[]).is_empty());
        assert!(s.kept.is_empty());
    }

    #[test]
    fn a_split_character_waits_for_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        std::fs::write(&path, &"ab\u{e9}".as_bytes()[..3]).unwrap();
        assert_eq!(read_from(&path, 0, 100), Some(("ab".to_string(), 2)));
        std::fs::write(&path, "ab\u{e9}").unwrap();
        assert_eq!(read_from(&path, 2, 100), Some(("\u{e9}".to_string(), 2)));
    }
}
