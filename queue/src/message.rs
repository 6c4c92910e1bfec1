//! Messages in and out of the log, and the queue's settings and reports.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use wharf_domain::{Subject, ValidationError};
use wharf_store::GroupFiguresRow;

/// The largest payload one message may carry.
pub const MAX_PAYLOAD_BYTES: usize = 8 * 1024 * 1024;
/// The most messages one publish may carry.
pub const MAX_BATCH: usize = 10_000;
const MAX_HEADER_NAME: usize = 255;
const MAX_HEADER_VALUE: usize = 64 * 1024;

/// Headers: string names to string values.
pub type Headers = BTreeMap<String, String>;

/// A message to publish: a subject (an MQTT topic name), a payload and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    /// The subject consumer groups match their bindings against.
    pub subject: Subject,
    /// The body.
    pub payload: Vec<u8>,
    /// Free-form headers.
    pub headers: Headers,
}

impl OutgoingMessage {
    /// Validates a message. Field names in errors are relative (`subject`, `payload`,
    /// `headers[NAME]`); a batch prefixes them with `messages[i].`.
    pub fn new(
        subject: &str,
        payload: impl Into<Vec<u8>>,
        headers: Headers,
    ) -> Result<Self, ValidationError> {
        let message = Self {
            subject: Subject::parse("subject", subject)?,
            payload: payload.into(),
            headers,
        };
        message.check()?;
        Ok(message)
    }

    /// Checks the payload size and the headers (the subject is valid by its type). Publishing
    /// runs this again, so a message built field by field is held to the same rules.
    pub fn check(&self) -> Result<(), ValidationError> {
        if self.payload.len() > MAX_PAYLOAD_BYTES {
            return Err(ValidationError::new(
                "payload",
                &format!("{} bytes", self.payload.len()),
                "a payload may hold at most 8 MiB",
            ));
        }
        for (name, value) in &self.headers {
            check_header(name, value)?;
        }
        Ok(())
    }
}

fn check_header(name: &str, value: &str) -> Result<(), ValidationError> {
    let field = format!("headers[{name}]");
    if name.is_empty() || name.len() > MAX_HEADER_NAME || name.chars().any(char::is_control) {
        return Err(ValidationError::new(
            &field,
            name,
            "a header name must be 1 to 255 bytes without control characters",
        ));
    }
    if value.len() > MAX_HEADER_VALUE {
        return Err(ValidationError::new(
            &field,
            &format!("{} bytes", value.len()),
            "a header value may hold at most 64 KiB",
        ));
    }
    Ok(())
}

/// Validates a whole batch before anything is written: the first bad message is named by its
/// index (`messages[3].subject`), and nothing of the batch is published.
pub fn validate_batch(
    raw: Vec<(String, Vec<u8>, Headers)>,
) -> Result<Vec<OutgoingMessage>, ValidationError> {
    if raw.is_empty() || raw.len() > MAX_BATCH {
        return Err(ValidationError::new(
            "messages",
            &format!("{} messages", raw.len()),
            "a publish carries 1 to 10000 messages",
        ));
    }
    raw.into_iter()
        .enumerate()
        .map(|(i, (subject, payload, headers))| {
            OutgoingMessage::new(&subject, payload, headers).map_err(|e| ValidationError {
                field: format!("messages[{i}].{}", e.field),
                ..e
            })
        })
        .collect()
}

/// A message claimed by an instance: hold it, then ack or nack it with its claim token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Claimed {
    /// The group that claimed it.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// Its position in the topic.
    pub position: i64,
    /// Its subject.
    pub subject: String,
    /// Its body.
    pub payload: Vec<u8>,
    /// Its headers.
    pub headers: Headers,
    /// When it was published.
    pub published_at: DateTime<Utc>,
    /// How many times it has been claimed, this claim included.
    pub attempts: i32,
    /// The ledger position of the declaration whose set routed it here.
    pub routed_by: i64,
    /// Proves this claim when acking or nacking; a claim that expired and was re-claimed by
    /// another instance no longer matches.
    pub claim_token: i64,
}

/// How claims behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSettings {
    /// How long a claim hides a message from other instances before it is redelivered.
    pub visibility_timeout: Duration,
    /// How many times a message may be claimed before it goes to the group's dead letters.
    pub max_attempts: u32,
    /// The first nack's backoff; doubles per attempt.
    pub backoff_base: Duration,
    /// The longest nack backoff.
    pub backoff_max: Duration,
    /// How many log positions one routing step reads.
    pub route_batch: i64,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            visibility_timeout: Duration::from_secs(30),
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            route_batch: 1_000,
        }
    }
}

