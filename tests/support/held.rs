//! A receiver that holds each request until the test lets it through: for tests that need an
//! attempt to be in flight at a point they choose.

use std::sync::Arc;
use std::time::Duration;

use idempotent_retry_testkit::{Delivery, Receiver, Reply};
use serde_json::json;
use tokio::sync::Semaphore;

/// A receiver whose handler, for each request, gives `started` a permit, waits at least
/// `hold`, then waits for a permit of `gate`; then it records the effect and answers
/// `status` with `{"charge": n}`.
pub struct Held {
    pub receiver: Receiver,
    pub started: Arc<Semaphore>,
    pub gate: Arc<Semaphore>,
}

pub async fn held_receiver(hold: Duration, status: u16) -> Held {
    let started = Arc::new(Semaphore::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let receiver = Receiver::builder()
        .handler({
            let (started, gate) = (started.clone(), gate.clone());
            move |delivery: Delivery| {
                let (started, gate) = (started.clone(), gate.clone());
                async move {
                    started.add_permits(1);
                    tokio::time::sleep(hold).await;
                    gate.acquire().await.expect("gate").forget();
                    let n = delivery.record_effect();
                    Reply::json(status, &json!({ "charge": n }))
                }
            }
        })
        .start()
        .await
        .expect("receiver");
    Held {
        receiver,
        started,
        gate,
    }
}

impl Held {
    /// Waits (at most 10 s) until one more request has reached the handler.
    pub async fn arrived(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.started.acquire())
            .await
            .expect("a request arrives")
            .expect("open")
            .forget();
    }
}
