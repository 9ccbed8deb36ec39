"""Input-level detection at the API: STRIP (:mod:`.strip`), also usable as a ``guard serve`` monitor."""
