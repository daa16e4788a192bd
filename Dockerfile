# dedupnode container image: the static binary and nothing else.
#
# The binary is built beforehand on the host (the goreleaser convention; no
# base image needs to be pulled), and the build context is dist/:
#
#   CGO_ENABLED=0 go build -trimpath -o dist/dedupnode ./cmd/dedupnode
#   mkdir -p dist/data
#   docker build -t dedupnode:local -f Dockerfile dist
#
# scripts/cluster-up.sh does exactly this, then starts docker-compose.yml.
FROM scratch

COPY dedupnode /dedupnode
# The data directory, owned by the unprivileged user so that a named volume
# mounted here starts out writable for it.
COPY --chown=65532:65532 data/ /data/

USER 65532:65532
VOLUME ["/data"]
# 7000: Raft between nodes; 7070: gRPC for clients and forwarding.
EXPOSE 7000 7070

ENTRYPOINT ["/dedupnode"]
CMD ["--help"]
