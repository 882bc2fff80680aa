//! mlxcel's core: the graph IR that model code builds, the passes that normalize it, and the
//! interface backends implement. See `docs/architecture.md`.

pub mod backend;
pub mod builder;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod op;
pub mod passes;
pub mod plan;
pub mod quant;
pub mod rng;
pub mod stats;
pub mod tensor;
pub mod testing;

pub use backend::{Backend, CompileOptions, GraphId, MemoryReport, Session};
pub use builder::{BuilderOptions, GraphBuilder};
pub use dtype::DType;
pub use error::{Error, Result};
pub use graph::{Graph, Node, NodeId, NodeName};
pub use op::{BinaryOp, CompareOp, Op, ReduceOp, UnaryOp};
pub use tensor::HostTensor;
