//! Predicted holders: (block, worker) pairs a router expects to appear soon.
//!
//! A prediction is the worker's holder word with the [`Tier::PREDICTED`] bit; this
//! module owns only *when* each one ends: a deadline per live pair and a timing
//! wheel of pairs by deadline tick, so expiry visits only the pairs due, never the
//! whole index, and pruning (approximate mode) drops the soonest-due pairs first.
//! It never changes holders itself: it hands the pairs that end to its caller.
//!
//! [`Tier::PREDICTED`]: crate::types::Tier::PREDICTED

use crate::types::{SeqHash, WorkerSlot};
use hashbrown::HashMap;
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Time in [`TICK`]s since the process started (`u32`: two years at 16 ms).
pub type Tick = u32;

/// Expiry resolution: a prediction ends within two ticks after its TTL.
pub const TICK: Duration = Duration::from_millis(16);

/// Buckets in the wheel: one lap spans 4 s, the default TTL with room to spare.
/// A deadline further out waits in its bucket and is put back on each lap.
const WHEEL: usize = 256;

/// Ticks covering `d`, rounded up (a TTL never ends early), at least one.
pub fn ticks(d: Duration) -> Tick {
    let t = TICK.as_nanos();
    (d.as_nanos().div_ceil(t)).clamp(1, Tick::MAX as u128 / 2) as Tick
}

/// The deadline of a prediction made now that must live at least `ttl`: the
/// current tick is partly gone, so the count starts at the next one.
pub fn deadline_after(ttl: Duration) -> Tick {
    now_tick().saturating_add(1).saturating_add(ticks(ttl))
}

/// The current tick, from a process-wide epoch shared by every core.
pub fn now_tick() -> Tick {
    (since_epoch().as_nanos() / TICK.as_nanos()) as Tick
}

fn since_epoch() -> Duration {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed()
}

/// How a store names the blocks it predicts: 64 bits that name one block.
pub trait PredictedBlock: Copy {
    fn to_bits(self) -> u64;
    fn from_bits(bits: u64) -> Self;
}

impl PredictedBlock for SeqHash {
    fn to_bits(self) -> u64 {
        self.0
    }
    fn from_bits(bits: u64) -> Self {
        SeqHash(bits)
    }
}

/// A predicted (block, worker) pair, packed into 4-byte words: 12 bytes where
/// `(SeqHash, WorkerSlot)` takes 16, and 16 with its deadline where that takes 24.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Pair([u32; 3]);

impl std::hash::Hash for Pair {
    /// Two integer writes, as the unpacked tuple would hash (not a byte slice).
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u64(self.bits());
        h.write_u32(self.0[2]);
    }
}

impl Pair {
    fn new(block: impl PredictedBlock, slot: WorkerSlot) -> Pair {
        let b = block.to_bits();
        Pair([b as u32, (b >> 32) as u32, slot.0])
    }

    fn bits(self) -> u64 {
        self.0[0] as u64 | (self.0[1] as u64) << 32
    }

    fn block<B: PredictedBlock>(self) -> B {
        B::from_bits(self.bits())
    }

    fn slot(self) -> WorkerSlot {
        WorkerSlot(self.0[2])
    }
}

/// What a prediction op did to its pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Predicted {
    /// A new predicted pair.
    Created,
    /// An existing prediction got a later deadline.
    Refreshed,
}

/// The live predictions of one index shard and their deadlines, blocks named by `B`.
pub struct Predictions<B = SeqHash> {
    /// Deadline of every live predicted pair. An entry outlives its holder bit only
    /// when the pair was cleared or evicted; its next wheel visit drops it.
    deadline: HashMap<Pair, Tick>,
    /// `wheel[t % WHEEL]`: pairs whose deadline was `t` when filed (or a later lap).
    /// Empty until the first prediction.
    wheel: Vec<Vec<Pair>>,
    /// Every tick up to this one has been expired.
    done: Tick,
    named: PhantomData<B>,
}

impl<B> Default for Predictions<B> {
    fn default() -> Self {
        Predictions {
            deadline: HashMap::default(),
            wheel: Vec::new(),
            done: 0,
            named: PhantomData,
        }
    }
}

impl<B: PredictedBlock> Predictions<B> {
    /// Pairs with a deadline (live, or cleared and not yet visited).
    pub fn len(&self) -> usize {
        self.deadline.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deadline.is_empty()
    }

