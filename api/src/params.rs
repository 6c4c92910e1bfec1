//! Parsing the query parameters of the paged listings (declarations, dead letters, swaps).
//!
//! Done by hand rather than by a typed `Query` extractor, so that every refusal is the JSON
//! error body naming the parameter and the value it had, and so that unknown or repeated
//! parameters are refused instead of silently ignored.

use chrono::{DateTime, Utc};
use wharf_domain::{DeclarerId, GroupName, TopicName};
use wharf_projections::audit::MAX_PAGE;
use wharf_projections::{
    GroupCursor, GroupQuery, HistoryQuery, InstanceCursor, MemberQuery, SessionStream, WaiterCursor,
};

use crate::error::ApiError;

/// The query parameters `GET /api/v1/groups/{group}/declarations` understands.
pub const HISTORY_PARAMS: &[&str] = &["since", "until", "declarer", "after", "limit"];

/// The query parameters `GET /api/v1/groups/{group}/dead-letters` understands.
pub const DEAD_LETTER_PARAMS: &[&str] = &["after", "limit"];

/// The query parameters `GET /api/v1/groups/{group}/swaps` understands.
pub const SWAP_PARAMS: &[&str] = &["limit"];

/// The query parameters `GET /api/v1/sessions/{session}/events` understands.
pub const SESSION_EVENT_PARAMS: &[&str] = &["stream", "after", "limit"];

/// The query parameters `GET /api/v1/groups` understands.
pub const GROUPS_PARAMS: &[&str] = &["after", "limit", "topic", "waiting"];

/// The query parameters `GET /api/v1/groups/{group}` understands.
pub const GROUP_PARAMS: &[&str] = &["limit", "waiters_after", "instances_after"];

/// How many swaps `GET /api/v1/groups/{group}/swaps` lists when `limit` is not given.
pub const DEFAULT_SWAPS: u32 = 20;

/// How many entries a page holds when `limit` is not given.
pub const DEFAULT_LIMIT: u32 = 100;

/// The largest dead-letter page.
pub const MAX_DEAD_LETTER_PAGE: u32 = 1_000;

/// Builds the history query for `group` from the raw `(name, value)` pairs of the query string.
pub fn history_query(
    group: GroupName,
    pairs: &[(String, String)],
) -> Result<HistoryQuery, ApiError> {
    let mut query = HistoryQuery::all(group);
    query.limit = DEFAULT_LIMIT;
    let mut raw_since: Option<&str> = None;
    for (known, value) in known_params(pairs, HISTORY_PARAMS)? {
        match known {
            "since" => {
                query.since = Some(timestamp(known, value)?);
                raw_since = Some(value);
            }
            "until" => query.until = Some(timestamp(known, value)?),
            "declarer" => query.declarer = Some(DeclarerId::parse(known, value)?.to_string()),
            "after" => query.after = position(known, value, "ledger")?,
            _ => query.limit = limit(known, value, MAX_PAGE)?,
        }
    }
    if let (Some(since), Some(until)) = (query.since, query.until) {
        if until <= since {
            let given = pairs
                .iter()
                .find(|(name, _)| name == "until")
                .map_or(String::new(), |(_, value)| value.clone());
            return Err(ApiError::invalid(
                "until",
                &given,
                format!(
                    "must be later than since ({})",
                    raw_since.unwrap_or_default()
                ),
            ));
        }
    }
    query.validate()?;
    Ok(query)
}

/// Builds the listing page request from the raw `(name, value)` pairs of the query string.
pub fn groups_query(pairs: &[(String, String)]) -> Result<GroupQuery, ApiError> {
    let mut query = GroupQuery::default();
    for (known, value) in known_params(pairs, GROUPS_PARAMS)? {
        match known {
            "after" => query.after = Some(GroupCursor::decode(known, value)?),
            "topic" => query.topic = Some(TopicName::parse(known, value)?),
            "waiting" => query.waiting = boolean(known, value)?,
            _ => query.limit = limit(known, value, MAX_PAGE)?,
        }
    }
    Ok(query)
}

