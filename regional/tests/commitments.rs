//! Committed capacity (docs/billing.md) against a real PostgreSQL: every
//! change of a guaranteed quota, a capacity reservation or a dedicated
//! cluster is kept as a version (V20's triggers, whatever code path made
//! it), and the region answers what each tenant had committed per
//! commitment and clock hour — a reservation resized mid-hour holds each
//! size for its part, a deleted cluster until its deletion, a changed
//! guarantee what held then.

use std::time::Duration;

use chrono::{DateTime, Utc};
use gangway_regional::store::{NewCluster, NewReservation, ReservationOutcome, Who};
use gangway_regional::Store;
use gangway_shared::api::{
    ClusterSpec, QuotaTerms, ReservationResize, ReservationSpec, TopologyLevel,
};
use gangway_shared::billing::{bill, CommitmentKind, CommitmentRecord, Decimal, PriceBook};
use uuid::Uuid;

mod common;
use common::{node, Fleet};

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Four nodes of 8 h100 GPUs on one leaf, heard from.
async fn fleet(store: &Store) {
    let nodes: Vec<_> = (0..4)
        .map(|n| node(&format!("n{n}"), "s0", "l0", "h100"))
        .collect();
    let fleet = Fleet::register_nodes(store, nodes).await;
    for n in 0..4 {
        fleet.sync(store, n, "boot-1", vec![], vec![]).await;
    }
}

