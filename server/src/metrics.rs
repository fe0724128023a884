//! The server's counters, gauges and latency histograms, rendered as Prometheus text for
//! `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// How a request ended (the `outcome` label of `specdec_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered in full.
    Ok,
    /// Refused with a 4xx.
    Refused,
    /// Turned away with a 503 (queue full, still loading).
    Unavailable,
    /// The client went away before the end.
    Cancelled,
    /// The engine failed on it (500).
    Failed,
}

const OUTCOMES: [(Outcome, &str); 5] = [
    (Outcome::Ok, "ok"),
    (Outcome::Refused, "refused"),
    (Outcome::Unavailable, "unavailable"),
    (Outcome::Cancelled, "cancelled"),
    (Outcome::Failed, "failed"),
];

/// Upper bounds of the latency buckets, seconds.
const BUCKETS_S: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A cumulative histogram of seconds.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS_S.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation of `seconds` (negative or NaN counts as 0).
    pub fn observe(&self, seconds: f64) {
        let s = if seconds.is_finite() {
            seconds.max(0.0)
        } else {
            0.0
        };
        for (bound, count) in BUCKETS_S.iter().zip(&self.counts) {
            if s <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((s * 1e6).round() as u64, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in BUCKETS_S.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// Everything `/metrics` reports; shared by the HTTP handlers and the engine thread.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: [AtomicU64; OUTCOMES.len()],
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: AtomicU64,
    /// Tokens sent back.
    pub completion_tokens: AtomicU64,
    /// Requests waiting for the engine.
    pub queue_depth: AtomicUsize,
    /// Requests in the engine's running batch.
    pub running: AtomicUsize,
    /// Blocks of the target's KV pool in use (after the last step).
    pub kv_blocks_used: AtomicUsize,
    /// Blocks of the target's KV pool free (after the last step).
    pub kv_blocks_free: AtomicUsize,
    /// Drafted tokens proposed to the target.
    pub drafts_proposed: AtomicU64,
    /// Drafted tokens the target accepted.
    pub drafts_accepted: AtomicU64,
    /// Target passes with a draft to verify.
    pub steps_speculative: AtomicU64,
    /// Target passes without one.
    pub steps_plain: AtomicU64,
    /// Engine steps (one target forward over the running batch each), counted as they end.
    pub engine_steps: AtomicU64,
    /// Seconds from arrival to the first token sent.
    pub time_to_first_token: Histogram,
    /// Seconds per output token after the first.
    pub time_per_output_token: Histogram,
    /// Seconds from arrival to the last byte.
    pub end_to_end: Histogram,
}

impl Metrics {
    /// Counts one request that ended with `outcome`.
    pub fn request(&self, outcome: Outcome) {
        let i = OUTCOMES
            .iter()
            .position(|(o, _)| *o == outcome)
            .unwrap_or(0);
        self.requests[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition; `method` labels the speculation counters.
    pub fn render(&self, method: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP specdec_requests_total Requests by outcome.\n# TYPE specdec_requests_total counter"
        );
        for ((_, label), count) in OUTCOMES.iter().zip(&self.requests) {
            let _ = writeln!(
                out,
                "specdec_requests_total{{outcome=\"{label}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let counters: [(&str, &str, u64); 7] = [
            (
                "specdec_prompt_tokens_total",
                "Prompt tokens of admitted requests.",
                self.prompt_tokens.load(Ordering::Relaxed),
            ),
            (
                "specdec_completion_tokens_total",
                "Tokens generated and sent.",
                self.completion_tokens.load(Ordering::Relaxed),
            ),
            (
                "specdec_drafts_proposed_total",
                "Draft tokens proposed to the target.",
                self.drafts_proposed.load(Ordering::Relaxed),
            ),
            (
                "specdec_drafts_accepted_total",
                "Draft tokens the target accepted.",
                self.drafts_accepted.load(Ordering::Relaxed),
            ),
            (
                "specdec_steps_speculative_total",
                "Target passes verifying a draft.",
                self.steps_speculative.load(Ordering::Relaxed),
            ),
            (
                "specdec_steps_plain_total",
                "Target passes without a draft.",
                self.steps_plain.load(Ordering::Relaxed),
            ),
            (
                "specdec_engine_steps_total",
                "Engine steps: target forwards over the running batch, counted as they end.",
                self.engine_steps.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            let labels = if name.contains("drafts") || name.starts_with("specdec_steps") {
                format!("{{method=\"{method}\"}}")
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{labels} {value}"
            );
        }
        let gauges = [
            (
                "specdec_queue_depth",
                "Requests waiting for the engine.",
                self.queue_depth.load(Ordering::Relaxed),
            ),
            (
                "specdec_running_sequences",
                "Requests in the running batch.",
                self.running.load(Ordering::Relaxed),
            ),
            (
                "specdec_kv_blocks_used",
                "Blocks of the target's KV pool in use after the last step.",
                self.kv_blocks_used.load(Ordering::Relaxed),
            ),
            (
                "specdec_kv_blocks_free",
                "Blocks of the target's KV pool free after the last step.",
                self.kv_blocks_free.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        let (proposed, accepted) = (
            self.drafts_proposed.load(Ordering::Relaxed),
            self.drafts_accepted.load(Ordering::Relaxed),
        );
        let passes = self.steps_speculative.load(Ordering::Relaxed)
            + self.steps_plain.load(Ordering::Relaxed);
        let acceptance = if proposed > 0 {
            accepted as f64 / proposed as f64
        } else {
            0.0
        };
        let tau = if passes > 0 {
            (accepted + passes) as f64 / passes as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "# HELP specdec_acceptance Accepted / proposed drafts since start.\n# TYPE specdec_acceptance gauge\nspecdec_acceptance{{method=\"{method}\"}} {acceptance}"
        );
        let _ = writeln!(
            out,
            "# HELP specdec_tau Mean accepted length: tokens per target pass since start.\n# TYPE specdec_tau gauge\nspecdec_tau{{method=\"{method}\"}} {tau}"
        );
        self.time_to_first_token.render(
            "specdec_time_to_first_token_seconds",
            "Seconds from arrival to the first token.",
            &mut out,
        );
        self.time_per_output_token.render(
            "specdec_time_per_output_token_seconds",
            "Seconds per output token after the first.",
            &mut out,
        );
        self.end_to_end.render(
            "specdec_e2e_request_latency_seconds",
            "Seconds from arrival to the end of the response.",
            &mut out,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_as_prometheus_text() {
        let m = Metrics::default();
        m.request(Outcome::Ok);
        m.request(Outcome::Ok);
        m.request(Outcome::Refused);
        m.drafts_proposed.store(10, Ordering::Relaxed);
        m.drafts_accepted.store(4, Ordering::Relaxed);
        m.steps_speculative.store(5, Ordering::Relaxed);
        m.time_to_first_token.observe(0.02);
        m.time_to_first_token.observe(3.0);
        let text = m.render("ngram");
        assert!(
            text.contains("specdec_requests_total{outcome=\"ok\"} 2"),
            "{text}"
        );
        assert!(text.contains("specdec_requests_total{outcome=\"refused\"} 1"));
        assert!(text.contains("specdec_acceptance{method=\"ngram\"} 0.4"));
        // tau: (4 accepted + 5 passes) / 5 passes
        assert!(text.contains("specdec_tau{method=\"ngram\"} 1.8"), "{text}");
        assert!(text.contains("specdec_time_to_first_token_seconds_bucket{le=\"0.025\"} 1"));
        assert!(text.contains("specdec_time_to_first_token_seconds_bucket{le=\"5\"} 2"));
        assert!(text.contains("specdec_time_to_first_token_seconds_count 2"));
    }
}
