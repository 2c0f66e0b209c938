//! The same cases for every [`Ledger`] implementation: the claim rule, leases, saved
//! responses, purge. Each backend's tests call [`check`] on a fresh (or uniquely prefixed)
//! ledger.

use std::time::{Duration, SystemTime};

use super::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerErrorKind, OperationStatus, SavedResponse,
};

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200 + secs)
}

fn claim(key: &str, fingerprint: &str, owner: &str, now: u64) -> Claim {
    Claim {
        key: key.to_owned(),
        scope: "conformance".to_owned(),
        fingerprint: fingerprint.to_owned(),
        owner: owner.to_owned(),
        now: at(now),
        lease_until: at(now + 60),
        expires_at: at(now + 3600),
        window_cutoff: at(now) - Duration::from_secs(600),
    }
}

fn update(key: &str, owner: &str, now: u64) -> AttemptUpdate {
    AttemptUpdate {
        key: key.to_owned(),
        owner: owner.to_owned(),
        at: at(now),
        lease_until: at(now + 60),
    }
}

fn finish(
    key: &str,
    owner: &str,
    status: OperationStatus,
    response: Option<SavedResponse>,
) -> Finish {
    Finish {
        key: key.to_owned(),
        owner: owner.to_owned(),
        status,
        response,
    }
}

