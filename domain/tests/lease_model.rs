//! The lease ledger against a model, under random acquire / renew / release / crash / clock
//! sequences by several holders: at most one claim passes the fence at any store time, tokens
//! strictly increase with every change of owner, and a stale claim's fence, renew and release
//! always fail.

use std::collections::BTreeSet;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use proptest::prelude::*;
use wharf_domain::lease::{
    fence, FencingToken, Lease, LeaseCommand, LeaseError, LeaseEvent, LeaseHolder,
};

const PROCESSES: usize = 3;

#[derive(Debug, Clone)]
enum Step {
    Acquire {
        process: usize,
        ttl_ms: u64,
    },
    Renew {
        process: usize,
    },
    Release {
        process: usize,
    },
    /// A claim some process once had (an older token, or a crashed incarnation's) renews.
    StaleRenew {
        pick: usize,
    },
    /// The same, releasing.
    StaleRelease {
        pick: usize,
    },
    /// The process dies; its restart is a new holder (a new incarnation).
    Crash {
        process: usize,
    },
    Advance {
        ms: u64,
    },
    /// The store's clock steps back (an NTP correction): safety must not depend on it.
    ClockBack {
        ms: u64,
    },
    ObserveExpiry,
}

fn step() -> impl Strategy<Value = Step> {
    let process = 0..PROCESSES;
    prop_oneof![
        4 => (process.clone(), 1u64..60_000).prop_map(|(process, ttl_ms)| Step::Acquire {
            process,
            ttl_ms
        }),
        5 => process.clone().prop_map(|process| Step::Renew { process }),
        2 => process.clone().prop_map(|process| Step::Release { process }),
        2 => any::<usize>().prop_map(|pick| Step::StaleRenew { pick }),
        1 => any::<usize>().prop_map(|pick| Step::StaleRelease { pick }),
        1 => process.prop_map(|process| Step::Crash { process }),
        4 => (0u64..40_000).prop_map(|ms| Step::Advance { ms }),
        1 => (0u64..3_000).prop_map(|ms| Step::ClockBack { ms }),
        1 => Just(Step::ObserveExpiry),
    ]
}

/// The model's owner: holder, token, expiry, TTL in ms.
type ModelOwner = (LeaseHolder, FencingToken, DateTime<Utc>, u64);

/// The model: who owns the lease until when, and the next token.
#[derive(Debug, Default)]
struct Model {
    owner: Option<ModelOwner>,
    next_token: u64,
}

impl Model {
    fn live(&self, now: DateTime<Utc>) -> Option<(&LeaseHolder, FencingToken)> {
        self.owner
            .as_ref()
            .filter(|(_, _, expires, _)| now < *expires)
            .map(|(h, t, _, _)| (h, *t))
    }

    fn holds(&self, holder: &LeaseHolder, token: FencingToken, now: DateTime<Utc>) -> bool {
        self.live(now) == Some((holder, token))
    }
}

struct World {
    state: Lease,
    events: Vec<LeaseEvent>,
    model: Model,
    now: DateTime<Utc>,
    incarnation: [u32; PROCESSES],
    belief: [Option<FencingToken>; PROCESSES],
    /// Every (holder, token) ever issued.
    claims: Vec<(LeaseHolder, FencingToken)>,
    acquired_tokens: Vec<FencingToken>,
}

fn ms(n: u64) -> TimeDelta {
    TimeDelta::milliseconds(i64::try_from(n).expect("small"))
}

impl World {
    fn new() -> Self {
        Self {
            state: Lease::default(),
            events: Vec::new(),
            model: Model {
                next_token: 1,
                ..Model::default()
            },
            now: Utc.timestamp_opt(1_800_000_000, 0).single().expect("time"),
            incarnation: [0; PROCESSES],
            belief: [None; PROCESSES],
            claims: Vec::new(),
            acquired_tokens: Vec::new(),
        }
    }

