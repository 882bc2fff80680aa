//! The command line: the demo runs end to end, and bad input exits non-zero with one clear line.

use std::process::{Command, Output};

fn mlxcel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel"))
        .args(args)
        .output()
        .expect("mlxcel runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn demo_generates_tokens_and_reports_the_decode_graph() {
    let o = mlxcel(&["demo", "--device", "cpu", "-n", "5", "--layers", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let generated = out
        .lines()
        .find(|l| l.starts_with("generated:"))
        .expect("a generated line");
    assert_eq!(generated.matches(',').count(), 4, "five tokens: {generated}");
    assert!(stderr(&o).contains("AsType per step"), "{}", stderr(&o));
}

#[test]
fn demo_writes_the_decode_graph_as_dot() {
    let path = std::env::temp_dir().join(format!("mlxcel-demo-{}.dot", std::process::id()));
    let o = mlxcel(&[
        "demo",
        "-n",
        "2",
        "--layers",
        "1",
        "--export-dot",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dot = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert!(dot.starts_with("digraph") && dot.contains("attention"), "{dot}");
}

#[test]
fn bad_input_is_one_clear_error() {
    for (args, needle) in [
        (&["demo", "--activations", "int8"][..], "--activations int8"),
        (&["demo", "--prompt-tokens", "1,x"][..], "bad token id"),
        (&["demo", "--prompt-tokens", "99999"][..], "outside the vocabulary"),
        (&["demo", "--heads", "3"][..], "inconsistent demo shape"),
        (&["demo", "--device", "cuda"][..], "CUDA"),
    ] {
        let o = mlxcel(args);
        assert!(!o.status.success(), "{args:?} should fail");
        let e = stderr(&o);
        assert!(e.starts_with("mlxcel: error:") && e.contains(needle), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
    let o = mlxcel(&["demo", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2), "clap rejects unknown flags");
}
