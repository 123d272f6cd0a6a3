//! Capacity reservations: create, read, list, resize and delete, and the
//! check a job naming one makes when it is submitted.
//!
//! Every change that could break a promise (a create, a resize; deletes
//! too, for the keys' sake) runs under one transaction-level advisory lock
//! per region, so admissions are decided one at a time against every live
//! reservation of the type, and the running work the scheduler could not
//! evict for it. The decision itself is the core's
//! ([`gangway_sched::capacity::admit`]) on the type's non-spare nodes.
//! Keeping the promise is the scheduler's: the snapshot hands it the live
//! reservations (`plans.rs`).

use chrono::{DateTime, Utc};
use gangway_sched::capacity::{admit, Admission, Ask, Domain, Promised};
use gangway_sched::{Level, Node, PREEMPTIBLE_PRIORITY};
use gangway_shared::api::{
    JobSpec, Reservation, ReservationResize, ReservationSpec, ReservationState,
};
use gangway_shared::error::codes;
use tokio_postgres::{GenericClient, Row, Transaction};
use uuid::Uuid;

use super::plans::level_from_db;
use super::rows::{level_of, topology_of};
use super::{Result, Store, StoreError, Who};

/// Advisory lock key held while a reservation is admitted or changed
/// ("gangresv").
const RESERVATION_LOCK_KEY: i64 = 0x6761_6e67_7265_7376;

/// Takes the region's capacity lock (transaction-level): reservation
/// admissions and changes, and the dedicated clusters' creates and grows
/// (which take nodes out of what reservations are admitted on), one at a
/// time.
pub(super) async fn lock_capacity(tx: &Transaction<'_>) -> Result<()> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&RESERVATION_LOCK_KEY])
        .await?;
    Ok(())
}

/// Columns every reservation query selects, in the shape
/// [`reservation_from_row`] reads. `r` is `capacity_reservations`.
const RESERVATION_COLUMNS: &str = "r.reservation_id, r.tenant, r.gpu_type, r.gpus, \
     r.level::text AS level, r.path, r.start_at, r.end_at, r.created_at, r.updated_at, \
     CASE WHEN r.state = 'deleted' THEN 'deleted'
          WHEN r.end_at <= now() THEN 'ended'
          WHEN r.start_at > now() THEN 'scheduled'
          ELSE 'active' END AS state, \
     (SELECT count(*) FROM allocations a JOIN jobs j ON j.job_id = a.job_id \
      WHERE j.reservation_id = r.reservation_id AND a.released_at IS NULL) AS in_use";

/// A validated reservation request, ready to admit.
#[derive(Clone, Debug)]
pub struct NewReservation {
    /// Derived from (tenant, key) when keyed
    /// ([`gangway_shared::ids::reservation_id_for_key`]).
    pub id: Uuid,
    pub tenant: String,
    pub idempotency_key: Option<String>,
    /// The request as accepted (kept, and compared on retries).
    pub spec: ReservationSpec,
}

/// What a create, resize or delete did.
#[derive(Clone, Debug)]
pub enum ReservationOutcome {
    /// Done now: the reservation as it is after it.
    Done(Reservation),
    /// A retry of an earlier request with the same key and body: nothing
    /// was done again; the reservation as it is now.
    Replayed(Reservation),
}

impl ReservationOutcome {
    pub fn reservation(&self) -> &Reservation {
        match self {
            ReservationOutcome::Done(r) | ReservationOutcome::Replayed(r) => r,
        }
    }
}

/// A snapshot-clock second as a time.
fn at(t: u64) -> DateTime<Utc> {
    DateTime::from_timestamp(t.min(i64::MAX as u64) as i64, 0).unwrap_or_default()
}

fn secs(t: DateTime<Utc>) -> u64 {
    t.timestamp().max(0) as u64
}

fn window(start: u64, end: Option<u64>) -> String {
    match end {
        Some(e) => format!("[{}, {})", at(start).to_rfc3339(), at(e).to_rfc3339()),
        None => format!("from {} on", at(start).to_rfc3339()),
    }
}

