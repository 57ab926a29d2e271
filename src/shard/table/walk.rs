//! Walks of a table while it changes between their steps: [`Cursor`] walks in
//! steps that keep or drop each entry, and reads by part (an export's).
//!
//! Owns where a walk has got to, and that every entry that stays is passed.
//! Must never change the segments' layout: a walk only removes entries, and a
//! segment that moved under it is walked again.

use super::{BlockTable, Filed, Reach, TableKey, shrink_if_sparse};

/// Where a walk in steps ([`BlockTable::retain_step`]) has got to; the default
/// starts one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    /// The first key (spread) of the segment being walked.
    from: u64,
    /// Past the last segment.
    done: bool,
    /// The segment last walked at `from`: another one there (a split, or a table
    /// filed anew) starts its walk over.
    seg: usize,
    bucket: usize,
    /// The segment's move count when the walk got to `bucket`.
    moves: u32,
}

impl Cursor {
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// A walk with nothing left to walk.
    pub fn done() -> Self {
        Cursor {
            done: true,
            ..Cursor::default()
        }
    }
}

impl<E: Filed + Copy> BlockTable<E> {
    /// [`Self::retain`] over at most `budget` buckets from `at`, moving `at` past
    /// them: a walk of every entry in steps, other changes to the table allowed
    /// between steps. Every entry in the table from the walk's start to its end is
    /// passed to `keep` at least once: a segment whose entries moved since the last
    /// step is walked again from its start, so `keep` must give the same answer for
    /// an entry it has seen. An entry filed during the walk may or may not be seen.
    /// `keep` may change the context, but not what it says of an entry's key.
    pub fn retain_step_in(
        &mut self,
        at: &mut Cursor,
        budget: usize,
        ctx: &mut E::Ctx,
        mut keep: impl FnMut(&mut E::Ctx, &mut E) -> bool,
    ) {
        let mut left = budget;
        while left > 0 && !at.is_done() {
            // Segments are walked in key order, so a split (which keeps each half's
            // keys where they were in that order) never puts unwalked keys behind
            // the walk, and a table growing during the walk cannot outrun it.
            let Some(s) = self.segment_at(at.from) else {
                // Nothing is filed: nothing is left to walk.
                at.done = true;
                break;
            };
            let seg = &mut self.segs[s];
            if at.seg != s || at.moves != self.moves[s] || at.bucket > seg.num_buckets() {
                (at.seg, at.moves, at.bucket) = (s, self.moves[s], 0);
            }
            let end = seg.num_buckets().min(at.bucket.saturating_add(left));
            for i in at.bucket..end {
                // Removing an entry never moves another (hashbrown only marks its
                // bucket), so the buckets after it are still where they were.
                if let Ok(mut entry) = seg.get_bucket_entry(i)
                    && !keep(ctx, entry.get_mut())
                {
                    entry.remove();
                    self.len -= 1;
                }
            }
            left -= end - at.bucket;
            at.bucket = end;
            if end == seg.num_buckets() {
                shrink_if_sparse(seg, &mut self.moves[s], ctx);
                let r = self.reach[s];
                match r.prefix.checked_add(1 << (64 - r.depth)) {
                    Some(next) => (at.from, at.bucket) = (next, 0),
                    None => at.done = true,
                }
            }
        }
        if self.len == 0 {
            // Empty: segments and directory go, as in a new table; use tracking stays.
            *self = BlockTable {
                clock: self.clock.take(),
                split_at: self.split_at,
                ..Self::default()
            };
        }
    }

    /// The entries whose keys are in part `part` of `1 << bits` (the keys whose
    /// spread's top `bits` bits are `part`): an export walks the table part by part
    /// and the executor serves between them. Each key is in one part whatever the
    /// segments do between the steps, so together they pass every entry filed
    /// throughout exactly once. A segment holding keys of several parts (shallower
    /// than `bits`, see [`Self::part_bits`]) is read once per part, its entries'
    /// keys checked.
    pub fn iter_part_in<'a>(
        &'a self,
        part: usize,
        bits: u32,
        ctx: &'a E::Ctx,
    ) -> impl Iterator<Item = &'a E> + 'a {
        self.segs
            .iter()
            .zip(&self.reach)
            .filter(move |(_, r)| overlaps(r, part, bits))
            .flat_map(move |(seg, r)| {
                let straddles = r.depth < bits;
                seg.iter()
                    .filter(move |e| !straddles || top(e.key_in(ctx).spread(), bits) == part as u64)
            })
    }

    /// The most bits [`Self::iter_part`] can split this table by with no segment
    /// holding keys of two parts (its shallowest segment's depth); `None` while
    /// nothing is filed. Grows with the table once its segments split.
    pub fn part_bits(&self) -> Option<u32> {
        self.reach.iter().map(|r| r.depth).min()
    }
}

/// Walks for entries that say their own key.
impl<E: Filed<Ctx = ()> + Copy> BlockTable<E> {
    /// Keep the entries for which `keep` is true.
    pub fn retain(&mut self, keep: impl FnMut(&mut E) -> bool) {
        self.retain_step(&mut Cursor::default(), usize::MAX, keep);
    }

    /// See [`Self::retain_step_in`].
    pub fn retain_step(
        &mut self,
        at: &mut Cursor,
        budget: usize,
        mut keep: impl FnMut(&mut E) -> bool,
    ) {
        self.retain_step_in(at, budget, &mut (), |_, e| keep(e));
    }

    /// See [`Self::iter_part_in`].
    pub fn iter_part(&self, part: usize, bits: u32) -> impl Iterator<Item = &E> {
        self.iter_part_in(part, bits, &())
    }
}

/// The top `bits` bits of `spread` (none: 0).
#[inline]
fn top(spread: u64, bits: u32) -> u64 {
    spread.checked_shr(64 - bits).unwrap_or(0)
}

/// Whether the segment reaching `r` holds keys of part `part` of `1 << bits`.
fn overlaps(r: &Reach, part: usize, bits: u32) -> bool {
    let common = r.depth.min(bits);
    top(r.prefix, common) == (part as u64).checked_shr(bits - common).unwrap_or(0)
}
