//! The response bodies this crate shapes itself: a group joined with its queue figures, the
//! topic list and the dead-letter page. (Group views and history pages are the read model's
//! own types, served as they are.)

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::Serialize;
use wharf_projections::{GroupSummary, GroupView};
use wharf_queue::{DeadLetter, GroupQueueStats, Headers, SwapRecord, TopicStats};

/// A group as the group endpoints answer it: its declaration view with a `queue` object beside
/// the view's own fields.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = GroupView)]
pub struct GroupDetail {
    /// The group's declaration view (its fields appear at the top level).
    #[serde(flatten)]
    pub view: GroupView,
    /// The group's queue figures.
    pub queue: GroupQueue,
}

/// The body of `GET /api/v1/groups/{group}/swaps`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SwapList {
    /// Newest install first.
    pub swaps: Vec<SwapRecord>,
}

/// The group's queue figures (its group and topic are those of the enclosing object). A declared
/// group the queue has no row for reads as zeros with a null `oldest_unacked_seconds`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct GroupQueue {
    /// The topic position the group has routed up to.
    pub routed_position: i64,
    /// Topic positions published but not yet routed for the group (head - routed_position,
    /// never negative).
    pub routed_lag: i64,
    /// Messages routed under the effective install and claimable now (including claims whose
    /// visibility timeout ran out).
    pub claimable: i64,
    /// Messages claimed and neither acked nor expired.
    pub in_flight: i64,
    /// Nacked messages waiting out their backoff.
    pub backing_off: i64,
    /// Messages in the group's dead letters.
    pub dead_letters: i64,
    /// Seconds since the oldest routed but unacked message was published, by the store's clock;
    /// null when there is none.
    #[schema(required = true)]
    pub oldest_unacked_seconds: Option<f64>,
    /// Unacked messages set aside by swaps: the effective set does not match them, so they are
    /// not claimable while it is in effect; an install whose set matches them again (a rollback)
    /// restores them while the log holds them (ADR 0014).
    pub set_aside: i64,
    /// Log positions the effective install still has to rescan after its swap, to deliver what
    /// the log holds, the group never consumed, and the new set matches.
    pub rescan_remaining: i64,
}

impl From<GroupQueueStats> for GroupQueue {
    fn from(stats: GroupQueueStats) -> Self {
        Self::from(&stats)
    }
}

impl From<&GroupQueueStats> for GroupQueue {
    fn from(stats: &GroupQueueStats) -> Self {
        Self {
            routed_position: stats.routed_position,
            routed_lag: stats.routed_lag,
            claimable: stats.claimable,
            in_flight: stats.in_flight,
            backing_off: stats.backing_off,
            dead_letters: stats.dead_letters,
            oldest_unacked_seconds: stats.oldest_unacked_seconds,
            set_aside: stats.set_aside,
            rescan_remaining: stats.rescan_remaining,
        }
    }
}

impl GroupDetail {
    /// Joins `view` with the first of `stats` that names its group (zeros when none does).
    pub fn new(view: GroupView, stats: impl IntoIterator<Item = GroupQueueStats>) -> Self {
        let queue = stats
            .into_iter()
            .find(|s| s.group == view.group)
            .map(GroupQueue::from)
            .unwrap_or_default();
        Self { view, queue }
    }
}

/// A group as the listing answers it: its summary with a `queue` object beside the summary's
/// own fields. Its waiters and instances are `GET /api/v1/groups/{group}`'s.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = GroupListEntry)]
pub struct GroupEntry {
    /// The group's summary (its fields appear at the top level).
    #[serde(flatten)]
    pub summary: GroupSummary,
    /// The group's queue figures.
    pub queue: GroupQueue,
}

