//! `gangway cluster …`: a tenant's dedicated clusters. Tables for people,
//! `--json` for machines; a refusal says what to ask for instead, and
//! `delete --wait` follows the delete until the nodes are back.

use std::time::Duration;

use anyhow::bail;
use clap::{Args, Subcommand};
use gangway_shared::api::{
    Cluster, ClusterResize, ClusterSpec, ClusterState, JobState, TopologyLevel,
};
use gangway_shared::client::{Client, ClientError, ListQuery};
use gangway_shared::error::codes;
use uuid::Uuid;

use crate::conn::Conn;
use crate::jobs_cli::{print_rows, table, warn_unavailable};
use crate::reservations_cli::{domain_cell, when};

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum ClusterCommand {
    /// Bind whole nodes to yourself: `gangway cluster create --gpu-type h100
    /// --nodes 4 --level leaf`. Only jobs naming the cluster (`gangway job
    /// submit --cluster ID`) run on them.
    Create {
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        args: CreateArgs,
    },
    /// Show one cluster: its nodes and its events.
    Get {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
    },
    /// List your clusters, newest first.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Grow or shrink a cluster (inside its domain).
    Resize {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
        /// The new number of nodes.
        #[arg(long)]
        nodes: i64,
        /// Idempotency key, to make a retried resize safe.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Delete a cluster: its queued jobs are cancelled, its running ones
    /// checkpointed and stopped, then its nodes go back to the region.
    Delete {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
        /// Wait until the cluster is deleted, showing its progress.
        #[arg(long)]
        wait: bool,
        /// Idempotency key, to make a retried delete safe.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
}

#[derive(Args, Debug, Clone)]
pub struct CreateArgs {
    #[arg(long)]
    gpu_type: String,
    /// Whole nodes, all bound at once (or none).
    #[arg(long)]
    nodes: i64,
    /// Every node inside one domain of this level: nvlink (or node), leaf,
    /// spine (the default) or region.
    #[arg(long, default_value = "spine")]
    level: TopologyLevel,
    /// A name for people.
    #[arg(long)]
    name: Option<String>,
    /// The region to make it in (needed when you may use several).
    #[arg(long)]
    region: Option<String>,
    /// Idempotency key. The CLI always sends one (a fresh one by default);
    /// pass your own to make a retried create safe across invocations.
    #[arg(long)]
    idempotency_key: Option<String>,
}

impl CreateArgs {
    fn spec(&self) -> anyhow::Result<ClusterSpec> {
        if self.nodes < 1 {
            bail!("say how many nodes: --nodes N (at least 1)");
        }
        Ok(ClusterSpec {
            name: self.name.clone(),
            gpu_type: self.gpu_type.clone(),
            nodes: self.nodes,
            level: self.level,
            region: self.region.clone(),
        })
    }
}

/// What to do about a refusal, after the server's message.
fn hint(code: &str, create: Option<&CreateArgs>) -> Option<String> {
    match code {
        codes::CLUSTER_UNAVAILABLE => Some(match create {
            Some(a) => {
                let wider = match a.level {
                    TopologyLevel::Nvlink => " or --level leaf",
                    TopologyLevel::Leaf => " or --level spine",
                    TopologyLevel::Spine => " or --level region",
                    TopologyLevel::Region => "",
                };
                format!(
                    "nothing was bound: ask for fewer than {} nodes{wider}, try another \
                     --region, or try again when work finishes (`gangway regions` shows free \
                     GPUs)",
                    a.nodes
                )
            }
            None => {
                "nothing changed: ask for fewer nodes, or try again when work finishes".to_string()
            }
        }),
        codes::CLUSTER_CONFLICT => Some(
            "the cluster is being deleted or is gone; make a new one with `gangway cluster \
             create`"
                .to_string(),
        ),
        codes::INVALID_CLUSTER if create.is_some_and(|a| a.region.is_none()) => {
            Some("name the region with --region NAME (`gangway regions` lists them)".to_string())
        }
        codes::NOT_FOUND => {
            Some("`gangway cluster list` lists your clusters and their ids".to_string())
        }
        _ => None,
    }
}

/// A refusal made readable; any other error as it is.
fn explained(e: ClientError, create: Option<&CreateArgs>) -> anyhow::Error {
    match &e {
        ClientError::Api { body, .. } => match hint(&body.code, create) {
            Some(h) => anyhow::anyhow!("{} ({})\n{h}", body.message, body.code),
            None => e.into(),
        },
        _ => e.into(),
    }
}

pub async fn run(cmd: ClusterCommand) -> anyhow::Result<u8> {
    match cmd {
        ClusterCommand::Create { conn, args } => {
            let spec = args.spec()?;
            let key = (args.idempotency_key.clone()).unwrap_or_else(|| Uuid::new_v4().to_string());
            let c = (conn.client()?.create_cluster(&spec, Some(&key)).await)
                .map_err(|e| explained(e, Some(&args)))?;
            print(&conn, &[c], true)?;
        }
        ClusterCommand::Get { conn, id } => {
            let c = (conn.client()?.get_cluster(id).await).map_err(|e| explained(e, None))?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                print!("{}", details(&c));
            }
        }
        ClusterCommand::List { conn } => {
            let list = conn.client()?.list_clusters().await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(0);
            }
            print(&conn, &list.clusters, false)?;
            warn_unavailable("clusters", &list.unavailable_regions);
        }
        ClusterCommand::Resize {
            conn,
            id,
            nodes,
            idempotency_key,
        } => {
            if nodes < 1 {
                bail!("--nodes must be at least 1; to give every node back, `gangway cluster delete {id}`");
            }
            let key = idempotency_key.as_deref();
            let c = (conn
                .client()?
                .resize_cluster(id, &ClusterResize { nodes }, key)
                .await)
                .map_err(|e| explained(e, None))?;
            print(&conn, &[c], true)?;
        }
        ClusterCommand::Delete {
            conn,
            id,
            wait,
            idempotency_key,
        } => {
            let client = conn.client()?;
            let key = idempotency_key.as_deref();
            let mut c = (client.delete_cluster(id, key).await).map_err(|e| explained(e, None))?;
            if wait && c.state != ClusterState::Deleted {
                c = wait_deleted(&client, c).await?;
            } else if c.state != ClusterState::Deleted {
                eprintln!(
                    "deleting: its jobs are being stopped; `gangway cluster get {id}` follows it, \
                     or pass --wait"
                );
            }
            print(&conn, &[c], true)?;
        }
    }
    Ok(0)
}

