//! `gangway admin …`: operator commands.

use clap::Subcommand;
use reqwest::Method;

use crate::conn::Conn;
use crate::jobs_cli::table;

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum AdminCommand {
    /// Per-tenant terms per GPU type: guaranteed GPUs, fair-share weight
    /// and an optional cap.
    Quota {
        #[command(subcommand)]
        command: QuotaCommand,
    },
    /// Per-tenant admission limits, per region: at most so many queued
    /// jobs, at most so many GPUs asked by unfinished jobs. A submit over
    /// one is refused (429 `queued_jobs_limit`, `requested_gpus_limit`).
    Limits {
        #[command(subcommand)]
        command: LimitsCommand,
    },
    /// Tenants as records: create, list, suspend (refuse its every
    /// request; --stop-jobs cancels its unfinished jobs), resume.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Act on any tenant's job.
    Job {
        #[command(subcommand)]
        command: JobAdminCommand,
    },
    /// Nodes: both axes of their state (what operators asked, what agents
    /// observe), cordon, uncordon, drain, inject faults (simulated fleets).
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// Agents' credentials: a token per agent (a real machine's agent is
    /// named as its node), bound to it and to one region.
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// Rolling maintenance: reboot nodes in capacity-aware waves.
    Maintenance {
        #[command(subcommand)]
        command: MaintenanceCommand,
    },
    /// Goodput per tenant: useful over allocated GPU time (work lost to
    /// restarts since the last checkpoint left out).
    Goodput {
        #[command(flatten)]
        conn: Conn,
        #[arg(long)]
        region: Option<String>,
    },
    /// The queue by tenant and GPU type, per region: jobs and GPUs
    /// waiting, jobs and GPUs placed, and the longest wait.
    Queue {
        #[command(flatten)]
        conn: Conn,
        #[arg(long)]
        region: Option<String>,
    },
    /// The audit log: every operator action, newest first.
    Audit {
        #[command(flatten)]
        conn: Conn,
        /// Only this region.
        #[arg(long)]
        region: Option<String>,
        /// Only this action (node.drain, quota.set, limits.set, job.preempt, …).
        #[arg(long)]
        action: Option<String>,
        /// Only this target (a node id, a job id, tenant/gpu_type, a tenant).
        #[arg(long)]
        target: Option<String>,
        /// Entries per region (1–1000).
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum TenantCommand {
    /// Record a tenant (active).
    Create {
        #[command(flatten)]
        conn: Conn,
        /// Its id, as its tokens name it.
        tenant: String,
        /// A name for people (default: the id).
        #[arg(long)]
        display_name: Option<String>,
    },
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Refuse every request of the tenant's (tokens and keys) from now on
    /// (every global replica within 5 s).
    Suspend {
        #[command(flatten)]
        conn: Conn,
        tenant: String,
        /// Also cancel its unfinished jobs in every region (default: they
        /// run on).
        #[arg(long)]
        stop_jobs: bool,
    },
    /// Serve the tenant again.
    Resume {
        #[command(flatten)]
        conn: Conn,
        tenant: String,
    },
}

async fn tenant(command: TenantCommand) -> anyhow::Result<u8> {
    let (conn, method, path, body) = match command {
        TenantCommand::Create {
            conn,
            tenant,
            display_name,
        } => (
            conn,
            Method::POST,
            "/v1/admin/tenants".to_string(),
            Some(serde_json::json!({"tenant": tenant, "display_name": display_name})),
        ),
        TenantCommand::List { conn } => (conn, Method::GET, "/v1/admin/tenants".into(), None),
        TenantCommand::Suspend {
            conn,
            tenant,
            stop_jobs,
        } => (
            conn,
            Method::POST,
            format!("/v1/admin/tenants/{tenant}/suspend"),
            Some(serde_json::json!({ "stop_jobs": stop_jobs })),
        ),
        TenantCommand::Resume { conn, tenant } => (
            conn,
            Method::POST,
            format!("/v1/admin/tenants/{tenant}/resume"),
            None,
        ),
    };
    let doc = conn
        .admin_client()?
        .call_json(method, &path, body.as_ref())
        .await?;
    if conn.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
    }
    let records: Vec<&serde_json::Value> = match doc.get("tenants") {
        Some(list) => list.as_array().into_iter().flatten().collect(),
        None => vec![doc.get("tenant").filter(|t| t.is_object()).unwrap_or(&doc)],
    };
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|t| {
            vec![
                s(t, "tenant"),
                s(t, "display_name"),
                s(t, "state"),
                s(t, "updated_at"),
                s(t, "updated_by"),
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["TENANT", "DISPLAY NAME", "STATE", "UPDATED", "BY"], &rows)
    );
    if let Some(n) = doc.get("stopped_jobs").and_then(|n| n.as_u64()) {
        if n > 0 {
            println!("{n} unfinished jobs asked to stop");
        }
    }
    Ok(0)
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum MaintenanceCommand {
    /// Start a plan in a region: name the nodes (--all, --leaf, --gpu-type,
    /// --nodes; together they narrow each other) and the limits.
    Start {
        #[command(flatten)]
        conn: Conn,
        /// The region to maintain.
        #[arg(long)]
        region: String,
        /// Every (non-spare) node of the region.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        leaf: Option<String>,
        #[arg(long)]
        gpu_type: Option<String>,
        /// Node ids, comma-separated.
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// At most this many nodes of one leaf out at once (K).
        #[arg(long, default_value_t = 1)]
        per_leaf: u32,
        /// At most this percentage of the region's nodes out at once,
        /// other outages counted (M).
        #[arg(long, default_value_t = 10)]
        max_percent: u32,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Progress of a plan: nodes per step and a progress bar.
    Status {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[arg(long)]
        region: Option<String>,
        /// Every node's step too.
        #[arg(long)]
        nodes: bool,
    },
    /// Every plan, newest first.
    List {
        #[command(flatten)]
        conn: Conn,
        #[arg(long)]
        region: Option<String>,
    },
    /// Stop a running plan; the nodes it took out return to service.
    Cancel {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum NodeCommand {
    /// Every node, with its admin and observed state, usable GPUs and why;
    /// and the machines refused as not in the inventory (`unknown`).
    List {
        #[command(flatten)]
        conn: Conn,
        /// Only this region.
        #[arg(long)]
        region: Option<String>,
        /// Only this leaf's nodes.
        #[arg(long)]
        leaf: Option<String>,
    },
    /// One node in detail, with its newest events.
    Get {
        #[command(flatten)]
        conn: Conn,
        id: String,
        /// The node's region (default: from its id).
        #[arg(long)]
        region: Option<String>,
    },
    /// No new work on the node; running jobs stay.
    Cordon {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        region: Option<String>,
    },
    /// Return the node to service (from cordon, drain or repair).
    Uncordon {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        region: Option<String>,
    },
    /// Cordon the node and move its jobs elsewhere through a checkpoint.
    Drain {
        #[command(flatten)]
        conn: Conn,
        id: String,
        /// `checkpoint`: checkpoint and move the jobs now; `wait`: let them
        /// finish, move those still running at the deadline.
        #[arg(long, default_value = "checkpoint")]
        mode: String,
        /// Seconds (checkpoint: at most this long to write a checkpoint;
        /// wait: how long jobs may run on).
        #[arg(long)]
        deadline_s: Option<i64>,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        region: Option<String>,
    },
    /// Admit a machine listed as unknown into its region's inventory, where
    /// it sits: its next registration is accepted and it takes work.
    Admit {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[command(flatten)]
        place: Placement,
        #[arg(long)]
        region: Option<String>,
    },
    /// Add a machine to a region's inventory (before or after it first
    /// tries to join), or move it.
    Add {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[command(flatten)]
        place: Placement,
        /// The region it belongs to (default: the only one).
        #[arg(long)]
        region: Option<String>,
    },
    /// Take a node over: the agent holding it loses its claim, so the next
    /// agent to register the node gets it even while the old one is alive
    /// (a machine replaced under the same name). Audited.
    Release {
        #[command(flatten)]
        conn: Conn,
        id: String,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        region: Option<String>,
    },
    /// Inject a fault into a simulated node, as if its agent reported it:
    /// `--kind xid --code 79 --gpu 0`, `--kind thermal --gpu 1`,
    /// `--kind node-down`, `--kind link-flap`, `--kind reboot`,
    /// `--kind rack-thermal [--throttled false]`, …
    InjectFault {
        #[command(flatten)]
        conn: Conn,
        id: String,
        /// xid, ecc, remap, thermal, nvlink, node-down, link-flap, reboot,
        /// rack-thermal.
        #[arg(long)]
        kind: String,
        #[arg(long)]
        gpu: Option<u32>,
        /// The XID (xid).
        #[arg(long)]
        code: Option<u32>,
        /// Temperature (thermal).
        #[arg(long)]
        celsius: Option<u32>,
        /// Whether the GPU (thermal) or the node's rack (rack-thermal)
        /// throttles; default true.
        #[arg(long)]
        throttled: Option<bool>,
        /// NVLink errors since boot (nvlink; default: the policy's limit).
        #[arg(long)]
        errors: Option<u64>,
        /// ECC counts (ecc).
        #[arg(long, default_value_t = 0)]
        single_bit: u64,
        #[arg(long, default_value_t = 0)]
        double_bit: u64,
        /// Row remap state (remap).
        #[arg(long)]
        pending: bool,
        #[arg(long)]
        failed: bool,
        /// How long the link stays down (link-flap).
        #[arg(long)]
        silent_s: Option<u64>,
        #[arg(long)]
        region: Option<String>,
    },
}

/// Where a machine sits in its region's topology.
#[derive(clap::Args, Debug)]
pub struct Placement {
    /// Its spine (pod), as the region's other nodes name theirs.
    #[arg(long)]
    spine: String,
    /// Its leaf switch (rack).
    #[arg(long)]
    leaf: String,
    /// Its NVLink domain (default: the node itself; the leaf for a
    /// rack-scale domain such as GB200 NVL72).
    #[arg(long)]
    nvlink_domain: Option<String>,
    /// Hold it in the spare pool.
    #[arg(long)]
    spare: bool,
    /// The GPU type it must report (default: whatever it reports).
    #[arg(long)]
    gpu_type: Option<String>,
    /// The agent that may serve it (default: its own, named as the node).
    #[arg(long)]
    agent_id: Option<String>,
    /// Its rack's power budget for GPU draw, in watts.
    #[arg(long)]
    rack_power_budget_w: Option<u64>,
    #[arg(long)]
    reason: Option<String>,
}

impl Placement {
    fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "spine": self.spine, "leaf": self.leaf, "nvlink_domain": self.nvlink_domain,
            "spare": self.spare, "gpu_type": self.gpu_type, "agent_id": self.agent_id,
            "rack_power_budget_w": self.rack_power_budget_w, "reason": self.reason,
        });
        if let Some(o) = body.as_object_mut() {
            o.retain(|_, v| !v.is_null());
        }
        body
    }
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum AgentCommand {
    /// Mint a token for one agent of one region (a real machine's agent is
    /// named as its node: `gangway admin agent token gpu-a1-001`). Give it
    /// to that agent alone (GANGWAY_AGENT_TOKEN); it cannot act for any
    /// other node or region.
    Token {
        #[command(flatten)]
        conn: Conn,
        /// The agent (a real machine's: its node name).
        id: String,
        /// The region it serves (default: the only one).
        #[arg(long)]
        region: Option<String>,
        /// How long it lasts, in days.
        #[arg(long, default_value_t = 90)]
        ttl_days: u64,
    },
}

async fn agent(cmd: AgentCommand) -> anyhow::Result<u8> {
    let AgentCommand::Token {
        conn,
        id,
        region,
        ttl_days,
    } = cmd;
    let mut q = region_query(region);
    q.push(("ttl_days", ttl_days.to_string()));
    let doc = conn
        .admin_client()?
        .call_json(
            Method::POST,
            &with_query(&format!("/v1/admin/agents/{id}/token"), &q),
            None,
        )
        .await?;
    if conn.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        // The token alone on stdout, so it can be piped into a secret.
        println!("{}", s(&doc, "token"));
        eprintln!(
            "agent {} of region {}, expires {}",
            s(&doc, "agent_id"),
            s(&doc, "region"),
            s(&doc, "expires_at")
        );
    }
    Ok(0)
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
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
#[command(defer = true)]
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

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum LimitsCommand {
    /// Set (replace) a tenant's admission limits in every region (or one):
    /// `gangway admin limits set globex --max-queued-jobs 100 --max-gpus 512`.
    /// A limit left out is no limit on that dimension; give at least one.
    #[command(group(clap::ArgGroup::new("limit")
        .required(true)
        .multiple(true)
        .args(["max_queued_jobs", "max_gpus"])))]
    Set {
        #[command(flatten)]
        conn: Conn,
        tenant: String,
        /// The most of the tenant's jobs queued at once, per region.
        #[arg(long, allow_hyphen_values = true)]
        max_queued_jobs: Option<i64>,
        /// The most GPUs the tenant's unfinished jobs (queued, starting,
        /// running, …) may ask for together, per region, the new job's
        /// included.
        #[arg(long, allow_hyphen_values = true)]
        max_gpus: Option<i64>,
        /// Only this region (default: every region).
        #[arg(long)]
        region: Option<String>,
    },
    /// List every tenant's limits, per region.
    List {
        #[command(flatten)]
        conn: Conn,
        /// Only this region.
        #[arg(long)]
        region: Option<String>,
    },
    /// Remove a tenant's limits (its submits are then never refused for
    /// them); a region where it had none says so.
    Delete {
        #[command(flatten)]
        conn: Conn,
        tenant: String,
        /// Only this region.
        #[arg(long)]
        region: Option<String>,
    },
}

