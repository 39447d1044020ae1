//! Issue 8: the wire decoders under random and mutated input, a bounded count in CI
//! (`railcc-fuzz 20000000` is the long run, bench/results/README.md).

#[test]
fn decoders_survive_two_hundred_thousand_inputs() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_railcc-fuzz"))
        .arg("200000")
        .output()
        .expect("railcc-fuzz runs");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "findings: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("fuzzed 200000 inputs") && text.contains("panics 0"),
        "{text}"
    );
}
