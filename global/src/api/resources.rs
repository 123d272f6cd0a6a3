//! What capacity reservations and dedicated clusters share at the global
//! tier: each is a tenant's thing that lives in one region.
//!
//! - A create goes to the region its body names (or the tenant's only
//!   region). A keyed create's id is UUIDv5(tenant, key) in the kind's
//!   namespace; the region it went to is claimed like a keyed job's
//!   (`POST /internal/v1/claims`), so the same key sent again naming another
//!   region is refused (`idempotency_key_reused`) instead of making a second
//!   one there; the region itself refuses the key with another body.
//! - Get, resize and delete go to the region that has it, found by asking
//!   every region at once, as for jobs; operators' calls name the operator
//!   (`X-Gangway-Actor`) for the region's audit log.
//! - Lists are every region's, merged newest first; regions that do not
//!   answer are named in `unavailable_regions`.
//!
//! Regions' answers, refusals included, are passed on as they are.

use std::collections::BTreeSet;

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use gangway_shared::error::codes;
use gangway_shared::http::{idempotency_key, ApiError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

use super::relay::{ask_every_region, claim, relay, unavailable};
use crate::regions::{Answer, Call, Region, Who};
use crate::routing::rendezvous;
use crate::state::GlobalState;

/// A kind of tenant thing that lives in one region.
pub(super) trait Resource {
    /// `reservation`, `cluster`: the word messages use.
    const WHAT: &'static str;
    /// The tenant's collection, here and in every region.
    const PATH: &'static str;
    /// Every tenant's, for operators.
    const ADMIN_PATH: &'static str;
    /// The code of a create that must name its region and does not, and of
    /// a job naming one that no region has.
    const INVALID: &'static str;
    /// The bodies of a create and of a resize.
    type Spec: Serialize;
    type Resize: Serialize;
    type Item: DeserializeOwned;
    /// A page of them (`unavailable_regions` included).
    type List: DeserializeOwned + Serialize;

    /// A create's body, with every check that needs no region.
    fn spec(body: serde_json::Value) -> Result<Self::Spec, ApiError>;
    /// A resize's body, checked.
    fn resize(body: serde_json::Value) -> Result<Self::Resize, ApiError>;
    /// The id a create with this Idempotency-Key gets.
    fn id_for_key(tenant: &str, key: &str) -> Uuid;
    /// The region a create names.
    fn region(spec: &mut Self::Spec) -> &mut Option<String>;
    /// What lists sort by, newest first: creation time, then id.
    fn created(item: &Self::Item) -> (DateTime<Utc>, Uuid);
    fn items(list: Self::List) -> Vec<Self::Item>;
    fn list(items: Vec<Self::Item>, unavailable_regions: Vec<String>) -> Self::List;
}

/// The region a `R` is made in: the one the body names (known, allowed to
/// the tenant, answering), or the tenant's only region.
fn target<'a, R: Resource>(
    state: &'a GlobalState,
    tenant: &str,
    named: Option<&str>,
) -> Result<&'a Region, ApiError> {
    let allowed: Vec<&Region> = (state.regions.list.iter())
        .filter(|r| state.tenant_may_use(tenant, &r.name))
        .collect();
    let name = match named {
        Some(name) => name,
        None if allowed.len() == 1 => allowed[0].name.as_str(),
        None => {
            let names: Vec<&str> = allowed.iter().map(|r| r.name.as_str()).collect();
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                R::INVALID,
                format!(
                    "name the region to make the {} in (\"region\"): you may use {}; \
                     GET /v1/regions lists them",
                    R::WHAT,
                    names.join(", ")
                ),
            ));
        }
    };
    let Some(region) = allowed.iter().find(|r| r.name == name) else {
        let why = if state.regions.get(name).is_some() {
            format!("your tenant may not use region {name}; ask an operator")
        } else {
            format!("no region named {name:?}; GET /v1/regions lists them")
        };
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::WRONG_REGION,
            why,
        ));
    };
    if !state.regions.healthy().iter().any(|r| r.name == name) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::REGION_UNAVAILABLE,
            format!("region {name} is not answering; retry shortly with the same Idempotency-Key"),
        )
        .with_retry_after(super::relay::RETRY_AFTER_S));
    }
    Ok(region)
}

