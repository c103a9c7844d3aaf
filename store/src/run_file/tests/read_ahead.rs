//! [`RunFileReader::will_read`]: one hint per stretch of contiguous blocks
//! the cache lacks, blocks looked at from the first until the budget is
//! spent (at least one), and nothing read.

use super::*;
use crate::run_file::recording_source::{RecordingSource, SourceCall, take_calls};

/// The hints `will_read` should make over `blocks`: each maximal stretch
/// of them the cache lacks.
fn expected_hints(
    reader: &RunFileReader,
    cache: &BlockCache,
    blocks: std::ops::Range<usize>,
) -> Vec<SourceCall> {
    let index = reader.index();
    let mut hints: Vec<SourceCall> = Vec::new();
    let mut open = false;
    for i in blocks {
        let (offset, len) = (index.offsets[i], u64::from(index.lens[i]));
        if cache.contains(reader.cache_id(), offset) {
            open = false;
            continue;
        }
        match hints.last_mut() {
            Some(SourceCall::Hint {
                offset: at,
                len: so_far,
            }) if open => {
                *so_far = offset + len - *at;
            }
            _ => hints.push(SourceCall::Hint { offset, len }),
        }
        open = true;
    }
    hints
}

#[test]
fn will_read_hints_each_uncached_stretch_once_within_its_budget() {
    let tmp = tempfile::tempdir().unwrap();
    for seed in 1..=8u64 {
        let mut rng = Rng(seed * 104_729);
        let model = random_model(&mut rng, 300 + 40 * seed as usize);
        let path = tmp.path().join(format!("ahead-{seed}"));
        write(&RealDisk, &path, &model, Mode::Plain, 128);
        let (source, calls) = RecordingSource::new(std::fs::read(&path).unwrap());
        let cache = Arc::new(BlockCache::new(1 << 20));
        let reader = RunFileReader::open_source(
            Box::new(source),
            &path,
            &read_protection(Mode::Plain),
            Arc::clone(&cache),
        )
        .unwrap();
        // Some blocks cached, in scattered places.
        let keys: Vec<u128> = model.keys().copied().collect();
        for _ in 0..keys.len() / 8 {
            reader
                .get(keys[rng.below(keys.len() as u64) as usize])
                .unwrap();
        }
        let blocks = reader.block_count();
        let lens = &reader.index().lens;
        for _ in 0..20 {
            take_calls(&calls);
            let from = rng.below(blocks as u64) as usize;
            let to = from + rng.below((blocks - from) as u64 + 1) as usize;
            let budget = rng.below(6000);
            let (looked_bytes, end) = reader.will_read(from..to, budget);
            let looked: u64 = lens[from..end].iter().map(|&l| u64::from(l)).sum();
            assert_eq!(looked_bytes, looked, "seed {seed}: bytes looked at");
            assert!(end <= to && (end > from || from == to), "seed {seed}");
            if end < to {
                // Stopped only once the budget was spent, and no later.
                assert!(looked >= budget, "seed {seed}: stopped early");
                let before_last = looked - u64::from(lens[end - 1]);
                assert!(
                    before_last < budget || end == from + 1,
                    "seed {seed}: looked past the budget"
                );
            }
            let hints = take_calls(&calls);
            assert_eq!(
                hints,
                expected_hints(&reader, &cache, from..end),
                "seed {seed}: blocks {from}..{to}, budget {budget}"
            );
        }
    }
}