/// The limits table's columns.
const LIMITS_COLUMNS: &[&str] = &["REGION", "TENANT", "MAX QUEUED JOBS", "MAX GPUS", "UPDATED"];

/// The limits table's rows from the global tier's per-region answer (a
/// list, the limits set, `{"deleted": true}` or an error per region), and
/// whether a region answered an error (a delete's `not_found` aside: the
/// tenant had no limits there).
fn limits_rows(doc: &serde_json::Value, deleting: bool) -> (Vec<Vec<String>>, bool) {
    let mut rows = Vec::new();
    let mut failed = false;
    let short = |region: &str, what: String| {
        let mut row = vec![region.to_string(), what];
        row.resize(LIMITS_COLUMNS.len(), String::new());
        row
    };
    for (region, v) in doc["regions"].as_object().into_iter().flatten() {
        if let Some(code) = v.get("code").and_then(|c| c.as_str()) {
            if deleting && code == gangway_shared::error::codes::NOT_FOUND {
                rows.push(short(region, "no limits there".into()));
            } else {
                failed = true;
                rows.push(short(region, format!("error {code}: {}", s(v, "message"))));
            }
            continue;
        }
        if v.get("deleted").is_some() {
            rows.push(short(region, "deleted".into()));
            continue;
        }
        let list: Vec<serde_json::Value> = match v.get("limits") {
            Some(list) => list.as_array().cloned().unwrap_or_default(),
            None => vec![v.clone()],
        };
        let limit = |l: &serde_json::Value, k: &str| match l.get(k) {
            None | Some(serde_json::Value::Null) => "none".to_string(),
            Some(_) => s(l, k),
        };
        for l in list {
            rows.push(vec![
                region.clone(),
                s(&l, "tenant"),
                limit(&l, "max_queued_jobs"),
                limit(&l, "max_gpus"),
                s(&l, "updated_at"),
            ]);
        }
    }
    (rows, failed)
}

