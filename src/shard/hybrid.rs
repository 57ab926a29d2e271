//! vLLM's prefix-hit rules for a hybrid model's KV-cache groups, and the hit they
//! come to together: how many blocks of a prompt a worker would reuse when its
//! full-attention blocks are not the only state a hit needs.
//!
//! Owns the rules only (pure computation over which blocks each group holds);
//! what a worker holds, per group, is the tree's ([`super::tree::Tree`]). Never
//! allocates per block: a group's blocks are read through a closure.
//!
//! The rules, as `vllm/v1/core/single_type_kv_cache_manager.py` states them,
//! for a prefix of at most `max` tokens:
//! - full attention: the longest run of present blocks from block 0;
//! - sliding window of `W` tokens: scanning from the right, the first run of
//!   `ceil((W - 1) / block_size)` present blocks ends the hit; without one, the
//!   run of present blocks from block 0 (shorter than that) is the hit;
//! - chunked local attention of chunk `C`: every block before the chunk that
//!   holds token `max` counts as hit; from there, a run of present blocks;
//! - Mamba: the last present state block (its state stands for the prefix).
//!
//! `kv_cache_coordinator.py` combines them: starting from the full-attention
//! hit, each group caps the hit the others allow, until no group lowers it; a
//! hit ends on a multiple of the alignment (the least common multiple of the
//! groups' block sizes).

/// What one KV-cache group's hit rule needs, besides which blocks it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupRule {
    /// Sliding window of this many tokens.
    SlidingWindow(u32),
    /// Chunked local attention with chunks of this many tokens (0: not known,
    /// taken as one chunk spanning the prompt).
    ChunkedLocal(u32),
    /// Mamba (or other linear-attention) state.
    Mamba,
}

/// One KV-cache group of a worker: its rule and its own block size (a multiple
/// of the index's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupSpec {
    pub rule: GroupRule,
    pub block_size: u32,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The alignment of a hit in tokens: `align` when set, else the least common
/// multiple of the block sizes.
pub fn alignment(index_block_size: u32, groups: &[GroupSpec], align: Option<u32>) -> u64 {
    if let Some(a) = align.filter(|&a| a > 0) {
        return a as u64;
    }
    groups.iter().fold(index_block_size as u64, |l, g| {
        let b = g.block_size as u64;
        l / gcd(l, b) * b
    })
}

/// The hit of one group's rule in tokens, for a prefix of at most `max` tokens,
/// `present(b)` saying whether the group holds its block `b` (in its own block
/// size), aligned to `align` tokens as vLLM aligns it.
pub fn group_hit(spec: GroupSpec, max: u64, align: u64, present: impl Fn(u64) -> bool) -> u64 {
    let bs = spec.block_size as u64;
    let blocks = max / bs;
    let aligned = |b: u64| bs == align || (b * bs).is_multiple_of(align);
    let down = |mut b: u64| {
        while !aligned(b) {
            b -= 1;
        }
        b
    };
    match spec.rule {
        GroupRule::SlidingWindow(window) => {
            let need = (window as u64).saturating_sub(1).div_ceil(bs);
            let mut run = 0;
            for i in (0..blocks).rev() {
                if !present(i) {
                    run = 0;
                    continue;
                }
                // A run must end on an aligned boundary to count.
                if run == 0 && !aligned(i + 1) {
                    continue;
                }
                run += 1;
                if run >= need {
                    return (i + run) * bs;
                }
            }
            down(run) * bs
        }
        GroupRule::ChunkedLocal(chunk) => {
            // An unknown chunk (0) is taken as one spanning the prompt.
            let chunk = chunk as u64;
            let start = max.checked_div(chunk).map_or(0, |n| n * chunk / bs);
            let mut hit = start.min(blocks);
            while hit < blocks && present(hit) {
                hit += 1;
            }
            hit * bs
        }
        GroupRule::Mamba => (0..blocks)
            .rev()
            .find(|&i| present(i) && aligned(i + 1))
            .map_or(0, |i| (i + 1) * bs),
    }
}

