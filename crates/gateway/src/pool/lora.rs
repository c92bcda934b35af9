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

    /// The adapter a request for `model` uses, when `model` is an adapter's name.
    pub fn adapter_named(&self, model: &str) -> Option<String> {
        let adapters = self.adapters.read().unwrap_or_else(|e| e.into_inner());
        adapters.contains(model).then(|| model.to_owned())
    }
}
