//! The consumer lifecycle machine, rule by rule, with no clock: given a history of inputs at
//! given times, when one more input arrives, then these states are published and this is
//! what the driver does next. The property tests at the end run arbitrary histories of
//! answers and times against the TTL bound.
//!
//! Timing throughout: `instance_ttl` 3 s (so a call's deadline is 1 s), heartbeats every
//! 500 ms, retries every 200 ms. Times are milliseconds on the driver's monotonic clock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use wharf_domain::consumer::{
    AttemptFailure, CallFailure, ConsumerLifecycle, ConsumerState, HeartbeatAnswer, Input, Install,
    LifecycleTiming, Next, Note, Step,
};
use wharf_domain::{
    BindingSet, DeclarationError, DeclarerId, GroupName, RegisterOutcome, TopicName,
};

const TTL: u64 = 3_000;
const CALL: u64 = 1_000;
const BEAT: u64 = 500;
const RETRY: u64 = 200;
/// The install the instance joins in most tests.
const INSTALL: i64 = 7;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn timing() -> LifecycleTiming {
    LifecycleTiming::new(ms(TTL), ms(BEAT), ms(RETRY))
}

fn own_set() -> BindingSet {
    BindingSet::parse(&["orders/+/paid", "orders/eu/#"]).expect("valid set")
}

fn other_set() -> BindingSet {
    BindingSet::parse(&["orders/#"]).expect("valid set")
}

fn store_time(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000 + secs, 0).expect("in range")
}

// --- Inputs ------------------------------------------------------------------------------------

fn joined() -> Input {
    Input::Attempted(Ok(RegisterOutcome::Joined {
        effective: own_set(),
    }))
}

fn waiting(declared_at: DateTime<Utc>) -> Input {
    Input::Attempted(Ok(RegisterOutcome::Waiting {
        incumbent: other_set(),
        live_declarers: vec![DeclarerId::parse("declarer", "old").expect("valid")],
        declared_at,
    }))
}

fn attempt_failed() -> Input {
    Input::Attempted(Err(AttemptFailure::Call(CallFailure::Error(
        "connection refused".into(),
    ))))
}

fn refused() -> Input {
    Input::Attempted(Err(AttemptFailure::Refused(
        DeclarationError::TopicMismatch {
            group: GroupName::parse("group", "billing").expect("valid"),
            bound: TopicName::parse("topic", "orders").expect("valid"),
            requested: TopicName::parse("topic", "invoices").expect("valid"),
        },
    )))
}

/// The group's install read back: `position` with this instance's own set (in another order:
/// a set is compared sorted).
fn own_install(position: i64) -> Input {
    Input::InstallRead(Ok(Some(Install {
        position,
        patterns: vec!["orders/eu/#".into(), "orders/+/paid".into()],
    })))
}

fn other_install(position: i64) -> Input {
    Input::InstallRead(Ok(Some(Install {
        position,
        patterns: other_set().patterns(),
    })))
}

fn read_unanswered() -> Input {
    Input::InstallRead(Err(CallFailure::NoAnswer))
}

fn recorded() -> Input {
    Input::Heartbeat(Ok(HeartbeatAnswer::Recorded))
}

fn beat_failed() -> Input {
    Input::Heartbeat(Err(CallFailure::Error("connection reset".into())))
}

fn beat_unanswered() -> Input {
    Input::Heartbeat(Err(CallFailure::NoAnswer))
}

// --- Given / when / then -----------------------------------------------------------------------

/// A lifecycle under test and the step its last input made.
struct Lifecycle {
    machine: ConsumerLifecycle,
    last: Step,
}

/// Given a consumer that started at `at`: its first attempt is in flight.
fn given_started_at(at: u64) -> Lifecycle {
    let mut machine = ConsumerLifecycle::new(own_set(), timing());
    let last = machine.start(ms(at));
    assert_eq!(
        last.next,
        Next::Attempt {
            first_declared_at: None,
            deadline: ms(at + CALL)
        },
        "the first attempt is sent at once"
    );
    Lifecycle { machine, last }
}

/// Given a consumer whose join was sent at `sent` and answered (attempt, then install read)
/// at `answered`: consuming under [`INSTALL`], joins 1.
fn given_consuming(sent: u64, answered: u64) -> Lifecycle {
    let mut lifecycle = given_started_at(sent);
    lifecycle.when(answered, joined());
    lifecycle.when(answered, own_install(INSTALL));
    lifecycle.then_ready(INSTALL, 1);
    lifecycle
}

