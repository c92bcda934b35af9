//! `kvgate bench`: open-loop load against any OpenAI-compatible URL, with goodput under an SLO.

use anyhow::Context;

/// Flags of `kvgate bench` (defined by kvgate-bench).
pub(crate) type Args = kvgate_bench::BenchArgs;

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(kvgate_bench::run(args))?;
    Ok(())
}
