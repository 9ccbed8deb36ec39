"""Suite-wide settings: hypothesis is derandomized (the same examples every run) so CI is reproducible; set
HYPOTHESIS_PROFILE=dev for fresh random examples while developing."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
