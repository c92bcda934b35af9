//! `kvgate epp`: kvgate's policies as an endpoint picker for an Envoy-based gateway with the
//! Gateway API Inference Extension (gateway-api-inference-extension.sigs.k8s.io). Envoy streams
//! each inference request to the picker over ext_proc gRPC; the picker parses the body as `kvgate
//! serve` would, picks with the configured policy and answers with the endpoint in the
//! `x-gateway-destination-endpoint` header and `envoy.lb` dynamic metadata; the response streams
//! back through it so the pool learns first tokens, usage and ends as if it had proxied the
//! request. Health follows the gRPC health protocol: `liveness` always serving; `readiness` and the
//! ext_proc service name serving while some endpoint is healthy and the picker is not shutting down
//! (as `/ready` of `kvgate serve`), checked every 250 ms.

mod exchange;
mod wire;

use crate::state::Shared;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};

/// The ext_proc service.
pub(crate) struct Picker {
    shared: Arc<Shared>,
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Answers>, Status> {
        let mut inbound = request.into_inner();
        let mut exchange = exchange::Exchange::new(self.shared.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                for answer in exchange.on(message) {
                    if tx.send(Ok(answer)).await.is_err() {
                        return;
                    }
                }
            }
        });
        let answers = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|answer| (answer, rx))
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

/// The gRPC services: ext_proc and health.
pub(crate) async fn services(
    shared: Arc<Shared>,
) -> (
    ExternalProcessorServer<Picker>,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("liveness", tonic_health::ServingStatus::Serving)
        .await;
    let mut ready = Readiness {
        shared: shared.clone(),
        reporter,
        last: None,
    };
    ready.check().await;
    tokio::spawn(ready.watch());
    (ExternalProcessorServer::new(Picker { shared }), health)
}

/// Keeps `readiness` (and the ext_proc service's status) in step with the pool.
struct Readiness {
    shared: Arc<Shared>,
    reporter: tonic_health::server::HealthReporter,
    last: Option<bool>,
}

impl Readiness {
    async fn check(&mut self) {
        let ready = !self
            .shared
            .draining
            .load(std::sync::atomic::Ordering::Relaxed)
            && self.shared.pool.any_healthy();
        if self.last == Some(ready) {
            return;
        }
        self.last = Some(ready);
        let status = if ready {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        for service in [
            "",
            "readiness",
            "envoy.service.ext_proc.v3.ExternalProcessor",
        ] {
            self.reporter.set_service_status(service, status).await;
        }
    }

    async fn watch(mut self) {
        let mut stop = self.shared.stop.subscribe();
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
        loop {
            tokio::select! {
                _ = tick.tick() => self.check().await,
                _ = stop.changed() => return,
            }
        }
    }
}
