//! `gangway key …`: API keys. A tenant makes, lists and revokes its own
//! with its token (or a `submit` key); an operator makes a tenant's
//! (`--tenant`) or an operator's (`--role admin`) with an admin token.

use clap::{Subcommand, ValueEnum};
use gangway_shared::api::{ApiKey, ApiKeyCreate, ApiKeyCreated, ApiKeyList, KeyScope};
use reqwest::Method;

use crate::conn::Conn;
use crate::jobs_cli::table;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// A tenant's key (the calling tenant's, or `--tenant`'s).
    Tenant,
    /// An operator's key, for the admin endpoints (needs an admin token).
    Admin,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scope {
    /// Reads only.
    Read,
    /// Everything a tenant's token does.
    Submit,
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum KeyCommand {
    /// Make a key; its secret is printed once (store it now).
    Create {
        #[command(flatten)]
        conn: Conn,
        /// A name to tell it by (1-64 letters, digits, '-', '_', '.').
        #[arg(long)]
        name: String,
        #[arg(long, value_enum, default_value = "tenant")]
        role: Role,
        /// A tenant key's scope.
        #[arg(long, value_enum, default_value = "submit")]
        scope: Scope,
        /// When it expires: 90d, 12h, 30m or seconds (default: never).
        #[arg(long)]
        expires: Option<String>,
        /// Operators: the tenant the key is for (with an admin token).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// List keys: the tenant's own, or with --admin every key (or
    /// --tenant's), with when each was last used.
    List {
        #[command(flatten)]
        conn: Conn,
        /// As an operator (admin token).
        #[arg(long)]
        admin: bool,
        /// As an operator: only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a key at once (refused everywhere within 5 s).
    Revoke {
        #[command(flatten)]
        conn: Conn,
        /// The key's id (KEY ID in `gangway key list`).
        id: String,
        /// As an operator (any key).
        #[arg(long)]
        admin: bool,
    },
}

/// `90d`, `12h`, `30m`, `45s` or plain seconds.
fn seconds(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (n, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let n: u64 = n
        .parse()
        .map_err(|_| anyhow::anyhow!("--expires {s:?}: give 90d, 12h, 30m or seconds"))?;
    let mult = match unit {
        'd' => 86_400,
        'h' => 3_600,
        'm' => 60,
        's' => 1,
        _ => anyhow::bail!("--expires {s:?}: the unit is d, h, m or s"),
    };
    Ok(n.saturating_mul(mult))
}

fn state_of(k: &ApiKey) -> &'static str {
    if k.revoked_at.is_some() {
        "revoked"
    } else if k.expires_at.is_some_and(|t| t <= chrono::Utc::now()) {
        "expired"
    } else {
        "active"
    }
}

fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map_or("-".into(), |t| t.format("%Y-%m-%d %H:%M").to_string())
}

fn rows(keys: &[ApiKey]) -> Vec<Vec<String>> {
    keys.iter()
        .map(|k| {
            vec![
                k.key_id.clone(),
                k.name.clone(),
                k.tenant.clone().unwrap_or_else(|| "(operator)".into()),
                k.scope.as_str().to_string(),
                state_of(k).to_string(),
                when(Some(k.created_at)),
                when(k.expires_at),
                when(k.last_used_at),
            ]
        })
        .collect()
}

const HEADERS: &[&str] = &[
    "KEY ID",
    "NAME",
    "TENANT",
    "SCOPE",
    "STATE",
    "CREATED",
    "EXPIRES",
    "LAST USED",
];

pub async fn run(cmd: KeyCommand) -> anyhow::Result<u8> {
    match cmd {
        KeyCommand::Create {
            conn,
            name,
            role,
            scope,
            expires,
            tenant,
        } => {
            let expires_in_s = expires.as_deref().map(seconds).transpose()?;
            let (admin, scope) = match (role, scope) {
                (Role::Admin, _) => (true, KeyScope::Admin),
                (Role::Tenant, s) => (
                    tenant.is_some(),
                    match s {
                        Scope::Read => KeyScope::Read,
                        Scope::Submit => KeyScope::Submit,
                    },
                ),
            };
            if role == Role::Admin && tenant.is_some() {
                anyhow::bail!("an operator's key (--role admin) names no --tenant");
            }
            let body = serde_json::to_value(ApiKeyCreate {
                name,
                scope: Some(scope),
                expires_in_s,
                tenant,
            })?;
            let (client, path) = if admin {
                (conn.admin_client()?, "/v1/admin/keys")
            } else {
                (conn.client()?, "/v1/keys")
            };
            let doc = client.call_json(Method::POST, path, Some(&body)).await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
                return Ok(0);
            }
            let made: ApiKeyCreated = serde_json::from_value(doc)?;
            print!("{}", table(HEADERS, &rows(std::slice::from_ref(&made.key))));
            println!(
                "\nSecret (shown this once; store it now, it cannot be read again):\n{}\n\nUse it as \
                 a bearer token, e.g. `gangway login --url URL` (it reads the key on standard input) or GANGWAY_TOKEN.",
                made.secret
            );
            Ok(0)
        }
        KeyCommand::List {
            conn,
            admin,
            tenant,
        } => {
            let doc = if admin || tenant.is_some() {
                let q: Vec<(&str, String)> = tenant.into_iter().map(|t| ("tenant", t)).collect();
                let path = if q.is_empty() {
                    "/v1/admin/keys".to_string()
                } else {
                    format!("/v1/admin/keys?{}", gangway_shared::http::query_string(&q))
                };
                conn.admin_client()?
                    .call_json(Method::GET, &path, None)
                    .await?
            } else {
                conn.client()?
                    .call_json(Method::GET, "/v1/keys", None)
                    .await?
            };
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
                return Ok(0);
            }
            let list: ApiKeyList = serde_json::from_value(doc)?;
            print!("{}", table(HEADERS, &rows(&list.keys)));
            Ok(0)
        }
        KeyCommand::Revoke { conn, id, admin } => {
            let doc = if admin {
                conn.admin_client()?
                    .call_json(Method::DELETE, &format!("/v1/admin/keys/{id}"), None)
                    .await?
            } else {
                conn.client()?
                    .call_json(Method::DELETE, &format!("/v1/keys/{id}"), None)
                    .await?
            };
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!("{id}: revoked; every global replica refuses it within 5 s");
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn expiries_read_as_people_write_them() {
        assert_eq!(super::seconds("90d").unwrap(), 90 * 86_400);
        assert_eq!(super::seconds("12h").unwrap(), 43_200);
        assert_eq!(super::seconds("30m").unwrap(), 1_800);
        assert_eq!(super::seconds("45").unwrap(), 45);
        assert!(super::seconds("soon").is_err());
        assert!(super::seconds("3w").is_err());
    }
}
