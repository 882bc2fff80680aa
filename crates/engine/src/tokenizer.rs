//! Text ↔ token ids: a Hugging Face `tokenizer.json`, plus the special tokens and chat template
//! that a model folder spreads over `tokenizer_config.json`, `config.json` and
//! `generation_config.json`, plus incremental detokenization for streaming.

use std::fs;
use std::ops::Deref;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::chat::{ChatMessage, ChatTemplate};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// The BOS token's text and id.
    pub bos: Option<(String, u32)>,
    /// Every id that ends generation, without repeats, in the order the files list them.
    pub eos_ids: Vec<u32>,
    /// The EOS text that chat templates see as `eos_token`.
    pub eos_token: Option<String>,
    /// Whether `encode` prepends `bos` to raw text.
    pub add_bos: bool,
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
    chat_template: Option<String>,
    /// Counted once: the tokenizers crate counts by copying the whole vocabulary, which for a
    /// 128k-token one took serve's request handler about 45 ms a request.
    vocab_size: usize,
}

impl Tokenizer {
    /// Loads tokenizer.json plus tokenizer_config.json / config.json / generation_config.json from a model folder.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let tokenizer_json = dir.join("tokenizer.json");
        if !tokenizer_json.is_file() {
            bail!(
                "{} not found: the model folder needs a Hugging Face tokenizer.json",
                tokenizer_json.display()
            );
        }
        Tokenizer::from_file_with_config(&tokenizer_json, dir)
    }

    /// From an already-built tokenizers::Tokenizer (a later issue builds one from GGUF metadata).
    pub fn new(mut inner: tokenizers::Tokenizer, special: SpecialTokens, chat_template: Option<String>) -> Tokenizer {
        // Some tokenizer.json files carry training-time truncation (say to 512 ids) and padding,
        // which would silently cut or pad prompts. Only a bad truncation stride can fail.
        let _ = inner.with_truncation(None);
        inner.with_padding(None);
        let vocab_size = inner.get_vocab_size(true);
        Tokenizer {
            inner,
            special,
            chat_template,
            vocab_size,
        }
    }

    /// A tokenizer.json from elsewhere (a --tokenizer override) with the config files of `model_dir`.
    pub fn from_file_with_config(tokenizer_json: &Path, model_dir: &Path) -> Result<Tokenizer> {
        let bytes = fs::read(tokenizer_json).with_context(|| format!("reading {}", tokenizer_json.display()))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| anyhow!("{} is not a valid tokenizer.json: {e}", tokenizer_json.display()))?;

        let tokenizer_config_path = model_dir.join("tokenizer_config.json");
        let tokenizer_config: TokenizerConfig = read_optional_json(&tokenizer_config_path)?;
        let config: ModelConfig = read_optional_json(&model_dir.join("config.json"))?;
        let generation_config: ModelConfig = read_optional_json(&model_dir.join("generation_config.json"))?;

        let special = special_tokens(
            &inner,
            &tokenizer_config,
            &tokenizer_config_path,
            &[&config, &generation_config],
        )?;
        let chat_template = chat_template(model_dir, tokenizer_config.chat_template, &tokenizer_config_path)?;
        Ok(Tokenizer::new(inner, special, chat_template))
    }

    /// Raw text: BOS added only if `add_bos` (and not already there), no other special handling.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode_plain(text)?;
        if let (true, Some((_, bos))) = (self.special.add_bos, &self.special.bos) {
            if ids.first() != Some(bos) {
                ids.insert(0, *bos);
            }
        }
        Ok(ids)
    }

    /// The chat template rendered for a reply (`add_generation_prompt`), then tokenized without
    /// adding a BOS, since templates write their own.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_plain(&self.render_chat(messages)?)
    }

    /// The prompt text `encode_chat` tokenizes.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        let source = self.chat_template.as_deref().ok_or_else(|| {
            anyhow!("this model has no chat template (none in tokenizer_config.json or chat_template.jinja)")
        })?;
        let bos = self.special.bos.as_ref().map(|(text, _)| text.clone());
        ChatTemplate::new(source, bos, self.special.eos_token.clone())?.render(messages, true)
    }

    /// Special tokens are kept as text, so a decode shows exactly what the ids say.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| anyhow!("decoding {} token ids: {e}", ids.len()))
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.special.eos_ids.contains(&id)
    }

    pub fn eos_ids(&self) -> &[u32] {
        &self.special.eos_ids
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// Including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Writes this tokenizer as Hugging Face files into `dir`: tokenizer.json, tokenizer_config.json
    /// (`chat_template`, `bos_token`, `eos_token`, `add_bos_token`) and generation_config.json
    /// (every EOS id), which `from_dir` and transformers both read back to the same tokenizer.
    /// When `add_bos` is set, tokenizer.json gets a post-processor that prepends BOS, since that
    /// is where transformers looks for it.
    pub fn save_folder_files(&self, dir: &Path) -> Result<()> {
        let mut inner = self.inner.clone();
        if let (true, Some((text, id))) = (self.special.add_bos, &self.special.bos) {
            let prepend = tokenizers::processors::template::TemplateProcessing::builder()
                .try_single(vec![text.clone(), "$A".to_string()])
                .and_then(|b| b.try_pair(vec![text.clone(), "$A".into(), text.clone(), "$B:1".into()]))
                .map_err(|e| anyhow!("BOS {text:?} does not fit a post-processor template: {e}"))?
                .special_tokens(vec![(text.clone(), *id)])
                .build()
                .map_err(|e| anyhow!("building the BOS post-processor: {e}"))?;
            inner.with_post_processor(Some(prepend));
        }
        let path = dir.join("tokenizer.json");
        inner
            .save(&path, true)
            .map_err(|e| anyhow!("writing {}: {e}", path.display()))?;

        let mut config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.special.add_bos,
            "add_eos_token": false,
            "clean_up_tokenization_spaces": false,
        });
        if let Some((text, _)) = &self.special.bos {
            config["bos_token"] = text.as_str().into();
        }
        if let Some(text) = &self.special.eos_token {
            config["eos_token"] = text.as_str().into();
        }
        if let Some(template) = &self.chat_template {
            config["chat_template"] = template.as_str().into();
        }
        write_json(&dir.join("tokenizer_config.json"), &config)?;

        let mut generation = serde_json::json!({});
        if let Some((_, id)) = &self.special.bos {
            generation["bos_token_id"] = (*id).into();
        }
        match self.special.eos_ids.as_slice() {
            [] => {}
            [one] => generation["eos_token_id"] = (*one).into(),
            many => generation["eos_token_id"] = many.into(),
        }
        write_json(&dir.join("generation_config.json"), &generation)
    }

    pub fn stream(&self) -> StreamDecoder<&Tokenizer> {
        StreamDecoder::new(self)
    }

    /// Added tokens in `text` (`<|eot_id|>`, `<s>`) are recognized either way; `false` keeps the
    /// post-processor from adding its own.
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("tokenizing text: {e}"))?;
        Ok(encoding.get_ids().to_vec())
    }
}

