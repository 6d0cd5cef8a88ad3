"""Which of a topic's owed subscriptions a message goes to, when some have selectors
(docs/selectors.md): the roster of those whose selector selects it, each distinct
selector evaluated once per message. Pure."""

from __future__ import annotations

from router.core.msgfields import selector_env
from router.core.records import DeliveryRecord, Roster

#: Selections (which subscriptions select a message) whose roster a topic's roster keeps made.
MAX_SELECTIONS = 64


def selected_roster(record: DeliveryRecord, roster: Roster) -> Roster:
    """The roster of the subscriptions whose selector selects ``record`` (``roster``
    itself when all do); the others go into ``record.filtered``."""
    env = selector_env(record.payload or b"", roster.headers)
    verdicts: dict[str, bool] = {}
    chosen = []
    for sub in roster.subs:
        selector = sub.selector
        if selector is None:
            chosen.append(True)
            continue
        verdict = verdicts.get(selector.text)
        if verdict is None:
            verdict = verdicts[selector.text] = selector.selects(env)
        chosen.append(verdict)
    if all(chosen):
        return roster
    record.filtered = [sub.key for sub, yes in zip(roster.subs, chosen) if not yes]
    selection = tuple(chosen)
    selected = roster.selections.get(selection)
    if selected is None:
        selected = Roster(sub for sub, yes in zip(roster.subs, chosen) if yes)
        if len(roster.selections) < MAX_SELECTIONS:  # (2^n selections of n selectors: keep the usual few)
            roster.selections[selection] = selected
    return selected
