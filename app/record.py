"""What one Run produced, as plain data: the per-user state behind the plots, slider, replay and export.

Built only from StepEvents and arrival times; stats come from `sage_engine.core.events.summarize`,
the same function the CLI uses, so the app and the CLI report the same figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sage_engine import RunStats, StepEvent
from sage_engine.core.events import TreeView, summarize

ACCEPTED = "draft, accepted"  # HighlightedText labels (also the legend)
BONUS = "target, bonus"
FIRST = "target, prefill"


@dataclass
class Lane:
    """One decoder's run: its step events, when each arrived, and its text split by origin."""

    name: str  # "ar" | "spec"
    policy: str
    steps: list[StepEvent] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # the output so far
    arrivals: list[float] = field(default_factory=list)  # seconds from lane start to each event
    segments: list[tuple[str, str]] = field(default_factory=list)  # (text, origin label) per step part
    text: str = ""
    text_ends: list[int] = field(default_factory=list)  # len(text) after each step (race replay)
    seconds: float | None = None  # wall time of the whole lane; None while it runs
    cpu_seconds: float | None = None  # CPU time of the lane's own steps when the lanes took turns (race.py)
    # in turns: (seconds, CPU seconds) of each timed round (race.py); `seconds` and `cpu_seconds` are their means
    rounds: list[tuple[float, float]] = field(default_factory=list)

    @property
    def decode_steps(self) -> list[StepEvent]:
        return [s for s in self.steps if s.kind == "decode"]

    @property
    def done(self) -> bool:
        return self.seconds is not None

    def stats(self) -> RunStats | None:
        if not self.done:
            return None
        return summarize(self.steps, self.token_ids, self.seconds)

    def summary(self) -> dict:
        stats = self.stats()
        return {"policy": self.policy, "text": self.text, "token_ids": self.token_ids,
                "stats": None if stats is None else stats.to_dict()}


@dataclass(frozen=True)
class Divergence:
    """Where two token sequences first differ."""

    index: int  # first output position that differs
    ar_token: int | None  # None: the sequence ended there
    spec_token: int | None


