//! The route table: every path the API serves and the handler that answers it, and the router
//! built from it. The OpenAPI test here holds the document to the table.

use axum::http::Request;
use axum::routing::{get, MethodRouter};
use axum::Router;
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::handlers::{
    self, DEAD_LETTERS_PATH, DECLARATIONS_PATH, DEEPHEALTH_PATH, GROUPS_PATH, GROUP_PATH,
    HEALTHZ_PATH, METRICS_PATH, OPENAPI_PATH, READYZ_PATH, SESSIONS_PATH, SESSION_EVENTS_PATH,
    SESSION_PATH, SWAPS_PATH, TOPICS_PATH,
};
use crate::state::ApiState;

/// Every route: its path and what answers it. The router is built from this table, and the
/// OpenAPI test checks the document against it.
pub(crate) fn routes() -> Vec<(&'static str, MethodRouter<ApiState>)> {
    vec![
        (TOPICS_PATH, get(handlers::list_topics)),
        (GROUPS_PATH, get(handlers::list_groups)),
        (GROUP_PATH, get(handlers::one_group)),
        (DECLARATIONS_PATH, get(handlers::declarations)),
        (DEAD_LETTERS_PATH, get(handlers::dead_letters)),
        (SWAPS_PATH, get(handlers::swaps)),
        (OPENAPI_PATH, get(crate::openapi::openapi)),
        (HEALTHZ_PATH, get(handlers::healthz)),
        (READYZ_PATH, get(handlers::readyz)),
        (METRICS_PATH, get(handlers::metrics)),
        (SESSIONS_PATH, get(crate::sessions::list_sessions)),
        (SESSION_PATH, get(crate::sessions::one_session)),
        (SESSION_EVENTS_PATH, get(crate::sessions::session_events)),
        (DEEPHEALTH_PATH, get(crate::deephealth::deephealth)),
    ]
}

/// The API's router, with JSON fallbacks for unknown paths and methods and a tracing layer.
pub fn router(state: ApiState) -> Router {
    let routes = routes()
        .into_iter()
        .fold(Router::new(), |router, (path, route)| {
            router.route(path, route)
        });
    routes
        .fallback(handlers::no_route)
        .method_not_allowed_fallback(handlers::wrong_method)
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request<_>| {
                    tracing::info_span!(
                        "http_request",
                        method = %request.method(),
                        path = %request.uri().path(),
                    )
                })
                .on_response(DefaultOnResponse::new().level(Level::INFO))
                .on_failure(DefaultOnFailure::new().level(Level::ERROR)),
        )
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::routes;
    use crate::openapi::document_json;

    fn document() -> Value {
        serde_json::from_str(document_json()).expect("the generated document is not valid JSON")
    }

    fn documented_paths(doc: &Value) -> BTreeSet<String> {
        doc["paths"]
            .as_object()
            .expect("the document has no paths")
            .keys()
            .cloned()
            .collect()
    }

    #[test]
    fn every_route_is_documented_and_nothing_else() {
        let doc = document();
        let routed: BTreeSet<String> = routes().iter().map(|(p, _)| (*p).to_owned()).collect();
        assert_eq!(documented_paths(&doc), routed);
        for path in &routed {
            let operation = &doc["paths"][path]["get"];
            assert!(operation.is_object(), "{path} documents no GET");
            assert!(
                operation["operationId"].is_string(),
                "{path}: no operationId"
            );
            assert!(
                operation["responses"]["200"].is_object(),
                "{path}: no 200 response"
            );
        }
    }
}
