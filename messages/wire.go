package messages

import "google.golang.org/protobuf/encoding/protowire"

// Hand-written encoders (the shard's jobs and run records, the worker's results)
// write what proto.Marshal writes: fields in number order, a zero scalar or an
// empty string left out. These append one field of number num, which must be
// below 16 (a one-byte tag).

// AppendVarintField appends field num as a varint, unless v is zero.
func AppendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(append(b, byte(num)<<3|byte(protowire.VarintType)), v)
}

// AppendStringField appends field num as a string, unless v is empty.
func AppendStringField(b []byte, num protowire.Number, v string) []byte {
	if v == "" {
		return b
	}
	return protowire.AppendString(append(b, byte(num)<<3|byte(protowire.BytesType)), v)
}

// VarintFieldSize is the length of AppendVarintField's bytes for v.
func VarintFieldSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

// StringFieldSize is the length of AppendStringField's bytes for v.
func StringFieldSize(v string) int {
	if v == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(v))
}
