//! How the region reaches PostgreSQL: its connection URL, and TLS when the
//! URL asks for it.
//!
//! `sslmode=verify-full` (or `require`) with `sslrootcert=FILE` connects
//! over TLS (rustls, through `tokio-postgres-rustls`), checking the
//! server's certificate against the CA in FILE alone and its name against
//! the host connected to. Unlike libpq, `require` is held to the same
//! check: an encrypted connection to a server nobody vouched for is not
//! one a region trusts, so a TLS mode without `sslrootcert` is refused at
//! start, as is `verify-ca` (which checks no name). A server that does not
//! speak TLS is a connection error, never a fallback to plain text. With
//! no `sslmode`, or `disable` / `prefer`, the connection is plain (a
//! database on the same host or a trusted network).
//!
//! The URL may be either form libpq takes: `postgres://…?sslmode=…&…` or
//! `host=… sslmode=… …`.
//!
//! A region whose database is a Patroni cluster (docs/operations.md) names
//! every member with `target_session_attrs=read-write`
//! (`postgres://u@db1:5432,db2:5432,db3:5432/gangway?target_session_attrs=read-write`):
//! each new connection tries the members in turn and keeps the one that
//! takes writes, so after a failover the pools' next connections reach the
//! new primary. Each member gets [`CONNECT_TIMEOUT`] to answer unless the
//! URL sets `connect_timeout`, so a member whose host is gone costs seconds,
//! not the kernel's minutes of SYN retries.
//!
//! The members are not tried one after another, as libpq does, but
//! staggered ([`PgTarget::connect_first`]): first the member that last took
//! writes in this process, then, every [`HEAD_START`] that none has
//! answered, the next, and the first that takes writes wins. A member whose
//! host lost power (a connect that hangs for its whole timeout) ahead of
//! the new primary in the URL would otherwise cost every new connection
//! that timeout — longer than a lease pool waits for one, so that a region
//! whose database had failed over within seconds could record no lease and
//! fenced itself (found on the lab of machines: `gangway chaos
//! database-failover --lab`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio_postgres::tls::{MakeTlsConnect, NoTls, TlsConnect};
use tokio_postgres::{Client, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;

/// A parsed connection URL and the TLS it asks for.
#[derive(Clone)]
pub struct PgTarget {
    pub config: tokio_postgres::Config,
    /// `None`: plain.
    pub tls: Option<MakeRustlsConnect>,
    /// The URL's members, each a configuration of its own (one when the
    /// URL names one host).
    members: Arc<[tokio_postgres::Config]>,
    /// The member that last took a connection, shared by every target of
    /// the same hosts in this process (the leader parses its URL anew on
    /// each reconnect).
    last: Arc<AtomicUsize>,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTarget")
            .field("hosts", &self.config.get_hosts())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// The TLS settings libpq reads that tokio-postgres does not.
const OURS: [&str; 2] = ["sslmode", "sslrootcert"];

impl PgTarget {
    /// Parses `url`; an error says which setting is wrong and what to do.
    pub fn parse(url: &str) -> anyhow::Result<PgTarget> {
        let (rest, ours) = split_settings(url);
        let get = |k: &str| ours.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let mode = get("sslmode").unwrap_or("disable");
        let tls = match mode {
            "disable" | "prefer" | "allow" => None,
            "require" | "verify-full" => {
                let Some(ca) = get("sslrootcert") else {
                    anyhow::bail!(
                        "the database URL asks for sslmode={mode} but names no sslrootcert=FILE: give the CA that signs the database server's certificate (a TLS connection to a server nobody vouched for is refused)"
                    );
                };
                let pem = std::fs::read_to_string(ca)
                    .map_err(|e| anyhow::anyhow!("cannot read the database's sslrootcert {ca}: {e}"))?;
                let _ = rustls::crypto::ring::default_provider().install_default();
                let config = gangway_auth::tls::client_config(&pem)
                    .map_err(|e| anyhow::anyhow!("the database's sslrootcert {ca}: {e}"))?;
                Some(MakeRustlsConnect::new(Arc::unwrap_or_clone(config)))
            }
            "verify-ca" => anyhow::bail!(
                "sslmode=verify-ca checks no server name: use sslmode=verify-full with sslrootcert=FILE"
            ),
            other => anyhow::bail!(
                "the database URL's sslmode={other} is not one of disable, prefer, require, verify-full"
            ),
        };
        let mut config: tokio_postgres::Config = rest
            .parse()
            .map_err(|e| anyhow::anyhow!("the database URL is not valid: {e}"))?;
        config.ssl_mode(match tls {
            Some(_) => tokio_postgres::config::SslMode::Require,
            None => tokio_postgres::config::SslMode::Disable,
        });
        dead_peer_timers(&mut config);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let members = members_of(&config).into();
        // Keyed by the URL's hosts and ports.
        static LAST: OnceLock<Mutex<HashMap<String, Arc<AtomicUsize>>>> = OnceLock::new();
        let key = format!("{:?}|{:?}", config.get_hosts(), config.get_ports());
        let last = (LAST.get_or_init(Default::default).lock().unwrap())
            .entry(key)
            .or_default()
            .clone();
        Ok(PgTarget {
            config,
            tls,
            members,
            last,
        })
    }

    /// A connection to the first member that takes it (and, with
    /// `target_session_attrs=read-write`, writes), trying them staggered:
    /// the member that last did first, then the next every [`HEAD_START`]
    /// (or at once when one fails). While a member is still being tried
    /// (a silent host's connect takes its whole timeout), those that
    /// refused are asked again every [`HEAD_START`]: a standby promoted
    /// meanwhile is found within it, not after the silent one gives up.
    /// The error is the last to fail's, once none is being tried.
    pub async fn connect_first<T>(
        &self,
        tls: T,
    ) -> Result<(Client, Connection<Socket, T::Stream>), tokio_postgres::Error>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + Sync,
        T::TlsConnect: Send + Sync,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let members = &self.members;
        if members.len() == 1 {
            return self.config.connect(tls).await;
        }
        let first = self.last.load(Ordering::Relaxed) % members.len();
        let mut order = (0..members.len()).map(|k| (first + k) % members.len());
        let mut trying = FuturesUnordered::new();
        let attempt = |i: usize| {
            let (config, tls) = (members[i].clone(), tls.clone());
            async move { (i, config.connect(tls).await) }
        };
        trying.push(attempt(order.next().expect("two members or more")));
        // Members that refused while another is still being tried: asked
        // again in turn, for one of them may be promoted meanwhile.
        let mut refused = std::collections::VecDeque::new();
        loop {
            let more = order.len() > 0 || !refused.is_empty();
            tokio::select! {
                Some((i, outcome)) = trying.next() => match outcome {
                    Ok(pair) => {
                        self.last.store(i, Ordering::Relaxed);
                        return Ok(pair);
                    }
                    Err(e) => {
                        tracing::debug!(member = i, error = %e, "database member refused");
                        match order.next() {
                            Some(j) => trying.push(attempt(j)),
                            None if trying.is_empty() => return Err(e),
                            None => refused.push_back(i),
                        }
                    }
                },
                () = tokio::time::sleep(HEAD_START), if more => {
                    if let Some(j) = order.next().or_else(|| refused.pop_front()) {
                        trying.push(attempt(j));
                    }
                }
            }
        }
    }

    /// One connection outside the pools (the leader's lock), its driver
    /// spawned; `what` names it in the log when it closes. The token is
    /// cancelled the moment the connection ends (the server went away, was
    /// shut down or failed over, or terminated the session), not when the
    /// client next uses it: whatever the session held (an advisory lock)
    /// is gone by then.
    pub async fn connect(
        &self,
        what: &'static str,
    ) -> Result<(tokio_postgres::Client, CancellationToken), tokio_postgres::Error> {
        let (client, connection) = self.connect_any().await?;
        let ended = CancellationToken::new();
        let on_end = ended.clone();
        tokio::spawn(async move {
            match connection.await {
                Err(e) => tracing::warn!(error = %e, what, "database connection closed"),
                Ok(()) => tracing::debug!(what, "database connection closed"),
            }
            on_end.cancel();
        });
        Ok((client, ended))
    }

    /// [`PgTarget::connect_first`] over TLS or not, as the URL says; the
    /// connection's driver is for the caller to spawn.
    async fn connect_any(&self) -> Result<(Client, Driver), tokio_postgres::Error> {
        Ok(match &self.tls {
            Some(tls) => {
                let (client, connection) = self.connect_first(tls.clone()).await?;
                (client, Box::pin(connection))
            }
            None => {
                let (client, connection) = self.connect_first(NoTls).await?;
                (client, Box::pin(connection))
            }
        })
    }
}

/// A connection's driver, whatever its stream.
type Driver = futures_util::future::BoxFuture<'static, Result<(), tokio_postgres::Error>>;

/// The pools' connector ([`deadpool_postgres::Connect`]): each new
/// connection through [`PgTarget::connect_first`].
pub struct PoolConnect(pub PgTarget);

impl deadpool_postgres::Connect for PoolConnect {
    fn connect(
        &self,
        _: &tokio_postgres::Config,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        Box::pin(async move {
            let (client, connection) = self.0.connect_any().await?;
            let driver = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(target: "deadpool.postgres", "Connection error: {}", e);
                }
            });
            Ok((client, driver))
        })
    }
}

