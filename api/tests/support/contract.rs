//! Every response the API tests receive is checked against the generated OpenAPI document
//! (ADR 0031): the operation for its path and method, the response for its status, the content
//! for its media type, and the JSON body against that content's schema, `$ref`s resolved into
//! `components`. A path no operation serves is answered with the `Error` schema (404, or 405 for
//! another method), as the document's description says.

use std::sync::OnceLock;

use serde_json::{json, Value};

fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        serde_json::from_str(wharf_api::openapi::document_json())
            .expect("the generated document is JSON")
    })
}

/// The document template that `path` (no query) matches: a literal segment beats a template
/// variable, which matches any one non-empty segment.
fn template_of<'d>(doc: &'d Value, path: &str) -> Option<&'d str> {
    let wanted: Vec<&str> = path.split('/').collect();
    let mut best: Option<(&str, usize)> = None;
    for template in doc["paths"].as_object()?.keys() {
        let parts: Vec<&str> = template.split('/').collect();
        if parts.len() != wanted.len() {
            continue;
        }
        let mut variables = 0;
        let fits = parts.iter().zip(&wanted).all(|(t, w)| {
            if t.starts_with('{') && t.ends_with('}') {
                variables += 1;
                !w.is_empty()
            } else {
                t == w
            }
        });
        if fits && best.is_none_or(|(_, v)| variables < v) {
            best = Some((template.as_str(), variables));
        }
    }
    best.map(|(t, _)| t)
}

/// Validates `body` against `schema` resolved in `doc`.
fn validate_against(doc: &Value, schema: &Value, body: &Value) -> Result<(), String> {
    let mut root = schema.clone();
    let Some(object) = root.as_object_mut() else {
        return Err(format!("schema {schema} is not an object"));
    };
    object.insert("components".into(), doc["components"].clone());
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&root)
        .map_err(|e| format!("the document's schema does not compile: {e}"))?;
    let violations: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("at {:?}: {e}", e.instance_path().as_str()))
        .collect();
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}

/// Follows a `$ref` to `components/responses`.
fn resolve<'d>(doc: &'d Value, node: &'d Value) -> &'d Value {
    match node["$ref"].as_str() {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or(&Value::Null),
        None => node,
    }
}

/// Whether `actual` (a `Content-Type` header) is the documented media type `documented`: the
/// same type and subtype, and every parameter the document names (`version=0.0.4`) present.
fn same_media(documented: &str, actual: &str) -> bool {
    let parts = |s: &str| -> Vec<String> {
        s.split(';')
            .map(|p| p.trim().to_ascii_lowercase())
            .filter(|p| !p.is_empty())
            .collect()
    };
    let (documented, actual) = (parts(documented), parts(actual));
    match (documented.split_first(), actual.split_first()) {
        (Some((d, d_params)), Some((a, a_params))) => {
            d == a && d_params.iter().all(|p| a_params.contains(p))
        }
        _ => false,
    }
}

/// Checks one response against the document; the error names what does not conform.
pub fn check(
    method: &str,
    path_and_query: &str,
    status: u16,
    content_type: &str,
    body: &str,
) -> Result<(), String> {
    check_in(
        document(),
        method,
        path_and_query,
        status,
        content_type,
        body,
    )
}

pub(crate) fn check_in(
    doc: &Value,
    method: &str,
    path_and_query: &str,
    status: u16,
    content_type: &str,
    body: &str,
) -> Result<(), String> {
    let path = path_and_query.split('?').next().unwrap_or_default();
    let operation = template_of(doc, path)
        .map(|t| (t, &doc["paths"][t][method.to_ascii_lowercase()]))
        .filter(|(_, op)| op.is_object());
    let Some((template, operation)) = operation else {
        let expected = if template_of(doc, path).is_some() {
            405
        } else {
            404
        };
        if status != expected {
            return Err(format!(
                "no operation serves it, yet the status is {status}, not {expected}"
            ));
        }
        let parsed: Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
        return validate_against(
            doc,
            &json!({ "$ref": "#/components/schemas/Error" }),
            &parsed,
        );
    };
    let response = operation["responses"]
        .get(status.to_string())
        .map(|r| resolve(doc, r))
        .ok_or_else(|| format!("{template} documents no {status} response"))?;
    let Some(contents) = response["content"].as_object() else {
        return Err(format!("{template} {status} documents no content"));
    };
    let (media, content) = contents
        .iter()
        .find(|(media, _)| same_media(media, content_type))
        .ok_or_else(|| {
            format!(
                "content-type {content_type:?} is not documented for {template} {status} (documented: {:?})",
                contents.keys().collect::<Vec<_>>()
            )
        })?;
    let json_media = media == "application/json" || media.ends_with("+json");
    if !json_media {
        return match content["schema"]["type"].as_str() {
            Some("string") => Ok(()),
            _ => Err(format!(
                "{template} {status} {media}: only string schemas are checked"
            )),
        };
    }
    let parsed: Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    validate_against(doc, &content["schema"], &parsed)
        .map_err(|violation| format!("{template} {status} {media}: {violation}"))
}