async fn limits(cmd: LimitsCommand) -> anyhow::Result<u8> {
    let (conn, method, path, region, body, deleting) = match cmd {
        LimitsCommand::Set {
            conn,
            tenant,
            max_queued_jobs,
            max_gpus,
            region,
        } => {
            let update = gangway_shared::api::LimitsUpdate {
                max_queued_jobs,
                max_gpus,
            };
            // The regions check the same; a typo is caught before any is asked.
            if let Err(r) = update.check() {
                anyhow::bail!("{} ({})", r.message, r.code);
            }
            (
                conn,
                Method::PUT,
                format!("/v1/admin/limits/{tenant}"),
                region,
                Some(serde_json::to_value(update).expect("a limits update serializes")),
                false,
            )
        }
        LimitsCommand::List { conn, region } => (
            conn,
            Method::GET,
            "/v1/admin/limits".to_string(),
            region,
            None,
            false,
        ),
        LimitsCommand::Delete {
            conn,
            tenant,
            region,
        } => (
            conn,
            Method::DELETE,
            format!("/v1/admin/limits/{tenant}"),
            region,
            None,
            true,
        ),
    };
    let doc = conn
        .admin_client()?
        .call_json(
            method,
            &with_query(&path, &region_query(region)),
            body.as_ref(),
        )
        .await?;
    let (rows, failed) = limits_rows(&doc, deleting);
    if conn.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", table(LIMITS_COLUMNS, &rows));
    }
    Ok(u8::from(failed))
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
        AdminCommand::Limits { command } => return limits(command).await,
        AdminCommand::Tenant { command } => return tenant(command).await,
        AdminCommand::Node { command } => return node(command).await,
        AdminCommand::Agent { command } => return agent(command).await,
        AdminCommand::Maintenance { command } => return maintenance(command).await,
        AdminCommand::Goodput { conn, region } => {
            let doc = conn
                .admin_client()?
                .call_json(
                    Method::GET,
                    &with_query("/v1/admin/goodput", &region_query(region)),
                    None,
                )
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
                return Ok(0);
            }
            let mut rows = Vec::new();
            for (region, v) in doc["regions"].as_object().into_iter().flatten() {
                for t in v["tenants"].as_array().into_iter().flatten() {
                    let h = |k: &str| format!("{:.2}", t[k].as_f64().unwrap_or(0.0) / 3600.0);
                    rows.push(vec![
                        s(t, "tenant"),
                        region.clone(),
                        h("allocated_gpu_s"),
                        h("lost_gpu_s"),
                        t["goodput"]
                            .as_f64()
                            .map_or("-".into(), |g| format!("{:.1}%", g * 100.0)),
                    ]);
                }
            }
            print!(
                "{}",
                table(
                    &[
                        "TENANT",
                        "REGION",
                        "ALLOCATED GPU-H",
                        "LOST GPU-H",
                        "GOODPUT"
                    ],
                    &rows
                )
            );
            return Ok(0);
        }
        AdminCommand::Queue { conn, region } => {
            let doc = conn
                .admin_client()?
                .call_json(
                    Method::GET,
                    &with_query("/v1/admin/queue", &region_query(region)),
                    None,
                )
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
                return Ok(0);
            }
            let now = chrono::Utc::now();
            let mut rows = Vec::new();
            for (region, v) in doc["regions"].as_object().into_iter().flatten() {
                if let Some(e) = v["message"].as_str() {
                    eprintln!("{region}: {e}");
                }
                for r in v["rows"].as_array().into_iter().flatten() {
                    let n = |k: &str| r[k].as_u64().unwrap_or(0).to_string();
                    let waited = (r["oldest_queued_at"].as_str())
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                        .map_or("-".into(), |t| {
                            let m = (now - t.with_timezone(&chrono::Utc)).num_minutes();
                            if m < 120 {
                                format!("{m} min")
                            } else {
                                format!("{:.1} h", m as f64 / 60.0)
                            }
                        });
                    rows.push(vec![
                        region.clone(),
                        s(r, "tenant"),
                        s(r, "gpu_type"),
                        n("queued_jobs"),
                        n("queued_gpus"),
                        n("active_jobs"),
                        n("active_gpus"),
                        waited,
                    ]);
                }
            }
            print!(
                "{}",
                table(
                    &[
                        "REGION",
                        "TENANT",
                        "GPU TYPE",
                        "QUEUED JOBS",
                        "QUEUED GPUS",
                        "PLACED JOBS",
                        "PLACED GPUS",
                        "LONGEST WAIT"
                    ],
                    &rows
                )
            );
            return Ok(0);
        }
        AdminCommand::Audit {
            conn,
            region,
            action,
            target,
            limit,
        } => {
            let mut q: Vec<(&str, String)> = vec![("limit", limit.to_string())];
            if let Some(r) = region {
                q.push(("region", r));
            }
            if let Some(a) = action {
                q.push(("action", a));
            }
            if let Some(t) = target {
                q.push(("target", t));
            }
            let doc = conn
                .admin_client()?
                .call_json(Method::GET, &with_query("/v1/admin/audit", &q), None)
                .await?;
            print_audit(&conn, &doc)?;
            return Ok(0);
        }
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

