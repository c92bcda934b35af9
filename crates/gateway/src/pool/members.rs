//! The pool's members that one source manages (the configuration file, a discovery).

use super::Pool;
use crate::endpoint_config::EndpointConfig;
use kvgate_core::EndpointId;

/// Endpoints one source manages (the file, a discovery), matched by base URL: [`Self::sync`]
/// makes the pool's members from this source exactly the ones wanted, leaving the others be.
#[derive(Debug, Default)]
pub(crate) struct EndpointSet {
    managed: Vec<EndpointId>,
}

impl EndpointSet {
    /// The members already in the pool that `endpoints` name.
    pub(crate) fn adopt(pool: &Pool, endpoints: &[EndpointConfig]) -> Self {
        let managed = pool
            .configs()
            .into_iter()
            .filter(|(_, c)| endpoints.iter().any(|e| e.base_url() == c.base_url()))
            .map(|(id, _)| id)
            .collect();
        EndpointSet { managed }
    }

    /// Wanted endpoints join (with blackout and slow start), missing ones leave (requests
    /// already sent there finish), the others take their new settings; returns the ids that
    /// joined (whose engines the caller starts watching) and how many left. New endpoints join
    /// before old ones leave, so a file that swaps one endpoint for another never leaves a
    /// moment with nothing to route to.
    pub(crate) fn sync(
        &mut self,
        pool: &Pool,
        wanted: &[EndpointConfig],
    ) -> (Vec<EndpointId>, usize) {
        let existing = pool.configs();
        let mut leaving = Vec::new();
        self.managed.retain(|id| {
            let Some((_, old)) = existing.iter().find(|(e, _)| e == id) else {
                return false; // removed meanwhile, e.g. through the admin API
            };
            match wanted.iter().find(|e| e.base_url() == old.base_url()) {
                Some(e) => {
                    if e != old {
                        pool.update(*id, e.clone());
                    }
                    true
                }
                None => {
                    leaving.push(*id);
                    false
                }
            }
        });
        let mut joined = Vec::new();
        for e in wanted {
            if !existing
                .iter()
                .any(|(_, old)| old.base_url() == e.base_url())
            {
                let id = pool.add(e.clone());
                self.managed.push(id);
                joined.push(id);
            }
        }
        for id in &leaving {
            pool.remove(*id);
        }
        (joined, leaving.len())
    }
}
