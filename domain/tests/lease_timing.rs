//! Renewal timing (ratios, validation), the renewer state machine, and the activation bound.

use std::time::Duration;

use proptest::prelude::*;
use wharf_domain::lease::{
    activation_deadline, ActivationPhases, LeaseTiming, RenewOutcome, Renewer, RenewerAction,
    Staleness, StepDownReason,
};

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// --- LeaseTiming ------------------------------------------------------------------------------

#[test]
fn client_go_ratios_give_15_2_10_and_the_default_is_45_6_30() {
    let client_go = LeaseTiming::scaled(s(15));
    assert_eq!(
        client_go,
        LeaseTiming {
            ttl: s(15),
            renew_interval: s(2),
            renew_deadline: s(10),
        }
    );
    let default = LeaseTiming::default();
    assert_eq!(
        default,
        LeaseTiming {
            ttl: s(45),
            renew_interval: s(6),
            renew_deadline: s(30),
        }
    );
    assert_eq!(default.margin(), s(15));
    assert_eq!(client_go.validate("lease"), Ok(()));
    assert_eq!(default.validate("lease"), Ok(()));
}

fn refused(timing: LeaseTiming) -> (String, String, String) {
    let err = timing.validate("mqtt.lease").expect_err("refused");
    (err.field.clone(), err.value.clone(), err.to_string())
}

#[test]
fn zero_fields_are_refused_by_name() {
    let base = LeaseTiming::default();
    let (field, value, _) = refused(LeaseTiming {
        ttl: Duration::ZERO,
        ..base
    });
    assert_eq!((field.as_str(), value.as_str()), ("mqtt.lease.ttl", "0s"));
    let (field, _, _) = refused(LeaseTiming {
        renew_interval: Duration::ZERO,
        ..base
    });
    assert_eq!(field, "mqtt.lease.renew_interval");
    let (field, _, _) = refused(LeaseTiming {
        renew_deadline: Duration::ZERO,
        ..base
    });
    assert_eq!(field, "mqtt.lease.renew_deadline");
}

#[test]
fn the_ttl_must_be_whole_milliseconds_and_at_most_a_day() {
    let (field, value, _) = refused(LeaseTiming::scaled(Duration::from_micros(45_000_500)));
    assert_eq!(
        (field.as_str(), value.as_str()),
        ("mqtt.lease.ttl", "45000500us")
    );
    let (field, value, _) = refused(LeaseTiming::scaled(s(86_401)));
    assert_eq!(
        (field.as_str(), value.as_str()),
        ("mqtt.lease.ttl", "86401s")
    );
    assert_eq!(LeaseTiming::scaled(s(86_400)).validate("l"), Ok(()));
}

#[test]
fn the_deadline_must_be_shorter_than_the_ttl() {
    let (field, value, text) = refused(LeaseTiming {
        ttl: s(45),
        renew_interval: s(6),
        renew_deadline: s(45),
    });
    assert_eq!(
        (field.as_str(), value.as_str()),
        ("mqtt.lease.renew_deadline", "45s")
    );
    assert!(text.contains("shorter than ttl (45s)"), "{text}");
}

#[test]
fn the_deadline_must_exceed_1_2_renew_intervals() {
    // Exactly 1.2 x is refused (client-go: strictly greater).
    let (field, value, text) = refused(LeaseTiming {
        ttl: s(45),
        renew_interval: s(25),
        renew_deadline: s(30),
    });
    assert_eq!(
        (field.as_str(), value.as_str()),
        ("mqtt.lease.renew_interval", "25s")
    );
    assert!(text.contains("renew_deadline / 1.2 (30s / 1.2)"), "{text}");
    let ok = LeaseTiming {
        ttl: s(45),
        renew_interval: ms(24_999),
        renew_deadline: s(30),
    };
    assert_eq!(ok.validate("mqtt.lease"), Ok(()));
}

// --- Renewer ----------------------------------------------------------------------------------

fn renewer_at(start: Duration) -> Renewer {
    Renewer::start(LeaseTiming::default(), start)
}

fn is_deadline(action: Option<RenewerAction>) -> bool {
    matches!(
        action,
        Some(RenewerAction::StepDown {
            reason: StepDownReason::DeadlineMissed { .. }
        })
    )
}

#[test]
fn it_renews_every_interval_from_the_send_of_the_last_success() {
    let mut r = renewer_at(s(100));
    assert_eq!(r.next_wakeup(), Some(s(106)));
    assert_eq!(r.tick(s(105)), None);
    assert_eq!(r.tick(s(106)), Some(RenewerAction::Renew));
    // One at a time: no second renew while one is in flight.
    assert!(r.renew_in_flight());
    assert_eq!(r.tick(s(110)), None);
    assert_eq!(r.next_wakeup(), Some(s(130)));
    assert_eq!(r.outcome(s(111), RenewOutcome::Renewed), None);
    // The success counts from its send (106 s), not its answer (111 s).
    assert_eq!(r.local_deadline(), s(136));
    assert_eq!(r.next_wakeup(), Some(s(112)));
    assert_eq!(r.tick(s(112)), Some(RenewerAction::Renew));
}

