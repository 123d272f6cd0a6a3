//! A job's output through the global tier: every region that ran an
//! attempt of the job keeps that attempt's output (`store/logs.rs` there),
//! so a job that moved (an evacuation, a failover, a balancing move) has
//! its output in more than one region. Each read asks every region at
//! once; the regions that have the job answer from the cursor's entry for
//! them, and their answers are merged into one, in the order the chunks
//! were received.

use std::collections::VecDeque;
use std::time::Duration;

use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use gangway_shared::api::{JobLogChunk, JobLogs, LogCursor, JOB_LOG_LIMIT_BYTES};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, JobId, Query};
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::relay::{relay, RETRY_AFTER_S};
use super::responses;
use crate::auth::TenantCaller;
use crate::regions::{Call, Who};
use crate::state::GlobalState;

#[derive(Clone, Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogsParams {
    /// Only this worker rank's output.
    rank: Option<u32>,
    /// Only this attempt's (a job restarted after a preemption or a lost
    /// node runs again as a new attempt; attempts count per region).
    attempt: Option<i32>,
    /// Only chunks after this cursor (the `next_after` of a read, as it
    /// was given).
    after: Option<String>,
    /// Stream the output as it comes (`application/x-ndjson`, one
    /// `JobLogChunk` a line) until the job has ended and its output is
    /// whole.
    #[serde(default)]
    follow: bool,
}

impl LogsParams {
    fn region_query(&self, after: &LogCursor) -> String {
        let mut q = vec![("after", after.to_string())];
        if let Some(r) = self.rank {
            q.push(("rank", r.to_string()));
        }
        if let Some(a) = self.attempt {
            q.push(("attempt", a.to_string()));
        }
        gangway_shared::http::query_string(&q)
    }
}

/// A job's output
///
/// Its workers' standard output and error, every attempt, from every
/// region that ran one (a job that moved between regions has its earlier
/// attempts' output where they ran), in the order it was received (agents
/// ship it as it is written, so it outlives the node). At most
/// `limit_bytes` (16 MiB) a job and region are kept; `dropped_bytes` says
/// how much was not. Read on with `after`, or `follow=true` to stream
/// until the job has ended. A region that does not answer is named in
/// `regions_unavailable` (what it holds comes once it answers again).
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/logs",
    operation_id = "job_logs",
    tag = "jobs",
    security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The job's id."), LogsParams),
    responses(
        (status = 200, description = "The output after `after` (with `follow`, a stream of \
            `JobLogChunk` lines).", body = JobLogs),
        (status = 400, description = responses::errors(
            "A query parameter is unknown or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::JobNotFound),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn logs(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    JobId(id): JobId,
    Query(p): Query<LogsParams>,
) -> Result<Response, ApiError> {
    let after: LogCursor = (p.after.as_deref().unwrap_or("").parse()).map_err(|e: String| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            format!("after: {e}"),
        )
    })?;
    let reader = Reader {
        state,
        tenant: caller.tenant,
        id,
        params: p,
    };
    let (first, next) = match reader.read(&after).await {
        Ok(read) => read,
        Err(Refused::Region(answer)) => return Ok(relay(answer)),
        Err(Refused::Global(e)) => return Err(e),
    };
    if !reader.params.follow {
        return Ok(axum::Json(first).into_response());
    }
    // Polls the regions: at once while there is more, every second while
    // the job runs; ends once the job has ended and three reads in a row
    // found nothing (its agent's last sync may still carry a piece), or
    // after ten failed reads in a row.
    struct Follow {
        reader: Reader,
        pending: Option<(JobLogs, LogCursor)>,
        after: LogCursor,
        more: bool,
        quiet: u32,
        failed: u32,
    }
    let start = Follow {
        reader,
        after: after.clone(),
        more: false,
        pending: Some((first, next)),
        quiet: 0,
        failed: 0,
    };
    let stream = futures_util::stream::unfold(start, |mut f| async move {
        loop {
            let (logs, next) = match f.pending.take() {
                Some(l) => l,
                None => {
                    if !f.more {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    match f.reader.read(&f.after).await {
                        Ok(l) => l,
                        Err(_) if f.failed < 10 => {
                            f.failed += 1;
                            f.more = false;
                            continue;
                        }
                        Err(_) => return None,
                    }
                }
            };
            f.failed = 0;
            f.after = next;
            f.more = logs.more;
            if logs.chunks.is_empty() {
                f.quiet = if logs.finished { f.quiet + 1 } else { 0 };
                if f.quiet >= 3 {
                    return None;
                }
                continue;
            }
            f.quiet = 0;
            let mut lines = Vec::new();
            for c in &logs.chunks {
                serde_json::to_writer(&mut lines, c).expect("a chunk serializes");
                lines.push(b'\n');
            }
            return Some((Ok::<_, std::convert::Infallible>(lines), f));
        }
    });
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(stream),
    )
        .into_response())
}

