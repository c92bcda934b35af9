use super::*;
use crate::index::Unit;

fn prediction(unit: Unit, units: u32, total: u32, text_bytes: Option<usize>) -> Prediction {
    Prediction {
        endpoint: EndpointId(0),
        units,
        held: units,
        total,
        unit,
        touched: Nanos::ZERO,
        text_bytes,
        by_tokens: unit != Unit::Bytes,
        engine: None,
        tail: TailScale::default(),
    }
}

#[test]
fn the_held_share_of_a_text_key_is_the_match_or_its_share_of_the_key() {
    // Keyed by text: the match is in the key's own bytes.
    let text = prediction(Unit::Bytes, 1_200, 2_000, Some(2_000));
    assert_eq!(text.cached_text_bytes(), Some(1_200));
    // Keyed by tokens or blocks: the matched share of the key.
    let tokens = prediction(Unit::Tokens, 300, 500, Some(2_000));
    assert_eq!(tokens.cached_text_bytes(), Some(1_200));
    let blocks = prediction(Unit::Blocks(16), 40, 40, Some(2_000));
    assert_eq!(blocks.cached_text_bytes(), Some(2_000));
    // No text key (a token prompt): nothing to say.
    assert_eq!(
        prediction(Unit::Tokens, 300, 500, None).cached_text_bytes(),
        None
    );
}
