#!/usr/bin/env bash
# Two test hosts on one machine, for multi-node runs over real TCP without sshd: each host is a
# network namespace (a veth pair between them, 10.231.0.1 and .2) plus a UTS namespace with its
# own host name (zrt-h1, zrt-h2). The host names matter: OpenMPI 4.1 identifies nodes by name,
# and two hosts that share one crash in MPI_Comm_dup after MPI_Comm_split_type.
#
#   netns-hosts.sh up                  make the hosts (idempotent; needs root: CAP_SYS_ADMIN, CAP_NET_ADMIN)
#   netns-hosts.sh down                remove them
#   netns-hosts.sh shape RATE [DELAY]  shape the link both ways with tc: tbf at RATE, netem DELAY
#                                      where the kernel has netem (e.g. 1gbit 0.5ms)
#   netns-hosts.sh unshape             remove the shaping
#   netns-hosts.sh cut | heal          take the link down / up (a cut cable)
#   netns-hosts.sh mpirun ARGS...      run mpirun on zrt-h1 with ranks on both hosts: ARGS are
#                                      mpirun's (add --host zrt-h1:N,zrt-h2:N); the rsh agent
#                                      below starts OpenMPI's daemon on zrt-h2 with nsenter
#   netns-hosts.sh exec HOST CMD...    run CMD on host 1 or 2
#   netns-hosts.sh check               exit 0 if the hosts can be made here, else 77 with why
#
# Exit code 77 (skip) when namespaces cannot be made here (not root, no ip/unshare/nsenter).
set -euo pipefail

state=/run/zrt-multinode
ns() { echo "zrtmn$1"; }
veth() { echo "veth-zrtmn$1"; }
addr() { echo "10.231.0.$1"; }

skip() { echo "netns-hosts: SKIPPED: $*" >&2; exit 77; }

can_make() {
  [ "$(id -u)" -eq 0 ] || { echo "not root"; return 1; }
  local tool
  for tool in ip unshare nsenter; do
    command -v "$tool" >/dev/null || { echo "$tool not found"; return 1; }
  done
  ip netns add "zrtmn-probe-$$" 2>/dev/null || { echo "cannot create network namespaces (ip netns add)"; return 1; }
  ip netns del "zrtmn-probe-$$"
  unshare --uts true 2>/dev/null || { echo "cannot create UTS namespaces (unshare --uts)"; return 1; }
  return 0
}

in_host() {  # in_host N CMD...: CMD in host N's network and UTS namespaces
  local n="$1"; shift
  exec nsenter --net="/run/netns/$(ns "$n")" --uts="$state/uts$n" -- "$@"
}

up() {
  local why
  why=$(can_make) || skip "$why"
  mkdir -p "$state"
  for n in 1 2; do
    ip netns list | grep -qw "$(ns "$n")" || ip netns add "$(ns "$n")"
    ip -n "$(ns "$n")" link set lo up
    if [ ! -e "$state/uts$n" ] || ! nsenter --uts="$state/uts$n" true 2>/dev/null; then
      touch "$state/uts$n"
      unshare --uts="$state/uts$n" hostname "zrt-h$n"
    fi
  done
  if ! ip -n "$(ns 1)" link show "$(veth 1)" >/dev/null 2>&1; then
    ip link add "$(veth 1)" netns "$(ns 1)" type veth peer name "$(veth 2)" netns "$(ns 2)"
    for n in 1 2; do
      ip -n "$(ns "$n")" addr add "$(addr "$n")/24" dev "$(veth "$n")"
    done
  fi
  for n in 1 2; do ip -n "$(ns "$n")" link set "$(veth "$n")" up; done
  # The hosts find each other by name: a hosts file both use (bind-mounted by `exec`).
  printf '127.0.0.1 localhost\n%s zrt-h1\n%s zrt-h2\n' "$(addr 1)" "$(addr 2)" > "$state/hosts"
  # The rsh agent mpirun calls as `agent [options] HOST COMMAND...`.
  cat > "$state/rsh-agent" <<AGENT
#!/usr/bin/env bash
# plm_rsh_agent for the netns test hosts: runs the daemon's command on zrt-hN in its namespaces.
while [ \$# -gt 0 ] && [[ "\$1" == -* ]]; do shift; done
host="\$1"; shift
case "\$host" in zrt-h1|$(addr 1)) n=1 ;; zrt-h2|$(addr 2)) n=2 ;; *) echo "rsh-agent: unknown host \$host" >&2; exit 255 ;; esac
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/netns-hosts.sh" exec "\$n" /bin/sh -c "\$*"
AGENT
  chmod +x "$state/rsh-agent"
  echo "netns-hosts: zrt-h1 ($(addr 1)) <-> zrt-h2 ($(addr 2)) up"
}

down() {
  for n in 1 2; do
    ip netns del "$(ns "$n")" 2>/dev/null || true
    if [ -e "$state/uts$n" ]; then umount "$state/uts$n" 2>/dev/null || true; fi
  done
  rm -rf "$state"
}

shape() {
  local rate="$1" delay="${2:-}"
  for n in 1 2; do
    local dev=(-n "$(ns "$n")" qdisc replace dev "$(veth "$n")")
    if [ -n "$delay" ] && tc "${dev[@]}" root handle 1: netem delay "$delay" 2>/dev/null; then
      tc "${dev[@]}" parent 1:1 handle 10: tbf rate "$rate" burst 256kb latency 50ms
    else
      # Some kernels lack sch_netem: the rate is still shaped, the delay is not.
      [ -n "$delay" ] && [ "$n" -eq 1 ] &&
        echo "netns-hosts: netem unavailable in this kernel; shaping the rate only (no $delay delay)" >&2
      tc "${dev[@]}" root handle 1: tbf rate "$rate" burst 256kb latency 50ms
    fi
  done
}

cmd="${1:-}"; shift || true
case "$cmd" in
  check) why=$(can_make) || skip "$why"; echo "netns-hosts: namespaces can be made here" ;;
  up) up ;;
  down) down ;;
  shape) [ $# -ge 1 ] || { echo "usage: netns-hosts.sh shape RATE [DELAY]" >&2; exit 2; }; shape "$@" ;;
  unshape) for n in 1 2; do tc -n "$(ns "$n")" qdisc del dev "$(veth "$n")" root 2>/dev/null || true; done ;;
  cut) ip -n "$(ns 1)" link set "$(veth 1)" down ;;
  heal) for n in 1 2; do ip -n "$(ns "$n")" link set "$(veth "$n")" up; done ;;
  exec)
    n="$1"; shift
    [ -d "/run/netns" ] && [ -e "$state/uts$n" ] || { echo "netns-hosts: host $n is not up (netns-hosts.sh up)" >&2; exit 2; }
    # Own mount namespace only to give the host its hosts file.
    exec unshare --mount --propagation private -- sh -c \
      'mount --bind "$0/hosts" /etc/hosts && netns=$1 && n=$2 && shift 2 &&
       exec nsenter --net="/run/netns/$netns" --uts="$0/uts$n" -- "$@"' \
      "$state" "$(ns "$n")" "$n" "$@" ;;
  mpirun)
    [ -x "$state/rsh-agent" ] || { echo "netns-hosts: hosts are not up (netns-hosts.sh up)" >&2; exit 2; }
    exec "$0" exec 1 mpirun --mca plm_rsh_agent "$state/rsh-agent" \
      --mca oob_tcp_if_include "$(addr 0)/24" --mca btl_tcp_if_include "$(addr 0)/24" "$@" ;;
  *) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
