package core

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kjob/kjob/messages"
)

// decodeJobFast parses a JOB_PUT payload without protobuf's reflection, for a job
// with no policy of its own and only the fields it knows: recovery decodes one
// such record per job created, and proto.Unmarshal cost about 0.8 µs each, as much
// as applying them. ok false means: use proto.Unmarshal (a policy, a field number
// or wire type it does not know, a repeated sub-message, invalid UTF-8, a malformed
// encoding; proto.Unmarshal then decodes it or says what is wrong).
// TestDecodeJobFastMatchesProto and FuzzDecodeJobFast keep it equal to proto.Unmarshal.
func decodeJobFast(b []byte) (*messages.Job, bool) {
	if !coldFieldsKnown() {
		return nil, false
	}
	j := &messages.Job{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && (num == 1 || (num >= 7 && num <= 15)):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			switch num {
			case 1:
				j.Id = int64(v)
			case 7:
				j.State = messages.JobState(int32(v))
			case 8:
				j.Version = int64(v)
			case 9:
				j.CreatedMs = int64(v)
			case 10:
				j.UpdatedMs = int64(v)
			case 11:
				j.NextDueMs = int64(v)
			case 12:
				j.Runs = int64(v)
			case 13:
				j.LastDueMs = int64(v)
			case 14:
				j.LastFinishMs = int64(v)
			case 15:
				j.RequestId = int64(v)
			}
		case typ == protowire.BytesType && num >= 2 && num <= 5:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			switch num {
			case 2, 3:
				if !utf8.Valid(v) {
					return nil, false
				}
				if num == 2 {
					j.App = string(v)
				} else {
					j.Handler = string(v)
				}
			case 4:
				j.Params = append([]byte{}, v...)
			case 5:
				if j.Schedule != nil { // a second occurrence merges into the first
					return nil, false
				}
				s, ok := decodeScheduleFast(v)
				if !ok {
					return nil, false
				}
				j.Schedule = s
			}
		default:
			return nil, false
		}
	}
	return j, true
}

func decodeScheduleFast(b []byte) (*messages.Schedule, bool) {
	s := &messages.Schedule{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && (num <= 3 || num >= 6) && num >= 1 && num <= 10:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			switch num {
			case 1:
				s.Kind = messages.ScheduleKind(int32(v))
			case 2:
				s.AtMs = int64(v)
			case 3:
				s.DelayMs = int64(v)
			case 6:
				s.EveryMs = int64(v)
			case 7:
				s.StartMs = int64(v)
			case 8:
				s.NotBeforeMs = int64(v)
			case 9:
				s.NotAfterMs = int64(v)
			case 10:
				s.MaxRuns = int64(v)
			}
		case typ == protowire.BytesType && (num == 4 || num == 5):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !utf8.Valid(v) {
				return nil, false
			}
			b = b[n:]
			if num == 4 {
				s.Cron = string(v)
			} else {
				s.Tz = string(v)
			}
		default:
			return nil, false
		}
	}
	return s, true
}
