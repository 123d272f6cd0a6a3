//! The SQL functions' live bodies are written once, in
//! `regional/sql/functions.sql`, which `Store::migrate` applies after the
//! versioned migrations (issue 20): every function of the schema is there
//! exactly once, a second `migrate` (a replica restarting) changes none of
//! them, and no migration after V25 restates one — a new migration that
//! did would be overwritten by the file's older body on every start.

use gangway_regional::store::FUNCTIONS_SQL;

mod common;

/// The functions `sql` creates, by name, in the order written.
fn written(sql: &str) -> Vec<String> {
    sql.lines()
        .filter_map(|l| l.strip_prefix("CREATE OR REPLACE FUNCTION "))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim().to_string())
        .collect()
}

async fn live(client: &tokio_postgres::Client) -> Vec<(String, String)> {
    client
        .query(
            "SELECT p.proname::text, pg_get_functiondef(p.oid) FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'public' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn every_function_of_the_schema_is_written_once_in_functions_sql() {
    let (store, client) = common::region_store("functions_live", "r1").await;
    let before = live(&client).await;
    let mut names = written(FUNCTIONS_SQL);
    assert!(names.len() >= 13, "{names:?}");
    names.sort();
    let mut once = names.clone();
    once.dedup();
    assert_eq!(names, once, "a function written twice");
    let in_db: Vec<String> = before.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(in_db, names, "functions in the schema vs in functions.sql");
    // A replica starting again: every body as it was.
    store.migrate().await.unwrap();
    assert_eq!(live(&client).await, before);
}

#[test]
fn no_migration_after_v25_restates_a_function() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let version: u32 = name
            .strip_prefix('V')
            .and_then(|v| v.split("__").next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not named V<n>__<what>.sql"));
        seen += 1;
        let sql = std::fs::read_to_string(&path).unwrap().to_uppercase();
        let sql = sql.split_whitespace().collect::<Vec<_>>().join(" ");
        let defines = sql.contains("CREATE FUNCTION") || sql.contains("CREATE OR REPLACE FUNCTION");
        assert!(
            version <= 25 || !defines,
            "{name} creates a SQL function: write its body in regional/sql/functions.sql instead \
             (applied after the migrations on every start)"
        );
    }
    assert!(seen >= 25);
}
