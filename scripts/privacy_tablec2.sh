#!/usr/bin/env bash
# Table C.2 (BCW rows) and Fig. C.1: the BCW target with no defense, dropout, and DP-SGD at ε ∈ {0.25, 1, 4, 16}.
# Usage: scripts/privacy_tablec2.sh OUT_DIR   (each row is a resumable `modelward privacy audit` study)
set -euo pipefail
OUT=${1:-runs/tablec2}
MW="python -m modelward.cli.main"
$MW privacy audit examples/privacy_bcw.toml --out "$OUT/none"
$MW privacy audit examples/privacy_bcw.toml --out "$OUT/dropout" --set defense.kind=dropout --set defense.dropout=0.5
for eps in 0.25 1 4 16; do
  $MW privacy audit examples/privacy_bcw_dp.toml --out "$OUT/dp_eps$eps" --set defense.dp.target_epsilon=$eps
done
