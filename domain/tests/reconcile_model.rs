//! A property test of the reconcile state machine against a simple model of the world.
//!
//! The model is the durable ledger (what Remember/Forget commits wrote), the broker's possible
//! filters (every filter a SUBSCRIBE was sent for, until a success UNSUBACK), and the
//! connections. Arbitrary steps: connects, disconnects, ledger commits, SUBACKs and UNSUBACKs
//! with arbitrary outcomes (short, partial, refused, downgraded, for old connections),
//! deliveries (replays or not, with or without subscription ids), time, and a crash at any step
//! (the machine is dropped, optionally after its pending ledger write committed, and rebuilt
//! from the durable history). After the steps, a well-behaved broker must bring it to Full
//! unless it went terminal. The invariants are checked after every step.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use proptest::prelude::*;
use wharf_domain::session::{
    subscription_id, Action, ExactFilter, FilterRecord, Input, Qos, ReconcileSettings, Reconciler,
    SessionLevel, SubscribeOutcome,
};

const GRACE: Duration = Duration::from_secs(5);

const FILTERS: [&str; 10] = [
    "a",
    "a/b",
    "a/#",
    "+/b",
    "#",
    "b/+",
    "$share/g/a/#",
    "$share/h/a/b",
    "$share/g/+/b",
    "$share/g/#",
];
const TOPICS: [&str; 7] = ["a", "a/b", "b", "b/b", "c/b", "zz/y", "$s/b"];

fn filter(index: usize) -> ExactFilter {
    ExactFilter::parse(FILTERS[index % FILTERS.len()]).expect("valid filter")
}

#[derive(Debug, Clone)]
enum SubChoice {
    AsRequested,
    Granted(u8),
    Refused,
    Omitted,
}

#[derive(Debug, Clone)]
enum Step {
    Connect,
    Disconnect,
    CommitRemember,
    CommitForget,
    SubAck(Vec<SubChoice>),
    UnsubAck(Vec<Option<u8>>),
    Deliver {
        topic: usize,
        via: usize,
        dup: bool,
        with_id: bool,
    },
    Advance(u64),
    /// A SUBACK and an UNSUBACK that claim success, for the previous connection.
    OldAcks,
    Crash {
        commit_first: bool,
    },
}

fn sub_choice() -> impl Strategy<Value = SubChoice> {
    prop_oneof![
        6 => Just(SubChoice::AsRequested),
        1 => (0u8..3).prop_map(SubChoice::Granted),
        1 => Just(SubChoice::Refused),
        1 => Just(SubChoice::Omitted),
    ]
}

fn unsub_choice() -> impl Strategy<Value = Option<u8>> {
    prop_oneof![
        4 => Just(Some(0x00)),
        2 => Just(Some(0x11)),
        1 => Just(Some(0x80)),
        1 => Just(Some(0x87)),
        1 => Just(None),
    ]
}

fn delivery() -> impl Strategy<Value = Step> {
    (
        0..TOPICS.len(),
        0..FILTERS.len(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(topic, via, dup, with_id)| Step::Deliver {
            topic,
            via,
            dup,
            with_id,
        })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Connect),
        1 => Just(Step::Disconnect),
        3 => Just(Step::CommitRemember),
        3 => Just(Step::CommitForget),
        4 => prop::collection::vec(sub_choice(), 0..12).prop_map(Step::SubAck),
        4 => prop::collection::vec(unsub_choice(), 0..12).prop_map(Step::UnsubAck),
        6 => delivery(),
        3 => (0u64..12_000).prop_map(Step::Advance),
        1 => Just(Step::OldAcks),
        1 => any::<bool>().prop_map(|commit_first| Step::Crash { commit_first }),
    ]
}

