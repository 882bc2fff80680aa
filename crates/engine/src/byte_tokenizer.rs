//! A byte-level tokenizer of any vocabulary size, for random-weight model folders
//! (`mlxcel synth`): ids 0..256 are the 256 bytes (GPT-2's byte-to-character table, no merges),
//! the last id is `<|endoftext|>`, and the ids between are unused placeholders. mlx-lm and
//! transformers load it like any byte-level BPE tokenizer.json.

use anyhow::{anyhow, ensure, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use crate::tokenizer::{SpecialTokens, Tokenizer};

pub const EOS: &str = "<|endoftext|>";

/// GPT-2's printable stand-in for byte `b`: printable Latin-1 bytes stand for themselves, the
/// others (controls, space, DEL, NBSP, soft hyphen) take the characters from U+0100 on, in order.
fn byte_char(b: u8) -> char {
    let printable = |c: u8| matches!(c, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).expect("U+0100..U+0143 are characters")
}

/// The tokenizer for a model of `vocab` ids; `<|endoftext|>` (id `vocab - 1`) ends generation.
pub fn byte_level(vocab: usize) -> Result<Tokenizer> {
    ensure!(
        vocab > 257,
        "a byte-level tokenizer needs more than 257 ids, got {vocab}"
    );
    let mut ids: Vocab = (0..=255u8).map(|b| (byte_char(b).to_string(), b as u32)).collect();
    for id in 256..vocab - 1 {
        ids.insert(format!("<|unused_{id}|>"), id as u32);
    }
    let eos = (vocab - 1) as u32;
    ids.insert(EOS.to_string(), eos);
    let bpe = BPE::builder()
        .vocab_and_merges(ids, vec![])
        .build()
        .map_err(|e| anyhow!("building the byte-level BPE: {e}"))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    inner.add_special_tokens(&[AddedToken::from(EOS, true)]);
    let special = SpecialTokens {
        bos: None,
        eos_ids: vec![eos],
        eos_token: Some(EOS.to_string()),
        add_bos: false,
    };
    Ok(Tokenizer::new(inner, special, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_has_its_own_character_and_text_round_trips() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        let t = byte_level(1000).unwrap();
        let text = "héllo, wörld\n";
        let ids = t.encode(text).unwrap();
        assert_eq!(ids, text.bytes().map(u32::from).collect::<Vec<_>>());
        assert_eq!(t.decode(&ids).unwrap(), text);
        assert_eq!(t.vocab_size(), 1000);
        assert_eq!(t.eos_ids(), &[999]);
        assert!(byte_level(257).is_err());
    }
}
