//! The managed-session projector (inline): each durable session identity's exact history.
//!
//! `managed_session` has a row once a baseline was seeded (no row: the history is unknown);
//! `managed_filter` holds every filter that may exist at the broker for it, with the newest
//! SUBACK outcome. A `FiltersForgotten` removes its rows. On Postgres the rows ride in the event's
//! insert statement (one round trip per event); a rebuild replays through `apply`.

use async_trait::async_trait;
use rusqlite::{params, Transaction};
use sqlx::PgConnection;
use wharf_domain::session::{
    ExactFilter, ForgottenFilter, ManagedFilterEvent, Qos, RememberedFilter, SubAckEntry,
    SubscribeOutcome, MANAGED_SESSION_AGGREGATE,
};
use wharf_store::{
    CteStatement, EventRef, PgProjector, RecordedEvent, SqliteProjector, StoreError,
};

/// Inline projector of `managed_session` and `managed_filter`.
pub struct ManagedSessions;

impl ManagedSessions {
    /// The projector's name.
    pub const NAME: &'static str = "managed_sessions";
    const TABLES: &'static [&'static str] = &["managed_session", "managed_filter"];
}

/// Decodes a managed-session event, or `None` for events of other aggregates.
fn session_event(event: &EventRef<'_>) -> Result<Option<ManagedFilterEvent>, StoreError> {
    if event.aggregate_type != MANAGED_SESSION_AGGREGATE {
        return Ok(None);
    }
    ManagedFilterEvent::decode(event.event_type, event.payload.get())
        .map(Some)
        .map_err(|e| StoreError::decode(event.position.unwrap_or(0), e))
}

/// A filter row's state and outcome columns after a SUBACK.
fn acknowledged(outcome: SubscribeOutcome) -> (&'static str, Option<i16>, Option<i16>) {
    match outcome {
        SubscribeOutcome::Granted { qos } => ("granted", Some(qos_column(qos)), None),
        SubscribeOutcome::Refused { reason_code } => {
            ("refused", None, Some(i16::from(reason_code)))
        }
    }
}

fn qos_column(qos: Qos) -> i16 {
    i16::from(qos.level())
}

/// A SUBACK outcome as one column value for the Postgres statement: a granted QoS as itself
/// (0-2), a refusal as `-1 - reason_code` (-1 to -256), so every outcome maps back exactly.
fn outcome_code(outcome: SubscribeOutcome) -> i16 {
    match outcome {
        SubscribeOutcome::Granted { qos } => qos_column(qos),
        SubscribeOutcome::Refused { reason_code } => -1 - i16::from(reason_code),
    }
}

fn strings(filters: &[ExactFilter]) -> Vec<String> {
    filters.iter().map(|f| f.as_str().to_owned()).collect()
}

impl SqliteProjector for ManagedSessions {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[MANAGED_SESSION_AGGREGATE])
    }

    fn apply(&self, tx: &Transaction<'_>, event: &RecordedEvent) -> Result<(), StoreError> {
        let Some(decoded) = session_event(&event.as_ref())? else {
            return Ok(());
        };
        let (session, position) = (event.aggregate_id.as_str(), event.position);
        match &decoded {
            ManagedFilterEvent::BaselineSeeded { filters, source } => {
                tx.prepare_cached(
                    "INSERT INTO managed_session (session_id, baseline_source, last_position) \
                     VALUES (?1, ?2, ?3) ON CONFLICT (session_id) DO NOTHING",
                )?
                .execute(params![session, source, position])?;
                sqlite_seed(tx, session, filters, position)?;
            }
            ManagedFilterEvent::BaselineExtended { filters, .. } => {
                sqlite_seed(tx, session, filters, position)?;
            }
            ManagedFilterEvent::FiltersRemembered { filters } => {
                let mut upsert = tx.prepare_cached(
                    "INSERT INTO managed_filter (session_id, filter, state, requested_qos, \
                     since_position, updated_position) VALUES (?1, ?2, 'remembered', ?3, ?4, ?4) \
                     ON CONFLICT (session_id, filter) DO UPDATE SET state = 'remembered', \
                     requested_qos = excluded.requested_qos, granted_qos = NULL, \
                     reason_code = NULL, updated_position = excluded.updated_position",
                )?;
                for RememberedFilter { filter, qos } in filters {
                    upsert.execute(params![
                        session,
                        filter.as_str(),
                        qos_column(*qos),
                        position
                    ])?;
                }
            }
            ManagedFilterEvent::SubscribesAcknowledged { outcomes } => {
                let mut update = tx.prepare_cached(
                    "UPDATE managed_filter SET state = ?3, requested_qos = ?4, granted_qos = ?5, \
                     reason_code = ?6, updated_position = ?7 WHERE session_id = ?1 AND filter = ?2",
                )?;
                for SubAckEntry {
                    filter,
                    requested,
                    outcome,
                } in outcomes
                {
                    let (state, granted, reason) = acknowledged(*outcome);
                    update.execute(params![
                        session,
                        filter.as_str(),
                        state,
                        qos_column(*requested),
                        granted,
                        reason,
                        position
                    ])?;
                }
            }
            ManagedFilterEvent::FiltersForgotten { filters } => {
                let mut delete = tx.prepare_cached(
                    "DELETE FROM managed_filter WHERE session_id = ?1 AND filter = ?2",
                )?;
                for ForgottenFilter { filter, .. } in filters {
                    delete.execute(params![session, filter.as_str()])?;
                }
            }
            ManagedFilterEvent::MigrationRequired { reason, .. } => {
                tx.prepare_cached(
                    "UPDATE managed_session SET migration_required = ?2 WHERE session_id = ?1",
                )?
                .execute(params![session, reason])?;
            }
            ManagedFilterEvent::MigrationResolved { .. } => {
                tx.prepare_cached(
                    "UPDATE managed_session SET migration_required = NULL WHERE session_id = ?1",
                )?
                .execute(params![session])?;
            }
        }
        tx.prepare_cached("UPDATE managed_session SET last_position = ?2 WHERE session_id = ?1")?
            .execute(params![session, position])?;
        Ok(())
    }
}