/// Panics, naming the request and the violation, when a response does not conform.
pub fn assert_conforms(
    method: &str,
    path_and_query: &str,
    status: u16,
    content_type: &str,
    body: &str,
) {
    if let Err(violation) = check(method, path_and_query, status, content_type, body) {
        panic!("{method} {path_and_query} -> {status}: the response does not match the OpenAPI document: {violation}\nbody: {body}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPICS: &str = "/api/v1/topics";

    #[test]
    fn a_conforming_body_passes() {
        let body = r#"{"topics":[{"topic":"orders","head":3,"size":2}]}"#;
        check("GET", TOPICS, 200, "application/json", body).unwrap();
    }

    #[test]
    fn a_deliberate_mismatch_fails_naming_the_violation() {
        // `head` as a string, `size` missing.
        let body = r#"{"topics":[{"topic":"orders","head":"3"}]}"#;
        let violation = check("GET", TOPICS, 200, "application/json", body).unwrap_err();
        assert!(violation.contains("/topics/0/head"), "{violation}");
        assert!(violation.contains("size"), "{violation}");
        let missing = check("GET", TOPICS, 200, "application/json", "{}").unwrap_err();
        assert!(missing.contains("topics"), "{missing}");
    }

    #[test]
    fn an_undocumented_status_or_media_type_fails() {
        let error = r#"{"error":{"code":"not_found","message":"x"}}"#;
        let status = check("GET", TOPICS, 404, "application/json", error).unwrap_err();
        assert!(status.contains("no 404"), "{status}");
        let media = check("GET", "/readyz", 200, "text/html", "{}").unwrap_err();
        assert!(media.contains("text/html"), "{media}");
        let version = check("GET", "/metrics", 200, "text/plain; version=0.0.5", "").unwrap_err();
        assert!(version.contains("0.0.5"), "{version}");
        let reordered = "text/plain; charset=utf-8; version=0.0.4";
        check("GET", "/metrics", 200, reordered, "").unwrap();
    }

    #[test]
    fn an_unknown_code_or_path_is_held_to_the_error_schema() {
        let bad_code = r#"{"error":{"code":"teapot","message":"x"}}"#;
        let violation = check("GET", "/nope", 404, "application/json", bad_code).unwrap_err();
        assert!(violation.contains("teapot"), "{violation}");
        let ok = r#"{"error":{"code":"not_found","message":"no endpoint"}}"#;
        check("GET", "/nope", 404, "application/json", ok).unwrap();
        check("GET", "/nope", 200, "application/json", ok).unwrap_err();
        let wrong = r#"{"error":{"code":"method_not_allowed","message":"POST"}}"#;
        check("POST", "/api/v1/groups", 405, "application/json", wrong).unwrap();
    }

    #[test]
    fn a_template_variable_matches_one_segment_and_literals_win() {
        let doc = document();
        assert_eq!(
            template_of(doc, "/api/v1/groups/billing"),
            Some("/api/v1/groups/{group}")
        );
        assert_eq!(template_of(doc, "/api/v1/groups"), Some("/api/v1/groups"));
        assert_eq!(template_of(doc, "/api/v1/groups/"), None);
        assert_eq!(
            template_of(doc, "/api/v1/groups/g/swaps"),
            Some("/api/v1/groups/{group}/swaps")
        );
    }
}
