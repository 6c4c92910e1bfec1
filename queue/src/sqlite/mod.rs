//! The message log and delivery on SQLite (embedded mode). Every write is one `BEGIN
//! IMMEDIATE` transaction on the store's single writer, so positions are commit-ordered and
//! claims cannot race; times are microseconds since the epoch by the store's clock.

mod claim;
mod claimed;
mod fetch;
mod log;
mod route;

pub(crate) use claim::{ack, ack_many, dead_letters, extend, nack, replay_dead_letter};
pub(crate) use fetch::{claim, ClaimRequest};
pub(crate) use log::{
    group_stats, group_stats_of, group_stats_sql, publish, retain, swaps, topic_stats, GROUPS_NAMED,
};
pub(crate) use route::{effective_install, route};

fn headers_from(text: &str) -> crate::message::Headers {
    if text == "{}" {
        // Most messages carry none: no parse.
        return crate::message::Headers::default();
    }
    serde_json::from_str(text).unwrap_or_default()
}