/// The world the machine runs in, and what the model knows about it.
#[derive(Debug)]
struct World {
    desired: BTreeMap<ExactFilter, Qos>,
    machine: Reconciler,
    /// The ledger: what Remember/Forget commits wrote.
    durable: BTreeSet<ExactFilter>,
    /// Filters that may exist at the broker.
    broker: BTreeSet<ExactFilter>,
    now: Duration,
    generation: u64,
    connected: Option<u64>,
    connected_at: Duration,
    remember: Option<Vec<(ExactFilter, Qos)>>,
    forget: Option<Vec<(ExactFilter, u8)>>,
    /// The most filters the first Remember may carry; each next one at most twice as many.
    wave: usize,
    /// Remembers the current machine instance issued.
    remembers_issued: u32,
    /// Subscribe actions not answered yet: connection and filters.
    subscribes: Vec<(u64, Vec<(ExactFilter, Qos)>)>,
    /// The current connection's SUBACK outcomes so far, and the filters sent on it.
    answered: BTreeMap<ExactFilter, SubscribeOutcome>,
    sent: BTreeSet<ExactFilter>,
    last_unsubscribe: Option<(u64, Vec<ExactFilter>)>,
    /// Per machine instance: generation of the newest Unsubscribe of each filter.
    unsubscribed_on: BTreeMap<ExactFilter, u64>,
    /// Per machine instance: generation of the newest success UNSUBACK of each filter.
    removed_on: BTreeMap<ExactFilter, u64>,
    /// Removed (this instance) and no Forget issued yet: the verification window.
    in_window: BTreeMap<ExactFilter, u64>,
    /// Delivery id -> its connection, topic and arrival, for undecided deliveries.
    open_deliveries: BTreeMap<u64, (u64, String, Duration)>,
    /// The connection on which a SUBACK granted every desired filter at its QoS.
    granted_on: Option<u64>,
    decided: BTreeSet<u64>,
    migrated_ids: BTreeSet<u64>,
    terminal: bool,
    next_id: u64,
}

impl World {
    fn new(
        desired: BTreeMap<ExactFilter, Qos>,
        history: BTreeSet<ExactFilter>,
        broker: BTreeSet<ExactFilter>,
        wave: usize,
    ) -> Self {
        let machine = build(&desired, &history, wave);
        Self {
            desired,
            machine,
            durable: history,
            broker,
            now: Duration::from_secs(100),
            generation: 0,
            connected: None,
            connected_at: Duration::ZERO,
            remember: None,
            forget: None,
            wave,
            remembers_issued: 0,
            subscribes: Vec::new(),
            answered: BTreeMap::new(),
            sent: BTreeSet::new(),
            last_unsubscribe: None,
            unsubscribed_on: BTreeMap::new(),
            removed_on: BTreeMap::new(),
            in_window: BTreeMap::new(),
            open_deliveries: BTreeMap::new(),
            granted_on: None,
            decided: BTreeSet::new(),
            migrated_ids: BTreeSet::new(),
            terminal: false,
            next_id: 0,
        }
    }

    fn feed(&mut self, input: Input) -> Vec<Action> {
        let actions = self.machine.handle(input, self.now);
        self.check(&actions);
        actions
    }

    fn connect(&mut self) -> Vec<Action> {
        let mut actions = self.disconnect();
        self.generation += 1;
        self.connected = Some(self.generation);
        self.connected_at = self.now;
        self.answered.clear();
        self.sent.clear();
        let generation = self.generation;
        actions.extend(self.feed(Input::Connected {
            generation,
            session_present: true,
        }));
        actions
    }

    fn disconnect(&mut self) -> Vec<Action> {
        let Some(generation) = self.connected.take() else {
            return Vec::new();
        };
        self.open_deliveries.retain(|_, (g, _, _)| *g != generation);
        self.feed(Input::Disconnected { generation })
    }

    fn commit_remember(&mut self) -> Vec<Action> {
        let Some(list) = self.remember.take() else {
            return Vec::new();
        };
        self.durable.extend(list.into_iter().map(|(f, _)| f));
        self.feed(Input::Remembered)
    }

    fn commit_forget(&mut self) -> Vec<Action> {
        let Some(list) = self.forget.take() else {
            return Vec::new();
        };
        for (f, _) in list {
            self.durable.remove(&f);
        }
        self.feed(Input::Forgotten)
    }