/// `path?k=v&…`, values percent-encoded.
pub(crate) fn with_query(path: &str, q: &[(&str, String)]) -> String {
    if q.is_empty() {
        return path.to_string();
    }
    format!("{path}?{}", gangway_shared::http::query_string(q))
}

fn region_query(region: Option<String>) -> Vec<(&'static str, String)> {
    region.map(|r| vec![("region", r)]).unwrap_or_default()
}

fn s(v: &serde_json::Value, k: &str) -> String {
    match v.get(k) {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(x)) => x.clone(),
        Some(x) => x.to_string(),
    }
}

/// `0-3,5,7` for a list of GPU indices.
fn gpu_ranges(v: Option<&serde_json::Value>) -> String {
    let mut g: Vec<u64> = v
        .and_then(|x| x.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default();
    g.sort_unstable();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < g.len() {
        let mut j = i;
        while j + 1 < g.len() && g[j + 1] == g[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", g[i], g[j])
        } else {
            g[i].to_string()
        });
        i = j + 1;
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(",")
    }
}

const NODE_COLUMNS: &[&str] = &[
    "NODE",
    "REGION",
    "GPU TYPE",
    "ADMIN",
    "OBSERVED",
    "USABLE",
    "ALLOCATED",
    "JOBS",
    "WHY",
];

