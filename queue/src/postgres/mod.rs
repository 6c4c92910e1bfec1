//! The message log and delivery on Postgres (cluster mode).

mod claim;
mod publish;
pub(crate) mod retention;
mod route;
mod stats;
mod swap;

pub(crate) use claim::{
    ack, ack_many, claim, dead_letters, extend, nack, replay_dead_letter, settle_in, ACK, BURY,
    EXTEND, KEYED_PLANS, NACK_MARK, NACK_RETRY, SETTLE,
};
pub(crate) use publish::publish;
pub(crate) use retention::retain;
pub(crate) use route::{
    effective_install, route, INSTALL_IN_EFFECT, INSTALL_ON_TOPIC, SETTLED_LOOK,
    SLICE as ROUTE_SLICE,
};
pub(crate) use stats::{group_stats, group_stats_of, swaps, topic_stats, GROUP_FIGURES_SQL};
pub(crate) use swap::OnLocked;

fn headers_json(value: serde_json::Value) -> crate::message::Headers {
    serde_json::from_value(value).unwrap_or_default()
}

/// Headers stored as JSON, read as text (`headers::text`): decoded straight into the map, with
/// no JSON tree in between (the claim's hot path).
fn headers_text(text: &str) -> crate::message::Headers {
    serde_json::from_str(text).unwrap_or_default()
}