/// How long the member tried first has before the next is tried too.
pub const HEAD_START: Duration = Duration::from_millis(300);

/// `c`'s members, each as a configuration of its own (one host, its port
/// and address), in the URL's order.
fn members_of(c: &tokio_postgres::Config) -> Vec<tokio_postgres::Config> {
    let hosts = c.get_hosts();
    if hosts.len() <= 1 {
        return vec![c.clone()];
    }
    (0..hosts.len())
        .map(|i| {
            let mut one = tokio_postgres::Config::new();
            match &hosts[i] {
                tokio_postgres::config::Host::Tcp(h) => one.host(h),
                tokio_postgres::config::Host::Unix(p) => one.host_path(p),
            };
            if let Some(addr) = c.get_hostaddrs().get(i) {
                one.hostaddr(*addr);
            }
            // One port for all, or one each (tokio-postgres checks).
            let ports = c.get_ports();
            if let Some(port) = ports.get(i).or(ports.first()) {
                one.port(*port);
            }
            if let Some(u) = c.get_user() {
                one.user(u);
            }
            if let Some(p) = c.get_password() {
                one.password(p);
            }
            if let Some(d) = c.get_dbname() {
                one.dbname(d);
            }
            if let Some(o) = c.get_options() {
                one.options(o);
            }
            if let Some(a) = c.get_application_name() {
                one.application_name(a);
            }
            if let Some(t) = c.get_connect_timeout() {
                one.connect_timeout(*t);
            }
            if let Some(t) = c.get_tcp_user_timeout() {
                one.tcp_user_timeout(*t);
            }
            one.ssl_mode(c.get_ssl_mode())
                .ssl_negotiation(c.get_ssl_negotiation())
                .keepalives(c.get_keepalives())
                .keepalives_idle(c.get_keepalives_idle())
                .target_session_attrs(c.get_target_session_attrs())
                .channel_binding(c.get_channel_binding());
            if let Some(i) = c.get_keepalives_interval() {
                one.keepalives_interval(i);
            }
            if let Some(r) = c.get_keepalives_retries() {
                one.keepalives_retries(r);
            }
            one
        })
        .collect()
}