    fn holder(&self, process: usize) -> LeaseHolder {
        let name = format!("p{process}-i{}", self.incarnation[process]);
        LeaseHolder::parse("holder", &name).expect("valid")
    }

    /// What the process renews or releases with: its token, or when it believes it holds
    /// nothing, its incarnation's newest token (or 1).
    fn claim(&self, process: usize) -> (LeaseHolder, FencingToken) {
        let holder = self.holder(process);
        let token = self.belief[process].unwrap_or_else(|| {
            self.claims
                .iter()
                .rev()
                .find(|(h, _)| *h == holder)
                .map_or(FencingToken(1), |(_, t)| *t)
        });
        (holder, token)
    }

    fn append(&mut self, events: Vec<LeaseEvent>) {
        for event in events {
            if let LeaseEvent::Acquired { holder, token, .. } = &event {
                self.claims.push((holder.clone(), *token));
                self.acquired_tokens.push(*token);
            }
            cqrs_es::Aggregate::apply(&mut self.state, event.clone());
            self.events.push(event);
        }
    }

    fn decide(&mut self, command: LeaseCommand) -> Result<Vec<LeaseEvent>, LeaseError> {
        let result = self.state.decide(&command);
        if let Ok(events) = &result {
            self.append(events.clone());
        }
        result
    }

    fn run(&mut self, step: &Step) -> Result<(), TestCaseError> {
        match step {
            Step::Acquire { process, ttl_ms } => self.acquire(*process, *ttl_ms)?,
            Step::Renew { process } => {
                let (holder, token) = self.claim(*process);
                if !self.renew(holder, token)? {
                    self.belief[*process] = None;
                }
            }
            Step::Release { process } => {
                let (holder, token) = self.claim(*process);
                self.release(holder, token)?;
                self.belief[*process] = None;
            }
            Step::StaleRenew { pick } => {
                if let Some((holder, token)) = self.stale_claim(*pick) {
                    prop_assert!(!self.renew(holder, token)?, "a stale claim renewed");
                }
            }
            Step::StaleRelease { pick } => {
                if let Some((holder, token)) = self.stale_claim(*pick) {
                    prop_assert!(!self.release(holder, token)?, "a stale claim released");
                }
            }
            Step::Crash { process } => {
                self.incarnation[*process] += 1;
                self.belief[*process] = None;
            }
            Step::Advance { ms: n } => self.now += ms(*n),
            Step::ClockBack { ms: n } => self.now -= ms(*n),
            Step::ObserveExpiry => self.observe_expiry()?,
        }
        self.check()
    }

    /// A claim that does not hold now: an older token, or a crashed incarnation's.
    fn stale_claim(&self, pick: usize) -> Option<(LeaseHolder, FencingToken)> {
        let stale: Vec<_> = self
            .claims
            .iter()
            .filter(|(h, t)| !self.model.holds(h, *t, self.now))
            .cloned()
            .collect();
        (!stale.is_empty()).then(|| stale[pick % stale.len()].clone())
    }

    fn acquire(&mut self, process: usize, ttl_ms: u64) -> Result<(), TestCaseError> {
        let holder = self.holder(process);
        let result = self.decide(LeaseCommand::Acquire {
            holder: holder.clone(),
            ttl: std::time::Duration::from_millis(ttl_ms),
            now: self.now,
        });
        match (self.model.live(self.now).is_some(), result) {
            (true, Err(LeaseError::Held { .. })) => {}
            (false, Ok(events)) => {
                let token = FencingToken(self.model.next_token);
                prop_assert_eq!(events.last().map(|e| e.token()), Some(token));
                self.model.next_token += 1;
                self.model.owner = Some((holder, token, self.now + ms(ttl_ms), ttl_ms));
                self.belief[process] = Some(token);
            }
            (live, result) => {
                return Err(TestCaseError::fail(format!(
                    "acquire with a live owner {live}: {result:?}"
                )))
            }
        }
        Ok(())
    }

