//! `gangway reservation …`: a tenant's capacity reservations. Tables for
//! people, `--json` for machines; a refusal prints the earliest window that
//! would work and the command that asks for it.

use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use gangway_shared::api::{Reservation, ReservationResize, ReservationSpec, TopologyLevel};
use gangway_shared::client::ClientError;
use gangway_shared::error::{codes, ErrorBody};
use uuid::Uuid;

use crate::conn::Conn;
use crate::jobs_cli::{print_rows, warn_unavailable};

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum ReservationCommand {
    /// Reserve GPUs: `gangway reservation create --gpus 16 --gpu-type h100
    /// --level spine --start 2030-01-01T00:00:00Z --duration-s 86400`.
    Create {
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        args: CreateArgs,
    },
    /// Show one reservation.
    Get {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
    },
    /// List your reservations, newest first.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Change a reservation's size and/or end (it stays in its domain).
    Resize {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
        #[command(flatten)]
        args: ResizeArgs,
        /// Operators: resize any tenant's (operator token; audited).
        #[arg(long)]
        operator: bool,
    },
    /// Delete a reservation: its GPUs are no longer held; its running jobs
    /// go on as ordinary work, its queued jobs wait until you cancel them.
    Delete {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
        /// Idempotency key, to make a retried delete safe.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Operators: delete any tenant's (operator token; audited).
        #[arg(long)]
        operator: bool,
    },
}

#[derive(Args, Debug, Clone)]
pub struct CreateArgs {
    /// GPUs to reserve, all inside one domain of --level.
    #[arg(long)]
    gpus: i64,
    #[arg(long)]
    gpu_type: String,
    /// nvlink (or node), leaf, spine, or region (anywhere; the default).
    #[arg(long, default_value = "region")]
    level: TopologyLevel,
    /// When it starts (RFC 3339); default now.
    #[arg(long)]
    start: Option<DateTime<Utc>>,
    /// When it ends (RFC 3339); default open-ended.
    #[arg(long, conflicts_with = "duration_s")]
    end: Option<DateTime<Utc>>,
    /// How long it lasts, in seconds from --start (or now).
    #[arg(long)]
    duration_s: Option<i64>,
    /// The region to reserve in (needed when you may use several).
    #[arg(long)]
    region: Option<String>,
    /// Operators: reserve on this tenant's behalf (with the operator
    /// token; the region audits it). The reservation is the tenant's.
    #[arg(long)]
    for_tenant: Option<String>,
    /// Idempotency key. The CLI always sends one (a fresh one by default);
    /// pass your own to make a retried create safe across invocations.
    #[arg(long)]
    idempotency_key: Option<String>,
}

impl CreateArgs {
    fn spec(&self, now: DateTime<Utc>) -> anyhow::Result<ReservationSpec> {
        if self.gpus < 1 {
            bail!("say how many GPUs to reserve: --gpus N (at least 1)");
        }
        let (start, end) = match self.duration_s {
            Some(d) if d < 1 => bail!("--duration-s must be at least 1"),
            Some(d) => {
                let start = self.start.unwrap_or(now);
                (Some(start), Some(start + chrono::Duration::seconds(d)))
            }
            None => (self.start, self.end),
        };
        Ok(ReservationSpec {
            gpu_type: self.gpu_type.clone(),
            gpus: self.gpus,
            level: self.level,
            start,
            end,
            region: self.region.clone(),
        })
    }
}

#[derive(Args, Debug, Clone)]
pub struct ResizeArgs {
    /// The new number of GPUs.
    #[arg(long)]
    gpus: Option<i64>,
    /// The new end (RFC 3339).
    #[arg(long, conflicts_with = "open_ended")]
    end: Option<DateTime<Utc>>,
    /// Make it open-ended.
    #[arg(long)]
    open_ended: bool,
    /// Idempotency key, to make a retried resize safe.
    #[arg(long)]
    idempotency_key: Option<String>,
}

