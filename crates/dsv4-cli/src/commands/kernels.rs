//! `dsv4 kernels compile`: the CUDA backend's kernels compiled ahead of time by NVRTC into the
//! kernel cache the backend loads them from (docs/cuda.md, "The kernel cache"), for GPUs named
//! by compute capability, on a machine without one. A deployment then runs exactly those
//! kernels with `DSV4_CUDA_KERNELS=cached`, and its GPU machines need no NVRTC. `dsv4 kernels
//! list` shows which cached CUBINs this build loads and prunes the stale ones.

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use dsv4_backend_cuda::cuda::default_acc_f64;
use dsv4_backend_cuda::kernel_cache::{
    self, CachedCubin, Precompiled, parse_capability, precompile,
};
use dsv4_backend_cuda::nvrtc::{self, KernelResources};
use std::path::PathBuf;
use std::time::Instant;

/// `dsv4 kernels …`.
#[derive(Debug, Subcommand)]
pub enum KernelsCommand {
    /// Compile the CUDA kernels for GPUs by compute capability into the kernel cache (needs
    /// NVRTC, not a GPU).
    Compile(CompileArgs),
    /// List the CUBINs in the kernel cache: which this build loads, which are stale.
    List(ListArgs),
}

/// `dsv4 kernels list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The kernel cache to read (default: the backend's, as for `compile`).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Delete the stale CUBINs (compiled from other kernel sources; never loaded again).
    #[arg(long)]
    pub prune: bool,
    /// Print one JSON document (schema dsv4.kernels/1) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The sums to compile the kernels with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Sums {
    /// The device's default: f64 on sm_80, sm_90 and sm_100 (full-rate FP64), f32 elsewhere.
    Auto,
    /// f64 sums (`backend.cuda_sums = "f64"`).
    F64,
    /// f32 sums (`backend.cuda_sums = "f32"`).
    F32,
    /// Both.
    Both,
}

