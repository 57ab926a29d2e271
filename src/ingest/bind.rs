//! Centralized ingest (llm-d): a SUB socket kvix binds (`--zmq-bind`) and every
//! engine's PUB connects to, each naming itself in the topic `kv@<pod>@<model>`.
//!
//! Owns the bound sockets, the topic → (pod, model) parse, and one stream per
//! (pod, model, dp rank) with its own [`WorkerFeed`] and sequence numbers. A pod
//! is registered ([`Registry::register_pod`]) on its first message and then is a
//! worker like any other, named by its pod identity. Lives on an ingest thread
//! and reuses its scratch, sink and feeds; never runs on an executor.
//!
//! A flood from one pod: libzmq gives each connected publisher its own pipe, bounded
//! by `--zmq-rcvhwm` frames, and the socket takes frames from the pipes in turn (fair
//! queueing), at most [`super::BURST`] per poll before the thread's other sockets get
//! theirs. So a pod that publishes faster than kvix applies fills only its own pipe:
//! its excess is dropped there and shows up as gaps on its own streams, while the
//! other pods' frames keep their turn. What topics may create is bounded by
//! `--max-event-indexes` (models) and `--max-event-slots` (pods × dp ranks per model).

use super::feed::{FeedStats, WorkerFeed};
use super::sequence::{Cursor, Step};
use super::{IngestThread, recv_parts};
use crate::registry::{Endpoint, MAX_NAME_BYTES, Registry, RegistryError, topic_name_ok};
use crate::types::{DpRank, IndexId, InstanceId, WorkerSlot};
use crate::wire::{self, WireError};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

/// The publisher kind pods are listed with in `/workers`.
pub const POD_PUBLISHER: &str = "llm-d";

/// Counters of the bound sockets that belong to no pod stream.
#[derive(Default, Debug)]
pub struct BindStats {
    /// Frames whose topic is not `kv@<pod>@<model>` (skipped).
    pub malformed_topics: AtomicU64,
    /// Frames of a well-named pod that failed to decode (skipped).
    pub malformed_frames: AtomicU64,
}

/// What a bound socket serves.
#[derive(Clone, Debug)]
pub struct BindOpts {
    /// Block size of a model first named by a topic (an existing index keeps its own).
    pub block_size: u32,
    /// Tenant the pods' blocks go to (events may name another).
    pub tenant: String,
}

/// `kv@<pod>@<model>` → (pod, model). The pod is what lies between the first two
/// `@`; the model is everything after the second, so a model name may hold `@` and
/// a pod identity may not. Both must be [`topic_name_ok`]: a publisher names workers and
/// models that kvix keeps, lists and logs, so their size and bytes are bounded here.
pub fn parse_topic(topic: &[u8]) -> Option<(&str, &str)> {
    let rest = topic.strip_prefix(b"kv@")?;
    let at = rest.iter().position(|&c| c == b'@')?;
    let (pod, model) = (&rest[..at], &rest[at + 1..]);
    if !topic_name_ok(pod) || !topic_name_ok(model) {
        return None;
    }
    // Visible ASCII is UTF-8.
    Some((
        std::str::from_utf8(pod).ok()?,
        std::str::from_utf8(model).ok()?,
    ))
}

/// One (pod, model, dp rank) stream.
pub(super) struct PodStream {
    pub(super) dp: DpRank,
    pub(super) feed: WorkerFeed,
    pub(super) cursor: Cursor,
}

/// One topic's pod and model, and its streams by dp rank.
struct Topic {
    pod: String,
    model: String,
    streams: Vec<PodStream>,
}

/// One bound SUB socket and the pods heard on it.
pub(super) struct Bound {
    pub(super) socket: zmq::Socket,
    pub(super) endpoint: String,
    opts: BindOpts,
    /// By topic bytes: a frame's stream is found without allocating.
    topics: HashMap<Box<[u8]>, Topic>,
}

impl Bound {
    pub(super) fn new(socket: zmq::Socket, endpoint: String, opts: BindOpts) -> Bound {
        Bound {
            socket,
            endpoint,
            opts,
            topics: HashMap::new(),
        }
    }

    /// Every stream of `instance`.
    fn streams_of(&mut self, instance: InstanceId) -> impl Iterator<Item = &mut PodStream> {
        self.topics
            .values_mut()
            .flat_map(|t| t.streams.iter_mut())
            .filter(move |s| s.feed.instance == instance)
    }

