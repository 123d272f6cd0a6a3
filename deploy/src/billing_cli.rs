//! `gangway billing export`: a month of every tenant's usage, credits,
//! corrections and committed capacity, merged from every region's ledger
//! (each holds its own rows and its peers'), deduplicated, priced by a
//! price book (`gangway_shared::billing::bill`), as FinOps FOCUS rows in
//! CSV or JSON Lines (docs/billing.md). `gangway billing reconcile`
//! (`reconcile.rs`) checks the ledger against the allocations.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use clap::{Subcommand, ValueEnum};
use gangway_shared::billing::{
    bill, CommitmentRecord, CommitmentRecords, CreditRecord, CreditRecords, FocusRow, PriceBook,
    UsageRecord, UsageRecords,
};
use reqwest::Method;
use uuid::Uuid;

use crate::admin_cli::with_query;
use crate::conn::Conn;

mod reconcile;

#[derive(Subcommand, Debug)]
pub enum BillingCommand {
    /// A month of every tenant's GPU usage, from every region, counted
    /// once and priced, as FOCUS rows (one per placement and clock hour),
    /// the month's credits for GPU time lost to provider-caused events
    /// (negative rows, `ChargeCategory` `Credit`) and corrections, and its
    /// committed capacity (guarantees, reservations, dedicated clusters:
    /// `Purchase` rows per commitment and hour, the usage they covered
    /// `Used`, what they left idle `Unused`).
    Export {
        #[command(flatten)]
        conn: Conn,
        /// The month, as YYYY-MM (UTC).
        #[arg(long)]
        month: String,
        #[arg(long, value_enum, default_value_t = Format::Csv)]
        format: Format,
        /// The price book (TOML; docs/billing.md).
        #[arg(long)]
        price_book: PathBuf,
        /// Where to write it (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Checks, per tenant and region, that billed plus credited
    /// GPU-seconds equal the GPU-seconds the regions' allocations held in
    /// a period; exit status 1 when they differ (docs/billing.md).
    Reconcile {
        #[command(flatten)]
        conn: Conn,
        /// The month, as YYYY-MM (UTC); or give --from and --to.
        #[arg(long, conflicts_with_all = ["from", "to"])]
        month: Option<String>,
        /// Start of the period (RFC 3339).
        #[arg(long, requires = "to")]
        from: Option<DateTime<Utc>>,
        /// End of the period, exclusive (RFC 3339).
        #[arg(long, requires = "from")]
        to: Option<DateTime<Utc>>,
        /// GPU-seconds a tenant's region may differ by (float rounding).
        #[arg(long, default_value_t = 0.5)]
        epsilon: f64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Csv,
    Jsonl,
}

/// [start, end) of month `YYYY-MM`.
pub(crate) fn month_bounds(month: &str) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
    let first = NaiveDate::parse_from_str(&format!("{month}-01"), "%Y-%m-%d")
        .with_context(|| format!("--month {month:?} is not YYYY-MM"))?;
    let next = if first.month() == 12 {
        NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
    }
    .context("no month after that")?;
    let at = |d: NaiveDate| Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight"));
    Ok((at(first), at(next)))
}

/// A page of a region's ledger as `GET /v1/admin/usage/{records,credits}`
/// gives it.
pub(crate) trait LedgerPage: serde::de::DeserializeOwned {
    type Item: PartialEq + std::fmt::Debug;
    /// What the rows are called in messages.
    const WHAT: &'static str;
    fn split(self) -> (Vec<Self::Item>, Option<Uuid>);
    fn id(item: &Self::Item) -> Uuid;
}

impl LedgerPage for UsageRecords {
    type Item = UsageRecord;
    const WHAT: &'static str = "usage rows";
    fn split(self) -> (Vec<UsageRecord>, Option<Uuid>) {
        (self.records, self.next)
    }
    fn id(r: &UsageRecord) -> Uuid {
        r.usage_id
    }
}

impl LedgerPage for CommitmentRecords {
    type Item = CommitmentRecord;
    const WHAT: &'static str = "commitment hours";
    fn split(self) -> (Vec<CommitmentRecord>, Option<Uuid>) {
        (self.commitments, self.next)
    }
    fn id(c: &CommitmentRecord) -> Uuid {
        c.record_id
    }
}

impl LedgerPage for CreditRecords {
    type Item = CreditRecord;
    const WHAT: &'static str = "credits";
    fn split(self) -> (Vec<CreditRecord>, Option<Uuid>) {
        (self.credits, self.next)
    }
    fn id(c: &CreditRecord) -> Uuid {
        c.credit_id
    }
}

/// Every region's rows of `path` for `period`, through the global tier,
/// page by page (progress on stderr), merged: a row held by two regions (a
/// home's, replicated to its buddy) is one row; two regions holding one id
/// with different contents stop it, as does a region that does not
/// answer (its rows may be only there). Returns the rows and the regions.
pub(crate) async fn read_merged<P: LedgerPage>(
    client: &gangway_shared::client::Client,
    path: &str,
    period: &[(&str, String)],
) -> anyhow::Result<(BTreeMap<Uuid, P::Item>, Vec<String>)> {
    /// The global tier's answer for one region's page.
    #[derive(serde::Deserialize)]
    #[serde(bound(deserialize = "P: serde::de::DeserializeOwned"))]
    struct Fanout<P> {
        regions: BTreeMap<String, P>,
    }
    let incomplete = |name: &str, answer: &serde_json::Value| {
        anyhow::anyhow!(
            "region {name} did not give its {} ({answer}): the result would be \
             incomplete; retry once it answers",
            P::WHAT
        )
    };
    // Every region's first page, then each region's next ones (those read
    // straight into their types: a month is a million rows).
    let mut first = client
        .call_json(Method::GET, &with_query(path, period), None)
        .await?;
    let regions: Vec<String> = (first["regions"].as_object())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let mut rows: BTreeMap<Uuid, P::Item> = BTreeMap::new();
    for name in &regions {
        let answer = first["regions"][name].take();
        let mut page = P::deserialize(&answer).map_err(|_| incomplete(name, &answer))?;
        let mut read = 0usize;
        loop {
            let (items, next) = page.split();
            read += items.len();
            for item in items {
                match rows.entry(P::id(&item)) {
                    std::collections::btree_map::Entry::Occupied(held) if *held.get() != item => {
                        bail!(
                            "{} {} differs between regions ({:?} and {item:?}): \
                             look into it before billing",
                            P::WHAT,
                            P::id(&item),
                            held.get()
                        )
                    }
                    std::collections::btree_map::Entry::Occupied(_) => {}
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(item);
                    }
                }
            }
            eprintln!("{name}: {read} {} read", P::WHAT);
            let Some(after) = next else {
                break;
            };
            let mut q = period.to_vec();
            q.push(("region", name.clone()));
            q.push(("after", after.to_string()));
            let next_page = match client.get_as::<Fanout<P>>(&with_query(path, &q)).await {
                Ok(mut doc) => doc.regions.remove(name),
                Err(_) => None,
            };
            page = match next_page {
                Some(p) => p,
                None => {
                    // Not a page: the answer itself, for the message.
                    let doc = client
                        .call_json(Method::GET, &with_query(path, &q), None)
                        .await?;
                    return Err(incomplete(name, &doc["regions"][name]));
                }
            };
        }
    }
    Ok((rows, regions))
}