/// Runs every case; keys start with `prefix` so several runs can share one table.
pub(crate) async fn check(ledger: &dyn Ledger, prefix: &str) {
    let k = |name: &str| format!("{prefix}-{name}");

    // A new key: inserted, in flight under the claimant's lease.
    let key = k("a");
    let Claimed::New(row) = ledger
        .claim(&claim(&key, "f1", "w1", 0))
        .await
        .expect("claim")
    else {
        panic!("first claim must insert");
    };
    assert_eq!(row.status, OperationStatus::InFlight);
    assert_eq!(row.attempts, 0);
    assert_eq!(row.first_attempt_at, at(0));
    assert_eq!(row.lease_owner.as_deref(), Some("w1"));
    assert_eq!(row.expires_at, at(3600));

    // Under a live lease, another claimant gets the row unchanged.
    let Claimed::Existing(row) = ledger
        .claim(&claim(&key, "f1", "w2", 10))
        .await
        .expect("claim")
    else {
        panic!("a live lease must not be taken");
    };
    assert_eq!(row.lease_owner.as_deref(), Some("w1"));

    // Only the holder may record or finish.
    for err in [
        ledger
            .record_attempt(&update(&key, "w2", 10))
            .await
            .expect_err("not the holder"),
        ledger
            .finish(&finish(&key, "w2", OperationStatus::Unknown, None))
            .await
            .expect_err("not the holder"),
    ] {
        assert_eq!(err.kind(), LedgerErrorKind::LeaseLost);
    }
    ledger
        .record_attempt(&update(&key, "w1", 20))
        .await
        .expect("record");
    ledger
        .record_attempt(&update(&key, "w1", 30))
        .await
        .expect("record");
    ledger
        .finish(&finish(&key, "w1", OperationStatus::Unknown, None))
        .await
        .expect("finish");
    let row = ledger.get(&key).await.expect("get").expect("row");
    assert_eq!(row.attempts, 2);
    assert_eq!(row.last_attempt_at, Some(at(30)));
    assert_eq!(row.lease_owner, None);
    assert_eq!(row.lease_expires_at, None);
    assert_eq!(row.status, OperationStatus::Unknown);

    // A finished run's lease cannot be reused.
    let err = ledger
        .record_attempt(&update(&key, "w1", 40))
        .await
        .expect_err("released");
    assert_eq!(err.kind(), LedgerErrorKind::LeaseLost);

    // Another request under the same key: refused by the caller, never taken over.
    let Claimed::Existing(_) = ledger
        .claim(&claim(&key, "f2", "w2", 40))
        .await
        .expect("claim")
    else {
        panic!("a different fingerprint must not be taken over");
    };

    // Outside the window: not taken over.
    let Claimed::Existing(_) = ledger
        .claim(&claim(&key, "f1", "w2", 700))
        .await
        .expect("claim")
    else {
        panic!("a row outside the window must not be taken over");
    };

    // Unknown, inside the window: taken over, history kept.
    let Claimed::TakenOver { record, previous } = ledger
        .claim(&claim(&key, "f1", "w2", 50))
        .await
        .expect("claim")
    else {
        panic!("an unknown row must be taken over");
    };
    assert_eq!(previous, OperationStatus::Unknown);
    assert_eq!(record.attempts, 2);
    assert_eq!(record.first_attempt_at, at(0));
    assert_eq!(record.lease_owner.as_deref(), Some("w2"));
    assert_eq!(record.status, OperationStatus::InFlight);

    // A lapsed lease (a crashed run) is taken over too.
    let Claimed::TakenOver { previous, .. } = ledger
        .claim(&claim(&key, "f1", "w3", 111))
        .await
        .expect("claim")
    else {
        panic!("a lapsed lease must be taken over");
    };
    assert_eq!(previous, OperationStatus::InFlight);
    let err = ledger
        .record_attempt(&update(&key, "w2", 112))
        .await
        .expect_err("lost");
    assert_eq!(err.kind(), LedgerErrorKind::LeaseLost);

    // A saved response round-trips; a succeeded row is never taken over.
    let saved = SavedResponse::new(
        201,
        vec![
            ("content-type".into(), "application/json".into()),
            ("location".into(), "/v1/charges/ch_1".into()),
        ],
        Some(b"{\"id\":\"ch_1\"}\x00\xff".to_vec()),
    );
    ledger
        .finish(&finish(
            &key,
            "w3",
            OperationStatus::Succeeded,
            Some(saved.clone()),
        ))
        .await
        .expect("finish");
    let Claimed::Existing(row) = ledger
        .claim(&claim(&key, "f1", "w4", 120))
        .await
        .expect("claim")
    else {
        panic!("a succeeded row must not be taken over");
    };
    assert_eq!(row.status, OperationStatus::Succeeded);
    assert_eq!(row.response, Some(saved));

    // A body over the limit is saved as absent, not empty.
    let key = k("b");
    ledger
        .claim(&claim(&key, "f", "w1", 0))
        .await
        .expect("claim");
    let unsaved = SavedResponse::new(200, Vec::new(), None);
    ledger
        .finish(&finish(
            &key,
            "w1",
            OperationStatus::Succeeded,
            Some(unsaved.clone()),
        ))
        .await
        .expect("finish");
    let row = ledger.get(&key).await.expect("get").expect("row");
    assert_eq!(row.response, Some(unsaved));
    assert_eq!(ledger.get(&k("missing")).await.expect("get"), None);
}

/// Purges in batches; run on an otherwise empty ledger.
pub(crate) async fn check_purge(ledger: &dyn Ledger) {
    for i in 0..5u64 {
        let mut c = claim(&format!("purge-{i}"), "f", "w", 0);
        c.expires_at = at(100 + i);
        ledger.claim(&c).await.expect("claim");
    }
    assert_eq!(ledger.purge_batch(at(99), 10).await.expect("purge"), 0);
    assert_eq!(ledger.purge_batch(at(104), 2).await.expect("purge"), 2);
    assert_eq!(ledger.purge_expired(at(104), 2).await.expect("purge"), 3);
    assert_eq!(ledger.get("purge-4").await.expect("get"), None);
    let err = ledger
        .purge_expired(at(104), 0)
        .await
        .expect_err("zero limit");
    assert_eq!(err.kind(), LedgerErrorKind::InvalidInput);
}

#[tokio::test]
async fn memory_ledger_conforms() {
    let ledger = super::MemoryLedger::new();
    check(&ledger, "mem").await;
    check_purge(&super::MemoryLedger::new()).await;
}
