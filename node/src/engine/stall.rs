//! A replica that stops answering. A replica whose node process is frozen,
//! whose network drops packets without a reset, or whose disk hangs keeps
//! its connection open and answers nothing: the writes the engine fans out
//! to it would wait for it for ever, and with them the volume.
//!
//! The engine watches each remote replica's oldest unanswered request of
//! the volume's I/O (`ReplicaClient::stalled_for`); a replica with none
//! waiting is sent a PING at each look, timed the same way, so that an
//! idle volume sees a frozen replica as a busy one does. One that has
//! waited longer than the replica timeout (`engine-replica-timeout`)
//! is given up once another rw replica proves that it answers: the others
//! are asked for their INFO right then (a replica with nothing asked of it
//! proves nothing by its silence), and the lent replica counts as
//! answering. Given up, its connection is abandoned, so its requests fail
//! as if the connection were lost, and the engine drops the replica as it
//! drops one that failed an I/O (its record of the replica set changes
//! first; the planner rebuilds or reuses the replica later). A replica
//! given up that a rebuild copies from ends that rebuild
//! (`end_rebuilds_from`): the fill reads it over its target's own
//! connection and would wait for it as long. When no other
//! rw replica answers, none is given up: dropping them all would fail the
//! volume's I/O, where waiting may still see it through.
//!
//! The lent replica's I/O runs on the engine's own threads: a write held
//! on its disk holds the thread too, and may hold every async worker
//! behind it, so the async watch could not run. A thread of its own
//! watches it (`watch_lent`): one that has held a write, a read or a
//! flush past the timeout while a remote rw replica answers (it has no request
//! older than the timeout: each was sent the write the local one holds)
//! is given up (`Lent::give_up`), the hung write answered with an error,
//! and the replica dropped as above. The engine says so
//! (`Engine::lent_given_up`): a frontend whose task the disk holds hands
//! that task's work to another.
//!
//! A snapshot, a growth and a rebuild's join pause the volume's I/O while
//! each replica answers a request no timeout may bound (a freeze reads the
//! whole head). Before such a pause (for a rebuild, before its source is
//! chosen: every rw replica is asked for its layers), each remote replica
//! is asked for its INFO, and one that does not answer within the replica
//! timeout while another answers is given up first (`give_up_silent`): a
//! replica frozen on an idle volume would otherwise hold the pause, and
//! the volume, for as long as it stays frozen. The replica joining, no
//! member yet, is asked only what is quick (its INFO; under the pause its
//! join and a spare's reads): it is given up when it leaves that
//! unanswered for the replica timeout (`joining_answer`), its node frozen
//! after its dial.
//!
//! It owns no state of its own: it reads the members and asks their
//! clients.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ballast::model::ReplicaMode;

use super::lent::Lent;
use super::{Engine, Link};
use crate::wire::client::{ClientError, ReplicaClient};

/// The setting's default: the time a replica may leave a request of the
/// volume's I/O unanswered (a test holds it to the settings table's).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(8);

/// A remote replica's state at one look.
struct Look {
    name: String,
    client: Arc<ReplicaClient>,
    rw: bool,
    stalled: Option<Duration>,
}

impl Engine {
    /// Gives up, from now on, on a remote replica that leaves a request of
    /// the volume's I/O unanswered for longer than `timeout` while another
    /// rw replica answers (see the module's head). The engine's process
    /// calls it once, after the start.
    pub fn watch_stalls(self: &Arc<Self>, timeout: Duration) {
        if self.replica_timeout.set(timeout).is_ok() {
            tokio::spawn(watch(Arc::downgrade(self), timeout));
        }
    }

    /// Before a pause of the volume's I/O: gives up each remote replica
    /// that leaves an INFO unanswered for the replica timeout while another
    /// answers (see the module's head). Without a timeout (an engine a test
    /// drives with none), nothing.
    pub(super) async fn give_up_silent(&self) {
        let Some(&timeout) = self.replica_timeout.get() else {
            return;
        };
        let (looks, lent_rw) = self.look(Instant::now()).await;
        let all: Vec<&Look> = looks.iter().collect();
        let answered = ask(&all, timeout).await;
        let answering = answering(&all, &answered, lent_rw);
        let silent: Vec<&Look> = all
            .iter()
            .zip(&answered)
            .filter(|(_, ok)| !**ok)
            .map(|(l, _)| *l)
            .collect();
        let why = |_: &Look| {
            format!(
                "no answer to INFO within {timeout:?} (engine-replica-timeout) before a pause of the I/O"
            )
        };
        self.give_up(&silent, &answering, &why).await;
    }

