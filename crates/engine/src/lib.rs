//! Generation on top of models: tokenizer, chat templates, sampling, generate, perplexity.

pub mod byte_tokenizer;
pub mod chat;
pub mod engine;
pub mod gguf_tokenizer;
pub mod sampler;
pub mod tokenizer;

pub use engine::{Engine, FinishReason, GenerateOptions, Generation};
pub use sampler::SamplerSettings;