    /// Stop the streams of `instance` in `index` (one dp rank or all) and forget what
    /// its other streams wrote there; returns the slots to clear. A pod that publishes
    /// again is registered again.
    pub(super) fn remove(
        &mut self,
        index: IndexId,
        instance: InstanceId,
        dp: Option<DpRank>,
    ) -> Vec<(IndexId, WorkerSlot)> {
        let mut cleared = Vec::new();
        for s in self.streams_of(instance) {
            if s.feed.index == index && dp.is_none_or(|d| d == s.dp) {
                cleared.extend(s.feed.forget_all());
            } else {
                cleared.extend(s.feed.forget(index, dp));
            }
        }
        for t in self.topics.values_mut() {
            t.streams.retain(|s| {
                !(s.feed.instance == instance
                    && s.feed.index == index
                    && dp.is_none_or(|d| d == s.dp))
            });
        }
        self.topics.retain(|_, t| !t.streams.is_empty());
        cleared
    }

    /// Warn about a malformed topic at most every 10 s.
    /// A frame whose topic is not `kv@<pod>@<model>` within [`MAX_NAME_BYTES`] and
    /// [`topic_name_ok`]'s characters: logged (its first bytes, escaped) at most once per
    /// interval, with the count of those left out.
    fn warn_topic(&self, topic: &[u8]) {
        crate::warn_throttled!(
            endpoint = self.endpoint,
            topic_bytes = topic.len(),
            topic = %String::from_utf8_lossy(&topic[..topic.len().min(80)]),
            "frame skipped: topic is not kv@<pod>@<model> (names of at most {MAX_NAME_BYTES} visible ASCII bytes)"
        );
    }
}

/// A new stream for (pod, model, dp), registered; `None` if the registry refuses it.
fn open_stream(
    registry: &Registry,
    endpoint: &str,
    opts: &BindOpts,
    pod: &str,
    model: &str,
    dp: DpRank,
) -> Result<PodStream, RegistryError> {
    let ep = Endpoint {
        endpoint: endpoint.to_string(),
        replay_endpoint: None,
        publisher: Some(POD_PUBLISHER.to_string()),
    };
    let (index, instance, block_size) =
        registry.register_pod(model, &opts.tenant, opts.block_size, pod, dp, &ep)?;
    tracing::info!(pod, model, dp, endpoint, "pod heard on the bound socket");
    Ok(PodStream {
        dp,
        feed: WorkerFeed::new(index, instance, dp, block_size),
        cursor: Cursor::default(),
    })
}

impl IngestThread {
    /// Take up to a burst of frames from bound socket `b`.
    pub(super) fn drain_bound(&mut self, b: usize) {
        for _ in 0..super::BURST {
            if !self.bound_one(b) {
                return;
            }
        }
    }

    /// Receive and apply one frame of bound socket `b`; false when none waits.
    fn bound_one(&mut self, b: usize) -> bool {
        let bs = self.bind_stats.clone();
        let bound = &mut self.binds[b];
        let parts = &mut self.scratch.parts;
        let n = match recv_parts(&bound.socket, parts) {
            Ok(None) => return false,
            Ok(Some(n)) => n,
            Err(e) => {
                crate::warn_throttled!(endpoint = bound.endpoint, "zmq recv failed: {e}");
                return false;
            }
        };
        if n != 3 || parse_topic(&parts[0]).is_none() {
            FeedStats::bump(&bs.malformed_topics, 1);
            self.binds[b].warn_topic(&parts[0]);
            return true;
        }
        let seq = wire::split_seq(&parts[1]);
        let readable = seq.as_ref().ok().copied();
        let decoded =
            seq.and_then(|seq| wire::decode(&parts[2], &mut self.scratch.batch).map(|_| seq));
        let seq = match decoded {
            Ok(seq) => seq,
            Err(e) => {
                self.malformed_pod_frame(b, readable, e);
                return true;
            }
        };
        let dp = self.scratch.batch.dp_rank.unwrap_or(0);
        let Some(i) = self.stream(b, dp) else {
            // Refused by the event limits: counted by the registry.
            return true;
        };
        let topic = self.binds[b]
            .topics
            .get_mut(&*self.scratch.parts[0])
            .expect("stream() made the topic");
        let s = &mut topic.streams[i];
        // No replay: a pod names no replay endpoint. A first frame above 0 and the
        // batches of a gap stay missing; a restart starts the stream over.
        let step = s.cursor.step(seq);
        s.feed.stats.count(step);
        match step {
            Step::Gap { after, missing } => crate::warn_throttled!(
                pod = topic.pod,
                model = topic.model,
                dp,
                last = after,
                seq,
                missing,
                "sequence gap"
            ),
            Step::Restart { last } => crate::warn_throttled!(
                pod = topic.pod,
                model = topic.model,
                dp,
                last,
                seq,
                "sequence went back: engine restarted; its blocks are kept and its stream starts over"
            ),
            Step::First | Step::Next => {}
        }
        s.feed.stats.received(&mut s.cursor, seq);
        s.feed.apply(
            &self.scratch.batch,
            &self.scratch.parts[2],
            &self.registry,
            &mut self.sink,
        );
        true
    }