pub(super) fn reservation_from_row(row: &Row, region: &str) -> Reservation {
    let state = match row.get::<_, &str>("state") {
        "deleted" => ReservationState::Deleted,
        "ended" => ReservationState::Ended,
        "scheduled" => ReservationState::Scheduled,
        _ => ReservationState::Active,
    };
    Reservation {
        id: row.get("reservation_id"),
        tenant: row.get("tenant"),
        region: region.to_string(),
        gpu_type: row.get("gpu_type"),
        gpus: row.get::<_, i32>("gpus").max(0) as u32,
        level: topology_of(level_from_db(row.get("level"))),
        domain: row.get("path"),
        start: row.get("start_at"),
        end: row.get("end_at"),
        state,
        in_use_gpus: row.get::<_, i64>("in_use").max(0) as u32,
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    }
}

/// What admission decides on, read inside the lock: the clock, the type's
/// non-spare nodes, and what is promised on them: its live reservations
/// (but `except`), and the running work that cannot be preempted.
struct Ground {
    now: u64,
    nodes: Vec<Node>,
    /// The reservations' promises first (`reserved` of them), then the
    /// running work's.
    promised: Vec<Promised>,
    reserved: usize,
}

/// Running units the scheduler may not evict for a reservation (above
/// [`PREEMPTIBLE_PRIORITY`], not in a live reservation of their own), per
/// (job, NVLink domain): their GPUs there and when they are expected to
/// end (start plus estimate). Admission counts them as promised until
/// then, so a reservation is not accepted on GPUs that only their end
/// would free; the earliest window then starts when they are expected to
/// be done.
const RUNNING_WORK_SQL: &str = "
    WITH run AS (
        SELECT a.job_id,
               extract(epoch FROM min(a.allocated_at))::bigint + j.estimated_duration_s AS end_s
        FROM allocations a JOIN jobs j ON j.job_id = a.job_id
        WHERE a.released_at IS NULL AND a.gpu_type = $1 AND j.priority > $2
          AND j.cluster_id IS NULL
          AND NOT EXISTS (SELECT 1 FROM capacity_reservations r
                          WHERE r.reservation_id = j.reservation_id AND r.state = 'active'
                            AND (r.end_at IS NULL OR r.end_at > now()))
        GROUP BY a.job_id, j.estimated_duration_s
    )
    SELECT n.spine, n.leaf, n.nvlink_domain, run.end_s, count(*)::int AS gpus
    FROM run
    JOIN allocations a ON a.job_id = run.job_id AND a.released_at IS NULL
    JOIN nodes n ON n.node_id = a.node_id
    WHERE run.end_s > extract(epoch FROM now())
    GROUP BY run.job_id, run.end_s, n.spine, n.leaf, n.nvlink_domain
    ORDER BY run.job_id, n.spine, n.leaf, n.nvlink_domain";

