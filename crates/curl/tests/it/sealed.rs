//! `--seal-keys FILE` (or `IDEMCURL_SEAL_KEYS`): the ledger keeps the answer sealed and the
//! URL's query values redacted; a re-run with the key writes the answer out byte for byte; a
//! re-run without it exits 78 naming the key id, nothing sent.

use idempotent_retry_testkit::{Delivery, Receiver, Reply};

use crate::support::{Scratch, idemcurl, run};

const ANSWER: &str = r#"{"api_key":"sk_live_ANSWERTOKEN"}"#;

async fn receiver() -> Receiver {
    Receiver::builder()
        .handler(|delivery: Delivery| async move {
            delivery.record_effect();
            Reply::json(201, &serde_json::from_str(ANSWER).expect("JSON"))
        })
        .start()
        .await
        .expect("receiver")
}

fn charge(scratch: &Scratch, receiver: &Receiver, keys: Option<&str>) -> tokio::process::Command {
    let mut command = idemcurl(scratch.dir.path());
    command
        .args(["--silent", "--json", r#"{"amount":1}"#, "--key", "sealed-1"])
        .arg("--ledger")
        .arg(scratch.ledger())
        .arg(receiver.url("/v1/keys?api_key=QUERYSECRET9"));
    if let Some(file) = keys {
        command.env("IDEMCURL_SEAL_KEYS", scratch.path(file));
    }
    command
}

#[tokio::test]
async fn a_sealed_answer_is_written_out_again_and_refused_without_its_key() {
    let receiver = receiver().await;
    let scratch = Scratch::new();
    let old = format!("k1:{}", "11".repeat(32));
    let new = format!("k2:{}", "22".repeat(32));
    std::fs::write(
        scratch.path("keys"),
        format!("# sealing key first\n{old}\n"),
    )
    .expect("keys");
    std::fs::write(scratch.path("rotated"), format!("{new}\n{old}\n")).expect("keys");
    std::fs::write(scratch.path("other"), format!("{new}\n")).expect("keys");

    let first = run(charge(&scratch, &receiver, Some("keys"))).await;
    assert_eq!(first.code, 0, "{first:?}");
    assert_eq!(first.stdout_text(), ANSWER);
    let stored = std::fs::read(scratch.ledger()).expect("the ledger");
    let mut wal = scratch.ledger().into_os_string();
    wal.push("-wal");
    let stored = [stored, std::fs::read(wal).unwrap_or_default()].concat();
    for secret in ["ANSWERTOKEN", "QUERYSECRET9"] {
        assert!(
            !stored.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} is in the ledger"
        );
    }

    let again = run(charge(&scratch, &receiver, Some("rotated"))).await;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.stdout_text(), ANSWER, "replayed byte for byte");

    for keys in [Some("other"), None] {
        let refused = run(charge(&scratch, &receiver, keys)).await;
        assert_eq!(refused.code, 78, "{refused:?}");
        assert!(refused.stderr.contains("key id \"k1\""), "{refused:?}");
        assert!(refused.stderr.contains("--seal-keys FILE"), "{refused:?}");
    }
    assert_eq!(receiver.effects(), 1, "sent once");
}
