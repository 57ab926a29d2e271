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

/// The wheel's levels, of [`SLOTS`] slots each: a slot of level `l` spans
/// `SLOTS^l` ticks, so six levels span every tick a [`Tick`] holds, and a
/// pair is looked at once per level it moves down (at most six times,
/// whatever its TTL), never once a lap.
const LEVELS: usize = 6;
const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;

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

/// How long until tick `t` begins (zero if it has).
pub fn until(t: Tick) -> Duration {
    (TICK * t).saturating_sub(since_epoch())
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

/// When a pair is due, and the request that predicted it first (its stamp,
/// counting up: pruning ends earlier requests' first among equal deadlines).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Due {
    at: Tick,
    stamp: u32,
}

/// The live predictions of one index shard and their deadlines, blocks named by `B`.
pub struct Predictions<B = SeqHash> {
    /// Deadline of every live predicted pair. An entry outlives its holder bit only
    /// when the pair was cleared or evicted; its next wheel visit drops it.
    deadline: HashMap<Pair, Due>,
    /// A hierarchical timing wheel (as the Linux kernel's and tokio's): the slot
    /// `i` of `level`, `slots[level * SLOTS + i]`, holds the pairs whose deadline,
    /// when filed, lay in it counted from `elapsed` (see [`level_for`]). Empty
    /// until the first prediction.
    slots: Vec<Vec<Pair>>,
    /// Per level, a bit per slot that holds pairs.
    occupied: [u64; LEVELS],
    /// The wheel's time: every slot that starts at or before it has been taken.
    elapsed: Tick,
    /// The pairs of the slot taken last, from `due_at` on not yet looked at (an
    /// expiry looks at a bounded number per call).
    due: Vec<Pair>,
    due_at: usize,
    /// Every tick up to this one has been handed to [`Self::expire`].
    done: Tick,
    named: PhantomData<B>,
}

impl<B> Default for Predictions<B> {
    fn default() -> Self {
        Predictions {
            deadline: HashMap::default(),
            slots: Vec::new(),
            occupied: [0; LEVELS],
            elapsed: 0,
            due: Vec::new(),
            due_at: 0,
            done: 0,
            named: PhantomData,
        }
    }
}

/// The level a deadline `when` is filed at, from the wheel's time `elapsed`: the
/// level of the highest group of [`SLOT_BITS`] in which they differ. Filed there,
/// the pair's slot starts after `elapsed`, and every pair of a lower level is
/// due before it.
fn level_for(elapsed: Tick, when: Tick) -> usize {
    let masked = u64::from(elapsed ^ when) | (SLOTS as u64 - 1);
    let significant = 63 - masked.leading_zeros();
    ((significant / SLOT_BITS) as usize).min(LEVELS - 1)
}

impl<B: PredictedBlock> Predictions<B> {
    /// Pairs with a deadline (live, or cleared and not yet visited).
    pub fn len(&self) -> usize {
        self.deadline.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deadline.is_empty()
    }

    /// Record that `(seq, slot)` is predicted until `deadline` by the request
    /// `stamp`; a prediction that already runs longer keeps its deadline, and a
    /// pair predicted before keeps its first stamp.
    pub fn predict(&mut self, seq: B, slot: WorkerSlot, deadline: Tick, stamp: u32) -> Predicted {
        let deadline = deadline.max(self.done + 1);
        match self.deadline.entry(Pair::new(seq, slot)) {
            hashbrown::hash_map::Entry::Occupied(mut e) => {
                // The pair is already filed; its visit finds the later deadline and
                // files it again there.
                let due = e.get_mut();
                due.at = due.at.max(deadline);
                Predicted::Refreshed
            }
            hashbrown::hash_map::Entry::Vacant(e) => {
                e.insert(Due {
                    at: deadline,
                    stamp,
                });
                self.file(Pair::new(seq, slot), deadline);
                Predicted::Created
            }
        }
    }

    /// Files `pair` in the slot of `when` (which is after `elapsed`).
    fn file(&mut self, pair: Pair, when: Tick) {
        if self.slots.is_empty() {
            self.slots.resize_with(LEVELS * SLOTS, Vec::new);
        }
        let level = level_for(self.elapsed, when);
        let slot = (u64::from(when) >> (level as u32 * SLOT_BITS)) as usize % SLOTS;
        self.slots[level * SLOTS + slot].push(pair);
        self.occupied[level] |= 1 << slot;
    }