/// Reads the [`Ground`] for an admission about `gpu_type`. First moves the
/// type's partition version forward, so that a plan read before this
/// admission (which may place work the admission does not see) is stale
/// and commits nothing, and one committing meanwhile waits for this
/// transaction (the row's lock) and then finds itself stale, or committed
/// before the reads below and is seen by them.
async fn ground(tx: &Transaction<'_>, gpu_type: &str, except: Option<Uuid>) -> Result<Ground> {
    tx.execute(
        "INSERT INTO sched_partitions AS p (pool, version) VALUES ($1, 1)
         ON CONFLICT (pool) DO UPDATE SET version = p.version + 1",
        &[&gpu_type],
    )
    .await?;
    let now: i64 = tx
        .query_one("SELECT floor(extract(epoch FROM now()))::bigint", &[])
        .await?
        .get(0);
    let nodes = (tx.query(
        "SELECT n.node_id, n.spine, n.leaf, n.nvlink_domain, count(*)::int AS gpus
             FROM nodes n JOIN gpus g ON g.node_id = n.node_id
             WHERE n.gpu_type = $1 AND NOT n.spare AND n.cluster_id IS NULL
             GROUP BY n.node_id ORDER BY n.node_id",
        &[&gpu_type],
    ))
    .await?
    .iter()
    .map(|r| Node {
        id: r.get("node_id"),
        spine: r.get("spine"),
        leaf: r.get("leaf"),
        nvlink_domain: r.get("nvlink_domain"),
        gpu_type: gpu_type.to_string(),
        gpus: r.get::<_, i32>("gpus").max(0) as u32,
        free: Vec::new(),
        schedulable: true,
    })
    .collect();
    let promised = (tx.query(
        "SELECT gpus, level::text AS level, path,
                    extract(epoch FROM start_at)::bigint AS start_s,
                    extract(epoch FROM end_at)::bigint AS end_s
             FROM capacity_reservations
             WHERE gpu_type = $1 AND state = 'active' AND (end_at IS NULL OR end_at > now())
               AND reservation_id IS DISTINCT FROM $2
             ORDER BY start_at, reservation_id",
        &[&gpu_type, &except],
    ))
    .await?
    .iter()
    .map(|r| Promised {
        gpus: r.get::<_, i32>("gpus").max(0) as u32,
        domain: Domain {
            level: level_from_db(r.get("level")),
            path: r.get("path"),
        },
        start: r.get::<_, i64>("start_s").max(0) as u64,
        end: r.get::<_, Option<i64>>("end_s").map(|e| e.max(0) as u64),
    })
    .collect::<Vec<_>>();
    let now = now.max(0) as u64;
    let preemptible = PREEMPTIBLE_PRIORITY as i16;
    let running = (tx
        .query(RUNNING_WORK_SQL, &[&gpu_type, &preemptible])
        .await?)
        .iter()
        .map(|r| Promised {
            gpus: r.get::<_, i32>("gpus").max(0) as u32,
            domain: Domain {
                level: Level::Nvlink,
                path: vec![r.get("spine"), r.get("leaf"), r.get("nvlink_domain")],
            },
            start: now,
            end: Some(r.get::<_, i64>("end_s").max(0) as u64),
        })
        .collect::<Vec<_>>();
    let reserved = promised.len();
    let promised = promised.into_iter().chain(running).collect();
    Ok(Ground {
        now,
        nodes,
        promised,
        reserved,
    })
}

/// Whether every live reservation of `gpu_type` could still be honoured
/// if `removed` (idle nodes a dedicated cluster takes) left the capacity
/// reservations are admitted on: `Err` with the first one that could not.
/// The caller holds the capacity lock ([`lock_capacity`]).
pub(super) async fn promises_hold_without(
    tx: &Transaction<'_>,
    gpu_type: &str,
    removed: &std::collections::BTreeSet<String>,
) -> Result<std::result::Result<(), String>> {
    let g = ground(tx, gpu_type, None).await?;
    let nodes: Vec<Node> = (g.nodes.into_iter())
        .filter(|n| !removed.contains(&n.id))
        .collect();
    for i in 0..g.reserved {
        let p = &g.promised[i];
        let others: Vec<Promised> = (g.promised.iter().enumerate())
            .filter(|(j, _)| *j != i)
            .map(|(_, q)| q.clone())
            .collect();
        let ask = Ask {
            gpus: p.gpus,
            level: p.domain.level,
            start: p.start.max(g.now),
            end: p.end,
        };
        if let Admission::Refused { .. } =
            gangway_sched::capacity::admit_within(&nodes, &others, &ask, &p.domain)
        {
            return Ok(Err(format!(
                "{} GPUs reserved in {} {} for {}",
                p.gpus,
                p.domain.level,
                p.domain.name(),
                window(ask.start, ask.end)
            )));
        }
    }
    Ok(Ok(()))
}

/// Whether `ask` fits in `domain` (a resize keeps its reservation's
/// domain), with the refusal worded for it.
fn admit_within(nodes: &[Node], promised: &[Promised], ask: &Ask, domain: &Domain) -> Admission {
    match gangway_sched::capacity::admit_within(nodes, promised, ask, domain) {
        Admission::Refused { earliest, .. } => Admission::Refused {
            why: format!(
                "its {} domain {} cannot keep {} GPUs unreserved for the whole window {} \
                 next to the other reservations there",
                domain.level,
                domain.name(),
                ask.gpus,
                window(ask.start, ask.end)
            ),
            earliest,
        },
        admitted => admitted,
    }
}

