//! The OpenAPI 3.1 document that describes this API, generated from the types the handlers
//! serve (utoipa, ADR 0031).
//!
//! Every response body derives `ToSchema` (the projections' and the queue's types behind their
//! `openapi` feature); every handler carries its `#[utoipa::path]` (operation id, prose,
//! parameters, responses); the parameter rules the hand parsers in `params.rs` enforce are the
//! `*Doc` parameter structs there. [`document_json`] builds the document once and caches it for
//! `GET /api/v1/openapi.json`, whose handler is here. `api/openapi.json` is a checked-in copy, so reviewers see API
//! changes as diffs: a test fails when it differs from the generated one, and
//! `WHARF_BLESS_OPENAPI=1 cargo test -p wharf-api --lib openapi` rewrites it.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response as HttpResponse};
use utoipa::openapi::{Content, Ref, RefOr, Response};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Wharf listing API",
        version = "1.0.0",
        description = "Read-only listing of Wharf topics, consumer groups with their queue figures, declaration history and dead letters, managed MQTT sessions, and the service probes. Every response is JSON except `/metrics` (Prometheus text format). Every error has the body described by the `Error` schema; `field` names the request parameter at fault when there is one. Times are RFC 3339 in UTC. Ledger positions are global commit-order integers; topic (log) positions are per-topic, gapless, commit-order integers from 1.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    paths(
        crate::handlers::list_topics,
        crate::handlers::list_groups,
        crate::handlers::one_group,
        crate::handlers::declarations,
        crate::handlers::dead_letters,
        crate::handlers::swaps,
        openapi,
        crate::handlers::healthz,
        crate::handlers::readyz,
        crate::handlers::metrics,
        crate::sessions::list_sessions,
        crate::sessions::one_session,
        crate::sessions::session_events,
        crate::deephealth::deephealth,
    ),
    components(schemas(crate::error::ErrorBody)),
    modifiers(&ServerBounds),
    tags(
        (name = "groups", description = "Consumer groups and their declaration history."),
        (name = "queue", description = "Topics, dead letters and swaps of the message log."),
        (name = "sessions", description = "Managed MQTT sessions and their audit."),
        (name = "probes", description = "Liveness, readiness, deep health and metrics."),
        (name = "meta", description = "About this API."),
    )
)]
struct ApiDoc;

/// The generated document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The generated document as pretty JSON, built once and served as is at
/// `GET /api/v1/openapi.json`.
pub fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        let mut text = document()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        text.push('\n');
        text
    })
}

#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    operation_id = "getOpenApi",
    tag = "meta",
    summary = "This document",
    description = "This OpenAPI 3.1 document, generated from the types the handlers serve.",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document.", body = Object)
    )
)]
pub(crate) async fn openapi() -> HttpResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document_json(),
    )
        .into_response()
}

/// The bounds every request meets in `server.rs` (ADR 0018), whatever its path: a declared body
/// over `http.max_body_bytes` is 413 `payload_too_large`, and a request that does not finish
/// within `http.request_timeout` is 503 `timeout`, both with the `Error` body.
struct ServerBounds;

const TOO_LARGE: &str =
    "The request declared a body larger than `http.max_body_bytes` (`payload_too_large`).";
const TIMED_OUT: &str = "The request did not finish within `http.request_timeout` (`timeout`).";

