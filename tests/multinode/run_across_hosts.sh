#!/usr/bin/env bash
# Runs MPI test binaries across the two network-namespace hosts of netns-hosts.sh: RANKS ranks on
# each host, the node count checked by the tests (ZRT_EXPECT_NODES=2). Exit 77 where namespaces
# cannot be made here.
#
#   run_across_hosts.sh RANKS_PER_HOST TEST_BINARY...
set -u
[ $# -ge 2 ] || { echo "usage: $0 RANKS_PER_HOST TEST_BINARY..." >&2; exit 2; }
per_host=$1; shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hosts="$here/netns-hosts.sh"
"$hosts" check > /dev/null || exit 77
exec 9> /run/zrt-multinode.lock && flock 9  # one user of the test hosts at a time
"$hosts" up || exit 1
trap '"$hosts" down' EXIT
status=0
for test in "$@"; do
  echo "== $(basename "$test") on zrt-h1:$per_host + zrt-h2:$per_host"
  timeout 120 "$hosts" mpirun --host "zrt-h1:$per_host,zrt-h2:$per_host" -n $((2 * per_host)) \
    --oversubscribe --bind-to none -x ZRT_EXPECT_NODES=2 -x OMP_NUM_THREADS=1 \
    -x ZRT_LOG_LEVEL=warn "$test" || status=1
done
exit $status
