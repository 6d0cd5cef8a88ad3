"""The slow-subscriber warning: a subscriber that holds records past an age
(``[logging] slow_subscriber_age``) is named in the log, since under exactly-once
every publisher delivery it was owed waits for its answer (docs/operations.md).

Checked at most once a second from the event loop, reading each topic's records
oldest first and stopping at the first one younger than the age, so a healthy
router reads one record per topic. Each subscriber is named at most once per age
period, with how many records it holds past the age and the oldest one's age.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("eorouter.slow")


class SlowSubscribers:
    def __init__(self, age: float) -> None:
        self.age = age
        self.next_check = 0.0
        self._warned: dict[str, float] = {}  # subscriber key -> when it was last named

    def due(self, now: float) -> bool:
        return self.age > 0 and now >= self.next_check

    def check(self, core: Any, now: float) -> list[tuple[str, str, int, float]]:
        """Warn about every subscriber holding records older than the age; returns
        what it warned about: (subscriber, topic, records, oldest age)."""
        self.next_check = now + min(1.0, self.age)
        held: dict[tuple[str, str], list] = {}  # (subscriber, topic) -> [records, oldest age]
        for topic in core.topics.values():
            for record in topic.records.values():  # oldest first
                age = now - record.arrived if record.arrived else 0.0
                if age < self.age:
                    break
                if record.pub_settled and record.outcome is not None:
                    continue  # answered and settled: lingering, not waiting
                states = record.expanded_states() if record.compact else record.subscribers
                for key, state in states.items():
                    if state.outcome is None:
                        entry = held.setdefault((key, topic.name), [0, age])
                        entry[0] += 1
        warned = []
        for (key, topic_name), (count, oldest) in held.items():
            last = self._warned.get(key)
            if last is not None and now - last < self.age:
                continue
            self._warned[key] = now
            log.warning(
                "slow subscriber %s: %d record(s) of topic %s unanswered past %gs (oldest %.1fs); their "
                "publishers' outcomes wait for it",
                key,
                count,
                topic_name,
                self.age,
                oldest,
                extra={"subscriber": key, "topic": topic_name, "records": count, "oldest_s": round(oldest, 3)},
            )
            warned.append((key, topic_name, count, oldest))
        for key in [k for k, t in self._warned.items() if now - t > 10 * self.age]:
            del self._warned[key]  # bounded: subscribers long quiet are forgotten
        return warned