    fn suback(&mut self, choices: &[SubChoice]) -> Vec<Action> {
        if self.subscribes.is_empty() {
            return Vec::new();
        }
        // Answers may come in any order.
        let pick = choices.len() % self.subscribes.len();
        let (generation, sent) = self.subscribes.remove(pick);
        let outcomes = sent
            .iter()
            .zip(
                choices
                    .iter()
                    .chain(std::iter::repeat(&SubChoice::AsRequested)),
            )
            .filter_map(|((f, q), choice)| {
                let outcome = match choice {
                    SubChoice::AsRequested => SubscribeOutcome::Granted { qos: *q },
                    SubChoice::Granted(level) => SubscribeOutcome::Granted {
                        qos: Qos::try_from(*level).expect("0..3"),
                    },
                    SubChoice::Refused => SubscribeOutcome::Refused { reason_code: 0x87 },
                    SubChoice::Omitted => return None,
                };
                Some((f.clone(), outcome))
            })
            .collect::<Vec<_>>();
        if self.connected == Some(generation) {
            self.answered.extend(outcomes.iter().cloned());
            let all_granted = self.desired.iter().all(|(f, q)| {
                self.answered
                    .get(f)
                    .is_some_and(|outcome| outcome.satisfies(*q))
            });
            if all_granted {
                self.granted_on = Some(generation);
            }
        }
        self.feed(Input::SubAck {
            generation,
            outcomes,
        })
    }

    fn unsuback(&mut self, choices: &[Option<u8>]) -> Vec<Action> {
        let Some((generation, sent)) = self.last_unsubscribe.take() else {
            return Vec::new();
        };
        let outcomes: Vec<(ExactFilter, u8)> = sent
            .iter()
            .zip(choices.iter().chain(std::iter::repeat(&Some(0x00))))
            .filter_map(|(f, reason)| reason.map(|r| (f.clone(), r)))
            .collect();
        for (f, reason) in &outcomes {
            if matches!(reason, 0x00 | 0x11) {
                // The broker dropped it, whether or not the ack reaches a live machine.
                self.broker.remove(f);
                if self.connected == Some(generation) {
                    self.removed_on.insert(f.clone(), generation);
                    self.in_window.insert(f.clone(), generation);
                }
            }
        }
        self.feed(Input::UnsubAck {
            generation,
            outcomes,
        })
    }

    fn deliver(&mut self, topic: usize, via: usize, dup: bool, with_id: bool) -> Vec<Action> {
        let Some(generation) = self.connected else {
            return Vec::new();
        };
        let via = filter(via);
        let topic = if via.matches(TOPICS[topic]) {
            TOPICS[topic].to_owned()
        } else {
            TOPICS
                .iter()
                .find(|t| via.matches(t))
                .map_or("nothing/here".into(), |t| (*t).to_owned())
        };
        self.next_id += 1;
        let id = self.next_id;
        let ids = if with_id {
            vec![subscription_id(&via)]
        } else {
            vec![]
        };
        let expect_migration = !self.terminal
            && dup
            && self.replays_through_removed_shared(&topic, &via, with_id, generation);
        self.open_deliveries
            .insert(id, (generation, topic.clone(), self.now));
        let input = Input::Delivery {
            id,
            generation,
            topic,
            dup,
            subscription_ids: ids,
        };
        let actions = self.feed(input);
        let migrated = actions
            .iter()
            .any(|a| matches!(a, Action::RequireMigration { .. }));
        assert_eq!(migrated, expect_migration, "delivery {id}: {actions:?}");
        if migrated {
            assert!(actions.contains(&Action::Hold { id }), "{actions:?}");
            assert!(actions.contains(&Action::Disconnect), "{actions:?}");
            self.migrated_ids.insert(id);
        }
        actions
    }

    /// The model's view of rule 5: a replay through a removed shared filter, in its window.
    fn replays_through_removed_shared(
        &self,
        topic: &str,
        via: &ExactFilter,
        with_id: bool,
        generation: u64,
    ) -> bool {
        let windowed = |f: &ExactFilter| {
            f.is_shared() && self.in_window.get(f).is_some_and(|g| *g < generation)
        };
        let known = |f: &ExactFilter| {
            self.desired.contains_key(f) || self.machine.history().contains_key(f)
        };
        if with_id && via.matches(topic) {
            // A shared filter's identifier names it; the plain filters' shared identifier says
            // "through a plain subscription", attributed to the known plain filters that match.
            if via.is_shared() && known(via) {
                return windowed(via);
            }
            let known_plain = self
                .desired
                .keys()
                .chain(self.machine.history().keys())
                .any(|f| !f.is_shared() && f.matches(topic));
            if !via.is_shared() && known_plain {
                return false;
            }
        }
        let desired_hit = self.desired.keys().any(|f| f.matches(topic));
        !desired_hit
            && self
                .machine
                .history()
                .keys()
                .any(|f| f.matches(topic) && windowed(f))
    }