fn sqlite_seed(
    tx: &Transaction<'_>,
    session: &str,
    filters: &[ExactFilter],
    position: i64,
) -> Result<(), StoreError> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO managed_filter (session_id, filter, state, since_position, updated_position) \
         VALUES (?1, ?2, 'seeded', ?3, ?3) ON CONFLICT (session_id, filter) DO NOTHING",
    )?;
    for filter in filters {
        insert.execute(params![session, filter.as_str(), position])?;
    }
    Ok(())
}

impl ManagedSessions {
    /// Adds the event's row changes to `statement` as CTEs; false for other aggregates' events.
    fn pg_rows(
        event: &EventRef<'_>,
        position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        let Some(decoded) = session_event(event)? else {
            return Ok(false);
        };
        let session = statement.bind(event.aggregate_id.to_owned())?;
        let touch = format!(
            "UPDATE managed_session SET last_position = {position} WHERE session_id = {session}"
        );
        match &decoded {
            ManagedFilterEvent::BaselineSeeded { filters, source } => {
                let source = statement.bind(source.clone())?;
                statement.cte(
                    "session_baseline",
                    &format!(
                        "INSERT INTO managed_session (session_id, baseline_source, last_position) \
                         VALUES ({session}, {source}, {position}) ON CONFLICT (session_id) \
                         DO UPDATE SET last_position = excluded.last_position"
                    ),
                );
                pg_seed(statement, &session, filters, position)?;
                return Ok(true);
            }
            ManagedFilterEvent::BaselineExtended { filters, .. } => {
                pg_seed(statement, &session, filters, position)?;
            }
            ManagedFilterEvent::FiltersRemembered { filters } => {
                let names = statement.bind(
                    filters
                        .iter()
                        .map(|r| r.filter.as_str().to_owned())
                        .collect::<Vec<_>>(),
                )?;
                let qos = statement.bind(
                    filters
                        .iter()
                        .map(|r| qos_column(r.qos))
                        .collect::<Vec<_>>(),
                )?;
                // Each listed filter's index entry is looked up once: the rows already there
                // are updated by key (none, for a wave of new filters: an empty array reads
                // no index page), the others inserted without a second lookup.
                statement.cte(
                    "filters_listed",
                    &format!(
                        "SELECT t.f, t.q, EXISTS (SELECT 1 FROM managed_filter m \
                           WHERE m.session_id = {session} AND m.filter = t.f) AS known \
                         FROM unnest({names}::text[], {qos}::smallint[]) AS t(f, q)"
                    ),
                );
                statement.cte(
                    "filters_re_remembered",
                    &format!(
                        "UPDATE managed_filter m SET state = 'remembered', requested_qos = l.q, \
                         granted_qos = NULL, reason_code = NULL, updated_position = {position} \
                         FROM filters_listed l \
                         WHERE m.session_id = {session} AND m.filter = l.f AND l.known \
                           AND m.filter = ANY(ARRAY(SELECT f FROM filters_listed WHERE known))"
                    ),
                );
                statement.cte(
                    "filters_remembered",
                    &format!(
                        "INSERT INTO managed_filter (session_id, filter, state, requested_qos, \
                         since_position, updated_position) \
                         SELECT {session}, f, 'remembered', q, {position}, {position} \
                         FROM filters_listed WHERE NOT known"
                    ),
                );
            }
            ManagedFilterEvent::SubscribesAcknowledged { outcomes } => {
                // Three arrays, each outcome one smallint (`outcome_code`); the state and the
                // two outcome columns follow from it in the statement.
                let names = statement.bind(
                    outcomes
                        .iter()
                        .map(|e| e.filter.as_str())
                        .collect::<Vec<_>>(),
                )?;
                let requested = statement.bind(
                    outcomes
                        .iter()
                        .map(|e| qos_column(e.requested))
                        .collect::<Vec<_>>(),
                )?;
                let answered = statement.bind(
                    outcomes
                        .iter()
                        .map(|e| outcome_code(e.outcome))
                        .collect::<Vec<_>>(),
                )?;
                statement.cte(
                    "filters_acknowledged",
                    &format!(
                        "UPDATE managed_filter m SET \
                         state = CASE WHEN t.a >= 0 THEN 'granted' ELSE 'refused' END, \
                         requested_qos = t.r, \
                         granted_qos = CASE WHEN t.a >= 0 THEN t.a END, \
                         reason_code = CASE WHEN t.a < 0 THEN -1 - t.a END, \
                         updated_position = {position} \
                         FROM unnest({names}::text[], {requested}::smallint[], \
                           {answered}::smallint[]) AS t(f, r, a) \
                         WHERE m.session_id = {session} AND m.filter = t.f"
                    ),
                );
            }
            ManagedFilterEvent::FiltersForgotten { filters } => {
                let names = statement.bind(
                    filters
                        .iter()
                        .map(|r| r.filter.as_str().to_owned())
                        .collect::<Vec<_>>(),
                )?;
                statement.cte(
                    "filters_forgotten",
                    &format!(
                        "DELETE FROM managed_filter \
                         WHERE session_id = {session} AND filter = ANY({names}::text[])"
                    ),
                );
            }
            ManagedFilterEvent::MigrationResolved { .. } => {
                statement.cte(
                    "session_touched",
                    &format!(
                        "UPDATE managed_session SET last_position = {position}, \
                         migration_required = NULL WHERE session_id = {session}"
                    ),
                );
                return Ok(true);
            }
            ManagedFilterEvent::MigrationRequired { reason, .. } => {
                let reason = statement.bind(reason.clone())?;
                statement.cte(
                    "session_touched",
                    &format!(
                        "UPDATE managed_session SET last_position = {position}, \
                         migration_required = {reason} WHERE session_id = {session}"
                    ),
                );
                return Ok(true);
            }
        }
        statement.cte("session_touched", &touch);
        Ok(true)
    }
}

