//! The mesh protocol between cores: the requests one core's shard answers for
//! another ([`Req`], [`Rep`]), how a core answers them, and scatter/gather over
//! every core; [`Core`] as the [`ShardMesh`] the HTTP handlers call.
//!
//! Never blocks an executor: a request to another core is a message, its reply
//! awaited; work that would block goes to [`ShardMesh::offload`].

use super::*;

/// One step of an export, as a shard answers it.
pub(super) struct ExportStep {
    blocks: Vec<ExportedBlock>,
    names: Vec<(WorkerSlot, u32, EngineHash)>,
    /// With the last step: the slots' other KV-cache groups.
    groups: Vec<(WorkerSlot, SlotGroups)>,
    at: ExportAt,
    done: bool,
}

/// A request from one core to another core's shard.
pub(super) enum Req {
    Lookup {
        index: IndexId,
        prompt: Arc<PromptBlocks>,
    },
    /// Bound the index first if asked, then apply the prediction's step if there
    /// is one (it goes to its slot's shard only).
    Predict {
        index: IndexId,
        step: Option<Box<PredictStep>>,
        prune: Option<PruneBound>,
    },
    /// The next step of an export from `at` (the default begins one). An export
    /// reads a shard in steps, one request each, so the shard's executor serves
    /// queries between them instead of walking its whole index at once. Ops applied
    /// between steps are covered by replay from the sequence numbers taken before
    /// the export, as ops applied after it are.
    Export {
        index: IndexId,
        at: Box<ExportAt>,
    },
    Stats,
    Slots(Box<SlotReq>),
}

pub(super) enum Rep {
    Lookup(ShardReply),
    /// Where the step ended (`None`: the shard was only bounded).
    Predicted(Option<Result<ChainAt, PredictRefused>>),
    /// The step's blocks and engine names, where the export got to, and whether
    /// it is done.
    Export(Box<ExportStep>),
    Stats(Box<ShardStats>),
    Slots(Box<SlotRep>),
}

pub(super) enum Msg {
    Req(u64, Req),
    Rep(u64, Rep),
}

impl Core {
    fn answer(&self, req: Req) -> Rep {
        match req {
            Req::Stats => {
                let shard = self.shard.borrow();
                let (blocks, tier_blocks) = shard.tier_counts();
                Rep::Stats(Box::new(ShardStats {
                    shard: self.id.0,
                    applied: shard.applied,
                    pending: self.app.rings().pending(self.id) as u64,
                    waiting: shard.waiting_ops() as u64,
                    stalls: self.app.rings().stalls(self.id),
                    polling_yielded: self.awake.stops(),
                    blocks,
                    tier_blocks,
                    predictions: shard.predictions,
                    evicted: shard.evicted,
                    unknown_parent: shard.unknown_parent,
                    unknown_removed: shard.unknown_removed,
                    duplicate_stores: shard.duplicate_stores,
                    group_unheld: shard.group_unheld,
                    engine_map_bytes: shard.engine_map_bytes() as u64,
                    heap_bytes: shard.heap_bytes() as u64,
                    http: self.http_stats.borrow().clone(),
                    slots: self.slot_tracker.borrow_mut().stats(Instant::now()),
                }))
            }
            Req::Slots(req) => Rep::Slots(Box::new(
                self.slot_tracker.borrow_mut().answer(*req, Instant::now()),
            )),
            Req::Lookup { index, prompt } => Rep::Lookup(crate::shard::answer(
                &mut self.shard.borrow_mut(),
                index,
                prompt.as_prompt(),
            )),
            Req::Predict { index, step, prune } => {
                let mut shard = self.shard.borrow_mut();
                if prune.is_some() {
                    shard.set_prune_bound(index, prune);
                }
                Rep::Predicted(step.map(|step| {
                    let r = shard.predict_step(index, &step);
                    // The drain loop ends predictions: it parks only until the next is due.
                    self.app.rings().wake(self.id);
                    r
                }))
            }
            Req::Export { index, mut at } => {
                // Apply everything already on the rings first, so an export taken after
                // the ingest threads reported their sequence numbers covers them.
                let mut shard = self.shard.borrow_mut();
                self.app
                    .rings()
                    .drain(self.id, usize::MAX, |ops| shard.apply_staged(ops));
                shard.finish_deferred();
                let (mut blocks, mut names) = (Vec::new(), Vec::new());
                let done = shard.export_step(index, &mut at, &mut blocks, &mut names);
                let mut groups = Vec::new();
                if done {
                    shard.group_specs(index, &mut groups);
                }
                Rep::Export(Box::new(ExportStep {
                    blocks,
                    names,
                    groups,
                    at: *at,
                    done,
                }))
            }
        }
    }

