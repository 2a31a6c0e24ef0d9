package core

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kjob/kjob/messages"
)

// TestJobCopyCopiesEveryField: jobCopy names Job's fields one by one, so a field
// added to messages.Job later must be added there too; this fails until it is.
func TestJobCopyCopiesEveryField(t *testing.T) {
	j := &messages.Job{}
	fillEveryField(t, j.ProtoReflect())
	j.Schedule.Kind, j.Policy.Attempts = messages.ScheduleKind_CRON, 3
	c := jobCopy(j)
	if !proto.Equal(c, j) {
		t.Fatalf("jobCopy lost fields:\n got %v\nwant %v", c, j)
	}
	if c == j {
		t.Fatal("jobCopy returned the job itself")
	}
}

// TestRunStateCopyCopiesEveryField: runStateCopyInto names RunState's fields one by
// one, so a field added to messages.RunState later must be added there too; this
// fails until it is.
func TestRunStateCopyCopiesEveryField(t *testing.T) {
	st := &messages.RunState{}
	fillEveryField(t, st.ProtoReflect())
	var d messages.RunState
	c := runStateCopyInto(&d, st)
	if !proto.Equal(c, st) {
		t.Fatalf("runStateCopyInto lost fields:\n got %v\nwant %v", c, st)
	}
	if c == st || c != &d {
		t.Fatal("runStateCopyInto did not fill the copy it was given")
	}
	st.WorkerId, st.DispatchedMs = "changed", 1 // what the shard changes in place
	if c.WorkerId == "changed" || c.DispatchedMs == 1 {
		t.Fatal("the copy follows the run's later changes")
	}
}

// fillEveryField sets every field of m to a value other than its zero, so that a
// copy that leaves one out differs (a message field gets an empty message).
func fillEveryField(t *testing.T, m protoreflect.Message) {
	t.Helper()
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		var v protoreflect.Value
		switch f.Kind() {
		case protoreflect.Int64Kind:
			v = protoreflect.ValueOfInt64(int64(100 + i))
		case protoreflect.Int32Kind:
			v = protoreflect.ValueOfInt32(int32(100 + i))
		case protoreflect.BoolKind:
			v = protoreflect.ValueOfBool(true)
		case protoreflect.StringKind:
			v = protoreflect.ValueOfString(string(f.Name()))
		case protoreflect.BytesKind:
			v = protoreflect.ValueOfBytes([]byte(f.Name()))
		case protoreflect.EnumKind:
			v = protoreflect.ValueOfEnum(1)
		case protoreflect.MessageKind:
			v = protoreflect.ValueOfMessage(m.NewField(f).Message())
		default:
			t.Fatalf("field %s of kind %s: extend fillEveryField", f.Name(), f.Kind())
		}
		m.Set(f, v)
	}
}
