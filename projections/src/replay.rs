//! Set-based replays of the declaration projectors (ADR 0025): a rebuild folds the whole log
//! in memory, in position order, into the rows each projector's tables end with, then writes
//! them in bulk (SQLite: one prepared insert per row in the rebuild's transaction; Postgres:
//! `COPY ... FROM STDIN`), instead of running the projector's statements once per event.
//!
//! Each fold mirrors its projector's `apply` exactly (`rebuild --verify` compares the two, and
//! the rebuild tests replay randomized workloads): the memory it takes is the size of the
//! projection, not of the log.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{params, Transaction};
use sqlx::PgConnection;
use wharf_domain::declaration::AGGREGATE_TYPE;
use wharf_domain::DeclarationEvent;
use wharf_store::projector::{PgReplay, SqliteReplay};
use wharf_store::rebuild::{Decoded, ReplayEvent, ReplayTarget};
use wharf_store::StoreError;

/// The event's declaration, decoded once for both folds (`None` for other aggregates).
pub(crate) fn declaration<'d>(
    event: &ReplayEvent<'_>,
    decoded: &'d mut Decoded,
) -> Result<Option<&'d DeclarationEvent>, StoreError> {
    if event.aggregate_type != AGGREGATE_TYPE {
        return Ok(None);
    }
    decoded
        .get_or_decode(|| {
            serde_json::from_str::<DeclarationEvent>(event.payload).map_err(|e| {
                let at = format!(
                    "{}/{}#{}",
                    event.aggregate_type, event.aggregate_id, event.sequence
                );
                StoreError::decode(event.position, format!("{at}: {e}"))
            })
        })
        .map(Some)
}

// ---------------------------------------------------------------------------------------------
// declarer_attempt
// ---------------------------------------------------------------------------------------------

/// One `declarer_attempt` row.
#[derive(Debug, Clone)]
struct AttemptRow {
    status: &'static str,
    version: String,
    patterns: Vec<String>,
    incumbent: Option<Vec<String>>,
    declared_at: DateTime<Utc>,
    attempt_at: DateTime<Utc>,
    position: i64,
}

/// The fold of `DeclarerAttempts`: each declarer's newest attempt per group; an install
/// resolves the group's other waiters for the same set. The groups left with a waiting
/// attempt are `waiting_group`'s rows.
#[derive(Default)]
pub struct AttemptsFold {
    /// group -> declarer -> row.
    rows: HashMap<String, BTreeMap<String, AttemptRow>>,
    /// group -> declarers whose row is waiting (what an install may resolve).
    waiting: HashMap<String, BTreeSet<String>>,
}

impl AttemptsFold {
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError> {
        let Some(declared) = declaration(event, decoded)? else {
            return Ok(());
        };
        let (attempt, status, incumbent) = match declared {
            DeclarationEvent::Installed { attempt, .. } => (attempt, "installed", None),
            DeclarationEvent::Waiting {
                attempt, incumbent, ..
            } => (attempt, "waiting", Some(incumbent.patterns())),
        };
        let group = attempt.group.as_str();
        let declarer = attempt.declarer.as_str();
        let patterns = attempt.patterns.patterns();
        let rows = self.rows.entry(group.to_owned()).or_default();
        let waiting = self.waiting.entry(group.to_owned()).or_default();
        let newer = rows
            .get(declarer)
            .is_none_or(|row| event.position > row.position);
        if newer {
            rows.insert(
                declarer.to_owned(),
                AttemptRow {
                    status,
                    version: attempt.version.to_string(),
                    patterns: patterns.clone(),
                    incumbent,
                    declared_at: attempt.declared_at,
                    attempt_at: attempt.attempt_at,
                    position: event.position,
                },
            );
            if status == "waiting" {
                waiting.insert(declarer.to_owned());
            } else {
                waiting.remove(declarer);
            }
        }
        if status == "installed" {
            waiting.retain(|other| {
                let Some(row) = rows.get_mut(other) else {
                    return false;
                };
                if other != declarer && row.patterns == patterns {
                    row.status = "resolved";
                    return false;
                }
                true
            });
        }
        Ok(())
    }

    /// The groups with a waiting attempt (`waiting_group`'s rows), in name order.
    fn waiting_groups(&self) -> Vec<String> {
        let mut groups: Vec<String> = self
            .waiting
            .iter()
            .filter(|(_, declarers)| !declarers.is_empty())
            .map(|(group, _)| group.clone())
            .collect();
        groups.sort_unstable();
        groups
    }