    fn old_acks(&mut self) {
        let Some(old) = self.generation.checked_sub(1).filter(|g| *g > 0) else {
            return;
        };
        let granted = self
            .desired
            .iter()
            .map(|(f, q)| (f.clone(), SubscribeOutcome::Granted { qos: *q }))
            .collect();
        let removed = self.durable.iter().map(|f| (f.clone(), 0x00)).collect();
        let suback = self.feed(Input::SubAck {
            generation: old,
            outcomes: granted,
        });
        let unsuback = self.feed(Input::UnsubAck {
            generation: old,
            outcomes: removed,
        });
        assert!(
            suback.is_empty() && unsuback.is_empty(),
            "acted on an old connection's acks"
        );
    }

    fn crash(&mut self, commit_first: bool) {
        if commit_first {
            if let Some(list) = self.remember.take() {
                self.durable.extend(list.into_iter().map(|(f, _)| f));
            }
            if let Some(list) = self.forget.take() {
                for (f, _) in list {
                    self.durable.remove(&f);
                }
            }
        }
        self.remember = None;
        self.forget = None;
        self.connected = None;
        self.subscribes.clear();
        self.last_unsubscribe = None;
        self.unsubscribed_on.clear();
        self.removed_on.clear();
        self.in_window.clear();
        self.open_deliveries.clear();
        // A terminal machine is kept: its ledger says migration required.
        if !self.terminal {
            self.machine = build(&self.desired, &self.durable, self.wave);
            self.remembers_issued = 0;
        }
    }

    /// Applies the actions' effects on the world and checks the invariants.
    fn check(&mut self, actions: &[Action]) {
        for action in actions {
            self.check_action(action);
        }
        assert!(
            self.broker.is_subset(&self.durable),
            "broker {:?} not within durable history {:?}",
            self.broker,
            self.durable
        );
        if self.machine.level() == SessionLevel::Full {
            let desired: BTreeSet<ExactFilter> = self.desired.keys().cloned().collect();
            assert_eq!(self.durable, desired, "Full with history != desired");
            assert!(self.machine.pending_stale().is_empty());
            assert!(self.forget.is_none() && self.remember.is_none());
        }
        if self.terminal {
            assert_eq!(self.machine.level(), SessionLevel::MigrationRequired);
        }
        self.check_deadline();
        let level = self.machine.level();
        if level >= SessionLevel::Subscribed && !self.terminal && !self.desired.is_empty() {
            assert_eq!(
                self.granted_on, self.connected,
                "{level} without a full SUBACK"
            );
        }
    }

    /// `next_deadline` is honest: a Tick before it changes nothing; with none, no Tick does.
    fn check_deadline(&self) {
        let mut probe = self.machine.clone();
        let quiet_until = match probe.next_deadline() {
            Some(deadline) if deadline > self.now => deadline - Duration::from_nanos(1),
            Some(deadline) => panic!(
                "deadline {deadline:?} passed unhandled at {:?}: {probe:?}",
                self.now
            ),
            None => self.now + Duration::from_secs(3600),
        };
        let actions = probe.handle(Input::Tick, quiet_until);
        assert!(
            actions.is_empty(),
            "a Tick before the deadline acted: {actions:?}"
        );
    }

