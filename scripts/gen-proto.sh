#!/usr/bin/env bash
# Regenerates api/**/*.pb.go from the .proto files with pinned tool versions.
# Needs protoc (Debian: apt-get install protobuf-compiler, 3.21.x).
set -euo pipefail
cd "$(dirname "$0")/.."
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
PROTOC_GEN_GO_VTPROTO_VERSION=v0.6.1-0.20240319094008-0393e58bdf10
bin="$(pwd)/.bin"
mkdir -p "$bin"
GOBIN="$bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
GOBIN="$bin" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
GOBIN="$bin" go install "github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@${PROTOC_GEN_GO_VTPROTO_VERSION}"
command -v protoc >/dev/null || { echo "protoc not found: apt-get install -y protobuf-compiler" >&2; exit 1; }
PATH="$bin:$PATH" protoc -I api \
  --go_out=api --go_opt=paths=source_relative \
  --go-grpc_out=api --go-grpc_opt=paths=source_relative \
  --go-vtproto_out=api --go-vtproto_opt=paths=source_relative,features=marshal+unmarshal+size \
  api/dedup/v1/dedup.proto api/dedup/v1/ops.proto
echo "generated api/dedup/v1"
