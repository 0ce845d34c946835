"""Ansor's learned cost model (docs/search.md#cost-model): XGBoost on per-store features with a pack-sum loss.

A program's score is the sum of the predictions of its store rows. The label of a measured program
is its task's best cost divided by its cost (failed programs: 0), and the loss weights each program
by its label, so fast programs count most. One model serves every task; labels are normalized per
workload key. The model is retrained from scratch on all data after updates.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import xgboost as xgb

from aotc.schedule.state import State
from aotc.search.common import MeasureResult
from aotc.search.features import N_FEATURES, state_features
from aotc.te.dag import ComputeDAG

SIDECAR_SUFFIX = ".meta.json"
FORMAT = "aotc-xgb-cost-model"
ALWAYS_RETRAIN_BELOW = 512
ADAPTIVE_RATIO = 0.2


def default_nthread() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def xgb_params(seed: int = 43, nthread: int | None = None) -> dict:
    """Ansor's parameters, with the hist tree method and no bias (pack sums start at 0)."""
    return {
        "max_depth": 10,
        "gamma": 0.001,
        "min_child_weight": 0,
        "eta": 0.2,
        "nthread": nthread or default_nthread(),
        "seed": seed,
        "tree_method": "hist",
        "base_score": 0.0,
        "disable_default_eval_metric": 1,
        "verbosity": 0,
    }


@dataclass
class _TaskData:
    features: list[np.ndarray] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)


@dataclass
class _Packed:
    """Rows of many programs; `pack_ids[r]` is the program of row r."""

    rows: np.ndarray
    pack_ids: np.ndarray
    n_packs: int


def pack(features: Sequence[np.ndarray]) -> _Packed:
    """All programs' rows stacked, each tagged with its program's index."""
    sizes = np.array([len(f) for f in features], dtype=np.int64)
    rows = np.concatenate(features) if len(features) else np.zeros((0, N_FEATURES), np.float32)
    return _Packed(
        rows.astype(np.float32, copy=False), np.repeat(np.arange(len(features)), sizes), len(features)
    )


def normalized_labels(costs: Sequence[float]) -> np.ndarray:
    """min_cost / cost per program of one task; failed (non-finite or ≥ 1e10) costs give 0."""
    c = np.asarray(costs, dtype=np.float64)
    ok = np.isfinite(c) & (c > 0) & (c < 1e10)
    out = np.zeros(len(c))
    if ok.any():
        out[ok] = c[ok].min() / c[ok]
    return out


def pack_sum_objective(
    pack_ids: np.ndarray, labels: np.ndarray, weights: np.ndarray
) -> Callable[[np.ndarray, xgb.DMatrix], tuple[np.ndarray, np.ndarray]]:
    """Gradient (Σ pack preds − y)·w and hessian w per row, y and w repeated over the pack's rows."""

    def objective(preds: np.ndarray, _dtrain: xgb.DMatrix) -> tuple[np.ndarray, np.ndarray]:
        sums = np.bincount(pack_ids, weights=preds)
        return (sums[pack_ids] - labels) * weights, weights.copy()

    return objective


def pack_sum_rmse(
    pack_ids: np.ndarray, pack_labels: np.ndarray
) -> Callable[[np.ndarray, xgb.DMatrix], tuple[str, float]]:
    """RMSE between pack sums and program labels (`p-rmse`, the early-stopping metric)."""

    def metric(preds: np.ndarray, _dtrain: xgb.DMatrix) -> tuple[str, float]:
        sums = np.bincount(pack_ids, weights=preds, minlength=len(pack_labels))
        return "p-rmse", float(np.sqrt(np.mean((sums - pack_labels) ** 2)))

    return metric