fn pg_seed(
    statement: &mut CteStatement,
    session: &str,
    filters: &[ExactFilter],
    position: &str,
) -> Result<(), StoreError> {
    let filters = statement.bind(strings(filters))?;
    statement.cte(
        "filters_seeded",
        &format!(
            "INSERT INTO managed_filter (session_id, filter, state, since_position, \
             updated_position) SELECT {session}, f, 'seeded', {position}, {position} \
             FROM unnest({filters}::text[]) AS f ON CONFLICT (session_id, filter) DO NOTHING"
        ),
    );
    Ok(())
}

#[async_trait]
impl PgProjector for ManagedSessions {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn tables(&self) -> &'static [&'static str] {
        Self::TABLES
    }

    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        Some(&[MANAGED_SESSION_AGGREGATE])
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &RecordedEvent,
    ) -> Result<(), StoreError> {
        crate::fused::apply_as_ctes(conn, event, Self::pg_rows).await
    }

    fn fuse(
        &self,
        event: &EventRef<'_>,
        position: &str,
        statement: &mut CteStatement,
    ) -> Result<bool, StoreError> {
        // Everything this projector writes for the event is now in the statement (nothing,
        // for an event it ignores): there is nothing to apply afterwards.
        Self::pg_rows(event, position, statement)?;
        Ok(true)
    }
}
