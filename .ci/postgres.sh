#!/usr/bin/env bash
# guard-state: the PostgreSQL server the guard's store tests start (tests/extraction/test_store.py,
# tests/e2e/test_guard_replicas.py). Installs Debian's server package where it is missing; the tests start their own
# throwaway cluster from its binaries (as the 'postgres' user when run as root). Without it those tests skip.
set -u
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -q postgresql >/dev/null 2>&1 || \
    (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q postgresql >/dev/null 2>&1)) && \
    { systemctl stop postgresql >/dev/null 2>&1 || service postgresql stop >/dev/null 2>&1 || true; exit 0; }
fi
echo "note: PostgreSQL could not be installed; the guard's PostgreSQL store tests will skip"
exit 0
