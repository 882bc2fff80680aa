//! Backend-independent op tests: each [`OpCase`] is a small graph with inputs and the
//! expected outputs from [`reference::evaluate`], a naive f64 interpreter written for clarity only.
//! The CPU backend runs every case against it; the CUDA backend runs the same cases.

pub mod cases;
pub mod reference;

use crate::dtype::DType;
use crate::graph::Graph;
use crate::tensor::HostTensor;

/// How close a backend's output must be: `|got - want| ≤ atol + rtol · |want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

impl Tolerance {
    pub const EXACT: Tolerance = Tolerance { atol: 0.0, rtol: 0.0 };

    /// The default for outputs stored in `dtype` (about two units of its last place).
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance { atol: 1e-5, rtol: 1e-5 },
            DType::F16 => Tolerance { atol: 1e-3, rtol: 2e-3 },
            DType::BF16 => Tolerance {
                atol: 8e-3,
                rtol: 1.6e-2,
            },
            _ => Tolerance::EXACT,
        }
    }

    pub fn scaled(self, factor: f64) -> Tolerance {
        Tolerance {
            atol: self.atol * factor,
            rtol: self.rtol * factor,
        }
    }
}

pub struct OpCase {
    pub name: String,
    pub graph: Graph,
    /// Runtime inputs, in `graph.inputs()` order.
    pub inputs: Vec<HostTensor>,
    /// Initial values of states (others start at zero).
    pub states: Vec<(String, HostTensor)>,
    /// One tolerance per graph output.
    pub tolerance: Vec<Tolerance>,
}

impl OpCase {
    /// The reference outputs for this case.
    pub fn expected(&self) -> crate::Result<Vec<HostTensor>> {
        reference::evaluate(&self.graph, &self.inputs, &self.states)
    }
}

/// True when `a` is within `tol` of `b` (false if either is NaN).
fn within(a: f64, b: f64, tol: Tolerance) -> bool {
    (a - b).abs() <= tol.atol + tol.rtol * b.abs()
}

/// Compares `got` with `want` elementwise; the error names the first mismatch.
pub fn compare(got: &HostTensor, want: &HostTensor, tol: Tolerance) -> Result<(), String> {
    if got.dtype != want.dtype || got.shape != want.shape {
        return Err(format!(
            "got {} {:?}, want {} {:?}",
            got.dtype, got.shape, want.dtype, want.shape
        ));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let same_special = (a.is_nan() && b.is_nan()) || (a.is_infinite() && a == b);
        if same_special {
            continue;
        }
        if within(a, b, tol) {
            continue;
        }
        let excess = (a - b).abs() - (tol.atol + tol.rtol * b.abs());
        if worst.is_none_or(|(_, e)| excess > e || excess.is_nan()) {
            worst = Some((i, excess));
        }
    }
    match worst {
        None => Ok(()),
        Some((i, _)) => {
            let bad = g.iter().zip(&w).filter(|(&a, &b)| !within(a, b, tol)).count();
            Err(format!(
                "{bad} of {} elements off; worst at {i}: got {}, want {} (atol {}, rtol {})",
                g.len(),
                g[i],
                w[i],
                tol.atol,
                tol.rtol
            ))
        }
    }
}

/// Runs one case in a fresh session of `backend`.
pub fn run_case(backend: &dyn crate::Backend, case: &OpCase) -> crate::Result<Vec<HostTensor>> {
    let mut session = backend.new_session()?;
    let id = session.load(&case.graph, crate::CompileOptions::default())?;
    for (name, value) in &case.states {
        session.write_state(name, value)?;
    }
    session.run(id, &case.inputs)
}

/// Runs every case on `backend` and compares with `expected` (the reference interpreter, or
/// another backend); returns one line per failing case.
pub fn check_cases(
    backend: &dyn crate::Backend,
    cases: &[OpCase],
    expected: impl Fn(&OpCase) -> crate::Result<Vec<HostTensor>>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        let outcome = expected(case).and_then(|want| Ok((want, run_case(backend, case)?)));
        match outcome {
            Err(e) => failures.push(format!("{}: {e}", case.name)),
            Ok((want, got)) => {
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    if let Err(e) = compare(g, w, case.tolerance[k]) {
                        failures.push(format!("{} output {k}: {e}", case.name));
                    }
                }
            }
        }
    }
    failures
}
