//! The endpoint handlers of the listing, the probes and the metrics (`routes.rs` has the table
//! of routes they answer).

use std::collections::BTreeMap;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;
use wharf_domain::GroupName;
use wharf_metrics::ScrapeCollector;
use wharf_projections::{CarriedFigures, HistoryPage};
use wharf_queue::GroupQueueStats;

use crate::error::{ApiError, ErrorBody};
use crate::metrics::{StoreCollector, CONTENT_TYPE as METRICS_CONTENT_TYPE};

use crate::params;
use crate::schemas::{health_status, pass_only};
use crate::state::{ApiState, HealthStatus};
use crate::views::{DeadLetterPage, GroupDetail, GroupEntry, GroupList, SwapList, TopicList};

/// `GET`: every topic's head and size.
pub const TOPICS_PATH: &str = "/api/v1/topics";
/// `GET`: a page of the declared groups, with their queue figures.
pub const GROUPS_PATH: &str = "/api/v1/groups";
/// `GET`: one group, with its queue figures.
pub const GROUP_PATH: &str = "/api/v1/groups/{group}";
/// `GET`: a page of one group's declaration history.
pub const DECLARATIONS_PATH: &str = "/api/v1/groups/{group}/declarations";
/// `GET`: a page of one group's dead letters.
pub const DEAD_LETTERS_PATH: &str = "/api/v1/groups/{group}/dead-letters";
/// `GET`: what each install applied by the group's routing did (newest first).
pub const SWAPS_PATH: &str = "/api/v1/groups/{group}/swaps";
/// `GET`: the OpenAPI document.
pub const OPENAPI_PATH: &str = "/api/v1/openapi.json";
/// `GET`: liveness.
pub const HEALTHZ_PATH: &str = "/healthz";
/// `GET`: readiness.
pub const READYZ_PATH: &str = "/readyz";
/// `GET`: Prometheus metrics (text exposition format 0.0.4).
pub const METRICS_PATH: &str = "/metrics";
/// `GET`: the managed MQTT sessions.
pub const SESSIONS_PATH: &str = "/api/v1/sessions";
/// `GET`: one managed MQTT session, by name or durable identity.
pub const SESSION_PATH: &str = "/api/v1/sessions/{session}";
/// `GET`: a page of one managed MQTT session's stream (`filters` or `lease`), for the audit.
pub const SESSION_EVENTS_PATH: &str = "/api/v1/sessions/{session}/events";

/// `GET`: deep health (`application/health+json`): sessions, leases, config watch, consumers,
/// the store's reachability.
pub const DEEPHEALTH_PATH: &str = "/api/v1/monitor/deephealth";

#[utoipa::path(
    get,
    path = "/api/v1/topics",
    operation_id = "listTopics",
    tag = "queue",
    summary = "Every topic's head and size",
    description = "Each topic ever published to, ordered by name: the last position assigned and how many messages the log still retains.",
    responses(
        (status = 200, description = "The topics (an empty list when nothing was ever published).", body = TopicList),
        (status = 500, description = "The server failed; the message is generic and the details are in the server log.", body = ErrorBody),
        (status = 503, description = "The store cannot be reached or is not migrated; retry later.", body = ErrorBody)
    )
)]
pub(crate) async fn list_topics(
    State(state): State<ApiState>,
) -> Result<Json<TopicList>, ApiError> {
    let topics = state.queue().topic_stats().await?;
    Ok(Json(TopicList { topics }))
}

