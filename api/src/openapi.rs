//! The OpenAPI 3.1 document that describes this API.
//!
//! It is written by hand in `api/openapi.json` and embedded at build time; the tests below keep
//! it honest against the router's route table, the paged listings' parameters, the queue schemas
//! and the error codes.

/// The document, served as is at `GET /api/v1/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::OPENAPI_JSON;
    use crate::error::ApiError;
    use crate::handlers::{routes, DEAD_LETTERS_PATH, DECLARATIONS_PATH, GROUPS_PATH, GROUP_PATH};
    use crate::params::{
        DEAD_LETTER_PARAMS, GROUPS_PARAMS, GROUP_PARAMS, HISTORY_PARAMS, MAX_DEAD_LETTER_PAGE,
    };
    use crate::views::{DeadLetterView, GroupQueue};

    fn document() -> Value {
        serde_json::from_str(OPENAPI_JSON).expect("api/openapi.json is not valid JSON")
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
    fn the_document_is_openapi_3_1() {
        let doc = document();
        let version = doc["openapi"].as_str().unwrap_or_default();
        assert!(version.starts_with("3.1."), "openapi is {version:?}");
        assert!(doc["info"]["title"].is_string());
        assert!(doc["info"]["version"].is_string());
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
        let detail = crate::views::GroupDetail::new(view, Vec::new());
        let detail = serde_json::to_value(detail).unwrap_or_default();
        assert_schema_matches(&doc, "GroupView", &detail);
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
        let node = &doc["components"]["schemas"][schema];
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
        let listed: BTreeSet<&str> = doc["components"]["schemas"]["Error"]["properties"]["error"]
            ["properties"]["code"]["enum"]
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
