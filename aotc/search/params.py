"""`SearchParams`: every search-policy setting, each with its one default (docs/search.md#search-parameters).

Policy is how the search explores: sketch structure, random annotation, evolution, how many candidates
a round measures and how they are picked, the task scheduler's strategy, the seed. How much to search
(trials, deadline), where records go and how candidates are measured are not policy: the tuning options
hold those (aotc.search.model_tuning.TuningOptions).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from aotc.target import host_cores

STRATEGIES = ("gradient", "round-robin")
MAX_DEFAULT_WORKERS = 8  # a round's batches are 256 programs at most: more workers would each get a few


@dataclass(frozen=True)
class SearchParams:
    """The search policy. Sketches: `structure` (multi-level tiling, S spatial / R reduce levels),
        `fusion_levels` (tile levels a consumer may fuse at); on GPU targets `gpu_structure` and
        `gpu_fusion_levels` (Ansor's block / vthread / thread levels first); `dot_products`: 8-bit reductions also
    get sketches with the target's dot-product instructions (docs/int8.md). Annotation: `max_innermost_split_factor`,
        `non_divisor_prob` (a split padded past the extent), `innermost_reorder_prob`, `unroll_steps`
        (auto-unroll choices; `gpu_unroll_steps` on GPU, `dot_unroll_steps` for a dot-product stage), `parallel_per_core` (parallel iterations per core at most). Evolution:
        `population`, `generations`, `mutation_prob`, `crossover_prob`. Each round: `per_round` candidates
        measured, `eps_greedy` of them random rather than the model's best. Task scheduler: `strategy`
        ("gradient" or "round-robin"). `seed`: every random choice (task i's search uses seed + i).
        `workers`: processes that lower and featurize a round's candidates (aotc.search.program_pool; fewer
        than 2: the tuner's own process); they change how fast a round is, never what it finds."""

    structure: str = "SSRSRS"
    fusion_levels: tuple[int, ...] = (1, 2)
    gpu_structure: str = "SSSRRSRS"
    gpu_fusion_levels: tuple[int, ...] = (3,)
    dot_products: bool = True
    max_innermost_split_factor: int = 64
    non_divisor_prob: float = 0.2
    innermost_reorder_prob: float = 0.5
    unroll_steps: tuple[int, ...] = (0, 16, 64, 512)
    # a stage with a dot-product micro-kernel: its register block is unrolled already, and 512 more steps
    # made 3-5 MB of LLVM IR that took 7-40 s to compile (the build timeout is 30 s)
    dot_unroll_steps: tuple[int, ...] = (0, 16, 64)
    gpu_unroll_steps: tuple[int, ...] = (0, 16, 64, 512, 1024)
    parallel_per_core: int = 16
    population: int = 256
    generations: int = 4
    mutation_prob: float = 0.85
    crossover_prob: float = 0.1
    per_round: int = 64
    eps_greedy: float = 0.05
    strategy: str = "gradient"
    seed: int = 0
    workers: int = field(default_factory=lambda: min(host_cores(), MAX_DEFAULT_WORKERS))

    def __post_init__(self) -> None:
        _check("workers", self.workers, _is_int(self.workers) and self.workers >= 0, "an int >= 0")
        for name in ("max_innermost_split_factor", "parallel_per_core", "population", "per_round"):
            _check(
                name,
                getattr(self, name),
                _is_int(getattr(self, name)) and getattr(self, name) >= 1,
                "a positive int",
            )
        _check(
            "generations",
            self.generations,
            _is_int(self.generations) and self.generations >= 0,
            "an int >= 0",
        )
        _check("seed", self.seed, _is_int(self.seed), "an int")
        _check("dot_products", self.dot_products, isinstance(self.dot_products, bool), "true or false")
        for name in (
            "non_divisor_prob",
            "innermost_reorder_prob",
            "mutation_prob",
            "crossover_prob",
            "eps_greedy",
        ):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0
            _check(name, value, ok, "a probability from 0 to 1")
        _check("strategy", self.strategy, self.strategy in STRATEGIES, " or ".join(map(repr, STRATEGIES)))
        for name in ("structure", "gpu_structure"):
            value = getattr(self, name)
            ok = isinstance(value, str) and bool(value) and set(value) <= {"S", "R"}
            _check(name, value, ok, "a string of S and R")
        for name in (
            "fusion_levels",
            "unroll_steps",
            "dot_unroll_steps",
            "gpu_fusion_levels",
            "gpu_unroll_steps",
        ):
            value = getattr(self, name)
            ok = isinstance(value, tuple | list) and bool(value) and all(_is_int(v) and v >= 0 for v in value)
            _check(name, value, ok, "a non-empty tuple of ints >= 0")
            object.__setattr__(self, name, tuple(value))

    def replace(self, **changes) -> SearchParams:
        return replace(self, **changes)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(name: str, value: object, ok: bool, expected: str) -> None:
    if not ok:
        raise ValueError(f"SearchParams.{name}: expected {expected}, got {value!r}")