    fn check_action(&mut self, action: &Action) {
        match action {
            Action::Remember(list) => {
                assert!(self.remember.is_none(), "two Remembers outstanding");
                let most = self.wave << self.remembers_issued;
                assert!(
                    !list.is_empty() && list.len() <= most,
                    "Remember {} of {} filters, first wave {}",
                    self.remembers_issued,
                    list.len(),
                    self.wave
                );
                self.remembers_issued += 1;
                self.remember = Some(list.clone());
            }
            Action::Subscribe(list) => {
                let generation = self.connected.expect("Subscribe while connected");
                for (f, q) in list {
                    assert!(
                        self.durable.contains(f),
                        "SUBSCRIBE {f} before it was durable"
                    );
                    assert_eq!(self.desired.get(f), Some(q));
                    assert!(
                        self.sent.insert(f.clone()),
                        "{f} subscribed twice on one connection"
                    );
                    self.broker.insert(f.clone());
                }
                assert!(!list.is_empty(), "an empty Subscribe");
                self.subscribes.push((generation, list.clone()));
            }
            Action::Unsubscribe(list) => {
                let generation = self.connected.expect("Unsubscribe while connected");
                for f in list {
                    assert!(!self.desired.contains_key(f) && self.durable.contains(f));
                    self.unsubscribed_on.insert(f.clone(), generation);
                }
                self.last_unsubscribe = Some((generation, list.clone()));
            }
            Action::Forget(list) => self.check_forget(list),
            Action::Dispatch { id } | Action::AckUnmatched { id } => self.check_ack(*id, action),
            Action::Hold { id } => {
                assert!(self.decided.insert(*id), "delivery {id} decided twice");
                self.open_deliveries.remove(id);
            }
            Action::RequireMigration { .. } => self.terminal = true,
            Action::Recycle | Action::Disconnect | Action::Failed { .. } | Action::Level(_) => {}
        }
    }

    fn check_forget(&mut self, list: &[(ExactFilter, u8)]) {
        assert!(!self.terminal, "Forget after migration required");
        assert!(self.forget.is_none(), "two Forgets outstanding");
        let generation = self.connected.expect("Forget while connected");
        for (f, reason) in list {
            assert!(matches!(reason, 0x00 | 0x11));
            let removed = self.removed_on.get(f).copied();
            let sent = self.unsubscribed_on.get(f).copied();
            assert!(
                removed.is_some() && removed >= sent,
                "Forget {f} without a success UNSUBACK at least as new as its UNSUBSCRIBE"
            );
            assert!(removed < Some(generation), "Forget {f} without a recycle");
            assert!(
                self.now >= self.connected_at + GRACE,
                "Forget {f} before the window ended"
            );
            assert!(!self.broker.contains(f));
            self.in_window.remove(f);
        }
        self.forget = Some(list.to_vec());
    }

    fn check_ack(&mut self, id: u64, action: &Action) {
        assert!(
            !self.migrated_ids.contains(&id) && !self.terminal,
            "{action:?} after migration"
        );
        assert!(self.decided.insert(id), "delivery {id} decided twice");
        let (generation, topic, arrived) =
            self.open_deliveries.remove(&id).expect("an open delivery");
        assert_eq!(
            Some(generation),
            self.connected,
            "acked on another connection"
        );
        let desired_hit = self.desired.keys().any(|f| f.matches(&topic));
        let stale_hit = self
            .durable
            .iter()
            .any(|f| !self.desired.contains_key(f) && f.matches(&topic));
        assert!(
            !stale_hit || desired_hit,
            "{action:?} of {topic} covered only by a pending stale filter"
        );
        if matches!(action, Action::Dispatch { .. }) {
            // Before a recycle, dispatch only when nothing stale awaits removal.
            let recycled = self.removed_on.values().any(|g| *g < generation);
            let stale = self.durable.iter().any(|f| !self.desired.contains_key(f));
            assert!(recycled || !stale, "Dispatch of {topic} before the recycle");
        } else {
            assert!(
                self.now >= arrived + GRACE,
                "AckUnmatched of {topic} within the grace"
            );
        }
        if matches!(action, Action::AckUnmatched { .. }) {
            assert!(
                !desired_hit && !stale_hit,
                "AckUnmatched of {topic}, which a filter matches"
            );
        }
    }

    fn run_returning(&mut self, step: &Step) -> Vec<Action> {
        match step {
            Step::Deliver {
                topic,
                via,
                dup,
                with_id,
            } => self.deliver(*topic, *via, *dup, *with_id),
            _ => Vec::new(),
        }
    }

