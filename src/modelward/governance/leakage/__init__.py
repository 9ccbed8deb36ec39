"""Label leakage of split training: the attacks (:mod:`.attacks`), the audit study (:mod:`.study`) and its run
over real party processes (:mod:`.parties`)."""