    /// The rows in key order (group, declarer; by bytes, which the database's collation may
    /// order a little differently): a bulk load in about the primary key's order fills the
    /// key's B-tree page by page instead of touching a random page per row.
    fn into_rows(self) -> impl Iterator<Item = (String, String, AttemptRow)> {
        let mut groups: Vec<_> = self.rows.into_iter().collect();
        groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        groups.into_iter().flat_map(|(group, rows)| {
            rows.into_iter()
                .map(move |(declarer, row)| (group.clone(), declarer, row))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// effective_declaration (the `binding` view unnests its patterns)
// ---------------------------------------------------------------------------------------------

/// One `effective_declaration` row (its binding rows are its `patterns`).
#[derive(Debug, Clone)]
struct EffectiveRow {
    topic: String,
    declarer: String,
    version: String,
    patterns: Vec<String>,
    previous: Option<Vec<String>>,
    declared_at: DateTime<Utc>,
    attempt_at: DateTime<Utc>,
    position: i64,
    installs: i64,
}

/// The fold of `EffectiveBindings`: each group's newest install, and how many it had.
#[derive(Default)]
pub struct EffectiveFold {
    groups: HashMap<String, EffectiveRow>,
}

impl EffectiveFold {
    /// The groups' rows in key order (see [`AttemptsFold::into_rows`]); a row's patterns are
    /// already sorted (a normalized set).
    fn into_rows(self) -> Vec<(String, EffectiveRow)> {
        let mut groups: Vec<_> = self.groups.into_iter().collect();
        groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        groups
    }

    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError> {
        let Some(DeclarationEvent::Installed { attempt, previous }) = declaration(event, decoded)?
        else {
            return Ok(());
        };
        let installs = self
            .groups
            .get(attempt.group.as_str())
            .map_or(0, |row| row.installs);
        self.groups.insert(
            attempt.group.to_string(),
            EffectiveRow {
                topic: attempt.topic.to_string(),
                declarer: attempt.declarer.to_string(),
                version: attempt.version.to_string(),
                patterns: attempt.patterns.patterns(),
                previous: previous.as_ref().map(|p| p.patterns()),
                declared_at: attempt.declared_at,
                attempt_at: attempt.attempt_at,
                position: event.position,
                installs: installs + 1,
            },
        );
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// SQLite writers
// ---------------------------------------------------------------------------------------------

pub(crate) fn json_list(list: &[String]) -> String {
    serde_json::Value::from(list.to_vec()).to_string()
}

impl SqliteReplay for AttemptsFold {
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError> {
        AttemptsFold::fold(self, event, decoded)
    }

    fn write(self: Box<Self>, tx: &Transaction<'_>) -> Result<(), StoreError> {
        let mut named = tx.prepare("INSERT INTO waiting_group (group_name) VALUES (?1)")?;
        for group in self.waiting_groups() {
            named.execute([group])?;
        }
        let mut insert = tx.prepare(
            "INSERT INTO declarer_attempt (group_name, declarer, status, version, patterns, \
             incumbent, declared_at, attempt_at, position) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        for (group, declarer, row) in self.into_rows() {
            insert.execute(params![
                group,
                declarer,
                row.status,
                row.version,
                json_list(&row.patterns),
                row.incumbent.as_deref().map(json_list),
                row.declared_at.timestamp_micros(),
                row.attempt_at.timestamp_micros(),
                row.position,
            ])?;
        }
        Ok(())
    }
}

impl SqliteReplay for EffectiveFold {
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError> {
        EffectiveFold::fold(self, event, decoded)
    }

    fn write(self: Box<Self>, tx: &Transaction<'_>) -> Result<(), StoreError> {
        let mut effective = tx.prepare(
            "INSERT INTO effective_declaration (group_name, topic, declarer, version, patterns, \
             previous, declared_at, attempt_at, position, installs) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?;
        for (group, row) in self.into_rows() {
            effective.execute(params![
                group,
                row.topic,
                row.declarer,
                row.version,
                json_list(&row.patterns),
                row.previous.as_deref().map(json_list),
                row.declared_at.timestamp_micros(),
                row.attempt_at.timestamp_micros(),
                row.position,
                row.installs,
            ])?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Postgres writers: COPY text format
// ---------------------------------------------------------------------------------------------

/// Rows of one `COPY ... FROM STDIN` in text format.
#[derive(Default)]
pub(crate) struct CopyText {
    text: String,
    fields: usize,
}

impl CopyText {
    /// Appends a field, escaped for COPY (`\`, tab, newline, carriage return).
    pub(crate) fn field(&mut self, value: &str) {
        self.separate();
        for c in value.chars() {
            match c {
                '\\' => self.text.push_str("\\\\"),
                '\t' => self.text.push_str("\\t"),
                '\n' => self.text.push_str("\\n"),
                '\r' => self.text.push_str("\\r"),
                c => self.text.push(c),
            }
        }
    }

    pub(crate) fn null(&mut self) {
        self.separate();
        self.text.push_str("\\N");
    }

    /// A `text[]` as an array literal, every element quoted.
    pub(crate) fn array(&mut self, list: &[String]) {
        let mut literal = String::from("{");
        for (i, item) in list.iter().enumerate() {
            if i > 0 {
                literal.push(',');
            }
            literal.push('"');
            for c in item.chars() {
                if c == '"' || c == '\\' {
                    literal.push('\\');
                }
                literal.push(c);
            }
            literal.push('"');
        }
        literal.push('}');
        self.field(&literal);
    }

    /// A timestamptz exactly as sqlx binds one: microseconds, truncated.
    pub(crate) fn time(&mut self, at: DateTime<Utc>) {
        let micros = at.timestamp_micros();
        let exact = DateTime::from_timestamp_micros(micros).unwrap_or(at);
        self.field(&exact.to_rfc3339_opts(SecondsFormat::Micros, true));
    }

    pub(crate) fn end_row(&mut self) {
        self.text.push('\n');
        self.fields = 0;
    }

    fn separate(&mut self) {
        if self.fields > 0 {
            self.text.push('\t');
        }
        self.fields += 1;
    }
}

/// Sends `rows` through `COPY {target} FROM STDIN`, in chunks.
pub(crate) async fn copy(
    conn: &mut PgConnection,
    target: &str,
    rows: CopyText,
) -> Result<(), StoreError> {
    if rows.text.is_empty() {
        return Ok(());
    }
    let mut copy = conn
        .copy_in_raw(&format!("COPY {target} FROM STDIN"))
        .await?;
    for chunk in rows.text.as_bytes().chunks(1 << 20) {
        copy.send(chunk).await?;
    }
    copy.finish().await?;
    Ok(())
}

#[async_trait]
impl PgReplay for AttemptsFold {
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError> {
        AttemptsFold::fold(self, event, decoded)
    }

    async fn write(
        self: Box<Self>,
        conn: &mut PgConnection,
        target: ReplayTarget,
    ) -> Result<(), StoreError> {
        let mut named = CopyText::default();
        for group in self.waiting_groups() {
            named.field(&group);
            named.end_row();
        }
        let waiting_group = target.table("waiting_group");
        copy(conn, &format!("{waiting_group} (group_name)"), named).await?;
        let mut rows = CopyText::default();
        for (group, declarer, row) in self.into_rows() {
            rows.field(&group);
            rows.field(&declarer);
            rows.field(row.status);
            rows.field(&row.version);
            rows.array(&row.patterns);
            match &row.incumbent {
                Some(list) => rows.array(list),
                None => rows.null(),
            }
            rows.time(row.declared_at);
            rows.time(row.attempt_at);
            rows.field(&row.position.to_string());
            rows.end_row();
        }
        let table = target.table("declarer_attempt");
        copy(
            conn,
            &format!(
                "{table} (group_name, declarer, status, version, patterns, incumbent, \
                 declared_at, attempt_at, position)"
            ),
            rows,
        )
        .await
    }
}

#[async_trait]
impl PgReplay for EffectiveFold {
    fn fold(&mut self, event: &ReplayEvent<'_>, decoded: &mut Decoded) -> Result<(), StoreError> {
        EffectiveFold::fold(self, event, decoded)
    }

    async fn write(
        self: Box<Self>,
        conn: &mut PgConnection,
        target: ReplayTarget,
    ) -> Result<(), StoreError> {
        let mut effective = CopyText::default();
        for (group, row) in self.into_rows() {
            effective.field(&group);
            effective.field(&row.topic);
            effective.field(&row.declarer);
            effective.field(&row.version);
            effective.array(&row.patterns);
            match &row.previous {
                Some(list) => effective.array(list),
                None => effective.null(),
            }
            effective.time(row.declared_at);
            effective.time(row.attempt_at);
            effective.field(&row.position.to_string());
            effective.field(&row.installs.to_string());
            effective.end_row();
        }
        let table = target.table("effective_declaration");
        copy(
            conn,
            &format!(
                "{table} (group_name, topic, declarer, version, patterns, previous, \
                 declared_at, attempt_at, position, installs)"
            ),
            effective,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_text_escapes_fields_and_array_elements() {
        let mut rows = CopyText::default();
        rows.field("a\tb\\c\nd");
        rows.array(&["x\"y".to_owned(), "p\\q".to_owned(), "plain".to_owned()]);
        rows.null();
        rows.end_row();
        assert_eq!(
            rows.text,
            "a\\tb\\\\c\\nd\t{\"x\\\\\"y\",\"p\\\\\\\\q\",\"plain\"}\t\\N\n"
        );
    }
}