    /// `asked` of `client`, a replica joining the volume (no member yet):
    /// past the replica timeout it is given up (its connection abandoned),
    /// since no member's silence is at stake, and the rebuild fails. What
    /// it is asked (its INFO; under the pause of the volume's I/O, its join
    /// and a spare's reads of a few blocks) is quick on a node that
    /// answers; unanswered, it would hold the pause, or the volume's one
    /// rebuild at a time. Without a timeout, unbounded.
    pub(super) async fn joining_answer<T>(
        &self,
        (name, client): (&str, &ReplicaClient),
        asked: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        let Some(&timeout) = self.replica_timeout.get() else {
            return asked.await;
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(answer) => answer,
            Err(_) => {
                let reason = format!(
                    "no answer within {timeout:?} (engine-replica-timeout) to a request of its join; the rebuild is given up"
                );
                tracing::error!(volume = %self.volume, replica = name, reason = %reason,
                    "a replica joining the volume stopped answering");
                client.abandon(&reason);
                Err(ClientError::Closed {
                    addr: client.addr().to_string(),
                    reason,
                })
            }
        }
    }

    /// Gives up each of `silent` (`why` says what it left unanswered),
    /// when `answering` names a replica that answers; else none.
    async fn give_up(
        &self,
        silent: &[&Look],
        answering: &[&str],
        why: &(dyn Fn(&Look) -> String + Sync),
    ) {
        if answering.is_empty() {
            return;
        }
        for l in silent {
            let reason = format!("{}, while {} answers", why(l), answering.join(", "));
            tracing::error!(volume = %self.volume, replica = %l.name, reason = %reason,
                "a replica stopped answering; it is given up and the volume goes on without it");
            l.client.abandon(&reason);
            self.fail(
                &l.name,
                &ClientError::Closed {
                    addr: l.client.addr().to_string(),
                    reason: reason.clone(),
                },
            )
            .await;
            self.end_rebuilds_from(&l.name, &reason).await;
        }
    }

    /// Gives up, from now on, the lent replica `lent` (named `name`) once
    /// it holds a write, a read or a flush past `timeout` while a remote rw
    /// replica answers (see the module's head), from a thread of its own;
    /// it ends with the replica or the engine.
    pub(super) fn watch_lent(self: &Arc<Self>, lent: &Arc<Lent>, name: &str, timeout: Duration) {
        let (engine, lent, name) = (Arc::downgrade(self), Arc::downgrade(lent), name.to_string());
        let runtime = tokio::runtime::Handle::current();
        let every = (timeout / 4).max(Duration::from_millis(250));
        let watch = move || {
            let mut waiting_said = false;
            loop {
                std::thread::sleep(every);
                let (Some(engine), Some(lent)) = (engine.upgrade(), lent.upgrade()) else {
                    return;
                };
                let now = Instant::now();
                let Some(held) = lent.stalled_for(now).filter(|d| *d > timeout) else {
                    waiting_said = false;
                    continue;
                };
                // Not awaited: the async workers may all be held.
                let Ok(members) = engine.members.try_lock() else {
                    continue;
                };
                let answering: Vec<String> = members
                    .iter()
                    .filter(|m| m.mode == ReplicaMode::Rw)
                    .filter(|m| match &m.link {
                        Some(Link::Remote(c)) => c.stalled_for(now).is_none_or(|d| d <= timeout),
                        _ => false,
                    })
                    .map(|m| m.at.name.clone())
                    .collect();
                drop(members);
                if answering.is_empty() {
                    if !waiting_said {
                        tracing::warn!(volume = %engine.volume, replica = %name, timeout = ?timeout,
                            "the local replica's disk holds a write past the replica timeout, and no other rw replica answers; it is not given up, the volume's I/O waits for it");
                        waiting_said = true;
                    }
                    continue;
                }
                let reason = format!(
                    "its disk held a write or a flush for {:.1}s (engine-replica-timeout {timeout:?}), while {} answers",
                    held.as_secs_f64(),
                    answering.join(", ")
                );
                tracing::error!(volume = %engine.volume, replica = %name, reason = %reason,
                    "the local replica's disk stopped answering; it is given up and the volume goes on without it");
                let why = ClientError::Closed {
                    addr: name.clone(),
                    reason: reason.clone(),
                };
                // The answer may start the write's conclusion, a task.
                let _in = runtime.enter();
                if let Some(answer) = lent.give_up(reason.clone()) {
                    answer(Err(why.clone()));
                }
                engine.lent_given_up.send_modify(|n| *n += 1);
                let name = name.clone();
                runtime.spawn(async move {
                    engine.fail(&name, &why).await;
                    engine.end_rebuilds_from(&name, &reason).await;
                });
                return;
            }
        };
        if let Err(e) = std::thread::Builder::new()
            .name("lent-watch".into())
            .spawn(watch)
        {
            tracing::warn!(volume = %self.volume, error = %e, "no thread to watch the local replica: a disk that hangs under it holds the volume's I/O");
        }
    }

