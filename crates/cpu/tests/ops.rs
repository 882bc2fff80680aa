//! Every op case from `mlxcel_core::testing::cases` on the CPU backend, against the naive f64
//! reference interpreter.

use mlxcel_core::testing::{cases, check_cases, OpCase};
use mlxcel_cpu::CpuBackend;

#[test]
fn every_op_case_matches_the_reference_interpreter() {
    let all = cases::all();
    assert!(all.len() > 100, "only {} op cases", all.len());
    eprintln!("{} op cases", all.len());
    let failures = check_cases(&CpuBackend, &all, OpCase::expected);
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}
