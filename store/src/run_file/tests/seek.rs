//! A range sought forward ([`RunFileRange::seek_forward`]) across many
//! ranges in key order answers each exactly as a fresh range does: ranges
//! inside one block, across blocks, in gaps, past the end, through a cache
//! of a few blocks.

use super::*;

/// Increasing, disjoint ranges over the model's keys: adjacent keys (one
/// block), short and long spans, gaps between, some empty.
fn increasing_ranges(rng: &mut Rng, model: &Model) -> Vec<(u128, u128)> {
    let keys: Vec<u128> = model.keys().copied().collect();
    let mut cuts: Vec<u128> = (0..120)
        .map(|_| match rng.below(3) {
            0 => rng.key(),
            _ => keys[rng.below(keys.len() as u64) as usize],
        })
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut ranges = Vec::new();
    for pair in cuts.chunks(2) {
        let lo = pair[0];
        let hi = match pair {
            [_, hi] => *hi - u128::from(rng.below(2) == 0 && *hi > lo),
            _ => u128::MAX,
        };
        ranges.push((lo, hi));
    }
    ranges
}

#[test]
fn a_range_sought_forward_answers_as_a_fresh_range() {
    let tmp = tempfile::tempdir().unwrap();
    for seed in 1..=10u64 {
        let mut rng = Rng(seed * 7919);
        let model = random_model(&mut rng, 300 + 50 * seed as usize);
        let path = tmp.path().join(format!("seek-{seed}"));
        write(&RealDisk, &path, &model, Mode::Plain, 128);
        let reader = RunFileReader::open(
            &path,
            &read_protection(Mode::Plain),
            Arc::new(BlockCache::new(3 * 700)),
        )
        .unwrap();
        let ranges = increasing_ranges(&mut rng, &model);
        let mut sought: Option<RunFileRange<'_>> = None;
        for &(lo, hi) in &ranges {
            let range = match &mut sought {
                Some(range) => {
                    range.seek_forward(lo, hi);
                    range
                }
                None => sought.insert(reader.range(lo, hi)),
            };
            let mut got: Entries = Vec::new();
            range
                .visit(|k, v| {
                    got.push((k, v.map(<[u8]>::to_vec)));
                    true
                })
                .unwrap();
            assert_eq!(
                got,
                model_range(&model, lo, hi),
                "seed {seed}: range {lo:#x}..={hi:#x}"
            );
        }
    }
}
