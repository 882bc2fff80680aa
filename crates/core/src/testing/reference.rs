//! Naive f64 interpreter (placeholder; being written).
use crate::graph::Graph;
use crate::tensor::HostTensor;

pub fn evaluate(_graph: &Graph, _inputs: &[HostTensor], _states: &[(String, HostTensor)]) -> crate::Result<Vec<HostTensor>> {
    Err(crate::Error::Invalid("reference interpreter not written yet".into()))
}
