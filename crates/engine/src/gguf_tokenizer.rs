//! A `tokenizers` tokenizer rebuilt from GGUF metadata (`tokenizer.ggml.*`). The GGUF's own
//! vocabulary, merges, special tokens and chat template are the source of truth.

use anyhow::{anyhow, bail, ensure, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use mlxcel_models::gguf::GgufFile;

use crate::tokenizer::{SpecialTokens, Tokenizer};

/// The `tokenizer.ggml.*` fields, read from a GGUF by the caller.
#[derive(Clone, Debug, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) is supported here.
    pub model: String,
    /// `tokenizer.ggml.pre`: which pre-tokenizer regex the model was trained with.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece models): a merged piece's priority.
    pub scores: Vec<f32>,
    pub merges: Vec<String>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Vec<i32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End-of-turn and other ids that also stop generation (`eot_token_id`, `eom_token_id`).
    pub extra_eos: Vec<u32>,
    pub add_bos: Option<bool>,
    pub chat_template: Option<String>,
}

/// Split regexes of the pre-tokenizers llama.cpp names in `tokenizer.ggml.pre`.
fn pre_regexes(pre: &str) -> Result<Vec<&'static str>> {
    const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    Ok(match pre {
        "gpt2" | "default" => vec![GPT2],
        // SmolLM: digits one at a time, then GPT-2's pattern.
        "smollm" => vec![r"\p{N}", GPT2],
        "qwen2" | "deepseek-r1-qwen" => vec![
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        "llama-bpe" | "llama3" => vec![
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        other => bail!("GGUF pre-tokenizer {other:?} is not supported (gpt2, smollm, qwen2, llama-bpe)"),
    })
}

fn split(regex: &str) -> Result<PreTokenizerWrapper> {
    let s = Split::new(
        SplitPattern::Regex(regex.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| anyhow!("bad pre-tokenizer regex: {e}"))?;
    Ok(s.into())
}

/// SentencePiece BPE merges recovered from piece scores, as Hugging Face's converters do: every
/// split of a piece into two pieces is a merge, ranked by the merged piece's score (highest
/// first; ties keep vocabulary order, and within a piece the order of the parts' ids).
fn merges_from_scores(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let ids: std::collections::HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let mut merges: Vec<(f32, usize, usize)> = Vec::new();
    for (piece_id, piece) in tokens.iter().enumerate() {
        let mut local = Vec::new();
        for (cut, _) in piece.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (ids.get(&piece[..cut]), ids.get(&piece[cut..])) {
                local.push((l, r));
            }
        }
        local.sort_unstable();
        merges.extend(local.into_iter().map(|(l, r)| (scores[piece_id], l, r)));
    }
    // Stable: equal scores keep the order built above.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges
        .into_iter()
        .map(|(_, l, r)| (tokens[l].clone(), tokens[r].clone()))
        .collect()
}

/// A SentencePiece-style BPE (`tokenizer.ggml.model = llama`, e.g. Gemma): spaces become `▁`,
/// bytes missing from the vocabulary fall back to `<0xNN>` pieces.
fn sentencepiece(v: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    use tokenizers::decoders::{byte_fallback::ByteFallback, fuse::Fuse, sequence::Sequence as DecoderSequence};
    use tokenizers::normalizers::replace::Replace;
    ensure!(
        v.scores.len() == v.tokens.len(),
        "GGUF SentencePiece vocabulary needs one score per token"
    );
    let vocab: tokenizers::models::bpe::Vocab = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = merges_from_scores(&v.tokens, &v.scores);
    let mut bpe = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true);
    if let Some(unk) = v
        .tokens
        .iter()
        .zip(&v.token_types)
        .find(|(_, &ty)| ty == 2)
        .map(|(t, _)| t.clone())
    {
        bpe = bpe.unk_token(unk).fuse_unk(true);
    }
    let bpe = bpe
        .build()
        .map_err(|e| anyhow!("building the SentencePiece BPE model from GGUF: {e}"))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let replace = |from: &str, to: &str| Replace::new(from, to).map_err(|e| anyhow!("{e}"));
    inner.with_normalizer(Some(replace(" ", "\u{2581}")?));
    let split = Split::new(
        SplitPattern::String(" ".into()),
        SplitDelimiterBehavior::MergedWithPrevious,
        false,
    )
    .map_err(|e| anyhow!("{e}"))?;
    inner.with_pre_tokenizer(Some(split));
    inner.with_decoder(Some(DecoderSequence::new(vec![
        replace("\u{2581}", " ")?.into(),
        ByteFallback::default().into(),
        Fuse::default().into(),
    ])));
    Ok(inner)
}