impl GroupEntry {
    /// Joins every summary with the stats row of the same group name, in the summaries'
    /// order (zeros when none names it). Stats rows of groups not listed are dropped. Each
    /// row is found by binary search in the stats sorted by name (they come sorted, so the
    /// sort is one pass): no map of cloned names per page.
    pub fn join(summaries: Vec<GroupSummary>, mut stats: Vec<GroupQueueStats>) -> Vec<Self> {
        stats.sort_unstable_by(|a, b| a.group.cmp(&b.group));
        summaries
            .into_iter()
            .map(|summary| {
                let queue = stats
                    .binary_search_by(|s| s.group.as_str().cmp(summary.group.as_str()))
                    .map(|at| GroupQueue::from(&stats[at]))
                    .unwrap_or_default();
                Self { summary, queue }
            })
            .collect()
    }
}

/// The body of `GET /api/v1/groups`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GroupList {
    /// One page of the declared groups, by name, each as a summary.
    pub groups: Vec<GroupEntry>,
    /// Pass as `after` for the next page; null when no group follows this page.
    #[schema(required = true)]
    pub next_after: Option<String>,
}

/// The body of `GET /api/v1/topics`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TopicList {
    /// Every topic ever published to, by name.
    pub topics: Vec<TopicStats>,
}

/// One dead letter as listed, with its payload in standard base64.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = DeadLetter)]
pub struct DeadLetterView {
    /// The topic.
    pub topic: String,
    /// The message's position in its topic.
    pub position: i64,
    /// Its subject.
    pub subject: String,
    /// The payload, standard base64 with padding.
    #[schema(content_encoding = "base64")]
    pub payload_base64: String,
    /// Its headers.
    #[schema(value_type = std::collections::BTreeMap<String, String>)]
    pub headers: Headers,
    /// When it was published.
    pub published_at: DateTime<Utc>,
    /// How many times it was claimed.
    pub attempts: i32,
    /// The last handler error given with a nack; null when none was.
    #[schema(required = true)]
    pub last_error: Option<String>,
    /// When it was dead-lettered.
    pub dead_at: DateTime<Utc>,
}

impl From<DeadLetter> for DeadLetterView {
    fn from(dead: DeadLetter) -> Self {
        Self {
            topic: dead.topic,
            position: dead.position,
            subject: dead.subject,
            payload_base64: STANDARD.encode(&dead.payload),
            headers: dead.headers,
            published_at: dead.published_at,
            attempts: dead.attempts,
            last_error: dead.last_error,
            dead_at: dead.dead_at,
        }
    }
}

/// The body of `GET /api/v1/groups/{group}/dead-letters`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeadLetterPage {
    /// The page, by position.
    pub dead_letters: Vec<DeadLetterView>,
    /// Pass as `after` for the next page; null when this page was not full (no more dead
    /// letters). A full last page still names a cursor, whose page then comes back empty.
    #[schema(required = true)]
    pub next_after: Option<i64>,
}

