//! `run_stress` end to end against a scripted OpenAI-compatible mock (not dsv4): a clean server
//! gives no failed session; every corruption signature, streamed and not, is found through the
//! real client on chat, the Responses API and background responses; background faults (a
//! replayed event, a response that never ends, one not queued) fail their turns; unreachable
//! servers are errors; a loading server is waited for; the workload is a function of the seed.

mod mock;

use dsv4_stress::{Api, Oracle, Signature, StreamMode, StressError, StressOptions, run_stress};
use mock::Script;
use std::time::Duration;

fn opts(url: &str) -> StressOptions {
    StressOptions {
        url: url.into(),
        sessions: 4,
        concurrency: 2,
        turns: 3,
        seed: 7,
        growth_chars: 120,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_server_gives_no_failed_sessions_with_the_solo_oracle() {
    let url = mock::start(Script::Clean).await;
    let o = StressOptions {
        sessions: 6,
        oracle: Some(Oracle::Solo),
        ..opts(&url)
    };
    let r = run_stress(&o).await.unwrap();
    assert_eq!(r.failed_sessions, 0, "{}", r.summary());
    assert_eq!((r.sessions, r.completed, r.failed), (6, 18, 0));
    assert!(r.signatures.values().all(|n| *n == 0));
    assert_eq!(r.signatures.len(), Signature::ALL.len());
    // Mixed mode replays every turn alone in both stream modes.
    assert_eq!(r.oracle_requests, 36);
    assert_eq!(r.server.model, "mock-model");
    assert_eq!(r.server.max_model_len, Some(1_000_000));
    let calls: usize = r
        .records
        .iter()
        .flat_map(|s| &s.turns)
        .map(|t| t.tool_calls.len())
        .sum();
    assert!(
        calls > 0,
        "forced turns made tool calls and got results back"
    );
    assert!(r.metrics.mean_e2el_ms > 0.0 && r.metrics.mean_ttft_ms > 0.0);
    assert!(r.metrics.total_output_tokens > 0 && r.metrics.total_input_tokens > 0);
    // Later turns carry more context than earlier ones.
    let s = &r.records[0];
    assert!(
        s.turns.windows(2).all(|w| w[1].messages > w[0].messages),
        "{s:?}"
    );

    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    for key in [
        "sessions",
        "failed_sessions",
        "completed",
        "failed",
        "signatures",
        "duration",
        "request_throughput",
        "output_throughput",
        "total_input_tokens",
        "total_output_tokens",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p90_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "p90_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "median_itl_ms",
        "p90_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "median_e2el_ms",
        "p90_e2el_ms",
        "p99_e2el_ms",
        "server",
        "records",
    ] {
        assert!(json.get(key).is_some(), "the JSON report lacks `{key}`");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_signature_is_found_end_to_end_streamed_and_not() {
    use Signature::*;
    // (script, forced tool rate, oracle, the signature it must produce)
    let cases = [
        (Script::MarkupInContent, 0.0, MarkupInContent),
        (Script::MarkupInContent, 0.0, StopWithMarkup),
        (Script::MarkupInContent, 0.0, UnbalancedTags),
        (Script::Unbalanced, 0.0, UnbalancedTags),
        (Script::InvalidJson, 1.0, InvalidArgumentsJson),
        (Script::SchemaViolation, 1.0, SchemaViolation),
        (Script::UnknownTool, 1.0, UnknownTool),
        (Script::IgnoreToolChoice, 1.0, ToolChoiceViolated),
        (Script::SpecialToken, 0.0, SpecialTokenInText),
        (Script::Repeat, 0.0, RepeatedToken),
        (Script::EmptyLength, 0.0, EmptyLength),
        (Script::ModelOutputError, 0.0, ServerOutputError),
        (Script::Unavailable, 0.0, RequestError),
    ];
    for (script, rate, sig) in cases {
        let url = mock::start(script).await;
        for api in [Api::Chat, Api::Responses, Api::ResponsesBackground] {
            for stream in [StreamMode::Always, StreamMode::Never] {
                let o = StressOptions {
                    forced_tool_rate: rate,
                    stream,
                    api,
                    ..opts(&url)
                };
                let r = run_stress(&o).await.unwrap();
                assert!(
                    r.signatures[sig.name()] > 0 && r.failed_sessions == r.sessions,
                    "{script:?} {api:?} {stream:?} should give {}:\n{}",
                    sig.name(),
                    r.summary()
                );
                assert_eq!(r.signature_sessions[sig.name()], r.sessions);
                let rec = &r.records[0];
                assert!(rec.failed && rec.signatures.contains_key(sig.name()));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_responses_apis_are_clean_on_a_clean_server() {
    let url = mock::start(Script::Clean).await;
    for api in [Api::Responses, Api::ResponsesBackground] {
        // Every turn streams, so the background streams whose cut point falls inside their
        // answer are resumed.
        let o = StressOptions {
            oracle: Some(Oracle::Solo),
            stream: StreamMode::Always,
            api,
            ..opts(&url)
        };
        let r = run_stress(&o).await.unwrap();
        assert_eq!(r.failed_sessions, 0, "{api:?}: {}", r.summary());
        assert_eq!(r.completed, 12);
        let turns = || r.records.iter().flat_map(|s| &s.turns);
        assert!(turns().any(|t| !t.tool_calls.is_empty()));
        let resumed: usize = turns().map(|t| t.resumed).sum();
        assert_eq!(
            resumed > 0,
            api == Api::ResponsesBackground,
            "only background streams are cut and resumed"
        );
        assert_eq!(held(&url).await, 0, "each background response was deleted");
    }
}

/// How many background responses the mock at `url` still holds.
async fn held(url: &str) -> u64 {
    let v: serde_json::Value = reqwest::get(format!("{url}/mock/held"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["held"].as_u64().unwrap()
}

/// The errors of the failed turns of `o`'s run, which must fail every session.
async fn failed_turn_errors(o: &StressOptions) -> Vec<String> {
    let r = run_stress(o).await.unwrap();
    assert!(r.failed_sessions > 0, "{}", r.summary());
    r.records
        .iter()
        .flat_map(|s| &s.turns)
        .filter_map(|t| t.error.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_faults_fail_the_turns_that_meet_them() {
    let background = |url: &str, stream| StressOptions {
        api: Api::ResponsesBackground,
        stream,
        forced_tool_rate: 0.0,
        ..opts(url)
    };
    // A resumed stream that repeats the last event read: the text no longer adds up.
    let url = mock::start(Script::ResumeRepeats).await;
    let errors = failed_turn_errors(&background(&url, StreamMode::Always)).await;
    assert!(
        errors.iter().any(|e| e.contains("do not add up")),
        "{errors:?}"
    );
    assert_eq!(
        held(&url).await,
        0,
        "failed turns' responses are deleted too"
    );
    // Plain turns of a server that does not queue them.
    let url = mock::start(Script::NotQueued).await;
    let errors = failed_turn_errors(&background(&url, StreamMode::Never)).await;
    assert!(
        errors.iter().all(|e| e.contains("not answered queued")),
        "{errors:?}"
    );
    assert_eq!(held(&url).await, 0);
    // A response that never finishes: polls give up at the timeout, streams end short.
    let url = mock::start(Script::NeverFinishes).await;
    let o = StressOptions {
        request_timeout: std::time::Duration::from_millis(300),
        ..background(&url, StreamMode::Never)
    };
    let errors = failed_turn_errors(&o).await;
    assert!(
        errors.iter().all(|e| e.contains("after the timeout")),
        "{errors:?}"
    );
    let errors = failed_turn_errors(&background(&url, StreamMode::Always)).await;
    assert!(
        errors.iter().all(|e| e.contains("stream ended without")),
        "{errors:?}"
    );
    assert_eq!(
        held(&url).await,
        0,
        "responses that never finish are abandoned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_comparisons_find_stream_mismatch_and_solo_divergence() {
    let url = mock::start(Script::StreamDiffers).await;
    let o = StressOptions {
        oracle: Some(Oracle::Solo),
        stream: StreamMode::Mixed,
        ..opts(&url)
    };
    let r = run_stress(&o).await.unwrap();
    assert!(r.signatures["stream_mismatch"] > 0, "{}", r.summary());
    assert_eq!(r.signatures["solo_divergence"], 0, "{}", r.summary());

    let url = mock::start(Script::SecondTimeDiffers).await;
    for stream in [StreamMode::Always, StreamMode::Never] {
        let o = StressOptions {
            oracle: Some(Oracle::Solo),
            stream,
            ..opts(&url)
        };
        let r = run_stress(&o).await.unwrap();
        assert_eq!(
            r.signatures["solo_divergence"],
            r.completed,
            "{}",
            r.summary()
        );
        assert_eq!(r.failed_sessions, r.sessions);
    }
    // Without the oracle the same server looks clean: the comparison is what finds it.
    let url = mock::start(Script::SecondTimeDiffers).await;
    let r = run_stress(&opts(&url)).await.unwrap();
    assert_eq!(r.failed_sessions, 0, "{}", r.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_sends_the_same_requests() {
    let url = mock::start(Script::Clean).await;
    let hashes = |r: &dsv4_stress::StressReport| -> Vec<String> {
        r.records
            .iter()
            .flat_map(|s| s.turns.iter().map(|t| t.request_sha256.clone()))
            .collect()
    };
    let a = run_stress(&opts(&url)).await.unwrap();
    let b = run_stress(&StressOptions {
        concurrency: 4,
        ..opts(&url)
    })
    .await
    .unwrap();
    assert_eq!(hashes(&a), hashes(&b));
    let c = run_stress(&StressOptions {
        seed: 8,
        ..opts(&url)
    })
    .await
    .unwrap();
    assert_ne!(hashes(&a), hashes(&c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_written_as_json_and_jsonl() {
    let url = mock::start(Script::SpecialToken).await;
    let r = run_stress(&opts(&url)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (json, jsonl) = (dir.path().join("r.json"), dir.path().join("r.jsonl"));
    r.write_json(&json).unwrap();
    r.write_jsonl(&jsonl).unwrap();
    let back: dsv4_stress::StressReport =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(back, r);
    let lines: Vec<dsv4_stress::SessionRecord> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, r.records);
    let e = r
        .write_json(&dir.path().join("no/such/dir.json"))
        .unwrap_err();
    assert!(e.to_string().contains("no/such/dir.json"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers_and_bad_options_are_errors() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let url = format!("http://127.0.0.1:{port}");
    let e = run_stress(&StressOptions {
        ready_timeout: Duration::ZERO,
        ..opts(&url)
    })
    .await
    .unwrap_err();
    assert!(matches!(e, StressError::Server { .. }), "{e}");
    assert!(e.to_string().contains("cannot reach"), "{e}");
    let e = run_stress(&StressOptions {
        ready_timeout: Duration::from_millis(600),
        ..opts(&url)
    })
    .await
    .unwrap_err();
    assert!(e.to_string().contains("not ready within 0.6 s"), "{e}");
    let e = run_stress(&StressOptions {
        concurrency: 0,
        ..opts("http://127.0.0.1:1")
    })
    .await
    .unwrap_err();
    assert!(e.to_string().contains("--concurrency"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_still_loading_is_waited_for_up_to_the_ready_timeout() {
    // Started at once, every session meets the 503 of a loading server.
    let url = mock::start_loading(3).await;
    let r = run_stress(&StressOptions {
        ready_timeout: Duration::ZERO,
        ..opts(&url)
    })
    .await
    .unwrap();
    assert_eq!(r.failed_sessions, r.sessions);
    // Waited for, none fails.
    let url = mock::start_loading(3).await;
    let r = run_stress(&opts(&url)).await.unwrap();
    assert_eq!((r.failed_sessions, r.completed), (0, 12));
    // One that never gets ready is an error that says what /health said last.
    let url = mock::start_loading(usize::MAX).await;
    let e = run_stress(&StressOptions {
        ready_timeout: Duration::from_millis(600),
        ..opts(&url)
    })
    .await
    .unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("/health") && e.contains("not ready within"),
        "{e}"
    );
    assert!(e.contains("503") && e.contains("loading"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_bound_stops_new_turns() {
    let url = mock::start(Script::Clean).await;
    let o = StressOptions {
        duration: Some(std::time::Duration::from_nanos(1)),
        ..opts(&url)
    };
    let r = run_stress(&o).await.unwrap();
    assert!(
        r.records.iter().all(|s| s.ended == "deadline"),
        "{:?}",
        r.records
    );
    assert_eq!(r.completed, 0);
    assert_eq!(r.failed_sessions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_end_without_failing_when_the_next_prompt_would_not_fit() {
    // The mock counts a token per request byte; a context 1024 tokens over the longest first
    // prompt lets every first turn run and ends every session within a few turns, as each turn
    // adds at least 1000 characters of user text.
    let o = StressOptions {
        growth_chars: 2000,
        forced_tool_rate: 0.0,
        turns: 20,
        ..opts("")
    };
    let probe = run_stress(&StressOptions {
        url: mock::start(Script::Clean).await,
        turns: 1,
        ..o.clone()
    })
    .await
    .unwrap();
    let first = probe
        .records
        .iter()
        .map(|s| s.turns[0].prompt_tokens.unwrap())
        .max()
        .unwrap();
    let url = mock::start_with_context(Script::Clean, first + 1024).await;
    let r = run_stress(&StressOptions { url, ..o }).await.unwrap();
    assert!(
        r.records.iter().all(|s| s.ended == "context"),
        "{:?}",
        r.records
    );
    assert!(
        r.records
            .iter()
            .all(|s| !s.turns.is_empty() && s.turns.len() < 3)
    );
    assert_eq!((r.failed_sessions, r.failed), (0, 0), "{}", r.summary());
}