    /// Record that `(seq, slot)` is predicted until `deadline`; a prediction that
    /// already runs longer keeps its deadline.
    pub fn predict(&mut self, seq: B, slot: WorkerSlot, deadline: Tick) -> Predicted {
        let deadline = deadline.max(self.done + 1);
        match self.deadline.entry(Pair::new(seq, slot)) {
            hashbrown::hash_map::Entry::Occupied(mut e) => {
                // The pair is already filed; its visit finds the later deadline and
                // files it again there.
                if *e.get() < deadline {
                    *e.get_mut() = deadline;
                }
                Predicted::Refreshed
            }
            hashbrown::hash_map::Entry::Vacant(e) => {
                e.insert(deadline);
                self.file(seq, slot, deadline);
                Predicted::Created
            }
        }
    }

    fn file(&mut self, seq: B, slot: WorkerSlot, deadline: Tick) {
        if self.wheel.is_empty() {
            self.wheel.resize_with(WHEEL, Vec::new);
        }
        self.wheel[deadline as usize % WHEEL].push(Pair::new(seq, slot));
    }

    /// The pair became an ordinary holder (or went away): forget its deadline.
    pub fn forget(&mut self, seq: B, slot: WorkerSlot) {
        self.deadline.remove(&Pair::new(seq, slot));
    }

    /// Hand every pair of `slot` to `end`, whatever its deadline (its slot was
    /// cleared): a walk of the live predictions, not of the index.
    pub fn end_slot(&mut self, slot: WorkerSlot, mut end: impl FnMut(B, WorkerSlot)) {
        self.deadline.retain(|pair, _| {
            if pair.slot() == slot {
                end(pair.block(), slot);
                false
            } else {
                true
            }
        });
    }

    /// Hand every pair whose deadline is at or before `now` to `end`, visiting only
    /// the buckets of the ticks since the last call (at most one lap).
    pub fn expire(&mut self, now: Tick, mut end: impl FnMut(B, WorkerSlot)) {
        if now <= self.done {
            return;
        }
        if self.wheel.is_empty() {
            self.done = now;
            return;
        }
        let span = (now - self.done).min(WHEEL as Tick);
        for t in now + 1 - span..=now {
            let b = t as usize % WHEEL;
            let mut bucket = std::mem::take(&mut self.wheel[b]);
            for pair in bucket.drain(..) {
                match self.deadline.get(&pair) {
                    None => {}
                    // Refreshed, or filed a lap or more ahead: file it where it is due.
                    Some(&d) if d > now => self.wheel[d as usize % WHEEL].push(pair),
                    Some(_) => {
                        self.deadline.remove(&pair);
                        end(pair.block(), pair.slot());
                    }
                }
            }
            // Keep the bucket's allocation for its next lap.
            if self.wheel[b].is_empty() {
                self.wheel[b] = bucket;
            }
        }
        self.done = now;
        if self.deadline.is_empty() && self.wheel.iter().all(Vec::is_empty) {
            // Nothing predicted any more: give the wheel and the map back.
            *self = Predictions {
                done: now,
                ..Predictions::default()
            };
        }
    }

    /// End `n` pairs early (or all, if fewer), those due soonest first, handing each
    /// to `end`; among pairs due in the same tick, the first predicted go first. A
    /// histogram of deadlines finds the cutoff bin: every pair due before it ends,
    /// then the bin's ticks are walked in their wheel buckets' filing order.
    pub fn prune(&mut self, n: usize, mut end: impl FnMut(B, WorkerSlot)) {
        if n == 0 || self.deadline.is_empty() {
            return;
        }
        const BINS: usize = 1024;
        let lo = self.deadline.values().copied().min().unwrap_or(0);
        let hi = self.deadline.values().copied().max().unwrap_or(0);
        let width = ((hi - lo) as usize / BINS + 1) as Tick;
        let mut hist = [0usize; BINS];
        for &d in self.deadline.values() {
            hist[((d - lo) / width) as usize] += 1;
        }
        let mut seen = 0;
        let mut cut = BINS - 1;
        for (i, c) in hist.iter().enumerate() {
            if seen + c >= n {
                cut = i;
                break;
            }
            seen += c;
        }
        let bin = lo as u64 + cut as u64 * width as u64;
        self.deadline.retain(|pair, d| {
            if (*d as u64) < bin {
                end(pair.block(), pair.slot());
                false
            } else {
                true
            }
        });
        let mut left = n - seen;
        for t in bin..bin + width as u64 {
            if left == 0 {
                return;
            }
            let t = t as Tick;
            // A pair predicted again since it was filed sits in its old bucket;
            // popping a stale entry here is harmless (expiry skips it).
            for pair in &self.wheel[t as usize % WHEEL] {
                if left > 0 && self.deadline.get(pair) == Some(&t) {
                    self.deadline.remove(pair);
                    end(pair.block(), pair.slot());
                    left -= 1;
                }
            }
        }
        // Refreshed pairs not yet re-filed: any of the bin's, to make up the count.
        let end_bin = bin + width as u64;
        self.deadline.retain(|pair, d| {
            if left > 0 && (*d as u64) < end_bin {
                end(pair.block(), pair.slot());
                left -= 1;
                false
            } else {
                true
            }
        });
    }