/// Builds the tokenizer; special tokens (control and user-defined types) are matched whole.
pub fn build(v: &GgufVocab) -> Result<Tokenizer> {
    if v.model == "llama" {
        return finish(v, sentencepiece(v)?);
    }
    ensure!(
        v.model == "gpt2",
        "GGUF tokenizer model {:?} is not supported (gpt2 byte-level BPE, llama SentencePiece)",
        v.model
    );
    ensure!(!v.tokens.is_empty(), "GGUF has no tokenizer.ggml.tokens");
    let vocab: tokenizers::models::bpe::Vocab = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = v
        .merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| anyhow!("bad merge {m:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let pre = v.pre.as_deref().unwrap_or("gpt2");
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(matches!(pre, "llama-bpe" | "llama3"))
        .build()
        .map_err(|e| anyhow!("building the BPE model from GGUF: {e}"))?;
    let mut steps = pre_regexes(pre)?.into_iter().map(split).collect::<Result<Vec<_>>>()?;
    steps.push(ByteLevel::new(false, true, false).into());
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(Sequence::new(steps)));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    finish(v, inner)
}

/// Special tokens, BOS/EOS and the chat template on top of the model.
fn finish(v: &GgufVocab, mut inner: tokenizers::Tokenizer) -> Result<Tokenizer> {
    let specials: Vec<AddedToken> = v
        .tokens
        .iter()
        .zip(&v.token_types)
        .filter(|(_, &ty)| ty == 3 || ty == 4)
        .map(|(t, _)| AddedToken::from(t.clone(), true))
        .collect();
    inner.add_special_tokens(&specials);

    let text = |id: u32| {
        v.tokens
            .get(id as usize)
            .cloned()
            .ok_or_else(|| anyhow!("special token id {id} is not in the vocabulary"))
    };
    let bos = v.bos.map(|id| Ok::<_, anyhow::Error>((text(id)?, id))).transpose()?;
    let mut eos_ids: Vec<u32> = v.eos.into_iter().chain(v.extra_eos.iter().copied()).collect();
    eos_ids.dedup();
    let special = SpecialTokens {
        add_bos: v.add_bos.unwrap_or(false) && bos.is_some(),
        bos,
        eos_token: v.eos.map(text).transpose()?,
        eos_ids,
    };
    Ok(Tokenizer::new(inner, special, v.chat_template.clone()))
}

fn strings(f: &GgufFile, key: &str) -> Result<Vec<String>> {
    f.get_array(key)?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("{key}: expected strings"))
        })
        .collect()
}

/// Reads the `tokenizer.ggml.*` metadata of a GGUF file.
pub fn vocab(f: &GgufFile) -> Result<GgufVocab> {
    let id = |key: &str| f.get(key).and_then(|v| v.as_u64()).map(|v| v as u32);
    let token_types = match f.get("tokenizer.ggml.token_type") {
        Some(_) => f
            .get_array("tokenizer.ggml.token_type")?
            .iter()
            .map(|v| {
                v.as_u64()
                    .map(|x| x as i32)
                    .ok_or_else(|| anyhow!("tokenizer.ggml.token_type: expected integers"))
            })
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    Ok(GgufVocab {
        model: f.get_str("tokenizer.ggml.model")?.to_string(),
        pre: f.get("tokenizer.ggml.pre").and_then(|v| v.as_str()).map(str::to_string),
        tokens: strings(f, "tokenizer.ggml.tokens")?,
        scores: match f.get("tokenizer.ggml.scores") {
            Some(_) => f
                .get_array("tokenizer.ggml.scores")?
                .iter()
                .map(|v| {
                    v.as_f32()
                        .ok_or_else(|| anyhow!("tokenizer.ggml.scores: expected numbers"))
                })
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        },
        merges: if f.get("tokenizer.ggml.merges").is_some() {
            strings(f, "tokenizer.ggml.merges")?
        } else {
            Vec::new()
        },
        token_types,
        bos: id("tokenizer.ggml.bos_token_id"),
        eos: id("tokenizer.ggml.eos_token_id"),
        extra_eos: ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
            .iter()
            .filter_map(|k| id(k))
            .collect(),
        add_bos: f.get("tokenizer.ggml.add_bos_token").and_then(|v| v.as_bool()),
        chat_template: f
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    })
}

/// The tokenizer a GGUF file carries.
pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer> {
    build(&vocab(f)?)
}