impl Lifecycle {
    /// When `input` arrives at `at` ms.
    fn when(&mut self, at: u64, input: Input) -> &mut Self {
        self.last = self.machine.step(ms(at), input);
        self
    }

    /// Then the driver is told to do `next`.
    fn then_next(&mut self, next: Next) -> &mut Self {
        assert_eq!(self.last.next, next, "state {:?}", self.machine.state());
        self
    }

    /// Then the state is `state`.
    fn then_state(&mut self, state: &ConsumerState) -> &mut Self {
        assert_eq!(self.machine.state(), state);
        self
    }

    fn then_ready(&mut self, install: i64, joins: u64) -> &mut Self {
        assert_eq!(
            self.machine.state(),
            &ConsumerState::Consuming {
                bindings: own_set(),
                install,
                joins
            }
        );
        self
    }

    fn then_not_ready(&mut self) -> &mut Self {
        assert!(
            !self.machine.state().is_ready(),
            "not ready: {:?}",
            self.machine.state()
        );
        self
    }

    fn then_stalled_by(&mut self, prefix: &str) -> &mut Self {
        match self.machine.state() {
            ConsumerState::Stalled { reason } => {
                assert!(reason.starts_with(prefix), "{reason}")
            }
            other => panic!("expected stalled by {prefix:?}, got {other:?}"),
        }
        self
    }

    /// Then this step published exactly `states`.
    fn then_published(&mut self, states: &[ConsumerState]) -> &mut Self {
        let published: Vec<ConsumerState> = self.last.published().cloned().collect();
        assert_eq!(published, states);
        self
    }

    fn then_noted(&mut self, note: &Note) -> &mut Self {
        assert!(
            self.last.notes().any(|n| n == note),
            "{note:?} in {:?}",
            self.last.effects
        );
        self
    }

    /// Then a re-declaration starts: `Declaring` is published and an attempt sent at `at`.
    fn then_redeclares_at(&mut self, at: u64) -> &mut Self {
        self.then_published(&[ConsumerState::Declaring])
            .then_next(Next::Attempt {
                first_declared_at: None,
                deadline: ms(at + CALL),
            })
    }
}

fn heartbeat_by(deadline: u64) -> Next {
    Next::Heartbeat {
        deadline: ms(deadline),
    }
}

fn read_by(deadline: u64) -> Next {
    Next::ReadInstall {
        deadline: ms(deadline),
    }
}

fn wait_until(at: u64) -> Next {
    Next::Wait {
        until: Some(ms(at)),
    }
}

// --- Ready only in effect ----------------------------------------------------------------------

#[test]
fn ready_only_after_a_join_and_the_install_read_back_as_its_own() {
    let mut consumer = given_started_at(0);
    consumer.then_state(&ConsumerState::Declaring);
    // The join alone is not enough: the install in effect is read first.
    consumer
        .when(40, joined())
        .then_next(read_by(1_040))
        .then_published(&[])
        .then_state(&ConsumerState::Declaring);
    consumer
        .when(60, own_install(INSTALL))
        .then_ready(INSTALL, 1)
        .then_noted(&Note::InEffect {
            outcome: RegisterOutcome::Joined {
                effective: own_set(),
            },
            install: INSTALL,
        })
        // The first heartbeat a heartbeat interval after.
        .then_next(wait_until(60 + BEAT));
    assert_eq!(
        consumer.machine.lapse(),
        Some(ms(TTL)),
        "from the join's send"
    );
}

#[test]
fn a_join_whose_install_is_another_set_is_not_ready_and_declares_again_after_the_retry() {
    let mut consumer = given_started_at(0);
    consumer.when(40, joined());
    consumer
        .when(60, other_install(8))
        .then_noted(&Note::NotOwnAfterJoin {
            current: Some(Install {
                position: 8,
                patterns: other_set().patterns(),
            }),
        })
        .then_published(&[])
        .then_not_ready()
        .then_next(wait_until(60 + RETRY));
    consumer
        .when(60 + RETRY, Input::Tick)
        .then_next(Next::Attempt {
            first_declared_at: None,
            deadline: ms(60 + RETRY + CALL),
        });
    consumer.when(300, joined());
    consumer
        .when(310, Input::InstallRead(Ok(None)))
        .then_not_ready();
}

