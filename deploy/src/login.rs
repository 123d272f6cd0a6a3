//! `gangway login` and `gangway logout`: the CLI's credentials kept in the
//! user's config directory, by named profile, so nobody exports tokens by
//! hand.
//!
//! `$GANGWAY_CONFIG_DIR`, else `$XDG_CONFIG_HOME/gangway`, else
//! `~/.config/gangway`, holds `credentials.toml` (mode 0600, its directory
//! 0700, written whole by a rename): per profile the API's URL, the tenant
//! token and/or the operator token, and the CA the API's certificate
//! chains to, inline (so the profile works from any directory). Which
//! credentials a command uses ([`crate::conn::Conn`]): flags and the
//! environment first, then the profile `--profile` (`GANGWAY_PROFILE`)
//! names, then a local cloud's `.gangway/env`, then the `default` profile.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Read as _};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use gangway_shared::client::Client;
use serde::{Deserialize, Serialize};

/// One profile's credentials.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// The CA certificate (PEM) to trust for the API, if not the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Credentials {
    #[serde(default)]
    profiles: BTreeMap<String, Profile>,
}

/// The profile used when none is named.
pub const DEFAULT_PROFILE: &str = "default";

/// Where the credentials file lives.
pub fn credentials_path() -> anyhow::Result<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = var("GANGWAY_CONFIG_DIR")
        .or_else(|| var("XDG_CONFIG_HOME").map(|d| d.join("gangway")))
        .or_else(|| var("HOME").map(|h| h.join(".config/gangway")))
        .context("no config directory: set GANGWAY_CONFIG_DIR or HOME")?;
    Ok(dir.join("credentials.toml"))
}

fn load() -> anyhow::Result<Credentials> {
    let path = credentials_path()?;
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text).with_context(|| {
            format!(
                "{} is not a credentials file ({}); fix it or remove it and log in again",
                path.display(),
                "see `gangway login --help`"
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Credentials::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn save(credentials: &Credentials) -> anyhow::Result<PathBuf> {
    let path = credentials_path()?;
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private", dir.display()))?;
    }
    let text = toml::to_string(credentials).context("the credentials serialize")?;
    gangway_auth::fsutil::write_atomic(&path, text.as_bytes(), gangway_auth::fsutil::Mode::Private)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The profile `name`, if it exists.
pub fn profile(name: &str) -> anyhow::Result<Option<Profile>> {
    Ok(load()?.profiles.remove(name))
}

#[derive(Args, Debug)]
pub struct LoginArgs {
    /// The profile to store the credentials as.
    #[arg(long, env = "GANGWAY_PROFILE", default_value = DEFAULT_PROFILE)]
    pub profile: String,
    /// The global tier's URL.
    #[arg(long, env = "GANGWAY_URL")]
    pub url: String,
    /// The token (a tenant's, or with --admin an operator's). Without it,
    /// read from standard input (a prompt when it is a terminal), which
    /// keeps it out of the shell's history.
    #[arg(long, env = "GANGWAY_LOGIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Store the token as the profile's operator token (for `gangway
    /// admin`), beside any tenant token it holds.
    #[arg(long)]
    pub admin: bool,
    /// A CA certificate (PEM) to trust for the API, stored in the profile.
    #[arg(long, env = "GANGWAY_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct LogoutArgs {
    /// The profile to forget.
    #[arg(long, env = "GANGWAY_PROFILE", default_value = DEFAULT_PROFILE)]
    pub profile: String,
}

/// `gangway login`: checks the token against the API, then stores it.
pub async fn login(args: LoginArgs) -> anyhow::Result<()> {
    let token = match args.token.clone() {
        Some(t) => t,
        None => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                eprint!(
                    "Paste the token for {} (profile {}): ",
                    args.url, args.profile
                );
            }
            let mut t = String::new();
            stdin
                .lock()
                .read_to_string(&mut t)
                .context("reading the token")?;
            t
        }
    };
    let token = token.trim().to_string();
    anyhow::ensure!(
        !token.is_empty() && !token.contains(char::is_whitespace),
        "no token given: pass --token, or give it on standard input"
    );
    let ca_pem = (args.ca_cert.as_ref())
        .map(|p| {
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the CA certificate {}", p.display()))
        })
        .transpose()?;
    // Refused now rather than at the first command: nothing is stored.
    let client = Client::one_shot(
        args.url.clone(),
        token.clone(),
        ca_pem.as_deref().map(str::as_bytes),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let checked = if args.admin {
        (client
            .call_json(reqwest::Method::GET, "/v1/admin/quotas", None)
            .await)
            .map(|_| ())
    } else {
        client.regions().await.map(|_| ())
    };
    checked.map_err(|e| {
        anyhow::anyhow!(
            "{} refused this {} token: {e}; nothing was stored",
            args.url,
            if args.admin { "operator" } else { "tenant" }
        )
    })?;
    let mut credentials = load()?;
    let entry = credentials
        .profiles
        .entry(args.profile.clone())
        .or_default();
    if entry.url != args.url {
        // Another API: the other kind of token is not for it.
        *entry = Profile {
            url: args.url.clone(),
            ..Profile::default()
        };
    }
    if args.admin {
        entry.admin_token = Some(token);
    } else {
        entry.token = Some(token);
    }
    if ca_pem.is_some() {
        entry.ca_pem = ca_pem;
    }
    let path = save(&credentials)?;
    println!(
        "Logged in to {} as profile {:?} ({} token); stored in {} (mode 0600).",
        args.url,
        args.profile,
        if args.admin { "operator" } else { "tenant" },
        path.display()
    );
    Ok(())
}

/// `gangway logout`: forgets a profile.
pub fn logout(args: LogoutArgs) -> anyhow::Result<()> {
    let mut credentials = load()?;
    if credentials.profiles.remove(&args.profile).is_none() {
        anyhow::bail!("no profile {:?} to log out of", args.profile);
    }
    let path = save(&credentials)?;
    println!(
        "Logged out of profile {:?} ({}).",
        args.profile,
        path.display()
    );
    Ok(())
}