    pub(super) fn on_msg(self: &Rc<Self>, peer: usize, msg: Msg) {
        match msg {
            Msg::Req(qid, req) => {
                self.awake.note();
                let rep = Msg::Rep(qid, self.answer(req));
                // Never block the receive loop (that could deadlock two cores sending to each
                // other): if the channel is full, finish the send in a task of its own.
                if let Err(glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(rep))) =
                    self.mesh.try_send_to(peer, rep)
                {
                    let me = self.clone();
                    glommio::spawn_local(async move {
                        let _ = me.mesh.send_to(peer, rep).await;
                    })
                    .detach();
                }
            }
            Msg::Rep(qid, rep) => {
                if let Some(tx) = self.pending.borrow_mut().remove(&qid) {
                    let _ = tx.try_send(rep);
                }
            }
        }
    }

    /// Send `req` to every shard that has one and collect the replies by shard. Peers
    /// are asked first and our own part is answered while they work. A shard that
    /// was asked and did not answer fails the whole request.
    async fn scatter(
        &self,
        mut reqs: Vec<Option<Req>>,
    ) -> Result<Vec<Option<Rep>>, ShardUnavailable> {
        let mut out: Vec<Option<Rep>> = (0..self.shards).map(|_| None).collect();
        let mut waits = Vec::new();
        for (i, req) in reqs.iter_mut().enumerate() {
            if i == self.id.0 {
                continue;
            }
            let Some(req) = req.take() else { continue };
            let qid = self.next_qid.get();
            self.next_qid.set(qid + 1);
            let (tx, rx) = local_channel::new_bounded(1);
            self.pending.borrow_mut().insert(qid, tx);
            if self.mesh.send_to(i, Msg::Req(qid, req)).await.is_err() {
                self.pending.borrow_mut().remove(&qid);
                return Err(ShardUnavailable(ShardId(i)));
            }
            waits.push((i, rx));
        }
        if let Some(req) = reqs.get_mut(self.id.0).and_then(Option::take) {
            out[self.id.0] = Some(self.answer(req));
        }
        for (i, rx) in waits {
            match rx.recv().await {
                Some(rep) => out[i] = Some(rep),
                None => return Err(ShardUnavailable(ShardId(i))),
            }
        }
        Ok(out)
    }
}

impl Core {
    /// [`Core::scatter`], then each asked shard's reply as `expect` reads it, in
    /// shard order: a reply `expect` does not take fails the request as one that
    /// never came.
    async fn ask<T>(
        &self,
        reqs: Vec<Option<Req>>,
        expect: impl Fn(Rep) -> Option<T>,
    ) -> Result<Vec<T>, ShardUnavailable> {
        let mut out = Vec::with_capacity(self.shards);
        for (i, rep) in self.scatter(reqs).await?.into_iter().enumerate() {
            // Not asked: scatter fails the request for a shard that was asked and
            // did not answer.
            let Some(rep) = rep else { continue };
            out.push(expect(rep).ok_or(ShardUnavailable(ShardId(i)))?);
        }
        Ok(out)
    }
}

impl ShardMesh for Core {
    fn http_stats(&self) -> &RefCell<HttpStats> {
        &self.http_stats
    }