    fn run(&mut self, step: &Step) {
        match step {
            Step::Connect => {
                self.connect();
            }
            Step::Disconnect => {
                self.disconnect();
            }
            Step::CommitRemember => {
                self.commit_remember();
            }
            Step::CommitForget => {
                self.commit_forget();
            }
            Step::SubAck(choices) => {
                self.suback(choices);
            }
            Step::UnsubAck(choices) => {
                self.unsuback(choices);
            }
            Step::Deliver {
                topic,
                via,
                dup,
                with_id,
            } => {
                self.deliver(*topic, *via, *dup, *with_id);
            }
            Step::Advance(ms) => {
                self.now += Duration::from_millis(*ms);
                self.feed(Input::Tick);
            }
            Step::Crash { commit_first } => self.crash(*commit_first),
            Step::OldAcks => self.old_acks(),
        }
    }

    /// A well-behaved world from here on: every write commits, every filter is granted and
    /// removed, time passes. Returns once Full (or terminal), or gives up after some rounds.
    /// `late` deliveries arrive along the way, one every other round, the rest once Full.
    fn converge(&mut self, late: &[Step]) {
        let mut queue: VecDeque<Action> = VecDeque::new();
        let mut late = late.iter();
        for round in 0..200 {
            if round % 2 == 1 {
                if let Some(step) = late.next() {
                    queue.extend(self.run_returning(step));
                }
            }
            if self.terminal || self.machine.level() == SessionLevel::Full {
                for step in late.by_ref() {
                    self.run(step);
                }
                self.now += GRACE;
                self.feed(Input::Tick);
                return;
            }
            let actions = match queue.pop_front() {
                Some(action) => self.respond(action),
                None if self.remember.is_some() => self.commit_remember(),
                None if self.forget.is_some() => self.commit_forget(),
                None if self.connected.is_none() => self.connect(),
                None if !self.subscribes.is_empty() => self.suback(&[]),
                None if self.last_unsubscribe.is_some() => self.unsuback(&[]),
                None => {
                    self.now += GRACE;
                    let ticked = self.feed(Input::Tick);
                    if ticked.is_empty() {
                        // Nothing to wait for: a failed attempt retries on a new connection.
                        self.connect()
                    } else {
                        ticked
                    }
                }
            };
            queue.extend(actions);
        }
    }

    fn respond(&mut self, action: Action) -> Vec<Action> {
        match action {
            Action::Recycle => self.connect(),
            Action::Failed { .. } => self.connect(),
            _ => Vec::new(),
        }
    }
}

fn build(
    desired: &BTreeMap<ExactFilter, Qos>,
    history: &BTreeSet<ExactFilter>,
    wave: usize,
) -> Reconciler {
    let history = history
        .iter()
        .map(|f| {
            (
                f.clone(),
                FilterRecord {
                    qos: desired.get(f).copied(),
                    ..FilterRecord::default()
                },
            )
        })
        .collect();
    let desired = desired.iter().map(|(f, q)| (f.clone(), *q)).collect();
    let settings = ReconcileSettings::new(GRACE).with_first_wave(wave);
    Reconciler::new(desired, history, settings).expect("valid")
}

fn world() -> impl Strategy<Value = World> {
    let n = FILTERS.len();
    (
        prop::collection::vec(prop::option::weighted(0.4, 0u8..3), n),
        prop::collection::vec(any::<bool>(), n),
        prop::collection::vec(any::<bool>(), n),
        prop_oneof![Just(1usize), Just(2), Just(3), Just(1000)],
    )
        .prop_map(move |(desired, history, broker, wave)| {
            let desired: BTreeMap<ExactFilter, Qos> = (0..n)
                .filter_map(|i| desired[i].map(|q| (filter(i), Qos::try_from(q).expect("0..3"))))
                .collect();
            let history: BTreeSet<ExactFilter> =
                (0..n).filter(|i| history[*i]).map(filter).collect();
            let broker = history
                .iter()
                .enumerate()
                .filter(|(i, _)| broker[*i])
                .map(|(_, f)| f.clone())
                .collect();
            World::new(desired, history, broker, wave)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn the_machine_keeps_every_invariant_and_converges(
        mut world in world(),
        steps in prop::collection::vec(step(), 0..80),
        late in prop::collection::vec(delivery(), 0..12),
    ) {
        for step in &steps {
            world.run(step);
        }
        world.converge(&late);
        prop_assert!(
            world.terminal || world.machine.level() == SessionLevel::Full,
            "did not converge: level {}, last failure {:?}",
            world.machine.level(),
            world.machine.last_failure()
        );
    }
}
