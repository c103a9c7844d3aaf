//! [`Merge`]: entries of several sorted sources, newest first, as one
//! sorted stream in which the newest source wins each key: what a fold (a
//! memtable and the run files it goes over) and a merge of run files write
//! through a [`RunFileWriter`](super::RunFileWriter).
//!
//! Tombstones are kept unless the merge writes the oldest data there is
//! (`drop_tombstones`): then nothing older can be hidden and a tombstone is
//! only a cost. Memory: one pending entry per source; the sources stream
//! (a [`RunFileRange`](super::RunFileRange) reads ahead a bounded window).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{RunFileError, Slot};

/// One entry of a source: a key and its value or tombstone.
pub type Entry = (u128, Slot);

/// A sorted source: keys strictly increasing; an error ends the merge.
pub type Source<'a> = Box<dyn Iterator<Item = Result<Entry, RunFileError>> + 'a>;

/// See the module doc.
pub struct Merge<'a> {
    /// Newest first.
    sources: Vec<Source<'a>>,
    /// Each source's next entry, by (key, source index): the smallest key
    /// first, and among equal keys the newest source.
    heads: BinaryHeap<Reverse<(u128, usize)>>,
    /// The slot of each source's head entry.
    slots: Vec<Option<Slot>>,
    drop_tombstones: bool,
    failed: bool,
}

impl<'a> Merge<'a> {
    /// `sources` newest first. `drop_tombstones`: leave deletes out (only
    /// when the merge covers the oldest run, so nothing older survives).
    pub fn new(sources: Vec<Source<'a>>, drop_tombstones: bool) -> Result<Merge<'a>, RunFileError> {
        let mut merge = Merge {
            slots: (0..sources.len()).map(|_| None).collect(),
            sources,
            heads: BinaryHeap::new(),
            drop_tombstones,
            failed: false,
        };
        for i in 0..merge.sources.len() {
            merge.advance(i)?;
        }
        Ok(merge)
    }

    /// Pulls source `i`'s next entry into the heap.
    fn advance(&mut self, i: usize) -> Result<(), RunFileError> {
        if let Some(next) = self.sources[i].next() {
            let (key, slot) = next?;
            self.heads.push(Reverse((key, i)));
            self.slots[i] = Some(slot);
        }
        Ok(())
    }

    /// The next surviving entry, or an error (after which the merge ends).
    fn step(&mut self) -> Result<Option<Entry>, RunFileError> {
        while let Some(Reverse((key, newest))) = self.heads.pop() {
            let slot = self.slots[newest].take().flatten();
            self.advance(newest)?;
            // Older sources' entries for the same key are hidden.
            while let Some(&Reverse((k, older))) = self.heads.peek() {
                if k != key {
                    break;
                }
                self.heads.pop();
                self.slots[older] = None;
                self.advance(older)?;
            }
            // A source out of order would make the merge write keys out of
            // order: a wrong file. (Run files and the delta are sorted.)
            if let Some(&Reverse((k, _))) = self.heads.peek() {
                assert!(k > key, "a merge source yielded keys out of order");
            }
            if slot.is_none() && self.drop_tombstones {
                continue;
            }
            return Ok(Some((key, slot)));
        }
        Ok(None)
    }
}

impl Iterator for Merge<'_> {
    type Item = Result<Entry, RunFileError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(entry) => entry.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Writes every entry of `entries` (a [`Merge`], say) and finishes the
/// file. An error from a source or the writer leaves only the writer's
/// `.tmp` file.
pub fn write_all(
    mut writer: super::RunFileWriter<'_>,
    entries: impl Iterator<Item = Result<Entry, RunFileError>>,
) -> Result<super::RunSummary, RunFileError> {
    for entry in entries {
        let (key, slot) = entry?;
        writer.push(key, slot.as_deref())?;
    }
    writer.finish()
}
