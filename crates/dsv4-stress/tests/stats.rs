//! The statistics module against published values: R's `fisher.test`, Wilson intervals from
//! Newcombe (1998) and R's `prop.test(correct = FALSE)`, Newcombe's (1998) worked examples of
//! his method 10, and the edge cases (no sessions, all or no failures, zero effect).

use dsv4_stress::stats::{
    Count, StatsError, fisher_two_sided, newcombe, power_note, relative_delta, sessions_needed,
    spread, wilson,
};

fn c(failures: u64, trials: u64) -> Count {
    Count::new(failures, trials, "test").unwrap()
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol
}

#[test]
fn fisher_matches_r() {
    // 6/50 vs 0/50: the two tails are the tables with 0 and 6 failures in A, each
    // C(94,50)/C(100,50), so p = 2·C(94,50)/C(100,50) = 0.0266611 (exact rationals, checked with
    // Python's math.comb; R's fisher.test(matrix(c(6,44,0,50),2)) agrees to its printed digits).
    let p = fisher_two_sided(c(6, 50), c(0, 50));
    assert!(close(p, 0.026_661_076_308_39, 1e-9), "{p}");
    // Symmetric in the arms.
    assert!(close(fisher_two_sided(c(0, 50), c(6, 50)), p, 1e-12));
    // R: fisher.test(matrix(c(3,1,1,3),2))$p.value = 0.4857143 (Fisher's tea tasting).
    let tea = fisher_two_sided(c(3, 4), c(1, 4));
    assert!(close(tea, 0.485_714_3, 1e-7), "{tea}");
    // Identical arms: every table is at least as extreme as the most likely one.
    assert!(close(fisher_two_sided(c(5, 20), c(5, 20)), 1.0, 1e-12));
    // Nothing failed anywhere: one possible table, p = 1.
    assert_eq!(fisher_two_sided(c(0, 80), c(0, 80)), 1.0);
    // The incident's numbers (15% vs 0% of 200) are far beyond chance.
    assert!(fisher_two_sided(c(30, 200), c(0, 200)) < 1e-8);
}

#[test]
fn fisher_large_tables_stay_finite() {
    let p = fisher_two_sided(c(900, 5000), c(850, 5000));
    assert!(p.is_finite() && p > 0.0 && p < 1.0, "{p}");
}

#[test]
fn wilson_matches_published_values() {
    // 0/80: [0, 0.0458].
    let w = wilson(c(0, 80));
    assert_eq!(w.low, 0.0);
    assert!(close(w.high, 0.0458, 5e-5), "{w:?}");
    // 15/100: R prop.test(15, 100, correct = FALSE)$conf.int = [0.0931, 0.2328].
    let w = wilson(c(15, 100));
    assert!(
        close(w.low, 0.0931, 5e-5) && close(w.high, 0.2328, 5e-5),
        "{w:?}"
    );
    // Newcombe (1998) table I: 81/263 → [0.2553, 0.3662].
    let w = wilson(c(81, 263));
    assert!(
        close(w.low, 0.2553, 5e-5) && close(w.high, 0.3662, 5e-5),
        "{w:?}"
    );
    // All failed: the mirror of none failed.
    let w = wilson(c(80, 80));
    assert_eq!(w.high, 1.0);
    assert!(close(w.low, 1.0 - 0.0458, 5e-5), "{w:?}");
}

#[test]
fn newcombe_matches_his_worked_examples() {
    // Newcombe (1998), Statistics in Medicine 17:873–890, table II, method 10.
    let cases = [
        ((56, 70), (48, 80), (0.0524, 0.3339)),
        ((9, 10), (3, 10), (0.1705, 0.8090)),
        ((5, 56), (0, 29), (-0.0381, 0.1926)),
    ];
    for ((k1, n1), (k2, n2), (lo, hi)) in cases {
        let i = newcombe(c(k1, n1), c(k2, n2));
        assert!(
            close(i.low, lo, 5e-5) && close(i.high, hi, 5e-5),
            "{k1}/{n1} vs {k2}/{n2}: {i:?}, want [{lo}, {hi}]"
        );
    }
    // Reversing the arms negates the interval.
    let a = newcombe(c(56, 70), c(48, 80));
    let b = newcombe(c(48, 80), c(56, 70));
    assert!(close(a.low, -b.high, 1e-12) && close(a.high, -b.low, 1e-12));
}

#[test]
fn impossible_counts_are_errors_not_nan() {
    let e = Count::new(0, 0, "arm A").unwrap_err();
    assert_eq!(
        e,
        StatsError::NoTrials {
            what: "arm A".into()
        }
    );
    assert!(e.to_string().contains("no sessions ran in arm A"), "{e}");
    let e = Count::new(3, 2, "arm B").unwrap_err();
    assert!(e.to_string().contains("3 failures out of 2"), "{e}");
    assert!(spread(&[], "tokens/s").is_err());
    assert!(spread(&[1.0, f64::NAN], "tokens/s").is_err());
    assert_eq!(relative_delta(0.0, 5.0), None);
}

#[test]
fn sample_size_follows_the_normal_approximation() {
    // 12% vs 0%: (1.96·√(2·0.06·0.94) + 0.8416·√(0.12·0.88))² / 0.12² = 60.3 → 61.
    assert_eq!(sessions_needed(0.12, 0.0), Some(61));
    // A textbook case: 0.3 vs 0.5 → 93 per arm (Fleiss without continuity correction).
    assert_eq!(sessions_needed(0.3, 0.5), Some(93));
    assert_eq!(sessions_needed(0.2, 0.2), None);
    // Smaller effects need more sessions.
    assert!(sessions_needed(0.15, 0.0).unwrap() < sessions_needed(0.05, 0.0).unwrap());
}

#[test]
fn power_note_handles_zero_failures_and_zero_effect() {
    let note = power_note(c(6, 50), c(0, 50));
    assert_eq!(note.sessions_per_arm, sessions_needed(0.12, 0.0));
    assert!(
        note.text.contains("needs 61 sessions per arm"),
        "{}",
        note.text
    );
    assert!(note.text.contains("underpowered"), "{}", note.text);
    assert!(note.text.contains("B had 0/50"), "{}", note.text);

    let none = power_note(c(0, 80), c(0, 80));
    assert_eq!(none.sessions_per_arm, None);
    assert!(none.text.contains("no finite sample size"), "{}", none.text);
    assert!(none.text.contains("would need"), "{}", none.text);

    let enough = power_note(c(30, 200), c(0, 200));
    assert!(enough.text.contains("had enough"), "{}", enough.text);
}

#[test]
fn spread_of_repeats() {
    let s = spread(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], "x").unwrap();
    assert_eq!((s.n, s.mean, s.min, s.max), (8, 5.0, 2.0, 9.0));
    // Sample sd: √(32/7).
    assert!(close(s.sd, (32.0f64 / 7.0).sqrt(), 1e-12));
    assert_eq!(spread(&[3.0], "x").unwrap().sd, 0.0);
    assert!(close(relative_delta(1000.0, 959.0).unwrap(), -0.041, 1e-12));
}
