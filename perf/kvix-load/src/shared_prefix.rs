//! The shared-prefix workload: a synthetic request list in which a few long
//! system prompts and few-shot prefixes open most requests, followed by
//! per-conversation turns that grow turn by turn.
//!
//! Owns the shape of that workload. It yields the same `Request`s the trace
//! reader does, so the simulator, the event phase and the query phase treat
//! both alike; everything is a pure function of the seed.

use crate::trace::{Request, TRACE_BLOCK, expand, from_tokens, splitmix};

/// Knobs of the generator; `Default` is what `--workload shared-prefix` uses.
#[derive(Clone, Debug)]
pub struct Shape {
    /// Distinct system prompts.
    pub system_prompts: usize,
    /// Distinct few-shot prefixes; each belongs to one system prompt.
    pub few_shots: usize,
    /// System prompt length range in tokens (inclusive).
    pub system_tokens: (usize, usize),
    /// Few-shot prefix length range in tokens.
    pub few_shot_tokens: (usize, usize),
    /// Per mille of conversations that open with a system prompt.
    pub with_system: u64,
    /// Per mille of those that add a few-shot prefix after it.
    pub with_few_shot: u64,
    /// Turns per conversation.
    pub turns: (usize, usize),
    /// First user message length.
    pub first_user_tokens: (usize, usize),
    /// Tokens each later turn appends (the previous answer and the next message).
    pub turn_tokens: (usize, usize),
    /// Conversations in flight: requests interleave over this many.
    pub concurrent: usize,
    /// No request grows beyond this many tokens.
    pub max_tokens: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            system_prompts: 4,
            few_shots: 16,
            system_tokens: (256, 1024),
            few_shot_tokens: (128, 768),
            with_system: 900,
            with_few_shot: 700,
            turns: (1, 6),
            first_user_tokens: (64, 512),
            turn_tokens: (96, 512),
            concurrent: 32,
            max_tokens: 6144,
        }
    }
}

/// A seeded SplitMix64 stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix(self.0)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, (lo, hi): (usize, usize)) -> usize {
        lo + (self.next() % (hi.saturating_sub(lo) as u64 + 1)) as usize
    }
    fn per_mille(&mut self, p: u64) -> bool {
        self.next() % 1000 < p
    }
}

/// Content ids live in their own range, far from trace hash ids and from the
/// padding ids of `trace::prompt` (bit 50), so no workload's tokens collide with
/// another's; `expand` keeps the low 55 bits of an id.
const SYSTEM_NS: u64 = 1 << 52;
const FEW_SHOT_NS: u64 = 2 << 52;
const CONVERSATION_NS: u64 = 3 << 52;

/// A content id in namespace `ns`, drawn from `x`.
fn id(ns: u64, x: u64) -> u64 {
    ns | splitmix(x) >> 12
}

/// `n` tokens of the content named `id`, from `expand` 512 tokens at a time.
fn content(id: u64, n: usize, out: &mut Vec<u32>) {
    for k in 0..n.div_ceil(TRACE_BLOCK) as u64 {
        let take = (n - k as usize * TRACE_BLOCK).min(TRACE_BLOCK);
        expand(id ^ (k << 40), take, out);
    }
}

/// One conversation in flight.
struct Conversation {
    tokens: Vec<u32>,
    turns_left: usize,
    id: u64,
    turn: u64,
}

/// The requests of the shared-prefix workload for `block_size`, one at a time, an
/// endless stream: a run takes as many as it needs, and may take them again from a
/// new generator with the same arguments instead of holding them.
pub struct Generator {
    shape: Shape,
    block_size: usize,
    seed: u64,
    rng: Rng,
    systems: Vec<Vec<u32>>,
    few_shots: Vec<Vec<u32>>,
    next_conversation: u64,
    live: Vec<Conversation>,
    made: u64,
}

impl Generator {
    pub fn new(shape: &Shape, block_size: usize, seed: u64) -> Self {
        let mut rng = Rng(splitmix(seed ^ 0x5A4E_D9F1));
        let systems: Vec<Vec<u32>> = (0..shape.system_prompts as u64)
            .map(|i| {
                let mut t = Vec::new();
                content(
                    id(SYSTEM_NS, seed ^ i),
                    rng.range(shape.system_tokens),
                    &mut t,
                );
                t
            })
            .collect();
        // Few-shot prefix j extends system prompt j % system_prompts.
        let few_shots: Vec<Vec<u32>> = (0..shape.few_shots as u64)
            .map(|j| {
                let mut t = Vec::new();
                content(
                    id(FEW_SHOT_NS, seed ^ !j),
                    rng.range(shape.few_shot_tokens),
                    &mut t,
                );
                t
            })
            .collect();
        let mut g = Generator {
            shape: shape.clone(),
            block_size,
            seed,
            rng,
            systems,
            few_shots,
            next_conversation: 0,
            live: Vec::new(),
            made: 0,
        };
        g.live = (0..shape.concurrent.max(1)).map(|_| g.start()).collect();
        g
    }

