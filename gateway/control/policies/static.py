"""`static`: one configured k for every class (the baseline adaptive must beat).

k = clamp(default_k, k_min, k_max). No parameters beyond `default_k`.
"""

from __future__ import annotations

from gateway.control.policies.base import Choice, PolicyInput


class StaticPolicy:
    name = "static"

    def __init__(self, default_k: int) -> None:
        self.default_k = default_k

    def choose(self, inp: PolicyInput) -> Choice:
        k = min(max(self.default_k, inp.k_min), inp.k_max)
        return Choice(k, f"static k={k}")
