"""The sweep's side of an adaptive planner (``planner.kind: optuna``): ask, record what was asked
as trials in the store, tell each config's results once every one of its trials has finished, ask
again, until the planner is done.

The store is the source of truth: a resumed sweep rebuilds the planner's history from the trials
an earlier sweep of the same spec planned and their latest results (:meth:`AdaptiveLoop.start`).
A config is finished when none of its trials would be run again (:func:`coordinator.planning.needs_run`:
ok, or failed as a measurement without ``--retry-failed``); a trial lost to transport or left a
hole keeps its config untold (the planner asks nothing more until it is told). A config asked at
several fidelities (successive halving) is asked, finished and told once per fidelity.
"""

from __future__ import annotations

from dataclasses import replace

from coordinator.planning import Planner, create_planner, needs_run
from coordinator.store import Store
from servetune.manifest import EngineConfig, Plan, PlannedBatch, TrialManifest, plan_configs, swept_names
from servetune.ranking import TrialSummary
from servetune.spec import ExperimentSpec

#: Batch indices from here on are rate-sweep follow-ups (``coordinator.sweep.FOLLOWUP_BATCH_OFFSET``).
_FOLLOWUPS_FROM = 10_000


class AdaptiveLoop:
    """Drives one adaptive planner for one sweep of ``spec`` (stored under ``spec_hash``)."""

    def __init__(self, spec: ExperimentSpec, spec_hash: str, retry_failed: bool = False):
        self.spec = spec
        self.spec_hash = spec_hash
        self.retry_failed = retry_failed
        self.planner: Planner = create_planner(spec)
        self.untold: dict[tuple[str, float], EngineConfig] = {}  # (config_id, fidelity) -> config: asked, not told
        self.next_index = 0
        self.restored = 0  # configs an earlier sweep planned (0: a fresh experiment)

    def start(self, store: Store) -> Plan:
        """The plan so far: on a fresh experiment the planner's first batch (with the baseline
        batches, if any); on a resumed one the batches an earlier sweep of this spec planned, the
        planner restored from their results. The caller records it, then calls :meth:`settle`."""
        rows = [(i, m) for i, m in store.planned_trials(self.spec_hash) if i < _FOLLOWUPS_FROM]
        if not rows:
            plan = self.planner.plan()
            self.untold = {(b.config_id, _fidelity(b)): b.config for b in plan.batches if not b.is_baseline}
            self.next_index = len(plan.batches)
            return plan
        by_index: dict[int, list[TrialManifest]] = {}
        for i, m in rows:
            by_index.setdefault(i, []).append(m)
        batches = tuple(PlannedBatch(index=i, config=ms[0].engine, trials=tuple(ms), is_baseline=ms[0].is_baseline)
                        for i, ms in sorted(by_index.items()))
        asked = {(b.config_id, _fidelity(b)): b.config for b in batches if not b.is_baseline}
        configs = list(dict.fromkeys(c.config_id for c in asked.values()))
        history = []
        for (config_id, fidelity), config in asked.items():
            trials = self._finished_trials(store, config_id, fidelity)
            history.append((config, fidelity, trials))
            if trials is None:
                self.untold[(config_id, fidelity)] = config
        self.planner.restore_at(history)
        self.restored = len(configs)
        self.next_index = max(by_index) + 1
        template = plan_configs(self.spec, [], design=self.planner.design, notes=self.planner.notes,
                            prune=False)
        return replace(template, batches=batches)

    def settle(self, store: Store) -> list[PlannedBatch]:
        """Tell the planner every asked config whose trials have all finished, ask for more, record
        what it asks in the store (as batches of new trials), and again while that tells something
        (an asked config may already have results, e.g. from another design of the same experiment).
        Returns the new batches, in order; the caller queues them."""
        out: list[PlannedBatch] = []
        while True:
            for key in list(self.untold):
                self._tell_if_finished(store, key)
            new = self._ask()
            pruned = self.planner.take_pruned()
            if pruned:  # configs the planner found unable to run, instead of asking for them
                store.add_pruned(self.spec_hash, pruned)
            if not new:
                return out
            for b in new:
                store.add_trials(self.spec_hash, list(b.trials), b.index)
            out += new

    @property
    def done(self) -> bool:
        return self.planner.done

    # ------------------------------------------------------------------ internals

    def _ask(self) -> list[PlannedBatch]:
        if self.planner.done:
            return []
        configs = self.planner.ask_at()
        if not configs:
            return []
        asked: list[PlannedBatch] = []
        for fidelity in dict.fromkeys(f for _, f in configs):
            plan = plan_configs(self.spec, [c for c, f in configs if f == fidelity], design=self.planner.design,
                                notes=self.planner.notes, prune=False, fidelity=fidelity)
            # the baseline batches run around the first batch only: planned again they would be the same trials
            asked += [b for b in plan.batches if not b.is_baseline]
        out = [replace(b, index=self.next_index + k) for k, b in enumerate(asked)]
        self.next_index += len(out)
        for c, f in configs:
            self.untold[(c.config_id, f)] = c
        return out

    def _tell_if_finished(self, store: Store, key: tuple[str, float]) -> bool:
        trials = self._finished_trials(store, *key)
        if trials is None:
            return False
        self.planner.tell_at(self.untold.pop(key), key[1], trials)
        return True

    def _finished_trials(self, store: Store, config_id: str, fidelity: float = 1.0) -> list[TrialSummary] | None:
        """The latest results of every (non-baseline) trial of ``config_id`` at ``fidelity`` planned
        under this spec, or None while one of them would still be run."""
        manifests = [m for _, m in store.planned_trials(self.spec_hash, config_id)
                     if not m.is_baseline and m.fidelity == fidelity]
        if not manifests:
            return None
        latest = store.latest_finished_of([m.trial_id for m in manifests])
        if any(needs_run(latest.get(m.trial_id), self.retry_failed) for m in manifests):
            return None
        swept = swept_names([m.engine for m in manifests]) or None
        out = []
        for m in manifests:
            att = latest[m.trial_id]
            out.append(TrialSummary(trial_id=m.trial_id, config_id=m.config_id, config_label=m.engine.label(swept),
                                    load_point=m.load_point.name, status=att.status, failure_kind=att.failure_kind,
                                    metrics=att.metrics or {}, is_baseline=False))
        return out


def _fidelity(batch: PlannedBatch) -> float:
    """The fidelity a batch was planned at (its trials share it)."""
    return batch.trials[0].fidelity if batch.trials else 1.0
