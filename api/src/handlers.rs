//! The endpoint handlers and the table of routes they answer.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Json;
use serde::Serialize;
use serde_json::json;
use wharf_domain::GroupName;
use wharf_projections::{GroupView, HistoryPage};

use crate::error::ApiError;
use crate::openapi::OPENAPI_JSON;
use crate::params;
use crate::state::ApiState;

/// `GET`: every declared group.
pub const GROUPS_PATH: &str = "/api/v1/groups";
/// `GET`: one group.
pub const GROUP_PATH: &str = "/api/v1/groups/{group}";
/// `GET`: a page of one group's declaration history.
pub const DECLARATIONS_PATH: &str = "/api/v1/groups/{group}/declarations";
/// `GET`: the OpenAPI document.
pub const OPENAPI_PATH: &str = "/api/v1/openapi.json";
/// `GET`: liveness.
pub const HEALTHZ_PATH: &str = "/healthz";
/// `GET`: readiness.
pub const READYZ_PATH: &str = "/readyz";

/// Every route: its path and what answers it. The router is built from this table, and the
/// OpenAPI test checks the document against it.
pub(crate) fn routes() -> Vec<(&'static str, MethodRouter<ApiState>)> {
    vec![
        (GROUPS_PATH, get(list_groups)),
        (GROUP_PATH, get(one_group)),
        (DECLARATIONS_PATH, get(declarations)),
        (OPENAPI_PATH, get(openapi)),
        (HEALTHZ_PATH, get(healthz)),
        (READYZ_PATH, get(readyz)),
    ]
}

/// The body of `GET /api/v1/groups`.
#[derive(Debug, Serialize)]
struct GroupList {
    groups: Vec<GroupView>,
}

async fn list_groups(State(state): State<ApiState>) -> Result<Json<GroupList>, ApiError> {
    let groups = state.read_model().groups().await?;
    Ok(Json(GroupList { groups }))
}

async fn one_group(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<GroupView>, ApiError> {
    let group = group_name(path)?;
    let view = find_group(&state, &group).await?;
    Ok(Json(view))
}

async fn declarations(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<HistoryPage>, ApiError> {
    let group = group_name(path)?;
    let Query(pairs) =
        query.map_err(|rejection| ApiError::invalid("query", "", rejection.body_text()))?;
    let query = params::history_query(group.clone(), &pairs)?;
    find_group(&state, &group).await?;
    let page = state.read_model().history(&query).await?;
    Ok(Json(page))
}

/// The group's view, or a 404 when it has no effective declaration.
async fn find_group(state: &ApiState, group: &GroupName) -> Result<GroupView, ApiError> {
    state.read_model().group(group).await?.ok_or_else(|| {
        ApiError::not_found(format!("group {:?} was never declared", group.as_str()))
    })
}

/// Validates the `{group}` path segment.
fn group_name(path: Result<Path<String>, PathRejection>) -> Result<GroupName, ApiError> {
    let Path(raw) =
        path.map_err(|rejection| ApiError::invalid("group", "", rejection.body_text()))?;
    Ok(GroupName::parse("group", &raw)?)
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "pass" }))
}

async fn readyz(State(state): State<ApiState>) -> Response {
    match state.check_ready().await {
        Ok(()) => Json(json!({ "status": "pass" })).into_response(),
        Err(reason) => {
            tracing::warn!(%reason, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "fail", "reason": reason })),
            )
                .into_response()
        }
    }
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
