#!/usr/bin/env bash
# Stop and remove the docker-compose cluster started by cluster-up.sh (all
# five node containers if there were five) and its network.
#
#   scripts/cluster-down.sh            # keep the data volumes
#   scripts/cluster-down.sh --volumes  # delete the nodes' data too
set -euo pipefail
cd "$(dirname "$0")/.."

volumes=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -v|--volumes) volumes=(--volumes); shift ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "cluster-down.sh: unknown argument $1; see --help" >&2; exit 2 ;;
  esac
done

project="${DEDUPNODE_PROJECT:-dedupnode}"
if docker-compose version >/dev/null 2>&1; then
  compose=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  echo "cluster-down.sh: neither docker-compose nor 'docker compose' is installed" >&2; exit 1
fi
# Unpause first: a container the chaos runner left paused cannot be stopped.
for id in $(docker ps -q --filter "label=com.docker.compose.project=$project" --filter status=paused); do
  docker unpause "$id" >/dev/null || true
done
"${compose[@]}" -p "$project" -f docker-compose.yml -f docker-compose.5nodes.yml down --remove-orphans "${volumes[@]}"