    /// The remote replicas, and how long each has left a request
    /// unanswered; and whether a replica is lent (always taken as
    /// answering).
    async fn look(&self, now: Instant) -> (Vec<Look>, bool) {
        let members = self.members.lock().await;
        let mut looks = Vec::new();
        let mut lent_rw = false;
        for m in members.iter() {
            let rw = m.mode == ReplicaMode::Rw;
            match &m.link {
                Some(Link::Remote(c)) if matches!(m.mode, ReplicaMode::Rw | ReplicaMode::Wo) => {
                    looks.push(Look {
                        name: m.at.name.clone(),
                        client: c.clone(),
                        rw,
                        stalled: c.stalled_for(now),
                    });
                }
                Some(Link::Lent(_)) if rw => lent_rw = true,
                _ => {}
            }
        }
        (looks, lent_rw)
    }
}

/// Asks each of `looks` for its INFO, all at once; whether each answered
/// within `timeout` (an error is an answer: the replica is there to give
/// it).
async fn ask(looks: &[&Look], timeout: Duration) -> Vec<bool> {
    let mut asked = tokio::task::JoinSet::new();
    for (i, l) in looks.iter().enumerate() {
        let c = l.client.clone();
        asked.spawn(async move { (i, tokio::time::timeout(timeout, c.info()).await.is_ok()) });
    }
    let mut answered = vec![false; looks.len()];
    while let Some(Ok((i, ok))) = asked.join_next().await {
        answered[i] = ok;
    }
    answered
}

/// The rw replicas of `looks` that `answered`, and the lent one when
/// there is one: the proof that the volume goes on without the others.
fn answering<'a>(looks: &[&'a Look], answered: &[bool], lent_rw: bool) -> Vec<&'a str> {
    looks
        .iter()
        .zip(answered)
        .filter(|(l, ok)| **ok && l.rw)
        .map(|(l, _)| l.name.as_str())
        .chain(lent_rw.then_some("the local replica"))
        .collect()
}

/// Looks at the replicas a few times per timeout for as long as the engine
/// lives. A replica past the timeout is given up only once another rw
/// replica has just answered an INFO (or the lent one is there): one with
/// nothing asked of it proves nothing by its silence; and only if it is
/// still past the timeout a look after that answer.
async fn watch(engine: Weak<Engine>, timeout: Duration) {
    let every = (timeout / 4).max(Duration::from_millis(250));
    let mut waiting_said = false;
    loop {
        tokio::time::sleep(every).await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let (looks, lent_rw) = engine.look(Instant::now()).await;
        // One with nothing asked of it is asked a PING, timed like the
        // I/O: a replica whose node froze under an idle volume shows its
        // silence at the next looks, as under I/O.
        for l in looks.iter().filter(|l| l.stalled.is_none()) {
            l.client.ping();
        }
        let over = |l: &Look| l.stalled.is_some_and(|d| d > timeout);
        let stalled: Vec<&Look> = looks.iter().filter(|l| over(l)).collect();
        if stalled.is_empty() {
            waiting_said = false;
            continue;
        }
        let others: Vec<&Look> = looks.iter().filter(|l| l.rw && !over(l)).collect();
        let answered = ask(&others, timeout).await;
        let answering = answering(&others, &answered, lent_rw);
        if answering.is_empty() {
            if !waiting_said {
                tracing::warn!(volume = %engine.volume, timeout = ?timeout,
                    replicas = ?stalled.iter().map(|l| &l.name).collect::<Vec<_>>(),
                    "every rw replica has left a request unanswered past the replica timeout, or answers nothing asked now; none is given up, the volume's I/O waits for them");
                waiting_said = true;
            }
            continue;
        }
        // A replica that answers as the others do (its node thawed, its
        // proxy or network let its answers through at once) is still
        // taken as stalled at the look, its answers a moment behind the
        // others' INFO: it is given up only if it still leaves its request
        // unanswered a look later. One that stopped answering costs that
        // look more.
        tokio::time::sleep(every).await;
        let now = Instant::now();
        let stalled: Vec<&Look> = stalled
            .into_iter()
            .filter(|l| l.client.stalled_for(now).is_some_and(|d| d > timeout))
            .collect();
        let why = |l: &Look| {
            format!(
                "no answer for {:.1}s (engine-replica-timeout {timeout:?})",
                l.stalled.unwrap_or_default().as_secs_f64()
            )
        };
        engine.give_up(&stalled, &answering, &why).await;
    }
}

#[cfg(test)]
mod tests {
    use super::DEFAULT_TIMEOUT;
    use ballast::settings::{ENGINE_REPLICA_TIMEOUT, definition};

    /// What `ballast engine` run by hand uses is what the node plugin
    /// passes when no one changed the setting.
    #[test]
    fn the_engines_default_timeout_is_the_settings_default() {
        let setting = definition(ENGINE_REPLICA_TIMEOUT).unwrap();
        assert_eq!(setting.default, DEFAULT_TIMEOUT.as_secs().to_string());
    }
}
