//! `top`'s counts per source: drops sampled at random, one in 16, so each
//! source's count stays within its stated bound whatever the order its
//! frames arrive in.

use ratelimit_common::{DROP_SAMPLE, map_v4};
use ratelimit_tests::{
    privileged,
    testrun::{Loaded, XDP_DROP, pin_to_cpu, unpin},
};

use super::{limit, rules, v4};

/// Four sources over their limit whose drops arrive in turn (A B C D A B …):
/// with a fixed stride of 16 per CPU they were counted 0, 384, 0 and 7 488
/// for 1 970 drops each. Each count must be within five standard
/// deviations (5·√(15·n), ±860) of the drops: the seed is drawn at each
/// load, and five keeps a false failure below one run in a million while
/// the stride's 0 and 7 880 stay far outside.
#[test]
fn top_counts_each_source_within_its_bound_whatever_the_order() {
    privileged!("top_counts_each_source_within_its_bound_whatever_the_order");
    const DROPS: u64 = 1970;
    let l = Loaded::new(&rules(limit("1/hour", 1)));
    let sources: Vec<[u8; 4]> = (1..=4).map(|i| [198, 18, 42, i]).collect();
    let frames: Vec<Vec<u8>> = sources
        .iter()
        .map(|s| v4(&format!("{}.{}.{}.{}", s[0], s[1], s[2], s[3])).build())
        .collect();
    // One CPU: its count of drops is what picks them.
    pin_to_cpu(0);
    // Each source's first frames: its burst, then its drops begin.
    for f in &frames {
        while l.verdict(f) != XDP_DROP {}
    }
    for _ in 1..DROPS {
        for f in &frames {
            assert_eq!(l.verdict(f), XDP_DROP);
        }
    }
    unpin();
    let counted = l.maps.drops();
    let bound = 5 * (15 * DROPS).isqrt();
    for s in &sources {
        let got = counted
            .iter()
            .filter(|(k, _)| k.addr == map_v4(*s) && k.level == 1)
            .map(|(_, n)| *n)
            .sum::<u64>();
        assert!(
            got % DROP_SAMPLE == 0 && got.abs_diff(DROPS) <= bound,
            "source {s:?}: {got} counted for {DROPS} drops (bound ±{bound}); all: {counted:?}"
        );
    }
}
