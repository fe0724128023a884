//! The two ways load is offered: open-loop Poisson arrivals (requests sent at seeded
//! exponential gaps, whatever the server's pace) and closed-loop clients (N clients, each
//! sending its next request when its last one ends).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use specdec_harness::simulation::SplitMix64;

use super::client::{stream_completion, Streamed};

/// One request to send: the route and the JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `/v1/completions` or `/v1/chat/completions`.
    pub path: &'static str,
    /// The JSON body (with `"stream": true`).
    pub body: String,
}

/// Arrival times (seconds from the start) of `n` requests of a Poisson process of `rate`
/// requests per second: the first at 0, then gaps drawn from Exp(rate) by the SplitMix64
/// stream `stream` of `seed` (the same seed and stream give the same times). `rate` must be
/// finite and positive.
pub fn poisson_arrivals(rate: f64, n: usize, seed: u64, stream: u64) -> Vec<f64> {
    let mut rng = SplitMix64::stream(seed, stream);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                // 1 - u lies in (0, 1]: the logarithm is finite
                t += -(1.0 - rng.uniform()).ln() / rate;
            }
            t
        })
        .collect()
}

/// What one phase of load gave: each request's result in request order, and the wall time
/// from the first send to the last answer, seconds.
#[derive(Debug)]
pub struct PhaseResult {
    /// Per request, in the order given, with its send time (seconds from the phase's start).
    pub results: Vec<(f64, Streamed)>,
    /// Seconds from the phase's start to its last answer.
    pub wall_s: f64,
}

/// Sends `requests[i]` at `arrivals[i]` seconds from now (each on its own task and
/// connection), and waits for every answer. `arrivals` has one time per request.
pub async fn open_loop(
    addr: SocketAddr,
    requests: &[Request],
    arrivals: &[f64],
    timeout: Duration,
) -> PhaseResult {
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = requests
        .iter()
        .zip(arrivals)
        .map(|(request, &at)| {
            let request = request.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
                let sent = start.elapsed().as_secs_f64();
                let got = stream_completion(addr, request.path, &request.body, timeout).await;
                (sent, got)
            })
        })
        .collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.unwrap_or_else(|e| (0.0, panicked(e))));
    }
    PhaseResult {
        results,
        wall_s: start.elapsed().as_secs_f64(),
    }
}

/// Runs `clients` clients that take the next unsent request of `requests` each time their
/// previous one is answered, until every request has been answered.
pub async fn closed_loop(
    addr: SocketAddr,
    requests: &[Request],
    clients: usize,
    timeout: Duration,
) -> PhaseResult {
    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let requests: Arc<Vec<Request>> = Arc::new(requests.to_vec());
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (next, requests) = (next.clone(), requests.clone());
            tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(request) = requests.get(i) else {
                        break done;
                    };
                    let sent = start.elapsed().as_secs_f64();
                    let got = stream_completion(addr, request.path, &request.body, timeout).await;
                    done.push((i, sent, got));
                }
            })
        })
        .collect();
    let mut slots: Vec<Option<(f64, Streamed)>> = vec![None; requests.len()];
    for task in tasks {
        match task.await {
            Ok(done) => {
                for (i, sent, got) in done {
                    slots[i] = Some((sent, got));
                }
            }
            Err(e) => {
                let failed = panicked(e);
                for slot in slots.iter_mut().filter(|s| s.is_none()) {
                    *slot = Some((0.0, failed.clone()));
                }
            }
        }
    }
    PhaseResult {
        results: slots
            .into_iter()
            .map(|s| s.unwrap_or_else(|| (0.0, never_sent())))
            .collect(),
        wall_s: start.elapsed().as_secs_f64(),
    }
}

fn panicked(e: tokio::task::JoinError) -> Streamed {
    Streamed {
        error: Some(format!("the client task failed: {e}")),
        ..Streamed::default()
    }
}

fn never_sent() -> Streamed {
    Streamed {
        error: Some("the request was never sent (its client failed)".into()),
        ..Streamed::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_gaps_are_seeded_and_have_the_rate() {
        let a = poisson_arrivals(4.0, 20_000, 7, 1);
        assert_eq!(a, poisson_arrivals(4.0, 20_000, 7, 1));
        assert_ne!(a, poisson_arrivals(4.0, 20_000, 7, 2));
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[1] >= w[0] && w[1].is_finite()));
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1] - w[0]).collect();
        let n = gaps.len() as f64;
        let mean = gaps.iter().sum::<f64>() / n;
        // mean 1/rate = 0.25 with standard error 0.25 / sqrt(n) ≈ 0.0018
        assert!((mean - 0.25).abs() < 0.01, "mean gap {mean}");
        // exponential: the standard deviation equals the mean
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / (n - 1.0);
        assert!((var.sqrt() - 0.25).abs() < 0.015, "sd {}", var.sqrt());
        // P(gap > 1/rate) = e^-1
        let over = gaps.iter().filter(|&&g| g > 0.25).count() as f64 / n;
        assert!(
            (over - (-1.0f64).exp()).abs() < 0.015,
            "share over the mean {over}"
        );
        // twice the rate halves every gap's scale
        let fast = poisson_arrivals(8.0, 100, 7, 1);
        let slow = poisson_arrivals(4.0, 100, 7, 1);
        for (f, s) in fast.iter().zip(&slow) {
            assert!((2.0 * f - s).abs() < 1e-9);
        }
    }
}
