//! The engine's LoRA adapters (semantics in [`crate::model::lora`]): which waiting request may be
//! admitted under `max_loras`, the load of an adapter not in memory, and the adapter gauges.

use super::{EngineModel, ENGINE_HASH_SEED};
use crate::model::lora::{LoraConfig, LoraStats};
use crate::model::SeqRequest;
use kvgate_core::index::blocks::adapter_scope;
use kvgate_core::Nanos;
use std::collections::VecDeque;

/// Adapter names and the in-memory cache.
#[derive(Clone, Debug)]
pub(super) struct Adapters {
    config: LoraConfig,
    /// Every adapter seen; a sequence's `adapter` is an index here plus one.
    names: Vec<String>,
    /// Adapters in memory, least recently used first.
    resident: VecDeque<u32>,
    /// Loads made in the iteration being scheduled.
    pending_loads: u32,
    loads: u64,
}

impl EngineModel {
    /// Serves LoRA adapters under `config` (off by default: requests name none).
    pub fn with_lora(mut self, config: LoraConfig) -> Self {
        let config = LoraConfig {
            max_loras: config.max_loras.max(1),
            max_cpu_loras: config.max_cpu_loras.max(config.max_loras).max(1),
            ..config
        };
        self.lora = Some(Adapters {
            config,
            names: Vec::new(),
            resident: VecDeque::new(),
            pending_loads: 0,
            loads: 0,
        });
        self
    }

