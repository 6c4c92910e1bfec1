//! Schema helpers for the REST API's generated OpenAPI document (feature `openapi`, ADR 0031):
//! string fields whose values are a fixed set are documented as enums.

use utoipa::openapi::schema::{Object, ObjectBuilder, Type};

/// A string schema that allows only `values`.
pub fn string_enum(values: &[&str]) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
        .build()
}

/// [`crate::session_views::ManagedFilterView::state`].
pub fn filter_state() -> Object {
    string_enum(&["seeded", "remembered", "granted", "refused"])
}

/// [`crate::audit::HistoryEntry::status`].
pub fn history_status() -> Object {
    string_enum(&["installed", "waiting"])
}
