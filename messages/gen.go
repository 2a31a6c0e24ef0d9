// Package messages holds kjob's wire messages and journal payloads (proto package
// kjob.v1). The generated code is committed; `go generate ./messages` regenerates it
// with the pinned protoc-gen-go (protoc itself is Debian's protobuf-compiler).
package messages

//go:generate sh ./generate.sh