/// A page of the declared groups (by name, from the `after` cursor, filtered by `topic` and
/// `waiting`) joined by name with their queue figures, each read by key: on Postgres in the
/// same statement, one snapshot (ADR 0072); on SQLite by a second read, so the figures may be
/// a moment apart from the declarations.
#[utoipa::path(
    get,
    path = "/api/v1/groups",
    operation_id = "listGroups",
    tag = "groups",
    summary = "A page of the declared consumer groups",
    description = "One page of groups, ordered by group name, each as a summary: its effective declaration, how many open waiters it has (counted up to 100, with `more` true beyond), how many instances it has recorded and how many of them are live (exact counts: a group's fleet), its oldest open waiter, and its queue figures. The waiters and instances themselves are paged by `GET /api/v1/groups/{group}`. Page with `after`: pass the previous page's `next_after` verbatim; it is null on the last page. Paging is by key (the group name), so a walk never lists a group twice and lists every group that existed throughout it exactly once, while other groups are created. Every read is by index: a page costs what its size and its groups' fleets cost, whatever the number of groups, their waiters or the length of the ledger. Any other query parameter, or one given twice, is refused with 400. On Postgres the declarations and the queue figures are one snapshot; on SQLite they are two reads, a moment apart.",
    params(params::GroupsParamsDoc),
    responses(
        (status = 200, description = "The page (an empty list when no group matches).", body = GroupList),
        (status = 400, description = "A path or query parameter is malformed or out of range; `error.field` names it and `error.message` quotes the value.", body = ErrorBody),
        (status = 500, description = "The server failed; the message is generic and the details are in the server log.", body = ErrorBody),
        (status = 503, description = "The store cannot be reached or is not migrated; retry later.", body = ErrorBody)
    )
)]
pub(crate) async fn list_groups(
    State(state): State<ApiState>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<GroupList>, ApiError> {
    let Query(pairs) =
        query.map_err(|rejection| ApiError::invalid("query", "", rejection.body_text()))?;
    let query = params::groups_query(&pairs)?;
    // On Postgres one statement reads the page and its queue figures (ADR 0072); elsewhere
    // the figures are a second read of the page's groups, by key.
    let (page, figures) = state.read_model().groups_page_with_figures(&query).await?;
    let stats = queue_figures(&state, figures, || {
        page.groups
            .iter()
            .filter_map(|g| GroupName::parse("group", &g.group).ok())
            .collect()
    })
    .await?;
    Ok(Json(GroupList {
        groups: GroupEntry::join(page.groups, stats),
        next_after: page.next_after,
    }))
}

/// One group with a page of its waiters and of its instances (`limit`, `waiters_after`,
/// `instances_after`) and its queue figures.
#[utoipa::path(
    get,
    path = "/api/v1/groups/{group}",
    operation_id = "getGroup",
    tag = "groups",
    summary = "One consumer group",
    description = "The group's declaration view and its queue figures, as in the listing, with one page of its open waiters (by when each first stated its set, then declarer) and one page of its worker instances (by declarer). `waiters_next_after` and `instances_next_after` name the cursor of the next page of each (null when none follows): pass one back as `waiters_after` or `instances_after`; the two lists page independently. Any other query parameter, or one given twice, is refused with 400.",
    params(params::GroupPathDoc, params::GroupParamsDoc),
    responses(
        (status = 200, description = "The group.", body = GroupDetail),
        (status = 400, description = "A path or query parameter is malformed or out of range; `error.field` names it and `error.message` quotes the value.", body = ErrorBody),
        (status = 404, description = "The group was never declared.", body = ErrorBody),
        (status = 500, description = "The server failed; the message is generic and the details are in the server log.", body = ErrorBody),
        (status = 503, description = "The store cannot be reached or is not migrated; retry later.", body = ErrorBody)
    )
)]
pub(crate) async fn one_group(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<GroupDetail>, ApiError> {
    let group = group_name(path)?;
    let Query(pairs) =
        query.map_err(|rejection| ApiError::invalid("query", "", rejection.body_text()))?;
    let members = params::member_query(&pairs)?;
    // On Postgres one statement reads the group and its queue figures (ADR 0071); elsewhere
    // the figures are a second read, after the first, so a read holds one of the API's
    // connections at a time (ADR 0067) and a group never declared costs one.
    let (view, figures) = state
        .read_model()
        .group_members_with_figures(&group, &members)
        .await?
        .ok_or_else(|| not_declared(&group))?;
    let stats = queue_figures(&state, figures, || vec![group.clone()]).await?;
    Ok(Json(GroupDetail::new(view, stats)))
}

#[utoipa::path(
    get,
    path = "/api/v1/groups/{group}/declarations",
    operation_id = "listDeclarations",
    tag = "groups",
    summary = "A page of a group's declaration history",
    description = "Declaration attempts from the ledger in position order: installs (set changes) and waits. Filter by time and declarer; page by passing the previous page's `next_after` as `after`. `until` must be later than `since` when both are given. Any other query parameter, or one given twice, is refused with 400.",
    params(params::GroupPathDoc, params::HistoryParamsDoc),
    responses(
        (status = 200, description = "The page.", body = HistoryPage),
        (status = 400, description = "A path or query parameter is malformed or out of range; `error.field` names it and `error.message` quotes the value.", body = ErrorBody),
        (status = 404, description = "The group was never declared.", body = ErrorBody),
        (status = 500, description = "The server failed; the message is generic and the details are in the server log.", body = ErrorBody),
        (status = 503, description = "The store cannot be reached or is not migrated; retry later.", body = ErrorBody)
    )
)]
pub(crate) async fn declarations(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<HistoryPage>, ApiError> {
    let group = group_name(path)?;
    let Query(pairs) =
        query.map_err(|rejection| ApiError::invalid("query", "", rejection.body_text()))?;
    let query = params::history_query(group.clone(), &pairs)?;
    // The check and the page are independent reads: side by side, not one after the other
    // (the page of a group never declared is empty and is dropped).
    let (_, page) = tokio::try_join!(ensure_declared(&state, &group), async {
        Ok::<_, ApiError>(state.read_model().history(&query).await?)
    })?;
    Ok(Json(page))
}

#[utoipa::path(
    get,
    path = "/api/v1/groups/{group}/dead-letters",
    operation_id = "listDeadLetters",
    tag = "queue",
    summary = "A page of a group's dead letters",
    description = "Messages the group gave up on, in topic-position order, each with a full copy of the message (payload in standard base64). Page by passing the previous page's `next_after` as `after`. Paging is by position: a message dead-lettered later at a position before the cursor is not seen by a walk already past it. Any other query parameter, or one given twice, is refused with 400; parameters are checked before the group is looked up.",
    params(params::GroupPathDoc, params::DeadLetterParamsDoc),
    responses(
        (status = 200, description = "The page.", body = DeadLetterPage),
        (status = 400, description = "A path or query parameter is malformed or out of range; `error.field` names it and `error.message` quotes the value.", body = ErrorBody),
        (status = 404, description = "The group was never declared.", body = ErrorBody),
        (status = 500, description = "The server failed; the message is generic and the details are in the server log.", body = ErrorBody),
        (status = 503, description = "The store cannot be reached or is not migrated; retry later.", body = ErrorBody)
    )
)]
pub(crate) async fn dead_letters(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<DeadLetterPage>, ApiError> {
    let group = group_name(path)?;
    let Query(pairs) =
        query.map_err(|rejection| ApiError::invalid("query", "", rejection.body_text()))?;
    let page = params::dead_letter_query(&pairs)?;
    ensure_declared(&state, &group).await?;
    let letters = state
        .queue()
        .dead_letters(&group, page.after, i64::from(page.limit))
        .await?;
    Ok(Json(DeadLetterPage::new(letters, page.limit)))
}

/// The installs the group's routing applied, newest first: what each swap kept claimable, set
/// aside and restored, and the log range it rescanned (ADR 0014).
#[utoipa::path(
    get,
    path = "/api/v1/groups/{group}/swaps",
    operation_id = "listSwaps",
    tag = "queue",
    summary = "What each swap did to the group's messages",
    description = "The installs the group's routing applied, newest first. A swap applies at the router's first step after the install commits: unacked deliveries of earlier installs are kept when the new set matches them and set aside otherwise; set-aside deliveries the new set matches are restored; then the new set rescans what the log holds from its oldest message up to where the previous install had routed. Only `limit` (1 to 1000, default 20) is accepted; any other query parameter, or one given twice, is refused with 400.",
    params(params::GroupPathDoc, params::SwapParamsDoc),
    responses(
        (status = 200, description = "The swaps.", body = SwapList),
        (status = 400, description = "A path or query parameter is malformed or out of range; `error.field` names it and `error.message` quotes the value.", body = ErrorBody),
        (status = 404, description = "The group was never declared.", body = ErrorBody),
        (status = 500, description = "The server failed; the message is generic and the details are in the server log.", body = ErrorBody),
        (status = 503, description = "The store cannot be reached or is not migrated; retry later.", body = ErrorBody)
    )
)]
pub(crate) async fn swaps(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<SwapList>, ApiError> {
    let group = group_name(path)?;
    let Query(pairs) =
        query.map_err(|rejection| ApiError::invalid("query", "", rejection.body_text()))?;
    let limit = params::swaps_limit(&pairs)?;
    ensure_declared(&state, &group).await?;
    let swaps = state.queue().swaps(&group, i64::from(limit)).await?;
    Ok(Json(SwapList { swaps }))
}

/// A 404 unless the group has an effective declaration (a single read; no view is built).
async fn ensure_declared(state: &ApiState, group: &GroupName) -> Result<(), ApiError> {
    if state.read_model().is_declared(group).await? {
        Ok(())
    } else {
        Err(not_declared(group))
    }
}

fn not_declared(group: &GroupName) -> ApiError {
    ApiError::not_found(format!("group {:?} was never declared", group.as_str()))
}

/// Validates the `{group}` path segment.
fn group_name(path: Result<Path<String>, PathRejection>) -> Result<GroupName, ApiError> {
    let Path(raw) =
        path.map_err(|rejection| ApiError::invalid("group", "", rejection.body_text()))?;
    Ok(GroupName::parse("group", &raw)?)
}

// The health answers are assembled as JSON here and in `deephealth.rs` (their shape is
// application/health+json's, keyed by check). These types state that shape for the document and
// are never built; the response validation of the HTTP tests holds the answers to them.

/// The liveness answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct Pass {
    #[schema(value_type = String, schema_with = pass_only)]
    status: String,
}