/// Turns generated ids into text as they come, never cutting a UTF-8 character: byte-level BPE and
/// SentencePiece byte-fallback both spread one character over several ids.
///
/// Each push decodes only a short window: the ids since the last emitted boundary but one, where
/// the older part gives the decoder its left context (SentencePiece drops a leading space at the
/// start of a decode, so the window and its emitted part must start at the same id). The text past
/// the emitted part is released once it no longer ends in U+FFFD, the mark of an unfinished byte
/// sequence.
///
/// `T` is how the decoder holds its tokenizer: `&Tokenizer` (`Tokenizer::stream`) or an
/// `Arc<Tokenizer>` where the decoder outlives the borrow (a server's response stream).
pub struct StreamDecoder<T: Deref<Target = Tokenizer>> {
    tokenizer: T,
    ids: Vec<u32>,
    /// How many of `ids` have had their text emitted.
    emitted: usize,
}

/// A UTF-8 character is at most 4 bytes, so more pending ids than this that still end in U+FFFD
/// are invalid bytes, not an unfinished character, and are emitted as they are.
const MAX_PENDING_IDS: usize = 8;

impl<T: Deref<Target = Tokenizer>> StreamDecoder<T> {
    pub fn new(tokenizer: T) -> StreamDecoder<T> {
        StreamDecoder {
            tokenizer,
            ids: Vec::new(),
            emitted: 0,
        }
    }

    /// Feeds one generated id; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let done = self.tokenizer.decode(&self.ids[..self.emitted])?;
        let all = self.tokenizer.decode(&self.ids)?;
        let complete = all.len() > done.len() && !all.ends_with('\u{FFFD}');
        if !complete && self.ids.len() - self.emitted < MAX_PENDING_IDS {
            return Ok(String::new());
        }
        self.ids.drain(..self.emitted);
        self.emitted = self.ids.len();
        Ok(text_after(&done, &all).to_owned())
    }

    /// Whatever remains at the end.
    pub fn finish(&mut self) -> Result<String> {
        if self.emitted == self.ids.len() {
            return Ok(String::new());
        }
        let done = self.tokenizer.decode(&self.ids[..self.emitted])?;
        let all = self.tokenizer.decode(&self.ids)?;
        self.ids.clear();
        self.emitted = 0;
        Ok(text_after(&done, &all).to_owned())
    }
}

/// The part of `all` past `done`. Decoders only append text as ids are appended, except clean-up
/// rules that rewrite earlier text; what was emitted stays emitted, so skip as many bytes as `done`.
fn text_after<'t>(done: &str, all: &'t str) -> &'t str {
    let mut start = done.len().min(all.len());
    while !all.is_char_boundary(start) {
        start -= 1;
    }
    &all[start..]
}

// ---- the config files -------------------------------------------------------------------------

