//! Packet identifiers for our outgoing SUBSCRIBE, UNSUBSCRIBE and QoS 1 PUBLISH: an id is never
//! handed out again while it is outstanding, and ids cycle through the whole 1..=65535 space so a
//! late acknowledgement of an old id is unlikely to meet a new request with the same id.

/// The set of outstanding identifiers of one connection.
#[derive(Debug)]
pub(crate) struct PacketIds {
    in_use: Vec<u64>,
    outstanding: usize,
    next: u16,
}

impl PacketIds {
    pub(crate) fn new() -> Self {
        PacketIds {
            in_use: vec![0; 1024],
            outstanding: 0,
            next: 1,
        }
    }

    /// The next free identifier, or `None` when all 65535 are outstanding.
    pub(crate) fn allocate(&mut self) -> Option<u16> {
        if self.outstanding == usize::from(u16::MAX) {
            return None;
        }
        loop {
            let id = self.next;
            self.next = if id == u16::MAX { 1 } else { id + 1 };
            if !self.contains(id) {
                self.set(id, true);
                self.outstanding += 1;
                return Some(id);
            }
        }
    }

    /// Frees an identifier; false if it was not outstanding.
    pub(crate) fn release(&mut self, id: u16) -> bool {
        if id == 0 || !self.contains(id) {
            return false;
        }
        self.set(id, false);
        self.outstanding -= 1;
        true
    }

    pub(crate) fn contains(&self, id: u16) -> bool {
        let (word, bit) = slot(id);
        self.in_use[word] & (1 << bit) != 0
    }

    #[cfg(test)]
    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding
    }

    fn set(&mut self, id: u16, used: bool) {
        let (word, bit) = slot(id);
        if used {
            self.in_use[word] |= 1 << bit;
        } else {
            self.in_use[word] &= !(1 << bit);
        }
    }
}

fn slot(id: u16) -> (usize, u32) {
    (usize::from(id / 64), u32::from(id % 64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn never_zero_and_wraps_past_the_top() {
        let mut ids = PacketIds::new();
        ids.next = u16::MAX;
        assert_eq!(ids.allocate(), Some(u16::MAX));
        assert_eq!(ids.allocate(), Some(1));
        assert!(!ids.release(0));
    }

    #[test]
    fn skips_an_outstanding_id_when_it_comes_round_again() {
        let mut ids = PacketIds::new();
        let held = ids.allocate().unwrap();
        for _ in 0..u16::MAX - 1 {
            let id = ids.allocate().unwrap();
            assert_ne!(id, held);
            assert!(ids.release(id));
        }
        let id = ids.allocate().unwrap();
        assert_ne!(id, held, "the held id comes round and must be skipped");
    }

    #[test]
    fn exhausts_at_65535() {
        let mut ids = PacketIds::new();
        for _ in 0..u16::MAX {
            assert!(ids.allocate().is_some());
        }
        assert_eq!(ids.allocate(), None);
        assert!(ids.release(7));
        assert_eq!(ids.allocate(), Some(7));
    }

    proptest! {
        #[test]
        fn an_outstanding_id_is_never_handed_out(ops in proptest::collection::vec(any::<(bool, u16)>(), 1..400)) {
            let mut ids = PacketIds::new();
            let mut model = BTreeSet::new();
            for (alloc, pick) in ops {
                if alloc || model.is_empty() {
                    let id = ids.allocate().unwrap();
                    prop_assert!(id != 0);
                    prop_assert!(model.insert(id), "id {} handed out twice", id);
                } else {
                    let id = *model.iter().nth(usize::from(pick) % model.len()).unwrap();
                    model.remove(&id);
                    prop_assert!(ids.release(id));
                    prop_assert!(!ids.release(id));
                }
                prop_assert_eq!(ids.outstanding(), model.len());
            }
        }
    }
}
