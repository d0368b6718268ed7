#!/bin/bash
# The fast-path cost on the H200 host with memcast and memcast-predictive timed in
# alternation: three criterion runs pinned to two cores, three unpinned, and the
# alternating example.
set -u
cd "$(dirname "$0")"
nproc; uptime
for pin in "taskset -c 4,5" ""; do
  for i in 1 2 3; do
    echo "== run $i ${pin:-unpinned}"
    $pin ./alloc_free-bench --bench 'alloc_free/memcast' --warm-up-time 3 --measurement-time 8 2>&1 \
      | grep -E "^alloc_free/|time:|thrpt:"
  done
done
taskset -c 4,5 ./predictive_cost 2>&1 | tail -6
uptime
