//! `gangway billing export`: a month of every tenant's usage, credits,
//! corrections and committed capacity, merged from every region's ledger
//! (each holds its own rows and its peers'), deduplicated, priced by a
//! price book (`gangway_shared::billing::bill`), as FinOps FOCUS rows in
//! CSV or JSON Lines (docs/billing.md). `gangway billing reconcile`
//! (`reconcile.rs`) checks the ledger against the allocations.
//!
//! The export streams: the credits and commitments (small) are read
//! first, then every region's usage rows in time order, merged clock hour
//! by clock hour, each hour priced and written as soon as it is complete,
//! so that what it holds is about an hour of rows, whatever the month.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use chrono::{DateTime, Utc};
use clap::{Subcommand, ValueEnum};
use gangway_shared::billing::{
    self as billing, bill, cents, Closings, CommitmentRecord, CommitmentRecords, CreditRecord,
    CreditRecords, FocusRow, LineTotals, PriceBook, UsageRecord, UsageRecords,
};
use gangway_shared::client::Client;
use reqwest::Method;
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::admin_cli::with_query;
use crate::conn::Conn;

mod reconcile;

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum BillingCommand {
    /// A month of every tenant's GPU usage, from every region, counted
    /// once and priced, as FOCUS rows (one per placement and clock hour),
    /// the month's credits for GPU time lost to provider-caused events
    /// (negative rows, `ChargeCategory` `Credit`) and corrections, and its
    /// committed capacity (guarantees, reservations, dedicated clusters:
    /// `Purchase` rows per commitment and hour, the usage they covered
    /// `Used`, what they left idle `Unused`). Streamed: lines come by
    /// clock hour (then tenant), the credits and corrections last.
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
        /// Where to write it (default: standard output). Written to a
        /// temporary file next to it, renamed once the month is whole: an
        /// export that stops leaves no file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Bill this region, which does not answer (gone for good), from
        /// the copies its peers hold: its rows and credits, the hours its
        /// adopters closed of its last placements, its commitments
        /// (docs/billing.md, "A region that does not come back").
        /// Repeatable.
        #[arg(long = "from-copies", value_name = "REGION")]
        from_copies: Vec<String>,
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
        /// Leave out this region, which does not answer (gone for good: its
        /// allocations cannot be read; bill it with `export
        /// --from-copies`). Repeatable.
        #[arg(long, value_name = "REGION")]
        without: Vec<String>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Csv,
    Jsonl,
}

/// [start, end) of month `YYYY-MM`.
pub(crate) fn month_bounds(month: &str) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
    bill::month_named(month).with_context(|| format!("--month {month:?} is not YYYY-MM"))
}

