"""The seeded trace of ``class_day.py``: who arrives when, how they work, how they leave.

The model and why it is a course lab are in ``class_day.py``'s docstring (``--help``). Every
random draw of a person comes from that person's own streams (``Person.stream``), so the k-th
burst of a student has the same length in every scenario, whenever it happens, and a retry pause
never shifts the work that follows it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime

CLASS, OTHERS, VISITORS = "ml-course", "research", "nlp-course"
START = datetime(2026, 12, 8, 10, 0, tzinfo=UTC)  # a Tuesday, 10:00
CLASS_MINUTES, LECTURE, PRE = 120.0, (45.0, 60.0), 30.0  # the simulation starts PRE minutes early


@dataclass
class Person:
    name: str
    groups: tuple[str, ...]
    # student | visitor (another course's homework) | job (asks during class) | training | forgotten (hold
    # GPUs from before class) | morning (the session before class: holds a GPU until it leaves around 10:00)
    kind: str
    arrival: float
    week_hours: float
    part1: int = 0  # bursts before the lecture's end
    part2: int = 0  # bursts after it (0: CPU work only)
    stops_when_done: bool = False
    leave: float = CLASS_MINUTES
    abandons: bool = False  # leaves without stopping the server
    job_minutes: float = 0.0
    seed: int = 0

    def stream(self, purpose: str) -> random.Random:
        """One random stream per person and purpose: the k-th burst is the same in every scenario."""
        return random.Random(f"{self.seed}-{purpose}")


def make_trace(students: int, seed: int, gpus: int = 8) -> list[Person]:
    rng = random.Random(seed)
    people = []
    for i in range(students):
        arrival = rng.uniform(0, 10) if rng.random() < 0.75 else rng.uniform(10, 60)
        r = rng.random()
        hours = rng.uniform(0, 2) if r < 0.7 else rng.uniform(2, 8) if r < 0.9 else rng.uniform(8, 25)
        part2 = rng.randint(2, 5) if rng.random() < 0.4 else 0
        early = rng.random() < 0.15
        people.append(
            Person(
                f"student{i:04d}",
                (CLASS,),
                "student",
                arrival,
                hours,
                rng.randint(3, 6),
                part2,
                rng.random() < 0.3,
                rng.uniform(50, 110) if early else CLASS_MINUTES,
                early and rng.random() < 0.5,
                seed=rng.randrange(1 << 30),
            )
        )
    for i in range(max(1, students // 20)):
        kind = "training" if i % 3 == 0 else "forgotten"
        people.append(Person(f"held{i:03d}", (OTHERS,), kind, -PRE, rng.uniform(20, 60), seed=rng.randrange(1 << 30)))
    for i in range(max(1, gpus // 2)):
        leave = rng.uniform(-5, 10)
        people.append(
            Person(
                f"morning{i:03d}",
                (VISITORS,),
                "morning",
                -PRE,
                rng.uniform(0, 3),
                leave=leave,
                abandons=rng.random() < 0.5,
                seed=rng.randrange(1 << 30),
            )
        )
    for i in range(max(2, students // 15)):
        people.append(
            Person(
                f"job{i:03d}",
                (OTHERS,),
                "job",
                rng.uniform(-PRE, 110),
                rng.uniform(20, 60),
                job_minutes=rng.uniform(20, 60),
                seed=rng.randrange(1 << 30),
            )
        )
    for i in range(max(2, students // 10)):
        arrival = rng.uniform(-20, 100)
        people.append(
            Person(
                f"visitor{i:03d}",
                (VISITORS,),
                "visitor",
                arrival,
                rng.uniform(0, 3),
                part1=rng.randint(2, 4),
                leave=arrival + rng.uniform(40, 80),
                abandons=rng.random() < 0.5,
                seed=rng.randrange(1 << 30),
            )
        )
    return people


BURST_MEDIAN = [3.0]  # minutes; --burst-minutes


def burst(rng: random.Random) -> float:
    return rng.lognormvariate(math.log(BURST_MEDIAN[0]), 0.6)


def stretch(rng: random.Random) -> float:
    return rng.uniform(20, 40) if rng.random() < 0.2 else rng.expovariate(1 / 12)
