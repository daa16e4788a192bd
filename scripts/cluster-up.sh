#!/usr/bin/env bash
# Build the static dedupnode binary and its FROM-scratch image offline, then
# start the docker-compose cluster and wait until every node is healthy.
#
#   scripts/cluster-up.sh             # 3 nodes, clients on 127.0.0.1:7070-7072
#   scripts/cluster-up.sh --nodes 5   # 5 nodes, 127.0.0.1:7070-7074
#   scripts/cluster-up.sh --no-build  # reuse dist/dedupnode and the image
#   scripts/cluster-up.sh --build-only  # build dist/dedupnode and the image, start nothing
#                                       # (then: dist/dedupnode chaos --mode docker)
#
# Environment: DEDUPNODE_PROJECT (compose project, default dedupnode),
# DEDUPNODE_IMAGE (default dedupnode:local), DEDUPNODE_NET (first three
# octets of the compose network, default 172.29.70).
set -euo pipefail
cd "$(dirname "$0")/.."

nodes=3
build=1
start=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --nodes=*) nodes="${1#*=}"; shift ;;
    --no-build) build=0; shift ;;
    --build-only) start=0; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "cluster-up.sh: unknown argument $1; see --help" >&2; exit 2 ;;
  esac
done
if [[ "$nodes" != 3 && "$nodes" != 5 ]]; then
  echo "cluster-up.sh: --nodes must be 3 or 5" >&2; exit 2
fi

project="${DEDUPNODE_PROJECT:-dedupnode}"
image="${DEDUPNODE_IMAGE:-dedupnode:local}"
export DEDUPNODE_IMAGE="$image"

if docker-compose version >/dev/null 2>&1; then
  compose=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  echo "cluster-up.sh: neither docker-compose nor 'docker compose' is installed" >&2; exit 1
fi
files=(-f docker-compose.yml)
[[ "$nodes" == 5 ]] && files+=(-f docker-compose.5nodes.yml)

if [[ "$build" == 1 ]]; then
  echo "building dist/dedupnode (static, CGO_ENABLED=0)"
  mkdir -p dist/data
  CGO_ENABLED=0 go build -trimpath -o dist/dedupnode ./cmd/dedupnode
  echo "building image $image FROM scratch"
  docker build -q -t "$image" -f Dockerfile dist >/dev/null
fi
if [[ "$start" == 0 ]]; then
  echo "built dist/dedupnode and image $image"
  exit 0
fi

"${compose[@]}" -p "$project" "${files[@]}" up -d

echo "waiting for $nodes healthy nodes"
deadline=$((SECONDS + 120))
while :; do
  healthy=0
  for i in $(seq 1 "$nodes"); do
    id=$("${compose[@]}" -p "$project" "${files[@]}" ps -q "node$i" 2>/dev/null || true)
    [[ -z "$id" ]] && continue
    st=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id" 2>/dev/null || true)
    [[ "$st" == healthy ]] && healthy=$((healthy + 1))
  done
  [[ "$healthy" == "$nodes" ]] && break
  if (( SECONDS > deadline )); then
    echo "cluster-up.sh: only $healthy of $nodes nodes healthy after 120 s; see: ${compose[*]} -p $project logs" >&2
    exit 1
  fi
  sleep 1
done

addrs=$(seq -s, 7070 $((7070 + nodes - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
echo "cluster up: $nodes nodes"
echo "addrs: $addrs"
if [[ -x dist/dedupnode ]]; then
  dist/dedupnode status --addr "$addrs" || true
fi
echo
echo "try:  dist/dedupnode mark --addr $addrs order-1 order-2"
echo "      dist/dedupnode check --addr $addrs order-1 order-3"
echo "stop: scripts/cluster-down.sh [--volumes]"
