//! What prefill/decode disaggregation reads of the pool: each endpoint's role and state from
//! the published snapshot (no lock), and what the prefix cache holds of a prompt on each.

use super::Pool;
use crate::endpoint_config::EndpointRole;
use kvgate_core::{EndpointId, Health, Request};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One endpoint as disaggregation sees it.
#[derive(Clone, Debug)]
pub struct RoleMember {
    /// Identity.
    pub id: EndpointId,
    /// Display name.
    pub name: Arc<str>,
    /// Base URL.
    pub base: Arc<str>,
    /// Its role.
    pub role: EndpointRole,
    /// SGLang's bootstrap port, when configured.
    pub bootstrap_port: Option<u16>,
    /// Whether it takes traffic now (healthy, not draining).
    pub healthy: bool,
    /// Sequences its engine runs (last scrape), else this gateway's requests in flight there.
    pub running: u32,
}

impl Pool {
    /// Whether any endpoint prefills only: disaggregation then applies.
    pub fn has_prefill_endpoints(&self) -> bool {
        self.snapshot.load().has_prefill
    }

    /// Every endpoint serving `model`, with its role.
    pub fn role_members(&self, model: Option<&str>) -> Vec<RoleMember> {
        let now = self.clock.now();
        let snapshot = self.snapshot.load();
        snapshot
            .endpoints
            .iter()
            .filter(|e| e.about.serves(model))
            .map(|e| RoleMember {
                id: e.id,
                name: e.about.name.clone(),
                base: e.about.base.clone(),
                role: e.about.config.role,
                bootstrap_port: e.about.config.bootstrap_port,
                healthy: e.health(now) == Health::Healthy,
                running: e
                    .observation
                    .map_or_else(|| e.inflight.load(Ordering::Relaxed), |o| o.running),
            })
            .collect()
    }

    /// Prompt tokens of `request` the prefix cache believes each of `endpoints` holds.
    pub fn cached_tokens(&self, request: &Request, endpoints: &[EndpointId]) -> Vec<u32> {
        let overlaps = self.lookup(request, self.clock.now());
        endpoints
            .iter()
            .map(|&e| overlaps.tokens(overlaps.of(e).total(), request.prompt_tokens))
            .collect()
    }
}
