//! Runs the benchmark from the command line: `cargo run -p kvgate-bench --example bench -- --url URL ...`
//! (the same flags as `kvgate bench`).

use clap::Parser;

/// `kvgate bench` flags.
#[derive(Parser, Debug)]
#[command(
    name = "bench",
    about = "Open-loop benchmark of OpenAI-compatible LLM endpoints"
)]
struct Cli {
    #[command(flatten)]
    bench: kvgate_bench::BenchArgs,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = kvgate_bench::run(&cli.bench).await {
        let mut msg = format!("error: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(&format!(": {s}"));
            source = s.source();
        }
        eprintln!("{msg}");
        std::process::exit(1);
    }
}