    /// A pod's frame that did not decode: counted, and when its sequence number is
    /// readable and the pod has one stream for the model, that stream received it (the
    /// next frame is no gap). With several dp ranks the frame's rank is unknown.
    fn malformed_pod_frame(&mut self, b: usize, seq: Option<u64>, e: WireError) {
        FeedStats::bump(&self.bind_stats.malformed_frames, 1);
        let bound = &mut self.binds[b];
        let topic = bound.topics.get_mut(&*self.scratch.parts[0]);
        crate::warn_throttled!(
            endpoint = bound.endpoint,
            pod = topic.as_ref().map(|t| t.pod.as_str()),
            "malformed frame skipped: {e}"
        );
        if let (Some(seq), Some(t)) = (seq, topic)
            && let [s] = &mut t.streams[..]
        {
            // Its number still says whether a gap or a restart came before it.
            s.feed.stats.count(s.cursor.step(seq));
            s.feed.stats.received(&mut s.cursor, seq);
        }
    }

    /// The stream of the frame in the scratch (its topic, dp rank `dp`) on bound
    /// socket `b`, opened on its first frame; `None` if the registry refuses it.
    fn stream(&mut self, b: usize, dp: DpRank) -> Option<usize> {
        let bound = &mut self.binds[b];
        let key = &*self.scratch.parts[0];
        if let Some(t) = bound.topics.get(key)
            && let Some(i) = t.streams.iter().position(|s| s.dp == dp)
        {
            return Some(i);
        }
        let (pod, model) = parse_topic(key)?;
        let stream = match open_stream(&self.registry, &bound.endpoint, &bound.opts, pod, model, dp)
        {
            Ok(s) => s,
            // Counted and logged once per interval by the registry.
            Err(RegistryError::EventLimit { .. }) => return None,
            Err(e) => {
                crate::warn_throttled!(pod, model, dp, "cannot index pod: {e}");
                return None;
            }
        };
        self.pods.note(stream.feed.instance, self.id);
        self.listener_stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((
                stream.feed.index,
                stream.feed.instance,
                dp,
                stream.feed.stats.clone(),
            ));
        let (pod, model) = (pod.to_string(), model.to_string());
        let t = bound.topics.entry(key.into()).or_insert(Topic {
            pod,
            model,
            streams: Vec::new(),
        });
        t.streams.push(stream);
        Some(t.streams.len() - 1)
    }
}

/// Which ingest thread each pod lives on, so that control calls naming a pod
/// (`/unregister`, seeds) reach the thread that feeds it.
#[derive(Default)]
pub struct PodThreads(std::sync::Mutex<HashMap<InstanceId, usize>>);

impl PodThreads {
    /// Record that `pod` is fed by thread `thread` (on its first stream; rare).
    pub fn note(&self, pod: InstanceId, thread: usize) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pod, thread);
    }

    pub fn thread_of(&self, pod: InstanceId) -> Option<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&pod)
            .copied()
    }
}

/// Bind a SUB socket to every topic at `endpoint`.
pub(super) fn bind_socket(
    ctx: &super::Context,
    opts: super::SocketOptions,
    endpoint: &str,
) -> Result<zmq::Socket, String> {
    // Pods connect: a pod whose connection libzmq drops reconnects by itself.
    let s = super::subscriber(ctx, opts, true).map_err(|e| e.to_string())?;
    s.bind(endpoint)
        .map_err(|e| format!("cannot bind {endpoint}: {e}"))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_split_at_the_first_two_ats() {
        assert_eq!(
            parse_topic(b"kv@10.0.0.5:8000@llama"),
            Some(("10.0.0.5:8000", "llama"))
        );
        assert_eq!(
            parse_topic(b"kv@pod-a@org/model@v2"),
            Some(("pod-a", "org/model@v2"))
        );
        for bad in [
            &b"kv@pod"[..],
            b"kv@@model",
            b"kv@pod@",
            b"kv-events",
            b"KV@pod@m",
            b"kv@p\xffd@m",
            b"",
        ] {
            assert_eq!(parse_topic(bad), None, "{bad:?}");
        }
    }
}
