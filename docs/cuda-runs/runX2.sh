#!/bin/bash
# Where the outliers of the pair come from: the same criterion pair, unpinned, with
# predictive mode's actions off (forecasts made, no advice followed), with the
# forecaster `none`, and with the defaults again.
set -u
cd "$(dirname "$0")"
uptime
for conf in "predictive_actions:none" "forecaster:none" "" "predictive_actions:none" "forecaster:none" ""; do
  echo "== MEMCAST_ALLOC_CONF=$conf"
  MEMCAST_ALLOC_CONF="$conf" ./alloc_free-bench --bench 'alloc_free/memcast' --warm-up-time 3 --measurement-time 8 2>&1 \
    | grep -E "^alloc_free/|time:" | grep -v "%"
done
uptime