    /// A new conversation: maybe a system prompt and a few-shot prefix, then its
    /// first user message.
    fn start(&mut self) -> Conversation {
        let (shape, rng) = (&self.shape, &mut self.rng);
        let mut tokens = Vec::new();
        if !self.systems.is_empty() && rng.per_mille(shape.with_system) {
            let s = rng.next() as usize % self.systems.len();
            tokens.extend_from_slice(&self.systems[s]);
            // The few-shot prefixes of this system prompt: s, s + systems, ...
            let mine = (s..self.few_shots.len())
                .step_by(self.systems.len())
                .count();
            if mine > 0 && rng.per_mille(shape.with_few_shot) {
                let f = s + self.systems.len() * (rng.next() as usize % mine);
                tokens.extend_from_slice(&self.few_shots[f]);
            }
        }
        let conv = id(
            CONVERSATION_NS,
            self.seed ^ self.next_conversation.rotate_left(17),
        );
        self.next_conversation += 1;
        content(conv, rng.range(shape.first_user_tokens), &mut tokens);
        tokens.truncate(shape.max_tokens);
        Conversation {
            tokens,
            turns_left: rng.range(shape.turns).max(1),
            id: conv,
            turn: 0,
        }
    }
}

impl Iterator for Generator {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        let c = self.rng.next() as usize % self.live.len();
        let answer = self.rng.range(self.shape.turn_tokens);
        let conv = &mut self.live[c];
        let req = from_tokens(conv.tokens.clone(), self.block_size, self.made * 10, answer);
        self.made += 1;
        conv.turns_left -= 1;
        conv.turn += 1;
        // The next turn: this prompt, the answer to it and the next user message.
        let room = self.shape.max_tokens.saturating_sub(conv.tokens.len());
        if conv.turns_left == 0 || room == 0 {
            self.live[c] = self.start();
        } else {
            content(
                conv.id ^ (conv.turn << 32),
                answer.min(room),
                &mut conv.tokens,
            );
        }
        Some(req)
    }
}

/// The first `count` requests of the shared-prefix workload for `block_size`.
#[cfg(test)]
pub fn generate(shape: &Shape, count: usize, block_size: usize, seed: u64) -> Vec<Request> {
    Generator::new(shape, block_size, seed)
        .take(count)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn small() -> Vec<Request> {
        generate(&Shape::default(), 600, 16, 7)
    }

    #[test]
    fn deterministic_from_the_seed() {
        let (a, b) = (small(), small());
        assert!(
            a.iter()
                .zip(&b)
                .all(|(x, y)| x.tokens == y.tokens && x.seqs == y.seqs)
        );
        let c = generate(&Shape::default(), 600, 16, 8);
        assert!(a.iter().zip(&c).any(|(x, y)| x.tokens != y.tokens));
    }

    #[test]
    fn blocks_are_the_tokens_hashes() {
        for r in small().iter().take(50) {
            assert_eq!(r.seqs.len(), r.tokens.len() / 16);
            assert_eq!(r.seqs, from_tokens(r.tokens.clone(), 16, 0, 0).seqs);
        }
    }

    #[test]
    fn prefixes_are_shared_by_most_requests() {
        let reqs = small();
        let shape = Shape::default();
        // First blocks: one per system prompt, plus the conversations without one.
        let mut first: HashMap<u64, usize> = HashMap::new();
        for r in &reqs {
            *first.entry(r.seqs[0]).or_default() += 1;
        }
        let shared: usize = first.values().filter(|&&n| n >= 20).sum();
        assert!(
            shared * 10 >= reqs.len() * 8,
            "{shared} of {} requests open with a shared block",
            reqs.len()
        );
        assert!(first.values().filter(|&&n| n >= 20).count() <= shape.system_prompts);
        // Shared deeply, not just one block: the 16th block (256 tokens in) too.
        let mut deep: HashMap<u64, usize> = HashMap::new();
        for r in reqs.iter().filter(|r| r.seqs.len() > 16) {
            *deep.entry(r.seqs[15]).or_default() += 1;
        }
        assert!(deep.values().any(|&n| n >= 50));
    }

    #[test]
    fn conversations_grow_and_differ() {
        let reqs = small();
        // Some request is a later turn: another request's tokens are its strict prefix.
        let by_len: Vec<&Request> = reqs.iter().collect();
        let continued = by_len.iter().any(|r| {
            by_len
                .iter()
                .any(|q| q.tokens.len() + 64 <= r.tokens.len() && r.tokens.starts_with(&q.tokens))
        });
        assert!(continued);
        // Suffixes are per conversation: the last blocks are mostly distinct.
        let lasts: std::collections::HashSet<u64> =
            reqs.iter().map(|r| *r.seqs.last().unwrap()).collect();
        assert!(lasts.len() * 10 >= reqs.len() * 9);
        assert!(
            reqs.iter()
                .all(|r| r.tokens.len() <= Shape::default().max_tokens)
        );
    }
}
