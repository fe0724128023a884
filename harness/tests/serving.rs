//! A serving run ([`Engine::serve`]) on the synthetic Llama with a bounded KV pool: requests
//! arrive while others decode and join the running batch between steps, a cancelled request
//! leaves before the next step with its KV blocks freed, a request that cannot fit even alone
//! is refused without stopping the others, and every output is the one its request has alone
//! (batch invariance across joins and departures).

use std::collections::HashMap;
use std::sync::Arc;

use specdec_algorithms::drafters::{Drafter, NgramConfig, NgramDrafter};
use specdec_algorithms::policy::FixedPolicy;
use specdec_algorithms::verify::{PairedVerifier, Verifier};
use specdec_harness::engine::{
    BatchStatus, Engine, EngineOptions, FinishReason, Generation, NoDrafter, Penalties, Request,
    RequestQueue, StopRule,
};
use specdec_harness::HarnessError;
use specdec_kernels::sampling::SamplingParams;
use specdec_kernels::verification::VerifyMethod;
use specdec_models::llama::synthetic::{synthetic_custom, SyntheticOptions};
use specdec_models::llama::{Architecture, LlamaModel, LlamaOptions, MatmulPath};

/// The synthetic Llama (vocabulary 64) with a pool of `kv_tokens` slots in blocks of 16.
fn target(kv_tokens: usize) -> LlamaModel {
    let file = synthetic_custom(Architecture::Llama, 31, &SyntheticOptions::default());
    let options = LlamaOptions {
        kv_capacity_tokens: kv_tokens,
        kv_block_size: 16,
        matmul: MatmulPath::Int8,
        ..LlamaOptions::default()
    };
    LlamaModel::from_gguf(&file, options).unwrap()
}

fn request(id: u64, prompt_tokens: usize, max_tokens: usize) -> Request {
    let prompt = (0..prompt_tokens as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ (id as u32 * 91)).rotate_left(5) % 63)
        .collect();
    Request {
        id,
        seed: None,
        workload: None,
        prompt,
        stop: StopRule::new(max_tokens, &[]),
    }
}

/// A scripted queue: each request arrives once the run has taken `after` steps (or at once
/// when the engine waits with nothing in flight); `cancel` = (id, after steps).
struct Script {
    arrivals: Vec<(usize, Request)>,
    cancel: Option<(u64, usize)>,
    steps: usize,
    finished: HashMap<u64, Generation>,
    refused: Vec<(u64, String)>,
    statuses: Vec<(usize, BatchStatus)>,
    /// The steps at which each request arrived.
    arrived_at: HashMap<u64, usize>,
}

impl Script {
    fn new(arrivals: Vec<(usize, Request)>, cancel: Option<(u64, usize)>) -> Self {
        Self {
            arrivals,
            cancel,
            steps: 0,
            finished: HashMap::new(),
            refused: Vec::new(),
            statuses: Vec::new(),
            arrived_at: HashMap::new(),
        }
    }
}

impl RequestQueue for Script {
    fn next(&mut self, wait: bool) -> Option<Request> {
        let (after, _) = self.arrivals.first()?;
        if *after > self.steps && !wait {
            return None;
        }
        let (_, request) = self.arrivals.remove(0);
        self.arrived_at.insert(request.id, self.steps);
        Some(request)
    }

    fn cancelled(&mut self, id: u64) -> bool {
        self.cancel
            .is_some_and(|(victim, after)| victim == id && self.steps >= after)
    }

    fn finished(&mut self, _index: usize, generation: Generation) {
        assert!(
            self.finished.insert(generation.id, generation).is_none(),
            "a request finished twice"
        );
    }

    fn refused(&mut self, request: Request, error: HarnessError) {
        self.refused.push((request.id, error.to_string()));
    }

    fn stepped(&mut self, status: &BatchStatus) {
        self.statuses.push((self.steps, *status));
        if status.cancelled == 0 {
            self.steps += 1;
        }
    }
}

fn greedy(kind: specdec_kernels::verification::DraftKind) -> PairedVerifier<f32> {
    let verifier: Arc<dyn Verifier<f32>> = Arc::new(VerifyMethod::Greedy);
    PairedVerifier::new(verifier, kind).unwrap()
}

