use super::*;
use axum::http::StatusCode;

fn gate(max_concurrency: usize, max_queue: usize, queue_timeout_ms: u64) -> Admission {
    Admission::new(
        AdmissionConfig {
            max_concurrency,
            max_queue,
            queue_timeout_ms,
            retry_after_secs: 2,
            ..AdmissionConfig::default()
        },
        AdmissionMetrics::register(&mut Default::default()),
    )
}

fn claim(tenant: &str, priority: Priority) -> Claim<'_> {
    Claim {
        tenant,
        weight: 1.0,
        cost: 100.0,
        priority,
    }
}

const I: Priority = Priority::Interactive;
const B: Priority = Priority::Batch;

#[tokio::test(start_paused = true)]
async fn full_queue_is_429_and_late_requests_are_504() {
    let gate = gate(1, 1, 50);
    let held = gate.admit(claim("t", I), None).await.unwrap();
    let (queued, full) = tokio::join!(
        gate.admit(claim("t", I), Some(Duration::from_millis(30))),
        async {
            tokio::task::yield_now().await;
            gate.admit(claim("t", I), None).await
        }
    );
    let full = full.unwrap_err();
    assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(full.retry_after_secs, Some(2));
    assert_eq!(queued.unwrap_err().status, StatusCode::GATEWAY_TIMEOUT);
    drop(held);
    assert!(gate.admit(claim("t", I), None).await.is_ok());
    assert_eq!(gate.inner.metrics.pending.get(), 0);
    assert_eq!(gate.inner.metrics.queue_depth.get(), 0);
    assert_eq!(gate.status().0, 0);
}

#[tokio::test(start_paused = true)]
async fn a_client_deadline_cannot_outlast_the_queue_timeout() {
    let gate = gate(1, 1, 20);
    let _held = gate.admit(claim("t", I), None).await.unwrap();
    let waited = tokio::time::timeout(
        Duration::from_secs(2),
        gate.admit(claim("t", I), Some(Duration::from_secs(3_600))),
    )
    .await
    .expect("the operator's 20 ms queue timeout must bound an hour-long client deadline");
    assert_eq!(waited.unwrap_err().status, StatusCode::GATEWAY_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn batch_uses_half_the_queue_and_is_shed_for_interactive_work() {
    // No headroom: the new interactive tenant must queue, not skip it.
    let gate = Admission::new(
        AdmissionConfig {
            fair_headroom: Some(0),
            ..gate(1, 2, 50).inner.config.clone()
        },
        AdmissionMetrics::register(&mut Default::default()),
    );
    let _held = gate.admit(claim("t", B), None).await.unwrap();
    let (first, second, interactive, another) = tokio::join!(
        gate.admit(claim("t", B), None),
        async {
            tokio::task::yield_now().await;
            gate.admit(claim("t", B), None).await
        },
        async {
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            gate.admit(claim("t", I), None).await
        },
        async {
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            gate.admit(claim("u", I), None).await
        }
    );
    assert_eq!(second.unwrap_err().status, StatusCode::TOO_MANY_REQUESTS);
    // The queue (2) held the first batch request and an interactive one; the second interactive
    // request shed the batch one and took its place; both interactive ones then timed out.
    let shed = first.unwrap_err();
    assert_eq!(
        (shed.status, shed.code),
        (StatusCode::TOO_MANY_REQUESTS, "shed")
    );
    assert_eq!(interactive.unwrap_err().status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(another.unwrap_err().status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(gate.inner.metrics.queue_depth.get(), 0);
    assert_eq!(gate.inner.metrics.pending.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_underserved_tenant_skips_a_heavy_backlog_and_cancelled_waiters_leave() {
    let gate = Arc::new(gate(1, 16, 10_000));
    let held = gate.admit(claim("heavy", I), None).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, tenant) in ["heavy", "heavy", "heavy", "light"].into_iter().enumerate() {
        let (gate, order) = (gate.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(i as u64)).await;
            let p = gate.admit(claim(tenant, I), None).await.unwrap();
            order.lock().unwrap().push(tenant);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(p);
        }));
    }
    // A waiter whose client goes away leaves no trace and takes no slot.
    let gone = {
        let gate = gate.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            gate.admit(claim("gone", I), None).await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    gone.abort();
    let _ = gone.await;
    // The light tenant took the headroom slot at once (and is done by now); three heavy requests
    // wait behind the one holding the only regular slot.
    let (in_flight, prefilling, queued, _) = gate.status();
    assert_eq!((in_flight, prefilling, queued), (1, 1, 3));
    drop(held);
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order[0], "light", "{order:?}");
    assert_eq!(gate.status().0, 0);
    assert_eq!(gate.inner.metrics.queue_depth.get(), 0);
    assert_eq!(gate.inner.metrics.pending.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn under_a_backlog_prefills_are_bounded_until_first_bytes_and_the_underserved_skip_it() {
    let gate = Arc::new(Admission::new(
        AdmissionConfig {
            max_prefills: Some(1),
            fair_headroom: Some(1),
            ..gate(2, 16, 10_000).inner.config.clone()
        },
        AdmissionMetrics::register(&mut Default::default()),
    ));
    let waiter = |tenant: &'static str| {
        let gate = gate.clone();
        tokio::spawn(async move { gate.admit(claim(tenant, I), None).await.unwrap() })
    };
    let settle = || tokio::time::sleep(Duration::from_millis(1));
    // Nobody waits: both go at once, the bound notwithstanding.
    let mut a = gate.admit(claim("heavy", I), None).await.unwrap();
    let mut b = gate.admit(claim("heavy", I), None).await.unwrap();
    assert_eq!(gate.status().1, 2);
    a.prefilled();
    a.prefilled(); // a second call changes nothing
    b.prefilled();
    let c = waiter("heavy");
    let d = waiter("heavy");
    settle().await;
    drop(a);
    let mut c = c.await.unwrap();
    // A slot is free, but one request left the queue and is still prefilling: `d` waits.
    drop(b);
    settle().await;
    assert!(!d.is_finished());
    let (in_flight, prefilling, queued, _) = gate.status();
    assert_eq!((in_flight, prefilling, queued), (1, 1, 1));
    // A tenant with nothing waiting takes the headroom past the bound.
    let light = gate.admit(claim("light", I), None).await.unwrap();
    assert_eq!(gate.status().1, 2);
    drop(light);
    assert!(!d.is_finished());
    // The first bytes of `c` free its prefill: `d` goes.
    c.prefilled();
    let d = d.await.unwrap();
    let e = waiter("heavy");
    settle().await;
    assert!(!e.is_finished());
    // A request that ends before its first bytes frees its prefill too.
    drop(d);
    let e = e.await.unwrap();
    let (in_flight, prefilling, queued, _) = gate.status();
    assert_eq!((in_flight, prefilling, queued), (2, 1, 0));
    drop((c, e));
    assert_eq!((gate.status().0, gate.status().1), (0, 0));
    assert_eq!(gate.inner.metrics.pending.get(), 0);
    assert_eq!(gate.inner.metrics.queue_depth.get(), 0);
}
