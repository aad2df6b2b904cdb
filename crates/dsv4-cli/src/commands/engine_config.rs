//! The engine options a profile pins: its `[cache]` and `[scheduler]` sections and
//! `exec.overlap_schedule`, as `dsv4 generate --batch`, `dsv4 serve` and `dsv4 run-batch` all
//! start the engine.

use anyhow::Context;
use dsv4_config::{Profile, SchedulePolicy as ProfilePolicy};
use dsv4_engine::{CacheBudget, EngineConfig, HostTierConfig, SchedulePolicy};

/// Prefill chunk when the profile leaves `scheduler.chunked_prefill_size` at 0.
const DEFAULT_CHUNKED_PREFILL: usize = 8192;

/// The engine options of a profile's `[cache]` and `[scheduler]` sections and
/// `exec.overlap_schedule`.
pub fn engine_config(profile: &Profile) -> anyhow::Result<EngineConfig> {
    let (cache, sched) = (&profile.cache, &profile.scheduler);
    let budget = match cache.max_total_tokens {
        0 => CacheBudget::Auto,
        n => {
            CacheBudget::Tokens(usize::try_from(n).context("cache.max_total_tokens is too large")?)
        }
    };
    let max_running = match sched.max_running_requests {
        0 => match budget {
            CacheBudget::Tokens(t) => (t / 256).clamp(1, 256),
            _ => 64,
        },
        n => usize::try_from(n).context("scheduler.max_running_requests is too large")?,
    };
    let chunk = match sched.chunked_prefill_size {
        0 => DEFAULT_CHUNKED_PREFILL,
        n => usize::try_from(n).context("scheduler.chunked_prefill_size is too large")?,
    };
    let cfg = EngineConfig {
        cache: budget,
        page_size: usize::try_from(cache.page_size).context("cache.page_size is too large")?,
        prefix_cache: cache.prefix_cache,
        max_running_requests: max_running,
        chunked_prefill_size: Some(chunk),
        schedule_policy: match sched.schedule_policy {
            ProfilePolicy::Fcfs => SchedulePolicy::Fcfs,
            ProfilePolicy::Lpm => SchedulePolicy::Lpm,
        },
        in_batch_prefix_caching: sched.in_batch_prefix_caching,
        hicache: cache.hicache.then(|| HostTierConfig {
            ratio: cache.hicache_ratio,
            ..Default::default()
        }),
        overlap_schedule: profile.exec.overlap_schedule,
        // Automatic: results do not depend on it, so no profile key pins it.
        choice_threads: 0,
        priority_preemption: match sched.priority_preemption {
            true => Some(
                u32::try_from(sched.priority_preemption_threshold)
                    .context("scheduler.priority_preemption_threshold is too large")?,
            ),
            false => None,
        },
    };
    cfg.validate()?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        let mut p = Profile::default();
        p.cache.max_total_tokens = 2048;
        p.scheduler.max_running_requests = 4;
        p
    }

    #[test]
    fn profile_values_map_to_engine_options() {
        let mut p = profile();
        p.scheduler.chunked_prefill_size = 0;
        p.scheduler.schedule_policy = ProfilePolicy::Lpm;
        assert!(!engine_config(&p).unwrap().overlap_schedule);
        p.exec.overlap_schedule = true;
        let c = engine_config(&p).unwrap();
        assert!(
            c.overlap_schedule,
            "exec.overlap_schedule reaches the engine"
        );
        assert_eq!(c.cache, CacheBudget::Tokens(2048));
        assert_eq!(c.chunked_prefill_size, Some(DEFAULT_CHUNKED_PREFILL));
        assert_eq!(c.schedule_policy, SchedulePolicy::Lpm);
        assert!(c.in_batch_prefix_caching, "on by default");
        p.scheduler.in_batch_prefix_caching = false;
        assert!(!engine_config(&p).unwrap().in_batch_prefix_caching);
        assert_eq!(c.priority_preemption, None, "off by default");
        p.scheduler.priority_preemption = true;
        p.scheduler.priority_preemption_threshold = 3;
        assert_eq!(engine_config(&p).unwrap().priority_preemption, Some(3));
        assert_eq!(c.max_running_requests, 4);
        assert_eq!(c.hicache, None);
        p.cache.hicache = true;
        p.cache.hicache_ratio = 3.0;
        let c = engine_config(&p).unwrap();
        assert_eq!(c.hicache.map(|h| h.ratio), Some(3.0));
        p.cache.prefix_cache = false;
        assert!(
            engine_config(&p)
                .unwrap_err()
                .to_string()
                .contains("cache.hicache"),
            "the host tier needs the prefix cache"
        );
    }
}