fn options(batch_size: usize) -> EngineOptions {
    EngineOptions {
        method: "serve".into(),
        sampling: SamplingParams::greedy(),
        penalties: Penalties::default(),
        seed: 3,
        batch_size,
        replay: None,
        op_split: false,
    }
}

fn serve(model: &mut LlamaModel, drafter: &mut dyn Drafter<f32>, k: usize, script: &mut Script) {
    let verifier = greedy(drafter.kind());
    let mut engine = Engine::new(
        model,
        drafter,
        verifier,
        Box::new(FixedPolicy::chain(k)),
        options(4),
    )
    .unwrap();
    engine.serve(script).unwrap();
}

/// Each request's greedy output run alone, plainly.
fn alone(model: &mut LlamaModel, request: &Request) -> Vec<u32> {
    let mut no_drafter = NoDrafter;
    let mut engine = Engine::new(
        model,
        &mut no_drafter,
        greedy(specdec_kernels::verification::DraftKind::Deterministic),
        Box::new(FixedPolicy::chain(0)),
        options(1),
    )
    .unwrap();
    engine
        .run(std::slice::from_ref(request), &mut |_| {})
        .unwrap()[0]
        .tokens
        .clone()
}

#[test]
fn requests_join_and_leave_a_running_batch_and_a_cancelled_one_frees_its_blocks() {
    let mut model = target(1024);
    let long = request(0, 40, 48);
    let joins = request(1, 30, 12);
    let cancelled = request(2, 60, 40);
    let too_big = request(3, 1000, 40);
    let late = request(4, 20, 10);
    let expected: HashMap<u64, Vec<u32>> = [&long, &joins, &late]
        .iter()
        .map(|r| (r.id, alone(&mut model, r)))
        .collect();
    for (drafter, k) in [
        (Box::new(NoDrafter) as Box<dyn Drafter<f32>>, 0),
        (
            Box::new(NgramDrafter::new(NgramConfig::default(), 3).unwrap()),
            3,
        ),
    ] {
        let mut drafter = drafter;
        let mut script = Script::new(
            vec![
                (0, long.clone()),
                (3, joins.clone()),
                (5, cancelled.clone()),
                (6, too_big.clone()),
                (60, late.clone()),
            ],
            Some((2, 9)),
        );
        serve(&mut model, &mut *drafter, k, &mut script);
        let name = drafter.name();
        // every output is the one its request has alone
        for (id, tokens) in &expected {
            let got = &script.finished[id];
            assert_eq!(&got.tokens, tokens, "{name}: request {id}");
        }
        // request 1 joined while request 0 decoded: they shared steps
        assert_eq!(script.arrived_at[&1], 3, "{name}");
        assert!(
            script.finished[&0].steps.iter().any(|s| s.batch >= 2),
            "{name}: request 1 never shared a step with request 0"
        );
        assert_eq!(script.finished[&1].finish, FinishReason::MaxTokens);
        // the cancelled one left with fewer tokens than it asked for, its blocks freed at once
        let gone = &script.finished[&2];
        assert_eq!(gone.finish, FinishReason::Cancelled, "{name}");
        assert!(gone.tokens.len() < 40, "{name}: {}", gone.tokens.len());
        let at_cancel = script
            .statuses
            .iter()
            .position(|(_, s)| s.cancelled == 1)
            .expect("a status right after the cancellation");
        let (before, after) = (
            script.statuses[at_cancel - 1].1.kv.unwrap(),
            script.statuses[at_cancel].1.kv.unwrap(),
        );
        assert!(
            after.free_blocks >= before.free_blocks + 4,
            "{name}: {} free blocks before the cancellation, {} after",
            before.free_blocks,
            after.free_blocks
        );
        // the one that cannot fit even alone is refused naming its tokens; the others ran
        assert_eq!(script.refused.len(), 1, "{name}");
        assert_eq!(script.refused[0].0, 3);
        assert!(
            script.refused[0].1.contains("1000 tokens"),
            "{}",
            script.refused[0].1
        );
        assert!(!script.finished.contains_key(&3));
        // the late one came when the batch was empty (the engine waited for it), and when the
        // queue ended nothing was left in the pool
        assert_eq!(script.finished[&4].finish, FinishReason::MaxTokens);
        let last = script.statuses.last().unwrap().1.kv.unwrap();
        assert_eq!(last.free_blocks, last.total_blocks, "{name}: blocks leaked");
    }
}