/// The hybrid hit in tokens: `full` tokens of full-attention prefix, capped by
/// each group in turn until none lowers it. `present(g, b)`: whether group `g`
/// (an index into `groups`) holds its block `b`.
pub fn hybrid_hit(
    full: u64,
    groups: &[GroupSpec],
    align: u64,
    present: impl Fn(usize, u64) -> bool,
) -> u64 {
    let mut hit = full / align * align;
    loop {
        let mut cur = hit;
        for (g, spec) in groups.iter().enumerate() {
            cur = cur.min(group_hit(*spec, cur, align, |b| present(g, b)));
        }
        if cur >= hit {
            return hit;
        }
        hit = cur;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rule: GroupRule) -> GroupSpec {
        GroupSpec {
            rule,
            block_size: 4,
        }
    }

    fn held(bits: &str) -> impl Fn(u64) -> bool + '_ {
        move |b| bits.as_bytes().get(b as usize) == Some(&b'1')
    }

    #[test]
    fn sliding_window_takes_the_rightmost_run_long_enough() {
        // Window 9 tokens, blocks of 4: ceil(8 / 4) = 2 blocks must be present.
        let sw = spec(GroupRule::SlidingWindow(9));
        // Blocks 0..6: present 0,1 then 4,5. Scanning from block 5: 5, 4 make 2.
        assert_eq!(group_hit(sw, 24, 4, held("110011")), 24);
        // Only block 5 of the tail present: 4 missing, so the run resets; 1, 0 make 2.
        assert_eq!(group_hit(sw, 24, 4, held("110001")), 8);
        // The cap trims the trailing blocks: max 16 tokens sees blocks 0..3 only.
        assert_eq!(group_hit(sw, 16, 4, held("110011")), 8);
        // No run of 2 anywhere: the run from block 0 (1 block) is the hit.
        assert_eq!(group_hit(sw, 24, 4, held("101010")), 4);
        assert_eq!(group_hit(sw, 24, 4, held("000000")), 0);
    }

    #[test]
    fn chunked_local_needs_only_the_current_chunk() {
        // Chunks of 8 tokens, blocks of 4; a prefix of 15 tokens has 3 full
        // blocks, and its chunk starts at token 8 (block 2).
        let cl = spec(GroupRule::ChunkedLocal(8));
        assert_eq!(group_hit(cl, 15, 4, held("001")), 12);
        assert_eq!(group_hit(cl, 15, 4, held("110")), 8);
        // At 16 tokens the chunk starts at token 16: nothing needs to be present.
        assert_eq!(group_hit(cl, 16, 4, held("0000")), 16);
        // An unknown chunk spans the prompt: the run from block 0.
        let unknown = spec(GroupRule::ChunkedLocal(0));
        assert_eq!(group_hit(unknown, 16, 4, held("1101")), 8);
    }

    #[test]
    fn mamba_takes_the_last_state_block() {
        let m = spec(GroupRule::Mamba);
        assert_eq!(group_hit(m, 24, 4, held("010100")), 16);
        assert_eq!(group_hit(m, 12, 4, held("010100")), 8);
        assert_eq!(group_hit(m, 24, 4, held("000000")), 0);
        // Aligned to 8 tokens: a state at the end of block 2 (12 tokens) does not count.
        assert_eq!(group_hit(m, 24, 8, held("011000")), 8);
    }

    #[test]
    fn the_groups_cap_each_other_to_a_fixed_point() {
        // Full attention holds 6 blocks; the window group (2 blocks) holds 0,1,3;
        // Mamba holds states at 1 and 4.
        let groups = [spec(GroupRule::SlidingWindow(9)), spec(GroupRule::Mamba)];
        let sw = "110100";
        let mamba = "010010";
        let present = |g: usize, b: u64| held([sw, mamba][g])(b);
        // From 6 blocks the window finds no run of 2 from the right (3 is alone):
        // the run from block 0 (0, 1) makes 8 tokens. Mamba capped at 8 tokens has
        // its state at block 1: 8. The window again at 8: 8. Nothing lowers it.
        assert_eq!(hybrid_hit(24, &groups, 4, present), 8);
        assert_eq!(alignment(4, &groups, None), 4);
        let big = [GroupSpec {
            rule: GroupRule::Mamba,
            block_size: 12,
        }];
        assert_eq!(alignment(8, &big, None), 24);
        assert_eq!(alignment(8, &big, Some(16)), 16);
    }
}