#[test]
fn a_waiting_instance_is_never_ready_and_states_its_first_declaration_on_every_retry() {
    let mut consumer = given_started_at(0);
    let declared_at = store_time(0);
    consumer
        .when(30, waiting(declared_at))
        .then_state(&ConsumerState::Waiting {
            incumbent: other_set(),
            live_declarers: vec![DeclarerId::parse("declarer", "old").expect("valid")],
            declared_at,
            attempts: 1,
        })
        .then_next(wait_until(30 + RETRY));
    // An early tick changes nothing.
    consumer.when(100, Input::Tick).then_next(wait_until(230));
    consumer.when(230, Input::Tick).then_next(Next::Attempt {
        first_declared_at: Some(declared_at),
        deadline: ms(230 + CALL),
    });
    consumer.when(260, waiting(declared_at));
    assert!(matches!(
        consumer.machine.state(),
        ConsumerState::Waiting { attempts: 2, .. }
    ));
    consumer.when(460, Input::Tick);
    consumer.when(470, joined());
    consumer
        .when(480, own_install(INSTALL))
        .then_ready(INSTALL, 1);
}

#[test]
fn a_refused_declaration_fails_for_good_and_leaves_once_stopped() {
    let mut consumer = given_started_at(0);
    consumer
        .when(20, refused())
        .then_next(Next::Wait { until: None });
    let ConsumerState::Failed { reason } = consumer.machine.state().clone() else {
        panic!("failed: {:?}", consumer.machine.state())
    };
    assert!(reason.contains("invoices"), "{reason}");
    // No time ends it: only a stop, and then the claim loop's drain.
    consumer
        .when(60_000, Input::Tick)
        .then_next(Next::Wait { until: None });
    consumer
        .when(60_001, Input::Stop)
        .then_next(Next::Wait { until: None });
    consumer.when(60_002, Input::Halt).then_next(Next::Leave {
        deadline: ms(60_002 + CALL),
    });
    consumer
        .when(60_010, Input::Left(Ok(())))
        .then_published(&[ConsumerState::Stopped])
        .then_next(Next::End);
}

#[test]
fn a_failed_attempt_stalls_and_retries() {
    let mut consumer = given_started_at(0);
    consumer
        .when(10, attempt_failed())
        .then_stalled_by("declaration attempt failed: connection refused")
        .then_next(wait_until(10 + RETRY));
    consumer.when(210, Input::Tick);
    consumer
        .when(
            1_210,
            Input::Attempted(Err(AttemptFailure::Call(CallFailure::NoAnswer))),
        )
        .then_stalled_by("declaration attempt: no answer from the store within its deadline");
}

// --- Stalled at once ---------------------------------------------------------------------------

#[test]
fn a_failed_heartbeat_stalls_at_once_and_the_next_round_comes_a_heartbeat_interval_later() {
    let mut consumer = given_consuming(0, 10);
    consumer
        .when(510, Input::Tick)
        .then_next(heartbeat_by(1_510));
    consumer
        .when(520, beat_failed())
        .then_stalled_by("heartbeat failed: connection reset")
        .then_noted(&Note::HeartbeatUnconfirmed {
            reason: "heartbeat failed: connection reset".into(),
        })
        .then_next(wait_until(1_020));
    // Stalled is not consuming; the lapse is still the join's send plus the TTL.
    assert_eq!(consumer.machine.lapse(), Some(ms(TTL)));
}

#[test]
fn an_unanswered_install_check_after_a_recorded_heartbeat_stalls_too() {
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer.when(520, recorded()).then_next(read_by(1_520));
    consumer
        .when(1_520, read_unanswered())
        .then_stalled_by("reading the group's install: no answer");
    assert_eq!(consumer.machine.lapse(), Some(ms(TTL)), "not confirmed");
}

// --- Readiness bounded by the TTL --------------------------------------------------------------

#[test]
fn a_heartbeat_confirmed_a_millisecond_before_the_lapse_keeps_it_consuming() {
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer.when(1_510, beat_unanswered());
    consumer
        .when(2_010, Input::Tick)
        .then_next(heartbeat_by(TTL));
    consumer.when(2_500, recorded()).then_next(read_by(TTL));
    consumer
        .when(TTL - 1, own_install(INSTALL))
        .then_ready(INSTALL, 1)
        .then_noted(&Note::Resumed)
        .then_next(wait_until(TTL - 1 + BEAT));
    // The lapse moved to that heartbeat's send plus the TTL.
    assert_eq!(consumer.machine.lapse(), Some(ms(2_010 + TTL)));
    consumer
        .when(TTL, Input::Tick)
        .then_ready(INSTALL, 1)
        .then_next(wait_until(TTL - 1 + BEAT));
}