impl ResizeArgs {
    fn resize(&self) -> anyhow::Result<ReservationResize> {
        let end = match (self.end, self.open_ended) {
            (Some(e), _) => Some(Some(e)),
            (None, true) => Some(None),
            (None, false) => None,
        };
        if self.gpus.is_none() && end.is_none() {
            bail!("say what to change: --gpus N, --end TIME or --open-ended");
        }
        Ok(ReservationResize {
            gpus: self.gpus,
            end,
        })
    }
}

pub(crate) fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A domain, from the region down (`s00/l01`); the empty one is the region.
pub(crate) fn domain_cell(domain: &[String]) -> String {
    if domain.is_empty() {
        "(region)".to_string()
    } else {
        domain.join("/")
    }
}

/// What to do about a refused reservation: the earliest window that would
/// work, and the command that asks for it (`create`: the same request
/// moved there).
fn refusal_hint(body: &ErrorBody, create: Option<&CreateArgs>) -> String {
    let Some(start) = body.earliest_start else {
        return "no later window of the same length would work either: ask for fewer GPUs or a \
                wider --level"
            .to_string();
    };
    let window = match body.earliest_end {
        Some(end) => format!("from {} to {}", when(start), when(end)),
        None => format!("from {} on (open-ended)", when(start)),
    };
    let mut out = format!("the earliest window that would work: {window}");
    if let Some(a) = create {
        let mut cmd = format!(
            "gangway reservation create --gpus {} --gpu-type {} --level {} --start {}",
            a.gpus,
            a.gpu_type,
            a.level,
            when(start)
        );
        if let Some(end) = body.earliest_end {
            cmd.push_str(&format!(" --end {}", when(end)));
        }
        if let Some(r) = &a.region {
            cmd.push_str(&format!(" --region {r}"));
        }
        out.push_str(&format!("\nto reserve it: {cmd}"));
    }
    out
}

/// A refusal made readable; any other error as it is.
fn explained(e: ClientError, create: Option<&CreateArgs>) -> anyhow::Error {
    match &e {
        ClientError::Api { body, .. } if body.code == codes::RESERVATION_UNAVAILABLE => {
            anyhow::anyhow!("{}\n{}", body.message, refusal_hint(body, create))
        }
        _ => e.into(),
    }
}

pub async fn run(cmd: ReservationCommand) -> anyhow::Result<u8> {
    match cmd {
        ReservationCommand::Create { conn, args } => {
            let spec = args.spec(Utc::now())?;
            let key = (args.idempotency_key.clone()).unwrap_or_else(|| Uuid::new_v4().to_string());
            let made = match &args.for_tenant {
                Some(t) => {
                    (conn.admin_client()?)
                        .create_reservation_for(t, &spec, Some(&key))
                        .await
                }
                None => conn.client()?.create_reservation(&spec, Some(&key)).await,
            };
            let r = made.map_err(|e| explained(e, Some(&args)))?;
            print(&conn, &[r], true)?;
        }
        ReservationCommand::Get { conn, id } => {
            let r = conn.client()?.get_reservation(id).await?;
            print(&conn, &[r], true)?;
        }
        ReservationCommand::List { conn } => {
            let list = conn.client()?.list_reservations().await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(0);
            }
            print(&conn, &list.reservations, false)?;
            warn_unavailable("reservations", &list.unavailable_regions);
        }
        ReservationCommand::Resize {
            conn,
            id,
            args,
            operator,
        } => {
            let resize = args.resize()?;
            let key = args.idempotency_key.as_deref();
            let done = if operator {
                (conn.admin_client()?)
                    .resize_any_reservation(id, &resize, key)
                    .await
            } else {
                conn.client()?.resize_reservation(id, &resize, key).await
            };
            let r = done.map_err(|e| explained(e, None))?;
            print(&conn, &[r], true)?;
        }
        ReservationCommand::Delete {
            conn,
            id,
            idempotency_key,
            operator,
        } => {
            let key = idempotency_key.as_deref();
            let r = if operator {
                conn.admin_client()?.delete_any_reservation(id, key).await?
            } else {
                conn.client()?.delete_reservation(id, key).await?
            };
            print(&conn, &[r], true)?;
        }
    }
    Ok(0)
}

