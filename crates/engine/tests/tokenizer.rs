//! Tokenizer and chat-template behaviour on two tiny model folders (see fixtures/make_fixtures.py):
//! `bpe` is a GPT-2 style byte-level BPE with Llama 3 special tokens and chat template, `spm` a
//! Llama 2 / Mistral style SentencePiece BPE with `<0xNN>` byte fallback.

use std::fs;
use std::path::{Path, PathBuf};

use mlxcel_engine::chat::{ChatMessage, ChatTemplate};
use mlxcel_engine::tokenizer::{SpecialTokens, Tokenizer};

const MULTI_BYTE: &str = "héllo wörld — 你好 🙂";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn load(name: &str) -> Tokenizer {
    Tokenizer::from_dir(&fixture(name)).unwrap()
}

/// A fresh model folder holding `copied` files of fixture `from` plus `written` (name, contents).
fn scratch_model(test: &str, from: &str, copied: &[&str], written: &[(&str, &str)]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("tokenizer-tests")
        .join(test);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    for file in copied {
        fs::copy(fixture(from).join(file), dir.join(file)).unwrap();
    }
    for (file, contents) in written {
        fs::write(dir.join(file), contents).unwrap();
    }
    dir
}

fn error_of<T>(result: anyhow::Result<T>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

fn messages(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs
        .iter()
        .map(|(role, content)| ChatMessage::new(*role, *content))
        .collect()
}

/// Streams `ids` one at a time and checks the pieces join to the full decode without ever
/// showing a replacement character; returns the pieces.
fn stream_all(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
    let mut stream = tok.stream();
    let mut pieces: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    pieces.push(stream.finish().unwrap());
    let full = tok.decode(ids).unwrap();
    assert_eq!(pieces.concat(), full);
    for piece in &pieces {
        assert!(!piece.contains('\u{FFFD}'), "partial character streamed in {pieces:?}");
    }
    pieces
}

// ---- encode / decode ---------------------------------------------------------------------------

#[test]
fn byte_level_bpe_round_trips_text_after_its_bos() {
    let tok = load("bpe");
    for text in ["Hello world!", MULTI_BYTE, "  leading spaces\nand\ttabs  ", ""] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(ids[0], 0, "<|begin_of_text|> first for {text:?}");
        assert_eq!(tok.decode(&ids[1..]).unwrap(), text);
        assert_eq!(tok.decode(&ids).unwrap(), format!("<|begin_of_text|>{text}"));
    }
    assert_eq!(tok.vocab_size(), 400);
}

#[test]
fn sentencepiece_byte_fallback_round_trips_multi_byte_text() {
    let tok = load("spm");
    for text in ["Hello world!", MULTI_BYTE, "The capital of France is Paris."] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(ids[0], 1, "<s> first for {text:?}");
        assert_eq!(tok.decode(&ids[1..]).unwrap(), text);
    }
    // "你" is not in the vocabulary: it must come out as its three UTF-8 bytes.
    let ids = tok.encode("你").unwrap();
    let bytes: Vec<u32> = [0xE4u32, 0xBD, 0xA0].iter().map(|b| 3 + b).collect();
    assert!(ids.windows(3).any(|w| w == bytes), "byte-fallback ids in {ids:?}");
}

#[test]
fn bos_is_added_only_when_add_bos_and_never_twice() {
    let spm = load("spm");
    assert!(spm.special_tokens().add_bos);
    assert_eq!(spm.special_tokens().bos, Some(("<s>".to_owned(), 1)));
    let with_bos = spm.encode("<s>Hello").unwrap();
    assert_eq!(with_bos.iter().filter(|&&id| id == 1).count(), 1, "{with_bos:?}");

    let config = r#"{"add_bos_token": false, "bos_token": "<s>", "eos_token": "</s>"}"#;
    let dir = scratch_model(
        "no_add_bos",
        "spm",
        &["tokenizer.json"],
        &[("tokenizer_config.json", config)],
    );
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert!(!tok.special_tokens().add_bos);
    let ids = tok.encode("Hello").unwrap();
    assert_eq!(ids, spm.encode("Hello").unwrap()[1..], "the same ids without <s>");

    // Llama 3 has no add_bos_token: the tokenizer.json post-processor adding BOS decides.
    let bpe = load("bpe");
    assert!(bpe.special_tokens().add_bos);
    let plain = Tokenizer::new(
        tokenizers::Tokenizer::from_file(fixture("bpe").join("tokenizer.json")).unwrap(),
        SpecialTokens {
            add_bos: false,
            ..bpe.special_tokens().clone()
        },
        None,
    );
    assert_eq!(plain.encode("Hello").unwrap(), bpe.encode("Hello").unwrap()[1..]);
}

