"""Bounded classes under adversarial input; LRU eviction of idle classes."""

from __future__ import annotations

import random
import string

from gateway.control.classify import OTHER, Classifier, RequestClass
from gateway.control.controller import Controller
from gateway.control.decision import LoadSnapshot
from gateway.control.features import RequestFeatures, features_from_chat
from gateway.control.settings import ControllerSettings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def random_template(rng: random.Random) -> RequestFeatures:
    words = "".join(rng.choices(string.ascii_letters + " ", k=40))
    tools = [{"type": "function", "function": {"name": "f"}}] if rng.random() < 0.5 else None
    return features_from_chat(
        [{"role": "system", "content": words}, {"role": "user", "content": "x"}],
        tools,
        None,
        None,
        rng.randint(1, 40_000),
    )


def test_thousands_of_random_templates_stay_bounded() -> None:
    clock = Clock()
    settings = ControllerSettings(max_classes=32)
    controller = Controller(settings, rng=random.Random(1), clock=clock)
    rng = random.Random(7)
    seen: set[str] = set()
    for _ in range(5000):
        clock.now += 0.01
        cls = controller.classify(random_template(rng))
        controller.decide(cls, LoadSnapshot())
        seen.add(cls.class_id)
    assert len(seen) == 33  # 32 live classes + `other`
    assert OTHER.class_id in seen
    assert len(controller.snapshot()) <= 33


def test_idle_classes_are_evicted_lru_first() -> None:
    clock = Clock()
    evicted: list[RequestClass] = []
    classifier = Classifier(2, idle_s=10.0, cache_size=64, clock=clock, on_evict=evicted.append)
    a = classifier.classify(RequestFeatures("chatml"))
    clock.now = 1.0
    b = classifier.classify(RequestFeatures("llama2"))
    clock.now = 5.0
    assert classifier.classify(RequestFeatures("alpaca")) is OTHER  # nothing idle yet
    clock.now = 12.0
    classifier.classify(RequestFeatures("llama2"))  # b is recently used, a is idle
    c = classifier.classify(RequestFeatures("alpaca"))
    assert c is not OTHER
    assert evicted == [a]
    assert {x.class_id for x in classifier.live()} == {b.class_id, c.class_id}


def test_identical_features_hit_the_cache_and_keep_their_class() -> None:
    classifier = Classifier(4, idle_s=0.0, cache_size=16, clock=Clock())
    first = classifier.classify(RequestFeatures("chat", length=128))
    again = classifier.classify(RequestFeatures("chat", length=128))
    assert first is again
    assert len(classifier) == 1