/// Why a read gave no output: a region's refusal (a bad query), passed on
/// as it is, or the global tier's own (no region has the job, or none
/// that may have it answered).
enum Refused {
    Region(crate::regions::Answer),
    Global(ApiError),
}

/// Reads one tenant's job's output from the regions.
struct Reader {
    state: GlobalState,
    tenant: String,
    id: Uuid,
    params: LogsParams,
}

impl Reader {
    /// One read from every region at once, from `after`, merged; and the
    /// cursor to read on from.
    async fn read(&self, after: &LogCursor) -> Result<(JobLogs, LogCursor), Refused> {
        let path = format!("/v1/jobs/{}/logs", self.id);
        let query = self.params.region_query(after);
        let asks = self.state.regions.list.iter().map(|r| {
            let call = Call {
                query: Some(&query),
                ..Who::Tenant(&self.tenant).call()
            };
            let (path, regions) = (&path, &self.state.regions);
            async move { (r, regions.call(r, Method::GET, path, call).await) }
        });
        let mut parts = Vec::new();
        let mut down = Vec::new();
        for (region, answer) in join_all(asks).await {
            match answer {
                Ok(a) if a.status == StatusCode::NOT_FOUND => {}
                Ok(a) if a.status.is_server_error() => down.push(region.name.clone()),
                Ok(a) if a.status != StatusCode::OK => return Err(Refused::Region(a)),
                Ok(a) => match serde_json::from_slice::<JobLogs>(&a.body) {
                    Ok(logs) => parts.push(logs),
                    Err(_) => down.push(region.name.clone()),
                },
                Err(_) => down.push(region.name.clone()),
            }
        }
        if parts.is_empty() {
            return Err(Refused::Global(if down.is_empty() {
                ApiError::not_found("job")
            } else {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::REGION_UNAVAILABLE,
                    format!(
                        "the job was not found in the regions that answered, and {} did not \
                         answer; retry shortly",
                        down.join(", ")
                    ),
                )
                .with_retry_after(RETRY_AFTER_S)
            }));
        }
        Ok(merge(self.id, parts, after, down))
    }
}

