"""Trust material of the parties: certificates and keys (:mod:`.certs`), pinned identities (:mod:`.identity`)."""
