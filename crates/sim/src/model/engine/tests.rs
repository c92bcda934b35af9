use super::*;

#[test]
fn chained_hashes_match_the_core_definition() {
    let tokens: Vec<u32> = (0..100).map(|i| i * 7 + 3).collect();
    assert_eq!(
        chained_hashes(&tokens, 16),
        kvgate_core::index::blocks::block_hashes(&tokens, 16, ENGINE_HASH_SEED)
    );
}
