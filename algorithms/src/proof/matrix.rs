//! The proof matrix: every verifier × tree kind (and the negative controls) on seeded toy
//! models, enumerated exactly; the table `specdec prove` prints.
//!
//! A row passes when a lossless pair shows total-variation distance exactly 0 to the target's own
//! distribution of the next N tokens, and when a lossy verifier or a negative control shows a
//! distance above 0 (the checker can fail). For rows with a distance, the outcome where the two
//! distributions differ most is printed.

use super::controls::{BrokenChain, ChainFlaw};
use super::drafters::ToyDrafter;
use super::sd_loop::SpecLoop;
use crate::error::Result;
use crate::verify::{PairedVerifier, Verifier};
use specdec_kernels::sampling::{BigRational, Prob, SamplingParams};
use specdec_kernels::verification::{DraftKind, VerifyMethod};
use specdec_models::toy::{ToyModel, ToyPair, ToyStyle};
use std::sync::Arc;

/// What a case is expected to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation {
    /// A lossless pair: distance exactly 0.
    Lossless,
    /// A verifier declared lossy: distance above 0 expected.
    Lossy,
    /// A negative control (broken variant or forced mismatched pair): must be caught, distance > 0.
    Control,
}

/// One enumerated case.
#[derive(Debug, Clone)]
pub struct ProofCase {
    /// The loop to enumerate.
    pub spec: SpecLoop<BigRational>,
    /// What it should show.
    pub expectation: Expectation,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct ProofRow {
    /// Verifier name (`forced` marks a mismatched pair).
    pub verifier: String,
    /// Drafter description (tree shape and kind).
    pub tree: String,
    /// Case size: vocabulary, Markov order, N, temperature (and top-k / top-p).
    pub size: String,
    /// Exact total-variation distance to the target's distribution of the next N tokens.
    pub total_variation: BigRational,
    /// The expectation.
    pub expectation: Expectation,
    /// Where the distributions differ most: `(outcome, speculative, target)`.
    pub worst: Option<(Vec<u32>, BigRational, BigRational)>,
    /// Wall time of the enumeration.
    pub elapsed: std::time::Duration,
}

impl ProofRow {
    /// True iff the row shows what its expectation requires.
    pub fn passed(&self) -> bool {
        let zero = self.total_variation.is_zero();
        match self.expectation {
            Expectation::Lossless => zero,
            Expectation::Lossy | Expectation::Control => !zero,
        }
    }

    /// The verdict column.
    pub fn verdict(&self) -> &'static str {
        match (self.expectation, self.passed()) {
            (Expectation::Lossless, true) => "lossless (exact)",
            (Expectation::Lossless, false) => "FAIL: not lossless",
            (Expectation::Lossy, true) => "lossy, as declared",
            (Expectation::Lossy, false) => "FAIL: lossy verifier showed no loss",
            (Expectation::Control, true) => "caught: not lossless",
            (Expectation::Control, false) => "FAIL: control not caught",
        }
    }
}

/// Describes sampling parameters: `T=0`, `T=1`, `T=1/2`, `T=0.7`, plus top-k / top-p.
pub fn describe_params(params: &SamplingParams) -> String {
    let mut text = match (params.is_greedy(), params.inverse_whole_temperature()) {
        (true, _) => "T=0".to_string(),
        (_, Some(1)) => "T=1".to_string(),
        (_, Some(k)) => format!("T=1/{k}"),
        _ => format!("T={}", params.temperature),
    };
    if let Some(k) = params.top_k {
        text.push_str(&format!(" top-k={k}"));
    }
    if let Some(p) = params.top_p {
        text.push_str(&format!(" top-p={p}"));
    }
    text
}

/// Enumerates one case.
///
/// # Errors
/// Enumeration or model errors.
pub fn run_case(case: &ProofCase) -> Result<ProofRow> {
    let spec = &case.spec;
    let start = std::time::Instant::now();
    let exact = spec.exact_distribution()?;
    let target = spec.target_distribution()?;
    let total_variation = exact.total_variation(&target);
    let worst = exact
        .worst_outcome(&target)
        .map(|(outcome, a, b)| (outcome.clone(), a, b));
    let verifier = spec.verifier.verifier().name();
    Ok(ProofRow {
        verifier: if spec.verifier.is_forced() {
            format!("{verifier} (forced pair)")
        } else {
            verifier
        },
        tree: spec.drafter.describe(),
        size: format!(
            "V={} order={} N={} {}",
            spec.pair.target.vocab(),
            spec.pair.target.order(),
            spec.n_tokens,
            describe_params(&spec.params)
        ),
        total_variation,
        expectation: case.expectation,
        worst,
        elapsed: start.elapsed(),
    })
}