    async fn lookup(
        &self,
        index: IndexId,
        slots: usize,
        prompt: Arc<PromptBlocks>,
    ) -> Result<Vec<ShardReply>, ShardUnavailable> {
        let partition = self.app.rings().partition();
        let asked = |i: usize| partition.holds_any(index, slots, ShardId(i));
        let reqs = (0..self.shards)
            .map(|i| {
                asked(i).then(|| Req::Lookup {
                    index,
                    prompt: prompt.clone(),
                })
            })
            .collect();
        self.ask(reqs, |r| match r {
            Rep::Lookup(r) => Some(r),
            _ => None,
        })
        .await
    }

    async fn export(
        &self,
        shard: ShardId,
        index: IndexId,
    ) -> Result<ShardExport, ShardUnavailable> {
        let step = |at| {
            let mut reqs: Vec<Option<Req>> = (0..self.shards).map(|_| None).collect();
            if let Some(r) = reqs.get_mut(shard.0) {
                *r = Some(Req::Export { index, at });
            }
            self.ask(reqs, |r| match r {
                Rep::Export(step) => Some(step),
                _ => None,
            })
        };
        let mut out = ShardExport::default();
        let mut at = Box::default();
        loop {
            // A shard out of range is asked nothing and answers nothing.
            let Some(step) = step(at).await?.pop() else {
                return Err(ShardUnavailable(shard));
            };
            let ExportStep {
                blocks,
                mut names,
                mut groups,
                at: next,
                done,
            } = *step;
            if !blocks.is_empty() {
                out.parts.push(blocks);
            }
            out.names.append(&mut names);
            out.groups.append(&mut groups);
            if done {
                return Ok(out);
            }
            at = Box::new(next);
            // Our own shard answers in place: let queued queries run between steps.
            let_requests_in().await;
        }
    }

    async fn predict(
        &self,
        index: IndexId,
        step: PredictStep,
        prune: Option<PruneBound>,
    ) -> Result<Result<ChainAt, PredictRefused>, ShardUnavailable> {
        let owner = self.app.rings().partition().shard_of(index, step.slot);
        let mut step = Some(Box::new(step));
        let reqs = (0..self.shards)
            .map(|s| {
                let step = if s == owner.0 { step.take() } else { None };
                (step.is_some() || prune.is_some()).then_some(Req::Predict { index, step, prune })
            })
            .collect();
        // Only the owner applies a step; the others were asked to bound the index.
        self.ask(reqs, |r| match r {
            Rep::Predicted(r) => Some(r),
            _ => None,
        })
        .await?
        .into_iter()
        .flatten()
        .next()
        .ok_or(ShardUnavailable(owner))
    }

    async fn stats(&self) -> Result<Vec<ShardStats>, ShardUnavailable> {
        let reqs = (0..self.shards).map(|_| Some(Req::Stats)).collect();
        self.ask(reqs, |r| match r {
            Rep::Stats(s) => Some(*s),
            _ => None,
        })
        .await
    }

    async fn slot_tracker(&self, req: SlotReq) -> Result<Vec<SlotRep>, ShardUnavailable> {
        let owner = req.key().map(|k| k.owner(self.shards));
        let mut req = Some(req);
        let reqs = (0..self.shards)
            .map(|i| match owner {
                Some(o) if o.0 != i => None,
                Some(_) => req.take().map(|r| Req::Slots(Box::new(r))),
                None => req.clone().map(|r| Req::Slots(Box::new(r))),
            })
            .collect();
        self.ask(reqs, |r| match r {
            Rep::Slots(r) => Some(*r),
            _ => None,
        })
        .await
    }

    fn shards(&self) -> usize {
        self.shards
    }

    async fn offload<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        glommio::executor().spawn_blocking(f).await
    }

    async fn sleep(&self, d: Duration) {
        glommio::timer::sleep(d).await
    }

    fn pauser(&self) -> impl Fn() -> Pin<Box<dyn Future<Output = ()>>> + 'static {
        || Box::pin(let_requests_in())
    }
}
