#!/bin/sh
# Regenerates kjob.pb.go. Needs protoc (apt-get install -y protobuf-compiler); the Go
# plugin is pinned to the protobuf version in go.mod and installed into a local bin.
set -eu
cd "$(dirname "$0")"
version=$(cd .. && go list -m -f '{{.Version}}' google.golang.org/protobuf)
bin=$(pwd)/../.bin
mkdir -p "$bin"
if [ ! -x "$bin/protoc-gen-go" ] || [ "$("$bin/protoc-gen-go" --version 2>/dev/null)" != "protoc-gen-go $version" ]; then
  GOBIN="$bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$version"
fi
command -v protoc >/dev/null || { echo "protoc not found: apt-get install -y protobuf-compiler" >&2; exit 1; }
PATH="$bin:$PATH" protoc --go_out=. --go_opt=paths=source_relative kjob.proto