/// The refusal of an admission.
fn refused(why: String, earliest: Option<(u64, Option<u64>)>) -> StoreError {
    StoreError::ReservationRefused {
        why,
        earliest: earliest.map(|(s, e)| (at(s), e.map(at))),
    }
}

fn invalid(message: String) -> StoreError {
    StoreError::Invalid {
        code: codes::INVALID_RESERVATION,
        message,
    }
}

fn conflict(message: String) -> StoreError {
    StoreError::Conflict {
        code: codes::RESERVATION_CONFLICT,
        message,
    }
}

impl Store {
    async fn reservation_in<C: GenericClient + Sync>(
        &self,
        client: &C,
        tenant: Option<&str>,
        id: Uuid,
    ) -> Result<Reservation> {
        let row = client
            .query_opt(
                &format!(
                    "SELECT {RESERVATION_COLUMNS} FROM capacity_reservations r
                     WHERE r.reservation_id = $1 AND ($2::text IS NULL OR r.tenant = $2)"
                ),
                &[&id, &tenant],
            )
            .await?
            .ok_or(StoreError::NotFound)?;
        Ok(reservation_from_row(&row, self.region()))
    }

    /// Admits and stores a reservation, or returns the one an earlier
    /// create with the same key made. One that cannot be honoured is
    /// [`StoreError::ReservationRefused`] with why and the earliest window
    /// of the same length that would work; nothing is written.
    /// An operator's create (`who`) is audited as `reservation.create`.
    pub async fn create_reservation(
        &self,
        new: &NewReservation,
        who: Who<'_>,
    ) -> Result<ReservationOutcome> {
        let request = serde_json::to_value(&new.spec).expect("a ReservationSpec serializes");
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_capacity(&tx).await?;
        if let Some(key) = &new.idempotency_key {
            let keyed = &super::keyed::RESERVATIONS;
            if keyed
                .earlier_create(&tx, new.id, &new.tenant, key, &request)
                .await?
            {
                let r = self.reservation_in(&*tx, Some(&new.tenant), new.id).await?;
                return Ok(ReservationOutcome::Replayed(r));
            }
        }
        let spec = &new.spec;
        let g = ground(&tx, &spec.gpu_type, None).await?;
        if g.nodes.is_empty() {
            return Err(StoreError::Invalid {
                code: codes::UNKNOWN_GPU_TYPE,
                message: format!(
                    "this region has no GPUs of type {:?}; GET /v1/region lists the types it has",
                    spec.gpu_type
                ),
            });
        }
        // A start in the past is a start now.
        let start = spec.start.map_or(g.now, secs).max(g.now);
        let end = spec.end.map(secs);
        if end.is_some_and(|e| e <= start) {
            return Err(invalid(format!(
                "the end ({}) must be after the start and after now ({})",
                spec.end.map(|e| e.to_rfc3339()).unwrap_or_default(),
                at(start).to_rfc3339()
            )));
        }
        let ask = Ask {
            gpus: spec.gpus.clamp(0, i64::from(u32::MAX)) as u32,
            level: level_of(spec.level),
            start,
            end,
        };
        let domain = match admit(&g.nodes, &g.promised, &ask) {
            Admission::Admitted { domain } => domain,
            Admission::Refused { why, earliest } => return Err(refused(why, earliest)),
        };
        tx.execute(
            "INSERT INTO capacity_reservations (reservation_id, tenant, idempotency_key, gpu_type,
                                                gpus, level, path, start_at, end_at, request)
             VALUES ($1, $2, $3, $4, $5, $6::text::topology_level, $7,
                     to_timestamp($8::bigint), to_timestamp($9::bigint), $10)",
            &[
                &new.id,
                &new.tenant,
                &new.idempotency_key,
                &spec.gpu_type,
                &(ask.gpus as i32),
                &domain.level.as_str(),
                &domain.path,
                &(start as i64),
                &end.map(|e| e as i64),
                &request,
            ],
        )
        .await?;
        let r = self.reservation_in(&*tx, None, new.id).await?;
        who.audit(
            &tx,
            "reservation.create",
            new.id,
            serde_json::json!({"tenant": new.tenant, "gpu_type": r.gpu_type, "gpus": r.gpus,
                               "domain": r.domain, "start": r.start, "end": r.end}),
        )
        .await?;
        tx.commit().await?;
        Ok(ReservationOutcome::Done(r))
    }

    /// A reservation of `tenant`'s (any tenant's for `None`: operators).
    /// Another tenant's is [`StoreError::NotFound`]. Deleted and ended
    /// reservations stay readable.
    pub async fn get_reservation(&self, tenant: Option<&str>, id: Uuid) -> Result<Reservation> {
        let conn = self.conn().await?;
        self.reservation_in(&**conn, tenant, id).await
    }

    /// `tenant`'s reservations (every tenant's for `None`: operators),
    /// newest first, deleted and ended ones included.
    pub async fn list_reservations(&self, tenant: Option<&str>) -> Result<Vec<Reservation>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!(
                    "SELECT {RESERVATION_COLUMNS} FROM capacity_reservations r
                     WHERE $1::text IS NULL OR r.tenant = $1
                     ORDER BY r.created_at DESC, r.reservation_id DESC"
                ),
                &[&tenant],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| reservation_from_row(r, self.region()))
            .collect())
    }

    /// Changes a reservation's size and/or end, admitted again against the
    /// others in the domain it is pinned to (a reservation never moves:
    /// its jobs run there). Refused ([`StoreError::ReservationRefused`])
    /// when it no longer fits there, with the earliest window that would;
    /// [`StoreError::Conflict`] when it is deleted or over, or the new
    /// size is below what its running jobs hold.
    pub async fn resize_reservation(
        &self,
        who: Who<'_>,
        id: Uuid,
        key: Option<&str>,
        resize: &ReservationResize,
    ) -> Result<ReservationOutcome> {
        let request = serde_json::to_value(resize).expect("a ReservationResize serializes");
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_capacity(&tx).await?;
        let current = self.reservation_in(&*tx, who.tenant(), id).await?;
        let tenant = current.tenant.as_str();
        if let Some(k) = key {
            if super::keyed::RESERVATIONS
                .earlier_change(&tx, tenant, k, id, "resize", &request)
                .await?
            {
                return Ok(ReservationOutcome::Replayed(current));
            }
        }
        match current.state {
            ReservationState::Deleted => {
                return Err(conflict(format!(
                    "reservation {id} was deleted; create a new one"
                )))
            }
            ReservationState::Ended => {
                return Err(conflict(format!(
                    "reservation {id} is over; create a new one"
                )))
            }
            ReservationState::Scheduled | ReservationState::Active => {}
        }
        let gpus = resize
            .gpus
            .map_or(current.gpus, |g| g.clamp(0, i64::from(u32::MAX)) as u32);
        if gpus < current.in_use_gpus {
            return Err(conflict(format!(
                "reservation {id}'s running jobs hold {} of its GPUs; it cannot shrink to {gpus} \
                 until some of them end (cancel them, or resize to at least {})",
                current.in_use_gpus, current.in_use_gpus
            )));
        }
        let end = resize.end.unwrap_or(current.end);
        let g = ground(&tx, &current.gpu_type, Some(id)).await?;
        let start = secs(current.start).max(g.now);
        let end_s = end.map(secs);
        if end_s.is_some_and(|e| e <= start) {
            return Err(invalid(format!(
                "the new end ({}) must be after the start and after now ({})",
                end.map(|e| e.to_rfc3339()).unwrap_or_default(),
                at(start).to_rfc3339()
            )));
        }
        let domain = Domain {
            level: level_of(current.level),
            path: current.domain.clone(),
        };
        let ask = Ask {
            gpus,
            level: domain.level,
            start,
            end: end_s,
        };
        if let Admission::Refused { why, earliest } =
            admit_within(&g.nodes, &g.promised, &ask, &domain)
        {
            return Err(refused(why, earliest));
        }
        tx.execute(
            "UPDATE capacity_reservations
             SET gpus = $2, end_at = to_timestamp($3::bigint), updated_at = now()
             WHERE reservation_id = $1",
            &[&id, &(gpus as i32), &end_s.map(|e| e as i64)],
        )
        .await?;
        super::keyed::RESERVATIONS
            .record(&tx, tenant, key, id, "resize", &request)
            .await?;
        who.audit(
            &tx,
            "reservation.resize",
            id,
            serde_json::json!({"tenant": tenant, "gpus": gpus, "end": end}),
        )
        .await?;
        let r = self.reservation_in(&*tx, None, id).await?;
        tx.commit().await?;
        Ok(ReservationOutcome::Done(r))
    }

    /// Deletes a reservation: its GPUs are no longer held, jobs running in
    /// it go on as ordinary work, and its queued jobs wait
    /// (`reservation_unavailable`) until cancelled. Deleting a deleted
    /// reservation changes nothing and answers the same.
    pub async fn delete_reservation(
        &self,
        who: Who<'_>,
        id: Uuid,
        key: Option<&str>,
    ) -> Result<ReservationOutcome> {
        let request = serde_json::json!({});
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_capacity(&tx).await?;
        let current = self.reservation_in(&*tx, who.tenant(), id).await?;
        let tenant = current.tenant.as_str();
        if let Some(k) = key {
            if super::keyed::RESERVATIONS
                .earlier_change(&tx, tenant, k, id, "delete", &request)
                .await?
            {
                return Ok(ReservationOutcome::Replayed(current));
            }
        }
        if current.state != ReservationState::Deleted {
            tx.execute(
                "UPDATE capacity_reservations SET state = 'deleted', updated_at = now()
                 WHERE reservation_id = $1",
                &[&id],
            )
            .await?;
        }
        super::keyed::RESERVATIONS
            .record(&tx, tenant, key, id, "delete", &request)
            .await?;
        who.audit(
            &tx,
            "reservation.delete",
            id,
            serde_json::json!({"tenant": tenant}),
        )
        .await?;
        let r = self.reservation_in(&*tx, None, id).await?;
        tx.commit().await?;
        Ok(ReservationOutcome::Done(r))
    }

    /// Checks that `tenant`'s job `spec` may run in the reservation it
    /// names (if any): the tenant's, of the job's GPU type, neither deleted
    /// nor over, holding at least the job's GPUs. Otherwise
    /// [`StoreError::Invalid`] (`invalid_reservation`) saying which.
    pub async fn check_job_reservation(&self, tenant: &str, spec: &JobSpec) -> Result<()> {
        let Some(id) = spec.reservation else {
            return Ok(());
        };
        let conn = self.conn().await?;
        check_job_reservation(&**conn, self.region(), tenant, spec, id).await
    }
}

