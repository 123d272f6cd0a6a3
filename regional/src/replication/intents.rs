//! Group commit of new jobs' intents (issue 23). A create is acknowledged
//! only once a buddy region holds its intent; creates that arrive while a
//! hand-over to the same buddy is under way wait for the next one and go
//! together: one request to the buddy, one commit there
//! (`Store::hold_intents`), one commit here marking them held
//! (`Store::replicated_many`). "Acknowledged means held by two regions"
//! is unchanged: every create's answer still waits for its own intent's
//! commit at the buddy.
//!
//! Creates queue by the first buddy of their rendezvous order, each queue
//! with at most one hand-over in flight, so a buddy that does not answer
//! holds up only the creates that would have waited for it anyway. Intents
//! that buddy refuses or never takes go, still batched, to each one's next
//! buddy in order, as `replicate_intent` would take them one at a time.
//! Intents every buddy that answered refused (each was being evacuated:
//! in a cloud of two regions, the other one) go round once more as a last
//! resort, which an evacuating region takes: it still holds the intent (it
//! is alive, it only runs no work), so a job runs with its intent in two
//! regions rather than not at all while the other region is evacuated.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::peers::{PeerError, Peers};
use crate::store::replicas::Intent;
use crate::store::Store;

/// The most intents in one request to a buddy; more wait for the next.
pub const MAX_BATCH: usize = 256;

/// `POST /internal/v1/replicas/intents/batch`'s body.
#[derive(Debug, Serialize, Deserialize)]
pub struct IntentBatch {
    pub intents: Vec<Intent>,
    /// Every buddy of these intents refused them: a region being
    /// evacuated holds them anyway.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_resort: bool,
}

/// Its answer: which jobs' intents the buddy now holds, and which it
/// refused (a region being evacuated takes no new job's intent).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BatchAnswer {
    pub held: Vec<Uuid>,
    #[serde(default)]
    pub refused: Vec<Uuid>,
}

/// What became of a create's intent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Held by this buddy, and the job marked so here: acknowledge it.
    Marked(String),
    /// Held by this buddy, but marking it here failed: the create marks
    /// it itself (`Store::replicated`), so that its error is its own.
    Unmarked(String),
    /// No buddy took it.
    Nobody,
}

struct Waiting {
    intent: Intent,
    /// Its buddies, in the job's rendezvous order (on the last resort
    /// round: those that refused it).
    order: Vec<String>,
    /// The next buddy of `order` to ask.
    next: usize,
    /// Buddies that answered and refused it.
    refused_by: Vec<String>,
    last_resort: bool,
    done: oneshot::Sender<Taken>,
}

impl Waiting {
    /// The buddy to ask next, or `None` once none is left: then, if some
    /// refused it (rather than not answering), they are asked again as a
    /// last resort, once.
    fn next_buddy(&mut self) -> Option<String> {
        if self.next >= self.order.len() && !self.last_resort && !self.refused_by.is_empty() {
            self.order = std::mem::take(&mut self.refused_by);
            (self.next, self.last_resort) = (0, true);
        }
        let b = self.order.get(self.next).cloned();
        self.next += 1;
        b
    }
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    /// A hand-over from this queue is under way (it takes the waiting
    /// ones next).
    flushing: bool,
}

/// The region's queues of intents, by first buddy. One per region process
/// (`AppState::intents`).
#[derive(Default)]
pub struct IntentBatcher {
    queues: Mutex<HashMap<String, Queue>>,
}

impl IntentBatcher {
    /// Hands `intent` to its buddies with whatever other creates are
    /// waiting for the same one, and waits for the outcome.
    pub async fn hold(
        self: &Arc<Self>,
        store: &Store,
        peers: &Arc<Peers>,
        intent: Intent,
    ) -> Taken {
        let order: Vec<String> = (peers.buddies_of(intent.job_id).into_iter())
            .map(String::from)
            .collect();
        let Some(first) = order.first().cloned() else {
            return Taken::Nobody;
        };
        let (done, outcome) = oneshot::channel();
        let start = {
            let mut queues = self.queues.lock().expect("intent queues lock");
            let q = queues.entry(first.clone()).or_default();
            q.waiting.push(Waiting {
                intent,
                order,
                next: 0,
                refused_by: Vec::new(),
                last_resort: false,
                done,
            });
            !std::mem::replace(&mut q.flushing, true)
        };
        if start {
            // Its own task: a create whose client went away must not take
            // the others' hand-over with it.
            let (this, store, peers) = (self.clone(), store.clone(), peers.clone());
            tokio::spawn(async move { this.flush(&store, &peers, &first).await });
        }
        outcome.await.unwrap_or(Taken::Nobody)
    }