@dataclass
class RunRecord:
    """Both lanes of one Run plus its settings."""

    preset: str
    prompt: str
    max_new_tokens: int
    policy: str
    policy_config: dict
    media: dict  # {"image": name or None, "video": name or None, "frames": n}
    ar: Lane = field(default_factory=lambda: Lane("ar", "ar"))
    spec: Lane = field(default_factory=lambda: Lane("spec", "sage"))
    stopped: bool = False  # the user pressed Stop: the lanes may be incomplete
    backends: dict = field(default_factory=dict)  # what each model ran on, and why a faster path was turned down
    alternated: bool = False  # the lanes decoded in turns (race.py), not one after the other
    retiming: int = 0  # the texts are done and round `retiming` (2, 3, ...) of the race's timing runs
    sage_cfg: object = None  # the knobs panel's SageConfig, drawn by the alpha -> (D, W) chart (not exported)

    @property
    def done(self) -> bool:
        return self.ar.done and self.spec.done

    def divergence(self) -> Divergence | None:
        a, b = self.ar.token_ids, self.spec.token_ids
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else None
            y = b[i] if i < len(b) else None
            if x != y:
                return Divergence(i, x, y)
        return None

    @property
    def rule(self) -> str:
        """How the speculative lane's target accepted draft tokens (engine TreeView.rule): "ratio" samples
        differently from the autoregressive lane for the same seed (same distribution, different draw)."""
        return next((s.tree.rule for s in self.spec.decode_steps if s.tree is not None), "greedy")

    def speedup(self) -> float | None:
        sa, ss = self.ar.stats(), self.spec.stats()
        if sa is None or ss is None or sa.tokens_per_second <= 0:
            return None
        return ss.tokens_per_second / sa.tokens_per_second

    def cpu_speedup(self) -> float | None:
        """Tokens per CPU second, speculative over autoregressive (the lanes took turns; else None): what each lane
        cost the processor, which a busy neighbour changes less than the clock (it mostly makes a lane wait)."""
        a, s = self.ar, self.spec
        if not (self.done and a.cpu_seconds and s.cpu_seconds and a.token_ids and s.token_ids):
            return None
        return (len(s.token_ids) / s.cpu_seconds) / (len(a.token_ids) / a.cpu_seconds)

    def headline_speedup(self) -> float | None:
        """The speedup the page leads with: in CPU time when the lanes took turns, else by the clock."""
        cpu = self.cpu_speedup()
        return self.speedup() if cpu is None else cpu

    def forwards_ratio(self) -> float | None:
        """Target forwards of the autoregressive lane over the speculative lane's (machine-independent)."""
        sa, ss = self.ar.stats(), self.spec.stats()
        if sa is None or ss is None or not ss.target_forwards:
            return None
        return sa.target_forwards / ss.target_forwards

    def summary(self) -> dict:
        """The API's JSON summary: {"ar": {...}, "speculative": {...}} plus the comparison."""
        div = self.divergence()
        ar = self.ar.summary()
        ar.pop("policy")
        return {
            "ar": ar,
            "speculative": self.spec.summary(),
            "identical": self.done and div is None,
            "rule": self.rule,
            "sampling": self.policy_config.get("sampling"),  # temperature, top_p, seed (temperature 0: greedy)
            "divergence": None if div is None else vars(div),
            "speedup": self.speedup(),
            "cpu_speedup": self.cpu_speedup(),
            "forwards_ratio": self.forwards_ratio(),
            "timed_rounds": len(self.spec.rounds) or None,  # in turns: how many times the race was decoded to time it
            "preset": self.preset,
            "stopped": self.stopped,
            "backends": self.backends,
        }

    def export(self) -> dict:
        """The full run for download: settings, both lanes' step events with arrival times, stats."""
        def lane(x: Lane) -> dict:
            return {**x.summary(), "seconds": x.seconds, "cpu_seconds": x.cpu_seconds, "rounds": x.rounds,
                    "steps": [{**s.to_dict(), "arrival_s": t} for s, t in zip(x.steps, x.arrivals)]}

        return {
            "format": "sage-run/1",
            "preset": self.preset,
            "prompt": self.prompt,
            "media": self.media,
            "max_new_tokens": self.max_new_tokens,
            "policy": self.policy,
            "policy_config": self.policy_config,
            "note": ("the two decoders took turns on the same input in lockstep by tokens, never at the same "
                     "time; each lane's seconds are the sum of its own steps, the mean of its timed rounds (a short "
                     "race is decoded again to time it; its steps' arrival_s are the first round's, scaled to that "
                     "mean)" if self.alternated else
                     "the two decoders ran one after the other on the same input, never at the same time"),
            "alternated": self.alternated,
            "ar": lane(self.ar),
            "speculative": lane(self.spec),
            **{k: v for k, v in self.summary().items() if k not in ("ar", "speculative")},
        }

    @classmethod
    def from_export(cls, run: dict) -> RunRecord:
        """The record back from `export()` (a cached example's run file): steps, arrival times, texts, stats,
        the bonus texts of the tree plots. Not restored: the per-step origin segments of the text."""
        def lane(name: str, x: dict) -> Lane:
            steps, arrivals = [], []
            for d in x["steps"]:
                d = dict(d)
                arrivals.append(d.pop("arrival_s"))
                tree = d.pop("tree")
                steps.append(StepEvent(**d, tree=TreeView(**tree) if tree else None))
            return Lane(name, x.get("policy", "ar"), steps=steps, token_ids=list(x["token_ids"]), arrivals=arrivals,
                        text=x["text"], seconds=x["seconds"], cpu_seconds=x.get("cpu_seconds"),
                        rounds=[tuple(r) for r in x.get("rounds", [])])

        if run.get("format") != "sage-run/1":
            raise ValueError(f"not a sage-run/1 export: {run.get('format')!r}")
        return cls(run["preset"], run["prompt"], run["max_new_tokens"], run["policy"], run["policy_config"],
                   run["media"], ar=lane("ar", run["ar"]), spec=lane("spec", run["speculative"]),
                   stopped=bool(run.get("stopped")), backends=run.get("backends") or {},
                   alternated=bool(run.get("alternated")))
