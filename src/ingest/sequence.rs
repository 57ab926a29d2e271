//! One engine stream's sequence cursor: what a batch's sequence number means given
//! the last one the stream received.
//!
//! Registered listeners and bound pods both keep one [`Cursor`] per stream and act on
//! its [`Step`]; the rule lives here once. Every `u64` is a valid sequence number:
//! nothing here overflows, wraps or panics.
//!
//! The rule:
//! - nothing heard yet: [`Step::First`] (a first number above 0 means the engine
//!   published batches before kvix listened: a cold start, replayed from 0 where the
//!   engine has a replay endpoint);
//! - `last + 1`: [`Step::Next`];
//! - above `last + 1`: [`Step::Gap`], the batches between are missing;
//! - `last` or below: [`Step::Restart`]: the engine's counter started again (vLLM
//!   numbers from 0 at every start). The engine's blocks are kept, the cursor starts
//!   over at this frame, and the frame is applied.

/// Last sequence number a stream received, if any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    last: Option<u64>,
}

/// What a frame's sequence number means for its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The stream's first frame since kvix started listening.
    First,
    /// The frame after the last one.
    Next,
    /// `missing` batches (`after + 1 ..= after + missing`) never arrived.
    Gap { after: u64, missing: u64 },
    /// The number is not above the last one (`last`): the engine restarted.
    Restart { last: u64 },
}

impl Cursor {
    pub fn new(last: Option<u64>) -> Cursor {
        Cursor { last }
    }

    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// What `seq` means after this cursor's last frame; the cursor does not move.
    pub fn step(&self, seq: u64) -> Step {
        let Some(last) = self.last else {
            return Step::First;
        };
        if seq <= last {
            return Step::Restart { last };
        }
        // seq > last, so the difference is at least 1 and cannot underflow.
        match seq - last - 1 {
            0 => Step::Next,
            missing => Step::Gap {
                after: last,
                missing,
            },
        }
    }

    /// The stream received the frame numbered `seq`.
    pub fn advance(&mut self, seq: u64) {
        self.last = Some(seq);
    }

    /// Forget the last frame: the next one is a stream's first.
    pub fn reset(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_rule_at_the_edges() {
        let mut c = Cursor::default();
        assert_eq!(c.step(u64::MAX), Step::First);
        c.advance(u64::MAX);
        assert_eq!(c.step(u64::MAX), Step::Restart { last: u64::MAX });
        assert_eq!(c.step(0), Step::Restart { last: u64::MAX });
        c.advance(0);
        assert_eq!(c.step(1), Step::Next);
        assert_eq!(
            c.step(u64::MAX),
            Step::Gap {
                after: 0,
                missing: u64::MAX - 1
            }
        );
        c.advance(u64::MAX - 1);
        assert_eq!(c.step(u64::MAX), Step::Next);
        c.reset();
        assert_eq!(c.step(7), Step::First);
    }

    /// Sequence numbers a stream may send: mostly consecutive, with repeats, small
    /// and huge jumps both ways, and the ends of the range.
    fn stream() -> impl Strategy<Value = Vec<u64>> {
        let one = prop_oneof![
            4 => Just(None),
            1 => (0u64..4).prop_map(Some),
            1 => Just(Some(u64::MAX)),
            1 => Just(Some(u64::MAX - 1)),
            1 => any::<u64>().prop_map(Some),
        ];
        prop::collection::vec(one, 1..64).prop_map(|picks| {
            let mut prev: u64 = 0;
            picks
                .into_iter()
                .map(|p| {
                    prev = p.unwrap_or_else(|| prev.saturating_add(1));
                    prev
                })
                .collect()
        })
    }

    proptest! {
        /// The cursor against the rule written as wide arithmetic: no overflow is
        /// possible in `i128`, so any wrap in the cursor would show as a difference.
        #[test]
        fn agrees_with_the_rule_in_wide_arithmetic(seqs in stream()) {
            let mut c = Cursor::default();
            let mut model: Option<i128> = None;
            let (mut missing_total, mut restarts) = (0i128, 0u32);
            for &s in &seqs {
                let wide = s as i128;
                let want = match model {
                    None => Step::First,
                    Some(l) if wide <= l => Step::Restart { last: l as u64 },
                    Some(l) if wide == l + 1 => Step::Next,
                    Some(l) => Step::Gap { after: l as u64, missing: (wide - l - 1) as u64 },
                };
                let got = c.step(s);
                prop_assert_eq!(got, want);
                match got {
                    Step::Gap { missing, .. } => missing_total += missing as i128,
                    Step::Restart { .. } => restarts += 1,
                    _ => {}
                }
                c.advance(s);
                model = Some(wide);
                prop_assert_eq!(c.last(), Some(s));
            }
            // Between restarts the gaps add up to the span the stream skipped.
            if restarts == 0 {
                let span = *seqs.last().unwrap() as i128 - seqs[0] as i128;
                prop_assert_eq!(missing_total, span - (seqs.len() as i128 - 1));
            }
        }
    }
}
