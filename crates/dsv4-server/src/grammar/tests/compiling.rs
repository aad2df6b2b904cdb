//! How grammars get compiled: on the compilers' own threads without holding a runtime worker,
//! kept and reused least recently used first out, compiled once for a burst of requests that
//! share one, and left to a waiting request when the one that started the compile goes away.

use super::*;

#[test]
fn compiles_wait_for_a_compiler_without_holding_the_runtime_worker() {
    let (g, vocab) = compiler();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // A chain of rules that takes llguidance milliseconds to compile.
    let chain: String = (0..2000)
        .map(|i| format!("r{i}: \"x\" r{}?\n", i + 1))
        .collect::<String>()
        + "r2000: \"y\"\n";
    let chain = format!("start: \"ab\" | r0\n{chain}");
    let rt = runtime();
    rt.block_on(async {
        // Every compiler busy: a request's compile waits its turn.
        let held = g.compiling.acquire_many(cores as u32).await.unwrap();
        let regex = tokio::spawn({
            let g = Arc::clone(&g);
            async move {
                g.constraint(Target::Regex("[ab]{3}"), &ToolSet::default(), false)
                    .await
            }
        });
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert!(!regex.is_finished(), "compiled with every compiler busy");
        drop(held);
        let c = regex.await.unwrap().unwrap();
        let text = String::from_utf8(generate(&c, &vocab, 1, 10)).unwrap();
        assert!(
            regex::Regex::new("^[ab]{3}$").unwrap().is_match(&text),
            "{text:?}"
        );
        // While a grammar compiles, the one worker thread runs the other tasks.
        let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ticker = tokio::spawn({
            let ticks = Arc::clone(&ticks);
            async move {
                loop {
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
        });
        let compiled = g
            .constraint(Target::Grammar(&chain), &ToolSet::default(), false)
            .await;
        let during = ticks.load(std::sync::atomic::Ordering::Relaxed);
        ticker.abort();
        assert!(compiled.is_ok(), "{:?}", compiled.err());
        assert!(during > 0, "the worker was held while the grammar compiled");
    });
}

#[test]
fn compiled_grammars_are_reused_least_recently_used_first_out() {
    let rt = runtime();
    let none = ToolSet::default();
    let get = |g: &Arc<GrammarCompiler>, rx: &str, thinking: bool| {
        rt.block_on(g.constrain(Target::Regex(rx), &none, thinking))
    };
    let (g, vocab) = compiler_caching(2);
    let a = get(&g, "a+", false);
    assert!(!a.cached);
    let again = get(&g, "a+", false);
    assert!(again.cached, "the same grammar is reused");
    let (a, again) = (a.constraint.unwrap(), again.constraint.unwrap());
    assert!(Arc::ptr_eq(&a.0, &again.0));
    // Thinking mode makes another grammar.
    assert!(!get(&g, "a+", true).cached);
    // Capacity 2: "a+" (used before thinking's) goes when "b+" comes.
    assert!(!get(&g, "b+", false).cached);
    assert_eq!(g.cached(), 2);
    assert!(
        !get(&g, "a+", false).cached,
        "the least recently used went first"
    );
    assert!(get(&g, "b+", false).cached);
    // A grammar that cannot compile is kept as the same refusal.
    let bad = get(&g, "(a", false);
    let bad_again = get(&g, "(a", false);
    assert!(!bad.cached && bad_again.cached);
    assert_eq!(bad.constraint.err(), bad_again.constraint.err());
    // Each request sharing a compiled grammar has its own state.
    let eos = Tokenizer::tiny().unwrap().eos_id() as usize;
    let a_id = Tokenizer::tiny().unwrap().encode("a").unwrap()[0];
    let mut first = a.0.start();
    first.advance(a_id).unwrap();
    let mut row = vec![0.0f32; vocab.len()];
    first.mask(&mut row).unwrap();
    assert_eq!(row[eos], 0.0, "after `a` the answer may end");
    let mut second = again.0.start();
    let mut row = vec![0.0f32; vocab.len()];
    second.mask(&mut row).unwrap();
    assert_eq!(
        row[eos],
        f32::NEG_INFINITY,
        "a fresh state must write `a` first"
    );
    // 0 keeps nothing.
    let (g, _) = compiler_caching(0);
    assert!(!get(&g, "a+", false).cached && !get(&g, "a+", false).cached);
    assert_eq!(g.cached(), 0);
}

/// Holds every compiler, so that requests queue: the permits come back with `add_permits`.
async fn hold_every_compiler(g: &GrammarCompiler) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    g.compiling
        .acquire_many(cores as u32)
        .await
        .unwrap()
        .forget();
    cores
}

/// Spawns a request for `rx` on `g`.
fn spawn_regex(g: &Arc<GrammarCompiler>, rx: &'static str) -> tokio::task::JoinHandle<Constrained> {
    let g = Arc::clone(g);
    tokio::spawn(async move {
        g.constrain(Target::Regex(rx), &ToolSet::default(), false)
            .await
    })
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// How many of `tasks` compiled (the others took a shared result); each must have a grammar.
async fn compiles(tasks: Vec<tokio::task::JoinHandle<Constrained>>) -> usize {
    let mut compiled = 0;
    for t in tasks {
        let got = t.await.unwrap();
        assert!(got.constraint.is_ok(), "{:?}", got.constraint.err());
        compiled += usize::from(!got.cached);
    }
    compiled
}

#[test]
fn a_burst_with_one_new_grammar_compiles_it_once_also_without_the_cache() {
    // Cache off: only the compile in flight can be shared.
    let (g, _) = compiler_caching(0);
    let rt = runtime();
    rt.block_on(async {
        let cores = hold_every_compiler(&g).await;
        let tasks: Vec<_> = (0..3).map(|_| spawn_regex(&g, "[0-9]{2,4}x")).collect();
        settle().await;
        assert_eq!(
            g.cache.in_flight(),
            1,
            "one compile in flight for one grammar"
        );
        // Every compiler free: still one compile, the other two wait for it.
        g.compiling.add_permits(cores);
        assert_eq!(compiles(tasks).await, 1, "one compile for one grammar");
        assert_eq!(g.cache.in_flight(), 0);
        // Nothing is kept: a later request compiles again.
        assert_eq!(compiles(vec![spawn_regex(&g, "[0-9]{2,4}x")]).await, 1);
    });
}

#[test]
fn a_request_gone_before_its_compile_leaves_it_to_one_that_waited() {
    let (g, _) = compiler();
    let rt = runtime();
    rt.block_on(async {
        let cores = hold_every_compiler(&g).await;
        let leader = spawn_regex(&g, "[a-c]{5}");
        settle().await;
        let tasks: Vec<_> = (0..2).map(|_| spawn_regex(&g, "[a-c]{5}")).collect();
        settle().await;
        // The leader's client leaves while it waits for a compiler.
        leader.abort();
        assert!(leader.await.unwrap_err().is_cancelled());
        settle().await;
        assert_eq!(g.cache.in_flight(), 1, "a follower leads now");
        g.compiling.add_permits(cores);
        let shared = tokio::time::timeout(std::time::Duration::from_secs(120), compiles(tasks));
        assert_eq!(shared.await.expect("the followers got a grammar"), 1);
        assert_eq!(g.cache.in_flight(), 0);
        assert_eq!(g.cached(), 1);
    });
}