impl DeadLetterPage {
    /// The page holding `letters`, read with a page size of `limit`.
    pub fn new(letters: Vec<DeadLetter>, limit: u32) -> Self {
        let full = letters.len() >= limit as usize;
        let next_after = if full {
            letters.last().map(|d| d.position)
        } else {
            None
        };
        Self {
            dead_letters: letters.into_iter().map(DeadLetterView::from).collect(),
            next_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use wharf_projections::EffectiveView;

    use super::*;

    fn view(group: &str) -> GroupView {
        let at = DateTime::<Utc>::UNIX_EPOCH;
        GroupView {
            group: group.to_owned(),
            topic: "orders".to_owned(),
            effective: EffectiveView {
                patterns: Vec::new(),
                whole_topic: true,
                declarer: "host:1:aa".to_owned(),
                version: "1".to_owned(),
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
        }
    }

    fn stats(group: &str, claimable: i64) -> GroupQueueStats {
        GroupQueueStats {
            group: group.to_owned(),
            topic: "orders".to_owned(),
            routed_position: 7,
            routed_lag: 2,
            claimable,
            in_flight: 1,
            backing_off: 0,
            dead_letters: 3,
            oldest_unacked_seconds: Some(1.5),
            set_aside: 2,
            rescan_remaining: 0,
        }
    }

    #[test]
    fn the_queue_sits_beside_the_view_fields() {
        let detail = GroupDetail::new(view("billing"), vec![stats("billing", 4)]);
        let body = serde_json::to_value(&detail).unwrap();
        assert_eq!(body["group"], "billing");
        assert_eq!(body["effective"]["whole_topic"], true);
        assert_eq!(
            body["queue"],
            json!({
                "routed_position": 7, "routed_lag": 2, "claimable": 4, "in_flight": 1,
                "backing_off": 0, "dead_letters": 3, "oldest_unacked_seconds": 1.5,
                "set_aside": 2, "rescan_remaining": 0
            })
        );
    }

    fn summary(group: &str) -> GroupSummary {
        let view = view(group);
        let none = wharf_projections::MemberCount {
            count: 0,
            more: false,
        };
        GroupSummary {
            group: view.group,
            topic: view.topic,
            effective: view.effective,
            waiters: none,
            oldest_waiter: None,
            instances: 0,
            live_instances: 0,
        }
    }

    #[test]
    fn the_join_is_by_name_and_a_missing_row_reads_as_zeros() {
        let joined = GroupEntry::join(
            vec![summary("a"), summary("b"), summary("c")],
            vec![stats("c", 9), stats("zz", 5), stats("a", 1)],
        );
        let claimable: Vec<i64> = joined.iter().map(|d| d.queue.claimable).collect();
        assert_eq!(claimable, [1, 0, 9]);
        assert_eq!(joined[1].queue, GroupQueue::default());
        // Summaries in any order still find their rows.
        let reversed = GroupEntry::join(
            vec![summary("c"), summary("b"), summary("a")],
            vec![stats("a", 1), stats("c", 9)],
        );
        let claimable: Vec<i64> = reversed.iter().map(|d| d.queue.claimable).collect();
        assert_eq!(claimable, [9, 0, 1]);
        let zeros = serde_json::to_value(&joined[1].queue).unwrap();
        assert_eq!(zeros["oldest_unacked_seconds"], serde_json::Value::Null);
        assert_eq!(zeros["routed_lag"], 0);
        assert_eq!(GroupDetail::new(view("x"), Vec::new()).queue.claimable, 0);
        let body = serde_json::to_value(&joined[0]).unwrap();
        assert_eq!(body["group"], "a");
        assert_eq!(body["waiters"], json!({ "count": 0, "more": false }));
        assert_eq!(body["queue"]["claimable"], 1);
    }

    fn dead(position: i64, payload: &[u8]) -> DeadLetter {
        DeadLetter {
            group: "billing".to_owned(),
            topic: "orders".to_owned(),
            position,
            subject: "orders/eu/paid".to_owned(),
            payload: payload.to_vec(),
            headers: Headers::new(),
            published_at: DateTime::<Utc>::UNIX_EPOCH,
            attempts: 1,
            last_error: None,
            dead_at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }

    #[test]
    fn dead_letters_carry_base64_and_a_cursor_only_when_full() {
        let page = DeadLetterPage::new(vec![dead(3, b"\xff\x00hi"), dead(8, b"")], 2);
        assert_eq!(page.next_after, Some(8));
        assert_eq!(page.dead_letters[0].payload_base64, "/wBoaQ==");
        assert_eq!(page.dead_letters[1].payload_base64, "");
        let body = serde_json::to_value(&page.dead_letters[0]).unwrap();
        assert!(body.get("group").is_none(), "{body}");
        assert!(body.get("payload").is_none(), "{body}");

        let short = DeadLetterPage::new(vec![dead(3, b"x")], 2);
        assert_eq!(short.next_after, None);
        assert_eq!(DeadLetterPage::new(Vec::new(), 1).next_after, None);
    }
}
