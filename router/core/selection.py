"""Which of a topic's owed subscriptions a message goes to, when some have selectors
(docs/selectors.md): the roster of those whose selector selects it, each distinct
selector evaluated once per message. Pure."""

from __future__ import annotations

from router.core.msgfields import application_properties, application_values, selector_env
from router.core.records import DeliveryRecord, Roster

#: Selections (which subscriptions select a message) whose roster a topic's roster keeps made.
MAX_SELECTIONS = 64


def selected_roster(record: DeliveryRecord, roster: Roster) -> Roster:
    """The roster of the subscriptions whose selector selects ``record`` (``roster``
    itself when all do); the others go into ``record.filtered``."""
    payload = record.payload or b""
    values_test = roster.values_test
    if values_test is not None:  # one selector here: its properties as a tuple, no dict
        if values_test(application_values(payload, roster.names)):
            return roster
        verdicts = [False]
    else:
        # Only the application properties the selectors read, unless one reads a JMS name.
        env = selector_env(payload) if roster.headers else application_properties(payload, roster.names)
        tests = roster.tests
        for test in tests:
            if not test(env):
                break
        else:
            return roster  # every selector selects it: the usual case, so the cheapest
        # (Each test is some subscription's: one that fails leaves someone out.)
        failed = tests.index(test)
        verdicts = [True] * failed + [False] + [test(env) for test in tests[failed + 1 :]]
    chosen = tuple(True if i < 0 else verdicts[i] for i in roster.test_of)
    record.filtered = [sub.key for sub, yes in zip(roster.subs, chosen) if not yes]
    selected = roster.selections.get(chosen)
    if selected is None:
        selected = Roster(sub for sub, yes in zip(roster.subs, chosen) if yes)
        if len(roster.selections) < MAX_SELECTIONS:  # (2^n selections of n selectors: keep the usual few)
            roster.selections[chosen] = selected
    return selected