/// The regions' answers as one: every region's chunks in its own order
/// (`seq`), the regions' interleaved by when they were received. A region
/// with more to read than it sent stops the merge where its answer ends
/// (what it has not sent yet may come before the others' next chunks), so
/// each region's chunks given are a prefix of its own, and the cursor
/// moves past exactly those. The job has ended once every region that has
/// it says so (a region it moved away from has ended its copy). Also
/// returns the cursor (`next_after`) as a value.
pub(crate) fn merge(
    job_id: Uuid,
    parts: Vec<JobLogs>,
    after: &LogCursor,
    regions_unavailable: Vec<String>,
) -> (JobLogs, LogCursor) {
    let finished = parts.iter().all(|p| p.finished);
    let (kept_bytes, dropped_bytes) =
        (parts.iter()).fold((0, 0), |(k, d), p| (k + p.kept_bytes, d + p.dropped_bytes));
    let mut queues: Vec<(bool, VecDeque<JobLogChunk>)> = (parts.into_iter())
        .map(|p| (p.more, p.chunks.into()))
        .collect();
    let mut cursor = after.clone();
    let mut chunks = Vec::new();
    let mut more = false;
    loop {
        if queues.iter().any(|(more, q)| *more && q.is_empty()) {
            more = true;
            break;
        }
        let next = (queues.iter_mut())
            .filter_map(|(_, q)| q.front().map(|c| (c.at, c.region.clone())).zip(Some(q)))
            .min_by(|(a, _), (b, _)| a.cmp(b));
        let Some((_, q)) = next else { break };
        let c = q.pop_front().expect("a front");
        cursor.set(&c.region, c.seq);
        chunks.push(c);
    }
    let logs = JobLogs {
        job_id,
        chunks,
        next_after: cursor.to_string(),
        more,
        finished,
        kept_bytes,
        dropped_bytes,
        limit_bytes: JOB_LOG_LIMIT_BYTES,
        regions_unavailable,
    };
    (logs, cursor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn chunk(region: &str, seq: i64, at_s: i64, text: &str) -> JobLogChunk {
        JobLogChunk {
            region: region.into(),
            seq,
            attempt: 1,
            rank: 0,
            stream: "stdout".into(),
            offset: 0,
            text: text.into(),
            at: Utc.timestamp_opt(1_800_000_000 + at_s, 0).unwrap(),
        }
    }

    fn part(chunks: Vec<JobLogChunk>, more: bool, finished: bool) -> JobLogs {
        let mut cursor = LogCursor::default();
        if let Some(c) = chunks.last() {
            cursor.set(&c.region, c.seq);
        }
        JobLogs {
            job_id: Uuid::nil(),
            next_after: cursor.to_string(),
            chunks,
            more,
            finished,
            kept_bytes: 10,
            dropped_bytes: 1,
            limit_bytes: JOB_LOG_LIMIT_BYTES,
            regions_unavailable: vec![],
        }
    }

    fn texts(l: &JobLogs) -> String {
        l.chunks.iter().map(|c| c.text.as_str()).collect()
    }

    #[test]
    fn a_cursor_is_written_and_read_back_and_a_bad_one_is_refused() {
        let c: LogCursor = "us-east:120,us-west:7".parse().unwrap();
        assert_eq!(
            (c.get("us-east"), c.get("us-west"), c.get("eu")),
            (120, 7, 0)
        );
        assert_eq!(c.to_string(), "us-east:120,us-west:7");
        assert_eq!("".parse::<LogCursor>().unwrap(), LogCursor::default());
        for bad in ["12", "us-east:", ":3", "a:-1", "a:1,a:2", "a b:1", "a:x"] {
            assert!(bad.parse::<LogCursor>().is_err(), "{bad}");
        }
    }

    /// A job ran in r1 (attempt 1), moved to r2, and came back to r1: its
    /// output reads in the order it was written, each region's cursor
    /// moving past what was given.
    #[test]
    fn regions_output_is_interleaved_by_when_it_was_received() {
        let r1 = part(
            vec![
                chunk("r1", 4, 0, "a"),
                chunk("r1", 9, 1, "b"),
                chunk("r1", 30, 20, "e"),
            ],
            false,
            false,
        );
        let r2 = part(
            vec![chunk("r2", 2, 10, "c"), chunk("r2", 3, 11, "d")],
            false,
            true,
        );
        let (merged, _) = merge(Uuid::nil(), vec![r2, r1], &LogCursor::default(), vec![]);
        assert_eq!(texts(&merged), "abcde");
        assert_eq!(merged.next_after, "r1:30,r2:3");
        assert!(!merged.more && !merged.finished, "r1's copy still runs");
        assert_eq!((merged.kept_bytes, merged.dropped_bytes), (20, 2));
    }

    /// A region with more than it sent holds the others back where its
    /// answer ends; the next read from the cursor goes on from there, and
    /// nothing is given twice or skipped.
    #[test]
    fn a_region_with_more_to_read_holds_the_others_back_where_its_answer_ends() {
        let after: LogCursor = "r2:1".parse().unwrap();
        let r1 = part(
            vec![chunk("r1", 1, 0, "a"), chunk("r1", 2, 5, "b")],
            true,
            true,
        );
        let r2 = part(
            vec![chunk("r2", 2, 3, "x"), chunk("r2", 3, 6, "y")],
            false,
            true,
        );
        let (merged, _) = merge(Uuid::nil(), vec![r1, r2], &after, vec!["r3".into()]);
        assert_eq!(texts(&merged), "axb");
        assert_eq!(merged.next_after, "r1:2,r2:2");
        assert!(merged.more && merged.finished);
        assert_eq!(merged.regions_unavailable, vec!["r3".to_string()]);
        // Within a region, its own order wins over the times it gives.
        let r1 = part(
            vec![chunk("r1", 7, 9, "late"), chunk("r1", 8, 2, "early")],
            false,
            true,
        );
        let (merged, _) = merge(Uuid::nil(), vec![r1], &LogCursor::default(), vec![]);
        assert_eq!(texts(&merged), "lateearly");
        assert_eq!(merged.next_after, "r1:8");
        // Nothing new: the cursor stays where it was.
        let (merged, _) = merge(Uuid::nil(), vec![part(vec![], false, true)], &after, vec![]);
        assert_eq!((merged.next_after.as_str(), merged.more), ("r2:1", false));
    }
}