/// How long one member of the URL has to accept a connection, unless the
/// URL's `connect_timeout` says otherwise.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How soon either end of a connection gives up on a silent peer: keepalive
/// probes after [`KEEPALIVE_IDLE`] of silence, [`KEEPALIVE_PROBES`] of them
/// [`KEEPALIVE_INTERVAL`] apart, and at most [`UNACKED_TIMEOUT`] for sent
/// data to be acknowledged.
///
/// Six seconds either way: a database host and its region's replicas share
/// a LAN, where a live kernel acknowledges within milliseconds however
/// loaded its processes are. The region's connections to a primary whose
/// host lost power must be given up before Patroni has promoted its
/// standby (its `ttl`, 10 s in the reference configuration), so that the
/// region writes again as soon as the new primary does: with 11 s / 15 s
/// it wrote again 16.5 s after the power cut, 6 s after the promotion
/// (the lab's database-failover drill).
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(3);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
pub const KEEPALIVE_PROBES: u32 = 3;
pub const UNACKED_TIMEOUT: Duration = Duration::from_secs(6);

/// A replica that vanishes without a word (its machine loses power, its
/// link is cut) must not keep its locks: PostgreSQL releases a session's
/// advisory lock (the scheduling leader's, `loops/leader.rs`) and row
/// locks only when it notices the session is gone, which with the
/// kernel's defaults takes two hours of silence. So every connection asks
/// the server to probe it (`tcp_keepalives_*` and `tcp_user_timeout` for
/// the session, through the startup `options`; settings the URL's own
/// `options` gives win, coming later) and probes the server itself the
/// same way: a dead peer is noticed within about 6 s, idle or with data in
/// flight.
fn dead_peer_timers(config: &mut tokio_postgres::Config) {
    config
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_PROBES)
        .tcp_user_timeout(UNACKED_TIMEOUT);
    let ours = format!(
        "-c tcp_keepalives_idle={} -c tcp_keepalives_interval={} -c tcp_keepalives_count={} \
         -c tcp_user_timeout={}",
        KEEPALIVE_IDLE.as_secs(),
        KEEPALIVE_INTERVAL.as_secs(),
        KEEPALIVE_PROBES,
        UNACKED_TIMEOUT.as_millis()
    );
    let options = match config.get_options() {
        Some(theirs) if !theirs.is_empty() => format!("{ours} {theirs}"),
        _ => ours,
    };
    config.options(options);
}

