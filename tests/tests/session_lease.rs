//! The HA lease of an exclusive session on a real SQLite file and a real Postgres schema:
//! acquire, renew, loss, release and expiry are appended events judged by the store's clock;
//! tokens grow with every owner; a renew that changes nothing is a recorded loss; and a ledger
//! write on behalf of a stale claim is refused by the fence in its own transaction, leaving
//! nothing behind.

use std::time::{Duration, Instant};

use wharf::domain::lease::{FencingToken, LeaseError, LeaseHolder, Staleness, LEASE_AGGREGATE};
use wharf::domain::session::{ExactFilter, Qos, MANAGED_SESSION_AGGREGATE};
use wharf::store::LeaseClaim;
use wharf_sessions::SessionError;
use wharf_sessions::{LeaseLedger, RenewVerdict, SessionLedger};
use wharf_tests::{execute_sql, on_both_backends, Backend, TestStore};

const SESSION: &str = "ms-0123456789abcdef0123456789abcdef";

fn holder(name: &str) -> LeaseHolder {
    LeaseHolder::parse("holder", name).expect("valid holder")
}

fn claim(holder: &LeaseHolder, token: FencingToken) -> LeaseClaim {
    LeaseClaim {
        holder: holder.as_str().to_owned(),
        token: token.get() as i64,
    }
}

fn filters(names: &[&str]) -> Vec<(ExactFilter, Qos)> {
    names
        .iter()
        .map(|f| {
            (
                ExactFilter::parse_field("filter", f).expect("valid filter"),
                Qos::AtLeastOnce,
            )
        })
        .collect()
}

async fn event_types(ts: &TestStore, aggregate: &str) -> Vec<String> {
    ts.store
        .load(aggregate, SESSION)
        .await
        .expect("load")
        .into_iter()
        .map(|e| e.event_type)
        .collect()
}

/// Acquires for `who` once the current owner's expiry has passed by the store's clock.
async fn acquire_after_expiry(
    leases: &LeaseLedger,
    who: &LeaseHolder,
    ttl: Duration,
) -> wharf_sessions::Acquired {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match leases.acquire(SESSION, who, ttl).await {
            Ok(acquired) => return acquired,
            Err(SessionError::Lease(LeaseError::Held { .. })) if Instant::now() < deadline => {
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("acquire after expiry: {e}"),
        }
    }
}

async fn lease_lifecycle(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let leases = LeaseLedger::new(ts.store.clone());
    let (a, b) = (holder("host-a-1"), holder("host-b-1"));
    let first = leases
        .acquire(SESSION, &a, Duration::from_secs(30))
        .await
        .expect("a acquires a free lease");
    assert_eq!(first.token, FencingToken(1));

    let held = leases.acquire(SESSION, &b, Duration::from_secs(30)).await;
    assert!(
        matches!(held, Err(SessionError::Lease(LeaseError::Held { ref holder, .. })) if holder == &a),
        "{held:?}"
    );
    match leases.renew(SESSION, &a, first.token).await.expect("renew") {
        RenewVerdict::Renewed { expires_at } => assert!(expires_at >= first.expires_at),
        other => panic!("the owner's renew: {other:?}"),
    }
    let stale = leases.renew(SESSION, &b, first.token).await.expect("renew");
    assert!(
        matches!(stale, RenewVerdict::Lost(Staleness::HeldByOther { .. })),
        "{stale:?}"
    );
    let refused = leases.release(SESSION, &b, first.token).await;
    assert!(
        matches!(
            refused,
            Err(SessionError::Lease(LeaseError::StaleRelease(_)))
        ),
        "{refused:?}"
    );
    leases
        .release(SESSION, &a, first.token)
        .await
        .expect("release");
    let second = leases
        .acquire(SESSION, &b, Duration::from_secs(30))
        .await
        .expect("b acquires the released lease");
    assert_eq!(second.token, FencingToken(2));

    // A fresh ledger (a restarted process) decides from the projected row.
    let restarted = LeaseLedger::new(ts.store.clone());
    let row = restarted.row(SESSION).await.expect("row").expect("a row");
    assert_eq!(row.holder.as_deref(), Some("host-b-1"));
    assert_eq!(row.token, 2);
    let lost = restarted
        .renew(SESSION, &a, first.token)
        .await
        .expect("renew");
    assert!(
        matches!(lost, RenewVerdict::Lost(Staleness::HeldByOther { .. })),
        "{lost:?}"
    );
    assert_eq!(
        event_types(&ts, LEASE_AGGREGATE).await,
        [
            "LeaseAcquired",
            "LeaseRenewed",
            "LeaseLost",
            "LeaseReleased",
            "LeaseAcquired",
            "LeaseLost"
        ]
    );
}

on_both_backends!(acquire_renew_release_and_loss_are_recorded, lease_lifecycle);

