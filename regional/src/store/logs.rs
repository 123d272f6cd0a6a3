//! Workers' output (`job_logs`, `job_log_sizes`: V31), shipped by agents
//! with their syncs and read by tenants through the API.
//!
//! An agent may only add output of workers placed on its own nodes (an
//! allocation of that job, rank and attempt on a node it serves): a node
//! cannot write into another tenant's job. A chunk is kept once by its
//! (job, attempt, rank, stream, offset), so an agent sends one again
//! until a sync says it was kept. A job keeps at most
//! [`JOB_LOG_LIMIT_BYTES`]; after that its output is counted, not kept.

use gangway_shared::agent::LogChunk;
use gangway_shared::api::{JobLogChunk, JobLogs, LogCursor, JOB_LOG_LIMIT_BYTES};
use uuid::Uuid;

use super::{Result, Store, StoreError};

/// Most chunks one read answers.
const READ_LIMIT: i64 = 1000;

impl Store {
    /// Keeps the chunks `agent_id` may add (its own workers'); how many
    /// were refused as not its own.
    pub async fn append_logs(&self, agent_id: &str, chunks: &[LogChunk]) -> Result<usize> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let mut refused = 0;
        // Whether each worker is the agent's, asked once a sync (its
        // stdout and stderr come together).
        let mut its_own: std::collections::HashMap<(Uuid, i32, i32), bool> = Default::default();
        for c in chunks {
            let (rank, offset, len) = (c.rank as i32, c.offset as i64, c.len as i64);
            let worker = (c.job_id, rank, c.attempt);
            let theirs = match its_own.get(&worker) {
                Some(&known) => known,
                None => {
                    let found = tx
                        .query_opt(
                            "SELECT 1 FROM allocations a JOIN nodes n ON n.node_id = a.node_id
                             WHERE a.job_id = $1 AND a.rank = $2 AND a.attempt = $3
                               AND n.agent_id = $4
                             LIMIT 1",
                            &[&c.job_id, &rank, &c.attempt, &agent_id],
                        )
                        .await?
                        .is_some();
                    its_own.insert(worker, found);
                    found
                }
            };
            if !theirs {
                refused += 1;
                continue;
            }
            // The job's row locked: two syncs of one job's ranks count
            // its bytes one after the other.
            let kept: i64 = tx
                .query_one(
                    "INSERT INTO job_log_sizes (job_id) VALUES ($1)
                     ON CONFLICT (job_id) DO UPDATE SET job_id = EXCLUDED.job_id
                     RETURNING kept",
                    &[&c.job_id],
                )
                .await?
                .get(0);
            let inserted = if kept + len > JOB_LOG_LIMIT_BYTES as i64 {
                0
            } else {
                tx.execute(
                    "INSERT INTO job_logs (job_id, attempt, rank, stream, byte_offset, len, text)
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                    &[
                        &c.job_id,
                        &c.attempt,
                        &rank,
                        &c.stream.as_str(),
                        &offset,
                        &len,
                        &c.text,
                    ],
                )
                .await?
            };
            let column = if inserted == 1 { "kept" } else { "dropped" };
            if inserted == 1 || kept + len > JOB_LOG_LIMIT_BYTES as i64 {
                tx.execute(
                    &format!("UPDATE job_log_sizes SET {column} = {column} + $2 WHERE job_id = $1"),
                    &[&c.job_id, &len],
                )
                .await?;
            }
        }
        tx.commit().await?;
        if refused > 0 {
            metrics::counter!("gangway_log_chunks_refused_total").increment(refused as u64);
        }
        Ok(refused)
    }

    /// The tenant's job's output after `after` (its `seq`), of one rank
    /// or attempt if asked.
    #[tracing::instrument(level = "debug", target = "gangway::db", name = "db", skip_all, fields(db.system = "postgresql", db.operation = "job_logs"))]
    pub async fn job_logs(
        &self,
        tenant: &str,
        id: Uuid,
        rank: Option<u32>,
        attempt: Option<i32>,
        after: i64,
    ) -> Result<JobLogs> {
        let conn = self.conn().await?;
        let job = conn
            .query_opt(
                "SELECT state IN ('succeeded', 'failed', 'cancelled') AS finished,
                        coalesce(s.kept, 0) AS kept, coalesce(s.dropped, 0) AS dropped
                 FROM jobs j LEFT JOIN job_log_sizes s USING (job_id)
                 WHERE j.job_id = $1 AND j.tenant = $2",
                &[&id, &tenant],
            )
            .await?
            .ok_or(StoreError::NotFound)?;
        let rank = rank.map(|r| r as i32);
        let rows = conn
            .query(
                "SELECT seq, attempt, rank, stream, byte_offset, text, at FROM job_logs
                 WHERE job_id = $1 AND seq > $2
                   AND ($3::int IS NULL OR rank = $3) AND ($4::int IS NULL OR attempt = $4)
                 ORDER BY seq LIMIT $5",
                &[&id, &after, &rank, &attempt, &(READ_LIMIT + 1)],
            )
            .await?;
        let more = rows.len() as i64 > READ_LIMIT;
        let chunks: Vec<JobLogChunk> = rows
            .iter()
            .take(READ_LIMIT as usize)
            .map(|r| JobLogChunk {
                region: self.region.clone(),
                seq: r.get("seq"),
                attempt: r.get("attempt"),
                rank: r.get::<_, i32>("rank") as u32,
                stream: r.get("stream"),
                offset: r.get::<_, i64>("byte_offset") as u64,
                text: r.get("text"),
                at: r.get("at"),
            })
            .collect();
        let mut cursor = LogCursor::default();
        cursor.set(&self.region, chunks.last().map_or(after, |c| c.seq));
        Ok(JobLogs {
            job_id: id,
            next_after: cursor.to_string(),
            chunks,
            more,
            finished: job.get("finished"),
            kept_bytes: job.get::<_, i64>("kept") as u64,
            dropped_bytes: job.get::<_, i64>("dropped") as u64,
            limit_bytes: JOB_LOG_LIMIT_BYTES,
            regions_unavailable: Vec::new(),
        })
    }
}
