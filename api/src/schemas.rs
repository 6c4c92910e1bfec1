//! The string schemas the document gives fields and parameters that take one of a few values
//! (a session's level, a reload's outcome, a consumer's state...): the types serve these as
//! plain strings, and `#[schema(schema_with = ...)]` names the values here.

use utoipa::openapi::schema::Object;

/// A string schema allowing only `values`.
fn one_of(values: &[&str]) -> Object {
    wharf_projections::openapi::string_enum(values)
}

/// A session's level (`LiveSession`, `DeepSession`).
pub(crate) fn session_level() -> Object {
    one_of(&[
        "starting",
        "connected",
        "subscribed",
        "full",
        "migration_required",
    ])
}

/// A session stream (`SessionEventPage.stream`).
pub(crate) fn session_stream() -> Object {
    one_of(&["filters", "lease"])
}

/// The `stream` query parameter: a session stream, `filters` by default.
pub(crate) fn stream_parameter() -> Object {
    let mut schema = session_stream();
    schema.default = Some(serde_json::json!("filters"));
    schema
}

/// A reload's outcome.
pub(crate) fn reload_outcome() -> Object {
    one_of(&["applied", "unchanged", "refused", "failed"])
}

/// The supervisor's reload strategy.
pub(crate) fn reload_strategy() -> Object {
    one_of(&["direct", "debounced"])
}

/// A consumer's state in deep health.
pub(crate) fn consumer_state() -> Object {
    one_of(&[
        "declaring",
        "waiting",
        "consuming",
        "stalled",
        "failed",
        "stopped",
    ])
}

pub(crate) fn health_status() -> Object {
    one_of(&["pass", "warn", "fail"])
}

pub(crate) fn pass_only() -> Object {
    one_of(&["pass"])
}