impl QueueSettings {
    /// The backoff after the given number of attempts: base x 2^(attempts-1), capped.
    pub fn backoff(&self, attempts: i32) -> Duration {
        let doublings = attempts.saturating_sub(1).clamp(0, 30) as u32;
        doubled(self.backoff_base, doublings, self.backoff_max)
    }
}

/// `base` doubled `doublings` times, at most `cap` (never overflowing): the shape of every
/// backoff here, a nacked message's and a failed fetch's.
pub fn doubled(base: Duration, doublings: u32, cap: Duration) -> Duration {
    base.saturating_mul(1u32.checked_shl(doublings).unwrap_or(u32::MAX))
        .min(cap)
}

/// The install in effect for a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveInstall {
    /// The ledger position of the `Installed` event: the install's identity.
    pub position: i64,
    /// Its binding set's patterns (empty = the whole topic).
    pub patterns: Vec<String>,
}

/// What a routing step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouteReport {
    /// New log positions examined (forward routing).
    pub scanned: u64,
    /// Older log positions examined again under a new install (ADR 0014).
    pub rescanned: u64,
    /// Of all those, routed to the group (deliveries made).
    pub routed: u64,
    /// True while a new install's rescan has more to do.
    pub rescan_pending: bool,
    /// The group's routing cursor afterwards.
    pub position: i64,
    /// True when another instance was routing this group, so this step did nothing.
    pub busy: bool,
    /// What applying a new install did, when this step was the first after a swap.
    pub swap: Option<SwapReport>,
}

impl RouteReport {
    /// True when another step right away would find more to route: a full forward batch, or
    /// a rescan not finished.
    pub fn more(&self, batch: i64) -> bool {
        !self.busy && (self.scanned as i64 >= batch || self.rescan_pending)
    }
}

/// What applying a group's new install to its routing did (ADR 0014).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SwapReport {
    /// The install applied (its ledger position).
    pub install: i64,
    /// Unacked deliveries of earlier installs that the new set matches: still claimable.
    pub kept: u64,
    /// Unacked deliveries of earlier installs that the new set does not match: set aside, not
    /// claimable while it is in effect.
    pub set_aside: u64,
    /// Deliveries set aside by an earlier swap that the new set matches again.
    pub restored: u64,
    /// The first log position the new set rescans.
    pub rescan_from: i64,
    /// The last one (the old install's routing cursor).
    pub rescan_until: i64,
}

/// The result of an ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// The message is done for the group.
    Acked,
    /// The claim had expired and was taken over; the ack changed nothing.
    ClaimLost,
}

/// What [`Queue::ack_and_fetch`](crate::Queue::ack_and_fetch) did.
#[derive(Debug)]
pub struct AckedFetch {
    /// Each ack's outcome, in the order given, settled in the commit of the fetch's first claim.
    pub acks: Vec<AckOutcome>,
    /// What the fetch claimed, or why the rest of it failed once the acks were settled.
    pub fetched: Result<Vec<Claimed>, crate::QueueError>,
}

/// The result of a nack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackOutcome {
    /// The message becomes claimable again after the backoff.
    Retrying {
        /// When it becomes claimable.
        visible_at: DateTime<Utc>,
    },
    /// It reached max attempts and moved to the group's dead letters.
    DeadLettered,
    /// The claim had expired and was taken over; the nack changed nothing.
    ClaimLost,
}

/// The result of extending a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtendOutcome {
    /// The claim holds until `visible_at` (by the store's clock).
    Extended {
        /// Until when no other instance can claim the message.
        visible_at: DateTime<Utc>,
    },
    /// The claim had expired and was taken over (or the message was settled); nothing changed.
    ClaimLost,
}

/// A message a group gave up on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// The group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The message's position.
    pub position: i64,
    /// Its subject.
    pub subject: String,
    /// Its body.
    pub payload: Vec<u8>,
    /// Its headers.
    pub headers: Headers,
    /// When it was published.
    pub published_at: DateTime<Utc>,
    /// How many times it was claimed.
    pub attempts: i32,
    /// The last handler error, if any.
    pub last_error: Option<String>,
    /// When it was dead-lettered.
    pub dead_at: DateTime<Utc>,
}

/// A topic's log, as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TopicStats {
    /// The topic.
    pub topic: String,
    /// The last position assigned (0 when nothing was ever published).
    pub head: i64,
    /// Messages the log still retains.
    pub size: i64,
}

/// A group's queue, as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupQueueStats {
    /// The group.
    pub group: String,
    /// The topic it consumes.
    pub topic: String,
    /// The log position the group has routed up to.
    pub routed_position: i64,
    /// Log positions not yet routed (head - routed_position).
    pub routed_lag: i64,
    /// Routed messages claimable now.
    pub claimable: i64,
    /// Messages claimed and not yet acked or expired.
    pub in_flight: i64,
    /// Messages nacked and waiting out their backoff.
    pub backing_off: i64,
    /// Messages in the group's dead letters.
    pub dead_letters: i64,
    /// Seconds since the oldest routed-but-unacked message was published.
    pub oldest_unacked_seconds: Option<f64>,
    /// Unacked deliveries set aside by swaps: the install in effect does not match them, so
    /// they are not claimable (ADR 0014).
    pub set_aside: i64,
    /// Log positions the install in effect still has to rescan after its swap.
    pub rescan_remaining: i64,
}

