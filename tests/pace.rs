//! `PaceLayer` on a client: requests wait their turn under the rule before
//! the inner service sees them, spaced as the rule says, each key on its
//! own budget; one whose turn is beyond the wait is refused at once with a
//! `RateLimited` and never reaches the inner service.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ratelimit_runtime::pace::{PaceError, PaceLayer};
use ratelimit_runtime::{RateLimiter, Rule};
use tower::{Layer, ServiceExt, service_fn};

/// 10 a second, one at a time: turns 100 ms apart.
const TENTHS: Rule = Rule::gcra(10, Duration::from_secs(1)).with_burst(1);

#[tokio::test]
async fn requests_wait_their_turn_before_the_inner_service() {
    let started = Instant::now();
    let seen: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
    let inner = {
        let seen = Arc::clone(&seen);
        service_fn(move |(tenant, n): (&'static str, u32)| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock()
                    .unwrap()
                    .push((tenant.to_owned(), started.elapsed()));
                Ok::<u32, Infallible>(n)
            }
        })
    };
    let layer = PaceLayer::new(
        RateLimiter::in_memory(),
        TENTHS,
        |(tenant, _): &(&'static str, u32)| format!("limiter:pace:{tenant}"),
        Duration::from_millis(250),
    );
    let client = layer.layer(inner);
    let call = |tenant, n| client.clone().oneshot((tenant, n));
    let (a0, a1, a2, a3, b0) = tokio::join!(
        call("a", 0),
        call("a", 1),
        call("a", 2),
        call("a", 3),
        call("b", 0)
    );
    let refused: Vec<_> = [a0, a1, a2, a3]
        .into_iter()
        .filter_map(|answer| match answer {
            Ok(_) => None,
            Err(PaceError::Limited(limited)) => Some(limited),
            Err(other) => panic!("{other}"),
        })
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "the fourth turn (300 ms) is beyond 250 ms"
    );
    assert!(refused[0].retry_after > Duration::from_millis(250));
    assert_eq!(b0.unwrap(), 0, "another key's own budget");

    let seen = seen.lock().unwrap().clone();
    let mut a: Vec<Duration> = seen
        .iter()
        .filter(|(tenant, _)| tenant == "a")
        .map(|(_, at)| *at)
        .collect();
    a.sort_unstable();
    assert_eq!(a.len(), 3, "the refused request never reached it: {seen:?}");
    for pair in a.windows(2) {
        assert!(pair[1] - pair[0] >= Duration::from_millis(80), "{seen:?}");
    }
    assert!(a[2] >= Duration::from_millis(190), "{seen:?}");
    assert!(a[2] < Duration::from_secs(2), "{seen:?}");
    let b = seen.iter().find(|(tenant, _)| tenant == "b").unwrap().1;
    assert!(b < Duration::from_millis(90), "b went at once: {seen:?}");
}

/// A rule that keeps no turns is the limiter's error, not a pass.
#[tokio::test]
async fn a_window_rule_cannot_pace() {
    let inner = service_fn(|n: u32| async move { Ok::<u32, Infallible>(n) });
    let layer = PaceLayer::new(
        RateLimiter::in_memory(),
        Rule::fixed_window(10, Duration::from_secs(1)),
        |_: &u32| "limiter:pace:window".to_owned(),
        Duration::from_secs(1),
    );
    let answer = layer.layer(inner).oneshot(1).await;
    assert!(
        matches!(
            answer,
            Err(PaceError::Limiter(ratelimit_runtime::Error::Unsupported(_)))
        ),
        "{answer:?}"
    );
}