/// `dsv4 kernels compile`.
#[derive(Debug, Args)]
pub struct CompileArgs {
    /// A compute capability to compile for: 9.0 or sm_90 (H100/H200), 12.0 or sm_120 (RTX PRO
    /// 6000), 8.0 (A100), …; repeatable.
    #[arg(long = "arch", value_name = "CC", required = true)]
    pub arch: Vec<String>,
    /// The sums the kernels accumulate in.
    #[arg(long, value_enum, default_value_t = Sums::Auto)]
    pub sums: Sums,
    /// The kernel cache to write (default: $DSV4_CACHE_DIR, else $XDG_CACHE_HOME/dsv4 or
    /// ~/.cache/dsv4, where the backend looks).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Also list what ptxas allocated for every kernel: registers, spills, shared memory, stack
    /// (always in the JSON).
    #[arg(long)]
    pub resources: bool,
    /// Print one JSON document (schema dsv4.kernels/1) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Run `dsv4 kernels …`.
pub fn run(cmd: &KernelsCommand) -> anyhow::Result<()> {
    match cmd {
        KernelsCommand::Compile(args) => compile(args),
        KernelsCommand::List(args) => list(args),
    }
}

/// `--cache-dir`, made absolute (the backend resolves `DSV4_CACHE_DIR` the same way).
fn cache_dir(dir: &Option<PathBuf>) -> anyhow::Result<Option<PathBuf>> {
    Ok(match dir {
        Some(d) if d.is_relative() => Some(std::env::current_dir()?.join(d)),
        other => other.clone(),
    })
}

fn list(args: &ListArgs) -> anyhow::Result<()> {
    let base = cache_dir(&args.cache_dir)?;
    let cubins = kernel_cache::list(base.as_deref()).context("reading the kernel cache")?;
    let mut pruned = 0u64;
    if args.prune {
        for c in cubins.iter().filter(|c| !c.current) {
            std::fs::remove_file(&c.path)
                .with_context(|| format!("removing {}", c.path.display()))?;
            pruned += c.bytes;
        }
    }
    let name = |c: &CachedCubin| format!("sm_{}{}", c.arch.0, c.arch.1);
    let sums = |c: &CachedCubin| if c.acc_f64 { "f64" } else { "f32" };
    let state = |c: &CachedCubin| match (c.current, args.prune) {
        (true, _) => "current",
        (false, false) => "stale",
        (false, true) => "pruned",
    };
    if args.json {
        let rows: Vec<_> = cubins
            .iter()
            .map(|c| {
                serde_json::json!({
                    "arch": name(c), "sums": sums(c), "path": c.path, "bytes": c.bytes,
                    "state": state(c),
                })
            })
            .collect();
        let doc =
            serde_json::json!({"schema": "dsv4.kernels/1", "cubins": rows, "pruned_bytes": pruned});
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    if cubins.is_empty() {
        println!("no CUBINs in the kernel cache (`dsv4 kernels compile --arch CC` fills it)");
    }
    for c in &cubins {
        println!(
            "{:<7} {}  {:<7} {:>9} bytes  {}",
            name(c),
            sums(c),
            state(c),
            c.bytes,
            c.path.display()
        );
    }
    if args.prune {
        println!("pruned {pruned} bytes of stale CUBINs");
    }
    Ok(())
}

fn compile(args: &CompileArgs) -> anyhow::Result<()> {
    // Every name is checked before the first (slow) compile.
    let arches = args
        .arch
        .iter()
        .map(|a| parse_capability(a).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()
        .context("--arch")?;
    let base = cache_dir(&args.cache_dir)?;
    let (major, minor) = nvrtc::version().context("compiling the kernels needs NVRTC")?;
    let mut done: Vec<(Precompiled, f64)> = Vec::new();
    for arch in arches {
        let sums = match args.sums {
            Sums::Auto => vec![default_acc_f64(arch)],
            Sums::F64 => vec![true],
            Sums::F32 => vec![false],
            Sums::Both => vec![true, false],
        };
        for acc_f64 in sums {
            let start = Instant::now();
            let c = precompile(base.as_deref(), arch, acc_f64)?;
            done.push((c, start.elapsed().as_secs_f64()));
        }
    }
    let name = |c: &Precompiled| format!("sm_{}{}", c.arch.0, c.arch.1);
    let sums = |c: &Precompiled| if c.acc_f64 { "f64" } else { "f32" };
    if args.json {
        let cubins: Vec<_> = done
            .iter()
            .map(|(c, secs)| {
                let kernels: Vec<_> = c
                    .resources
                    .iter()
                    .map(|k| {
                        serde_json::json!({
                            "name": k.name, "registers": k.registers,
                            "spill_stores": k.spill_stores, "spill_loads": k.spill_loads,
                            "shared_bytes": k.shared_bytes, "stack_bytes": k.stack_bytes,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "arch": name(c), "sums": sums(c), "path": c.path, "bytes": c.bytes,
                    "seconds": secs, "kernels": kernels,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "schema": "dsv4.kernels/1", "nvrtc": format!("{major}.{minor}"), "cubins": cubins,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("NVRTC {major}.{minor}");
    for (c, secs) in &done {
        println!(
            "{:<7} {}  {:>9} bytes  {secs:>5.1} s  {}",
            name(c),
            sums(c),
            c.bytes,
            c.path.display()
        );
        if args.resources {
            print!("{}", resource_table(&c.resources));
        }
        let spilling: Vec<&str> = c
            .resources
            .iter()
            .filter(|k| k.spill_stores + k.spill_loads > 0)
            .map(|k| k.name.as_str())
            .collect();
        if !spilling.is_empty() {
            println!(
                "  {} kernel(s) spill registers to local memory: {}",
                spilling.len(),
                spilling.join(", ")
            );
        }
    }
    Ok(())
}

/// One line per kernel, most registers first.
fn resource_table(resources: &[KernelResources]) -> String {
    let mut rows: Vec<&KernelResources> = resources.iter().collect();
    rows.sort_by(|a, b| b.registers.cmp(&a.registers).then(a.name.cmp(&b.name)));
    let mut out = format!(
        "  {:<40} {:>9} {:>12} {:>11} {:>11}\n",
        "kernel", "registers", "spill st/ld", "smem bytes", "stack bytes"
    );
    for k in rows {
        out.push_str(&format!(
            "  {:<40} {:>9} {:>12} {:>11} {:>11}\n",
            k.name,
            k.registers,
            format!("{}/{}", k.spill_stores, k.spill_loads),
            k.shared_bytes,
            k.stack_bytes
        ));
    }
    out
}