#[test]
fn eos_ids_are_collected_from_every_file_without_repeats() {
    // tokenizer_config.json: <|eot_id|> (4); config.json: [1, 5]; generation_config.json: [1, 4, 5].
    let bpe = load("bpe");
    assert_eq!(bpe.eos_ids(), &[4, 1, 5]);
    assert_eq!(bpe.special_tokens().eos_token.as_deref(), Some("<|eot_id|>"));
    assert!(bpe.is_eos(1) && bpe.is_eos(4) && bpe.is_eos(5));
    assert!(!bpe.is_eos(0) && !bpe.is_eos(2));

    assert_eq!(load("spm").eos_ids(), &[2]);

    // Without tokenizer_config.json the ids still come from config.json, and the text from the vocabulary.
    let dir = scratch_model("eos_from_config", "bpe", &["tokenizer.json", "config.json"], &[]);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.eos_ids(), &[1, 5]);
    assert_eq!(tok.special_tokens().eos_token.as_deref(), Some("<|end_of_text|>"));
    assert_eq!(tok.special_tokens().bos, Some(("<|begin_of_text|>".to_owned(), 0)));
}

// ---- chat templates ----------------------------------------------------------------------------

#[test]
fn llama3_template_renders_a_two_message_conversation() {
    let tok = load("bpe");
    let chat = messages(&[("system", "You are terse."), ("user", "  Hi there!\n")]);
    let expected = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>\
                    <|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>\
                    <|start_header_id|>assistant<|end_header_id|>\n\n";
    assert_eq!(tok.render_chat(&chat).unwrap(), expected);

    let ids = tok.encode_chat(&chat).unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == 0).count(), 1, "exactly one BOS: {ids:?}");
    assert_eq!(ids[0], 0);
    assert_eq!(ids[1], 2, "<|start_header_id|> recognized as one token");
    assert_eq!(ids.iter().filter(|&&id| id == 4).count(), 2, "two <|eot_id|>");
    assert_eq!(tok.decode(&ids).unwrap(), expected);
}

#[test]
fn named_template_list_uses_the_default_one() {
    let tok = load("spm");
    assert!(tok.has_chat_template());
    let chat = messages(&[("user", "What is 2+2? "), ("assistant", "4"), ("user", "And 3+3?")]);
    assert_eq!(
        tok.render_chat(&chat).unwrap(),
        "<s>[INST] What is 2+2? [/INST] 4</s>[INST] And 3+3? [/INST]"
    );
    let ids = tok.encode_chat(&chat).unwrap();
    assert_eq!(
        ids.iter().filter(|&&id| id == 1).count(),
        1,
        "the template's <s> only: {ids:?}"
    );
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 1, "</s> recognized: {ids:?}");
}

#[test]
fn raise_exception_surfaces_its_message() {
    let tok = load("spm");
    let chat = messages(&[("user", "a"), ("user", "b")]);
    let error = error_of(tok.encode_chat(&chat));
    assert!(
        error.contains("Conversation roles must alternate user/assistant/user/assistant/..."),
        "{error}"
    );
}

#[test]
fn tojson_matches_python_json_dumps() {
    let source = r#"{{ {"name": "get_weather", "parameters": {"city": {"type": "string"}}, "tags": []} | tojson }}
{{ [{"b": 1, "a": [1.5, none, true]}] | tojson(indent=2) }}
{{ "a<b>&'é\n\"" | tojson }} {{ {"z": 1, "a": 2} | tojson(sort_keys=true) }} {{ "é" | tojson(ensure_ascii=true) }}
{{ messages[0] | tojson }}"#;
    let template = ChatTemplate::new(source, None, None).unwrap();
    let rendered = template.render(&messages(&[("user", "Hi")]), false).unwrap();
    let expected = r#"{"name": "get_weather", "parameters": {"city": {"type": "string"}}, "tags": []}
[
  {
    "b": 1,
    "a": [
      1.5,
      null,
      true
    ]
  }
]
"a<b>&'é\n\"" {"a": 2, "z": 1} "\u00e9"
{"role": "user", "content": "Hi"}"#;
    assert_eq!(rendered, expected);
}

