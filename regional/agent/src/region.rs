//! The region's agent endpoints, and the backoff used while it is away.

use std::time::Duration;

use gangway_shared::agent::{
    ChangesRequest, ChangesResponse, RegisterRequest, RegisterResponse, SyncRequest, SyncResponse,
};
use gangway_shared::client::{post_json, ClientError};
use gangway_shared::error::codes;
use gangway_shared::reload::Reloadable;

/// No single request may hold up the loop longer than this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent's link to its region: an HTTP client trusting the region's
/// CA and presenting the agent's token, which SIGHUP may replace
/// (`gangway agent` re-reads `--region-ca` and its token file). Each call
/// takes the client in use when it starts, so a sync under way finishes
/// on its connection; the next one uses the new client. Clones share it.
#[derive(Clone, Debug)]
pub struct RegionLink {
    http: Reloadable<reqwest::Client>,
    /// Started with the region's CA: a reload must bring one too.
    tls: bool,
}

/// A client for [`RegionLink::install`], built by [`RegionLink::prepare`].
pub struct PreparedLink(reqwest::Client);

impl RegionLink {
    /// A link presenting `token` (an agent token naming this region) on
    /// every call, over HTTPS trusting only `ca_pem` when given, else
    /// plain HTTP.
    pub fn new(token: Option<&str>, ca_pem: Option<&str>) -> Result<Self, String> {
        Ok(RegionLink {
            http: Reloadable::new(client(token, ca_pem)?),
            tls: ca_pem.is_some(),
        })
    }

    /// A new client from a re-read token and CA; nothing changes until
    /// [`RegionLink::install`].
    pub fn prepare(
        &self,
        token: Option<&str>,
        ca_pem: Option<&str>,
    ) -> Result<PreparedLink, String> {
        if ca_pem.is_some() != self.tls {
            return Err(
                "the region's CA (--region-ca) cannot be added or removed without a restart".into(),
            );
        }
        client(token, ca_pem).map(PreparedLink)
    }

    /// Calls from now on use `link`'s client.
    pub fn install(&self, link: PreparedLink) {
        self.http.replace(link.0);
    }
}

fn client(token: Option<&str>, ca_pem: Option<&str>) -> Result<reqwest::Client, String> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = token {
        if let Ok(mut v) = reqwest::header::HeaderValue::from_str(&format!("Bearer {t}")) {
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
    }
    gangway_shared::client::internal_client(
        reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .default_headers(headers),
        ca_pem,
    )
}

#[derive(Clone, Debug)]
pub(crate) struct RegionClient {
    link: RegionLink,
    base: String,
}

impl RegionClient {
    /// A client for the region at `base` over `link`.
    pub fn new(base: &str, link: RegionLink) -> Self {
        RegionClient {
            link,
            base: base.trim_end_matches('/').to_string(),
        }
    }

    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, ClientError> {
        let url = format!("{}/internal/v1/agents/register", self.base);
        post_json(&self.link.http.current(), &url, req).await
    }

    /// `agent_id` has been checked to need no escaping in a path.
    pub async fn sync(
        &self,
        agent_id: &str,
        req: &SyncRequest,
    ) -> Result<SyncResponse, ClientError> {
        let url = format!("{}/internal/v1/agents/{agent_id}/sync", self.base);
        post_json(&self.link.http.current(), &url, req).await
    }
}

impl RegionClient {
    /// Waits up to `wait` (under the request timeout) for the region to say
    /// this agent's assignments changed.
    pub async fn changes(&self, agent_id: &str, wait: Duration) -> Result<bool, ClientError> {
        let url = format!("{}/internal/v1/agents/{agent_id}/changes", self.base);
        let req = ChangesRequest {
            wait_ms: wait.as_millis() as u64,
        };
        let answer: ChangesResponse = post_json(&self.link.http.current(), &url, &req).await?;
        Ok(answer.changed)
    }
}

/// How long one `changes` poll may be held: under [`REQUEST_TIMEOUT`].
pub(crate) const CHANGES_WAIT: Duration = Duration::from_secs(8);

/// The region has forgotten this agent or this boot: register again.
pub(crate) fn must_reregister(e: &ClientError) -> bool {
    matches!(e.code(), Some(codes::UNKNOWN_AGENT | codes::STALE_BOOT))
}

/// Worth retrying as it is: the region is unreachable, overloaded or
/// restarting. Anything else is a rejection that a retry alone will not fix.
pub(crate) fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Transport { .. } => true,
        ClientError::Api { status, .. } | ClientError::Unexpected { status, .. } => {
            status.is_server_error() || status.as_u16() == 429
        }
    }
}

/// Capped exponential backoff with jitter (`backon`): a base delay that
/// doubles from `MIN` to `MAX`, each delay the base plus a random part of
/// it, so within [base, 2 × base). The jitter keeps a fleet of agents from
/// retrying in lockstep after a region restart; it comes from a seed (the
/// boot id), so a run can be replayed.
#[derive(Debug)]
pub(crate) struct Backoff {
    builder: backon::ExponentialBuilder,
    delays: backon::ExponentialBackoff,
}

impl Backoff {
    pub const MIN: Duration = Duration::from_millis(50);
    pub const MAX: Duration = Duration::from_millis(2500);

    pub fn new(seed: u64) -> Self {
        use backon::BackoffBuilder;
        let builder = backon::ExponentialBuilder::new()
            .with_min_delay(Self::MIN)
            .with_max_delay(Self::MAX)
            .without_max_times()
            .with_jitter()
            .with_jitter_seed(seed);
        Backoff {
            builder,
            delays: builder.build(),
        }
    }

    pub fn reset(&mut self) {
        use backon::BackoffBuilder;
        self.delays = self.builder.build();
    }

    pub fn next_delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(Self::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(42);
        let mut base = Backoff::MIN;
        let mut delays = Vec::new();
        for _ in 0..12 {
            let d = b.next_delay();
            assert!(d >= base && d < base * 2, "{d:?} for a base of {base:?}");
            delays.push(d);
            base = (base * 2).min(Backoff::MAX);
        }
        assert!(delays[11] >= Backoff::MAX, "{delays:?}");
        // Jittered: not each exactly the base.
        assert!(
            delays.iter().any(|d| d.subsec_micros() % 1000 != 0),
            "{delays:?}"
        );
        // The same seed, the same delays (a run replays).
        let mut again = Backoff::new(42);
        assert!(delays.iter().all(|d| again.next_delay() == *d));
        b.reset();
        assert!(b.next_delay() < Backoff::MIN * 2);
    }
}
