//! The object itself: every map found by the name `ratelimit-common` gives
//! it (the verifier's figures are in `budget.rs`).

use ratelimit_tests::privileged;

#[test]
fn every_map_is_found_by_its_shared_name() {
    privileged!("every_map_is_found_by_its_shared_name");
    let ebpf = aya::EbpfLoader::new()
        .map_max_entries(ratelimit_common::MAP_TABLE, 1024)
        .map_max_entries(ratelimit_common::MAP_BORN, 1024)
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