    /// Renews (holder, token); true when it renewed.
    fn renew(&mut self, holder: LeaseHolder, token: FencingToken) -> Result<bool, TestCaseError> {
        let holds = self.model.holds(&holder, token, self.now);
        let events = self
            .decide(LeaseCommand::Renew {
                holder,
                token,
                now: self.now,
            })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        if holds {
            prop_assert!(
                matches!(events.as_slice(), [LeaseEvent::Renewed { .. }]),
                "a holding renew appended {:?}",
                events
            );
            if let Some(owner) = self.model.owner.as_mut() {
                owner.2 = self.now + ms(owner.3);
            }
        } else {
            prop_assert!(
                matches!(events.last(), Some(LeaseEvent::Lost { .. })),
                "a stale renew was not a definitive loss: {:?}",
                events
            );
            if matches!(events.first(), Some(LeaseEvent::Expired { .. })) {
                self.model.owner = None;
            }
        }
        Ok(holds)
    }

    /// Releases (holder, token); true when it released.
    fn release(&mut self, holder: LeaseHolder, token: FencingToken) -> Result<bool, TestCaseError> {
        let holds = self.model.holds(&holder, token, self.now);
        let result = self.decide(LeaseCommand::Release {
            holder,
            token,
            now: self.now,
        });
        match (holds, result) {
            (true, Ok(events)) => {
                prop_assert!(
                    matches!(events.as_slice(), [LeaseEvent::Released { .. }]),
                    "a holding release appended {:?}",
                    events
                );
                self.model.owner = None;
            }
            (false, Err(LeaseError::StaleRelease(_))) => {}
            (holds, result) => {
                return Err(TestCaseError::fail(format!(
                    "release by a holder {holds}: {result:?}"
                )))
            }
        }
        Ok(holds)
    }

    fn observe_expiry(&mut self) -> Result<(), TestCaseError> {
        let events = self
            .decide(LeaseCommand::ObserveExpiry { now: self.now })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let expired = self.model.owner.is_some() && self.model.live(self.now).is_none();
        prop_assert_eq!(events.len(), usize::from(expired));
        if expired {
            self.model.owner = None;
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(&Lease::fold(&self.events), &self.state, "replay differs");
        // Tokens strictly increase with every change of owner, one at a time, from 1.
        for (i, token) in self.acquired_tokens.iter().enumerate() {
            prop_assert_eq!(token.get(), i as u64 + 1);
        }
        prop_assert_eq!(
            self.state.last_token.get(),
            self.acquired_tokens.len() as u64
        );
        let unique: BTreeSet<_> = self.claims.iter().cloned().collect();
        let probes = [
            self.now,
            self.now + ms(1),
            self.now - ms(60_000),
            self.now + ms(30_000),
            self.now + ms(120_000),
        ];
        for probe in probes {
            let passing: Vec<_> = unique
                .iter()
                .filter(|(h, t)| fence(&self.state, h, *t, probe).is_ok())
                .collect();
            prop_assert!(passing.len() <= 1, "several claims pass: {:?}", passing);
            // Every claim but the current ownership fails, at any store time.
            for (holder, token) in &unique {
                let current = self
                    .state
                    .owner
                    .as_ref()
                    .is_some_and(|o| &o.holder == holder && o.token == *token);
                if !current {
                    prop_assert!(fence(&self.state, holder, *token, probe).is_err());
                }
            }
        }
        // The fence agrees with the model now.
        for (holder, token) in &unique {
            prop_assert_eq!(
                fence(&self.state, holder, *token, self.now).is_ok(),
                self.model.holds(holder, *token, self.now)
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn one_claim_at_most_passes_the_fence_and_stale_claims_never_do(
        steps in prop::collection::vec(step(), 0..60),
    ) {
        let mut world = World::new();
        for step in &steps {
            world.run(step)?;
        }
    }
}