#[test]
fn python_methods_namespace_and_loop_controls_work() {
    let source = "{% set ns = namespace(system='', n=0) %}
{% for m in messages %}
{% if m.role == 'system' %}{% set ns.system = m.content %}{% continue %}{% endif %}
{% set ns.n = ns.n + 1 %}
{{ loop.index }}/{{ loop.length }}{% if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}: \
{{ m.role.upper() }} {{ m.content.lower().replace('o', '0') }} {{ m.content.split(' ') | length }}\
{% if m.content.startswith('Hi') %} hi{% endif %}{% if m.content.endswith('?') %} ?{% endif %}
{% if ns.n == 2 %}{% break %}{% endif %}
{% endfor %}
system={{ ns.system.strip() }} n={{ ns.n }}
{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}
";
    let chat = messages(&[
        ("system", "  Be nice  "),
        ("user", "Hi Bob, how are you?"),
        ("assistant", "Good"),
        ("user", "Ok"),
    ]);
    let rendered = ChatTemplate::new(source, None, None)
        .unwrap()
        .render(&chat, false)
        .unwrap();
    // What transformers' Jinja environment (trim_blocks, lstrip_blocks, loopcontrols) renders.
    // trim_blocks eats the newline after each line's closing `{% endif %}`.
    assert_eq!(
        rendered,
        "2/4: USER hi b0b, h0w are y0u? 5 hi ?3/4: ASSISTANT g00d 1system=Be nice n=2\na=1;b=2;"
    );
}

#[test]
fn special_token_variables_and_generation_prompt() {
    let source = "{{ bos_token }}|{{ eos_token }}|{% if add_generation_prompt %}go{% endif %}";
    let template = ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into())).unwrap();
    assert_eq!(template.render(&[], true).unwrap(), "<s>|</s>|go");
    assert_eq!(template.render(&[], false).unwrap(), "<s>|</s>|");
    // Models without a BOS (Qwen) render it as nothing, not as "none".
    assert_eq!(
        ChatTemplate::new(source, None, None)
            .unwrap()
            .render(&[], false)
            .unwrap(),
        "||"
    );
}

#[test]
fn strftime_now_gives_the_date() {
    let template = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", None, None).unwrap();
    let date = template.render(&[], true).unwrap();
    let year: u32 = date[..4].parse().unwrap();
    assert!(year >= 2024 && date.len() == 10, "{date}");
}

#[test]
fn template_syntax_errors_are_reported() {
    let error = error_of(ChatTemplate::new("{% for m in messages %}", None, None));
    assert!(error.contains("chat template does not parse"), "{error}");
}

#[test]
fn chat_template_jinja_file_wins_over_the_config() {
    let dir = scratch_model(
        "jinja_file",
        "bpe",
        &["tokenizer.json", "tokenizer_config.json"],
        &[("chat_template.jinja", "{{ messages[0].content }}!")],
    );
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.render_chat(&messages(&[("user", "hey")])).unwrap(), "hey!");
}

#[test]
fn model_without_chat_template_says_so() {
    let config = r#"{"bos_token": "<s>", "eos_token": "</s>"}"#;
    let dir = scratch_model(
        "no_template",
        "spm",
        &["tokenizer.json"],
        &[("tokenizer_config.json", config)],
    );
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert!(!tok.has_chat_template());
    let error = error_of(tok.encode_chat(&messages(&[("user", "hi")])));
    assert!(error.contains("no chat template"), "{error}");
}

// ---- streaming ---------------------------------------------------------------------------------

#[test]
fn streaming_equals_full_decode_for_both_tokenizer_kinds() {
    for name in ["bpe", "spm"] {
        let tok = load(name);
        for text in [MULTI_BYTE, "Hello world, 你好世界! 🙂🙂 ok", "a — b — c"] {
            let ids = tok.encode(text).unwrap();
            stream_all(&tok, &ids);
            stream_all(&tok, &ids[1..]);
        }
        let chat = tok.encode_chat(&messages(&[("user", MULTI_BYTE)])).unwrap();
        stream_all(&tok, &chat);
    }
}