fn node_row(n: &serde_json::Value) -> Vec<String> {
    vec![
        s(n, "node_id"),
        s(n, "region"),
        s(n, "gpu_type"),
        s(n, "admin_state"),
        s(n, "observed"),
        format!(
            "{}/{}",
            n["usable_gpus"].as_array().map_or(0, Vec::len),
            s(n, "gpus")
        ),
        gpu_ranges(n.get("allocated_gpus")),
        n["jobs"].as_array().map_or(0, Vec::len).to_string(),
        s(n, "why"),
    ]
}

async fn node(cmd: NodeCommand) -> anyhow::Result<u8> {
    use serde_json::json;
    let (conn, method, path, query, body) = match cmd {
        NodeCommand::List { conn, region, leaf } => {
            let mut query = region_query(region);
            query.extend(leaf.map(|l| ("leaf", l)));
            let doc = conn
                .admin_client()?
                .call_json(Method::GET, &with_query("/v1/admin/nodes", &query), None)
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
                return Ok(0);
            }
            let mut rows = Vec::new();
            if let Some(regions) = doc.get("regions").and_then(|r| r.as_object()) {
                for (region, v) in regions {
                    if let Some(code) = v.get("code").and_then(|c| c.as_str()) {
                        let mut row = vec![
                            String::new(),
                            region.clone(),
                            format!("error {code}: {}", s(v, "message")),
                        ];
                        row.resize(NODE_COLUMNS.len(), String::new());
                        rows.push(row);
                        continue;
                    }
                    for n in v["nodes"].as_array().into_iter().flatten() {
                        rows.push(node_row(n));
                    }
                    // Refused as not in the inventory: no work until admitted.
                    for n in v["unknown"].as_array().into_iter().flatten() {
                        let mut row = vec![
                            s(n, "node_id"),
                            region.clone(),
                            s(n, "gpu_type"),
                            "-".into(),
                            "unknown".into(),
                            format!("0/{}", s(n, "gpus")),
                            "-".into(),
                            "0".into(),
                            format!(
                                "not in the inventory (agent {}, last tried {}): gangway admin node admit",
                                s(n, "agent_id"),
                                s(n, "last_seen_at")
                            ),
                        ];
                        row.resize(NODE_COLUMNS.len(), String::new());
                        rows.push(row);
                    }
                }
            }
            print!("{}", table(NODE_COLUMNS, &rows));
            return Ok(0);
        }
        NodeCommand::Get { conn, id, region } => (
            conn,
            Method::GET,
            format!("/v1/admin/nodes/{id}"),
            region_query(region),
            None,
        ),
        NodeCommand::Cordon {
            conn,
            id,
            reason,
            region,
        } => (
            conn,
            Method::POST,
            format!("/v1/admin/nodes/{id}/cordon"),
            region_query(region),
            Some(json!({"reason": reason})),
        ),
        NodeCommand::Uncordon {
            conn,
            id,
            reason,
            region,
        } => (
            conn,
            Method::POST,
            format!("/v1/admin/nodes/{id}/uncordon"),
            region_query(region),
            Some(json!({"reason": reason})),
        ),
        NodeCommand::Drain {
            conn,
            id,
            mode,
            deadline_s,
            reason,
            region,
        } => {
            anyhow::ensure!(
                matches!(mode.as_str(), "checkpoint" | "wait"),
                "--mode is checkpoint or wait"
            );
            let mut body = json!({"mode": mode, "reason": reason});
            if let Some(d) = deadline_s {
                body["deadline_s"] = json!(d);
            }
            (
                conn,
                Method::POST,
                format!("/v1/admin/nodes/{id}/drain"),
                region_query(region),
                Some(body),
            )
        }
        NodeCommand::Admit {
            conn,
            id,
            place,
            region,
        } => (
            conn,
            Method::POST,
            format!("/v1/admin/nodes/{id}/admit"),
            region_query(region),
            Some(place.body()),
        ),
        NodeCommand::Add {
            conn,
            id,
            place,
            region,
        } => (
            conn,
            Method::PUT,
            format!("/v1/admin/inventory/{id}"),
            region_query(region),
            Some(place.body()),
        ),
        NodeCommand::Release {
            conn,
            id,
            reason,
            region,
        } => (
            conn,
            Method::POST,
            format!("/v1/admin/nodes/{id}/release"),
            region_query(region),
            Some(json!({"reason": reason})),
        ),
        NodeCommand::InjectFault {
            conn,
            id,
            kind,
            gpu,
            code,
            celsius,
            throttled,
            errors,
            single_bit,
            double_bit,
            pending,
            failed,
            silent_s,
            region,
        } => {
            let kind = kind.replace('-', "_");
            let need_gpu = || gpu.ok_or_else(|| anyhow::anyhow!("--kind {kind} needs --gpu"));
            let body = match kind.as_str() {
                "xid" => json!({"kind": "xid", "gpu": need_gpu()?,
                                "code": code.ok_or_else(|| anyhow::anyhow!("--kind xid needs --code"))?}),
                "ecc" => json!({"kind": "ecc", "gpu": need_gpu()?, "single_bit": single_bit,
                                "double_bit": double_bit}),
                "remap" => json!({"kind": "remap", "gpu": need_gpu()?, "pending": pending,
                                  "failed": failed}),
                "thermal" => json!({"kind": "thermal", "gpu": need_gpu()?, "celsius": celsius,
                                    "throttled": throttled}),
                "nvlink" => json!({"kind": "nvlink", "gpu": need_gpu()?, "errors": errors}),
                "node_down" | "dead" => json!({"kind": "node_down"}),
                "link_flap" => json!({"kind": "link_flap", "silent_s": silent_s}),
                "reboot" => json!({"kind": "reboot"}),
                "rack_thermal" => json!({"kind": "rack_thermal", "throttled": throttled}),
                other => anyhow::bail!(
                    "unknown --kind {other:?}: xid, ecc, remap, thermal, nvlink, node-down, link-flap, \
                     reboot or rack-thermal"
                ),
            };
            let mut body = body;
            if let Some(o) = body.as_object_mut() {
                o.retain(|_, v| !v.is_null());
            }
            (
                conn,
                Method::POST,
                format!("/v1/admin/nodes/{id}/faults"),
                region_query(region),
                Some(body),
            )
        }
    };
    let doc = conn
        .admin_client()?
        .call_json(method, &with_query(&path, &query), body.as_ref())
        .await?;
    if conn.json || doc.get("observed").is_none() {
        // Not a node view (an inventory entry, a release): as it is.
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
    }
    print_node(&doc);
    Ok(0)
}

