//! A set of `u64` kept as disjoint, non-adjacent half-open ranges: the done offsets above a
//! subscription's cursor, stored compactly however many records are acked out of order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSet {
    /// start -> end (exclusive). Ranges never overlap or touch.
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub fn contains(&self, x: u64) -> bool {
        self.ranges
            .range(..=x)
            .next_back()
            .is_some_and(|(_, &end)| x < end)
    }

    /// Adds one value, merging with neighbours.
    pub fn insert(&mut self, x: u64) {
        if self.contains(x) {
            return;
        }
        let mut start = x;
        let mut end = x + 1;
        if let Some((&s, &e)) = self.ranges.range(..x).next_back() {
            if e == x {
                start = s;
                self.ranges.remove(&s);
            }
        }
        if let Some(&e) = self.ranges.get(&end) {
            self.ranges.remove(&end);
            end = e;
        }
        self.ranges.insert(start, end);
    }

    /// Removes and returns the end of the range that starts exactly at `x`, if any.
    pub fn take_run_at(&mut self, x: u64) -> Option<u64> {
        self.ranges.remove(&x)
    }

    /// Forgets every value below `x`.
    pub fn remove_below(&mut self, x: u64) {
        let mut keep = self.ranges.split_off(&x);
        if let Some((_, &end)) = self.ranges.iter().next_back() {
            if end > x {
                keep.insert(x, end);
            }
        }
        self.ranges = keep;
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// How many values the set holds.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// How many values below `x` the set holds.
    pub fn count_below(&self, x: u64) -> u64 {
        self.ranges.range(..x).map(|(&s, &e)| e.min(x) - s).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of stored ranges (the memory it takes).
    pub fn runs(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec((0u8..3, 0u64..64), 0..200)) {
            let mut r = RangeSet::default();
            let mut model = BTreeSet::new();
            for (op, x) in ops {
                match op {
                    0 | 1 => { r.insert(x); model.insert(x); }
                    _ => { r.remove_below(x); model = model.split_off(&x); }
                }
                prop_assert_eq!(r.len(), model.len() as u64);
                for v in 0..66 {
                    prop_assert_eq!(r.contains(v), model.contains(&v), "value {}", v);
                }
                // Compact: no two ranges touch.
                let v: Vec<_> = r.ranges.iter().map(|(s, e)| (*s, *e)).collect();
                for w in v.windows(2) {
                    prop_assert!(w[0].1 < w[1].0);
                }
            }
        }
    }

    #[test]
    fn take_run() {
        let mut r = RangeSet::default();
        for x in [3, 4, 5, 7] {
            r.insert(x);
        }
        assert_eq!(r.take_run_at(4), None);
        assert_eq!(r.take_run_at(3), Some(6));
        assert_eq!(r.len(), 1);
        assert_eq!(r.runs(), 1);
    }
}