fn print(conn: &Conn, list: &[Reservation], single: bool) -> anyhow::Result<()> {
    let headers = [
        "ID", "REGION", "GPUS", "IN USE", "LEVEL", "DOMAIN", "START", "END", "STATE",
    ];
    print_rows(conn, list, single, &headers, row)
}

fn row(r: &Reservation) -> Vec<String> {
    vec![
        r.id.to_string(),
        r.region.clone(),
        format!("{}×{}", r.gpus, r.gpu_type),
        r.in_use_gpus.to_string(),
        r.level.to_string(),
        domain_cell(&r.domain),
        when(r.start),
        r.end.map_or_else(|| "open-ended".to_string(), when),
        r.state.to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Create {
        #[command(flatten)]
        args: CreateArgs,
    }

    #[derive(Parser, Debug)]
    struct Resize {
        #[command(flatten)]
        args: ResizeArgs,
    }

    fn create(argv: &[&str]) -> CreateArgs {
        let mut all = vec!["create"];
        all.extend_from_slice(argv);
        Create::try_parse_from(all).unwrap().args
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_duration_ends_the_window_that_long_after_its_start() {
        let now = at("2030-01-01T00:00:00Z");
        let a = create(&["--gpus", "16", "--gpu-type", "h100", "--level", "node"]);
        let s = a.spec(now).unwrap();
        assert_eq!(
            (s.level, s.start, s.end),
            (TopologyLevel::Nvlink, None, None)
        );
        let a = create(&[
            "--gpus",
            "8",
            "--gpu-type",
            "h100",
            "--start",
            "2030-02-01T00:00:00Z",
            "--duration-s",
            "3600",
        ]);
        let s = a.spec(now).unwrap();
        assert_eq!(s.end, Some(at("2030-02-01T01:00:00Z")));
        let a = create(&["--gpus", "8", "--gpu-type", "h100", "--duration-s", "60"]);
        assert_eq!(a.spec(now).unwrap().start, Some(now));
        let zero = create(&["--gpus", "0", "--gpu-type", "h100"]);
        assert!(zero.spec(now).is_err());
    }

    #[test]
    fn a_resize_says_what_it_changes() {
        let parse = |argv: &[&str]| {
            let mut all = vec!["resize"];
            all.extend_from_slice(argv);
            Resize::try_parse_from(all).unwrap().args.resize()
        };
        assert_eq!(parse(&["--open-ended"]).unwrap().end, Some(None));
        assert_eq!(parse(&["--gpus", "4"]).unwrap().end, None);
        assert!(parse(&[]).is_err());
    }

    #[test]
    fn a_refusal_prints_the_earliest_window_and_the_command_for_it() {
        let body = ErrorBody {
            code: codes::RESERVATION_UNAVAILABLE.into(),
            message: "the reservation cannot be honoured".into(),
            request_id: None,
            earliest_start: Some(at("2030-01-01T06:00:00Z")),
            earliest_end: Some(at("2030-01-02T06:00:00Z")),
        };
        let a = create(&[
            "--gpus",
            "16",
            "--gpu-type",
            "h100",
            "--level",
            "spine",
            "--region",
            "us-east",
        ]);
        let text = refusal_hint(&body, Some(&a));
        assert!(
            text.contains("from 2030-01-01T06:00:00Z to 2030-01-02T06:00:00Z"),
            "{text}"
        );
        assert!(
            text.contains(
                "gangway reservation create --gpus 16 --gpu-type h100 --level spine \
                 --start 2030-01-01T06:00:00Z --end 2030-01-02T06:00:00Z --region us-east"
            ),
            "{text}"
        );
        let never = ErrorBody {
            earliest_start: None,
            earliest_end: None,
            ..body
        };
        assert!(refusal_hint(&never, None).contains("fewer GPUs"));
    }
}