/// One node in detail.
fn print_node(n: &serde_json::Value) {
    let line = |k: &str, v: String| {
        if !v.is_empty() {
            println!("{k:<16}{v}");
        }
    };
    line("node", s(n, "node_id"));
    line("region", s(n, "region"));
    line(
        "place",
        format!(
            "{} / {} / {}",
            s(n, "spine"),
            s(n, "leaf"),
            s(n, "nvlink_domain")
        ),
    );
    line("gpus", format!("{} × {}", s(n, "gpus"), s(n, "gpu_type")));
    let mut admin = s(n, "admin_state");
    if let Some(r) = n.get("admin_reason").and_then(|r| r.as_str()) {
        admin.push_str(&format!(" ({r})"));
    }
    if let Some(m) = n.get("drain_mode").and_then(|m| m.as_str()) {
        admin.push_str(&format!(", {m} drain until {}", s(n, "drain_deadline")));
    }
    line("admin", admin);
    line("observed", s(n, "observed"));
    line("schedulable", s(n, "schedulable"));
    line("usable gpus", gpu_ranges(n.get("usable_gpus")));
    line("allocated gpus", gpu_ranges(n.get("allocated_gpus")));
    let jobs: Vec<String> = n["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| j.as_str().map(String::from))
        .collect();
    line(
        "jobs",
        if jobs.is_empty() {
            "-".into()
        } else {
            jobs.join(", ")
        },
    );
    line("why", s(n, "why"));
    let mut power = Vec::new();
    if let Some(w) = n.get("gpu_power_w").and_then(|w| w.as_u64()) {
        power.push(format!("{w} W per GPU"));
    }
    if let Some(b) = n.get("rack_power_budget_w").and_then(|b| b.as_u64()) {
        power.push(format!("rack budget {b} W"));
    }
    if n["rack_throttled"] == serde_json::Value::Bool(true) {
        power.push("rack thermally throttling".into());
    }
    line("power", power.join(", "));
    if n["drained"] == serde_json::Value::Bool(true) {
        line("drained", "yes: no jobs left on it".into());
    }
    line("boot id", s(n, "boot_id"));
    line("last heartbeat", s(n, "last_heartbeat"));
    let events = n["events"].as_array().cloned().unwrap_or_default();
    if !events.is_empty() {
        println!("\nevents:");
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| vec![s(e, "at"), s(e, "kind"), s(e, "message")])
            .collect();
        print!("{}", table(&["AT", "KIND", "MESSAGE"], &rows));
    }
}

