//! The A/B bundle from synthetic stress reports: its statistics, its summary, and — so the format
//! cannot drift — that the ledger's evidence reader accepts it and lifts the same numbers.

use dsv4_stress::ab::{
    AB_FORMAT, AbBundle, AbOptions, ArmSpec, Machine, RepeatRun, Target, Versions,
};
use dsv4_stress::report::zero_counts;
use dsv4_stress::{Metrics, ServerIdentity, SessionRecord, StressOptions, StressReport};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A report of `sessions` sessions of which the first `failed` show `signature`, producing
/// `tokens` output tokens in `seconds`, with median E2EL `e2el_ms`.
fn report(sessions: usize, failed: usize, tokens: u64, seconds: f64, e2el_ms: f64) -> StressReport {
    let mut signatures = zero_counts();
    let mut signature_sessions = zero_counts();
    let name = "solo_divergence".to_string();
    *signatures.entry(name.clone()).or_default() += failed;
    *signature_sessions.entry(name.clone()).or_default() += failed;
    let records = (0..sessions)
        .map(|i| SessionRecord {
            session: i,
            seed: i as u64,
            failed: i < failed,
            signatures: if i < failed {
                [(name.clone(), 1)].into_iter().collect()
            } else {
                Default::default()
            },
            tools: vec!["get_weather".into()],
            ended: "turns".into(),
            turns: vec![],
        })
        .collect();
    StressReport {
        sessions,
        failed_sessions: failed,
        completed: sessions * 2,
        failed: 0,
        signatures,
        signature_sessions,
        metrics: Metrics {
            duration: seconds,
            total_output_tokens: tokens,
            output_throughput: tokens as f64 / seconds,
            request_throughput: (sessions * 2) as f64 / seconds,
            median_e2el_ms: e2el_ms,
            ..Default::default()
        },
        server: ServerIdentity::default(),
        options: StressOptions::default(),
        oracle_requests: 0,
        records,
    }
}

fn arm(label: &str, set: &str) -> ArmSpec {
    ArmSpec {
        label: label.into(),
        target: Target::Boot {
            profile: "dev-cpu".into(),
            sets: vec![set.into()],
        },
        config: serde_json::json!({"profile": "dev-cpu"}),
    }
}

fn options(repeat: usize) -> AbOptions {
    AbOptions {
        a: arm(
            "exec.multi_stream_overlap=true",
            "exec.multi_stream_overlap=true",
        ),
        b: arm(
            "exec.multi_stream_overlap=false",
            "exec.multi_stream_overlap=false",
        ),
        repeat,
        workload: StressOptions {
            sessions: 25,
            ..Default::default()
        },
        binary: PathBuf::from("/nonexistent/dsv4"),
        serve_extra: vec![],
        boot_timeout: Duration::from_secs(60),
        command: "dsv4 ab --b-set exec.multi_stream_overlap=false --sessions 25 --repeat 2".into(),
        progress: false,
    }
}

fn run(repeat: usize, arm: &str, r: StressReport) -> RepeatRun {
    RepeatRun {
        repeat,
        arm: arm.into(),
        url: "http://127.0.0.1:1".into(),
        booted: true,
        server_command: Some(vec!["dsv4".into(), "serve".into()]),
        boot_s: Some(1.0),
        server_exit: Some("exit status: 0".into()),
        report: r,
    }
}

/// A: 3 + 3 of 25 failed (6/50), 1000 tokens in 10 s and 1100 in 10 s; B: 0/50, 950 and 1045.
fn bundle() -> AbBundle {
    let runs = vec![
        run(0, "A", report(25, 3, 1000, 10.0, 200.0)),
        run(0, "B", report(25, 0, 950, 10.0, 210.0)),
        run(1, "A", report(25, 3, 1100, 10.0, 220.0)),
        run(1, "B", report(25, 0, 1045, 10.0, 220.0)),
    ];
    AbBundle::build(&options(2), runs, Versions::default(), Machine::default()).unwrap()
}

