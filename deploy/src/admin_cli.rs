//! `gangway admin …`: operator commands.

use clap::Subcommand;
use reqwest::Method;

use crate::conn::Conn;
use crate::jobs_cli::table;

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Per-tenant caps on GPUs allocated at once, per GPU type.
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
    /// Set a tenant's cap: `gangway admin quota set globex h100 64`.
    Set {
        #[command(flatten)]
        conn: Conn,
        tenant: String,
        gpu_type: String,
        max_gpus: i64,
    },
    /// List every cap.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove a cap (the tenant is then limited only by capacity).
    Delete {
        #[command(flatten)]
        conn: Conn,
        tenant: String,
        gpu_type: String,
    },
}

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
                rows.push(vec![
                    region.clone(),
                    format!("error {code}: {msg}"),
                    String::new(),
                    String::new(),
                ]);
                continue;
            }
            let quotas: Vec<serde_json::Value> = match v.get("quotas") {
                Some(list) => list.as_array().cloned().unwrap_or_default(),
                None if v.get("deleted").is_some() => {
                    rows.push(vec![
                        region.clone(),
                        "deleted".into(),
                        String::new(),
                        String::new(),
                    ]);
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
                rows.push(vec![
                    region.clone(),
                    f("tenant"),
                    f("gpu_type"),
                    f("max_gpus"),
                ]);
            }
        }
    }
    print!(
        "{}",
        table(&["REGION", "TENANT", "GPU TYPE", "MAX GPUS"], &rows)
    );
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
            max_gpus,
        } => (
            conn,
            Method::PUT,
            format!("/v1/admin/quotas/{tenant}/{gpu_type}"),
            Some(serde_json::json!({ "max_gpus": max_gpus })),
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
