# shellcheck shell=bash
# Shell helpers shared by scripts/fabric.sh, its test and the fabric benchmarks. Source it:
#   . "$(dirname "$0")/lib/netns.sh"      (or the path from the repository root)
# Nothing here changes the machine; the functions only check and compute.

# netns_unavailable: prints why network namespaces cannot be used here (and returns 0), or
# prints nothing and returns 1 when they can. Checks root, the ip command and `ip netns`.
netns_unavailable() {
  if [ "$(id -u)" != 0 ]; then
    echo "not root (network namespaces, veth and tc need CAP_NET_ADMIN/CAP_SYS_ADMIN)"
    return 0
  fi
  if ! command -v ip >/dev/null 2>&1; then
    echo "no ip command (install iproute2)"
    return 0
  fi
  local err
  if ! err=$(ip netns list 2>&1 >/dev/null); then
    echo "ip netns is unavailable: ${err:-ip netns list failed}"
    return 0
  fi
  return 1
}

# median V1 V2 ...: the median of numbers (the mean of the middle two for an even count).
median() {
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) exit 1
    if (NR % 2) printf "%.6g\n", v[(NR + 1) / 2]; else printf "%.6g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# rate_bits RATE: bits per second of a rate such as 1gbit, 100mbit, 2.5Gbit/s, 1Gbps, 800kbit
# (bits only: Gbps/Mbps are bits as in docs/topology.md; a bare "bps", which tc reads as
# bytes, is refused rather than guessed). Prints the
# integer, or nothing and returns 1 when RATE does not parse or is under 1 kbit/s.
rate_bits() {
  echo "$1" | awk '{
    s = tolower($0)
    if (s !~ /^[0-9]+(\.[0-9]+)?([kmgt])?(bit|bit\/s|bits\/s|bps)$/) exit 1
    if (s ~ /^[0-9.]+bps$/) exit 1
    n = s; sub(/[kmgt]?(bit|bit\/s|bits\/s|bps)$/, "", n)
    u = s; sub(/^[0-9.]+/, "", u); m = 1
    if (u ~ /^k/) m = 1e3; else if (u ~ /^m/) m = 1e6; else if (u ~ /^g/) m = 1e9; else if (u ~ /^t/) m = 1e12
    v = n * m
    if (v < 1000) exit 1
    printf "%.0f\n", v }'
}