/// [`Store::check_job_reservation`] on `client`.
pub(super) async fn check_job_reservation<C: GenericClient + Sync>(
    client: &C,
    region: &str,
    tenant: &str,
    spec: &JobSpec,
    id: Uuid,
) -> Result<()> {
    let row = client
        .query_opt(
            "SELECT gpu_type, gpus, state, end_at, end_at <= now() AS over
             FROM capacity_reservations WHERE reservation_id = $1 AND tenant = $2",
            &[&id, &tenant],
        )
        .await?;
    let Some(row) = row else {
        return Err(invalid(format!(
            "you have no reservation {id} in region {region}; GET /v1/reservations lists yours"
        )));
    };
    let gpu_type: &str = row.get("gpu_type");
    let gpus = i64::from(row.get::<_, i32>("gpus"));
    if row.get::<_, &str>("state") == "deleted" {
        return Err(invalid(format!(
            "reservation {id} was deleted; name another one, or none"
        )));
    }
    if row.get::<_, Option<bool>>("over") == Some(true) {
        let end: Option<DateTime<Utc>> = row.get("end_at");
        return Err(invalid(format!(
            "reservation {id} ended at {}; name another one, or none",
            end.map(|e| e.to_rfc3339()).unwrap_or_default()
        )));
    }
    if gpu_type != spec.gpu_type {
        return Err(invalid(format!(
            "reservation {id} holds {gpu_type} GPUs, and the job asks for {}",
            spec.gpu_type
        )));
    }
    if spec.gpus > gpus {
        return Err(invalid(format!(
            "the job asks for {} GPUs, more than reservation {id} holds ({gpus}); ask for \
             fewer, or resize the reservation",
            spec.gpus
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` 8-GPU nodes per leaf, leaves `l0`, `l1` under spines `s0`,
    /// `s1`.
    fn fleet(n: usize) -> Vec<Node> {
        let mut nodes = Vec::new();
        for s in 0..2 {
            for l in 0..2 {
                for i in 0..n {
                    let id = format!("s{s}-l{l}-n{i}");
                    nodes.push(Node {
                        id: id.clone(),
                        spine: format!("s{s}"),
                        leaf: format!("s{s}-l{l}"),
                        nvlink_domain: id,
                        gpu_type: "h100".into(),
                        gpus: 8,
                        free: Vec::new(),
                        schedulable: true,
                    });
                }
            }
        }
        nodes
    }

    fn spine(s: &str) -> Domain {
        Domain {
            level: Level::Spine,
            path: vec![s.into()],
        }
    }

    fn ask(gpus: u32, start: u64, end: Option<u64>) -> Ask {
        Ask {
            gpus,
            level: Level::Spine,
            start,
            end,
        }
    }

    #[test]
    fn within_a_domain_only_that_domain_counts() {
        let nodes = fleet(2); // 32 GPUs per spine
        let s1_busy = Promised {
            gpus: 32,
            domain: spine("s1"),
            start: 0,
            end: Some(100),
        };
        // s0 is free: 32 fit there, whatever s1 holds.
        let a = admit_within(
            &nodes,
            std::slice::from_ref(&s1_busy),
            &ask(32, 0, None),
            &spine("s0"),
        );
        assert_eq!(
            a,
            Admission::Admitted {
                domain: spine("s0")
            }
        );
        // s1 is full until 100: the earliest window there starts then.
        let a = admit_within(&nodes, &[s1_busy], &ask(1, 0, Some(10)), &spine("s1"));
        match a {
            Admission::Refused { why, earliest } => {
                assert_eq!(earliest, Some((100, Some(110))));
                assert!(why.contains("spine domain s1"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        // More than the domain has: never, though the region could.
        let a = admit_within(&nodes, &[], &ask(33, 0, None), &spine("s0"));
        assert!(
            matches!(a, Admission::Refused { earliest: None, .. }),
            "{a:?}"
        );
    }

    #[test]
    fn within_a_domain_the_load_above_it_still_counts() {
        let nodes = fleet(1); // 16 GPUs per spine, 32 in the region
                              // A region-wide reservation of 24 leaves 8 for any spine.
        let wide = Promised {
            gpus: 24,
            domain: Domain {
                level: Level::Region,
                path: Vec::new(),
            },
            start: 0,
            end: None,
        };
        let w = std::slice::from_ref(&wide);
        assert!(matches!(
            admit_within(&nodes, w, &ask(8, 0, None), &spine("s0")),
            Admission::Admitted { .. }
        ));
        assert!(matches!(
            admit_within(&nodes, w, &ask(9, 0, None), &spine("s0")),
            Admission::Refused { .. }
        ));
        // The same as the core says for the one-spine fleet.
        let one: Vec<Node> = nodes.iter().filter(|n| n.spine == "s0").cloned().collect();
        let in_one = Promised { gpus: 8, ..wide };
        assert!(matches!(
            admit(&one, std::slice::from_ref(&in_one), &ask(9, 0, None)),
            Admission::Refused { .. }
        ));
        assert!(matches!(
            admit_within(&one, &[in_one], &ask(8, 0, None), &spine("s0")),
            Admission::Admitted { .. }
        ));
    }
}