/// The versions of one commitment: (GPUs, open?), oldest first.
async fn versions(db: &tokio_postgres::Client, kind: &str, id: &str) -> Vec<(i32, bool)> {
    db.query(
        "SELECT gpus, valid_until IS NULL FROM commitment_history
         WHERE kind = $1 AND commitment_id = $2 ORDER BY version_id",
        &[&kind, &id],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// Moves the versions of one commitment (oldest first) to these validity
/// intervals, in minutes after `base` (`None`: still in force), and a
/// reservation's window to start at `base`: the clock of the test.
async fn retime(
    db: &tokio_postgres::Client,
    kind: &str,
    id: &str,
    base: DateTime<Utc>,
    spans: &[(i64, Option<i64>)],
) {
    let ids: Vec<i64> = db
        .query(
            "SELECT version_id FROM commitment_history
             WHERE kind = $1 AND commitment_id = $2 ORDER BY version_id",
            &[&kind, &id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids.len(), spans.len());
    let at = |m: i64| base + chrono::Duration::minutes(m);
    for (v, &(from, until)) in ids.iter().zip(spans) {
        db.execute(
            "UPDATE commitment_history
             SET valid_from = $2, valid_until = $3,
                 window_start = CASE WHEN window_start IS NULL THEN NULL ELSE $4::timestamptz END
             WHERE version_id = $1",
            &[v, &at(from), &until.map(at), &base],
        )
        .await
        .unwrap();
    }
}

/// Every commitment record of `tenant` in [from, to), page by page (two a
/// page), in id order.
async fn facts(
    store: &Store,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    tenant: &str,
) -> Vec<CommitmentRecord> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .usage_commitments(from, to, Some(tenant), after, 2)
            .await
            .unwrap();
        assert!(page.commitments.len() <= 2);
        all.extend(page.commitments);
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert!(all.windows(2).all(|w| w[0].record_id < w[1].record_id));
    all
}

/// (hour offset from `base`, GPU-seconds, most GPUs) of `kind`'s records,
/// by hour.
fn by_hour(
    records: &[CommitmentRecord],
    kind: CommitmentKind,
    base: DateTime<Utc>,
) -> Vec<(i64, f64, i32)> {
    let mut out: Vec<(i64, f64, i32)> = (records.iter())
        .filter(|r| r.kind == kind)
        .map(|r| ((r.hour - base).num_hours(), r.gpu_seconds, r.gpus))
        .collect();
    out.sort_by_key(|x| x.0);
    out
}

/// A whole hour three hours ago.
fn three_hours_ago() -> DateTime<Utc> {
    bill::hour_of(Utc::now()) - chrono::Duration::hours(3)
}

#[tokio::test]
async fn a_reservation_resized_mid_hour_commits_each_size_for_its_part() {
    let (store, db) = common::store("commit_reservation").await;
    fleet(&store).await;
    let spec = ReservationSpec {
        gpu_type: "h100".into(),
        gpus: 8,
        level: TopologyLevel::Region,
        start: None,
        end: None,
        region: None,
    };
    let made = match store
        .create_reservation(
            &NewReservation {
                id: Uuid::new_v4(),
                tenant: "acme".into(),
                idempotency_key: None,
                spec,
            },
            Who::Tenant("acme"),
        )
        .await
        .unwrap()
    {
        ReservationOutcome::Done(r) => r,
        other => panic!("{other:?}"),
    };
    let id = made.id.to_string();
    assert_eq!(versions(&db, "reservation", &id).await, [(8, true)]);
    // Grown to 16, then deleted: each change closes a version.
    let grow = ReservationResize {
        gpus: Some(16),
        end: None,
    };
    store
        .resize_reservation(Who::Tenant("acme"), made.id, None, &grow)
        .await
        .unwrap();
    assert_eq!(
        versions(&db, "reservation", &id).await,
        [(8, false), (16, true)]
    );
    store
        .delete_reservation(Who::Tenant("acme"), made.id, None)
        .await
        .unwrap();
    assert_eq!(
        versions(&db, "reservation", &id).await,
        [(8, false), (16, false)]
    );
    // Deleting again changes nothing.
    store
        .delete_reservation(Who::Tenant("acme"), made.id, None)
        .await
        .unwrap();
    assert_eq!(versions(&db, "reservation", &id).await.len(), 2);

    // On the test's clock: 8 GPUs from :10 of hour H, 16 from :40, deleted
    // at :40 of hour H+1.
    let base = three_hours_ago();
    retime(
        &db,
        "reservation",
        &id,
        base,
        &[(10, Some(40)), (40, Some(100))],
    )
    .await;
    let all = facts(
        &store,
        base - chrono::Duration::hours(1),
        Utc::now(),
        "acme",
    )
    .await;
    assert_eq!(
        by_hour(&all, CommitmentKind::Reservation, base),
        [
            (0, 8.0 * 1800.0 + 16.0 * 1200.0, 16),
            (1, 16.0 * 2400.0, 16)
        ]
    );
    let first = all.iter().find(|r| r.hour == base).unwrap();
    assert_eq!(first.started_at, base + chrono::Duration::minutes(10));
    assert_eq!(first.ended_at, base + chrono::Duration::hours(1));
    assert_eq!(first.commitment_id, id);
    assert_eq!(first.region, "test-region");
    assert_eq!(first.discount_id(), format!("reservation/{id}"));
    // Clipped to the period asked for, the same ids; another tenant's
    // commitments are not listed.
    let half = facts(
        &store,
        base + chrono::Duration::minutes(30),
        base + chrono::Duration::minutes(90),
        "acme",
    )
    .await;
    assert_eq!(
        by_hour(&half, CommitmentKind::Reservation, base),
        [(0, 8.0 * 600.0 + 16.0 * 1200.0, 16), (1, 16.0 * 1800.0, 16)]
    );
    assert_eq!(half[0].record_id, all[0].record_id);
    assert!(facts(&store, base, Utc::now(), "globex").await.is_empty());
    // Priced: each committed GPU-hour at the reservation's price.
    let book = PriceBook::parse(
        r#"currency = "USD"
[[price]]
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 3.0
[[commitment]]
kind = "reservation"
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 2.0
"#,
    )
    .unwrap();
    let period = bill::month_of(base);
    let lines = bill::price(period, [], [], all.iter(), &book).unwrap();
    let billed: Decimal = lines.iter().map(|l| l.BilledCost).sum();
    let effective: Decimal = lines.iter().map(|l| l.EffectiveCost).sum();
    // (8 × 1800 + 16 × 1200 + 16 × 2400) s = 20 GPU-hours, at 2.00.
    assert_eq!(billed, Decimal::from(40), "{billed}");
    assert_eq!(effective, billed, "all of it unused");
}

#[tokio::test]
async fn a_dedicated_cluster_commits_its_nodes_until_it_is_deleted() {
    let (store, db) = common::store("commit_cluster").await;
    fleet(&store).await;
    let new = NewCluster {
        id: Uuid::new_v4(),
        tenant: "acme".into(),
        idempotency_key: None,
        spec: ClusterSpec {
            name: Some("train".into()),
            gpu_type: "h100".into(),
            nodes: 2,
            level: TopologyLevel::Leaf,
            region: None,
        },
        agent_timeout: AGENT_TIMEOUT,
    };
    store.create_cluster(&new).await.unwrap();
    let id = new.id.to_string();
    assert_eq!(versions(&db, "cluster", &id).await, [(16, true)]);
    // Deleted with nothing running on it: its nodes go back at once, and
    // it commits nothing from then on.
    store
        .delete_cluster(Who::Tenant("acme"), new.id, None)
        .await
        .unwrap();
    let v = versions(&db, "cluster", &id).await;
    assert!(v.iter().all(|&(g, open)| g == 16 && !open), "{v:?}");
    let n = v.len() as i64;
    // From :30 of hour H to :30 of hour H+1 (however many versions its
    // states made, back to back).
    let base = three_hours_ago();
    let spans: Vec<(i64, Option<i64>)> = (0..n)
        .map(|k| (30 + 60 * k / n, Some(30 + 60 * (k + 1) / n)))
        .collect();
    retime(&db, "cluster", &id, base, &spans).await;
    let all = facts(
        &store,
        base - chrono::Duration::hours(1),
        Utc::now(),
        "acme",
    )
    .await;
    assert_eq!(
        by_hour(&all, CommitmentKind::Cluster, base),
        [(0, 16.0 * 1800.0, 16), (1, 16.0 * 1800.0, 16)]
    );
    assert!(all.iter().all(|r| r.commitment_id == id));
}

#[tokio::test]
async fn a_guarantee_bills_what_held_then() {
    let (store, db) = common::store("commit_guarantee").await;
    let terms = |g: u32, w: u32| QuotaTerms {
        guaranteed_gpus: g,
        max_gpus: None,
        weight_milli: w,
    };
    store
        .set_quota("acme", "h100", &terms(8, 1000))
        .await
        .unwrap();
    // Another weight, the same guarantee: no new version.
    store
        .set_quota("acme", "h100", &terms(8, 2000))
        .await
        .unwrap();
    store
        .set_quota_as("ops", "acme", "h100", &terms(4, 2000))
        .await
        .unwrap();
    // A quota that guarantees nothing commits nothing.
    store
        .set_quota("globex", "h100", &terms(0, 1000))
        .await
        .unwrap();
    assert!(versions(&db, "guarantee", "globex/h100").await.is_empty());
    assert_eq!(
        versions(&db, "guarantee", "acme/h100").await,
        [(8, false), (4, true)]
    );
    // 8 GPUs from :00 of hour H, 4 from :15 of hour H+1, still in force.
    let base = three_hours_ago();
    retime(
        &db,
        "guarantee",
        "acme/h100",
        base,
        &[(0, Some(75)), (75, None)],
    )
    .await;
    let all = facts(&store, base, Utc::now(), "acme").await;
    let hours = by_hour(&all, CommitmentKind::Guarantee, base);
    assert_eq!(hours[0], (0, 8.0 * 3600.0, 8));
    assert_eq!(hours[1], (1, 8.0 * 900.0 + 4.0 * 2700.0, 8));
    assert_eq!(hours[2], (2, 4.0 * 3600.0, 4));
    // Up to now, no further.
    assert_eq!(hours.len(), 4, "{hours:?}");
    let last = all.iter().max_by_key(|r| r.hour).unwrap();
    assert!(last.ended_at <= Utc::now() && last.ended_at > last.started_at);
    assert_eq!(last.discount_id(), "guarantee/test-region/acme/h100");
    // Removed: closed.
    store.delete_quota("acme", "h100").await.unwrap();
    assert_eq!(
        versions(&db, "guarantee", "acme/h100").await,
        [(8, false), (4, false)]
    );
}