#[test]
fn a_late_answer_past_the_deadline_renews_immediately_again() {
    let mut r = renewer_at(Duration::ZERO);
    assert_eq!(r.tick(s(6)), Some(RenewerAction::Renew));
    // Answered at 20 s: the next attempt (6 + 6 = 12 s) is already due.
    assert_eq!(
        r.outcome(s(20), RenewOutcome::Renewed),
        Some(RenewerAction::Renew)
    );
    assert_eq!(r.local_deadline(), s(36));
}

#[test]
fn a_success_answered_after_its_send_plus_the_deadline_still_steps_down() {
    let mut r = renewer_at(Duration::ZERO);
    assert_eq!(r.tick(s(6)), Some(RenewerAction::Renew));
    // Sent at 6 s, answered at 37 s (no tick in between): 6 + 30 = 36 s is already past.
    assert!(is_deadline(r.outcome(s(37), RenewOutcome::Renewed)));
}

#[test]
fn a_definitive_loss_steps_down_at_once_and_for_good() {
    let mut r = renewer_at(Duration::ZERO);
    assert_eq!(r.tick(s(6)), Some(RenewerAction::Renew));
    let action = r.outcome(s(7), RenewOutcome::Lost(Staleness::NotHeld));
    assert_eq!(
        action,
        Some(RenewerAction::StepDown {
            reason: StepDownReason::Lost(Staleness::NotHeld)
        })
    );
    assert_eq!(r.tick(s(12)), None);
    assert_eq!(r.outcome(s(13), RenewOutcome::Renewed), None);
    assert_eq!(r.next_wakeup(), None);
    assert_eq!(
        r.stepped_down().map(ToString::to_string),
        Some("the lease was lost: no one holds the lease".to_owned())
    );
}

#[test]
fn failures_are_retried_every_interval_until_the_deadline() {
    let mut r = renewer_at(Duration::ZERO);
    let mut renews = 0;
    let mut step_down = None;
    for second in 0..=40 {
        let now = s(second);
        match r.tick(now) {
            Some(RenewerAction::Renew) => {
                renews += 1;
                let failed = RenewOutcome::Failed("store unreachable".into());
                assert_eq!(r.outcome(now, failed), None);
            }
            Some(RenewerAction::StepDown { reason }) => {
                step_down = Some((second, reason));
                break;
            }
            None => {}
        }
    }
    // Attempts at 6, 12, 18, 24 s; the deadline (30 s after the Acquire was sent) steps down.
    assert_eq!(renews, 4);
    let (second, reason) = step_down.expect("stepped down");
    assert_eq!(second, 30);
    assert_eq!(
        reason.to_string(),
        "no lease renew succeeded for 30s (last error: store unreachable)"
    );
}

#[test]
fn a_renew_hanging_past_the_deadline_steps_down() {
    let mut r = renewer_at(s(1));
    assert_eq!(r.tick(s(7)), Some(RenewerAction::Renew));
    assert_eq!(r.tick(s(30)), None);
    assert!(is_deadline(r.tick(s(31))));
    // Its answer, arriving after the step-down, changes nothing.
    assert_eq!(r.outcome(s(32), RenewOutcome::Renewed), None);
    assert!(r.stepped_down().is_some());
}

#[test]
fn a_process_paused_past_the_deadline_steps_down_before_renewing() {
    let mut r = renewer_at(Duration::ZERO);
    assert_eq!(r.tick(s(6)), Some(RenewerAction::Renew));
    assert_eq!(r.outcome(s(6), RenewOutcome::Renewed), None);
    // SIGSTOP for a minute: the first tick after it steps down, it does not renew.
    assert!(is_deadline(r.tick(s(66))));
}

#[test]
fn outcomes_without_a_renew_in_flight_and_clocks_going_back_are_ignored() {
    let mut r = renewer_at(s(10));
    assert_eq!(r.outcome(s(11), RenewOutcome::Renewed), None);
    assert_eq!(r.local_deadline(), s(40));
    assert_eq!(r.tick(s(16)), Some(RenewerAction::Renew));
    assert_eq!(r.outcome(s(17), RenewOutcome::Renewed), None);
    // A tick from the past does not move the machine back.
    assert_eq!(r.tick(s(1)), None);
    assert_eq!(r.local_deadline(), s(46));
}