class XGBCostModel:
    """The CostModel protocol with Ansor's XGBoost model, shared by all tasks of a build.

    Until more than `num_warmup_sample` programs have been measured `predict` returns uniform random
    scores; states that do not lower always get -inf.
    """

    def __init__(
        self,
        num_warmup_sample: int = 64,
        seed: int = 43,
        nthread: int | None = None,
        max_rounds: int = 300,
        early_stopping_rounds: int = 30,
        adaptive_training: bool = True,
    ):
        self.num_warmup_sample = num_warmup_sample
        self.params = xgb_params(seed, nthread)
        self.max_rounds = max_rounds
        self.early_stopping_rounds = early_stopping_rounds
        self.adaptive_training = adaptive_training
        self.rng = np.random.default_rng(seed)
        self.tasks: dict[str, _TaskData] = {}
        self.booster: xgb.Booster | None = None
        self.booster_size = 0
        self.trained_on = 0
        self.loaded = False

    @property
    def num_programs(self) -> int:
        return sum(len(t.costs) for t in self.tasks.values())

    # ---- CostModel protocol ----

    def predict(self, dag: ComputeDAG, states: list[State]) -> np.ndarray:
        return self.predict_features([state_features(s) for s in states])

    def update(self, dag: ComputeDAG, states: list[State], results: list[MeasureResult]) -> None:
        feats = [state_features(s) for s in states]
        costs = [r.mean_cost if r.ok else math.inf for r in results]
        self.add_training_data(dag.workload_key, feats, costs)

    # ---- data and training ----

    def add_training_data(
        self, workload_key: str, features_list: Sequence[np.ndarray], costs: Sequence[float]
    ) -> None:
        """Record measured programs of one task (programs without feature rows are skipped), then
        retrain if enough is new."""
        self._add(workload_key, features_list, costs)
        if self._should_train():
            self.fit()

    def warm_start(self, groups: Iterable[tuple[str, Sequence[State], Sequence[float]]]) -> int:
        """Learn from earlier measurements before a search: each group is (task name, states, costs),
        its costs ranked among themselves. Trains once, at the end, if the model then holds more than
        its warm-up sample. Returns how many programs were added (states that do not lower are not)."""
        added = 0
        for name, states, costs in groups:
            added += self._add(name, [state_features(s) for s in states], costs)
        if added and self.num_programs > self.num_warmup_sample:
            self.fit()
        return added

    def _add(self, task_name: str, features_list: Sequence[np.ndarray], costs: Sequence[float]) -> int:
        task = self.tasks.setdefault(task_name, _TaskData())
        added = 0
        for f, c in zip(features_list, costs, strict=True):
            if len(f):
                task.features.append(np.asarray(f, dtype=np.float32))
                task.costs.append(float(c))
                added += 1
        return added

    def _should_train(self) -> bool:
        n = self.num_programs
        if n <= max(self.num_warmup_sample, 1):
            return False
        if self.booster is None or not self.adaptive_training:
            return True
        if not self.loaded and n <= ALWAYS_RETRAIN_BELOW:
            return n > self.trained_on
        return n - self.trained_on >= ADAPTIVE_RATIO * self.booster_size

    def training_set(self) -> tuple[_Packed, np.ndarray]:
        feats: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        for task in self.tasks.values():
            feats.extend(task.features)
            labels.append(normalized_labels(task.costs))
        return pack(feats), np.concatenate(labels) if labels else np.zeros(0)

    def fit(self) -> None:
        """Retrain from scratch on every recorded program."""
        packed, pack_labels = self.training_set()
        if packed.n_packs == 0 or not (pack_labels > 0).any():
            return
        labels = pack_labels[packed.pack_ids]
        dtrain = xgb.DMatrix(packed.rows, label=labels, nthread=self.params["nthread"])
        booster = xgb.train(
            self.params,
            dtrain,
            num_boost_round=self.max_rounds,
            obj=pack_sum_objective(packed.pack_ids, labels, labels),
            custom_metric=pack_sum_rmse(packed.pack_ids, pack_labels),
            evals=[(dtrain, "tr")],
            early_stopping_rounds=self.early_stopping_rounds,
            verbose_eval=False,
        )
        best = getattr(booster, "best_iteration", None)
        if best is not None and best + 1 < booster.num_boosted_rounds():
            booster = booster[: best + 1]
        self.booster = booster
        self.booster_size = packed.n_packs
        self.trained_on = packed.n_packs
        self.loaded = False

    # ---- prediction ----

    def _model_ready(self) -> bool:
        return self.booster is not None and (self.loaded or self.num_programs > self.num_warmup_sample)

    def predict_features(self, features_list: Sequence[np.ndarray]) -> np.ndarray:
        """Scores of programs given their feature matrices; empty matrices score -inf."""
        n = len(features_list)
        valid = np.array([len(f) > 0 for f in features_list], dtype=bool)
        if self._model_ready() and valid.any():
            scores = np.zeros(n)
            scores[valid] = self._predict_packs([f for f, v in zip(features_list, valid) if v])
        else:
            scores = self.rng.random(n)
        scores[~valid] = -np.inf
        return scores

    def _predict_packs(self, features_list: Sequence[np.ndarray]) -> np.ndarray:
        assert self.booster is not None
        packed = pack(features_list)
        raw = self.booster.predict(xgb.DMatrix(packed.rows, nthread=self.params["nthread"]))
        return np.bincount(packed.pack_ids, weights=raw, minlength=packed.n_packs)

    # ---- persistence ----

    def save(self, path: str) -> None:
        """The booster in xgboost's JSON format at `path`, and a JSON sidecar at `path`.meta.json."""
        if self.booster is None:
            raise ValueError("the cost model has not been trained; nothing to save")
        with open(path, "wb") as fh:
            fh.write(bytes(self.booster.save_raw("json")))
        meta = {
            "format": FORMAT,
            "version": 1,
            "num_features": N_FEATURES,
            "num_train_programs": self.booster_size,
            "params": self.params,
            "max_rounds": self.max_rounds,
            "early_stopping_rounds": self.early_stopping_rounds,
        }
        with open(path + SIDECAR_SUFFIX, "w") as fh:
            json.dump(meta, fh, indent=1, sort_keys=True)

    def load(self, path: str) -> None:
        """Load a saved booster; it predicts at once (no warm-up) until enough new data replaces it."""
        with open(path + SIDECAR_SUFFIX) as fh:
            meta = json.load(fh)
        if meta.get("format") != FORMAT or meta.get("num_features") != N_FEATURES:
            raise ValueError(f"{path}: not an aotc cost model for {N_FEATURES} features")
        booster = xgb.Booster()
        with open(path, "rb") as fh:
            booster.load_model(bytearray(fh.read()))
        booster.set_param({"nthread": self.params["nthread"]})
        self.booster = booster
        self.booster_size = int(meta.get("num_train_programs", 0))
        self.trained_on = 0
        self.loaded = True


