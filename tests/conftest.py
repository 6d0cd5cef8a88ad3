"""Suite-wide settings: hypothesis profiles.

``HYPOTHESIS_PROFILE=ci`` (set by ``scripts/test`` when ``CI=true``) runs fewer,
derandomized examples with no per-example deadline (CI machines are slow and
shared; a flaky deadline failure tells us nothing). ``dev`` (the default) runs
more examples, randomized, with hypothesis' default deadline, so local runs keep
exploring new inputs and notice slow code. Tests doing real I/O (the integration
fuzz test) set ``deadline=None`` themselves.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=100,
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
