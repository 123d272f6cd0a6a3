//! Agents waiting to hear that their assignments changed
//! (`POST /internal/v1/agents/{id}/changes`, a long poll): a committed plan
//! wakes the agents of the nodes it placed or preempted on, which sync at
//! once instead of at their next interval, so a placed worker starts (and
//! a victim starts its checkpoint) within a round trip of the commit.
//!
//! In memory, in the process that commits the plan: an agent whose long
//! poll reached another replica hears nothing from it and syncs on its
//! interval as before. A wake that comes after a poll registered but before
//! it waits is kept (a permit of the watch's [`Notify`]); one between two
//! polls of an agent is dropped — the sync that follows the first poll
//! reads whatever changed before it, and a change after that read and
//! before the next poll waits for the interval, as every change did before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The registry of waiting agents, by node. One per region process
/// ([`super::Store`], shared by its clones).
#[derive(Debug, Default)]
pub struct AgentWakes {
    by_node: Mutex<HashMap<String, Arc<Notify>>>,
}

/// One agent's long poll, registered under each of its nodes until dropped
/// (the request answered or cancelled).
pub struct Watch<'a> {
    wakes: &'a AgentWakes,
    nodes: Vec<String>,
    notify: Arc<Notify>,
}

impl AgentWakes {
    /// Registers a watch of `nodes`, replacing any earlier one of theirs
    /// (an agent polls once at a time; a poll it gave up on is dropped).
    pub fn watch(&self, nodes: Vec<String>) -> Watch<'_> {
        let notify = Arc::new(Notify::new());
        let mut by_node = self.by_node.lock().expect("agent wakes lock");
        for n in &nodes {
            by_node.insert(n.clone(), notify.clone());
        }
        drop(by_node);
        Watch {
            wakes: self,
            nodes,
            notify,
        }
    }

    /// Wakes the watches of these nodes (each once, however many of its
    /// nodes are named: a [`Notify`] keeps at most one permit, and a poll
    /// answers once).
    pub fn wake<'n>(&self, nodes: impl IntoIterator<Item = &'n str>) {
        let by_node = self.by_node.lock().expect("agent wakes lock");
        for notify in nodes.into_iter().filter_map(|n| by_node.get(n)) {
            notify.notify_one();
        }
    }

    /// Whether any agent is waiting (a wake would reach someone).
    pub fn any_waiting(&self) -> bool {
        !self.by_node.lock().expect("agent wakes lock").is_empty()
    }

    /// Nodes with a watch registered.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.by_node.lock().expect("agent wakes lock").len()
    }
}

impl Watch<'_> {
    /// Until a plan touches one of the nodes (at once if one did since the
    /// watch was registered).
    pub async fn changed(&self) {
        self.notify.notified().await
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut by_node = self.wakes.by_node.lock().expect("agent wakes lock");
        for n in &self.nodes {
            // Only our own registration: a newer poll of the agent's stays.
            if by_node.get(n).is_some_and(|w| Arc::ptr_eq(w, &self.notify)) {
                by_node.remove(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn nodes(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    async fn woken(w: &Watch<'_>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), w.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_plan_wakes_the_watches_of_its_nodes_only() {
        let wakes = AgentWakes::default();
        let a = wakes.watch(nodes(&["n1", "n2"]));
        let b = wakes.watch(nodes(&["n3"]));
        // Before anyone waits: kept until the watch is awaited.
        wakes.wake(["n2", "n1", "n9"]);
        assert!(woken(&a).await);
        assert!(!woken(&a).await, "two of its nodes wake it once");
        assert!(!woken(&b).await);
        wakes.wake(["n3"]);
        assert!(woken(&b).await);
    }

    #[tokio::test]
    async fn a_finished_poll_leaves_no_registration_and_spares_a_newer_one() {
        let wakes = AgentWakes::default();
        let old = wakes.watch(nodes(&["n1", "n2"]));
        let new = wakes.watch(nodes(&["n1"]));
        drop(old);
        // n2 was the old poll's alone; n1 is the newer one's now.
        assert_eq!(wakes.watched(), 1);
        wakes.wake(["n1"]);
        assert!(woken(&new).await);
        assert!(wakes.any_waiting());
        drop(new);
        assert_eq!(wakes.watched(), 0);
        assert!(!wakes.any_waiting(), "nobody to wake: nothing to read for");
        // Nobody watches: a wake is dropped, not kept for a later poll.
        wakes.wake(["n1"]);
        let later = wakes.watch(nodes(&["n1"]));
        assert!(!woken(&later).await);
    }
}
