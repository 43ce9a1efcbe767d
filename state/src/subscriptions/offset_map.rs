//! [`OffsetMap`]: a subscription's leases or pending redeliveries by offset, remembering which
//! offsets changed since the store last took them, so that the store writes what an apply
//! changed instead of every lease the subscription holds.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;

use serde::{Deserialize, Serialize};

/// A map from offset to `V` that records every offset it inserts or removes. Reads go through
/// `Deref` to the map; every change goes through [`insert`](Self::insert),
/// [`remove`](Self::remove) or [`remove_below`](Self::remove_below), so none escapes the
/// record. Encoded, compared and hashed as the map alone: the record of changes is bookkeeping
/// between apply and the store, not state (two replicas with the same map are equal whatever
/// each has or has not written yet).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OffsetMap<V> {
    map: BTreeMap<u64, V>,
    #[serde(skip)]
    changed: BTreeSet<u64>,
}

impl<V> Default for OffsetMap<V> {
    fn default() -> Self {
        OffsetMap {
            map: BTreeMap::new(),
            changed: BTreeSet::new(),
        }
    }
}

impl<V: PartialEq> PartialEq for OffsetMap<V> {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl<V: Eq> Eq for OffsetMap<V> {}

impl<V> Deref for OffsetMap<V> {
    type Target = BTreeMap<u64, V>;

    fn deref(&self) -> &BTreeMap<u64, V> {
        &self.map
    }
}

impl<'a, V> IntoIterator for &'a OffsetMap<V> {
    type Item = (&'a u64, &'a V);
    type IntoIter = std::collections::btree_map::Iter<'a, u64, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

impl<V> FromIterator<(u64, V)> for OffsetMap<V> {
    /// A map read back from storage: nothing in it has changed since.
    fn from_iter<I: IntoIterator<Item = (u64, V)>>(iter: I) -> Self {
        OffsetMap {
            map: iter.into_iter().collect(),
            changed: BTreeSet::new(),
        }
    }
}

impl<V> OffsetMap<V> {
    pub fn insert(&mut self, offset: u64, value: V) -> Option<V> {
        self.changed.insert(offset);
        self.map.insert(offset, value)
    }

    pub fn remove(&mut self, offset: &u64) -> Option<V> {
        let removed = self.map.remove(offset);
        if removed.is_some() {
            self.changed.insert(*offset);
        }
        removed
    }

    /// Removes and returns every entry below `bound` (every entry when `None`).
    pub fn remove_below(&mut self, bound: Option<u64>) -> BTreeMap<u64, V> {
        let kept = bound.map_or_else(BTreeMap::new, |b| self.map.split_off(&b));
        let removed = std::mem::replace(&mut self.map, kept);
        self.changed.extend(removed.keys().copied());
        removed
    }

    /// Offsets inserted or removed since the last [`take_changed`](Self::take_changed).
    pub fn changed(&self) -> &BTreeSet<u64> {
        &self.changed
    }

    /// Hands over the changed offsets and forgets them: the store calls it once it has the
    /// map's current entry (or absence) for each in the batch it writes.
    pub fn take_changed(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_is_recorded_and_taken_once() {
        let mut m: OffsetMap<u32> = [(1, 10), (5, 50), (9, 90)].into_iter().collect();
        assert!(
            m.changed().is_empty(),
            "read back from storage: nothing changed"
        );
        m.insert(7, 70);
        assert_eq!(m.remove(&5), Some(50));
        assert_eq!(m.remove(&6), None, "absent");
        let below = m.remove_below(Some(7));
        assert_eq!(below.into_iter().collect::<Vec<_>>(), vec![(1, 10)]);
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), vec![7, 9]);
        assert_eq!(
            m.take_changed().into_iter().collect::<Vec<_>>(),
            vec![1, 5, 7]
        );
        assert!(m.changed().is_empty());
        m.remove_below(None);
        assert!(m.is_empty());
        assert_eq!(m.take_changed().into_iter().collect::<Vec<_>>(), vec![7, 9]);
    }

    /// Encoded as the plain map it replaced, so stored subscriptions read the same.
    #[test]
    fn it_encodes_as_the_map_alone_and_compares_by_it() {
        let plain: BTreeMap<u64, u32> = [(3, 30), (4, 40)].into_iter().collect();
        let mut tracked: OffsetMap<u32> = OffsetMap::default();
        tracked.insert(4, 40);
        tracked.insert(3, 30);
        let untouched: OffsetMap<u32> = plain.clone().into_iter().collect();
        assert_eq!(tracked, untouched, "changes are not state");
        let a = bincode::serialize(&plain).expect("encode");
        assert_eq!(bincode::serialize(&tracked).expect("encode"), a);
        let back: OffsetMap<u32> = bincode::deserialize(&a).expect("decode");
        assert_eq!(*back, plain);
        assert!(back.changed().is_empty());
    }
}