/// Builds a case on the seeded toy pair `(seed, vocab, order)` (see [`ToyPair::seeded`]), N = 3,
/// prompt `[0, 1]`. The pairing rule is enforced unless `expectation` is a control. Lossless cases
/// use [`ToyStyle::default`] tables (zeros and one-hot rows included); controls and lossy cases use
/// [`ToyStyle::DENSE`] tables, where every mistake has room to show.
///
/// # Errors
/// A mismatched pair for a non-control case; model construction errors.
pub fn case(
    verifier: Arc<dyn Verifier<BigRational>>,
    drafter: ToyDrafter,
    params: SamplingParams,
    (seed, vocab, order): (u64, usize, usize),
    expectation: Expectation,
) -> Result<ProofCase> {
    let style = match expectation {
        Expectation::Lossless => ToyStyle::default(),
        Expectation::Lossy | Expectation::Control => ToyStyle::DENSE,
    };
    let pair = ToyPair::seeded(seed, vocab, order, style)?;
    let paired = match expectation {
        Expectation::Control => PairedVerifier::forced(verifier, drafter.kind()),
        _ => PairedVerifier::new(verifier, drafter.kind())?,
    };
    let spec = SpecLoop::new(pair, drafter, paired, params, vec![0, 1], 3)?;
    Ok(ProofCase { spec, expectation })
}

/// A lossless case on hand-written order-0 tables (weights per token, normalised), for exact
/// ties: equal probabilities at the top-k boundary and cumulative masses exactly at top-p.
///
/// # Errors
/// A mismatched pair; table errors.
pub fn tie_case(
    verifier: Arc<dyn Verifier<BigRational>>,
    drafter: ToyDrafter,
    params: SamplingParams,
    target: &[u32],
    draft: &[u32],
) -> Result<ProofCase> {
    let pair = ToyPair::new(
        ToyModel::from_weights(target.len(), 0, &[target.to_vec()])?,
        ToyModel::from_weights(draft.len(), 0, &[draft.to_vec()])?,
    )?;
    let paired = PairedVerifier::new(verifier, drafter.kind())?;
    let spec = SpecLoop::new(pair, drafter, paired, params, vec![0, 1], 3)?;
    Ok(ProofCase {
        spec,
        expectation: Expectation::Lossless,
    })
}

impl ProofCase {
    /// The same case generating `n_tokens` tokens.
    pub fn with_tokens(mut self, n_tokens: usize) -> Self {
        self.spec.n_tokens = n_tokens;
        self
    }
}