#[test]
fn statistics_of_the_pooled_arms() {
    let b = bundle();
    assert_eq!(b.format, AB_FORMAT);
    assert_eq!((b.a.sessions, b.a.failures), (50, 6));
    assert_eq!((b.b.sessions, b.b.failures), (50, 0));
    // Fisher 6/50 vs 0/50 = 2·C(94,50)/C(100,50).
    assert!((b.p_value - 0.026_661_076).abs() < 1e-8, "{}", b.p_value);
    assert!((b.a.tokens_per_s - 105.0).abs() < 1e-9);
    assert!((b.b.tokens_per_s - 99.75).abs() < 1e-9);
    assert!((b.throughput_delta - (-0.05)).abs() < 1e-12);
    assert!(b.throughput_delta_defined);
    assert!((b.difference.estimate - (-0.12)).abs() < 1e-12);
    assert!(
        b.difference.ci_low < -0.12 && b.difference.ci_high > -0.12 && b.difference.ci_high < 0.0
    );
    assert_eq!(b.a.signature_sessions["solo_divergence"], 6);
    assert_eq!(b.power.sessions_per_arm, Some(61));

    let e2el = b
        .metrics
        .iter()
        .find(|m| m.name == "median_e2el_ms")
        .unwrap();
    assert_eq!((e2el.a.mean, e2el.b.mean), (210.0, 215.0));
    let paired = e2el.paired_delta.unwrap();
    assert_eq!(paired.n, 2);
    assert!((paired.min - 0.0).abs() < 1e-12 && (paired.max - 0.05).abs() < 1e-12);
    // Throughput per repeat: both repeats lost exactly 5%.
    let tput = b
        .metrics
        .iter()
        .find(|m| m.name == "output_throughput")
        .unwrap();
    let p = tput.paired_delta.unwrap();
    assert!((p.mean + 0.05).abs() < 1e-12 && p.sd < 1e-12);
    // A metric that is 0 in A has no relative delta.
    let ttft = b
        .metrics
        .iter()
        .find(|m| m.name == "median_ttft_ms")
        .unwrap();
    assert_eq!((ttft.delta, ttft.paired_delta), (None, None));
}

#[test]
fn summary_says_what_people_need() {
    let s = bundle().summary();
    for want in [
        "A exec.multi_stream_overlap=true: 6/50 sessions failed, 12.0%",
        "B exec.multi_stream_overlap=false: 0/50 sessions failed, 0.0% [95% CI 0.0%, 7.1%]",
        "failure rate B − A: -12.0 points",
        "p = 2.666e-2 (significant at 0.05)",
        "throughput (B − A) / A: -5.0%",
        "needs 61 sessions per arm",
        "solo_divergence 6",
    ] {
        assert!(s.contains(want), "missing {want:?} in:\n{s}");
    }
}

#[test]
fn the_ledger_reads_the_bundle() {
    let b = bundle();
    let json = b.to_json();
    let lifted = dsv4_ledger::evidence::ab_summary(json.as_bytes(), Path::new("ab.json"))
        .unwrap()
        .expect("the ledger recognises a dsv4-ab/1 bundle");
    assert_eq!(lifted.a.label, "exec.multi_stream_overlap=true");
    assert_eq!((lifted.a.sessions, lifted.a.failures), (50, 6));
    assert_eq!((lifted.b.sessions, lifted.b.failures), (50, 0));
    assert_eq!(lifted.a.ci_high, b.a.ci_high);
    assert_eq!(lifted.b.tokens_per_s, b.b.tokens_per_s);
    assert_eq!(lifted.p_value, b.p_value);
    assert_eq!(lifted.throughput_delta, b.throughput_delta);
    assert_eq!(lifted.command, b.command);
    assert!(lifted.line().contains("6/50 (12.0%"), "{}", lifted.line());
    // The raw per-session records survive the round trip.
    let back: AbBundle = serde_json::from_str(&json).unwrap();
    assert_eq!(back, b);
    assert_eq!(back.runs[0].report.records.len(), 25);
}

#[test]
fn an_arm_without_sessions_is_an_error_not_nan() {
    let runs = vec![
        run(0, "A", report(0, 0, 0, 1.0, 0.0)),
        run(0, "B", report(25, 0, 950, 10.0, 210.0)),
    ];
    let e =
        AbBundle::build(&options(1), runs, Versions::default(), Machine::default()).unwrap_err();
    assert!(e.to_string().contains("no sessions ran in arm A"), "{e}");
}

#[test]
fn options_are_checked_before_booting() {
    let mut o = options(0);
    let e = o.validate().unwrap_err();
    assert!(e.to_string().contains("--repeat"), "{e}");
    o.repeat = 1;
    let e = o.validate().unwrap_err();
    assert!(e.to_string().contains("/nonexistent/dsv4"), "{e}");
    o.a.target = Target::Url {
        url: "http://127.0.0.1:1".into(),
    };
    o.b.target = o.a.target.clone();
    o.validate().unwrap();
}