/// What a deleting cluster still waits for, as one progress line: its
/// unfinished jobs (when they could be counted) and the GPUs they hold.
fn progress(c: &Cluster, jobs: Option<usize>) -> String {
    let busy = c.members.iter().filter(|m| m.in_use_gpus > 0).count();
    let jobs = jobs.map_or_else(String::new, |n| format!("{n} job(s) still stopping, "));
    format!(
        "{}: {jobs}{} GPU(s) on {busy} node(s) still in use",
        c.state, c.in_use_gpus
    )
}

/// How many of the tenant's jobs on cluster `id` have not ended (the
/// first page of each unfinished state); `None` if a list failed.
async fn unfinished_jobs(client: &Client, id: Uuid) -> Option<usize> {
    let mut n = 0;
    for state in JobState::ALL.into_iter().filter(|s| !s.is_terminal()) {
        let query = ListQuery {
            state: Some(state),
            limit: Some(500),
            ..Default::default()
        };
        let page = client.list(&query).await.ok()?;
        n += (page.jobs.iter())
            .filter(|j| j.spec.cluster == Some(id))
            .count();
    }
    Some(n)
}

/// Polls the cluster until it is deleted, printing each change of
/// progress on stderr.
async fn wait_deleted(client: &Client, mut c: Cluster) -> anyhow::Result<Cluster> {
    let mut last = String::new();
    let mut failures = 0u32;
    loop {
        let line = progress(&c, unfinished_jobs(client, c.id).await);
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        match client.get_cluster(c.id).await {
            Ok(now) if now.state == ClusterState::Deleted => {
                eprintln!("deleted: its nodes are back in region {}", now.region);
                return Ok(now);
            }
            Ok(now) => {
                failures = 0;
                c = now;
            }
            // Keep following through a blip; give up after a minute.
            Err(e) if failures < 60 => {
                failures += 1;
                tracing::debug!(error = %e, "waiting: will retry");
            }
            Err(e) => {
                return Err(anyhow::Error::from(e).context(format!(
                    "lost track of the delete (it goes on); `gangway cluster get {}` it later",
                    c.id
                )))
            }
        }
    }
}

const HEADERS: [&str; 8] = [
    "ID", "NAME", "REGION", "NODES", "GPUS", "IN USE", "DOMAIN", "STATE",
];

fn print(conn: &Conn, list: &[Cluster], single: bool) -> anyhow::Result<()> {
    print_rows(conn, list, single, &HEADERS, row)
}

/// Nodes it has, and of how many asked when that differs (`3/4`).
fn nodes_cell(c: &Cluster) -> String {
    let have = c.members.len();
    if have == c.nodes as usize {
        have.to_string()
    } else {
        format!("{have}/{}", c.nodes)
    }
}

