package schedule

import (
	"slices"
	"strings"
	"testing"
)

func TestParseLadder(t *testing.T) {
	good := []struct {
		in   string
		want []int64
	}{
		{"1s,5s,30s,2m", []int64{1000, 5000, 30000, 120000}},
		{" 250ms , 1.5s ,1h ", []int64{250, 1500, 3600000}},
		{"168h", []int64{MaxLadderDelayMs}},
		{"", []int64{1000, 5000, 30000, 120000}}, // the default: 1 s, 5 s, 30 s, 2 min
		{"   ", []int64{1000, 5000, 30000, 120000}},
		{strings.Repeat("1s,", MaxLadderLevels-1) + "1s", slices.Repeat([]int64{1000}, MaxLadderLevels)},
	}
	for _, tt := range good {
		got, err := ParseLadder(tt.in)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseLadder(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	d, _ := ParseLadder("")
	d[0] = 42
	if DefaultLadderMs[0] != 1000 {
		t.Fatal("ParseLadder(\"\") aliases DefaultLadderMs")
	}
	for _, in := range []string{
		"0s", "-1s", "1s,,2s", "1s,", "5", "1 d", "abc", "169h", "8d", "1500us",
		strings.Repeat("1s,", MaxLadderLevels) + "1s",
		strings.Repeat(" ", MaxLadderBytes+1),
	} {
		_, err := ParseLadder(in)
		wantField(t, err, FieldLadder)
	}
}