#[test]
fn a_confirmation_that_arrives_at_the_lapse_does_not_count() {
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer.when(1_510, beat_unanswered());
    consumer.when(2_010, Input::Tick);
    consumer.when(2_500, recorded());
    consumer
        .when(TTL, own_install(INSTALL))
        .then_noted(&Note::Lapsed)
        .then_redeclares_at(TTL);
}

#[test]
fn the_lapse_counts_from_the_send_of_the_last_confirmed_heartbeat_not_its_answer() {
    // The join was sent at 0 and answered 900 ms later: the lapse is at 3 s, not 3.9 s.
    let mut consumer = given_consuming(0, 900);
    assert_eq!(consumer.machine.lapse(), Some(ms(TTL)));
    // A heartbeat sent at 1.4 s, recorded and checked only at 2.3 s: the lapse is 4.4 s.
    consumer
        .when(1_400, Input::Tick)
        .then_next(heartbeat_by(2_400));
    consumer.when(2_000, recorded());
    consumer
        .when(2_300, own_install(INSTALL))
        .then_ready(INSTALL, 1);
    assert_eq!(consumer.machine.lapse(), Some(ms(1_400 + TTL)));
    // From then on nothing is confirmed: stalled, and the waits end at the lapse.
    consumer
        .when(2_800, Input::Tick)
        .then_next(heartbeat_by(3_800));
    consumer
        .when(3_800, beat_unanswered())
        .then_next(wait_until(4_300));
    consumer
        .when(4_300, Input::Tick)
        .then_next(heartbeat_by(4_400));
    consumer
        .when(4_399, Input::Tick)
        .then_stalled_by("heartbeat");
    // Its deadline was the lapse: unanswered by then, it stalls and lapses in one step.
    consumer
        .when(4_400, beat_unanswered())
        .then_noted(&Note::Lapsed)
        .then_published(&[
            ConsumerState::Stalled {
                reason: "heartbeat: no answer from the store within its deadline".into(),
            },
            ConsumerState::Declaring,
        ])
        .then_next(Next::Attempt {
            first_declared_at: None,
            deadline: ms(4_400 + CALL),
        });
}

#[test]
fn a_lapsed_instance_declares_again_before_it_is_ready_again_and_counts_a_second_join() {
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer.when(1_510, beat_unanswered());
    consumer.when(2_010, Input::Tick);
    consumer
        .when(TTL, beat_unanswered())
        .then_noted(&Note::Lapsed)
        .then_state(&ConsumerState::Declaring);
    // The store is back: a heartbeat is no longer what brings readiness back, a join is.
    consumer.when(3_020, joined());
    consumer
        .when(3_030, own_install(INSTALL))
        .then_ready(INSTALL, 2);
}

#[test]
fn every_call_has_the_call_deadline_and_none_outlives_the_lapse() {
    let mut consumer = given_started_at(100);
    // Declaring: the attempt's deadline is a third of the TTL.
    consumer.when(400, joined()).then_next(read_by(1_400));
    consumer.when(500, own_install(INSTALL));
    // Far from the lapse (3.1 s): now + a third of the TTL.
    consumer
        .when(1_000, Input::Tick)
        .then_next(heartbeat_by(2_000));
    consumer.when(2_000, beat_unanswered());
    consumer
        .when(2_500, Input::Tick)
        .then_next(heartbeat_by(3_100));
    consumer.when(2_600, recorded()).then_next(read_by(3_100));
    // The next round would start at 3.2 s: the wait ends at the lapse instead.
    consumer
        .when(2_700, read_unanswered())
        .then_next(wait_until(3_100));
    consumer.when(3_100, Input::Tick).then_noted(&Note::Lapsed);
    // And the install read after a join never outlives that join's lapse.
    let mut slow = given_started_at(0);
    slow.when(2_500, joined()).then_next(read_by(TTL));
}

#[test]
fn a_join_answered_past_its_lapse_is_not_in_effect() {
    let mut consumer = given_started_at(0);
    consumer
        .when(TTL, joined())
        .then_stalled_by("the join was confirmed only after the instance TTL")
        .then_next(wait_until(TTL + RETRY));
    let mut late_read = given_started_at(0);
    late_read.when(2_900, joined());
    late_read
        .when(TTL, own_install(INSTALL))
        .then_stalled_by("the join was confirmed only after the instance TTL");
}

