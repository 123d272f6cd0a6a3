//! `gangway billing export`: a month of every tenant's usage, merged from
//! every region's ledger (each holds its own rows and its peers'),
//! deduplicated, priced by a price book, as FinOps FOCUS rows in CSV or
//! JSON Lines (docs/billing.md).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use clap::{Subcommand, ValueEnum};
use gangway_shared::billing::{FocusRow, PriceBook, UsageRecord, UsageRecords};
use reqwest::Method;
use uuid::Uuid;

use crate::admin_cli::with_query;
use crate::conn::Conn;

#[derive(Subcommand, Debug)]
pub enum BillingCommand {
    /// A month of every tenant's GPU usage, from every region, counted
    /// once and priced, as FOCUS rows (one per placement and clock hour).
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Csv,
    Jsonl,
}

/// [start, end) of month `YYYY-MM`.
fn month_bounds(month: &str) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
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

pub async fn run(cmd: BillingCommand) -> anyhow::Result<u8> {
    let BillingCommand::Export {
        conn,
        month,
        format,
        price_book,
        out,
    } = cmd;
    let (start, end) = month_bounds(&month)?;
    let text = std::fs::read_to_string(&price_book)
        .with_context(|| format!("cannot read the price book {}", price_book.display()))?;
    let book = PriceBook::parse(&text).map_err(anyhow::Error::msg)?;
    let client = conn.admin_client()?;
    let period = [("from", start.to_rfc3339()), ("to", end.to_rfc3339())];
    // Every region's first page, then each region's next ones.
    let first = client
        .call_json(
            Method::GET,
            &with_query("/v1/admin/usage/records", &period),
            None,
        )
        .await?;
    let regions: Vec<String> = (first["regions"].as_object())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    // Every region's ledger, merged: a row held by two regions (a home's,
    // replicated to its buddy) is one row.
    let mut rows: BTreeMap<Uuid, UsageRecord> = BTreeMap::new();
    for name in &regions {
        let mut answer = first["regions"][name].clone();
        let mut read = 0usize;
        loop {
            let page: UsageRecords = serde_json::from_value(answer.clone()).map_err(|_| {
                anyhow::anyhow!(
                    "region {name} did not give its usage ({answer}): the export would be \
                     incomplete; retry once it answers"
                )
            })?;
            read += page.records.len();
            for rec in page.records {
                match rows.get(&rec.usage_id) {
                    Some(held) if *held != rec => bail!(
                        "usage row {} differs between regions ({held:?} and {rec:?}): \
                         reconcile before exporting",
                        rec.usage_id
                    ),
                    Some(_) => {}
                    None => {
                        rows.insert(rec.usage_id, rec);
                    }
                }
            }
            eprintln!("{name}: {read} usage rows read");
            let Some(after) = page.next else {
                break;
            };
            let mut q = period.to_vec();
            q.push(("region", name.clone()));
            q.push(("after", after.to_string()));
            let doc = client
                .call_json(
                    Method::GET,
                    &with_query("/v1/admin/usage/records", &q),
                    None,
                )
                .await?;
            answer = doc["regions"][name].clone();
        }
    }
    // Rows lie within one clock hour: those starting in the month are its.
    let mut priced = Vec::new();
    let mut unpriced: BTreeMap<String, usize> = BTreeMap::new();
    for rec in rows
        .values()
        .filter(|r| r.started_at >= start && r.started_at < end)
    {
        match FocusRow::of(rec, &book, (start, end)) {
            Some(row) => priced.push(row),
            None => {
                let sku = format!(
                    "{} {} in {}",
                    rec.gpu_type,
                    gangway_shared::billing::priority_name(rec.priority),
                    rec.region
                );
                *unpriced.entry(sku).or_default() += 1;
            }
        }
    }
    if !unpriced.is_empty() {
        let list: Vec<String> = unpriced
            .iter()
            .map(|(sku, n)| format!("{sku} ({n} rows)"))
            .collect();
        bail!(
            "the price book has no price in force for: {}; add one and export again",
            list.join(", ")
        );
    }
    priced.sort_by(|a, b| {
        (
            &a.BillingAccountId,
            a.ChargePeriodStart,
            &a.ResourceId,
            a.x_Rank,
        )
            .cmp(&(
                &b.BillingAccountId,
                b.ChargePeriodStart,
                &b.ResourceId,
                b.x_Rank,
            ))
    });
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
    // What finance checks first: per tenant, GPU-hours and cost.
    let mut totals: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for row in &priced {
        let t = totals.entry(&row.BillingAccountId).or_default();
        t.0 += row.UsageQuantity;
        t.1 += row.BilledCost;
    }
    for (tenant, (hours, cost)) in &totals {
        eprintln!(
            "{tenant}: {hours:.3} GPU-hours, {cost:.2} {}",
            book.currency
        );
    }
    eprintln!(
        "{} rows for {month} from {} regions",
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
