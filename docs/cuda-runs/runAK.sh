#!/bin/bash
# Run AK: runAJ.sh again, unchanged, after the need a forecast gives stopped at the level
# envelope (`Forecast::level_envelope`): the dynamic workloads reactive and predictive,
# six processes at a time, with predictive mode's log at debug, then
# `gpt2_dynseq_b8_bf16`, whose predictive run overshot in runs AI and AJ, four more
# times. Staged with scripts/stage-gpu.sh .gpu; run from the repository root; figures
# in $OUT.
exec bash "$(dirname "$0")/runAJ.sh" "$@"