#[derive(Debug, Clone)]
enum Event {
    Advance(u64),
    Answer(u8),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (0u64..20_000).prop_map(Event::Advance),
        2 => (0u8..10).prop_map(Event::Answer),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// While the renewer has not stepped down, some renew (or the Acquire) sent less than
    /// `renew_deadline` ago succeeded, so the store's expiry (at least send + ttl) is at least
    /// `ttl - renew_deadline` away: the holder never acts on an ownership the store let lapse.
    #[test]
    fn it_never_acts_past_its_newest_success_plus_the_deadline(
        events in prop::collection::vec(event(), 0..80),
    ) {
        let timing = LeaseTiming::default();
        let mut r = Renewer::start(timing, Duration::ZERO);
        let mut now = Duration::ZERO;
        let mut sent: Option<Duration> = None;
        let mut newest_success = Duration::ZERO;
        for event in events {
            let action = match event {
                Event::Advance(n) => {
                    now += ms(n);
                    r.tick(now)
                }
                Event::Answer(kind) => {
                    let outcome = match kind {
                        0 => RenewOutcome::Lost(Staleness::NotHeld),
                        1..=5 => RenewOutcome::Renewed,
                        _ => RenewOutcome::Failed("timeout".into()),
                    };
                    if matches!(outcome, RenewOutcome::Renewed) {
                        if let Some(at) = sent.take() {
                            newest_success = newest_success.max(at);
                        }
                    } else {
                        sent = None;
                    }
                    r.outcome(now, outcome)
                }
            };
            if action == Some(RenewerAction::Renew) {
                prop_assert!(sent.is_none(), "two renews in flight");
                sent = Some(now);
            }
            if r.stepped_down().is_none() {
                prop_assert!(now < newest_success + timing.renew_deadline);
                prop_assert_eq!(r.local_deadline(), newest_success + timing.renew_deadline);
            } else {
                break;
            }
        }
    }
}

// --- Activation bound -------------------------------------------------------------------------

#[test]
fn the_bound_is_four_minutes_with_the_30s_mqtt_defaults() {
    let defaults = ActivationPhases::mqtt_defaults();
    assert_eq!(defaults.hard_bound(), Duration::from_secs(4 * 60));
    assert!(defaults.hard_bound() > LeaseTiming::default().ttl);
}

#[test]
fn the_bound_counts_each_phase_once_by_its_own_timeout() {
    // Distinct magnitudes show each timeout's multiplicity in the sum.
    let phases = ActivationPhases {
        connect_timeout: ms(1),
        subscribe_timeout: ms(10),
        unsubscribe_timeout: ms(100),
        quiescence_timeout: ms(1_000),
        unmatched_grace: ms(10_000),
    };
    assert_eq!(
        phases.hard_bound(),
        ms(2 + 2 * 10 + 100 + 1_000 + 2 * 10_000)
    );
    let names: Vec<_> = phases.phases().iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "initial connection",
            "initial subscription",
            "exact cleanup",
            "ingress quiescence",
            "recycle connection",
            "final subscription",
            "first replay verification",
            "second replay verification",
        ]
    );
}

#[test]
fn the_bound_follows_the_formula_for_several_configs() {
    let formula = |p: &ActivationPhases| {
        p.connect_timeout * 2
            + p.subscribe_timeout * 2
            + p.unsubscribe_timeout
            + p.quiescence_timeout
            + p.unmatched_grace * 2
    };
    let configs = [
        // Wharf's current `mqtt` defaults: 30 s timeouts (UNSUBSCRIBE shares subscribe_timeout),
        // unmatched_grace 5 s, quiescence at the 30 s drain default: 3 min 10 s.
        (s(30), s(30), s(30), s(30), s(5), s(190)),
        // The test harness's fast settings.
        (s(5), s(5), s(5), s(1), ms(300), ms(26_600)),
        (s(10), s(20), s(20), s(30), s(60), s(230)),
        (s(1), s(1), s(1), s(1), s(1), s(8)),
    ];
    for (connect, subscribe, unsubscribe, quiescence, grace, expected) in configs {
        let phases = ActivationPhases {
            connect_timeout: connect,
            subscribe_timeout: subscribe,
            unsubscribe_timeout: unsubscribe,
            quiescence_timeout: quiescence,
            unmatched_grace: grace,
        };
        assert_eq!(phases.hard_bound(), expected);
        assert_eq!(phases.hard_bound(), formula(&phases));
        let sum: Duration = phases.phases().iter().map(|(_, d)| *d).sum();
        assert_eq!(sum, expected);
    }
}

#[test]
fn the_bound_saturates_instead_of_overflowing() {
    let huge = ActivationPhases {
        connect_timeout: Duration::MAX,
        ..ActivationPhases::mqtt_defaults()
    };
    assert_eq!(huge.hard_bound(), Duration::MAX);
}

#[test]
fn the_activation_deadline_is_the_bound_or_a_sooner_caller_deadline() {
    let bound = ActivationPhases::mqtt_defaults().hard_bound();
    assert_eq!(activation_deadline(s(10), bound, None), s(250));
    assert_eq!(activation_deadline(s(10), bound, Some(s(100))), s(100));
    assert_eq!(activation_deadline(s(10), bound, Some(s(900))), s(250));
}