/// The fields of tokenizer_config.json used here.
#[derive(Default, Deserialize)]
struct TokenizerConfig {
    bos_token: Option<TokenText>,
    eos_token: Option<TokenText>,
    add_bos_token: Option<bool>,
    chat_template: Option<ChatTemplateSource>,
}

/// A token written as its text or as a serialized `AddedToken` (`{"content": "<s>", ...}`).
#[derive(Deserialize)]
#[serde(untagged, expecting = "a token's text or an AddedToken object with \"content\"")]
enum TokenText {
    Text(String),
    Added { content: String },
}

impl TokenText {
    fn text(&self) -> &str {
        match self {
            TokenText::Text(text) | TokenText::Added { content: text } => text,
        }
    }
}

#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a template string or a list of {\"name\", \"template\"} objects"
)]
enum ChatTemplateSource {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

/// The token-id fields shared by config.json and generation_config.json.
#[derive(Default, Deserialize)]
struct ModelConfig {
    bos_token_id: Option<TokenIds>,
    eos_token_id: Option<TokenIds>,
    /// Multimodal checkpoints keep the language model's ids here.
    text_config: Option<Box<ModelConfig>>,
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "a token id or a list of token ids")]
enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl ModelConfig {
    fn bos_id(&self) -> Option<u32> {
        let own = self
            .bos_token_id
            .as_ref()
            .and_then(|ids| ids.as_slice().first().copied());
        own.or_else(|| self.text_config.as_ref()?.bos_id())
    }

    fn eos_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eos_token_id.as_ref().map_or(&[][..], TokenIds::as_slice).to_vec();
        if let Some(text) = &self.text_config {
            ids.extend(text.eos_ids());
        }
        ids
    }
}

impl TokenIds {
    fn as_slice(&self) -> &[u32] {
        match self {
            TokenIds::One(id) => std::slice::from_ref(id),
            TokenIds::Many(ids) => ids,
        }
    }
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A missing file reads as the defaults; an unreadable or malformed one is an error naming it.
fn read_optional_json<T: DeserializeOwned + Default>(path: &Path) -> Result<T> {
    if !path.exists() {
        return Ok(T::default());
    }
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is malformed", path.display()))
}

fn special_tokens(
    inner: &tokenizers::Tokenizer,
    tokenizer_config: &TokenizerConfig,
    tokenizer_config_path: &Path,
    configs: &[&ModelConfig],
) -> Result<SpecialTokens> {
    let id_of = |token: &TokenText, field: &str| {
        let text = token.text();
        inner.token_to_id(text).map(|id| (text.to_owned(), id)).ok_or_else(|| {
            anyhow!(
                "{}: {field} {text:?} is not a token of tokenizer.json",
                tokenizer_config_path.display()
            )
        })
    };

    let bos = match &tokenizer_config.bos_token {
        Some(token) => Some(id_of(token, "bos_token")?),
        None => configs
            .iter()
            .find_map(|c| c.bos_id())
            .and_then(|id| inner.id_to_token(id).map(|text| (text, id))),
    };

    let mut eos_ids = Vec::new();
    let mut eos_token = None;
    if let Some(token) = &tokenizer_config.eos_token {
        let (text, id) = id_of(token, "eos_token")?;
        eos_ids.push(id);
        eos_token = Some(text);
    }
    for id in configs.iter().flat_map(|c| c.eos_ids()) {
        if !eos_ids.contains(&id) {
            eos_ids.push(id);
        }
    }
    let eos_token = eos_token.or_else(|| inner.id_to_token(*eos_ids.first()?));

    // Without `add_bos_token` (Llama 3 has none), the tokenizer's post-processor decides, as in
    // transformers.
    let add_bos = match (&bos, tokenizer_config.add_bos_token) {
        (None, _) => false,
        (Some(_), Some(add)) => add,
        (Some((_, bos_id)), None) => inner
            .encode("a", true)
            .is_ok_and(|e| e.get_ids().first() == Some(bos_id)),
    };
    Ok(SpecialTokens {
        bos,
        eos_ids,
        eos_token,
        add_bos,
    })
}

/// transformers saves newer templates to chat_template.jinja, which then wins over the config's.
fn chat_template(
    model_dir: &Path,
    from_config: Option<ChatTemplateSource>,
    tokenizer_config_path: &Path,
) -> Result<Option<String>> {
    let jinja = model_dir.join("chat_template.jinja");
    if jinja.exists() {
        return fs::read_to_string(&jinja)
            .map(Some)
            .with_context(|| format!("reading {}", jinja.display()));
    }
    match from_config {
        None => Ok(None),
        Some(ChatTemplateSource::One(template)) => Ok(Some(template)),
        Some(ChatTemplateSource::Named(templates)) => {
            let names: Vec<&str> = templates.iter().map(|t| t.name.as_str()).collect();
            match templates.iter().find(|t| t.name == "default") {
                Some(t) => Ok(Some(t.template.clone())),
                None => bail!(
                    "{}: chat_template lists {names:?} but none named \"default\"",
                    tokenizer_config_path.display()
                ),
            }
        }
    }
}