// --- Resume within the TTL ---------------------------------------------------------------------

#[test]
fn a_late_confirmation_within_the_ttl_resumes_under_the_same_install() {
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer
        .when(600, beat_failed())
        .then_stalled_by("heartbeat");
    consumer
        .when(1_100, Input::Tick)
        .then_next(heartbeat_by(2_100));
    // Recorded slowly; its check answered just before the deadline.
    consumer.when(1_900, recorded()).then_next(read_by(2_900));
    consumer
        .when(2_899, own_install(INSTALL))
        .then_published(&[ConsumerState::Consuming {
            bindings: own_set(),
            install: INSTALL,
            joins: 1,
        }])
        .then_next(wait_until(2_899 + BEAT));
    assert_eq!(consumer.machine.lapse(), Some(ms(1_100 + TTL)));
}

#[test]
fn a_confirmed_heartbeat_while_ready_publishes_nothing() {
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer.when(520, recorded());
    consumer
        .when(530, own_install(INSTALL))
        .then_published(&[])
        .then_next(wait_until(1_030));
    assert_eq!(consumer.machine.lapse(), Some(ms(510 + TTL)));
}

// --- Declaring again: row gone, install moved, fenced ------------------------------------------

#[test]
fn a_heartbeat_that_finds_its_row_gone_declares_again_at_once() {
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer
        .when(520, Input::Heartbeat(Ok(HeartbeatAnswer::RowGone)))
        .then_noted(&Note::RowGone)
        .then_redeclares_at(520);
}

#[test]
fn an_install_that_moved_on_declares_again_even_with_the_same_set() {
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer.when(520, recorded());
    // A->B->A: the same set under a newer install is still a move.
    consumer
        .when(530, own_install(INSTALL + 3))
        .then_noted(&Note::InstallMoved {
            joined: INSTALL,
            current: Some(Install {
                position: INSTALL + 3,
                patterns: vec!["orders/eu/#".into(), "orders/+/paid".into()],
            }),
        })
        .then_redeclares_at(530);
    consumer.when(540, joined());
    consumer
        .when(550, own_install(INSTALL + 3))
        .then_ready(INSTALL + 3, 2);
}

#[test]
fn a_fetch_fenced_from_its_install_declares_again_and_one_from_another_is_ignored() {
    let mut consumer = given_consuming(0, 10);
    consumer
        .when(100, Input::Fenced(INSTALL - 1))
        .then_published(&[])
        .then_next(wait_until(510));
    consumer
        .when(200, Input::Fenced(INSTALL))
        .then_noted(&Note::Fenced { install: INSTALL })
        .then_redeclares_at(200);
}

// --- Drain, then leave -------------------------------------------------------------------------

#[test]
fn shutdown_heartbeats_while_the_claim_loop_drains_then_leaves() {
    let mut consumer = given_consuming(0, 10);
    // Stop: the claim loop stops claiming and drains; the instance stays in effect meanwhile.
    consumer
        .when(100, Input::Stop)
        .then_ready(INSTALL, 1)
        .then_next(wait_until(510));
    consumer
        .when(510, Input::Tick)
        .then_next(heartbeat_by(1_510));
    consumer.when(520, recorded());
    consumer
        .when(530, own_install(INSTALL))
        .then_next(wait_until(1_030));
    // Drained: heartbeat no more, leave.
    consumer
        .when(700, Input::Halt)
        .then_published(&[])
        .then_next(Next::Leave {
            deadline: ms(700 + CALL),
        });
    consumer
        .when(720, Input::Left(Err(CallFailure::NoAnswer)))
        .then_noted(&Note::LeaveFailed {
            reason: "leave: no answer from the store within its deadline".into(),
        })
        .then_published(&[ConsumerState::Stopped])
        .then_next(Next::End);
}

#[test]
fn a_drain_that_ends_during_a_heartbeat_leaves_after_its_answer() {
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer
        .when(515, Input::Halt)
        .then_next(Next::Await)
        .then_ready(INSTALL, 1);
    consumer.when(520, recorded()).then_next(read_by(1_520));
    consumer
        .when(530, own_install(INSTALL))
        .then_next(Next::Leave {
            deadline: ms(530 + CALL),
        });
}