/// A query of the ledger endpoints: (name, value) pairs.
pub(crate) type Query = Vec<(&'static str, String)>;

/// A page of a region's ledger as `GET
/// /v1/admin/usage/{records,credits,commitments}` gives it.
pub(crate) trait LedgerPage: serde::de::DeserializeOwned + Send + 'static {
    type Item: PartialEq + std::fmt::Debug + Send + 'static;
    /// What the rows are called in messages.
    const WHAT: &'static str;
    /// The page's rows, and the query parameters that ask for the next
    /// page (its cursor); `None` on the last.
    fn split(self) -> (Vec<Self::Item>, Option<Query>);
    fn id(item: &Self::Item) -> Uuid;
    /// `Err`, saying why, when the page is not of the kind asked for.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

impl LedgerPage for UsageRecords {
    type Item = UsageRecord;
    const WHAT: &'static str = "usage rows";
    fn split(self) -> (Vec<UsageRecord>, Option<Query>) {
        let next = self.next.map(|id| {
            let mut q = vec![("after", id.to_string())];
            q.extend((self.next_start).map(|t| {
                let t = t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
                ("after_start", t)
            }));
            q
        });
        (self.records, next)
    }
    fn id(r: &UsageRecord) -> Uuid {
        <UsageRecords as billing::LedgerPage>::id(r)
    }
}

/// A page of usage rows in time order (`order=time`): (`started_at`,
/// `usage_id`), so clock hour by clock hour.
#[derive(serde::Deserialize)]
#[serde(transparent)]
struct ByTime(UsageRecords);

impl LedgerPage for ByTime {
    type Item = UsageRecord;
    const WHAT: &'static str = "usage rows";
    fn split(self) -> (Vec<UsageRecord>, Option<Query>) {
        self.0.split()
    }
    fn id(r: &UsageRecord) -> Uuid {
        <UsageRecords as billing::LedgerPage>::id(r)
    }
    fn check(&self) -> Result<(), String> {
        if self.0.next.is_some() && self.0.next_start.is_none() {
            return Err(
                "it pages its usage rows in id order only (it does not know \
                        `order=time`: an older version); update it and export again"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A page in id order: the next is asked `after` its last id.
fn by_id<P: billing::LedgerPage>(page: P) -> (Vec<P::Item>, Option<Query>) {
    let (items, next) = page.into_items();
    (items, next.map(|id| vec![("after", id.to_string())]))
}

impl LedgerPage for CommitmentRecords {
    type Item = CommitmentRecord;
    const WHAT: &'static str = "commitment hours";
    fn split(self) -> (Vec<CommitmentRecord>, Option<Query>) {
        by_id(self)
    }
    fn id(c: &CommitmentRecord) -> Uuid {
        <Self as billing::LedgerPage>::id(c)
    }
}

impl LedgerPage for CreditRecords {
    type Item = CreditRecord;
    const WHAT: &'static str = "credits";
    fn split(self) -> (Vec<CreditRecord>, Option<Query>) {
        by_id(self)
    }
    fn id(c: &CreditRecord) -> Uuid {
        <Self as billing::LedgerPage>::id(c)
    }
}

/// The global tier's answer for one region's page.
#[derive(serde::Deserialize)]
#[serde(bound(deserialize = "P: serde::de::DeserializeOwned"))]
struct Fanout<P> {
    regions: BTreeMap<String, P>,
}

/// A region that did not give its page stops a read: its rows may be only
/// there.
fn incomplete<P: LedgerPage>(name: &str, answer: &serde_json::Value) -> anyhow::Error {
    anyhow!(
        "region {name} did not give its {} ({answer}): the result would be \
         incomplete; retry once it answers",
        P::WHAT
    )
}

/// One region's rows of a ledger endpoint, a page at a time: today, asked
/// of the region itself by name through the global tier (`?region=NAME`,
/// its first page possibly from the global tier's answer for every
/// region, [`open`]). The merges ask a source for pages and nothing else,
/// so a region read another way (say, from the copies its peers hold
/// while it does not answer) is another source of the same rows.
pub(crate) struct RegionPages<P: LedgerPage> {
    /// The region whose rows these are.
    pub(crate) name: String,
    path: &'static str,
    /// Every page's query (the period, the order), less region and cursor.
    query: Query,
    next: Next<P>,
    /// Rows read so far (progress on stderr).
    read: usize,
}

/// What a [`RegionPages`] reads next.
enum Next<P> {
    /// A page it has already.
    Page(P),
    /// The page that this cursor asks for (empty: the first).
    After(Query),
    Done,
}

impl<P: LedgerPage> RegionPages<P> {
    /// Region `name`'s pages of `path` for `query`, from the first.
    pub(crate) fn new(name: String, path: &'static str, query: Query) -> Self {
        RegionPages {
            name,
            path,
            query,
            next: Next::After(Vec::new()),
            read: 0,
        }
    }

    /// The first page, while it is not read yet.
    fn first_page(&self) -> Option<&P> {
        match &self.next {
            Next::Page(p) => Some(p),
            _ => None,
        }
    }

    /// The next page's rows (progress on stderr); `None` after the last.
    /// A region that does not give it stops the read.
    pub(crate) async fn next(&mut self, client: &Client) -> anyhow::Result<Option<Vec<P::Item>>> {
        let page = match std::mem::replace(&mut self.next, Next::Done) {
            Next::Done => return Ok(None),
            Next::Page(page) => page,
            Next::After(cursor) => self.fetch(client, cursor).await?,
        };
        (page.check()).map_err(|why| anyhow!("region {}: {why}", self.name))?;
        let (items, next) = page.split();
        self.read += items.len();
        eprintln!("{}: {} {} read", self.name, self.read, P::WHAT);
        if let Some(cursor) = next {
            self.next = Next::After(cursor);
        }
        Ok(Some(items))
    }

    async fn fetch(&self, client: &Client, cursor: Query) -> anyhow::Result<P> {
        let mut q = self.query.clone();
        q.push(("region", self.name.clone()));
        q.extend(cursor);
        let path = with_query(self.path, &q);
        if let Ok(mut doc) = client.get_as::<Fanout<P>>(&path).await {
            if let Some(page) = doc.regions.remove(&self.name) {
                return Ok(page);
            }
        }
        // Not a page: the answer itself, for the message.
        let doc = client.call_json(Method::GET, &path, None).await?;
        Err(incomplete::<P>(&self.name, &doc["regions"][&self.name]))
    }
}

/// Every region's pages of `path` for `query`: the global tier's answer
/// for every region (each one's first page; it names the regions), then
/// each region's next pages asked of it by name. The regions in
/// `from_copies` are billed from their peers' copies instead: they must
/// not answer (one that does is billed from its own ledger), and give no
/// source.
pub(crate) async fn open<P: LedgerPage>(
    client: &Client,
    path: &'static str,
    query: &[(&'static str, String)],
    from_copies: &[String],
) -> anyhow::Result<Vec<RegionPages<P>>> {
    let mut first = client
        .call_json(Method::GET, &with_query(path, query), None)
        .await?;
    let names: Vec<String> = (first["regions"].as_object())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    if let Some(r) = from_copies.iter().find(|r| !names.contains(r)) {
        bail!("--from-copies {r}: the global tier knows no region {r} (it knows {names:?})");
    }
    let mut sources = Vec::new();
    for name in names {
        let answer = first["regions"][&name].take();
        let page = P::deserialize(&answer);
        if from_copies.contains(&name) {
            if page.is_ok() {
                bail!(
                    "region {name} answers: it is billed from its own ledger, not from its \
                     copies; drop --from-copies {name}"
                );
            }
            continue;
        }
        let page = page.map_err(|_| incomplete::<P>(&name, &answer))?;
        sources.push(RegionPages {
            next: Next::Page(page),
            ..RegionPages::new(name, path, query.to_vec())
        });
    }
    Ok(sources)
}

/// Adds `item` to `rows` unless its id is there already: a row held by
/// two regions (a home's, replicated to its buddy) is one row; one id
/// with two contents stops the read.
fn keep_once<P: LedgerPage>(
    rows: &mut BTreeMap<Uuid, P::Item>,
    item: P::Item,
) -> anyhow::Result<()> {
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
    Ok(())
}

/// Every region's rows of `path` for `period`, through the global tier,
/// page by page (progress on stderr), merged: a row held by two regions (a
/// home's, replicated to its buddy) is one row; two regions holding one id
/// with different contents stop it, as does a region that does not
/// answer (its rows may be only there). Returns the rows and the regions.
/// It holds them all: for the credits and commitments (and reconciliation);
/// the export streams the usage rows ([`Hours`]).
pub(crate) async fn read_merged<P: LedgerPage>(
    client: &Client,
    path: &'static str,
    period: &[(&'static str, String)],
    from_copies: &[String],
) -> anyhow::Result<(BTreeMap<Uuid, P::Item>, Vec<String>)> {
    let sources = open::<P>(client, path, period, from_copies).await?;
    read_all(client, sources).await
}

/// Every row of `sources`, merged (each id once; one id with two
/// contents stops the read), and the sources' regions.
async fn read_all<P: LedgerPage>(
    client: &Client,
    sources: Vec<RegionPages<P>>,
) -> anyhow::Result<(BTreeMap<Uuid, P::Item>, Vec<String>)> {
    let regions = sources.iter().map(|s| s.name.clone()).collect();
    let mut rows: BTreeMap<Uuid, P::Item> = BTreeMap::new();
    for mut source in sources {
        while let Some(items) = source.next(client).await? {
            for item in items {
                keep_once::<P>(&mut rows, item)?;
            }
        }
    }
    Ok((rows, regions))
}

/// Every region's usage rows in time order (`order=time`), merged one
/// clock hour at a time ([`Hours::next`]): a k-way merge of the regions'
/// time-ordered pages. Each region's pages are read ahead by a task of
/// its own (a page or two, so that reading overlaps pricing); an hour is
/// complete once every region has given a row of a later hour, or its
/// last page. What it holds: a page or two per region, and the hour.
struct Hours {
    regions: Vec<RegionRows>,
}

/// A region's rows in time order, as its reading task gives them.
struct RegionRows {
    name: String,
    /// Pages (`None`: the last was read), or why the read stopped.
    pages: tokio::sync::mpsc::Receiver<anyhow::Result<Option<Vec<UsageRecord>>>>,
    rows: VecDeque<UsageRecord>,
    /// The last row's (start, id), to check the order.
    last: Option<(DateTime<Utc>, Uuid)>,
    done: bool,
}

impl Hours {
    /// Also merges `rows` (in any order), as if a region gave them: the
    /// hours adopters closed of a region billed from its copies.
    fn with_rows(mut self, name: &str, mut rows: Vec<UsageRecord>) -> Hours {
        rows.sort_by_key(|r| (r.started_at, r.usage_id));
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tx.try_send(Ok(Some(rows))).expect("room for two pages");
        tx.try_send(Ok(None)).expect("room for two pages");
        self.regions.push(RegionRows {
            name: name.to_string(),
            pages: rx,
            rows: VecDeque::new(),
            last: None,
            done: false,
        });
        self
    }

    fn new(sources: Vec<RegionPages<ByTime>>, client: &Client) -> Hours {
        let regions = (sources.into_iter())
            .map(|mut source| {
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                let name = source.name.clone();
                let client = client.clone();
                tokio::spawn(async move {
                    loop {
                        let page = source.next(&client).await;
                        let more = matches!(page, Ok(Some(_)));
                        if tx.send(page).await.is_err() || !more {
                            break;
                        }
                    }
                });
                RegionRows {
                    name,
                    pages: rx,
                    rows: VecDeque::new(),
                    last: None,
                    done: false,
                }
            })
            .collect();
        Hours { regions }
    }

    /// The next clock hour's rows, every region's merged (each id once,
    /// the same in every region that holds it), in id order; `None` once
    /// every region is read to the end.
    async fn next(&mut self) -> anyhow::Result<Option<Vec<UsageRecord>>> {
        let mut hour: Option<DateTime<Utc>> = None;
        for region in &mut self.regions {
            if let Some(h) = region.head().await? {
                hour = Some(hour.map_or(h, |x| x.min(h)));
            }
        }
        let Some(hour) = hour else {
            return Ok(None);
        };
        let mut rows: BTreeMap<Uuid, UsageRecord> = BTreeMap::new();
        for region in &mut self.regions {
            while region.head().await? == Some(hour) {
                let row = region.rows.pop_front().expect("a row");
                keep_once::<ByTime>(&mut rows, row)?;
            }
        }
        Ok(Some(rows.into_values().collect()))
    }
}

impl RegionRows {
    /// The clock hour of the region's next row, waiting for its next page
    /// if need be; `None` once it is read to the end.
    async fn head(&mut self) -> anyhow::Result<Option<DateTime<Utc>>> {
        while self.rows.is_empty() && !self.done {
            match self.pages.recv().await {
                Some(Ok(Some(rows))) => {
                    for r in &rows {
                        let at = (r.started_at, r.usage_id);
                        if let Some(last) = self.last.filter(|&last| last >= at) {
                            bail!(
                                "region {} gave its usage rows out of time order ({} at {} \
                                 after {} at {}): it does not page by `order=time`; update it \
                                 and export again",
                                self.name,
                                at.1,
                                at.0.to_rfc3339(),
                                last.1,
                                last.0.to_rfc3339()
                            );
                        }
                        self.last = Some(at);
                    }
                    self.rows.extend(rows);
                }
                Some(Ok(None)) => self.done = true,
                Some(Err(e)) => return Err(e),
                None => bail!("reading region {}'s usage rows stopped", self.name),
            }
        }
        Ok(self.rows.front().map(|r| bill::hour_of(r.started_at)))
    }
}

pub async fn run(cmd: BillingCommand) -> anyhow::Result<u8> {
    match cmd {
        BillingCommand::Export {
            conn,
            month,
            format,
            price_book,
            out,
            from_copies,
        } => export(conn, month, format, price_book, out, from_copies).await,
        BillingCommand::Reconcile {
            conn,
            month,
            from,
            to,
            epsilon,
            without,
        } => reconcile::reconcile(conn, month, from, to, epsilon, without).await,
    }
}

async fn export(
    conn: Conn,
    month: String,
    format: Format,
    price_book: PathBuf,
    out: Option<PathBuf>,
    from_copies: Vec<String>,
) -> anyhow::Result<u8> {
    let (start, end) = month_bounds(&month)?;
    let text = std::fs::read_to_string(&price_book)
        .with_context(|| format!("cannot read the price book {}", price_book.display()))?;
    let book = PriceBook::parse(&text).map_err(anyhow::Error::msg)?;
    let client = conn.admin_client()?;
    let mut sink = Sink::open(out.as_deref(), format)?;
    sink.names = tenant_names(&client).await;
    let period = [("from", start.to_rfc3339()), ("to", end.to_rfc3339())];
    // The month's credits and corrections first: they are priced as the
    // rows they offset were billed, which can lie in an earlier month.
    let (mut credits, _) =
        read_merged::<CreditRecords>(&client, "/v1/admin/usage/credits", &period, &from_copies)
            .await?;
    // A year back: the closed hours the month's credits offset (priced as
    // they were billed) may lie before it. Few, whatever the period.
    let year = [
        ("from", (start - chrono::Duration::days(366)).to_rfc3339()),
        ("to", end.to_rfc3339()),
    ];
    let closed = closings(&client, &year, &from_copies).await?;
    for c in closed.credits {
        keep_once::<CreditRecords>(&mut credits, c)?;
    }
    let from = bill::reads_from((start, end), credits.values());
    let wider = [("from", from.to_rfc3339()), ("to", end.to_rfc3339())];
    if from < start {
        let (earlier, _) =
            read_merged::<CreditRecords>(&client, "/v1/admin/usage/credits", &wider, &from_copies)
                .await?;
        credits.extend(earlier);
    }
    // Committed capacity: small too (a commitment is 720 hours a month).
    let (mut commitments, _) = read_merged::<CommitmentRecords>(
        &client,
        "/v1/admin/usage/commitments",
        &wider,
        &from_copies,
    )
    .await?;
    for region in &from_copies {
        for c in copied_commitments(&client, region, &wider, &from_copies).await? {
            keep_once::<CommitmentRecords>(&mut commitments, c)?;
        }
    }
    // The closings of the hours read, as rows (few: a dead region's last
    // placements).
    let (read_from, read_to) = (from, end);
    let closed_rows: Vec<UsageRecord> = (closed.records.into_iter())
        .filter(|r| r.ended_at > read_from && r.started_at < read_to)
        .collect();
    let mut pricer = bill::Pricer::new(
        (start, end),
        credits.into_values(),
        commitments.into_values(),
        &book,
    );
    // Then the usage rows, every region's in time order, merged and
    // priced clock hour by clock hour, each hour written as it is priced.
    let mut by_time = wider.to_vec();
    by_time.push(("order", "time".into()));
    let sources =
        open::<ByTime>(&client, "/v1/admin/usage/records", &by_time, &from_copies).await?;
    let regions = sources.len();
    let mut hours = Hours::new(sources, &client).with_rows("the closings of adopters", closed_rows);
    let mut totals = Totals::default();
    while let Some(rows) = hours.next().await? {
        let lines = pricer.hour(&rows);
        totals.add(&lines);
        // A price the book lacks: the bill will fail; no more lines.
        if !pricer.lacks_prices() {
            sink.write(lines)?;
        }
    }
    drop(hours);
    // The credits and corrections (and the commitments of hours after the
    // last row), or every SKU the book lacks.
    let rest = pricer.finish().map_err(|unpriced| anyhow!("{unpriced}"))?;
    totals.add(&rest);
    sink.write(rest)?;
    sink.commit()?;
    totals.print(&book.currency);
    eprintln!(
        "{} rows ({} credits, {} corrections, {} commitment hours) for {month} from {regions} \
         regions{}",
        totals.lines,
        totals.credits,
        totals.corrections,
        totals.commitments,
        if from_copies.is_empty() {
            String::new()
        } else {
            format!(
                " and from the copies of {} (what they had not replicated when they died is \
                 not in it)",
                from_copies.join(", ")
            )
        }
    );
    Ok(0)
}

/// The hours adopters closed of the last placements of the regions billed
/// from their copies, and those placements' credits, from every other
/// region (`GET /v1/admin/usage/closings`): each id once. A region that
/// does not answer (and is not billed from copies itself) stops it: the
/// closings may be only there.
async fn closings(
    client: &Client,
    period: &[(&'static str, String)],
    from_copies: &[String],
) -> anyhow::Result<Closings> {
    let mut records: BTreeMap<Uuid, UsageRecord> = BTreeMap::new();
    let mut credits: BTreeMap<Uuid, CreditRecord> = BTreeMap::new();
    for home in from_copies {
        let mut q = period.to_vec();
        q.push(("home", home.clone()));
        let mut doc = client
            .call_json(
                Method::GET,
                &with_query("/v1/admin/usage/closings", &q),
                None,
            )
            .await?;
        let names: Vec<String> = (doc["regions"].as_object())
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for name in names.iter().filter(|n| !from_copies.contains(n)) {
            let answer = doc["regions"][name].take();
            let c: Closings = serde_json::from_value(answer.clone()).map_err(|_| {
                anyhow!(
                    "region {name} did not give the closings it holds of {home} ({answer}): \
                     the bill would be incomplete; retry once it answers"
                )
            })?;
            eprintln!(
                "{name}: {} closed hours and {} credits of {home}'s last placements read",
                c.records.len(),
                c.credits.len()
            );
            for r in c.records {
                keep_once::<UsageRecords>(&mut records, r)?;
            }
            for c in c.credits {
                keep_once::<CreditRecords>(&mut credits, c)?;
            }
        }
    }
    Ok(Closings {
        records: records.into_values().collect(),
        credits: credits.into_values().collect(),
    })
}

/// Region `home`'s commitment hours from the copies its peers hold
/// (`?home=`), from the peer that heard from it last (its copy is the
/// most complete: a commitment still in force counts to then).
async fn copied_commitments(
    client: &Client,
    home: &str,
    period: &[(&'static str, String)],
    from_copies: &[String],
) -> anyhow::Result<Vec<CommitmentRecord>> {
    let mut q = period.to_vec();
    q.push(("home", home.to_string()));
    let sources =
        open::<CommitmentRecords>(client, "/v1/admin/usage/commitments", &q, from_copies).await?;
    let Some(best) = (sources.into_iter()).max_by_key(|s| s.first_page().and_then(|p| p.heard_at))
    else {
        bail!("no region holds copies of {home}'s commitments");
    };
    eprintln!("{home}: its commitments from the copy {} holds", best.name);
    let (rows, _) = read_all(client, vec![best]).await?;
    Ok(rows.into_values().collect())
}

/// Where the export's lines go (docs/billing.md, "The export"). With
/// `--out`, a temporary file next to it (`.NAME.PID.partial`), renamed
/// over it once the whole month is priced: an export that stops (a price
/// the book lacks, a region that does not answer) leaves no file, and an
/// older one as it was. On standard output (or an `--out` that is not a
/// regular file: a pipe, `/dev/stdout`), the lines as they are priced:
/// what was written before a stop is not a bill, which the exit status
/// says. Once a price the book lacks is known to be needed, no more lines
/// are written (the export goes on reading, to name every SKU).
struct Sink {
    w: Box<dyn Write>,
    format: Format,
    /// The CSV writer (over `w`, taken), from the first write on.
    csv: Option<csv::Writer<Box<dyn Write>>>,
    /// Tenants' display names (`BillingAccountName`), where known.
    names: BTreeMap<String, String>,
    /// The temporary file, and where it goes once whole.
    file: Option<(PathBuf, PathBuf)>,
}

impl Sink {
    fn open(out: Option<&Path>, format: Format) -> anyhow::Result<Sink> {
        let stream = |w: Box<dyn Write>| Sink {
            w,
            format,
            csv: None,
            names: BTreeMap::new(),
            file: None,
        };
        let Some(path) = out else {
            return Ok(stream(Box::new(std::io::BufWriter::new(
                std::io::stdout().lock(),
            ))));
        };
        let create = |p: &Path| {
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))
        };
        // Through a symbolic link to the file it names.
        let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if std::fs::metadata(&target).is_ok_and(|m| !m.is_file()) {
            return Ok(stream(Box::new(std::io::BufWriter::new(create(&target)?))));
        }
        let name = (target.file_name())
            .with_context(|| format!("--out {} names no file", path.display()))?;
        let tmp = target.with_file_name(format!(
            ".{}.{}.partial",
            name.to_string_lossy(),
            std::process::id()
        ));
        let w = std::io::BufWriter::new(create(&tmp)?);
        let mut sink = stream(Box::new(w));
        sink.file = Some((tmp, target));
        Ok(sink)
    }

    fn write(&mut self, lines: Vec<FocusRow>) -> anyhow::Result<()> {
        if self.format == Format::Csv && self.csv.is_none() {
            let w = std::mem::replace(&mut self.w, Box::new(std::io::sink()));
            self.csv = Some(FocusRow::csv_writer(w)?);
        }
        for mut row in lines {
            if let Some(name) = self.names.get(&row.BillingAccountId) {
                row.BillingAccountName.clone_from(name);
                row.SubAccountName.clone_from(name);
            }
            match &mut self.csv {
                Some(csv) => csv.serialize(&row)?,
                None => writeln!(self.w, "{}", serde_json::to_string(&row)?)?,
            }
        }
        Ok(())
    }

    /// The export is whole: flushed, and the file where `--out` says.
    fn commit(mut self) -> anyhow::Result<()> {
        self.write(Vec::new())?;
        if let Some(csv) = self.csv.take() {
            self.w = csv.into_inner().map_err(|e| anyhow!("{}", e.error()))?;
        }
        self.w.flush()?;
        self.w = Box::new(std::io::sink());
        if let Some((tmp, path)) = self.file.take() {
            if let Err(e) = std::fs::rename(&tmp, &path) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e).with_context(|| format!("cannot write {}", path.display()));
            }
        }
        Ok(())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some((tmp, _)) = self.file.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// What finance checks first, per tenant: GPU-hours and cost, net of
/// credits and corrections, the credits, and what commitments cost; and
/// how many lines of each kind.
#[derive(Default)]
struct Totals {
    tenants: BTreeMap<String, LineTotals>,
    lines: usize,
    credits: usize,
    corrections: usize,
    commitments: usize,
}

impl Totals {
    fn add(&mut self, lines: &[FocusRow]) {
        for row in lines {
            if !self.tenants.contains_key(&row.BillingAccountId) {
                (self.tenants).insert(row.BillingAccountId.clone(), LineTotals::default());
            }
            let t = (self.tenants.get_mut(&row.BillingAccountId)).expect("inserted");
            t.add(row);
            self.credits += usize::from(row.ChargeCategory == "Credit");
            self.commitments += usize::from(row.ChargeCategory == "Purchase");
            if row.x_Cause == gangway_shared::billing::CORRECTION {
                self.corrections += 1;
            }
            self.lines += 1;
        }
    }

    /// Each tenant's sums of its lines as written; money to the cent
    /// (half away from zero), GPU-hours to three places.
    fn print(&self, cur: &str) {
        let h = |x: Decimal| x.round_dp(3);
        for (tenant, t) in &self.tenants {
            eprintln!(
                "{tenant}: {:.3} GPU-hours, {} {cur} (after credits of {:.3} GPU-hours, \
                 {} {cur}; committed capacity {:.3} GPU-hours, {} {cur})",
                h(t.hours),
                cents(t.cost),
                h(t.credit_hours),
                cents(t.credit),
                h(t.committed_hours),
                cents(t.committed),
            );
        }
    }
}

/// Tenants' display names, from the identity records; none (the
/// export names tenants by id) when they cannot be read.
async fn tenant_names(client: &Client) -> BTreeMap<String, String> {
    let list = client
        .call_json(reqwest::Method::GET, "/v1/admin/tenants", None)
        .await
        .ok()
        .and_then(|v| serde_json::from_value::<gangway_shared::api::TenantList>(v).ok());
    match list {
        Some(l) => (l.tenants.into_iter())
            .map(|t| (t.tenant, t.display_name))
            .collect(),
        None => {
            eprintln!(
                "(tenants' display names could not be read: BillingAccountName is each \
                 tenant's id)"
            );
            BTreeMap::new()
        }
    }
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

    #[test]
    fn a_time_ordered_page_asks_for_the_next_by_start_and_id() {
        let id = Uuid::from_u128(7);
        let t: DateTime<Utc> = "2026-11-10T10:15:00.123456Z".parse().unwrap();
        let page = |next_start| UsageRecords {
            records: vec![],
            next: Some(id),
            next_start,
        };
        let timed = ByTime(page(Some(t)));
        assert!(timed.check().is_ok());
        let (_, next) = timed.split();
        assert_eq!(
            next.unwrap(),
            [
                ("after", id.to_string()),
                ("after_start", "2026-11-10T10:15:00.123456Z".to_string())
            ]
        );
        // A region that pages by id only (an older one) is not read as
        // if it were in time order.
        assert!(ByTime(page(None)).check().is_err());
        let (_, next) = page(None).split();
        assert_eq!(next.unwrap(), [("after", id.to_string())]);
        let last = UsageRecords::default();
        assert!(ByTime(last).check().is_ok());
    }

    #[test]
    fn out_is_written_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("nov.csv");
        std::fs::write(&out, "last month's\n").unwrap();
        let files = || -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        // Stopped midway: the temporary file goes, the old file stays.
        let mut sink = Sink::open(Some(&out), Format::Csv).unwrap();
        sink.write(Vec::new()).unwrap();
        assert_eq!(files().len(), 2, "{:?}", files());
        drop(sink);
        assert_eq!(files(), ["nov.csv"]);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "last month's\n");
        // Whole: renamed over it.
        let sink = Sink::open(Some(&out), Format::Csv).unwrap();
        sink.commit().unwrap();
        assert_eq!(files(), ["nov.csv"]);
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            format!("{}\n", FocusRow::COLUMNS.join(","))
        );
    }
}