fn print_audit(conn: &Conn, doc: &serde_json::Value) -> anyhow::Result<()> {
    if conn.json {
        println!("{}", serde_json::to_string_pretty(doc)?);
        return Ok(());
    }
    let mut rows = Vec::new();
    if let Some(regions) = doc.get("regions").and_then(|r| r.as_object()) {
        for (region, v) in regions {
            if let Some(code) = v.get("code").and_then(|c| c.as_str()) {
                rows.push(vec![
                    String::new(),
                    region.clone(),
                    String::new(),
                    format!("error {code}"),
                    String::new(),
                    s(v, "message"),
                ]);
                continue;
            }
            for e in v["entries"].as_array().into_iter().flatten() {
                rows.push(vec![
                    s(e, "at"),
                    region.clone(),
                    s(e, "actor"),
                    s(e, "action"),
                    s(e, "target"),
                    s(e, "reason"),
                ]);
            }
        }
    }
    rows.sort_by(|a, b| b[0].cmp(&a[0]));
    print!(
        "{}",
        table(&["AT", "REGION", "WHO", "ACTION", "TARGET", "WHY"], &rows)
    );
    Ok(())
}

const STEPS: [&str; 7] = [
    "pending",
    "draining",
    "rebooting",
    "checking",
    "done",
    "skipped",
    "cancelled",
];

/// `[#########-----------] 12/64 done`, or with nodes skipped (out of
/// service when their turn came) `[#########x----------] 12/64 done, 1
/// skipped`: `#` done, `x` skipped, `-` still to do. Written by hand, not
/// with `indicatif`: this is text in a table cell or a printed report
/// (also when the output is a file or a pipe), with a third state
/// (skipped); indicatif draws live bars on a terminal and renders none
/// elsewhere.
fn progress_bar(done: u64, skipped: u64, total: u64, width: usize) -> String {
    let upto = |n: u64| {
        if total == 0 {
            width
        } else {
            ((n.min(total) as usize) * width) / total as usize
        }
    };
    let filled = upto(done);
    // A skip shows even when it is less than one character's worth.
    let finished = upto(done + skipped)
        .max(filled + usize::from(skipped > 0))
        .min(width);
    let tail = if skipped > 0 {
        format!(", {skipped} skipped")
    } else {
        String::new()
    };
    format!(
        "[{}{}{}] {done}/{total} done{tail}",
        "#".repeat(filled),
        "x".repeat(finished - filled),
        "-".repeat(width - finished)
    )
}

fn print_plan(plan: &serde_json::Value, with_nodes: bool) {
    let total = plan["total"].as_u64().unwrap_or(0);
    let count = |k: &str| plan["steps"][k].as_u64().unwrap_or(0);
    println!("plan:     {}", s(plan, "plan_id"));
    println!("region:   {}", s(plan, "region"));
    println!("state:    {}", s(plan, "state"));
    println!("by:       {}", s(plan, "created_by"));
    if !s(plan, "reason").is_empty() {
        println!("reason:   {}", s(plan, "reason"));
    }
    println!(
        "limits:   {} per leaf, {}% of the region",
        s(plan, "per_leaf"),
        s(plan, "region_percent")
    );
    println!(
        "progress: {}",
        progress_bar(count("done"), count("skipped"), total, 40)
    );
    let steps: Vec<String> = STEPS
        .iter()
        .filter(|k| count(k) > 0)
        .map(|k| format!("{k} {}", count(k)))
        .collect();
    println!("steps:    {}", steps.join(", "));
    // Nodes left out, each with why (out of service when its turn came).
    let skipped = plan["skipped"].as_array().cloned().unwrap_or_default();
    for (i, n) in skipped.iter().enumerate() {
        let label = if i == 0 { "skipped:" } else { "" };
        println!("{label:<9} {}  {}", s(n, "node_id"), s(n, "reason"));
    }
    if let Some(held) = plan.get("held").filter(|h| !h.is_null()) {
        println!("waiting:  {held}");
    }
    if with_nodes {
        let rows: Vec<Vec<String>> = plan["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| {
                let why = match s(n, "reason") {
                    r if !r.is_empty() => r,
                    _ if !s(n, "waiting_since").is_empty() => {
                        format!("out of service; waited for since {}", s(n, "waiting_since"))
                    }
                    _ => String::new(),
                };
                vec![
                    s(n, "node_id"),
                    s(n, "step"),
                    s(n, "started_at"),
                    s(n, "finished_at"),
                    why,
                ]
            })
            .collect();
        print!(
            "{}",
            table(&["NODE", "STEP", "STARTED", "FINISHED", "WHY"], &rows)
        );
    }
}

