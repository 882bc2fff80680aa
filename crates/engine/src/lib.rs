//! Generation on top of models: tokenizer, chat templates, sampling, generate, perplexity,
//! and batched generation over a paged KV cache.

pub mod batcher;
pub mod blocks;
pub mod byte_tokenizer;
pub mod chat;
pub mod engine;
pub mod gguf_tokenizer;
pub mod paged;
pub mod sampler;
pub mod scheduler;
pub mod tokenizer;

pub use engine::{Engine, FinishReason, GenerateOptions, Generation, GraphDType, StepGraphStats};
pub use sampler::SamplerSettings;