/// Builds the member page request of one group from the raw `(name, value)` pairs.
pub fn member_query(pairs: &[(String, String)]) -> Result<MemberQuery, ApiError> {
    let mut query = MemberQuery::default();
    for (known, value) in known_params(pairs, GROUP_PARAMS)? {
        match known {
            "waiters_after" => query.waiters_after = Some(WaiterCursor::decode(known, value)?),
            "instances_after" => {
                query.instances_after = Some(InstanceCursor::decode(known, value)?)
            }
            _ => query.limit = limit(known, value, MAX_PAGE)?,
        }
    }
    Ok(query)
}

/// Parses `true` or `false`.
fn boolean(field: &str, raw: &str) -> Result<bool, ApiError> {
    match raw {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(ApiError::invalid(field, raw, "must be true or false")),
    }
}

/// A page request of a group's dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetterQuery {
    /// Only dead letters after this topic position (the previous page's `next_after`).
    pub after: i64,
    /// At most this many (1 to [`MAX_DEAD_LETTER_PAGE`]).
    pub limit: u32,
}

impl Default for DeadLetterQuery {
    fn default() -> Self {
        Self {
            after: 0,
            limit: DEFAULT_LIMIT,
        }
    }
}

/// Builds the dead-letter page request from the raw `(name, value)` pairs of the query string.
pub fn dead_letter_query(pairs: &[(String, String)]) -> Result<DeadLetterQuery, ApiError> {
    let mut query = DeadLetterQuery::default();
    for (known, value) in known_params(pairs, DEAD_LETTER_PARAMS)? {
        match known {
            "after" => query.after = position(known, value, "log")?,
            _ => query.limit = limit(known, value, MAX_DEAD_LETTER_PAGE)?,
        }
    }
    Ok(query)
}

/// A page request of one of a session's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionEventQuery {
    /// Which stream (`filters` by default).
    pub stream: SessionStream,
    /// Only events after this ledger position (the previous page's `next_after`).
    pub after: i64,
    /// At most this many (1 to [`MAX_DEAD_LETTER_PAGE`]).
    pub limit: u32,
}

/// Builds a session-events page request from the raw `(name, value)` pairs of the query string.
pub fn session_events_query(pairs: &[(String, String)]) -> Result<SessionEventQuery, ApiError> {
    let mut query = SessionEventQuery {
        stream: SessionStream::Filters,
        after: 0,
        limit: DEFAULT_LIMIT,
    };
    for (known, value) in known_params(pairs, SESSION_EVENT_PARAMS)? {
        match known {
            "stream" => {
                query.stream = SessionStream::parse(value).ok_or_else(|| {
                    ApiError::invalid(known, value, "must be \"filters\" or \"lease\"")
                })?
            }
            "after" => query.after = position(known, value, "ledger")?,
            _ => query.limit = limit(known, value, MAX_DEAD_LETTER_PAGE)?,
        }
    }
    Ok(query)
}

/// The number of swaps to list, from the raw `(name, value)` pairs of the query string.
pub fn swaps_limit(pairs: &[(String, String)]) -> Result<u32, ApiError> {
    let mut wanted = DEFAULT_SWAPS;
    for (known, value) in known_params(pairs, SWAP_PARAMS)? {
        wanted = limit(known, value, MAX_DEAD_LETTER_PAGE)?;
    }
    Ok(wanted)
}

/// Pairs each parameter with its name from `known`, refusing unknown names and names given
/// more than once (the first offender, in query-string order).
fn known_params<'a>(
    pairs: &'a [(String, String)],
    known: &[&'static str],
) -> Result<Vec<(&'static str, &'a str)>, ApiError> {
    let mut seen: Vec<(&'static str, &'a str)> = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        let Some(param) = known.iter().copied().find(|p| p == name) else {
            return Err(ApiError::invalid(
                name,
                value,
                format!("unknown parameter; expected one of {}", known.join(", ")),
            ));
        };
        if seen.iter().any(|(p, _)| *p == param) {
            return Err(ApiError::invalid(name, value, "given more than once"));
        }
        seen.push((param, value));
    }
    Ok(seen)
}