async fn maintenance(cmd: MaintenanceCommand) -> anyhow::Result<u8> {
    use gangway_shared::api::MaintenanceStart;
    match cmd {
        MaintenanceCommand::Start {
            conn,
            region,
            all,
            leaf,
            gpu_type,
            nodes,
            per_leaf,
            max_percent,
            reason,
        } => {
            let body = serde_json::to_value(MaintenanceStart {
                all,
                leaf,
                gpu_type,
                nodes,
                per_leaf: Some(per_leaf),
                region_percent: Some(max_percent),
                reason,
            })?;
            let doc = conn
                .admin_client()?
                .call_json(
                    Method::POST,
                    &with_query("/v1/admin/maintenance", &region_query(Some(region))),
                    Some(&body),
                )
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print_plan(&doc, false);
            }
        }
        MaintenanceCommand::Status {
            conn,
            id,
            region,
            nodes,
        } => {
            let doc = conn
                .admin_client()?
                .call_json(
                    Method::GET,
                    &with_query(
                        &format!("/v1/admin/maintenance/{id}"),
                        &region_query(region),
                    ),
                    None,
                )
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print_plan(&doc, nodes);
            }
        }
        MaintenanceCommand::List { conn, region } => {
            let doc = conn
                .admin_client()?
                .call_json(
                    Method::GET,
                    &with_query("/v1/admin/maintenance", &region_query(region)),
                    None,
                )
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
                return Ok(0);
            }
            let mut rows = Vec::new();
            for (region, v) in doc["regions"].as_object().into_iter().flatten() {
                if let Some(code) = v.get("code").and_then(|c| c.as_str()) {
                    rows.push(vec![
                        String::new(),
                        region.clone(),
                        format!("error {code}"),
                        String::new(),
                        String::new(),
                        s(v, "message"),
                    ]);
                    continue;
                }
                for p in v["plans"].as_array().into_iter().flatten() {
                    let total = p["total"].as_u64().unwrap_or(0);
                    let done = p["steps"]["done"].as_u64().unwrap_or(0);
                    let skipped = p["steps"]["skipped"].as_u64().unwrap_or(0);
                    rows.push(vec![
                        s(p, "plan_id"),
                        region.clone(),
                        s(p, "state"),
                        progress_bar(done, skipped, total, 20),
                        s(p, "created_at"),
                        s(p, "reason"),
                    ]);
                }
            }
            print!(
                "{}",
                table(
                    &["PLAN", "REGION", "STATE", "PROGRESS", "CREATED", "WHY"],
                    &rows
                )
            );
        }
        MaintenanceCommand::Cancel {
            conn,
            id,
            region,
            reason,
        } => {
            let body = serde_json::json!({ "reason": reason });
            let doc = conn
                .admin_client()?
                .call_json(
                    Method::POST,
                    &with_query(
                        &format!("/v1/admin/maintenance/{id}/cancel"),
                        &region_query(region),
                    ),
                    Some(&body),
                )
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print_plan(&doc, false);
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod limits_tests {
    use super::limits_rows;
    use serde_json::json;

    #[test]
    fn the_limits_table_has_a_row_per_tenant_and_region_and_says_none_for_no_limit() {
        let doc = json!({"regions": {
            "eu": {"code": "region_unavailable", "message": "timed out"},
            "us": {"limits": [
                {"tenant": "acme", "max_queued_jobs": 2, "max_gpus": null,
                 "updated_at": "2026-01-01T00:00:00Z"},
                {"tenant": "globex", "max_queued_jobs": null, "max_gpus": 64,
                 "updated_at": "2026-01-02T00:00:00Z"}]},
        }});
        let (rows, failed) = limits_rows(&doc, false);
        assert!(failed, "a region's error is a failure");
        assert_eq!(rows[0][..2], ["eu", "error region_unavailable: timed out"]);
        assert_eq!(rows[1], ["us", "acme", "2", "none", "2026-01-01T00:00:00Z"]);
        assert_eq!(rows[2][1..4], ["globex", "none", "64"]);
    }

    #[test]
    fn a_delete_where_there_were_no_limits_is_not_a_failure() {
        let doc = json!({"regions": {
            "eu": {"code": "not_found", "message": "limits for this tenant not found"},
            "us": {"deleted": true},
        }});
        let (rows, failed) = limits_rows(&doc, true);
        assert!(!failed);
        assert_eq!(rows[0][1], "no limits there");
        assert_eq!(rows[1][1], "deleted");
        // A set that one region refused is.
        let doc = json!({"regions": {
            "us": {"code": "invalid_limits", "message": "max_gpus must be …"},
        }});
        assert!(limits_rows(&doc, false).1);
    }
}

#[cfg(test)]
mod maintenance_tests {
    use super::progress_bar;

    #[test]
    fn the_progress_bar_fills_with_the_nodes_done() {
        assert_eq!(progress_bar(0, 0, 4, 8), "[--------] 0/4 done");
        assert_eq!(progress_bar(2, 0, 4, 8), "[####----] 2/4 done");
        assert_eq!(progress_bar(4, 0, 4, 8), "[########] 4/4 done");
    }

    #[test]
    fn skipped_nodes_fill_the_bar_apart_and_are_counted() {
        assert_eq!(progress_bar(1, 1, 4, 8), "[##xx----] 1/4 done, 1 skipped");
        // A plan finished with a node skipped: a full bar, the skip said.
        assert_eq!(progress_bar(3, 1, 4, 8), "[######xx] 3/4 done, 1 skipped");
        assert_eq!(progress_bar(0, 4, 4, 8), "[xxxxxxxx] 0/4 done, 4 skipped");
        assert_eq!(
            progress_bar(18, 1, 64, 40),
            format!(
                "[{}x{}] 18/64 done, 1 skipped",
                "#".repeat(11),
                "-".repeat(28)
            )
        );
    }
}
