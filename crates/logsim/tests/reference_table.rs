//! Validation: logsim reproduces the simulated table of peers-reference section 2.3 (one
//! frontier, GC below 2 free zones, sequential fill then random writes, B = 1024, U = 1 Mi)
//! within a few percent. Deterministic seed: these are counts, not timings.
//!
//! U = 1 Mi blocks as in the reference (with fewer zones its 3 reserved zones eat more of the
//! over-provisioning: U = 256 Ki gives 8.39 instead of 7.88); 2U measured instead of the
//! reference's 4U, after 2U of warm-up (4U for greedy under skew at 28 %, see `warm_for`), to
//! keep each run to seconds. The 4U + 4U figures of `logsim gc` are in docs/log-layout.md.

use logsim::store::{Config, Store, Victim};
use logsim::workload::Skew;

fn wa(op: f64, victim: Victim, skew: &str, warm: f64) -> f64 {
    let mut c = Config::reference(1 << 20, 1024, op, victim, skew.parse::<Skew>().unwrap());
    c.warm = warm;
    c.measure = 2.0;
    Store::run(c).wa()
}

/// Warm-up in multiples of U: 2 converges everywhere but for greedy under skew at 28 % OP,
/// whose barely dirty cold zones take the reference's 4U to settle (3.11 after 2U).
fn warm_for(op: f64, victim: Victim, skew: &str) -> f64 {
    if victim == Victim::Greedy && skew != "uniform" && op > 0.2 {
        4.0
    } else {
        2.0
    }
}

/// Runs every case and fails with the whole list if any is off by more than its tolerance.
fn check(cases: &[(f64, Victim, &str, f64, f64)]) {
    let mut bad = Vec::new();
    for &(op, victim, skew, want, tol) in cases {
        let got = wa(op, victim, skew, warm_for(op, victim, skew));
        let err = (got - want).abs() / want;
        let line = format!(
            "OP {op} {victim} {skew}: WA {got:.3}, reference {want}, {:.1} % off",
            err * 100.0
        );
        eprintln!("{line}");
        if err > tol {
            bad.push(line);
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn uniform_matches_the_reference_and_the_formula() {
    // Reference greedy 7.88 / 2.48; Lambert-W formula 7.82 / 2.48.
    check(&[
        (0.07, Victim::Greedy, "uniform", 7.88, 0.03),
        (0.28, Victim::Greedy, "uniform", 2.48, 0.03),
    ]);
}

#[test]
fn cost_benefit_beats_greedy_under_skew_as_in_the_reference() {
    // Reference, B = 1024: 90/10 greedy 8.59 / 2.87, cost-benefit 4.84 / 1.89;
    // Zipf .99 cost-benefit 5.05 / 2.27.
    check(&[
        (0.07, Victim::Greedy, "90-10", 8.59, 0.04),
        (0.07, Victim::CostBenefit, "90-10", 4.84, 0.06),
        (0.07, Victim::CostBenefit, "zipf", 5.05, 0.05),
        (0.28, Victim::Greedy, "90-10", 2.87, 0.04),
        (0.28, Victim::CostBenefit, "zipf", 2.27, 0.05),
    ]);
}
