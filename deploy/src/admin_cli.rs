//! `gangway admin …`: operator commands.

use clap::Subcommand;

use crate::jobs_cli::{table, Conn};

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Per-tenant caps on GPUs allocated at once, per GPU type.
    Quota {
        #[command(subcommand)]
        command: QuotaCommand,
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

pub async fn run(cmd: AdminCommand) -> anyhow::Result<()> {
    let AdminCommand::Quota { command } = cmd;
    match command {
        QuotaCommand::Set {
            conn,
            tenant,
            gpu_type,
            max_gpus,
        } => {
            let q = conn
                .client()?
                .set_quota(&tenant, &gpu_type, max_gpus)
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&q)?);
            } else {
                println!(
                    "{}: at most {} {} GPUs at once",
                    q.tenant, q.max_gpus, q.gpu_type
                );
            }
        }
        QuotaCommand::List { conn } => {
            let list = conn.client()?.list_quotas().await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let rows: Vec<Vec<String>> = list
                    .quotas
                    .iter()
                    .map(|q| vec![q.tenant.clone(), q.gpu_type.clone(), q.max_gpus.to_string()])
                    .collect();
                print!("{}", table(&["TENANT", "GPU TYPE", "MAX GPUS"], &rows));
            }
        }
        QuotaCommand::Delete {
            conn,
            tenant,
            gpu_type,
        } => {
            conn.client()?.delete_quota(&tenant, &gpu_type).await?;
            if !conn.json {
                println!("{tenant}: no cap on {gpu_type} GPUs");
            }
        }
    }
    Ok(())
}
