"""Explanations section (filled in once the explanations area lands on main)."""

from __future__ import annotations

from pathlib import Path

from modelward.assess.config import AssessConfig
from modelward.assess.profiles import ProfileSizes
from modelward.assess.sections.common import NotAssessed, SectionResult
from modelward.assess.target import Target


def run(cfg: AssessConfig, target: Target, sizes: ProfileSizes, out: Path, root: Path) -> SectionResult:
    raise NotAssessed("this version of modelward has no explanations audit yet")