    /// Hands over `first`'s queue, a batch at a time, until it is empty.
    async fn flush(&self, store: &Store, peers: &Peers, first: &str) {
        loop {
            let batch = {
                let mut queues = self.queues.lock().expect("intent queues lock");
                let q = queues.get_mut(first).expect("a flushing queue stays");
                if q.waiting.is_empty() {
                    q.flushing = false;
                    return;
                }
                let n = q.waiting.len().min(MAX_BATCH);
                q.waiting.drain(..n).collect::<Vec<_>>()
            };
            hand_over(store, peers, batch).await;
        }
    }
}

/// Hands a batch to each intent's buddies in order, marks those taken and
/// answers every create.
async fn hand_over(store: &Store, peers: &Peers, batch: Vec<Waiting>) {
    metrics::histogram!("gangway_intent_batch_size").record(batch.len() as f64);
    // A buddy gets half the lease to answer before the next is tried: one
    // whose packets vanish (a cut link) must not hold up a create, or an
    // adoption in the beat, for a whole request timeout.
    let patience = peers.config.lease / 2;
    let mut left = batch;
    let mut taken: Vec<(Waiting, String)> = Vec::new();
    while !left.is_empty() {
        let mut by_buddy: BTreeMap<(String, bool), Vec<Waiting>> = BTreeMap::new();
        for mut w in left.drain(..) {
            match w.next_buddy() {
                Some(b) => by_buddy.entry((b, w.last_resort)).or_default().push(w),
                None => {
                    let _ = w.done.send(Taken::Nobody);
                }
            }
        }
        for ((buddy, last_resort), items) in by_buddy {
            let intents: Vec<&Intent> = items.iter().map(|w| &w.intent).collect();
            let sent = std::time::Instant::now();
            let send = send(peers, &buddy, &intents, last_resort);
            let held = match tokio::time::timeout(patience, send).await {
                Ok(r) => r,
                Err(_) => Err(PeerError::Timeout {
                    peer: buddy.clone(),
                    after: patience,
                }),
            };
            metrics::histogram!("gangway_intent_handover_seconds", "step" => "buddy")
                .record(sent.elapsed().as_secs_f64());
            match held {
                Ok(held) => {
                    for mut w in items {
                        if held.contains(&w.intent.job_id) {
                            taken.push((w, buddy.clone()));
                        } else {
                            w.refused_by.push(buddy.clone());
                            left.push(w);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, buddy, intents = items.len(), "a buddy did not take a batch of intents");
                    left.extend(items);
                }
            }
        }
    }
    if taken.is_empty() {
        return;
    }
    let pairs: Vec<(Uuid, &str)> = (taken.iter())
        .map(|(w, b)| (w.intent.job_id, b.as_str()))
        .collect();
    let marking = std::time::Instant::now();
    let marked = store.replicated_many(&pairs).await;
    metrics::histogram!("gangway_intent_handover_seconds", "step" => "mark")
        .record(marking.elapsed().as_secs_f64());
    if let Err(e) = &marked {
        tracing::warn!(error = %e, jobs = pairs.len(), "marking a batch of intents held failed: each create marks its own");
    }
    metrics::counter!("gangway_intents_replicated_total").increment(taken.len() as u64);
    for (w, buddy) in taken {
        let _ = w.done.send(match marked {
            Ok(()) => Taken::Marked(buddy),
            Err(_) => Taken::Unmarked(buddy),
        });
    }
}

/// One request to `buddy` with these intents; the jobs it now holds. A
/// buddy that predates batches (404) is sent them one at a time.
async fn send(
    peers: &Peers,
    buddy: &str,
    intents: &[&Intent],
    last_resort: bool,
) -> Result<BTreeSet<Uuid>, PeerError> {
    let body = BatchBody {
        intents,
        last_resort,
    };
    let path = "/internal/v1/replicas/intents/batch";
    match peers.post::<_, BatchAnswer>(buddy, path, &body).await {
        Ok(a) => Ok(a.held.into_iter().collect()),
        Err(PeerError::Refused { status: 404, .. }) => {
            let mut held = BTreeSet::new();
            for i in intents {
                let one =
                    peers.post::<_, serde_json::Value>(buddy, "/internal/v1/replicas/intents", i);
                if one.await.is_ok() {
                    held.insert(i.job_id);
                }
            }
            Ok(held)
        }
        Err(e) => Err(e),
    }
}

/// [`IntentBatch`] as sent, borrowing the intents.
#[derive(Serialize)]
struct BatchBody<'a> {
    intents: &'a [&'a Intent],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    last_resort: bool,
}