    /// The next slot to take: its level, its index and the tick it starts at (the
    /// lowest level that holds pairs: they are due before any of a higher one).
    fn next_slot(&self) -> Option<(usize, usize, Tick)> {
        let level = (0..LEVELS).find(|&l| self.occupied[l] != 0)?;
        let shift = level as u32 * SLOT_BITS;
        let at = u64::from(self.elapsed);
        let now_slot = (at >> shift) % SLOTS as u64;
        // Slots hold deadlines after `elapsed`, so the first one holding pairs
        // from here on, round the level, is the next.
        let rotated = self.occupied[level].rotate_right(now_slot as u32);
        let slot = (u64::from(rotated.trailing_zeros()) + now_slot) % SLOTS as u64;
        let level_span = 1u64 << (shift + SLOT_BITS);
        let mut start = (at & !(level_span - 1)) + (slot << shift);
        if start <= at {
            start += level_span;
        }
        Some((
            level,
            slot as usize,
            start.min(u64::from(Tick::MAX)) as Tick,
        ))
    }

    /// When [`Self::expire`] next has work: now, if pairs of a slot whose turn
    /// came are left; else the start of the next slot holding pairs (a pair due
    /// then, or pairs to move down a level); `None` when nothing is predicted.
    pub fn next_due(&self) -> Option<Tick> {
        if self.deadline.is_empty() {
            None
        } else if self.due_at < self.due.len() {
            Some(self.elapsed)
        } else {
            self.next_slot().map(|(_, _, at)| at)
        }
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

    /// Hand pairs whose deadline is at or before `now` to `end`, looking at no more
    /// than `budget` pairs: only the slots whose turn came since the last call
    /// are taken, each pair due moves down a level or ends. Returns whether pairs
    /// due by `now` are left for the next call.
    pub fn expire(&mut self, now: Tick, budget: usize, mut end: impl FnMut(B, WorkerSlot)) -> bool {
        self.done = self.done.max(now);
        let now = self.done;
        let mut left = budget;
        loop {
            while let Some(&pair) = self.due.get(self.due_at) {
                if left == 0 {
                    return true;
                }
                left -= 1;
                self.due_at += 1;
                match self.deadline.get(&pair) {
                    None => {}
                    // Refreshed, or due in a later slot of a lower level.
                    Some(d) if d.at > now => self.file(pair, d.at),
                    Some(_) => {
                        self.deadline.remove(&pair);
                        end(pair.block(), pair.slot());
                    }
                }
            }
            match self.next_slot() {
                Some((level, slot, at)) if at <= now && !self.deadline.is_empty() => {
                    self.elapsed = at;
                    self.occupied[level] &= !(1 << slot);
                    self.due = std::mem::take(&mut self.slots[level * SLOTS + slot]);
                    self.due_at = 0;
                }
                _ => break,
            }
        }
        if self.deadline.is_empty() {
            // Nothing predicted any more: give the wheel and the map back.
            *self = Predictions {
                done: now,
                elapsed: now,
                ..Predictions::default()
            };
        } else {
            // No slot starts by `now`: the wheel's time moves on without passing one.
            self.due = Vec::new();
            self.due_at = 0;
            self.elapsed = now;
        }
        false
    }

    /// End `n` pairs early (or all, if fewer), those due soonest first, handing each
    /// to `end`; among pairs due in the same tick, those of the earlier request
    /// first, and a request's from the last predicted (a prompt from its end, so
    /// that each ends a block rather than leave a path to the ones after it). A
    /// histogram of deadlines finds the cutoff bin: every pair due before it
    /// ends, then the bin's pairs in that order.
    pub fn prune(&mut self, n: usize, mut end: impl FnMut(B, WorkerSlot)) {
        if n == 0 || self.deadline.is_empty() {
            return;
        }
        const BINS: usize = 1024;
        let lo = self.deadline.values().map(|d| d.at).min().unwrap_or(0);
        let hi = self.deadline.values().map(|d| d.at).max().unwrap_or(0);
        let width = ((hi - lo) as usize / BINS + 1) as Tick;
        let mut hist = [0usize; BINS];
        for d in self.deadline.values() {
            hist[((d.at - lo) / width) as usize] += 1;
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
        let bin = u64::from(lo) + cut as u64 * u64::from(width);
        let bin_end = bin + u64::from(width);
        self.deadline.retain(|pair, d| {
            if u64::from(d.at) < bin {
                end(pair.block(), pair.slot());
                false
            } else {
                true
            }
        });
        // The bin's pairs, each with its place in filing order: the slot being
        // taken, then the levels from the top (a pair is filed lower the later it
        // is filed, and a slot keeps its pairs in filing order).
        let mut in_bin: Vec<(Due, usize, Pair)> = Vec::new();
        let filed = std::iter::once(&self.due[self.due_at.min(self.due.len())..])
            .chain(self.slots.chunks(SLOTS).rev().flatten().map(Vec::as_slice));
        for (i, &pair) in filed.flatten().enumerate() {
            if let Some(&d) = self.deadline.get(&pair)
                && (bin..bin_end).contains(&u64::from(d.at))
            {
                in_bin.push((d, i, pair));
            }
        }
        in_bin.sort_unstable_by_key(|&(d, i, _)| (d.at, d.stamp, std::cmp::Reverse(i)));
        let mut left = n - seen;
        for (d, _, pair) in in_bin {
            if left == 0 {
                break;
            }
            // A pair forgotten and predicted again is filed twice: it ends once.
            if self.deadline.get(&pair) == Some(&d) {
                self.deadline.remove(&pair);
                end(pair.block(), pair.slot());
                left -= 1;
            }
        }
    }

    /// Heap bytes, for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        let pairs = self.due.capacity() + self.slots.iter().map(Vec::capacity).sum::<usize>();
        self.deadline.allocation_size()
            + pairs * std::mem::size_of::<Pair>()
            + self.slots.capacity() * std::mem::size_of::<Vec<Pair>>()
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
        assert!(!p.expire(now, usize::MAX, |s, _| out.push(s.0)));
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
            assert_eq!(p.predict(s, w, 10 + i as Tick, 0), Predicted::Created);
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
        p.predict(a, w, 10, 0);
        p.predict(b, w, 10, 0);
        assert_eq!(p.predict(a, w, 50, 0), Predicted::Refreshed);
        // A shorter refresh does not cut a longer prediction.
        p.predict(a, w, 20, 0);
        p.forget(b, w);
        assert!(expired(&mut p, 49).is_empty());
        assert_eq!(expired(&mut p, 50), vec![1]);
    }

    #[test]
    fn deadlines_levels_out_and_long_gaps_between_calls() {
        let mut p = Predictions::default();
        let far = 3 * 4096 + 7;
        p.predict(SeqHash(1), WorkerSlot(0), far, 0);
        p.predict(SeqHash(2), WorkerSlot(0), 5, 0);
        for now in (1..far).step_by(3) {
            let e = expired(&mut p, now);
            assert!(e.iter().all(|&s| s == 2), "{now}: {e:?}");
        }
        assert_eq!(expired(&mut p, far), vec![1]);
        // A gap of many slots between calls still ends everything due.
        p.predict(SeqHash(3), WorkerSlot(0), far + 10, 0);
        p.predict(SeqHash(4), WorkerSlot(0), far + 300_000, 0);
        assert_eq!(expired(&mut p, far + 200_000), vec![3]);
        assert_eq!(expired(&mut p, far + 300_000), vec![4]);
        assert!(p.is_empty());
    }

    /// A pair is looked at once per level it moves down, never once a lap:
    /// an hour-long prediction asks for a handful of wake-ups, the first of
    /// them far ahead.
    #[test]
    fn an_hour_long_prediction_is_visited_a_few_times() {
        let mut p = Predictions::default();
        let start: Tick = 1_000_003;
        p.expire(start, usize::MAX, |_, _| {});
        let hour = ticks(Duration::from_secs(3600));
        p.predict(SeqHash(1), WorkerSlot(0), start + hour, 0);
        p.predict(SeqHash(2), WorkerSlot(0), start + hour, 0);
        let first = p.next_due().unwrap();
        assert!(
            first - start > 4096,
            "first wake-up after {} ticks",
            first - start
        );
        let (mut wakeups, mut ended) = (0, Vec::new());
        while let Some(t) = p.next_due() {
            wakeups += 1;
            assert!(t <= start + hour, "{t}");
            p.expire(t, usize::MAX, |s, _| ended.push(s.0));
        }
        assert!(wakeups <= LEVELS, "{wakeups} wake-ups");
        ended.sort();
        assert_eq!(ended, [1, 2]);
    }

    /// An expiry looks at a bounded number of pairs per call, and the next call
    /// goes on where it stopped.
    #[test]
    fn a_mass_expiry_is_spread_over_calls() {
        let mut p = Predictions::default();
        for i in 0..10_000u64 {
            p.predict(SeqHash(i), WorkerSlot(0), 100, 0);
        }
        let mut ended = Vec::new();
        let mut calls = 1;
        while p.expire(100, 1000, |s, _| ended.push(s.0)) {
            calls += 1;
            assert_eq!(p.next_due(), Some(64));
        }
        assert!(calls >= 10, "{calls}");
        ended.sort();
        assert_eq!(ended, (0..10_000).collect::<Vec<_>>());
        assert_eq!(p.next_due(), None);
    }

    #[test]
    fn a_deadline_already_past_ends_on_the_next_tick() {
        let mut p = Predictions::default();
        p.expire(100, usize::MAX, |_, _| {});
        p.predict(SeqHash(1), WorkerSlot(0), 50, 0);
        assert_eq!(expired(&mut p, 101), vec![1]);
    }

    #[test]
    fn prune_ends_the_soonest_due_first() {
        let mut p = Predictions::default();
        for i in 0..1000u64 {
            p.predict(SeqHash(i), WorkerSlot(0), 1000 + i as Tick, 0);
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

    /// Among pairs due in the same tick, an earlier request's go first, and a
    /// request's own from the last predicted.
    #[test]
    fn prune_within_one_tick_ends_earlier_requests_first_each_from_its_end() {
        let mut p = Predictions::default();
        for r in 0..10u32 {
            for b in 0..10u64 {
                p.predict(SeqHash(10 * r as u64 + b), WorkerSlot(0), 700, r);
            }
        }
        // Refreshing keeps a pair's place: it was still predicted by request 0.
        p.predict(SeqHash(3), WorkerSlot(0), 700, 42);
        let mut gone = Vec::new();
        p.prune(15, |s, _| gone.push(s.0));
        assert_eq!(
            gone,
            [
                (0..10).rev().collect::<Vec<u64>>(),
                (15..20).rev().collect()
            ]
            .concat()
        );
        p.prune(500, |s, _| gone.push(s.0));
        assert_eq!(gone.len(), 100);
        assert!(p.is_empty());
    }

    /// Pruning sees pairs wherever the wheel holds them: moved down a level,
    /// or in a slot an expiry is partway through.
    #[test]
    fn prune_finds_pairs_on_every_level() {
        let mut p = Predictions::default();
        for i in 0..1000u64 {
            p.predict(SeqHash(i), WorkerSlot(0), 64 + (i as Tick % 10) * 5000, 0);
        }
        let mut ended = 0;
        assert!(p.expire(64, 10, |_, _| ended += 1));
        assert_eq!(ended, 10);
        let mut gone = Vec::new();
        p.prune(300, |s, _| gone.push(s.0));
        assert_eq!(gone.len(), 300);
        // The 90 due at 64 that the expiry left, the 100 due at 5064 and at
        // 10064, then the last 10 predicted of those due at 15064.
        let due = |s: &u64| 64 + (*s as Tick % 10) * 5000;
        assert_eq!(gone.iter().filter(|s| due(s) <= 10_064).count(), 290);
        assert_eq!(
            gone[290..],
            (0..10).map(|k| 993 - 10 * k).collect::<Vec<_>>()
        );
        assert_eq!(p.len(), 690);
        let mut rest = Vec::new();
        p.expire(Tick::MAX / 2, usize::MAX, |s, _| rest.push(s.0));
        assert_eq!(rest.len(), 690);
    }
}
