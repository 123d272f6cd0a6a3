//! Plans kept while the tables stay the size they were planned at.
//!
//! An agent's quiet sync reads its assignments (`agents.rs`,
//! `load_assignments`) many times a second across a region. Sent as an
//! unnamed statement it is planned at every call: on a 10,240-GPU region
//! with an agent per leaf, about a millisecond of planning for 0.04 ms of
//! execution (docs/benchmarks-history.md, "Session 30"). Prepared once per
//! connection it would be planned once — but PostgreSQL keeps a prepared
//! statement's plan however the tables grow (until an `ANALYZE` of them),
//! and a plan made in a fresh region's first seconds, on nearly empty
//! tables, scanned `jobs` and `workers` whole once they held thousands of
//! rows (24 ms a sync at 3,500 jobs).
//!
//! So such a statement is prepared per connection *and per table scale*:
//! its text starts with a comment naming the power of two of the pages of
//! the tables the agents' reads join ([`TableScale::label`]), read again every few
//! seconds. A table grown (or shrunk) past a power of two gives a new text,
//! hence a new statement, planned on the table's size then; in between,
//! each use is one round trip with no planning (for a statement with
//! parameters, once PostgreSQL has settled on its generic plan: after five
//! calls planned for their values, where the generic plan is estimated no
//! dearer; for `unnest` of an array parameter it never is, and such a
//! statement is planned at every call however it is sent). The planner
//! scales a table's row estimate by its current pages, so a plan is used
//! only on tables within a factor of two of those it was made for.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{cached, Result};

/// How often the tables' sizes are read again (per region process).
const REFRESH: Duration = Duration::from_secs(2);

/// The tables whose size a scaled statement's plan depends on: those the
/// agents' reads join.
const SIZES_SQL: &str = "SELECT pg_relation_size('workers'), pg_relation_size('jobs'),
                                pg_relation_size('nodes'), pg_relation_size('agents')";

/// The current scale's label, and when it was read. One per region process
/// (`super::Store`, shared by its clones).
#[derive(Debug, Default)]
pub struct TableScale {
    last: Mutex<Option<(Instant, String)>>,
}

impl TableScale {
    /// The comment that starts a scaled statement's text: at most
    /// [`REFRESH`] old, read in `tx` when older.
    async fn label(&self, tx: &deadpool_postgres::Transaction<'_>) -> Result<String> {
        if let Some((at, label)) = &*self.last.lock().expect("table scale lock") {
            if at.elapsed() < REFRESH {
                return Ok(label.clone());
            }
        }
        let row = tx.query_one(&cached(tx, SIZES_SQL).await?, &[]).await?;
        let label = label_of(&[row.get(0), row.get(1), row.get(2), row.get(3)]);
        *self.last.lock().expect("table scale lock") = Some((Instant::now(), label.clone()));
        Ok(label)
    }

    /// `sql` prepared once per connection and table scale.
    pub(super) async fn prepare(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        sql: &str,
    ) -> Result<tokio_postgres::Statement> {
        let label = self.label(tx).await?;
        cached(tx, &format!("{label}\n{sql}")).await
    }
}

/// `/* scale a b c */`: for each table's size in bytes, the power of two of
/// its 8 KiB pages (0 for none, 1 for one page, 2 for two or three…).
fn label_of(bytes: &[i64]) -> String {
    let exps: Vec<String> = (bytes.iter())
        .map(|&b| (64 - (b.max(0) as u64 / 8192).leading_zeros()).to_string())
        .collect();
    format!("/* scale {} */", exps.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_changes_only_when_a_table_passes_a_power_of_two_of_pages() {
        let page = 8192;
        assert_eq!(label_of(&[0, page, 3 * page]), "/* scale 0 1 2 */");
        // Within a factor of two of its pages: the same label, the same plan.
        assert_eq!(
            label_of(&[1024 * page, 0, 0]),
            label_of(&[2047 * page, 0, 0])
        );
        // Grown past one: a new statement, planned on the new size.
        assert_ne!(
            label_of(&[1024 * page, 0, 0]),
            label_of(&[2048 * page, 0, 0])
        );
        // Less than a page is no page.
        assert_eq!(label_of(&[page - 1, 0, 0]), "/* scale 0 0 0 */");
    }
}
