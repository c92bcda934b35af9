//! `kvgate epp`: kvgate's policies as the endpoint picker of an Envoy-based gateway with the
//! Gateway API Inference Extension (ext_proc over gRPC). It takes `kvgate serve`'s flags and
//! configuration file; `--listen` is the gRPC address (default `127.0.0.1:9002`, the
//! extension's picker port) and `--admin-listen` serves `/metrics` and the admin API, which
//! need an admin token (`--admin-token` or `KVGATE_ADMIN_TOKEN`). Endpoints are the model servers the picker chooses among, by `ip:port`.

use crate::serve;
use anyhow::Context;
use kvgate_gateway::Gateway;

/// The extension's conventional picker port.
const DEFAULT_LISTEN: &str = "127.0.0.1:9002";

pub(crate) fn run(args: &serve::Args) -> anyhow::Result<()> {
    let mut config = serve::build_config(args)?;
    if args.listen.is_none() && config.listen == kvgate_gateway::Config::default().listen {
        config.listen = DEFAULT_LISTEN.into();
    }
    anyhow::ensure!(
        !config.endpoints.is_empty() || config.discovery.inference_pool.is_some(),
        "kvgate epp picks among model servers: give them with --endpoint URL, in the file, or \
         through `discovery.inference_pool`"
    );
    if args.checked(&config)? {
        return Ok(());
    }
    for e in &config.endpoints {
        let host = e.base_url().split("://").nth(1).unwrap_or_default();
        let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
        if host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_err()
        {
            tracing::warn!(
                endpoint = %e.url,
                "not an IP address: Envoy's override-host load balancing expects ip:port"
            );
        }
    }
    let runtime = crate::runtime(args.threads)?;
    runtime.block_on(async {
        let grpc = tokio::net::TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let http = match &config.admin_listen {
            Some(at) => Some(
                tokio::net::TcpListener::bind(at)
                    .await
                    .with_context(|| format!("binding the metrics listener {at}"))?,
            ),
            None => None,
        };
        let addr = grpc.local_addr()?;
        let metrics_at = match &http {
            Some(h) => format!(", metrics on http://{}", h.local_addr()?),
            None => String::new(),
        };
        let policy = config.policy.name();
        let gateway = Gateway::new(config)?;
        if let Some(path) = &args.config {
            gateway.watch_config(path.clone());
        }
        // One parseable line (gRPC over cleartext HTTP/2 on this address).
        println!(
            "kvgate epp listening on http://{addr} (ext_proc gRPC, policy {policy}{metrics_at})"
        );
        gateway
            .serve_epp(grpc, http, serve::wait_for_signal())
            .await?;
        Ok(())
    })
}
