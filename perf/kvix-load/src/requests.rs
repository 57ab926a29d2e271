//! The requests a run replays: held in memory (a trace's), or generated again for
//! every pass over them (the shared-prefix workload's, a pure function of the seed).
//!
//! Owns how the simulator and the query phase read requests. A generated workload
//! never holds its requests at once, so an index of tens of millions of blocks is
//! built from a client that holds only the frames it will publish.

use crate::shared_prefix::{Generator, Shape};
use crate::trace::Request;

pub enum Requests {
    Held(Vec<Request>),
    Generated {
        shape: Shape,
        count: usize,
        block_size: usize,
        seed: u64,
    },
}

impl Requests {
    pub fn len(&self) -> usize {
        match self {
            Requests::Held(v) => v.len(),
            Requests::Generated { count, .. } => *count,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One pass over every request, in order, with its index.
    pub fn for_each(&self, mut f: impl FnMut(usize, &Request)) {
        match self {
            Requests::Held(v) => v.iter().enumerate().for_each(|(i, r)| f(i, r)),
            Requests::Generated {
                shape,
                count,
                block_size,
                seed,
            } => Generator::new(shape, *block_size, *seed)
                .take(*count)
                .enumerate()
                .for_each(|(i, r)| f(i, &r)),
        }
    }

    /// `f` applied to the requests at `indices` (ascending), in that order.
    pub fn map_at<T>(&self, indices: &[usize], mut f: impl FnMut(usize, &Request) -> T) -> Vec<T> {
        debug_assert!(indices.is_sorted());
        match self {
            Requests::Held(v) => indices.iter().map(|&i| f(i, &v[i])).collect(),
            Requests::Generated { .. } => {
                let mut out = Vec::with_capacity(indices.len());
                let mut want = indices.iter().peekable();
                self.for_each(|i, r| {
                    while want.next_if_eq(&&i).is_some() {
                        out.push(f(i, r));
                    }
                });
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_prefix::generate;

    fn generated(count: usize) -> Requests {
        Requests::Generated {
            shape: Shape::default(),
            count,
            block_size: 16,
            seed: 7,
        }
    }

    /// A generated pass and a picked request are the requests a held list of the
    /// same workload has, index for index.
    #[test]
    fn generated_requests_are_the_held_ones() {
        let held = Requests::Held(generate(&Shape::default(), 300, 16, 7));
        let gen_ = generated(300);
        let seqs = |r: &Requests| {
            let mut all = Vec::new();
            r.for_each(|i, q| all.push((i, q.seqs.clone(), q.tokens.len())));
            all
        };
        assert_eq!(seqs(&held), seqs(&gen_));
        assert_eq!(seqs(&gen_).len(), 300);
        let at = [0, 5, 5, 299];
        let pick = |r: &Requests| r.map_at(&at, |i, q| (i, q.seqs.clone()));
        assert_eq!(pick(&held), pick(&gen_));
        assert_eq!(pick(&gen_).iter().map(|p| p.0).collect::<Vec<_>>(), at);
    }
}