/// The standard matrix behind `specdec prove`: every lossless verifier with every tree kind it
/// accepts, typical acceptance (lossy), a forced mismatched pair and the broken chain variants
/// (controls). The shapes, by what they exercise:
///
/// - **chains**: K = 3 or 4 with N = 3 (all-accepted paths cut before the bonus), and K = 1 or 2
///   with N = 3 or 4 (**N > K**: the bonus token is drawn, then later rounds);
/// - **trees**: 2 × 2 (two children per node, two levels), and **3 and 4 sampled children at
///   the root** (`3`, `4`, `3x1`) for multi-round and recursive rejection, where "rejected token
///   not removed" and "removed but not renormalised" give different distributions;
/// - **sampling**: T = 0, T = 1 and T = 1/2, plain and with top-k and top-p (both T = 1 and
///   T = 1/2, thresholds chosen to remove tokens on the seeded tables), on vocabularies of 3 to
///   5 tokens and Markov orders 1 and 2; and hand-written dyadic tables with **exact ties** at
///   the top-k boundary and cumulative masses exactly at top-p ([`tie_case`]), where a wrong
///   tie rule or a strict threshold comparison changes the distribution.
///
/// Every row runs the production decision rules through the enumerator, and the target's
/// reference comes from the independent oracle.
///
/// # Errors
/// Model construction errors.
pub fn standard_cases() -> Result<Vec<ProofCase>> {
    use VerifyMethod::{ChainRejection, Greedy, MultiRound, RecursiveRejection, TargetOnly};
    let t = SamplingParams::with_temperature;
    let chain = |k| ToyDrafter::Chain { k };
    let tree = |kind| ToyDrafter::Tree {
        widths: vec![2, 2],
        kind,
    };
    let wide = |widths: &[usize], kind| ToyDrafter::Tree {
        widths: widths.to_vec(),
        kind,
    };
    let filtered = |temperature, top_k, top_p| SamplingParams {
        top_k: Some(top_k),
        top_p: Some(top_p),
        ..t(temperature)
    };
    let (iid, wor, det) = (
        DraftKind::Iid,
        DraftKind::WithoutReplacement,
        DraftKind::Deterministic,
    );
    // (verifier, drafter, parameters, (seed, vocabulary, order), N).
    let mut lossless = vec![
        (Greedy, tree(iid), t(0.0), (11, 3, 1), 3),
        (Greedy, tree(wor), t(0.0), (11, 3, 1), 3),
        (Greedy, tree(det), t(0.0), (11, 3, 1), 3),
        (Greedy, chain(3), t(0.0), (12, 4, 2), 3),
        (Greedy, chain(1), t(0.0), (12, 4, 2), 3),
        (ChainRejection, chain(3), t(1.0), (13, 3, 1), 3),
        (ChainRejection, chain(3), t(0.5), (13, 3, 2), 3),
        (ChainRejection, chain(3), t(0.0), (13, 3, 1), 3),
        (
            ChainRejection,
            chain(3),
            filtered(1.0, 3, 0.875),
            (14, 4, 1),
            3,
        ),
        // N > K: the bonus token is reached.
        (ChainRejection, chain(1), t(1.0), (21, 3, 1), 3),
        (ChainRejection, chain(2), t(1.0), (21, 4, 1), 4),
        (ChainRejection, chain(2), t(0.5), (22, 3, 2), 3),
        (
            ChainRejection,
            chain(2),
            filtered(1.0, 3, 0.75),
            (23, 4, 1),
            3,
        ),
        (
            ChainRejection,
            chain(2),
            filtered(0.5, 3, 0.75),
            (23, 4, 1),
            3,
        ),
    ];
    for params in [t(1.0), t(0.5), t(0.0)] {
        lossless.push((MultiRound, tree(iid), params, (15, 3, 1), 3));
        lossless.push((RecursiveRejection, tree(wor), params, (16, 3, 1), 3));
    }
    // The largest cases: four tokens, a 2x2 tree (6 drafts) and a chain of 4.
    lossless.push((MultiRound, tree(iid), t(1.0), (5, 4, 1), 3));
    lossless.push((RecursiveRejection, tree(wor), t(1.0), (5, 4, 1), 3));
    lossless.push((ChainRejection, chain(4), t(1.0), (5, 4, 1), 3));
    // Three and four sampled children per node, with and without top-k / top-p.
    lossless.push((MultiRound, wide(&[3], iid), t(1.0), (24, 4, 1), 3));
    lossless.push((MultiRound, wide(&[3, 1], iid), t(0.5), (25, 3, 1), 3));
    lossless.push((
        MultiRound,
        wide(&[3], iid),
        filtered(1.0, 3, 0.75),
        (26, 5, 1),
        3,
    ));
    lossless.push((RecursiveRejection, wide(&[3], wor), t(1.0), (24, 4, 1), 3));
    lossless.push((RecursiveRejection, wide(&[4], wor), t(1.0), (27, 5, 1), 3));
    lossless.push((
        RecursiveRejection,
        wide(&[3, 1], wor),
        t(0.5),
        (25, 3, 1),
        3,
    ));
    lossless.push((
        RecursiveRejection,
        wide(&[3], wor),
        filtered(0.5, 4, 0.75),
        (26, 5, 1),
        3,
    ));
    for kind in DraftKind::ALL {
        lossless.push((TargetOnly, tree(kind), t(0.5), (17, 3, 2), 3));
    }
    lossless.push((
        TargetOnly,
        wide(&[3], det),
        filtered(1.0, 3, 0.75),
        (28, 4, 1),
        3,
    ));
    let mut cases = Vec::new();
    for (method, drafter, params, toy, n_tokens) in lossless {
        cases.push(
            case(
                Arc::new(method),
                drafter,
                params,
                toy,
                Expectation::Lossless,
            )?
            .with_tokens(n_tokens),
        );
    }
    // Exact ties at every threshold: p = (1/4, 1/4, 1/2) has a tie at the top-2 boundary and
    // reaches 3/4 exactly at its second token; the uniform 4-token table at T = 1/2 ties
    // everywhere, with top-2 then top-p 1/2 reached exactly at the first kept token. min-p 1/2
    // sits exactly on the target's 1/4 against its 1/2 (all kept); just above it keeps only the
    // target's token 2 and the draft's token 0 (every draft is rejected).
    let with_min_p = |min_p| SamplingParams {
        min_p: Some(min_p),
        ..t(1.0)
    };
    let ties = [
        (t(1.0), &[1, 1, 2][..], &[2, 1, 1][..]),
        (
            SamplingParams {
                top_k: Some(2),
                ..t(1.0)
            },
            &[1, 1, 2],
            &[2, 1, 1],
        ),
        (
            SamplingParams {
                top_p: Some(0.75),
                ..t(1.0)
            },
            &[1, 1, 2],
            &[2, 1, 1],
        ),
        (filtered(0.5, 2, 0.5), &[1, 1, 1, 1], &[3, 1, 2, 2]),
        (with_min_p(0.5), &[1, 1, 2], &[2, 1, 1]),
        (with_min_p(0.5 + 1.0 / 1024.0), &[1, 1, 2], &[2, 1, 1]),
    ];
    for (params, target, draft) in ties {
        cases.push(tie_case(
            Arc::new(ChainRejection),
            chain(1),
            params,
            target,
            draft,
        )?);
    }
    let typical = VerifyMethod::Typical {
        epsilon: 0.3,
        delta: 0.09,
    };
    cases.push(case(
        Arc::new(typical),
        chain(2),
        t(1.0),
        (18, 3, 1),
        Expectation::Lossy,
    )?);
    cases.push(case(
        Arc::new(MultiRound),
        tree(det),
        t(1.0),
        (19, 3, 1),
        Expectation::Control,
    )?);
    for flaw in ChainFlaw::ALL {
        let mut c = case(
            Arc::new(BrokenChain(flaw)),
            chain(2),
            t(1.0),
            (20, 3, 1),
            Expectation::Control,
        )?;
        if !flaw.is_lossy() {
            c.expectation = Expectation::Lossless;
        }
        cases.push(c);
    }
    Ok(cases)
}

