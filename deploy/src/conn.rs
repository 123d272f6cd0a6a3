//! How the CLI reaches the API: URL, token and CA certificate from flags
//! and the environment first; then from the profile `--profile` names
//! (`gangway login`); else from a local cloud's state dir (`.gangway/env`);
//! else from the `default` profile.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use gangway_shared::client::Client;

#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// The global tier's URL.
    #[arg(long, env = "GANGWAY_URL", global = true)]
    pub url: Option<String>,
    /// Bearer token (a tenant's for `job`, an operator's for `admin`).
    #[arg(long, env = "GANGWAY_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Operator token for `gangway admin`.
    #[arg(
        long,
        env = "GANGWAY_ADMIN_TOKEN",
        global = true,
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// CA certificate (PEM) to trust for the API's TLS certificate: it
    /// alone, as `curl --cacert` (without it, the system's roots).
    #[arg(long, env = "GANGWAY_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Where `gangway dev up` keeps its state; its `env` file fills in
    /// whatever the flags and environment leave out.
    #[arg(
        long,
        env = "GANGWAY_STATE_DIR",
        default_value = ".gangway",
        global = true
    )]
    pub state_dir: PathBuf,
    /// The stored credentials to use (`gangway login --profile NAME`).
    #[arg(long, env = "GANGWAY_PROFILE", global = true)]
    pub profile: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

/// A profile's CA certificate, inline (never an environment variable).
const CA_PEM: &str = " ca_pem";

/// A local cloud's `env` file (`gangway dev up` writes it: `export
/// NAME=value` lines, for a shell to source), as `NAME → value`; empty when
/// there is none. Read as a dotenv file, without touching this process's
/// environment.
pub(crate) fn state_env(dir: &std::path::Path) -> BTreeMap<String, String> {
    match dotenvy::from_path_iter(dir.join("env")) {
        Ok(items) => items.filter_map(Result::ok).collect(),
        Err(_) => BTreeMap::new(),
    }
}

impl Conn {
    /// Where what the flags and the environment leave out comes from: the
    /// named profile; else the local cloud's env file when there is one;
    /// else the default profile.
    fn fallback(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let from_profile = |p: crate::login::Profile| {
            let mut m = BTreeMap::from([("GANGWAY_URL".to_string(), p.url)]);
            m.extend(p.token.map(|t| ("GANGWAY_TOKEN".to_string(), t)));
            m.extend(
                p.admin_token
                    .map(|t| ("GANGWAY_ADMIN_TOKEN".to_string(), t)),
            );
            m.extend(p.ca_pem.map(|c| (CA_PEM.to_string(), c)));
            m
        };
        if let Some(name) = &self.profile {
            let p = crate::login::profile(name)?.with_context(|| {
                format!(
                    "no profile {name:?}: log in first (gangway login --profile {name} --url URL)"
                )
            })?;
            return Ok(from_profile(p));
        }
        let file = state_env(&self.state_dir);
        if !file.is_empty() {
            return Ok(file);
        }
        Ok((crate::login::profile(crate::login::DEFAULT_PROFILE)?)
            .map(from_profile)
            .unwrap_or_default())
    }

    fn resolve(&self, admin: bool) -> anyhow::Result<Client> {
        let file = self.fallback()?;
        let pick =
            |flag: &Option<String>, var: &str| flag.clone().or_else(|| file.get(var).cloned());
        let url = pick(&self.url, "GANGWAY_URL").context(
            "no API URL: pass --url, set GANGWAY_URL, log in (gangway login --url URL), \
             or run `gangway dev up` here",
        )?;
        let (token, var) = if admin {
            (
                pick(&self.admin_token, "GANGWAY_ADMIN_TOKEN"),
                "GANGWAY_ADMIN_TOKEN",
            )
        } else {
            (pick(&self.token, "GANGWAY_TOKEN"), "GANGWAY_TOKEN")
        };
        let token = token.with_context(|| {
            format!(
                "no token: set {var}, pass --{}, or log in (gangway login{})",
                if admin { "admin-token" } else { "token" },
                if admin { " --admin" } else { "" }
            )
        })?;
        let ca =
            match self
                .ca_cert
                .clone()
                .or_else(|| file.get("GANGWAY_CA_CERT").map(PathBuf::from))
            {
                Some(path) => Some(std::fs::read(&path).with_context(|| {
                    format!("cannot read the CA certificate {}", path.display())
                })?),
                None => file.get(CA_PEM).map(|pem| pem.clone().into_bytes()),
            };
        Client::one_shot(url, token, ca.as_deref()).map_err(|e| anyhow::anyhow!(e))
    }

    /// A client acting with the tenant token.
    pub fn client(&self) -> anyhow::Result<Client> {
        self.resolve(false)
    }

    /// A client acting with the operator token.
    pub fn admin_client(&self) -> anyhow::Result<Client> {
        self.resolve(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file `gangway dev up` writes reads back as it was written;
    /// none is no settings.
    #[test]
    fn a_dev_env_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        assert!(state_env(dir.path()).is_empty());
        std::fs::write(
            dir.path().join("env"),
            "# Written by `gangway dev up`; source it in a shell.\n\
             export GANGWAY_URL=https://127.0.0.1:20915\n\
             export GANGWAY_GLOBAL_REPLICAS=https://127.0.0.1:1,https://127.0.0.1:2\n\
             export GANGWAY_TOKEN=eyJ0eXAi.eyJzdWIi.c2ln-_\n",
        )
        .unwrap();
        let env = state_env(dir.path());
        assert_eq!(env["GANGWAY_URL"], "https://127.0.0.1:20915");
        assert_eq!(
            env["GANGWAY_GLOBAL_REPLICAS"],
            "https://127.0.0.1:1,https://127.0.0.1:2"
        );
        assert_eq!(env["GANGWAY_TOKEN"], "eyJ0eXAi.eyJzdWIi.c2ln-_");
        assert_eq!(env.len(), 3);
    }
}
