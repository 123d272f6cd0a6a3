//! `gangway admin …`: operator commands.

use clap::Subcommand;
use reqwest::Method;

use crate::conn::Conn;
use crate::jobs_cli::table;

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Per-tenant terms per GPU type: guaranteed GPUs, fair-share weight
    /// and an optional cap.
    Quota {
        #[command(subcommand)]
        command: QuotaCommand,
    },
    /// Act on any tenant's job.
    Job {
        #[command(subcommand)]
        command: JobAdminCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum JobAdminCommand {
    /// Ask a job to checkpoint, stop and requeue; it resumes from its
    /// newest checkpoint.
    Preempt {
        #[command(flatten)]
        conn: Conn,
        id: uuid::Uuid,
    },
}

#[derive(Subcommand, Debug)]
pub enum QuotaCommand {
    /// Set (replace) a tenant's terms for a GPU type:
    /// `gangway admin quota set globex h100 --guaranteed 64 --max 128 --weight 2`.
    Set {
        #[command(flatten)]
        conn: Conn,
        tenant: String,
        gpu_type: String,
        /// GPUs guaranteed: lent to others while unused, taken back by
        /// preempting tenants beyond their own guarantees when needed.
        #[arg(long)]
        guaranteed: i64,
        /// The most GPUs the tenant may hold at once, borrowing included
        /// (default: no cap).
        #[arg(long = "max")]
        max_gpus: Option<i64>,
        /// Fair-share weight among tenants beyond their guarantees
        /// (default 1.0).
        #[arg(long)]
        weight: Option<f64>,
    },
    /// List every tenant's terms.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove a tenant's terms (it is then guaranteed nothing, has weight 1
    /// and no cap).
    Delete {
        #[command(flatten)]
        conn: Conn,
        tenant: String,
        gpu_type: String,
    },
}

/// The quota table's columns.
const COLUMNS: &[&str] = &[
    "REGION",
    "TENANT",
    "GPU TYPE",
    "GUARANTEED",
    "MAX GPUS",
    "WEIGHT",
];

/// Prints the global tier's per-region answer: `{"regions": {name: doc}}`.
fn print_per_region(conn: &Conn, doc: &serde_json::Value) -> anyhow::Result<()> {
    if conn.json {
        println!("{}", serde_json::to_string_pretty(doc)?);
        return Ok(());
    }
    let mut rows = Vec::new();
    if let Some(regions) = doc.get("regions").and_then(|r| r.as_object()) {
        for (region, v) in regions {
            if let Some(code) = v.get("code").and_then(|c| c.as_str()) {
                let msg = v.get("message").and_then(|m| m.as_str()).unwrap_or("");
                let mut row = vec![region.clone(), format!("error {code}: {msg}")];
                row.resize(COLUMNS.len(), String::new());
                rows.push(row);
                continue;
            }
            let quotas: Vec<serde_json::Value> = match v.get("quotas") {
                Some(list) => list.as_array().cloned().unwrap_or_default(),
                None if v.get("deleted").is_some() => {
                    let mut row = vec![region.clone(), "deleted".into()];
                    row.resize(COLUMNS.len(), String::new());
                    rows.push(row);
                    continue;
                }
                None => vec![v.clone()],
            };
            for q in quotas {
                let f = |k: &str| {
                    q.get(k)
                        .map(|x| x.to_string().trim_matches('"').to_string())
                        .unwrap_or_default()
                };
                let max = match q.get("max_gpus") {
                    None | Some(serde_json::Value::Null) => "none".to_string(),
                    Some(_) => f("max_gpus"),
                };
                rows.push(vec![
                    region.clone(),
                    f("tenant"),
                    f("gpu_type"),
                    f("guaranteed_gpus"),
                    max,
                    f("weight"),
                ]);
            }
        }
    }
    print!("{}", table(COLUMNS, &rows));
    Ok(())
}

pub async fn run(cmd: AdminCommand) -> anyhow::Result<u8> {
    let command = match cmd {
        AdminCommand::Quota { command } => command,
        AdminCommand::Job {
            command: JobAdminCommand::Preempt { conn, id },
        } => {
            let doc = conn
                .admin_client()?
                .call_json(Method::POST, &format!("/v1/admin/jobs/{id}/preempt"), None)
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!("{id}: asked to checkpoint and stop; it requeues and resumes from its newest checkpoint");
            }
            return Ok(0);
        }
    };
    let (conn, method, path, body) = match command {
        QuotaCommand::Set {
            conn,
            tenant,
            gpu_type,
            guaranteed,
            max_gpus,
            weight,
        } => (
            conn,
            Method::PUT,
            format!("/v1/admin/quotas/{tenant}/{gpu_type}"),
            Some(
                serde_json::to_value(gangway_shared::api::QuotaUpdate {
                    guaranteed_gpus: guaranteed,
                    max_gpus,
                    weight,
                })
                .expect("a quota serializes"),
            ),
        ),
        QuotaCommand::List { conn } => (conn, Method::GET, "/v1/admin/quotas".to_string(), None),
        QuotaCommand::Delete {
            conn,
            tenant,
            gpu_type,
        } => (
            conn,
            Method::DELETE,
            format!("/v1/admin/quotas/{tenant}/{gpu_type}"),
            None,
        ),
    };
    let doc = conn
        .admin_client()?
        .call_json(method, &path, body.as_ref())
        .await?;
    print_per_region(&conn, &doc)?;
    Ok(0)
}