fn row(c: &Cluster) -> Vec<String> {
    vec![
        c.id.to_string(),
        c.name.clone().unwrap_or_else(|| "-".into()),
        c.region.clone(),
        nodes_cell(c),
        format!("{}×{}", c.gpus, c.gpu_type),
        c.in_use_gpus.to_string(),
        format!("{} {}", c.level, domain_cell(&c.domain)),
        c.state.to_string(),
    ]
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

/// `gangway cluster get`: the summary, its members, then its events
/// (newest last).
fn details(c: &Cluster) -> String {
    let mut out = table(&HEADERS, &[row(c)]);
    out.push_str(&format!(
        "placed within one {} domain\n\n",
        c.placement_level
    ));
    let members: Vec<Vec<String>> = (c.members.iter())
        .map(|m| {
            vec![
                m.node_id.clone(),
                m.leaf.clone(),
                m.gpus.to_string(),
                m.in_use_gpus.to_string(),
                yes(m.releasing),
                yes(m.schedulable),
            ]
        })
        .collect();
    if members.is_empty() {
        out.push_str("no nodes\n");
    } else {
        let headers = ["NODE", "LEAF", "GPUS", "IN USE", "RELEASING", "SCHEDULABLE"];
        out.push_str(&table(&headers, &members));
    }
    if !c.events.is_empty() {
        let events: Vec<Vec<String>> = (c.events.iter())
            .map(|e| vec![when(e.at), e.kind.clone(), e.message.clone()])
            .collect();
        out.push('\n');
        out.push_str(&table(&["AT", "EVENT", "DETAIL"], &events));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use gangway_shared::api::{ClusterEvent, ClusterNode};

    #[derive(Parser, Debug)]
    struct Create {
        #[command(flatten)]
        args: CreateArgs,
    }

    fn create(argv: &[&str]) -> CreateArgs {
        let mut all = vec!["create"];
        all.extend_from_slice(argv);
        Create::try_parse_from(all).unwrap().args
    }

    fn cluster(state: ClusterState) -> Cluster {
        let at = "2030-01-01T00:00:00Z".parse().unwrap();
        let node = |id: &str, in_use: u32, releasing: bool| ClusterNode {
            node_id: id.into(),
            spine: "s00".into(),
            leaf: "l00".into(),
            nvlink_domain: id.into(),
            gpus: 8,
            in_use_gpus: in_use,
            releasing,
            schedulable: !releasing,
        };
        Cluster {
            id: Uuid::nil(),
            tenant: "acme".into(),
            region: "us-east".into(),
            name: Some("train".into()),
            gpu_type: "h100".into(),
            nodes: 2,
            level: TopologyLevel::Leaf,
            domain: vec!["s00".into(), "l00".into()],
            placement_level: TopologyLevel::Leaf,
            state,
            gpus: 16,
            in_use_gpus: 8,
            members: vec![node("n1", 8, false), node("n2", 0, true)],
            events: vec![
                ClusterEvent {
                    at,
                    kind: "created".into(),
                    message: "created with 2 h100 node(s)".into(),
                    details: serde_json::Value::Null,
                },
                ClusterEvent {
                    at,
                    kind: "deleting".into(),
                    message: "deleting".into(),
                    details: serde_json::json!({"stopping_jobs": 1}),
                },
            ],
            created_at: at,
            updated_at: at,
        }
    }

    #[test]
    fn a_create_defaults_to_the_spine_and_refuses_no_nodes() {
        let a = create(&["--gpu-type", "h100", "--nodes", "4"]);
        let s = a.spec().unwrap();
        assert_eq!(
            (s.level, s.nodes, s.region),
            (TopologyLevel::Spine, 4, None)
        );
        let a = create(&["--gpu-type", "h100", "--nodes", "2", "--level", "node"]);
        assert_eq!(a.spec().unwrap().level, TopologyLevel::Nvlink);
        assert!(create(&["--gpu-type", "h100", "--nodes", "0"])
            .spec()
            .is_err());
    }

    #[test]
    fn a_refusal_says_what_to_ask_for_instead() {
        let a = create(&["--gpu-type", "h100", "--nodes", "4", "--level", "leaf"]);
        let h = hint(codes::CLUSTER_UNAVAILABLE, Some(&a)).unwrap();
        assert!(h.contains("fewer than 4 nodes or --level spine"), "{h}");
        let h = hint(codes::INVALID_CLUSTER, Some(&a)).unwrap();
        assert!(h.contains("--region"), "{h}");
        assert!(hint(codes::INVALID_SPEC, Some(&a)).is_none());
    }

    #[test]
    fn get_shows_members_and_events_newest_last() {
        let text = details(&cluster(ClusterState::Ready));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ID"), "{text}");
        assert!(lines[1].contains("16×h100") && lines[1].contains("leaf s00/l00"));
        let member = lines.iter().find(|l| l.starts_with("n2")).unwrap();
        assert!(member.contains("yes") && member.ends_with("no"), "{member}");
        let created = text.find("created with").unwrap();
        assert!(created < text.rfind("deleting").unwrap(), "{text}");
    }

    #[test]
    fn progress_says_what_a_delete_waits_for() {
        let c = cluster(ClusterState::Deleting);
        assert_eq!(
            progress(&c, Some(2)),
            "deleting: 2 job(s) still stopping, 8 GPU(s) on 1 node(s) still in use"
        );
        assert_eq!(
            progress(&c, None),
            "deleting: 8 GPU(s) on 1 node(s) still in use"
        );
    }
}
