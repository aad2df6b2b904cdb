//! dsv4-stress: `dsv4 stress` (a multi-turn agentic workload against any OpenAI-compatible server,
//! with corruption signatures and vLLM `bench serve` metrics) and `dsv4 ab` (interleaved cold-boot
//! A/B runs of two dsv4 configurations, with the statistics the ledger cites).

pub mod stats;