/// Parses an RFC 3339 timestamp.
///
/// A `+hh:mm` offset sent without percent-encoding arrives as a space (form decoding turns `+`
/// into a space); that one case is repaired rather than refused.
fn timestamp(field: &str, raw: &str) -> Result<DateTime<Utc>, ApiError> {
    let parse = |text: &str| DateTime::parse_from_rfc3339(text).map(|t| t.with_timezone(&Utc));
    if let Ok(at) = parse(raw) {
        return Ok(at);
    }
    let bytes = raw.as_bytes();
    if bytes.len() > 6 && bytes[bytes.len() - 6] == b' ' {
        let repaired = format!("{}+{}", &raw[..raw.len() - 6], &raw[raw.len() - 5..]);
        if let Ok(at) = parse(&repaired) {
            return Ok(at);
        }
    }
    Err(ApiError::invalid(
        field,
        raw,
        "must be an RFC 3339 timestamp such as 2024-05-01T12:00:00Z (send '+' as %2B)",
    ))
}

/// Parses a position (0 or more) of the `kind` of log named ("ledger" or "log").
fn position(field: &str, raw: &str, kind: &str) -> Result<i64, ApiError> {
    match raw.parse::<i64>() {
        Ok(at) if at >= 0 => Ok(at),
        _ => Err(ApiError::invalid(
            field,
            raw,
            format!("must be a {kind} position: an integer, 0 or more"),
        )),
    }
}