impl Modify for ServerBounds {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let error = || Content::new(Some(RefOr::Ref(Ref::from_schema_name("Error"))));
        for item in openapi.paths.paths.values_mut() {
            let Some(operation) = item.get.as_mut() else {
                continue;
            };
            let responses = &mut operation.responses.responses;
            let mut too_large = Response::new(TOO_LARGE);
            too_large
                .content
                .insert("application/json".to_owned(), error());
            responses.insert("413".to_owned(), RefOr::T(too_large));
            match responses.get_mut("503") {
                Some(RefOr::T(unavailable)) => {
                    if !unavailable.content.contains_key("application/json") {
                        unavailable
                            .content
                            .insert("application/json".to_owned(), error());
                    }
                    unavailable.description =
                        format!("{} Or: {TIMED_OUT}", unavailable.description);
                }
                _ => {
                    let mut timed_out = Response::new(TIMED_OUT);
                    timed_out
                        .content
                        .insert("application/json".to_owned(), error());
                    responses.insert("503".to_owned(), RefOr::T(timed_out));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::document_json;
    use crate::error::ApiError;
    use crate::handlers::{DEAD_LETTERS_PATH, DECLARATIONS_PATH, GROUPS_PATH, GROUP_PATH};
    use crate::params::{
        DEAD_LETTER_PARAMS, GROUPS_PARAMS, GROUP_PARAMS, HISTORY_PARAMS, MAX_DEAD_LETTER_PAGE,
    };
    use crate::views::{DeadLetterView, GroupQueue};

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

    /// `api/openapi.json` is the generated document, byte for byte, so a change to the API
    /// shows in review as a diff of that file. `WHARF_BLESS_OPENAPI=1` rewrites it.
    #[test]
    fn the_checked_in_copy_is_the_generated_document() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
        if std::env::var_os("WHARF_BLESS_OPENAPI").is_some_and(|v| v == "1") {
            std::fs::write(path, document_json()).expect("api/openapi.json is writable");
        }
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == document_json(),
            "api/openapi.json differs from the document generated from the types; review the \
             API change and rewrite it with WHARF_BLESS_OPENAPI=1 cargo test -p wharf-api --lib openapi"
        );
    }

    #[test]
    fn the_swap_and_session_event_parameters_match_the_parser() {
        use crate::handlers::{SESSION_EVENTS_PATH, SWAPS_PATH};
        use crate::params::{DEFAULT_LIMIT, DEFAULT_SWAPS, SESSION_EVENT_PARAMS, SWAP_PARAMS};
        let doc = document();
        for (path, known, default) in [
            (SWAPS_PATH, SWAP_PARAMS, DEFAULT_SWAPS),
            (SESSION_EVENTS_PATH, SESSION_EVENT_PARAMS, DEFAULT_LIMIT),
        ] {
            let parsed: BTreeSet<String> = known.iter().map(|p| (*p).to_owned()).collect();
            assert_eq!(query_parameter_names(&doc, path), parsed, "{path}");
            let limit = parameters(&doc, path)
                .into_iter()
                .find(|p| p["name"] == "limit")
                .expect("no limit parameter");
            assert_eq!(limit["schema"]["maximum"], MAX_DEAD_LETTER_PAGE, "{path}");
            assert_eq!(limit["schema"]["minimum"], 1, "{path}");
            assert_eq!(limit["schema"]["default"], default, "{path}");
        }
        let stream = parameters(&doc, SESSION_EVENTS_PATH)
            .into_iter()
            .find(|p| p["name"] == "stream")
            .expect("no stream parameter");
        let streams: Vec<&str> = stream["schema"]["enum"]
            .as_array()
            .expect("stream has no enum")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for name in &streams {
            assert!(
                wharf_projections::SessionStream::parse(name).is_some(),
                "{name}"
            );
        }
        assert_eq!(streams, ["filters", "lease"]);
        assert_eq!(stream["schema"]["default"], "filters");
    }

    #[test]
    fn the_declarations_document_that_until_follows_since() {
        let doc = document();
        let until = parameters(&doc, DECLARATIONS_PATH)
            .into_iter()
            .find(|p| p["name"] == "until")
            .expect("no until parameter");
        let text = until["description"].as_str().unwrap_or_default();
        assert!(
            text.contains("later than") && text.contains("`since`"),
            "{text}"
        );
        let group = parameters(&doc, DECLARATIONS_PATH)
            .into_iter()
            .find(|p| p["name"] == "group")
            .expect("no group parameter");
        assert_eq!(group["schema"]["pattern"], "^[A-Za-z0-9._-]{1,255}$");
    }

    /// The name rules the document states accept exactly what the domain's parsers accept.
    #[test]
    fn the_documented_name_rules_are_the_parsers() {
        use wharf_domain::{DeclarerId, GroupName, TopicName};
        let doc = document();
        let schema_of = |path: &str, name: &str| {
            parameters(&doc, path)
                .into_iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("{path} has no {name}"))["schema"]
                .clone()
        };
        let accepts = |schema: &Value, text: &str| {
            jsonschema::validator_for(schema)
                .expect("the parameter schema compiles")
                .is_valid(&Value::from(text))
        };
        let samples = [
            String::new(),
            "a".into(),
            "billing.v2".into(),
            "x-y_Z9".into(),
            "a b".into(),
            "a/b".into(),
            "ü".into(),
            " ".into(),
            "a".repeat(255),
            "a".repeat(256),
        ];
        let group = schema_of(GROUP_PATH, "group");
        let topic = schema_of(GROUPS_PATH, "topic");
        let declarer = schema_of(DECLARATIONS_PATH, "declarer");
        for text in &samples {
            let parsed = GroupName::parse("group", text).is_ok();
            assert_eq!(accepts(&group, text), parsed, "group {text:?}");
            let parsed = TopicName::parse("topic", text).is_ok();
            assert_eq!(accepts(&topic, text), parsed, "topic {text:?}");
            let parsed = DeclarerId::parse("declarer", text).is_ok();
            assert_eq!(accepts(&declarer, text), parsed, "declarer {text:?}");
        }
    }

