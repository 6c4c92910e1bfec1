//! The API's one error type and how each case becomes an HTTP response.
//!
//! Every error answers with the same JSON shape:
//! `{"error": {"code": ..., "message": ..., "field": ...}}`, where `field` is present only when
//! one request parameter is at fault. Store details never reach the client: they are logged and
//! the client gets a generic message.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use wharf_domain::ValidationError;
use wharf_projections::ProjectionError;
use wharf_queue::QueueError;
use wharf_store::StoreError;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A path or query parameter is malformed or out of range (400).
    #[error("invalid {field}: {}: {reason}", quoted(.value))]
    InvalidParameter {
        /// The parameter at fault.
        field: String,
        /// The value as given.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// The addressed resource does not exist (404).
    #[error("{message}")]
    NotFound {
        /// What was not found.
        message: String,
    },
    /// The path exists but does not answer this method (405).
    #[error("method {method} is not allowed here; this API is read-only (GET)")]
    MethodNotAllowed {
        /// The method used.
        method: String,
    },
    /// The request declared a body larger than `http.max_body_bytes` (413).
    #[error("the request body of {length} bytes is over the limit of {limit} bytes; this API takes no request bodies")]
    PayloadTooLarge {
        /// The declared `Content-Length`.
        length: u64,
        /// The limit.
        limit: u64,
    },
    /// The request did not finish within `http.request_timeout` (503).
    #[error("the request did not finish within {}", humantime_ms(.after))]
    TimedOut {
        /// The timeout.
        after: std::time::Duration,
    },
    /// The store cannot be reached, or is not migrated yet (503).
    #[error("the store is unavailable")]
    Unavailable(#[source] StoreError),
    /// Anything else that went wrong on the server (500).
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

fn humantime_ms(duration: &std::time::Duration) -> String {
    format!("{} ms", duration.as_millis())
}

/// The value quoted for a message, cut short when very long.
fn quoted(value: &str) -> String {
    const SHOWN: usize = 120;
    if value.chars().count() <= SHOWN {
        format!("{value:?}")
    } else {
        let head: String = value.chars().take(SHOWN).collect();
        format!("{head:?}...")
    }
}

/// The machine-readable codes of the error body.
const CODE_INVALID: &str = "invalid_parameter";
const CODE_NOT_FOUND: &str = "not_found";
const CODE_METHOD: &str = "method_not_allowed";
const CODE_UNAVAILABLE: &str = "unavailable";
const CODE_TOO_LARGE: &str = "payload_too_large";
const CODE_TIMEOUT: &str = "timeout";
const CODE_INTERNAL: &str = "internal";

impl ApiError {
    /// A 400 for `field` holding `value`.
    pub fn invalid(field: &str, value: &str, reason: impl Into<String>) -> Self {
        Self::InvalidParameter {
            field: field.to_owned(),
            value: value.to_owned(),
            reason: reason.into(),
        }
    }

    /// A 404 with `message`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::NotFound {
            message: message.into(),
        }
    }

    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidParameter { .. } => StatusCode::BAD_REQUEST,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::TimedOut { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `code` of the error body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidParameter { .. } => CODE_INVALID,
            Self::NotFound { .. } => CODE_NOT_FOUND,
            Self::MethodNotAllowed { .. } => CODE_METHOD,
            Self::PayloadTooLarge { .. } => CODE_TOO_LARGE,
            Self::TimedOut { .. } => CODE_TIMEOUT,
            Self::Unavailable(_) => CODE_UNAVAILABLE,
            Self::Internal(_) => CODE_INTERNAL,
        }
    }

    /// The parameter at fault, when there is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::InvalidParameter { field, .. } => Some(field),
            _ => None,
        }
    }

    /// The message the client sees: the full text for client errors, a generic sentence for
    /// server errors (whose detail only goes to the log).
    pub fn public_message(&self) -> String {
        match self {
            Self::Unavailable(_) => {
                "the store is unavailable or not migrated; retry later".to_owned()
            }
            Self::Internal(_) => "internal error; the server log has the details".to_owned(),
            other => other.to_string(),
        }
    }
}

/// True when a store error means the store cannot serve at all right now.
fn store_unavailable(error: &StoreError) -> bool {
    match error {
        StoreError::NotMigrated { .. } => true,
        StoreError::Projection { source, .. } => store_unavailable(source),
        other => other.is_unavailable(),
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        if store_unavailable(&error) {
            Self::Unavailable(error)
        } else {
            Self::Internal(Box::new(error))
        }
    }
}

