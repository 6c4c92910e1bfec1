//! The lease ledger, branch by branch: given stored events, when a command, then the events
//! appended (cqrs-es's harness), plus the fence and the JSON form of the stored events.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use cqrs_es::test::{AggregateTestExecutor, TestFramework};
use cqrs_es::DomainEvent;
use serde_json::json;
use wharf_domain::lease::ledger::MAX_TTL;
use wharf_domain::lease::{
    fence, FenceError, FencingToken, Lease, LeaseCommand, LeaseError, LeaseEvent, LeaseHolder,
    Staleness,
};

const TTL: Duration = Duration::from_secs(45);

fn at(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000, 0)
        .single()
        .expect("valid time")
        + TimeDelta::seconds(seconds)
}

fn h(name: &str) -> LeaseHolder {
    LeaseHolder::parse("holder", name).expect("valid holder")
}

fn t(n: u64) -> FencingToken {
    FencingToken(n)
}

fn acquired(holder: &str, token: u64, at_s: i64) -> LeaseEvent {
    LeaseEvent::Acquired {
        holder: h(holder),
        token: t(token),
        ttl_ms: 45_000,
        expires_at: at(at_s + 45),
    }
}

fn renewed(holder: &str, token: u64, at_s: i64) -> LeaseEvent {
    LeaseEvent::Renewed {
        holder: h(holder),
        token: t(token),
        expires_at: at(at_s + 45),
    }
}

fn released(holder: &str, token: u64) -> LeaseEvent {
    LeaseEvent::Released {
        holder: h(holder),
        token: t(token),
    }
}

fn expired(holder: &str, token: u64) -> LeaseEvent {
    LeaseEvent::Expired {
        holder: h(holder),
        token: t(token),
    }
}

fn lost(holder: &str, token: u64, reason: Staleness) -> LeaseEvent {
    LeaseEvent::Lost {
        holder: h(holder),
        token: t(token),
        reason,
    }
}

fn acquire(holder: &str, now_s: i64) -> LeaseCommand {
    LeaseCommand::Acquire {
        holder: h(holder),
        ttl: TTL,
        now: at(now_s),
    }
}

fn renew(holder: &str, token: u64, now_s: i64) -> LeaseCommand {
    LeaseCommand::Renew {
        holder: h(holder),
        token: t(token),
        now: at(now_s),
    }
}

fn release(holder: &str, token: u64, now_s: i64) -> LeaseCommand {
    LeaseCommand::Release {
        holder: h(holder),
        token: t(token),
        now: at(now_s),
    }
}

fn given(events: Vec<LeaseEvent>) -> AggregateTestExecutor<Lease> {
    TestFramework::<Lease>::with(()).given(events)
}

fn fresh() -> AggregateTestExecutor<Lease> {
    TestFramework::<Lease>::with(()).given_no_previous_events()
}

fn held_by(holder: &str, token: u64) -> Staleness {
    Staleness::HeldByOther {
        current: h(holder),
        token: t(token),
    }
}

// --- Acquire ----------------------------------------------------------------------------------

#[test]
fn the_first_acquire_takes_token_one_until_now_plus_ttl() {
    fresh()
        .when(acquire("a", 0))
        .then_expect_events(vec![acquired("a", 1, 0)]);
}

#[test]
fn acquire_is_refused_while_the_owner_has_not_expired() {
    let held = LeaseError::Held {
        holder: h("a"),
        token: t(1),
        expires_at: at(45),
    };
    given(vec![acquired("a", 1, 0)])
        .when(acquire("b", 44))
        .then_expect_error(held.clone());
    // The owner itself may not acquire again either: it renews.
    given(vec![acquired("a", 1, 0)])
        .when(acquire("a", 10))
        .then_expect_error(held.clone());
    let text = held.to_string();
    assert!(text.contains("held by a with token 1"), "{text}");
}

#[test]
fn acquire_after_expiry_records_the_expiry_then_takes_the_next_token() {
    // Expiry is inclusive: at exactly expires_at the owner no longer holds it.
    given(vec![acquired("a", 1, 0)])
        .when(acquire("b", 45))
        .then_expect_events(vec![expired("a", 1), acquired("b", 2, 45)]);
}

#[test]
fn acquire_after_a_release_or_an_observed_expiry_never_reuses_a_token() {
    given(vec![acquired("a", 1, 0), released("a", 1)])
        .when(acquire("a", 5))
        .then_expect_events(vec![acquired("a", 2, 5)]);
    given(vec![
        acquired("a", 1, 0),
        expired("a", 1),
        acquired("b", 2, 50),
        released("b", 2),
    ])
    .when(acquire("c", 60))
    .then_expect_events(vec![acquired("c", 3, 60)]);
}

