//! Which model names are LoRA adapters: those an engine's `/v1/models` lists with a `parent`
//! (vLLM lists each adapter after its base model that way). A request naming one carries the
//! adapter into routing (`kvgate_core::lora`): adapter-scoped prefix keys and the
//! adapter-affinity term of the policy.

use super::Pool;

impl Pool {
    /// Adds adapter names an engine listed.
    pub fn note_adapters(&self, names: Vec<String>) {
        if names.is_empty() {
            return;
        }
        let mut adapters = self.adapters.write().unwrap_or_else(|e| e.into_inner());
        adapters.extend(names);
    }

    /// `endpoint` loaded `adapter` at the gateway's request (`lora.on_demand`): it serves the
    /// adapter from now on, without waiting for the next `/v1/models` refresh to list it.
    pub fn adapter_loaded(&self, endpoint: super::EndpointId, adapter: &str) {
        self.note_adapters(vec![adapter.to_owned()]);
        let mut core = self.lock();
        let Some(e) = core.endpoint_mut(endpoint) else {
            return;
        };
        if e.about.models.iter().any(|m| m == adapter) {
            return;
        }
        let mut models = e.about.models.clone();
        models.push(adapter.to_owned());
        e.about = std::sync::Arc::new(super::About::new(e.about.config.clone(), models));
        let serving = e.about.serving.clone();
        core.dispatch.set_serving(endpoint, serving);
        self.publish(&core);
    }

    /// Whether `endpoint`'s configuration names its model (else its models are discovered).
    pub fn model_configured(&self, endpoint: super::EndpointId) -> bool {
        self.snapshot
            .load()
            .get(endpoint)
            .is_none_or(|e| e.about.config.model.is_some())
    }

    /// Keeps `endpoint`'s adapter report for the admin API (read without the core's lock).
    pub(crate) fn note_adapter_report(
        &self,
        endpoint: super::EndpointId,
        report: Option<kvgate_core::lora::AdapterState>,
    ) {
        let mut reports = self
            .adapter_reports
            .write()
            .unwrap_or_else(|e| e.into_inner());
        match report {
            Some(state) => reports.insert(endpoint, state),
            None => reports.remove(&endpoint),
        };
    }

    /// Each endpoint's adapters as its engine last reported them (for the admin API).
    pub(crate) fn adapter_states(
        &self,
    ) -> std::collections::BTreeMap<super::EndpointId, kvgate_core::lora::AdapterState> {
        self.adapter_reports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The `Authorization` header requests to `endpoint` carry (its `api_key`).
    pub(crate) fn authorization_of(
        &self,
        endpoint: super::EndpointId,
    ) -> Option<axum::http::HeaderValue> {
        let snapshot = self.snapshot.load();
        snapshot.get(endpoint)?.about.authorization.clone()
    }

    /// The adapter names engines listed, sorted.
    pub fn adapter_names(&self) -> Vec<String> {
        let adapters = self.adapters.read().unwrap_or_else(|e| e.into_inner());
        adapters.iter().cloned().collect()
    }

    /// The adapter a request for `model` uses, when `model` is an adapter's name or SGLang's
    /// `base:adapter` naming one (split at the first `:`, as SGLang splits it).
    pub fn adapter_named(&self, model: &str) -> Option<String> {
        let adapters = self.adapters.read().unwrap_or_else(|e| e.into_inner());
        if adapters.contains(model) {
            return Some(model.to_owned());
        }
        let (_, adapter) = model.split_once(':')?;
        adapters.contains(adapter).then(|| adapter.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::endpoint_config::EndpointConfig;
    use crate::pool::{Attempt, PoolMetrics};
    use kvgate_core::Request;

    #[test]
    fn base_colon_adapter_goes_where_the_adapter_is_listed_named_as_vllm_wants() {
        let mut config = crate::Config::default();
        config.set_policy("round_robin").unwrap();
        let pool = Pool::new(
            &config.pool_settings(),
            Clock::manual(),
            PoolMetrics::register(&mut Default::default()),
            7,
        );
        let with = pool.add(EndpointConfig::from_url("http://with:1"));
        let without = pool.add(EndpointConfig::from_url("http://without:1"));
        pool.set_models(with, vec!["base".into(), "sql".into()]);
        pool.set_models(without, vec!["base".into()]);
        pool.note_adapters(vec!["sql".into()]);
        assert_eq!(pool.adapter_named("base:sql").as_deref(), Some("sql"));
        assert_eq!(pool.adapter_named("sql").as_deref(), Some("sql"));
        assert_eq!(pool.adapter_named("base:chat"), None);
        assert!(pool.serves("base:sql") && !pool.serves("base:chat"));
        for id in 0..4 {
            let request = Request {
                model: Some("base:sql".into()),
                adapter: Some("sql".into()),
                ..Request::from_text(id, "hello")
            };
            let t = pool.pick(&request, &[], Attempt::First).unwrap();
            assert_eq!(t.id, with, "only the endpoint listing the adapter");
            assert_eq!(t.send_model.as_deref(), Some("sql"));
        }
        let base = Request {
            model: Some("base".into()),
            ..Request::from_text(9, "hello")
        };
        let t = pool.pick(&base, &[], Attempt::First).unwrap();
        assert_eq!(t.send_model, None, "the base model's name is left alone");
    }
}