#[test]
fn a_stop_while_declaring_ends_declaring_and_leaves_once_drained() {
    let mut consumer = given_started_at(0);
    consumer
        .when(10, attempt_failed())
        .then_next(wait_until(210));
    consumer
        .when(50, Input::Stop)
        .then_next(Next::Wait { until: None });
    consumer
        .when(210, Input::Tick)
        .then_next(Next::Wait { until: None });
    consumer.when(300, Input::Halt).then_next(Next::Leave {
        deadline: ms(1_300),
    });
}

#[test]
fn a_stop_given_while_an_attempt_is_in_flight_sends_no_further_attempt() {
    let mut consumer = given_started_at(0);
    consumer.when(5, Input::Stop).then_next(Next::Await);
    consumer
        .when(10, waiting(store_time(0)))
        .then_next(Next::Wait { until: None });
    // A stop also ends a re-declaration before its first attempt.
    let mut consumer = given_consuming(0, 10);
    consumer.when(510, Input::Tick);
    consumer.when(515, Input::Stop);
    consumer
        .when(520, Input::Heartbeat(Ok(HeartbeatAnswer::RowGone)))
        .then_published(&[ConsumerState::Declaring])
        .then_next(Next::Wait { until: None });
}

#[test]
fn answers_nobody_asked_for_change_nothing() {
    let mut consumer = given_consuming(0, 10);
    consumer
        .when(100, recorded())
        .then_published(&[])
        .then_next(wait_until(510));
    consumer.when(110, joined()).then_next(wait_until(510));
    consumer.when(120, own_install(99)).then_ready(INSTALL, 1);
}

// --- Properties --------------------------------------------------------------------------------

/// How the store answers one call, and when.
#[derive(Debug, Clone)]
struct Move {
    /// How long after the call (or the wait's start) the answer or signal comes.
    delay: u64,
    /// 0..=5: ok; 6..=7: failed; 8: the other answer (waiting, row gone, install moved);
    /// 9: no answer.
    kind: u8,
    /// During a wait: a fetch fenced from the install joined, before the wait's end.
    fence: bool,
}

fn moves() -> impl Strategy<Value = Vec<Move>> {
    prop::collection::vec(
        (0..2_000u64, 0..10u8, prop::bool::weighted(0.05)).prop_map(|(delay, kind, fence)| Move {
            delay,
            kind,
            fence,
        }),
        1..120,
    )
}