#[test]
fn acquire_refuses_a_ttl_out_of_range() {
    for (ttl, ttl_ms) in [
        (Duration::ZERO, 0),
        (Duration::from_micros(999), 0),
        (MAX_TTL + Duration::from_millis(1), 86_400_001),
    ] {
        fresh()
            .when(LeaseCommand::Acquire {
                holder: h("a"),
                ttl,
                now: at(0),
            })
            .then_expect_error(LeaseError::InvalidTtl { ttl_ms });
    }
    let text = LeaseError::InvalidTtl { ttl_ms: 0 }.to_string();
    assert!(text.contains("invalid lease ttl: 0ms"), "{text}");
}

#[test]
fn acquire_refuses_an_expiry_beyond_the_range_of_times() {
    let now = DateTime::<Utc>::MAX_UTC - TimeDelta::seconds(1);
    fresh()
        .when(LeaseCommand::Acquire {
            holder: h("a"),
            ttl: TTL,
            now,
        })
        .then_expect_error(LeaseError::TimeOutOfRange {
            now,
            ttl_ms: 45_000,
        });
}

#[test]
fn acquire_refuses_once_every_token_was_issued() {
    let last = LeaseEvent::Acquired {
        holder: h("a"),
        token: t(u64::MAX),
        ttl_ms: 1_000,
        expires_at: at(1),
    };
    given(vec![last, released("a", u64::MAX)])
        .when(acquire("b", 5))
        .then_expect_error(LeaseError::TokensExhausted);
}

// --- Renew ------------------------------------------------------------------------------------

#[test]
fn the_holder_renews_with_its_token_before_expiry_to_now_plus_ttl() {
    given(vec![acquired("a", 1, 0)])
        .when(renew("a", 1, 44))
        .then_expect_events(vec![renewed("a", 1, 44)]);
    given(vec![acquired("a", 1, 0), renewed("a", 1, 30)])
        .when(renew("a", 1, 70))
        .then_expect_events(vec![renewed("a", 1, 70)]);
}

#[test]
fn a_renew_of_a_free_lease_is_lost() {
    fresh()
        .when(renew("a", 1, 0))
        .then_expect_events(vec![lost("a", 1, Staleness::NotHeld)]);
    given(vec![acquired("a", 1, 0), released("a", 1)])
        .when(renew("a", 1, 5))
        .then_expect_events(vec![lost("a", 1, Staleness::NotHeld)]);
}

#[test]
fn a_renew_by_another_holder_is_lost_and_leaves_the_owner_alone() {
    given(vec![
        acquired("a", 1, 0),
        expired("a", 1),
        acquired("b", 2, 50),
    ])
    .when(renew("a", 1, 60))
    .then_expect_events(vec![lost("a", 1, held_by("b", 2))]);
    let state = Lease::fold(&[acquired("b", 2, 50), lost("a", 1, held_by("b", 2))]);
    assert_eq!(state.owner.map(|o| o.holder), Some(h("b")));
}

#[test]
fn a_renew_with_an_older_token_is_lost() {
    given(vec![
        acquired("a", 1, 0),
        released("a", 1),
        acquired("a", 2, 5),
    ])
    .when(renew("a", 1, 6))
    .then_expect_events(vec![lost(
        "a",
        1,
        Staleness::TokenMismatch { current: t(2) },
    )]);
}

#[test]
fn a_renew_at_or_after_expiry_records_the_expiry_and_is_lost() {
    given(vec![acquired("a", 1, 0)])
        .when(renew("a", 1, 45))
        .then_expect_events(vec![
            expired("a", 1),
            lost("a", 1, Staleness::Expired { expired_at: at(45) }),
        ]);
}

// --- Release ----------------------------------------------------------------------------------

#[test]
fn the_holder_releases_with_its_token_before_expiry() {
    given(vec![acquired("a", 1, 0)])
        .when(release("a", 1, 10))
        .then_expect_events(vec![released("a", 1)]);
}

#[test]
fn stale_releases_are_refused_with_the_reason() {
    let refused = |holder: &str, token: u64, reason| {
        LeaseError::StaleRelease(FenceError {
            holder: h(holder),
            token: t(token),
            reason,
        })
    };
    fresh()
        .when(release("a", 1, 0))
        .then_expect_error(refused("a", 1, Staleness::NotHeld));
    given(vec![acquired("b", 1, 0)])
        .when(release("a", 1, 5))
        .then_expect_error(refused("a", 1, held_by("b", 1)));
    given(vec![
        acquired("a", 1, 0),
        released("a", 1),
        acquired("a", 2, 5),
    ])
    .when(release("a", 1, 6))
    .then_expect_error(refused("a", 1, Staleness::TokenMismatch { current: t(2) }));
    given(vec![acquired("a", 1, 0)])
        .when(release("a", 1, 45))
        .then_expect_error(refused("a", 1, Staleness::Expired { expired_at: at(45) }));
    let text = refused("a", 1, held_by("b", 2)).to_string();
    assert_eq!(
        text,
        "release refused: lease claim of a with token 1 is stale: the lease is held by b with \
         token 2"
    );
}