pub async fn run(cmd: BillingCommand) -> anyhow::Result<u8> {
    match cmd {
        BillingCommand::Export {
            conn,
            month,
            format,
            price_book,
            out,
        } => export(conn, month, format, price_book, out).await,
        BillingCommand::Reconcile {
            conn,
            month,
            from,
            to,
            epsilon,
        } => reconcile::reconcile(conn, month, from, to, epsilon).await,
    }
}

async fn export(
    conn: Conn,
    month: String,
    format: Format,
    price_book: PathBuf,
    out: Option<PathBuf>,
) -> anyhow::Result<u8> {
    let (start, end) = month_bounds(&month)?;
    let text = std::fs::read_to_string(&price_book)
        .with_context(|| format!("cannot read the price book {}", price_book.display()))?;
    let book = PriceBook::parse(&text).map_err(anyhow::Error::msg)?;
    let client = conn.admin_client()?;
    let period = [("from", start.to_rfc3339()), ("to", end.to_rfc3339())];
    // The month's credits and corrections first: they are priced as the
    // rows they offset were billed, which can lie in an earlier month.
    let (mut credits, _) =
        read_merged::<CreditRecords>(&client, "/v1/admin/usage/credits", &period).await?;
    let from = bill::reads_from((start, end), credits.values());
    let wider = [("from", from.to_rfc3339()), ("to", end.to_rfc3339())];
    if from < start {
        let (earlier, _) =
            read_merged::<CreditRecords>(&client, "/v1/admin/usage/credits", &wider).await?;
        credits.extend(earlier);
    }
    let (rows, regions) =
        read_merged::<UsageRecords>(&client, "/v1/admin/usage/records", &wider).await?;
    let (commitments, _) =
        read_merged::<CommitmentRecords>(&client, "/v1/admin/usage/commitments", &wider).await?;
    let priced = bill::price(
        (start, end),
        rows.values(),
        credits.values(),
        commitments.values(),
        &book,
    )
    .map_err(|unpriced| anyhow::anyhow!("{unpriced}"))?;
    let mut w: Box<dyn Write> = match &out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    if format == Format::Csv {
        writeln!(w, "{}", FocusRow::CSV_HEADER)?;
    }
    for row in &priced {
        match format {
            Format::Csv => writeln!(w, "{}", row.csv())?,
            Format::Jsonl => writeln!(w, "{}", serde_json::to_string(row)?)?,
        }
    }
    w.flush()?;
    // What finance checks first: per tenant, GPU-hours and cost, net of
    // credits and corrections, the credits, and what commitments cost.
    #[derive(Default)]
    struct Total {
        hours: f64,
        cost: f64,
        credit_hours: f64,
        credit: f64,
        committed_hours: f64,
        committed: f64,
    }
    let mut totals: BTreeMap<&str, Total> = BTreeMap::new();
    for row in &priced {
        let t = totals.entry(&row.BillingAccountId).or_default();
        t.hours += row.UsageQuantity;
        t.cost += row.BilledCost;
        if row.ChargeCategory == "Credit" {
            t.credit_hours -= row.UsageQuantity;
            t.credit -= row.BilledCost;
        }
        if row.ChargeCategory == "Purchase" {
            t.committed_hours += row.PricingQuantity;
            t.committed += row.BilledCost;
        }
    }
    for (tenant, t) in &totals {
        eprintln!(
            "{tenant}: {:.3} GPU-hours, {:.2} {cur} (after credits of {:.3} GPU-hours, \
             {:.2} {cur}; committed capacity {:.3} GPU-hours, {:.2} {cur})",
            t.hours,
            t.cost,
            t.credit_hours,
            t.credit,
            t.committed_hours,
            t.committed,
            cur = book.currency
        );
    }
    let count = |f: &dyn Fn(&FocusRow) -> bool| priced.iter().filter(|r| f(r)).count();
    let n_credits = count(&|r| r.ChargeCategory == "Credit");
    let n_corrections = count(&|r| r.x_Cause == gangway_shared::billing::CORRECTION);
    let n_commitments = count(&|r| r.ChargeCategory == "Purchase");
    eprintln!(
        "{} rows ({n_credits} credits, {n_corrections} corrections, {n_commitments} commitment \
         hours) for {month} from {} regions",
        priced.len(),
        regions.len()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_month_is_its_first_midnight_to_the_next_months() {
        let (s, e) = month_bounds("2026-12").unwrap();
        assert_eq!(s.to_rfc3339(), "2026-12-01T00:00:00+00:00");
        assert_eq!(e.to_rfc3339(), "2027-01-01T00:00:00+00:00");
        assert!(month_bounds("2026-13").is_err());
        assert!(month_bounds("november").is_err());
    }
}