/// `POST` of the collection: creates the body's `R` for `tenant` in its
/// region (see [`target`]), claiming the region for a keyed create first.
/// `by` is the tenant itself, or an operator acting on its behalf (sent to
/// the region's `/v1/admin/tenants/{tenant}/…`, which audits it).
pub(super) async fn create<R: Resource>(
    state: &GlobalState,
    tenant: &str,
    by: Who<'_>,
    headers: &HeaderMap,
    body: serde_json::Value,
) -> Result<Response, ApiError> {
    let key = idempotency_key(headers)?;
    let key = key.as_deref();
    let mut spec = R::spec(body)?;
    let region = target::<R>(state, tenant, R::region(&mut spec).as_deref())?;
    // The region is part of what a key stands for.
    *R::region(&mut spec) = Some(region.name.clone());
    if let Some(k) = key {
        let id = R::id_for_key(tenant, k);
        let healthy: Vec<&str> = (state.regions.healthy().into_iter())
            .map(|r| r.name.as_str())
            .collect();
        let order = rendezvous(id, healthy);
        let claimed = match claim(state, id, tenant, &region.name, &order).await {
            Ok(claimed) => claimed,
            Err(refusal) => return Ok(refusal),
        };
        if claimed != region.name {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::IDEMPOTENCY_KEY_REUSED,
                format!(
                    "this Idempotency-Key was already used for a {what} in region {claimed}; \
                     use a new key for a {what} in {}",
                    region.name,
                    what = R::WHAT,
                ),
            ));
        }
    }
    let body = serde_json::to_vec(&spec).expect("a create body serializes");
    let call = Call {
        idempotency_key: key,
        body: Some(body.into()),
        ..by.call()
    };
    let path = match by {
        Who::Tenant(_) => R::PATH.to_string(),
        Who::Operator(_) => format!(
            "/v1/admin/tenants/{tenant}{}",
            R::PATH.trim_start_matches("/v1")
        ),
    };
    let answer = (state.regions.call(region, Method::POST, &path, call).await)
        .map_err(|e| unavailable(&e))?;
    Ok(relay(answer))
}

/// The collection `who` may see: the tenant's own, or every tenant's.
fn collection<R: Resource>(who: Who<'_>) -> &'static str {
    match who {
        Who::Tenant(_) => R::PATH,
        Who::Operator(_) => R::ADMIN_PATH,
    }
}

/// Every region's list (the tenant's, or every tenant's), merged newest
/// first; regions that do not answer are named.
pub(super) async fn merged<R: Resource>(
    state: &GlobalState,
    who: Who<'_>,
) -> Result<Response, ApiError> {
    let path = collection::<R>(who);
    let asks = state.regions.list.iter().map(|r| async move {
        (
            r,
            state.regions.call(r, Method::GET, path, who.call()).await,
        )
    });
    let mut items = Vec::new();
    let mut unavailable_regions = BTreeSet::new();
    for (region, answer) in join_all(asks).await {
        let page = (answer.ok())
            .filter(|a| a.status == StatusCode::OK)
            .and_then(|a| serde_json::from_slice::<R::List>(&a.body).ok());
        match page {
            Some(p) => items.extend(R::items(p)),
            None => {
                unavailable_regions.insert(region.name.clone());
            }
        }
    }
    items.sort_by_key(|i| std::cmp::Reverse(R::created(i)));
    let list = R::list(items, unavailable_regions.into_iter().collect());
    Ok(axum::Json(list).into_response())
}

/// The region that has `id` (for `who`), with its answer to a GET.
async fn find<'a, R: Resource>(
    state: &'a GlobalState,
    who: Who<'_>,
    id: Uuid,
) -> Result<(&'a Region, Answer), ApiError> {
    let path = format!("{}/{id}", collection::<R>(who));
    ask_every_region(state, Method::GET, &path, who, R::WHAT).await
}

/// `GET …/{id}`, from the region that has it.
pub(super) async fn get<R: Resource>(
    state: &GlobalState,
    who: Who<'_>,
    id: Uuid,
) -> Result<Response, ApiError> {
    let (_, answer) = find::<R>(state, who, id).await?;
    Ok(relay(answer))
}

/// `PATCH …/{id}` with the checked body, to the region that has it.
pub(super) async fn resize<R: Resource>(
    state: &GlobalState,
    who: Who<'_>,
    id: Uuid,
    headers: &HeaderMap,
    body: serde_json::Value,
) -> Result<Response, ApiError> {
    let key = idempotency_key(headers)?;
    let resize = R::resize(body)?;
    let body = serde_json::to_vec(&resize).expect("a resize serializes");
    forward::<R>(state, who, id, Method::PATCH, key.as_deref(), Some(body)).await
}

/// `DELETE …/{id}`, to the region that has it.
pub(super) async fn delete<R: Resource>(
    state: &GlobalState,
    who: Who<'_>,
    id: Uuid,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let key = idempotency_key(headers)?;
    forward::<R>(state, who, id, Method::DELETE, key.as_deref(), None).await
}

/// Sends `method` with `key` and `body` to the region that has `id`.
async fn forward<R: Resource>(
    state: &GlobalState,
    who: Who<'_>,
    id: Uuid,
    method: Method,
    key: Option<&str>,
    body: Option<Vec<u8>>,
) -> Result<Response, ApiError> {
    let (region, _) = find::<R>(state, who, id).await?;
    let path = format!("{}/{id}", collection::<R>(who));
    let call = Call {
        idempotency_key: key,
        body: body.map(Into::into),
        ..who.call()
    };
    let answer =
        (state.regions.call(region, method, &path, call).await).map_err(|e| unavailable(&e))?;
    Ok(relay(answer))
}

/// The region that has `tenant`'s `id`, for a job that names it; one no
/// region has is `R::INVALID`.
pub(super) async fn home<'a, R: Resource>(
    state: &'a GlobalState,
    tenant: &str,
    id: Uuid,
) -> Result<&'a Region, ApiError> {
    match find::<R>(state, Who::Tenant(tenant), id).await {
        Ok((region, _)) => Ok(region),
        Err(e) if e.status == StatusCode::NOT_FOUND => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            R::INVALID,
            format!("you have no {} {id}; GET {} lists yours", R::WHAT, R::PATH),
        )),
        Err(e) => Err(e),
    }
}