/// `url` without the settings in [`OURS`], and those settings.
fn split_settings(url: &str) -> (String, Vec<(String, String)>) {
    let mut ours = Vec::new();
    let keep = |kv: &str, ours: &mut Vec<(String, String)>| -> bool {
        match kv.split_once('=') {
            Some((k, v)) if OURS.contains(&k.trim()) => {
                ours.push((k.trim().to_string(), v.trim().to_string()));
                false
            }
            _ => true,
        }
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_string(), ours);
        };
        let rest: Vec<&str> = query.split('&').filter(|kv| keep(kv, &mut ours)).collect();
        let url = if rest.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        (url, ours)
    } else {
        let rest: Vec<&str> = (url.split_whitespace())
            .filter(|kv| keep(kv, &mut ours))
            .collect();
        (rest.join(" "), ours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_read_from_either_form_and_the_rest_left_to_tokio_postgres() {
        let (rest, ours) = split_settings(
            "postgres://u@db:5432/g?sslmode=verify-full&application_name=x&sslrootcert=/ca.pem",
        );
        assert_eq!(rest, "postgres://u@db:5432/g?application_name=x");
        assert_eq!(ours.len(), 2);
        let (rest, ours) = split_settings("host=db sslmode=require port=5432 sslrootcert=/ca.pem");
        assert_eq!(rest, "host=db port=5432");
        assert_eq!(ours[0], ("sslmode".into(), "require".into()));
        assert!(PgTarget::parse("host=db").unwrap().tls.is_none());
    }

    #[test]
    fn a_multi_host_url_names_every_member_and_asks_for_the_primary() {
        let t = PgTarget::parse(
            "postgres://u:p@db1:5432,db2:5433,db3:5434/g?target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(t.config.get_hosts().len(), 3);
        assert_eq!(t.config.get_ports(), &[5432, 5433, 5434]);
        assert_eq!(
            t.config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        assert_eq!(t.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        let t = PgTarget::parse("host=db1,db2 connect_timeout=1").unwrap();
        assert_eq!(
            t.config.get_connect_timeout(),
            Some(&Duration::from_secs(1))
        );
    }

    #[test]
    fn a_tls_mode_without_a_ca_or_checking_no_name_is_refused() {
        let e = PgTarget::parse("host=db sslmode=require")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslrootcert"), "{e}");
        let e = PgTarget::parse("postgres://db/g?sslmode=verify-ca&sslrootcert=/x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("verify-full"), "{e}");
        let e = PgTarget::parse("host=db sslmode=verify-full sslrootcert=/nonexistent")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent"), "{e}");
        let e = PgTarget::parse("host=db sslmode=sometimes")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sometimes"), "{e}");
    }
}
