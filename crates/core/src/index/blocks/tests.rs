use super::*;
use proptest::prelude::*;

fn stored(tokens: &[u32], parent: Option<u64>, ext0: u64, tier: Tier) -> KvEvent {
    KvEvent::BlockStored {
        lora_name: None,
        block_hashes: (0..(tokens.len() / 4) as u64).map(|i| ext0 + i).collect(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: 4,
        tier,
    }
}

#[test]
fn events_and_requests_hash_alike() {
    let mut idx = BlockIndex::new(4, None);
    let prompt: Vec<u32> = (0..14).collect();
    idx.apply(
        EndpointId(1),
        &stored(&prompt[..8], None, 100, Tier::Device),
        Nanos(0),
    );
    idx.apply(
        EndpointId(1),
        &stored(&prompt[8..12], Some(101), 200, Tier::Host),
        Nanos(0),
    );
    idx.apply(
        EndpointId(2),
        &stored(&prompt[..4], None, 900, Tier::Device),
        Nanos(0),
    );
    let hashes = block_hashes(&prompt, 4, ENGINE_SCOPE);
    let o = idx.overlaps_of(&hashes, Nanos(0));
    assert_eq!(o.total, 3);
    assert_eq!(
        o.of(EndpointId(1)),
        Overlap {
            endpoint: EndpointId(1),
            device: 2,
            host: 1,
            disk: 0,
            touched: Nanos(0),
            pending: 0,
        }
    );
    assert_eq!(o.of(EndpointId(2)).device, 1);
    idx.apply(
        EndpointId(1),
        &KvEvent::BlockRemoved {
            block_hashes: vec![101],
            tier: Tier::Device,
        },
        Nanos(1),
    );
    assert_eq!(
        idx.overlaps_of(&hashes, Nanos(1)).of(EndpointId(1)).total(),
        1
    );
    assert!(idx.overlaps_of(&hashes, Nanos(1)).evicted);
    assert_eq!(idx.evicted().collect::<Vec<_>>(), [EndpointId(1)]);
    idx.apply(EndpointId(1), &KvEvent::AllBlocksCleared, Nanos(2));
    assert_eq!(
        idx.overlaps_of(&hashes, Nanos(2)).of(EndpointId(1)).total(),
        0
    );
    // A cleared cache starts empty: nothing in it has been evicted yet.
    assert!(!idx.overlaps_of(&hashes, Nanos(2)).evicted);
    assert_eq!(idx.evicted().count(), 0);
    assert_eq!(
        idx.overlaps_of(&hashes, Nanos(2)).of(EndpointId(2)).total(),
        1
    );
}

#[test]
fn unknown_parent_is_not_placed() {
    let mut idx = BlockIndex::new(4, None);
    idx.apply(
        EndpointId(0),
        &stored(&[1, 2, 3, 4], Some(77), 5, Tier::Device),
        Nanos(0),
    );
    assert!(idx.is_empty());
    assert_eq!(idx.unplaced(), 1);
}

proptest! {
    /// The index agrees with a recount: an endpoint's overlap is the longest run of leading
    /// blocks of the query that it was sent, per router-side insert.
    #[test]
    fn overlap_matches_a_recount(sent in prop::collection::vec((0u32..3, prop::collection::vec(0u32..3, 0..24)), 0..20),
                                 query in prop::collection::vec(0u32..3, 0..24)) {
        let mut idx = BlockIndex::new(4, None);
        for (e, toks) in &sent {
            idx.insert(&PrefixKey { adapter: None, scope: 0, text: None, tokens: Some(toks) }, EndpointId(*e), Nanos(0));
        }
        let got = idx.overlaps(&PrefixKey { adapter: None, scope: 0, text: None, tokens: Some(&query) }, Nanos(0));
        for e in 0..3 {
            let recount = sent.iter().filter(|(x, _)| *x == e)
                .map(|(_, t)| t.iter().zip(&query).take_while(|(a, b)| a == b).count() / 4)
                .max().unwrap_or(0)
                .min(query.len() / 4);
            prop_assert_eq!(got.of(EndpointId(e)).device as usize, recount);
        }
    }
}

/// Token blocks hash their ids' little-endian bytes: the same chain as those bytes cut into
/// blocks of four bytes per token.
#[test]
fn token_blocks_hash_their_little_endian_bytes() {
    let tokens: Vec<u32> = (0..1000u32)
        .map(|t| t.wrapping_mul(2_654_435_761))
        .collect();
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    for size in [1, 3, 16, 64] {
        assert_eq!(
            block_hashes(&tokens, size, 9),
            text_block_hashes(&bytes, size, 9)
        );
    }
    assert!(block_hashes(&tokens[..15], 16, 9).is_empty());
}