/// Parses a page size (1 to `max`).
fn limit(field: &str, raw: &str, max: u32) -> Result<u32, ApiError> {
    match raw.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(ApiError::invalid(
            field,
            raw,
            format!("must be an integer from 1 to {max}"),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// What the parsers above accept, as the OpenAPI document states it (ADR 0031). The structs are
// never built: they carry each parameter's name, type, bounds and description into the
// generated document, and the tests in `openapi.rs` hold their names and bounds to the
// parsers' own lists and constants.
// ---------------------------------------------------------------------------------------------

/// The `{group}` path segment.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct GroupPathDoc {
    /// The consumer group's name: 1 to 255 ASCII letters, digits, '.', '_' or '-'.
    #[param(pattern = r"^[A-Za-z0-9._-]{1,255}$")]
    group: String,
}

/// The `{session}` path segment.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct SessionPathDoc {
    /// A configured session name or a durable session identity (`ms-` and 32 hex digits).
    session: String,
}

/// [`HISTORY_PARAMS`].
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct HistoryParamsDoc {
    /// Only entries the ledger recorded at or after this time (RFC 3339, e.g.
    /// `2024-05-01T12:00:00Z`; send '+' in an offset as %2B).
    #[param(required = false)]
    since: DateTime<Utc>,
    /// Only entries the ledger recorded before this time (RFC 3339). Must be later than
    /// `since` when both are given: otherwise 400 naming `until`.
    #[param(required = false)]
    until: DateTime<Utc>,
    /// Only this declarer's entries (exact match): 1 to 255 bytes, not blank.
    #[param(required = false, min_length = 1, max_length = 255, pattern = r"\S")]
    declarer: String,
    /// Only entries after this ledger position: the previous page's `next_after`.
    #[param(required = false, minimum = 0, default = 0)]
    after: i64,
    /// At most this many entries (1 to 1000; default 100).
    #[param(required = false, minimum = 1, maximum = 1000, default = 100)]
    limit: u32,
}

/// [`DEAD_LETTER_PARAMS`].
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct DeadLetterParamsDoc {
    /// Only dead letters after this topic position: the previous page's `next_after`.
    #[param(required = false, minimum = 0, default = 0)]
    after: i64,
    /// At most this many dead letters (1 to 1000; default 100).
    #[param(required = false, minimum = 1, maximum = 1000, default = 100)]
    limit: u32,
}

/// [`SWAP_PARAMS`].
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct SwapParamsDoc {
    /// How many swaps to list (1 to 1000; default 20).
    #[param(required = false, minimum = 1, maximum = 1000, default = 20)]
    limit: u32,
}

/// [`SESSION_EVENT_PARAMS`].
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct SessionEventParamsDoc {
    /// `filters` (the managed-filter ledger, the default) or `lease` (the HA lease).
    #[param(required = false, schema_with = crate::schemas::stream_parameter)]
    stream: String,
    /// Only events after this ledger position (the previous page's `next_after`).
    #[param(required = false, minimum = 0, default = 0)]
    after: i64,
    /// At most this many events (1 to 1000; default 100).
    #[param(required = false, minimum = 1, maximum = 1000, default = 100)]
    limit: u32,
}

/// [`GROUPS_PARAMS`].
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct GroupsParamsDoc {
    /// Only groups after this cursor: the previous page's `next_after`, passed verbatim.
    /// Cursors are opaque and hold no server state: one stays valid across restarts and on any
    /// instance. Anything else is refused with 400 naming `after`.
    #[param(required = false, min_length = 1)]
    after: String,
    /// At most this many groups (1 to 1000; default 100).
    #[param(required = false, minimum = 1, maximum = 1000, default = 100)]
    limit: u32,
    /// Only groups consuming this topic.
    #[param(required = false, pattern = r"^[A-Za-z0-9._-]{1,255}$")]
    topic: String,
    /// `true`: only groups with at least one open waiter; `false` (the default): every group.
    /// Anything else is refused with 400 naming `waiting`.
    #[param(required = false, default = false)]
    waiting: bool,
}

/// [`GROUP_PARAMS`].
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct GroupParamsDoc {
    /// At most this many waiters, and at most this many instances (1 to 1000; default 100).
    #[param(required = false, minimum = 1, maximum = 1000, default = 100)]
    limit: u32,
    /// Only waiters after this cursor: a previous answer's `waiters_next_after`, passed
    /// verbatim (opaque; anything else is refused with 400 naming `waiters_after`).
    #[param(required = false, min_length = 1)]
    waiters_after: String,
    /// Only instances after this cursor: a previous answer's `instances_next_after`, passed
    /// verbatim (opaque; anything else is refused with 400 naming `instances_after`).
    #[param(required = false, min_length = 1)]
    instances_after: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> GroupName {
        GroupName::parse("group", "billing").unwrap()
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn refused_field(items: &[(&str, &str)]) -> String {
        match history_query(group(), &pairs(items)) {
            Err(ApiError::InvalidParameter { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn no_parameters_give_the_first_default_page() {
        let query = history_query(group(), &[]).unwrap();
        assert_eq!(query, HistoryQuery::all(group()));
        assert_eq!(query.limit, DEFAULT_LIMIT);
    }

    #[test]
    fn every_parameter_is_read() {
        let query = history_query(
            group(),
            &pairs(&[
                ("since", "2024-01-01T00:00:00Z"),
                ("until", "2024-01-02T00:00:00 02:00"),
                ("declarer", "host:1:ab"),
                ("after", "17"),
                ("limit", "5"),
            ]),
        )
        .unwrap();
        assert_eq!(
            query.since.unwrap().to_rfc3339(),
            "2024-01-01T00:00:00+00:00"
        );
        assert_eq!(
            query.until.unwrap().to_rfc3339(),
            "2024-01-01T22:00:00+00:00"
        );
        assert_eq!(query.declarer.as_deref(), Some("host:1:ab"));
        assert_eq!((query.after, query.limit), (17, 5));
    }

    #[test]
    fn each_bad_parameter_is_named() {
        assert_eq!(refused_field(&[("since", "yesterday")]), "since");
        assert_eq!(refused_field(&[("until", "2024-13-01T00:00:00Z")]), "until");
        assert_eq!(refused_field(&[("after", "x")]), "after");
        assert_eq!(refused_field(&[("after", "-1")]), "after");
        assert_eq!(refused_field(&[("limit", "0")]), "limit");
        assert_eq!(refused_field(&[("limit", "1001")]), "limit");
        assert_eq!(refused_field(&[("limit", "2.5")]), "limit");
        assert_eq!(refused_field(&[("declarer", " ")]), "declarer");
        assert_eq!(refused_field(&[("page", "2")]), "page");
        assert_eq!(refused_field(&[("limit", "1"), ("limit", "2")]), "limit");
        assert_eq!(
            refused_field(&[
                ("since", "2024-01-02T00:00:00Z"),
                ("until", "2024-01-02T00:00:00Z"),
            ]),
            "until"
        );
    }

    fn dead_letter_refused_field(items: &[(&str, &str)]) -> String {
        match dead_letter_query(&pairs(items)) {
            Err(ApiError::InvalidParameter { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn dead_letter_paging_is_read_with_defaults() {
        assert_eq!(
            dead_letter_query(&[]).unwrap(),
            DeadLetterQuery {
                after: 0,
                limit: DEFAULT_LIMIT
            }
        );
        assert_eq!(
            dead_letter_query(&pairs(&[("limit", "1000"), ("after", "42")])).unwrap(),
            DeadLetterQuery {
                after: 42,
                limit: 1000
            }
        );
    }

    #[test]
    fn each_bad_dead_letter_parameter_is_named() {
        assert_eq!(dead_letter_refused_field(&[("limit", "0")]), "limit");
        assert_eq!(dead_letter_refused_field(&[("limit", "1001")]), "limit");
        assert_eq!(dead_letter_refused_field(&[("limit", "")]), "limit");
        assert_eq!(dead_letter_refused_field(&[("after", "-1")]), "after");
        assert_eq!(dead_letter_refused_field(&[("after", "1e3")]), "after");
        assert_eq!(dead_letter_refused_field(&[("since", "x")]), "since");
        assert_eq!(
            dead_letter_refused_field(&[("after", "1"), ("after", "2")]),
            "after"
        );
    }

    fn groups_refused_field(items: &[(&str, &str)]) -> String {
        match groups_query(&pairs(items)) {
            Err(ApiError::InvalidParameter { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_group_listing_parameters_are_read_and_bad_ones_named() {
        assert_eq!(groups_query(&[]).unwrap(), GroupQuery::default());
        let cursor = GroupCursor(group()).encode();
        let query = groups_query(&pairs(&[
            ("after", &cursor),
            ("limit", "1000"),
            ("topic", "orders"),
            ("waiting", "true"),
        ]))
        .unwrap();
        assert_eq!(query.after, Some(GroupCursor(group())));
        assert_eq!(query.limit, 1000);
        assert_eq!(query.topic.unwrap().as_str(), "orders");
        assert!(query.waiting);
        assert_eq!(groups_refused_field(&[("after", "billing")]), "after");
        assert_eq!(groups_refused_field(&[("limit", "0")]), "limit");
        assert_eq!(groups_refused_field(&[("limit", "1001")]), "limit");
        assert_eq!(groups_refused_field(&[("topic", "a/b")]), "topic");
        assert_eq!(groups_refused_field(&[("waiting", "yes")]), "waiting");
        assert_eq!(groups_refused_field(&[("page", "2")]), "page");
    }

    #[test]
    fn the_member_parameters_are_read_and_bad_ones_named() {
        let waiter = WaiterCursor {
            declared_at_micros: 7,
            declarer: "d".to_owned(),
        };
        let query = member_query(&pairs(&[
            ("limit", "5"),
            ("waiters_after", &waiter.encode()),
        ]))
        .unwrap();
        assert_eq!(
            (query.limit, query.waiters_after),
            (5, Some(waiter.clone()))
        );
        let refused = |items: &[(&str, &str)]| match member_query(&pairs(items)) {
            Err(ApiError::InvalidParameter { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        };
        // A waiter cursor is not an instance cursor.
        assert_eq!(
            refused(&[("instances_after", &waiter.encode())]),
            "instances_after"
        );
        assert_eq!(refused(&[("waiters_after", "x")]), "waiters_after");
        assert_eq!(refused(&[("limit", "-1")]), "limit");
        assert_eq!(refused(&[("after", "x")]), "after");
    }

    #[test]
    fn the_refusal_quotes_the_value_given() {
        let error = history_query(group(), &pairs(&[("limit", "abc")])).unwrap_err();
        assert!(error.to_string().contains("\"abc\""), "{error}");
    }
}