async fn stale_writes_are_fenced(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let leases = LeaseLedger::new(ts.store.clone());
    let ledger = SessionLedger::new(ts.store.clone());
    ledger
        .seed(SESSION, Vec::new(), "test")
        .await
        .expect("seed");
    let (a, b) = (holder("host-a-1"), holder("host-b-1"));
    let ttl = Duration::from_millis(300);
    let first = leases.acquire(SESSION, &a, ttl).await.expect("acquire");
    let owner = ledger.fenced(claim(&a, first.token));
    owner
        .remember(SESSION, filters(&["plant/a"]))
        .await
        .expect("the owner's write lands");

    // A made-up token never passes, even for the right holder.
    let forged = ledger.fenced(claim(&a, FencingToken(7)));
    let refused = forged.remember(SESSION, filters(&["plant/forged"])).await;
    assert!(
        matches!(refused, Err(SessionError::Fenced { .. })),
        "{refused:?}"
    );

    // Past the TTL another holder takes over; the old owner's writes are refused.
    let second = acquire_after_expiry(&leases, &b, Duration::from_secs(30)).await;
    assert_eq!(second.token, FencingToken(2));
    let before = event_types(&ts, MANAGED_SESSION_AGGREGATE).await;
    let stale = owner.remember(SESSION, filters(&["plant/stale"])).await;
    match &stale {
        Err(SessionError::Fenced { session_id, reason }) => {
            assert_eq!(session_id, SESSION);
            assert!(
                reason.contains("host-a-1") && reason.contains("token 1"),
                "{reason}"
            );
        }
        other => panic!("a stale owner's write: {other:?}"),
    }
    let forget = owner
        .forget(
            SESSION,
            vec![(ExactFilter::parse_field("filter", "plant/a").unwrap(), 0)],
        )
        .await;
    assert!(
        matches!(forget, Err(SessionError::Fenced { .. })),
        "{forget:?}"
    );
    assert_eq!(
        event_types(&ts, MANAGED_SESSION_AGGREGATE).await,
        before,
        "nothing of a refused write landed"
    );
    ledger
        .fenced(claim(&b, second.token))
        .remember(SESSION, filters(&["plant/b"]))
        .await
        .expect("the new owner's write lands");
    let expired = leases.renew(SESSION, &a, first.token).await.expect("renew");
    assert!(matches!(expired, RenewVerdict::Lost(_)), "{expired:?}");
    let history: Vec<String> = ledger
        .load(SESSION)
        .await
        .expect("load")
        .history
        .expect("known")
        .keys()
        .map(|f| f.as_str().to_owned())
        .collect();
    assert_eq!(history, ["plant/a", "plant/b"]);
}

on_both_backends!(
    a_stale_claims_writes_are_refused_by_the_fence,
    stale_writes_are_fenced
);

async fn superseded_renewals_are_pruned(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let wharf = ts.wharf();
    let leases = LeaseLedger::new(ts.store.clone());
    let a = holder("host-a-1");
    let first = leases
        .acquire(SESSION, &a, Duration::from_secs(30))
        .await
        .expect("acquire");
    for _ in 0..5 {
        leases.renew(SESSION, &a, first.token).await.expect("renew");
    }
    // A loss by another holder does not supersede the newest renewal: its expiry stays.
    leases
        .renew(SESSION, &holder("host-b-1"), first.token)
        .await
        .expect("renew");
    let before = leases.row(SESSION).await.expect("row");
    let options = wharf::projections::PruneOptions {
        retention: Duration::ZERO,
        dry_run: false,
        batch: 2,
    };
    let report = wharf::projections::prune(&ts.store, options)
        .await
        .expect("prune");
    assert_eq!((report.eligible, report.deleted), (4, 4));
    assert_eq!(
        event_types(&ts, LEASE_AGGREGATE).await,
        ["LeaseAcquired", "LeaseRenewed", "LeaseLost"],
        "the newest renewal and every other event stay"
    );
    assert_eq!(leases.row(SESSION).await.expect("row"), before);
    let progress: wharf::store::Progress = std::sync::Arc::new(|_, _| {});
    let verify = wharf
        .read_model()
        .rebuild(wharf::store::RebuildMode::Verify, progress)
        .await
        .expect("verify");
    assert!(verify.is_clean(), "{verify:?}");
    // The lease goes on from the trimmed stream.
    let renewed = LeaseLedger::new(ts.store.clone())
        .renew(SESSION, &a, first.token)
        .await
        .expect("renew");
    assert!(
        matches!(renewed, RenewVerdict::Renewed { .. }),
        "{renewed:?}"
    );
}

on_both_backends!(
    superseded_lease_renewals_are_pruned,
    superseded_renewals_are_pruned
);

/// The lease row is applied event by event in a rebuild (it has no set-based replay), so
/// Verify keeps the live row aside and replays into the table itself: a corrupted row is
/// reported in both directions, survives the verify, and an Apply restores it.
async fn verify_reports_a_corrupted_lease_row(backend: Backend) {
    let ts = TestStore::new(backend).await;
    let wharf = ts.wharf();
    let leases = LeaseLedger::new(ts.store.clone());
    let a = holder("host-a-1");
    leases
        .acquire(SESSION, &a, Duration::from_secs(30))
        .await
        .expect("acquire");
    let before = leases.row(SESSION).await.expect("row");
    execute_sql(&ts.store, "UPDATE session_lease SET token = token + 7").await;
    let corrupted = leases.row(SESSION).await.expect("row");
    assert_ne!(corrupted, before);
    let progress: wharf::store::Progress = std::sync::Arc::new(|_, _| {});
    let read = wharf.read_model();
    let verify = read
        .rebuild(wharf::store::RebuildMode::Verify, progress.clone())
        .await
        .expect("verify");
    let found: Vec<(&str, u64, u64)> = verify
        .differences
        .iter()
        .map(|d| (d.table.as_str(), d.only_live, d.only_rebuilt))
        .collect();
    assert_eq!(found, vec![("session_lease", 1, 1)], "{verify:?}");
    assert_eq!(
        leases.row(SESSION).await.expect("row"),
        corrupted,
        "Verify changes nothing"
    );
    read.rebuild(wharf::store::RebuildMode::Apply, progress.clone())
        .await
        .expect("rebuild");
    assert_eq!(leases.row(SESSION).await.expect("row"), before);
    let again = read
        .rebuild(wharf::store::RebuildMode::Verify, progress)
        .await
        .expect("verify");
    assert!(again.is_clean(), "{again:?}");
}

on_both_backends!(
    verify_reports_a_corrupted_lease_row_and_apply_restores_it,
    verify_reports_a_corrupted_lease_row
);
