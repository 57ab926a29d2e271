//! What a lookup takes and what it answers: the prompt's blocks ([`Prompt`]), and
//! per block `[n, holder..]`, or [`SAME_HOLDERS`] for a block held exactly as the
//! block before it ([`HolderLists`] reads such a list; [`union_holders`] merges the
//! shards' lists into one). The encoding alone: no shard state, nothing allocated
//! but the output.

use crate::types::{BlockHash, SeqHash};

/// In a lookup's output, a block held exactly as the block before it; never a
/// holder count, since a block has fewer holders than there are worker slots.
pub const SAME_HOLDERS: u32 = u32::MAX;

/// A lookup's output read block by block: each block's holders (a
/// [`SAME_HOLDERS`] block's are the block before's) and whether they repeat the
/// block before's. Ends with the output (a lookup's ends at its first empty block).
pub struct HolderLists<'a> {
    list: &'a [u32],
    at: usize,
    last: std::ops::Range<usize>,
}

impl<'a> HolderLists<'a> {
    pub fn new(list: &'a [u32]) -> Self {
        HolderLists {
            list,
            at: 0,
            last: 0..0,
        }
    }
}

impl<'a> Iterator for HolderLists<'a> {
    type Item = (&'a [u32], bool);

    fn next(&mut self) -> Option<Self::Item> {
        let n = *self.list.get(self.at)?;
        if n == SAME_HOLDERS {
            self.at += 1;
            return Some((self.list.get(self.last.clone())?, true));
        }
        let r = self.at + 1..self.at + 1 + n as usize;
        let hs = self.list.get(r.clone())?;
        self.at = r.end;
        self.last = r;
        Some((hs, false))
    }
}

/// A query's blocks as a lookup takes them: local hashes (a prompt's tokens, or
/// Dynamo's `/query_by_hash`), or sequence hashes (Mooncake's rolling hashes).
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    Locals(&'a [BlockHash]),
    Seqs(&'a [SeqHash]),
}

impl Prompt<'_> {
    pub fn len(&self) -> usize {
        match self {
            Prompt::Locals(l) => l.len(),
            Prompt::Seqs(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Merges lists of `[n, holder..]` per block (each ending at its first block
/// nobody holds, or with the prompt; [`SAME_HOLDERS`] for a repeated list) into
/// one, keeping what `keep` returns for each holder: a block's holders are the
/// union of its lists'. Ends, as every list does, at the first block left with no
/// holder: no worker's prefix reaches past it. A block every list repeats is
/// written as [`SAME_HOLDERS`].
pub fn union_holders(
    parts: &[&[u32]],
    mut keep: impl FnMut(u32) -> Option<u32>,
    out: &mut Vec<u32>,
) {
    let mut lists: Vec<HolderLists> = parts.iter().map(|p| HolderLists::new(p)).collect();
    loop {
        let head = out.len();
        out.push(0);
        let (mut listed, mut all_same) = (false, true);
        for (hs, same) in lists.iter_mut().filter_map(Iterator::next) {
            listed = true;
            all_same &= same;
            out.extend(hs.iter().filter_map(|&h| keep(h)));
        }
        if !listed {
            out.pop();
            return;
        }
        let n = out.len() - head - 1;
        if all_same && n > 0 {
            out.truncate(head);
            out.push(SAME_HOLDERS);
            continue;
        }
        out[head] = n as u32;
        if n == 0 {
            return;
        }
    }
}
