//! Routers sharing what they do, as gateway replicas would over a message bus (`kvgate serve
//! --cluster`): each router's dispatches, first tokens and completions reach every other
//! router [`super::FleetConfig::share`] later, and each applies them as its own
//! ([`kvgate_core::dispatch::Dispatcher::peer_dispatched`]), so replicas see each other's in-flight load and
//! prefix placements instead of only their own share of the traffic.

use super::{Kind, Sim};
use kvgate_core::{EndpointId, Nanos, Request, Usage};

/// One router's news for one peer.
#[derive(Clone)]
pub(super) enum News {
    Dispatched(Box<Request>, EndpointId),
    FirstToken {
        id: u64,
        endpoint: EndpointId,
        ttft: Nanos,
    },
    Done {
        id: u64,
        endpoint: EndpointId,
        usage: Usage,
        e2e: Nanos,
        output: u32,
    },
}

impl Sim<'_> {
    /// Router `from` did `news`: every other router hears of it after the sharing delay (no
    /// one does when routers do not share).
    pub(super) fn share(&mut self, from: usize, news: News) {
        let Some(delay) = self.config.share else {
            return;
        };
        for to in (0..self.routers.len()).filter(|&to| to != from) {
            let slot = match self.free_news.pop() {
                Some(i) => {
                    self.news[i] = Some((to, news.clone()));
                    i
                }
                None => {
                    self.news.push(Some((to, news.clone())));
                    self.news.len() - 1
                }
            };
            self.push(self.now + delay, Kind::News, slot as u64);
        }
    }

    /// A peer's news reaches its router.
    pub(super) fn hear(&mut self, slot: usize) {
        let Some((to, news)) = self.news[slot].take() else {
            return;
        };
        self.free_news.push(slot);
        let now = self.now;
        let alive = |e: EndpointId| self.replicas[e.0 as usize].alive;
        let router = &mut self.routers[to];
        match news {
            News::Dispatched(request, endpoint) if alive(endpoint) => {
                router.peer_dispatched(&request, endpoint, now);
            }
            News::FirstToken { id, endpoint, ttft } if alive(endpoint) => {
                router.peer_first_token(id, endpoint, now, ttft);
            }
            News::Done {
                id,
                endpoint,
                usage,
                e2e,
                output,
            } if alive(endpoint) => {
                let end = kvgate_core::dispatch::End::Completed {
                    latency: e2e,
                    output_tokens: output,
                    usage: Some(usage),
                };
                router.peer_ended((id, endpoint), end, now);
            }
            _ => {}
        }
    }
}