/// The readiness answer (application/health+json).
#[derive(Serialize, ToSchema)]
pub(crate) struct Health {
    /// The worst check's status: `fail` is 503, `pass` and `warn` are 200.
    #[schema(value_type = String, schema_with = health_status)]
    status: String,
    /// The first failing check's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    output: Option<String>,
    /// Every check, keyed `component:measurement`.
    checks: BTreeMap<String, Vec<HealthCheck>>,
}

/// One readiness check.
#[derive(Serialize, ToSchema)]
#[schema(as = HealthCheck)]
pub(crate) struct HealthCheck {
    #[schema(value_type = String, schema_with = health_status)]
    status: String,
    /// Why it warns or fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    output: Option<String>,
}

#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "getLiveness",
    tag = "probes",
    summary = "Liveness",
    description = "Always passes while the process serves HTTP; never touches the database.",
    responses(
        (status = 200, description = "The process is alive.", body = Pass)
    )
)]
pub(crate) async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "pass" }))
}

/// The `application/health+json` readiness answer: the worst check's status (`fail` is 503,
/// `pass` and `warn` are 200), every check keyed `component:measurement`, and the first
/// failing check's reason as `output`.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "getReadiness",
    tag = "probes",
    summary = "Readiness",
    description = "An application/health+json answer: passes when the store can serve the listing (reachable, a schema this build can read, catch-up projections applying). `warn` (200) when a newer build migrated the store. Checks are keyed `component:measurement`: `store:schema`, `projections:catch-up`, `mqtt:sessions`, or `readiness:probe` for a custom probe and `readiness:duration` when the probe does not finish in time.",
    responses(
        (status = 200, description = "Ready for traffic (status pass or warn).", body = Health, content_type = "application/health+json"),
        (status = 503, description = "Not ready (status fail); `output` is the first failing check's reason.", body = Health, content_type = "application/health+json")
    )
)]
pub(crate) async fn readyz(State(state): State<ApiState>) -> Response {
    let checks = state.check_health().await;
    let status = checks
        .iter()
        .map(|c| c.status)
        .max()
        .unwrap_or(HealthStatus::Pass);
    let mut keyed = serde_json::Map::new();
    for check in &checks {
        let mut entry = serde_json::Map::new();
        entry.insert("status".into(), json!(check.status));
        if let Some(output) = &check.output {
            entry.insert("output".into(), json!(output));
        }
        keyed.insert(check.key.clone(), json!([entry]));
    }
    let mut body = json!({ "status": status, "checks": keyed });
    let first_failure = checks.iter().find(|c| c.status == HealthStatus::Fail);
    if let Some(output) = first_failure.and_then(|c| c.output.clone()) {
        tracing::warn!(reason = %output, "not ready");
        body["output"] = json!(output);
    }
    let code = if status == HealthStatus::Fail {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (
        code,
        [(header::CONTENT_TYPE, "application/health+json")],
        body.to_string(),
    )
        .into_response()
}

/// The process's counters and the store's figures, read now (ADR 0021). Always 200: a store
/// that fails or does not answer within the scrape timeout shows as `wharf_store_up 0`.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "getMetrics",
    tag = "probes",
    summary = "Prometheus metrics",
    description = "The process's counters (claims, acks, nacks, dead-lettered, lost claims per group; published messages per topic; prune and retention deletions; store errors per operation) and the store's figures read at scrape time (per group: waiters, oldest wait age, live instances, installs, claimable, in flight, backing off, dead letters, set aside, rescan remaining, routing lag, oldest unacked age; per topic: head position and retained messages; projection lag), in the Prometheus text exposition format 0.0.4. Always 200: when the store fails or does not answer within the scrape timeout, `wharf_store_up` is 0 and the store's figures are left out. The metrics are listed in docs/metrics.md (ADR 0021).",
    responses(
        (status = 200, description = "The metrics.", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8", example = json!("# HELP wharf_store_up 1 when every store read of this scrape answered within the scrape timeout, else 0.\n# TYPE wharf_store_up gauge\nwharf_store_up 1\n"))
    )
)]
pub(crate) async fn metrics(State(state): State<ApiState>) -> Response {
    let store = StoreCollector::new(
        state.read_model().clone(),
        state.queue().clone(),
        state.metrics().clone(),
    );
    let sessions = state
        .session_source()
        .map(|source| crate::metrics::SessionCollector::new(source.clone()));
    let mut collectors: Vec<&dyn ScrapeCollector> = vec![&store];
    if let Some(sessions) = &sessions {
        collectors.push(sessions);
    }
    let text = state
        .metrics()
        .render(&collectors, state.scrape_timeout_value())
        .await;
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response()
}

/// The queue figures a read carried, or (where it did not) the queue's own read of the
/// groups `names` gives, by key.
async fn queue_figures(
    state: &ApiState,
    carried: CarriedFigures,
    names: impl FnOnce() -> Vec<GroupName>,
) -> Result<Vec<GroupQueueStats>, ApiError> {
    Ok(match carried {
        CarriedFigures::Read(found) => found
            .into_iter()
            .map(|(group, row)| GroupQueueStats::from_figures(group, row))
            .collect(),
        CarriedFigures::NotRead => state.queue().group_stats_of(&names()).await?,
    })
}

/// Answers any path no route matches.
pub(crate) async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no endpoint at {method} {}", uri.path()))
}

/// Answers a known path called with a method it does not serve.
pub(crate) async fn wrong_method(method: Method) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
    }
}