    #[test]
    fn the_metrics_media_type_is_the_one_served() {
        let doc = document();
        let content = doc["paths"][crate::handlers::METRICS_PATH]["get"]["responses"]["200"]
            ["content"]
            .as_object()
            .expect("/metrics documents no content");
        let media: Vec<&String> = content.keys().collect();
        assert_eq!(media, [crate::metrics::CONTENT_TYPE]);
    }

    #[test]
    fn the_document_is_openapi_3_1() {
        let doc = document();
        let version = doc["openapi"].as_str().unwrap_or_default();
        assert!(version.starts_with("3.1."), "openapi is {version:?}");
        assert!(doc["info"]["title"].is_string());
        assert!(doc["info"]["version"].is_string());
    }

    #[test]
    fn every_path_template_variable_is_a_declared_path_parameter() {
        let doc = document();
        for path in documented_paths(&doc) {
            let declared: BTreeSet<String> = parameters(&doc, &path)
                .iter()
                .filter(|p| p["in"] == "path")
                .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
                .collect();
            let templated: BTreeSet<String> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .map(str::to_owned)
                .collect();
            assert_eq!(declared, templated, "{path}");
        }
    }

    fn query_parameter_names(doc: &Value, path: &str) -> BTreeSet<String> {
        parameters(doc, path)
            .iter()
            .filter(|p| p["in"] == "query")
            .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn the_declarations_query_parameters_match_the_parser() {
        let doc = document();
        let parsed: BTreeSet<String> = HISTORY_PARAMS.iter().map(|p| (*p).to_owned()).collect();
        assert_eq!(query_parameter_names(&doc, DECLARATIONS_PATH), parsed);
    }

    #[test]
    fn the_dead_letter_query_parameters_match_the_parser() {
        let doc = document();
        let parsed: BTreeSet<String> = DEAD_LETTER_PARAMS.iter().map(|p| (*p).to_owned()).collect();
        assert_eq!(query_parameter_names(&doc, DEAD_LETTERS_PATH), parsed);
        let limit = parameters(&doc, DEAD_LETTERS_PATH)
            .into_iter()
            .find(|p| p["name"] == "limit")
            .expect("no limit parameter");
        assert_eq!(limit["schema"]["maximum"], MAX_DEAD_LETTER_PAGE);
    }

    #[test]
    fn the_group_listing_query_parameters_match_the_parser() {
        let doc = document();
        for (path, known) in [(GROUPS_PATH, GROUPS_PARAMS), (GROUP_PATH, GROUP_PARAMS)] {
            let parsed: BTreeSet<String> = known.iter().map(|p| (*p).to_owned()).collect();
            assert_eq!(query_parameter_names(&doc, path), parsed, "{path}");
            let limit = parameters(&doc, path)
                .into_iter()
                .find(|p| p["name"] == "limit")
                .expect("no limit parameter");
            assert_eq!(
                limit["schema"]["maximum"],
                wharf_projections::listing::MAX_PAGE
            );
            assert_eq!(
                limit["schema"]["default"],
                wharf_projections::listing::DEFAULT_PAGE
            );
        }
    }

    #[test]
    fn the_group_view_schema_matches_what_serializes() {
        let doc = document();
        let at = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let view = wharf_projections::GroupView {
            group: "g".into(),
            topic: "t".into(),
            effective: wharf_projections::EffectiveView {
                patterns: Vec::new(),
                whole_topic: true,
                declarer: "d".into(),
                version: "1".into(),
                declared_at: at,
                installed_at: at,
                position: 1,
                installs: 1,
                previous: None,
            },
            waiters: Vec::new(),
            waiters_next_after: None,
            instances: Vec::new(),
            instances_next_after: None,
        };
        let count = wharf_projections::MemberCount {
            count: 1,
            more: false,
        };
        let summary = wharf_projections::GroupSummary {
            group: view.group.clone(),
            topic: view.topic.clone(),
            effective: view.effective.clone(),
            waiters: count,
            oldest_waiter: None,
            instances: 2,
            live_instances: 1,
        };
        let detail = crate::views::GroupDetail::new(view, Vec::new());
        let detail = serde_json::to_value(detail).unwrap_or_default();
        assert_schema_matches(&doc, "GroupView", &detail);
        let entry = crate::views::GroupEntry::join(vec![summary], Vec::new());
        let entry = serde_json::to_value(&entry[0]).unwrap_or_default();
        assert_schema_matches(&doc, "GroupListEntry", &entry);
        assert_schema_matches(&doc, "MemberCount", &entry["waiters"]);
        let list = crate::views::GroupList {
            groups: Vec::new(),
            next_after: None,
        };
        let list = serde_json::to_value(list).unwrap_or_default();
        assert_schema_matches(&doc, "GroupList", &list);
    }

    /// The property names a schema requires, and those it lists, against what serializes.
    fn assert_schema_matches(doc: &Value, schema: &str, serialized: &Value) {
        let fields: BTreeSet<&str> = serialized
            .as_object()
            .unwrap_or_else(|| panic!("{schema}: not an object"))
            .keys()
            .map(String::as_str)
            .collect();
        let node = &resolved(doc, &doc["components"]["schemas"][schema]);
        let required: BTreeSet<&str> = node["required"]
            .as_array()
            .unwrap_or_else(|| panic!("{schema} has no required list"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let listed: BTreeSet<&str> = node["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{schema} has no properties"))
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(required, fields, "{schema}.required");
        assert_eq!(listed, fields, "{schema}.properties");
    }

    /// `node` with `$ref`s followed and an `allOf` merged into one object schema.
    fn resolved(doc: &Value, node: &Value) -> Value {
        if let Some(reference) = node["$ref"].as_str() {
            let target = doc
                .pointer(reference.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("{reference} does not resolve"));
            return resolved(doc, target);
        }
        let Some(parts) = node["allOf"].as_array() else {
            return node.clone();
        };
        let mut properties = serde_json::Map::new();
        let mut required = Vec::new();
        for part in parts.iter().map(|p| resolved(doc, p)) {
            if let Some(listed) = part["properties"].as_object() {
                properties.extend(listed.clone());
            }
            if let Some(names) = part["required"].as_array() {
                required.extend(names.iter().cloned());
            }
        }
        serde_json::json!({ "type": "object", "properties": properties, "required": required })
    }

    #[test]
    fn the_session_schemas_match_what_serializes() {
        let doc = document();
        let live = crate::sessions::LiveSession {
            name: "plant".into(),
            session_id: "ms-0".into(),
            identity: "mqtt://h:1883".into(),
            level: "full".into(),
            ready: true,
            reason: None,
            generation: Some(1),
            pending_stale: Vec::new(),
            last_reconcile: None,
            ingested: 0,
            held: 0,
            dropped_unmatched: 0,
            lease: Some(crate::sessions::LiveLease {
                held: true,
                holder: Some("h:1:a:s1".into()),
                token: Some(1),
                expires_at: None,
                transitions: 1,
            }),
        };
        let history = wharf_projections::ManagedSessionView {
            session_id: "ms-0".into(),
            baseline_source: "cli".into(),
            migration_required: None,
            last_position: 1,
            filters: vec![wharf_projections::ManagedFilterView {
                filter: "a/#".into(),
                state: "granted".into(),
                requested_qos: Some(1),
                granted_qos: Some(1),
                reason_code: None,
                since_position: 1,
                updated_position: 1,
            }],
        };
        let lease = wharf_projections::LeaseRow {
            session_id: "ms-0".into(),
            holder: Some("h:1:a:s1".into()),
            token: 1,
            ttl_ms: Some(45_000),
            expires_at: Some(chrono::DateTime::<chrono::Utc>::UNIX_EPOCH),
            last_sequence: 1,
            last_position: 2,
        };
        let detail = crate::sessions::SessionDetail {
            session_id: "ms-0".into(),
            live: Some(live.clone()),
            history: Some(history.clone()),
            lease: Some(lease.clone()),
        };
        let entry = wharf_projections::SessionHistoryEntry {
            position: 2,
            recorded_at: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
            event: "LeaseAcquired".into(),
            detail: serde_json::json!({}),
            metadata: serde_json::json!({}),
        };
        let page = crate::sessions::SessionEventPage {
            session_id: "ms-0".into(),
            stream: "lease",
            events: vec![entry.clone()],
            next_after: None,
        };
        let as_value = |v: &dyn erased::Serialize| v.to_value();
        assert_schema_matches(&doc, "LiveSession", &as_value(&live));
        assert_schema_matches(&doc, "ManagedSession", &as_value(&history));
        assert_schema_matches(&doc, "ManagedFilter", &as_value(&history.filters[0]));
        assert_schema_matches(&doc, "SessionDetail", &as_value(&detail));
        assert_schema_matches(&doc, "LeaseRow", &as_value(&lease));
        assert_schema_matches(&doc, "SessionEvent", &as_value(&entry));
        assert_schema_matches(&doc, "SessionEventPage", &as_value(&page));
    }

    #[test]
    fn the_deep_health_schemas_match_what_serializes() {
        use crate::deephealth::*;
        let doc = document();
        let at = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let lease = LeaseReport {
            held: true,
            holder: Some("h:1:a".into()),
            token: Some(1),
            expires_at: Some(at),
        };
        let session = DeepSession {
            name: "plant".into(),
            session_id: "ms-0".into(),
            level: "full".into(),
            reason: None,
            generation: Some(1),
            lease: Some(lease.clone()),
        };
        let reload = ReloadSummary {
            outcome: "applied".into(),
            generation: 2,
            trigger: "SIGHUP".into(),
            reason: None,
            at,
        };
        let watch = ConfigWatchReport {
            applied_generation: 2,
            converged_generation: 2,
            degraded: false,
            reason: None,
            strategy: "direct".into(),
            last_reload: Some(reload.clone()),
        };
        let consumer = ConsumerReport {
            group: "g".into(),
            declarer: "h:1:a/1".into(),
            state: "consuming".into(),
            reason: None,
            last_heartbeat: Some(at),
        };
        let report = DeepReport {
            sessions: vec![session.clone()],
            config_watch: Some(watch.clone()),
            consumers: vec![consumer.clone()],
        };
        let (_, body) = render(&report, &Ok(()));
        let as_value = |v: &dyn erased::Serialize| v.to_value();
        assert_schema_matches(&doc, "DeepHealth", &body);
        assert_schema_matches(&doc, "DeepSession", &as_value(&session));
        assert_schema_matches(&doc, "Lease", &as_value(&lease));
        assert_schema_matches(&doc, "ReloadSummary", &as_value(&reload));
        assert_schema_matches(&doc, "ConfigWatch", &as_value(&watch));
        assert_schema_matches(&doc, "ConsumerHealth", &as_value(&consumer));
    }

    /// Serializing test values of several types through one closure.
    mod erased {
        pub trait Serialize {
            fn to_value(&self) -> serde_json::Value;
        }
        impl<T: serde::Serialize> Serialize for T {
            fn to_value(&self) -> serde_json::Value {
                serde_json::to_value(self).unwrap_or_default()
            }
        }
    }

    #[test]
    fn the_queue_schemas_match_what_serializes() {
        let doc = document();
        let queue = serde_json::to_value(GroupQueue::default()).unwrap_or_default();
        assert_schema_matches(&doc, "GroupQueue", &queue);
        let at = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let dead = DeadLetterView {
            topic: "t".into(),
            position: 1,
            subject: "s".into(),
            payload_base64: String::new(),
            headers: wharf_queue::Headers::new(),
            published_at: at,
            attempts: 1,
            last_error: None,
            dead_at: at,
        };
        let dead = serde_json::to_value(dead).unwrap_or_default();
        assert_schema_matches(&doc, "DeadLetter", &dead);
        let topic = wharf_queue::TopicStats {
            topic: "t".into(),
            head: 0,
            size: 0,
        };
        let topic = serde_json::to_value(topic).unwrap_or_default();
        assert_schema_matches(&doc, "TopicStats", &topic);
    }

    #[test]
    fn the_error_schema_lists_every_code() {
        let doc = document();
        let error = resolved(
            &doc,
            &doc["components"]["schemas"]["Error"]["properties"]["error"],
        );
        let listed: BTreeSet<&str> = error["properties"]["code"]["enum"]
            .as_array()
            .expect("Error.error.code has no enum")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let produced = [
            ApiError::invalid("f", "v", "r"),
            ApiError::not_found("x"),
            ApiError::MethodNotAllowed {
                method: "POST".into(),
            },
            ApiError::Unavailable(wharf_store::StoreError::NotMigrated {
                found: 0,
                needed: 1,
            }),
            ApiError::Internal("x".into()),
            ApiError::PayloadTooLarge {
                length: 2,
                limit: 1,
            },
            ApiError::TimedOut {
                after: std::time::Duration::from_secs(1),
            },
        ];
        let produced: BTreeSet<&str> = produced.iter().map(ApiError::code).collect();
        assert_eq!(listed, produced);
    }

    #[test]
    fn every_reference_resolves() {
        let doc = document();
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(!refs.is_empty());
        for reference in refs {
            let pointer = reference
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("{reference} is not a local reference"));
            assert!(
                doc.pointer(pointer).is_some(),
                "{reference} does not resolve"
            );
        }
    }

    /// The parameters of a path's GET, with `$ref`s to shared parameters resolved.
    fn parameters(doc: &Value, path: &str) -> Vec<Value> {
        let mut found = Vec::new();
        let lists = [
            &doc["paths"][path]["parameters"],
            &doc["paths"][path]["get"]["parameters"],
        ];
        for list in lists.into_iter().filter_map(Value::as_array) {
            for parameter in list {
                let resolved = match parameter["$ref"].as_str() {
                    Some(r) => doc
                        .pointer(r.trim_start_matches('#'))
                        .cloned()
                        .unwrap_or(Value::Null),
                    None => parameter.clone(),
                };
                found.push(resolved);
            }
        }
        found
    }

    fn collect_refs(value: &Value, into: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, inner) in map {
                    match (key.as_str(), inner) {
                        ("$ref", Value::String(r)) => into.push(r.clone()),
                        _ => collect_refs(inner, into),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| collect_refs(i, into)),
            _ => {}
        }
    }
}