    /// Queues a request for `adapter` (`None`: the base model) as [`EngineModel::submit`] does.
    /// An adapter on an engine without [`EngineModel::with_lora`] serves as the base model.
    pub fn submit_with_adapter(&mut self, request: SeqRequest, adapter: Option<&str>) {
        let (Some(name), Some(lora)) = (adapter, self.lora.as_mut()) else {
            return self.submit(request);
        };
        let index = match lora.names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                lora.names.push(name.to_owned());
                lora.names.len() - 1
            }
        };
        let seed = adapter_scope(name, ENGINE_HASH_SEED);
        self.submit_seeded(request, index as u32 + 1, seed);
    }

    /// The adapter gauges, when the engine serves adapters.
    pub fn lora_stats(&self) -> Option<LoraStats> {
        let lora = self.lora.as_ref()?;
        let names = |ids: &mut dyn Iterator<Item = &u64>| {
            let mut out: Vec<String> = Vec::new();
            for id in ids {
                if let Some(name) = self.adapter_name(self.seqs[id].adapter) {
                    if !out.contains(&name) {
                        out.push(name);
                    }
                }
            }
            out
        };
        Some(LoraStats {
            max_loras: lora.config.max_loras,
            running: names(&mut self.running.iter()),
            waiting: names(&mut self.waiting.iter()),
            loads: lora.loads,
        })
    }

    /// The name of adapter `adapter` (0, the base model, has none).
    pub(super) fn adapter_name(&self, adapter: u32) -> Option<String> {
        let lora = self.lora.as_ref()?;
        let i = adapter.checked_sub(1)?;
        lora.names.get(i as usize).cloned()
    }

    /// The queue position of the first waiting request that may join the batch: a base-model
    /// request, one whose adapter runs, or one for which a slot is free.
    pub(super) fn admissible(&self) -> Option<usize> {
        let Some(lora) = &self.lora else {
            return (!self.waiting.is_empty()).then_some(0);
        };
        let mut running: Vec<u32> = self
            .running
            .iter()
            .map(|id| self.seqs[id].adapter)
            .filter(|&a| a != 0)
            .collect();
        running.sort_unstable();
        running.dedup();
        self.waiting.iter().position(|id| {
            let a = self.seqs[id].adapter;
            a == 0 || running.contains(&a) || running.len() < lora.config.max_loras
        })
    }

    /// Request `id` joins the batch: its adapter is loaded if it is not in memory.
    pub(super) fn adapter_admitted(&mut self, id: u64) {
        let adapter = self.seqs[&id].adapter;
        let Some(lora) = self.lora.as_mut().filter(|_| adapter != 0) else {
            return;
        };
        if let Some(i) = lora.resident.iter().position(|&a| a == adapter) {
            lora.resident.remove(i);
        } else {
            lora.pending_loads += 1;
            lora.loads += 1;
            if lora.resident.len() >= lora.config.max_cpu_loras {
                lora.resident.pop_front();
            }
        }
        lora.resident.push_back(adapter);
    }

    /// The time the adapters loaded in this iteration add to it.
    pub(super) fn take_adapter_loads(&mut self) -> Nanos {
        let Some(lora) = self.lora.as_mut() else {
            return Nanos::ZERO;
        };
        let n = std::mem::take(&mut lora.pending_loads);
        Nanos(lora.config.load.0.saturating_mul(u64::from(n)))
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{
        Batching, CostModel, EngineConfig, EngineModel, LoraConfig, SeqEvent, SeqRequest,
        TICK_NANOS,
    };
    use kvgate_core::index::blocks::KvEvent;
    use kvgate_core::Nanos;

    fn engine(max_loras: usize) -> EngineModel {
        EngineModel::new(EngineConfig {
            max_num_seqs: 8,
            kv_blocks: 200,
            block_size: 16,
            batching: Batching::Continuous,
            prefix_caching: true,
            cost: CostModel::unit(),
        })
        .with_lora(LoraConfig {
            max_loras,
            max_cpu_loras: max_loras,
            load: Nanos(5 * TICK_NANOS),
        })
    }

    fn req(id: u64, out: u32) -> SeqRequest {
        SeqRequest {
            id,
            prompt: (0..40).collect(),
            max_output_tokens: out,
        }
    }

    fn first_tokens(it: &crate::model::Iteration) -> Vec<u64> {
        it.events
            .iter()
            .filter_map(|e| match e {
                SeqEvent::FirstToken { id, .. } => Some(*id),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_request_for_a_second_adapter_is_skipped_while_the_first_runs() {
        let mut e = engine(1);
        e.submit_with_adapter(req(1, 3), Some("a"));
        e.submit_with_adapter(req(2, 3), Some("b"));
        e.submit_with_adapter(req(3, 3), Some("a"));
        e.submit(req(4, 3));
        let it = e.step().unwrap();
        assert_eq!(
            first_tokens(&it),
            [1, 3, 4],
            "b is skipped, later a and base pass it"
        );
        assert_eq!(
            it.duration,
            Nanos(6 * TICK_NANOS),
            "one iteration plus loading a"
        );
        let stats = e.lora_stats().unwrap();
        assert_eq!(
            (stats.running, stats.waiting),
            (vec!["a".into()], vec!["b".into()])
        );
        let mut b_first = None;
        for step in 1..10 {
            let it = e.step().unwrap();
            if first_tokens(&it).contains(&2) {
                b_first = Some((step, it.duration));
                break;
            }
        }
        let (step, duration) = b_first.expect("b runs once a has drained");
        assert_eq!(step, 3, "after a's two decodes");
        assert_eq!(duration, Nanos(6 * TICK_NANOS), "b is loaded, a evicted");
        assert_eq!(e.lora_stats().unwrap().loads, 2);
    }

    #[test]
    fn adapters_do_not_share_prefix_blocks_and_events_name_them() {
        let mut e = engine(2);
        e.submit(req(1, 1));
        e.submit_with_adapter(req(2, 1), Some("a"));
        let it = e.step().unwrap();
        let names: Vec<Option<String>> = it
            .kv_events
            .iter()
            .filter_map(|ev| match ev {
                KvEvent::BlockStored { lora_name, .. } => Some(lora_name.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(names, [None, Some("a".to_owned())]);
        e.submit_with_adapter(req(3, 1), Some("a"));
        e.submit_with_adapter(req(4, 1), Some("b"));
        let it = e.step().unwrap();
        let cached: Vec<(u64, u32)> = it
            .events
            .iter()
            .filter_map(|ev| match ev {
                SeqEvent::FirstToken { id, cached_tokens } => Some((*id, *cached_tokens)),
                _ => None,
            })
            .collect();
        assert_eq!(cached, [(3, 32), (4, 0)], "a's blocks serve a only");
    }
}