impl GroupQueueStats {
    /// The figures of `group` as the database computed them (`wharf_group_figures`, or a read
    /// that carries its columns, ADR 0071): the lag from the topic's head, the oldest unacked
    /// message's age from the database's clock.
    pub fn from_figures(group: String, row: GroupFiguresRow) -> Self {
        Self {
            group,
            topic: row.topic,
            routed_position: row.routed_position,
            routed_lag: (row.head - row.routed_position).max(0),
            claimable: row.claimable,
            in_flight: row.in_flight,
            backing_off: row.backing_off,
            dead_letters: row.dead_letters,
            oldest_unacked_seconds: row
                .oldest_published_at
                .map(|at| (row.now - at).num_microseconds().unwrap_or(0) as f64 / 1e6),
            set_aside: row.set_aside,
            rescan_remaining: row.rescan_remaining,
        }
    }
}

impl SwapReport {
    /// Logs what applying the install did, as fields (both routers call it).
    pub(crate) fn log(&self, group: &str) {
        tracing::info!(
            group,
            install = self.install,
            kept = self.kept,
            set_aside = self.set_aside,
            restored = self.restored,
            rescan_from = self.rescan_from,
            rescan_until = self.rescan_until,
            "applied the group's new install to its routing"
        );
    }
}

/// One install as the group's routing applied it (ADR 0014): the listing's and the audit's
/// record of what each swap did to the messages routed before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Swap))]
pub struct SwapRecord {
    /// The install: the ledger position of its Installed event.
    pub install: i64,
    /// Its binding set (empty = the whole topic).
    pub patterns: Vec<String>,
    /// When the router applied it (store clock).
    pub applied_at: DateTime<Utc>,
    /// Unacked deliveries of earlier installs that it matched: kept claimable.
    pub kept: i64,
    /// Unacked deliveries of earlier installs that it did not match: set aside, not claimable
    /// while it is in effect.
    pub set_aside: i64,
    /// Deliveries set aside by earlier swaps that it matched again.
    pub restored: i64,
    /// First log position it rescanned.
    pub rescan_from: i64,
    /// Last log position it rescanned (where the previous install had routed to); the range is
    /// empty when rescan_from is greater.
    pub rescan_until: i64,
}

/// What a retention pass deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct RetentionReport {
    /// Messages deleted from the log.
    pub messages: u64,
    /// Deliveries of groups with no live instance whose messages aged out.
    pub orphaned_deliveries: u64,
    /// Deliveries set aside by a swap whose messages aged out.
    pub set_aside_dropped: u64,
}

/// What the claim statements of one claim call did (both backends).
#[derive(Debug, Default)]
pub(crate) struct ClaimStep {
    /// What they handed out, in position order.
    pub claimed: Vec<Claimed>,
    /// Exhausted messages they moved to the dead letters instead.
    pub buried: usize,
    /// The `(position, token)` acks the first one settled.
    pub acked: std::collections::HashSet<(i64, i64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_names_the_bad_message_by_index() {
        let raw = vec![
            ("a/b".to_owned(), b"x".to_vec(), Headers::new()),
            ("a/+".to_owned(), b"y".to_vec(), Headers::new()),
        ];
        let err = validate_batch(raw).unwrap_err();
        assert_eq!(err.field, "messages[1].subject");
        assert_eq!(err.value, "a/+");
    }

    #[test]
    fn empty_and_oversized_input_is_refused() {
        assert_eq!(validate_batch(Vec::new()).unwrap_err().field, "messages");
        let big = vec![0u8; MAX_PAYLOAD_BYTES + 1];
        assert_eq!(
            OutgoingMessage::new("a", big, Headers::new())
                .unwrap_err()
                .field,
            "payload"
        );
        let headers = Headers::from([(String::new(), "v".to_owned())]);
        assert_eq!(
            OutgoingMessage::new("a", b"".to_vec(), headers)
                .unwrap_err()
                .field,
            "headers[]"
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let s = QueueSettings {
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_millis(350),
            ..QueueSettings::default()
        };
        assert_eq!(s.backoff(1), Duration::from_millis(100));
        assert_eq!(s.backoff(2), Duration::from_millis(200));
        assert_eq!(s.backoff(3), Duration::from_millis(350));
        assert_eq!(s.backoff(40), Duration::from_millis(350));
    }
}