# ---- ranking metrics ----


def _as_costs(costs: Sequence[float]) -> np.ndarray:
    c = np.asarray(costs, dtype=np.float64)
    return np.where(np.isfinite(c), c, np.inf)


def pairwise_accuracy(preds: Sequence[float], costs: Sequence[float]) -> float:
    """Fraction of pairs with different costs that the scores order right (higher score ⇔ lower
    cost); tied scores count half."""
    p = np.asarray(preds, dtype=np.float64)
    c = _as_costs(costs)
    right = total = 0.0
    chunk = 1024
    for start in range(0, len(p), chunk):
        dp = np.sign(p[start : start + chunk, None] - p[None, :])
        dc = np.sign(c[None, :] - c[start : start + chunk, None])
        mask = dc != 0
        total += mask.sum()
        right += (dp[mask] == dc[mask]).sum() + 0.5 * (dp[mask] == 0).sum()
    return float(right / total) if total else 0.5


def recall_at_k(preds: Sequence[float], costs: Sequence[float], k: int) -> float:
    """Fraction of the k truly fastest programs that are among the k best scored."""
    p = np.asarray(preds, dtype=np.float64)
    c = _as_costs(costs)
    k = min(k, len(p))
    if k <= 0:
        return 0.0
    top_pred = set(np.argsort(-p, kind="stable")[:k].tolist())
    top_true = set(np.argsort(c, kind="stable")[:k].tolist())
    return len(top_pred & top_true) / k