    /// Heap bytes, for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.deadline.allocation_size()
            + self
                .wheel
                .iter()
                .map(|b| b.capacity() * std::mem::size_of::<Pair>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(i: u64) -> (SeqHash, WorkerSlot) {
        (SeqHash(i), WorkerSlot(1))
    }

    fn expired(p: &mut Predictions, now: Tick) -> Vec<u64> {
        let mut out = Vec::new();
        p.expire(now, |s, _| out.push(s.0));
        out.sort();
        out
    }

    #[test]
    fn a_deadline_never_comes_before_its_ttl() {
        for ms in [1, 15, 16, 17, 1500] {
            let ttl = Duration::from_millis(ms);
            let start = since_epoch();
            let due = TICK * deadline_after(ttl);
            assert!(due >= start + ttl, "{ms} ms: due {due:?}, start {start:?}");
            assert!(due <= start + ttl + 2 * TICK, "{ms} ms: due {due:?}");
        }
    }

    #[test]
    fn pairs_end_at_their_deadline_not_before() {
        let mut p = Predictions::default();
        for i in 0..10 {
            let (s, w) = pair(i);
            assert_eq!(p.predict(s, w, 10 + i as Tick), Predicted::Created);
        }
        assert!(expired(&mut p, 9).is_empty());
        assert_eq!(expired(&mut p, 12), vec![0, 1, 2]);
        assert_eq!(expired(&mut p, 100), (3..10).collect::<Vec<_>>());
        assert!(p.is_empty());
    }

    #[test]
    fn a_refresh_moves_the_deadline_and_a_forgotten_pair_never_ends() {
        let mut p = Predictions::default();
        let (a, w) = pair(1);
        let (b, _) = pair(2);
        p.predict(a, w, 10);
        p.predict(b, w, 10);
        assert_eq!(p.predict(a, w, 50), Predicted::Refreshed);
        // A shorter refresh does not cut a longer prediction.
        p.predict(a, w, 20);
        p.forget(b, w);
        assert!(expired(&mut p, 49).is_empty());
        assert_eq!(expired(&mut p, 50), vec![1]);
    }

    #[test]
    fn deadlines_beyond_a_lap_and_long_gaps_between_calls() {
        let mut p = Predictions::default();
        let far = 3 * WHEEL as Tick + 7;
        p.predict(SeqHash(1), WorkerSlot(0), far);
        p.predict(SeqHash(2), WorkerSlot(0), 5);
        for now in (1..far).step_by(3) {
            let e = expired(&mut p, now);
            assert!(e.iter().all(|&s| s == 2), "{now}: {e:?}");
        }
        assert_eq!(expired(&mut p, far), vec![1]);
        // A gap of many laps between calls still ends everything due.
        p.predict(SeqHash(3), WorkerSlot(0), far + 10);
        assert_eq!(expired(&mut p, far + 10 * WHEEL as Tick), vec![3]);
    }

    #[test]
    fn a_deadline_already_past_ends_on_the_next_tick() {
        let mut p = Predictions::default();
        p.expire(100, |_, _| {});
        p.predict(SeqHash(1), WorkerSlot(0), 50);
        assert_eq!(expired(&mut p, 101), vec![1]);
    }

    #[test]
    fn prune_ends_the_soonest_due_first() {
        let mut p = Predictions::default();
        for i in 0..1000u64 {
            p.predict(SeqHash(i), WorkerSlot(0), 1000 + i as Tick);
        }
        let mut gone = Vec::new();
        p.prune(200, |s, _| gone.push(s.0));
        gone.sort();
        assert_eq!(gone, (0..200).collect::<Vec<_>>());
        assert_eq!(p.len(), 1000 - gone.len());
        // Pruned pairs do not end again.
        let rest = expired(&mut p, 5000);
        assert_eq!(rest.len(), 1000 - gone.len());
    }

    #[test]
    fn prune_within_one_tick_ends_the_first_predicted() {
        let mut p = Predictions::default();
        for i in 0..100u64 {
            p.predict(SeqHash(i), WorkerSlot(0), 700);
        }
        // Refreshing keeps a pair's place: it was still predicted first.
        p.predict(SeqHash(3), WorkerSlot(0), 700);
        let mut gone = Vec::new();
        p.prune(30, |s, _| gone.push(s.0));
        assert_eq!(gone, (0..30).collect::<Vec<_>>());
        p.prune(500, |s, _| gone.push(s.0));
        assert_eq!(gone.len(), 100);
        assert!(p.is_empty());
    }
}