/// Drives a lifecycle through `moves` as a driver would (every answer by its call's deadline)
/// and checks, after every step, the bound by an oracle of its own: the send time of the
/// last call whose round confirmed the heartbeat (an attempt that joined and read its own
/// install back; a heartbeat recorded and checked against the same install).
fn run(moves: &[Move]) -> Result<(), TestCaseError> {
    let ttl = ms(TTL);
    let mut machine = ConsumerLifecycle::new(own_set(), timing());
    let mut now = ms(0);
    let mut next = machine.start(now).next;
    // The round in flight: whether it is a join (else a heartbeat), and its call's send time.
    let mut round: Option<(bool, Duration)> = None;
    let mut install = INSTALL;
    // The oracle's last confirmed send, while the instance holds a join.
    let mut confirmed: Option<Duration> = None;
    for step in moves {
        let delay = ms(step.delay);
        let input = match next.clone() {
            Next::Attempt { deadline, .. } => {
                prop_assert!(deadline <= now + ms(CALL));
                let sent = now;
                now = (now + delay).min(deadline);
                if step.kind == 9 || now == deadline {
                    now = deadline;
                    Input::Attempted(Err(AttemptFailure::Call(CallFailure::NoAnswer)))
                } else if step.kind <= 5 {
                    round = Some((true, sent));
                    joined()
                } else if step.kind == 8 {
                    waiting(store_time(0))
                } else {
                    attempt_failed()
                }
            }
            Next::ReadInstall { deadline } => {
                let (join, round_sent) = round.take().expect("a read ends a round");
                prop_assert!(deadline <= now + ms(CALL));
                prop_assert!(deadline > now, "a read is never sent past its deadline");
                prop_assert!(
                    deadline <= confirmed.unwrap_or(round_sent) + ttl,
                    "never past the lapse"
                );
                now = (now + delay).min(deadline);
                if step.kind == 9 || now == deadline {
                    now = deadline;
                    read_unanswered()
                } else if step.kind <= 5 {
                    // The install this instance holds (or joins now) read back: confirmed.
                    confirmed = Some(match confirmed {
                        Some(before) if !join => before.max(round_sent),
                        _ => round_sent,
                    });
                    own_install(install)
                } else if step.kind == 8 {
                    install += 1;
                    other_install(install)
                } else {
                    Input::InstallRead(Err(CallFailure::Error("read failed".into())))
                }
            }
            Next::Heartbeat { deadline } => {
                let sent = now;
                let lapse = confirmed.expect("heartbeats only while joined") + ttl;
                prop_assert!(deadline <= now + ms(CALL));
                prop_assert!(deadline <= lapse, "the heartbeat never outlives the lapse");
                prop_assert!(deadline > now, "never sent past the lapse");
                now = (now + delay).min(deadline);
                if step.kind == 9 || now == deadline {
                    now = deadline;
                    beat_unanswered()
                } else if step.kind <= 5 {
                    round = Some((false, sent));
                    recorded()
                } else if step.kind == 8 {
                    Input::Heartbeat(Ok(HeartbeatAnswer::RowGone))
                } else {
                    beat_failed()
                }
            }
            Next::Wait { until } => {
                let until = until.expect("no stop is given, so every wait has an end");
                prop_assert!(until >= now);
                if step.fence && now + delay < until {
                    now += delay;
                    Input::Fenced(install)
                } else if step.kind == 0 && now + delay < until {
                    // An early wake-up.
                    now += delay;
                    Input::Tick
                } else {
                    now = until;
                    Input::Tick
                }
            }
            Next::Await | Next::Leave { .. } | Next::End => {
                return Err(TestCaseError::fail(format!("unexpected {next:?}")));
            }
        };
        let outcome = machine.step(now, input);
        next = outcome.next.clone();
        if !matches!(next, Next::ReadInstall { .. }) {
            round = None;
        }
        if outcome.published().any(|s| *s == ConsumerState::Declaring) {
            // A re-declaration: only a new join makes it ready again.
            confirmed = None;
        }
        if machine.state().is_ready() {
            let confirmed = confirmed
                .ok_or_else(|| TestCaseError::fail("consuming without a confirmed join"))?;
            prop_assert!(
                now < confirmed + ttl,
                "consuming at {now:?}, the TTL from the last confirmed send {confirmed:?} passed"
            );
            prop_assert_eq!(machine.lapse(), Some(confirmed + ttl));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_consuming_at_or_past_the_ttl_from_the_last_confirmed_send(moves in moves()) {
        run(&moves)?;
    }
}

proptest! {
    #[test]
    fn a_halt_always_ends_in_a_leave_then_stopped(moves in moves(), halt_at in 0..120usize) {
        let mut machine = ConsumerLifecycle::new(own_set(), timing());
        let mut now = ms(0);
        let mut next = machine.start(now).next;
        for (i, step) in moves.iter().enumerate() {
            if i == halt_at {
                match machine.step(now, Input::Halt).next {
                    Next::Await => {} // the call in flight is still to be answered
                    other => next = other,
                }
            }
            now += ms(step.delay);
            let input = match next {
                Next::Attempt { .. } => if step.kind <= 5 { joined() } else { attempt_failed() },
                Next::ReadInstall { .. } => own_install(INSTALL),
                Next::Heartbeat { .. } => if step.kind <= 5 { recorded() } else { beat_failed() },
                Next::Wait { .. } | Next::Await => Input::Tick,
                Next::Leave { .. } => break,
                Next::End => unreachable!("left without a leave"),
            };
            next = machine.step(now, input).next;
        }
        if !machine.halted() {
            match machine.step(now, Input::Halt).next {
                Next::Await => {}
                other => next = other,
            }
        }
        // Whatever was in flight is answered; then it leaves.
        for _ in 0..3 {
            next = match next {
                Next::Attempt { .. } => machine.step(now, attempt_failed()).next,
                Next::ReadInstall { .. } => machine.step(now, own_install(INSTALL)).next,
                Next::Heartbeat { .. } => machine.step(now, recorded()).next,
                other => other,
            };
        }
        prop_assert!(matches!(next, Next::Leave { .. }), "{next:?}");
        let last = machine.step(now, Input::Left(Ok(())));
        prop_assert_eq!(last.next, Next::End);
        prop_assert_eq!(machine.state(), &ConsumerState::Stopped);
    }
}