// --- ObserveExpiry ----------------------------------------------------------------------------

#[test]
fn an_observed_expiry_frees_the_lease_and_nothing_is_observed_early() {
    given(vec![acquired("a", 1, 0), renewed("a", 1, 20)])
        .when(LeaseCommand::ObserveExpiry { now: at(64) })
        .then_expect_events(vec![]);
    given(vec![acquired("a", 1, 0), renewed("a", 1, 20)])
        .when(LeaseCommand::ObserveExpiry { now: at(65) })
        .then_expect_events(vec![expired("a", 1)]);
    fresh()
        .when(LeaseCommand::ObserveExpiry { now: at(65) })
        .then_expect_events(vec![]);
    let state = Lease::fold(&[acquired("a", 1, 0), expired("a", 1)]);
    assert_eq!(state.owner, None);
    assert_eq!(state.last_token, t(1));
}

// --- Fence ------------------------------------------------------------------------------------

#[test]
fn the_fence_passes_only_for_the_current_claim_before_expiry() {
    let state = Lease::fold(&[acquired("a", 1, 0), renewed("a", 1, 10)]);
    assert_eq!(fence(&state, &h("a"), t(1), at(54)), Ok(()));
    let reason = |holder: &str, token: u64, now: i64| {
        fence(&state, &h(holder), t(token), at(now)).map_err(|e| e.reason)
    };
    assert_eq!(
        reason("a", 1, 55),
        Err(Staleness::Expired { expired_at: at(55) })
    );
    assert_eq!(reason("b", 1, 20), Err(held_by("a", 1)));
    assert_eq!(
        reason("a", 2, 20),
        Err(Staleness::TokenMismatch { current: t(1) })
    );
    assert_eq!(
        fence(&Lease::default(), &h("a"), t(1), at(0)).map_err(|e| e.reason),
        Err(Staleness::NotHeld)
    );
}

#[test]
fn a_stale_event_does_not_change_the_current_ownership() {
    // Events about another ownership (never decided, but possible in a replayed history) are
    // no-ops on the current one.
    let state = Lease::fold(&[
        acquired("b", 2, 50),
        renewed("a", 1, 90),
        released("a", 1),
        expired("b", 1),
    ]);
    let owner = state.owner.expect("b still owns it");
    assert_eq!((owner.holder, owner.token), (h("b"), t(2)));
    assert_eq!(owner.expires_at, at(95));
}

// --- Stored form ------------------------------------------------------------------------------

#[test]
fn stored_events_are_the_variant_fields_and_decode_by_type() {
    let events = [
        acquired("a", 1, 0),
        renewed("a", 1, 10),
        released("a", 1),
        expired("a", 1),
        lost("a", 1, held_by("b", 2)),
        lost("a", 1, Staleness::Expired { expired_at: at(5) }),
    ];
    for event in events {
        let payload = serde_json::to_value(&event).expect("serializes");
        let decoded =
            LeaseEvent::decode(&event.event_type(), &payload.to_string()).expect("decodes");
        assert_eq!(decoded, event);
    }
    assert_eq!(
        serde_json::to_value(released("a", 3)).expect("serializes"),
        json!({"holder": "a", "token": 3})
    );
    assert_eq!(
        serde_json::to_value(lost("a", 1, held_by("b", 2))).expect("serializes"),
        json!({"holder": "a", "token": 1,
               "reason": {"kind": "held_by_other", "current": "b", "token": 2}})
    );
    assert_eq!(acquired("a", 1, 0).event_type(), "LeaseAcquired");
}

#[test]
fn decoding_refuses_an_unknown_type_and_a_payload_of_another_type() {
    let released = serde_json::to_value(released("a", 1)).expect("serializes");
    let err = LeaseEvent::decode("LeaseStolen", &released.to_string()).expect_err("unknown");
    assert!(err.to_string().contains("LeaseStolen"), "{err}");
    let err = LeaseEvent::decode("LeaseAcquired", &released.to_string()).expect_err("wrong fields");
    assert!(err.to_string().contains("LeaseReleased"), "{err}");
    let bad_holder = json!({"holder": "a b", "token": 1});
    assert!(LeaseEvent::decode("LeaseReleased", &bad_holder.to_string()).is_err());
}

#[test]
fn holders_are_validated_naming_the_field() {
    let err = LeaseHolder::parse("lease.holder", "").expect_err("empty");
    assert_eq!(err.field, "lease.holder");
    let err = LeaseHolder::parse("lease.holder", "host 1").expect_err("space");
    assert_eq!(err.value, "host 1");
    assert!(LeaseHolder::parse("lease.holder", &"x".repeat(256)).is_err());
    assert!(LeaseHolder::parse("lease.holder", "host-1:4711.a_b").is_ok());
}