impl From<ProjectionError> for ApiError {
    fn from(error: ProjectionError) -> Self {
        match error {
            ProjectionError::InvalidParameter {
                field,
                value,
                reason,
            } => Self::invalid(field, &value, reason),
            ProjectionError::Store(e) => e.into(),
        }
    }
}

impl From<ValidationError> for ApiError {
    fn from(error: ValidationError) -> Self {
        Self::InvalidParameter {
            field: error.field,
            value: error.value,
            reason: error.reason,
        }
    }
}

impl From<QueueError> for ApiError {
    fn from(error: QueueError) -> Self {
        match error {
            QueueError::Invalid(e) => e.into(),
            QueueError::UnknownGroup(group) => {
                Self::not_found(format!("group {group:?} was never declared"))
            }
            QueueError::Store(e) => e.into(),
            // The read-only API never claims; a fence here is a bug, not the client's fault.
            fenced @ QueueError::Fenced { .. } => Self::Internal(Box::new(fenced)),
        }
    }
}

/// Every `code` an error body can carry, in the order the document lists them.
pub(crate) const ERROR_CODES: [&str; 7] = [
    CODE_INVALID,
    CODE_NOT_FOUND,
    CODE_METHOD,
    CODE_TOO_LARGE,
    CODE_TIMEOUT,
    CODE_UNAVAILABLE,
    CODE_INTERNAL,
];

/// The body of every error response, including unknown paths (404) and methods other than GET
/// (405).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ErrorDetail {
    #[schema(value_type = String, schema_with = error_code)]
    code: &'static str,
    /// Human-readable explanation.
    message: String,
    /// The request parameter at fault; present only for invalid_parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    field: Option<String>,
}

fn error_code() -> utoipa::openapi::schema::Object {
    wharf_projections::openapi::string_enum(&ERROR_CODES)
}

/// Writes an error and its whole chain of causes on one line, for the log.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::Unavailable(_) => tracing::warn!(error = %chain(&self), "store unavailable"),
            Self::Internal(_) => tracing::error!(error = %chain(&self), "request failed"),
            Self::TimedOut { .. } => tracing::warn!(error = %self, "request timed out"),
            _ => tracing::debug!(error = %self, "request refused"),
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.public_message(),
                field: self.field().map(str::to_owned),
            },
        };
        (self.status(), Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projection_parameter_errors_keep_their_field() {
        let error: ApiError = ProjectionError::InvalidParameter {
            field: "limit",
            value: "0".into(),
            reason: "must be between 1 and 1000",
        }
        .into();
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
        assert_eq!(error.field(), Some("limit"));
        assert!(error.public_message().contains("\"0\""));
    }

    #[test]
    fn store_errors_split_into_unavailable_and_internal() {
        let not_migrated: ApiError = StoreError::NotMigrated {
            found: 0,
            needed: 3,
        }
        .into();
        assert_eq!(not_migrated.status(), StatusCode::SERVICE_UNAVAILABLE);

        let wrapped: ApiError =
            StoreError::in_projector("p", StoreError::Postgres(sqlx_like_unavailable())).into();
        assert_eq!(wrapped.code(), "unavailable");

        let internal: ApiError = StoreError::decode(7, "secret detail").into();
        assert_eq!(internal.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!internal.public_message().contains("secret"));
        assert!(chain(&internal).contains("secret detail"));
    }

    #[test]
    fn queue_errors_map_like_their_causes() {
        let invalid: ApiError =
            QueueError::Invalid(ValidationError::new("limit", "0", "too small")).into();
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
        assert_eq!(invalid.field(), Some("limit"));

        let unknown: ApiError = QueueError::UnknownGroup("billing".into()).into();
        assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
        assert!(unknown.public_message().contains("billing"));

        let unavailable: ApiError =
            QueueError::Store(StoreError::Postgres(sqlx_like_unavailable())).into();
        assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);

        let internal: ApiError = QueueError::Store(StoreError::decode(3, "secret")).into();
        assert_eq!(internal.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!internal.public_message().contains("secret"));
    }

    fn sqlx_like_unavailable() -> sqlx::Error {
        sqlx::Error::PoolTimedOut
    }
}