#[test]
fn byte_fallback_character_is_held_until_its_last_byte() {
    let tok = load("spm");
    let smile: Vec<u32> = "🙂".bytes().map(|b| 3 + u32::from(b)).collect();
    let mut ids = tok.encode("ok").unwrap();
    ids.extend(&smile);
    let pieces = stream_all(&tok, &ids);
    let n = pieces.len();
    assert_eq!(&pieces[n - 5..], &["", "", "", "🙂", ""]);
}

#[test]
fn byte_level_tokens_splitting_characters_stream_whole_characters() {
    let tok = load("bpe");
    // "你好" as ä | ½ł | å | ¥½ (bytes E4 | BD A0 | E5 | A5 BD): each character split over two tokens.
    let inner = tokenizers::Tokenizer::from_file(fixture("bpe").join("tokenizer.json")).unwrap();
    let ids = ["ä", "½ł", "å", "¥½"].map(|t| inner.token_to_id(t).unwrap());
    assert_eq!(tok.decode(&ids).unwrap(), "你好");
    assert_eq!(stream_all(&tok, &ids), ["", "你", "", "好", ""]);
}

#[test]
fn long_outputs_stream_equal_to_the_full_decode() {
    for name in ["bpe", "spm"] {
        let tok = load(name);
        let ids = tok
            .encode(&format!("{MULTI_BYTE} The quick brown fox. ").repeat(300))
            .unwrap();
        assert!(ids.len() > 5000);
        stream_all(&tok, &ids);
    }
}

#[test]
fn invalid_bytes_do_not_stall_the_stream() {
    let tok = load("spm");
    // Lone continuation bytes never complete a character; the stream must not hold them forever.
    let mut ids = vec![3 + 0x80; 20];
    ids.extend(tok.encode("ok").unwrap());
    let mut stream = tok.stream();
    let streamed: String = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert!(streamed.contains('\u{FFFD}'));
    assert_eq!(streamed + &stream.finish().unwrap(), tok.decode(&ids).unwrap());
}

// ---- errors ------------------------------------------------------------------------------------

#[test]
fn missing_tokenizer_json_names_the_file() {
    let dir = scratch_model("missing_tokenizer", "bpe", &["config.json"], &[]);
    let error = error_of(Tokenizer::from_dir(&dir));
    assert!(
        error.contains("tokenizer.json") && error.contains("not found"),
        "{error}"
    );
}

#[test]
fn malformed_files_are_errors_naming_them() {
    let cases = [
        ("bad_tokenizer_json", "tokenizer.json", "{\"model\": 3}"),
        (
            "bad_tokenizer_config",
            "tokenizer_config.json",
            "{\"bos_token\": \"<s>\", ",
        ),
        ("bad_config", "config.json", "{\"eos_token_id\": \"two\"}"),
        ("bad_generation_config", "generation_config.json", "[1, 2"),
        ("unknown_eos", "tokenizer_config.json", "{\"eos_token\": \"<|nope|>\"}"),
        (
            "unnamed_templates",
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#,
        ),
    ];
    for (test, file, contents) in cases {
        let copied: Vec<&str> = ["tokenizer.json", "config.json"]
            .into_iter()
            .filter(|f| *f != file)
            .collect();
        let dir = scratch_model(test, "bpe", &copied, &[(file, contents)]);
        let error = error_of(Tokenizer::from_dir(&dir));
        assert!(error.contains(file), "{test}: {error}");
    }
}

#[test]
fn tokenizer_override_takes_config_from_the_model_folder() {
    let dir = scratch_model(
        "override",
        "bpe",
        &["tokenizer_config.json", "generation_config.json"],
        &[],
    );
    let tok = Tokenizer::from_file_with_config(&fixture("bpe").join("tokenizer.json"), &dir).unwrap();
    assert_eq!(tok.eos_ids(), &[4, 1, 5]);
    assert!(tok.has_chat_template());
    let error = error_of(Tokenizer::from_file_with_config(&dir.join("tokenizer.json"), &dir));
    assert!(error.contains("tokenizer.json"), "{error}");
}