/// Renders rows as an aligned text table, with the worst outcome under each row with a distance.
pub fn render_table(rows: &[ProofRow]) -> String {
    let header = [
        "verifier",
        "tree",
        "case",
        "TV to target",
        "verdict",
        "time",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            let tv = if r.total_variation.is_zero() {
                "0".to_string()
            } else {
                format!(
                    "{:.6} (exact {})",
                    r.total_variation.to_f64(),
                    short(&r.total_variation)
                )
            };
            [
                r.verifier.clone(),
                r.tree.clone(),
                r.size.clone(),
                tv,
                r.verdict().to_string(),
                format!("{:.0} ms", r.elapsed.as_secs_f64() * 1e3),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |row: &[String]| {
        row.iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(&header.map(String::from));
    out.push('\n');
    out.push_str(&widths.map(|w| "-".repeat(w)).join("  "));
    out.push('\n');
    for (row, r) in cells.iter().zip(rows) {
        out.push_str(&line(row));
        out.push('\n');
        if let Some((outcome, spec, target)) = &r.worst {
            out.push_str(&format!(
                "    worst outcome {outcome:?}: speculative {} vs target {}\n",
                short(spec),
                short(target)
            ));
        }
    }
    out
}

/// A rational as `a/b`, or its decimal value when the digits get long.
fn short(value: &BigRational) -> String {
    let text = value.to_string();
    if text.len() <= 24 {
        text
    } else {
        format!("≈{:.8}", value.to_f64())
    }
}
