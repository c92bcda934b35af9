//! A fast OpenAI-compatible SSE server for measuring the bench itself (the test server of
//! `tests/common`). Usage: `sse_server ADDR [TOKENS] [TTFT_MS] [ITL_MS]`, e.g.
//! `cargo run --release -p kvgate-bench --example sse_server -- 127.0.0.1:9000 2`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = args.get(1).map_or("127.0.0.1:9000", String::as_str);
    let num = |i: usize| args.get(i).and_then(|s| s.parse::<u64>().ok());
    let config = common::ServerConfig {
        tokens: num(2).map(|t| t as u32),
        ttft: Duration::from_millis(num(3).unwrap_or(0)),
        itl: Duration::from_millis(num(4).unwrap_or(0)),
        ..common::ServerConfig::default()
    };
    let server = common::spawn_on(addr, config, false).await;
    println!("listening on http://{}", server.addr);
    std::future::pending::<()>().await;
}
