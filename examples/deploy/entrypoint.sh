#!/bin/sh
# Reads the PostgreSQL password from a secret file (never from the config), then runs the command.
set -e
if [ -n "$PGPASSWORD_FILE" ] && [ -f "$PGPASSWORD_FILE" ]; then
    PGPASSWORD="$(cat "$PGPASSWORD_FILE")"
    export PGPASSWORD
fi
exec "$@"
